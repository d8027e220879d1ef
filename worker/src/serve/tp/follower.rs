//! The plan broadcast over shared-memory rings: [`RingPlanSink`] on rank 0 (one SPSC ring per
//! follower, plugged into the engine with [`Engine::set_plan_sink`](crate::engine::Engine)), and
//! [`run_follower`], the loop of ranks 1..T-1: read a plan, mirror it, run the backend's shard.

use std::time::Duration;

use thiserror::Error;

use super::plan::{self, PlanEncoder, PlanError, PlanMirror, PlanMsg};
use crate::backend::{Backend, BackendError};
use crate::engine::{EngineError, PlanSink};
use crate::scheduler::{Scheduler, StepPlan};

/// Ring record kind of a plan record.
pub const PLAN_RECORD_KIND: u16 = 0x5450;

/// Rank 0's end of the plan broadcast.
pub struct RingPlanSink {
    rings: Vec<ringbuf::Producer>,
    encoder: PlanEncoder,
    buf: Vec<u8>,
    timeout: Duration,
}

impl std::fmt::Debug for RingPlanSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingPlanSink")
            .field("followers", &self.rings.len())
            .finish_non_exhaustive()
    }
}

impl RingPlanSink {
    /// A sink writing to `rings` (one per follower rank, in rank order). A follower whose ring
    /// stays full for `timeout` is an error.
    pub fn new(rings: Vec<ringbuf::Producer>, timeout: Duration) -> Self {
        Self {
            rings,
            encoder: PlanEncoder::default(),
            buf: Vec::new(),
            timeout,
        }
    }

    fn broadcast(&mut self) -> Result<(), String> {
        for (i, ring) in self.rings.iter_mut().enumerate() {
            if self.buf.len() > ring.max_payload() {
                return Err(format!(
                    "a plan of {} bytes exceeds the ring's {}-byte records",
                    self.buf.len(),
                    ring.max_payload()
                ));
            }
            match ring.push_wait(&self.buf, self.timeout) {
                Ok(true) => {}
                Ok(false) => return Err(format!("rank {}'s plan ring stayed full", i + 1)),
                Err(e) => return Err(format!("rank {}: {e}", i + 1)),
            }
        }
        Ok(())
    }
}

impl PlanSink for RingPlanSink {
    fn send(&mut self, plan: &StepPlan, scheduler: &Scheduler) -> Result<(), EngineError> {
        self.encoder
            .encode(
                plan,
                |id| scheduler.seq(id).map(|s| s.tokens()),
                &mut self.buf,
            )
            .map_err(|e| EngineError::PlanBroadcast(e.to_string()))?;
        self.broadcast().map_err(EngineError::PlanBroadcast)
    }
}

impl Drop for RingPlanSink {
    /// Tells the followers to exit (best effort: a dead follower is already gone).
    fn drop(&mut self) {
        plan::encode_shutdown(&mut self.buf);
        self.timeout = self.timeout.min(Duration::from_secs(1));
        let _ = self.broadcast();
    }
}

/// Why a follower stopped with an error.
#[derive(Debug, Error)]
pub enum FollowerError {
    /// The plan ring failed (rank 0 died, or the ring is corrupt).
    #[error("plan ring: {0}")]
    Ring(#[from] ringbuf::Error),
    /// A plan record was malformed or did not fit the mirrored state.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The backend failed (including a collective with a dead peer).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// No plan arrived for this long although rank 0 lives.
    #[error("no plan from rank 0 for {0:?}")]
    Idle(Duration),
}

/// Runs a follower rank until rank 0 sends shutdown: returns the number of steps computed.
/// `idle_timeout` bounds the wait for one plan (`None`: wait as long as rank 0 lives).
pub fn run_follower(
    ring: &mut ringbuf::Consumer,
    backend: &mut dyn Backend,
    idle_timeout: Option<Duration>,
) -> Result<u64, FollowerError> {
    let mut mirror = PlanMirror::default();
    let mut steps = 0u64;
    let poll = Duration::from_millis(100);
    let mut idle = Duration::ZERO;
    loop {
        let Some(grant) = ring.pop_wait(poll)? else {
            idle += poll;
            if let Some(limit) = idle_timeout
                && idle >= limit
            {
                return Err(FollowerError::Idle(limit));
            }
            continue;
        };
        idle = Duration::ZERO;
        let msg = plan::decode(&grant);
        drop(grant);
        match msg? {
            PlanMsg::Shutdown => return Ok(steps),
            PlanMsg::Step {
                step,
                seqs,
                preempted,
                finished,
            } => {
                let inputs = mirror.apply(step, &seqs, &preempted, &finished)?;
                if !inputs.is_empty() {
                    inputs.with_batch(|batch| backend.forward(batch))?;
                    steps += 1;
                }
            }
        }
    }
}
