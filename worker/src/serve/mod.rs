//! The worker's ring-serving loop: requests in from the gateway's request ring, one engine step at a
//! time, tokens out through the response ring.
//!
//! The loop attaches to (or creates) its two rings, claims the consumer end of the request ring and
//! the producer end of the response ring, announces readiness with a [`Hello`] record, then repeats:
//! drain [`Submit`] and [`Cancel`] records, run one engine step, and write one [`Tokens`](RecordKind::Tokens) record
//! holding every sequence's new tokens (split in several only if it would not fit in one) together
//! with the engine's gauges. Idle, it sleeps on the request ring's futex and burns no CPU.
//!
//! A record that does not decode fails that request (an error entry in the next Tokens record), not
//! the worker. A full response ring makes the step wait — counted in the gauges' `response_ring_stalls`
//! — rather than dropping tokens. The loop ends when the gateway dies or the rings turn corrupt, or,
//! asked to drain ([`lifecycle`]), once the gateway released it and its engine is idle.

pub mod join;
pub mod launch;
pub mod lifecycle;
pub mod tp;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use protos::records::{
    Cancel, Draining, EngineGauges, EntryLogprobs, ErrorCode, Finish, Hello, HelloInfo, RecordKind,
    Release, Submit, TokenEntry, TokensWriter, WireError, peek_kind,
};
use ringbuf::{Consumer, Producer, Ring};
use thiserror::Error;

use crate::engine::{Engine, EngineError, TokenEvent};
use crate::kv::SeqId;
use crate::request::{FinishReason, Request, RequestError};
use crate::sampler::SamplingParams;

/// Names of a worker's two rings, derived from one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingNames {
    /// Gateway → worker.
    pub request: String,
    /// Worker → gateway.
    pub response: String,
}

impl RingNames {
    /// `{prefix}-req` and `{prefix}-resp`.
    pub fn new(prefix: &str) -> Self {
        Self {
            request: format!("{prefix}-req"),
            response: format!("{prefix}-resp"),
        }
    }
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Ring name prefix (see [`RingNames`]).
    pub rings: String,
    /// Capacity of each ring when the worker has to create it (power of two).
    pub ring_capacity: usize,
    /// The model's vocabulary size (announced to the gateway).
    pub vocab_size: usize,
    /// Set to make the loop return [`ServeExit::Stopped`] (checked at least every 100 ms).
    pub stop: Arc<AtomicBool>,
    /// Heartbeats and draining.
    pub lifecycle: lifecycle::Lifecycle,
}

/// Why the loop stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("ring: {0}")]
    Ring(#[from] ringbuf::Error),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("encoding a record: {0}")]
    Wire(#[from] WireError),
    #[error("starting the heartbeat thread: {0}")]
    Pulse(#[source] std::io::Error),
}

/// Why the loop stopped without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServeExit {
    /// The gateway process died or released its end.
    GatewayGone,
    /// [`ServeConfig::stop`] was set.
    Stopped,
    /// Asked to drain: it finished its requests and the gateway released it.
    Drained,
}

fn attach_or_create(name: &str, capacity: usize) -> Result<Ring, ringbuf::Error> {
    match ringbuf::attach(name) {
        Ok(ring) => Ok(ring),
        Err(ringbuf::Error::NotFound { .. }) => ringbuf::create(name, capacity),
        Err(e) => Err(e),
    }
}

/// What the loop keeps between steps.
struct Loop {
    engine: Engine,
    rx: Consumer,
    tx: Producer,
    /// Live requests' prompt lengths (for usage).
    prompt_lens: HashMap<u64, u32>,
    /// Requests that failed before reaching the engine: reported in the next Tokens record.
    failed: Vec<(u64, ErrorCode)>,
    /// Cancels acknowledged in the next Tokens record.
    cancelled: Vec<u64>,
    last_gauges: Option<EngineGauges>,
    stalls: u32,
    step: u64,
    vocab_size: usize,
    stop: Arc<AtomicBool>,
    lifecycle: lifecycle::Lifecycle,
    pulse: lifecycle::Pulse,
    /// The Draining record was sent.
    draining: bool,
    /// The gateway's Release record came.
    released: bool,
}

/// Runs the serving loop over `engine` until the gateway goes away.
pub fn serve(engine: Engine, config: &ServeConfig) -> Result<ServeExit, ServeError> {
    let names = RingNames::new(&config.rings);
    let req_ring = attach_or_create(&names.request, config.ring_capacity)?;
    let resp_ring = attach_or_create(&names.response, config.ring_capacity)?;
    let rx = req_ring.consumer()?;
    let tx = resp_ring.producer()?;
    let pulse = lifecycle::Pulse::start(
        vec![tx.heartbeat_handle(), rx.heartbeat_handle()],
        config.lifecycle.long_step_timeout,
    )
    .map_err(ServeError::Pulse)?;
    pulse.progress();
    let mut state = Loop {
        engine,
        rx,
        tx,
        prompt_lens: HashMap::new(),
        failed: Vec::new(),
        cancelled: Vec::new(),
        last_gauges: None,
        stalls: 0,
        step: 0,
        vocab_size: config.vocab_size,
        stop: config.stop.clone(),
        lifecycle: config.lifecycle.clone(),
        pulse,
        draining: false,
        released: false,
    };
    state.hello()?;
    tracing::info!(rings = %config.rings, "worker ready");
    state.run()
}

impl Loop {
    fn hello(&mut self) -> Result<(), ServeError> {
        let stats = self.engine.stats();
        let sched = self.engine.scheduler().config();
        let info = HelloInfo {
            pid: std::process::id(),
            num_kv_blocks: stats.kv_blocks_total as u32,
            block_size: sched.block_size as u32,
            max_model_len: self.engine.max_model_len() as u32,
            vocab_size: self.vocab_size as u32,
            max_num_seqs: sched.max_num_seqs as u32,
        };
        let hello = Hello::new(info);
        self.write(Hello::LEN, RecordKind::Hello, |out| hello.encode(out))
    }

    /// Writes one record, waiting (and counting a stall) when the ring is full.
    fn write(
        &mut self,
        len: usize,
        kind: RecordKind,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, WireError>,
    ) -> Result<(), ServeError> {
        let mut fill = Some(fill);
        let mut stalled = false;
        loop {
            let grant = if stalled {
                self.tx.reserve_wait(len, Duration::from_millis(100))?
            } else {
                self.tx.reserve(len)?
            };
            match grant {
                Some(mut grant) => {
                    if let Some(fill) = fill.take() {
                        fill(&mut grant)?;
                    }
                    grant.set_kind(kind as u16);
                    grant.commit();
                    return Ok(());
                }
                None if !stalled => {
                    stalled = true;
                    self.stalls = self.stalls.wrapping_add(1);
                }
                // Waiting for the gateway to read is not a hang of this loop.
                None => self.pulse.progress(),
            }
        }
    }

    fn run(&mut self) -> Result<ServeExit, ServeError> {
        let mut last_beat = Instant::now();
        let mut gateway_seen = false;
        loop {
            // Relaxed: a plain flag; nothing is published through it.
            if self.stop.load(Ordering::Relaxed) {
                return Ok(ServeExit::Stopped);
            }
            self.pulse.progress();
            if !self.draining && self.lifecycle.drain_requested() {
                tracing::info!("draining: no new requests; leaving once the in-flight ones end");
                self.write(Draining::LEN, RecordKind::Draining, |out| {
                    Draining::new().encode(out)
                })?;
                self.draining = true;
            }
            if let Some(exit) = self.drain()? {
                return Ok(exit);
            }
            if self.released && !self.engine.has_unfinished() {
                tracing::info!("drained: leaving");
                return Ok(ServeExit::Drained);
            }
            // No gateway will ever release a worker it is not attached to (it never came, or it
            // died): a drain then ends at once, and the rings this worker created go with it.
            if self.draining && !self.gateway_attached() {
                tracing::info!("draining with no gateway attached: leaving now");
                return Ok(ServeExit::GatewayGone);
            }
            let events = if self.engine.has_unfinished() {
                self.step += 1;
                self.engine.step()?
            } else {
                Vec::new()
            };
            self.publish(&events)?;
            if last_beat.elapsed() > Duration::from_millis(100) {
                self.rx.heartbeat();
                self.tx.heartbeat();
                last_beat = Instant::now();
                // The gateway let go of this worker (it was found hung, or it was removed): leave.
                // (A worker that created its rings waits for a gateway to attach first.)
                match self.rx.peer_state() {
                    ringbuf::PeerState::Absent if gateway_seen => {
                        tracing::warn!("the gateway released this worker's rings");
                        return Ok(ServeExit::GatewayGone);
                    }
                    ringbuf::PeerState::Absent => {}
                    _ => gateway_seen = true,
                }
            }
        }
    }

    /// Whether a gateway process holds the producer end of the request ring and lives.
    fn gateway_attached(&self) -> bool {
        matches!(
            self.rx.peer_state(),
            ringbuf::PeerState::Alive { .. } | ringbuf::PeerState::Unresponsive { .. }
        )
    }

    /// Takes every record waiting in the request ring (sleeping for one when the engine is idle).
    fn drain(&mut self) -> Result<Option<ServeExit>, ServeError> {
        let mut idle = !self.engine.has_unfinished();
        loop {
            let mut records: Vec<(u16, Vec<u8>)> = Vec::new();
            let popped = if idle {
                self.rx
                    .pop_batch_wait(256, Duration::from_millis(100), |r| {
                        records.push((r.kind, r.payload.to_vec()))
                    })
            } else {
                self.rx
                    .pop_batch(256, |r| records.push((r.kind, r.payload.to_vec())))
            };
            let n = match popped {
                Ok(n) => n,
                Err(ringbuf::Error::PeerDead { .. }) => return Ok(Some(ServeExit::GatewayGone)),
                Err(e) => return Err(e.into()),
            };
            for (kind, payload) in records {
                self.handle(kind, &payload)?;
            }
            if n < 256 {
                return Ok(None);
            }
            idle = false;
        }
    }

    fn handle(&mut self, kind: u16, payload: &[u8]) -> Result<(), ServeError> {
        let kind = peek_kind(payload).ok().filter(|k| *k as u16 == kind);
        match kind {
            Some(RecordKind::Submit) => match Submit::decode(payload) {
                Ok(submit) => self.submit(submit)?,
                Err(e) => self.corrupt(payload, &e),
            },
            Some(RecordKind::Release) => match Release::decode(payload) {
                Ok(()) if self.draining => self.released = true,
                Ok(()) => tracing::warn!("ignoring a release: this worker is not draining"),
                Err(e) => tracing::warn!(error = %e, "dropping a corrupt release record"),
            },
            Some(RecordKind::Cancel) => match Cancel::decode(payload) {
                Ok(id) => {
                    if self.engine.cancel(SeqId(id))? {
                        self.cancelled.push(id);
                    }
                    self.prompt_lens.remove(&id);
                }
                Err(e) => tracing::warn!(error = %e, "dropping a corrupt cancel record"),
            },
            _ => self.corrupt(
                payload,
                &WireError::Invalid {
                    what: "request ring record kind",
                    value: u64::from(kind.map_or(0, |k| k as u16)),
                },
            ),
        }
        Ok(())
    }

    fn corrupt(&mut self, payload: &[u8], e: &WireError) {
        match Submit::peek_request_id(payload) {
            Some(id) => {
                tracing::warn!(request_id = id, error = %e, "failing a request with a corrupt record");
                self.failed.push((id, ErrorCode::CorruptRecord));
            }
            None => tracing::warn!(error = %e, "dropping an unreadable record"),
        }
    }

    fn submit(&mut self, s: Submit) -> Result<(), ServeError> {
        let id = s.request_id;
        let prompt_len = s.prompt.len() as u32;
        let req = Request {
            id: SeqId(id),
            prompt: s.prompt,
            params: SamplingParams::from(s.sampling),
            max_tokens: s.max_tokens as usize,
            stop_token_ids: s.stop_token_ids,
            min_tokens: s.min_tokens as usize,
            ignore_eos: s.ignore_eos,
            logprobs: (s.logprobs > 0).then_some(s.logprobs as usize),
            prior_output_len: s.prior_output_len as usize,
            grammar: None,
        };
        let req = match s
            .grammar
            .map(|g| grammar::GrammarSpec::from_wire(g.kind, &g.text))
        {
            None => req,
            Some(Ok(spec)) => Request {
                grammar: Some(spec),
                ..req
            },
            Some(Err(e)) => {
                tracing::warn!(request_id = id, error = %e, "failing a request with a corrupt grammar");
                self.failed.push((id, ErrorCode::CorruptRecord));
                return Ok(());
            }
        };
        match self.engine.add_request(req) {
            Ok(()) => {
                self.prompt_lens.insert(id, prompt_len);
            }
            Err(e) => {
                tracing::warn!(request_id = id, error = %e, "request rejected");
                let code = match e {
                    RequestError::DuplicateId(_) => ErrorCode::DuplicateId,
                    _ => ErrorCode::Rejected,
                };
                self.failed.push((id, code));
            }
        }
        Ok(())
    }

    fn gauges(&self) -> EngineGauges {
        let s = self.engine.stats();
        EngineGauges {
            step: self.step,
            running: s.running as u32,
            waiting: s.waiting as u32,
            kv_blocks_used: s.kv_blocks_used as u32,
            kv_blocks_total: s.kv_blocks_total as u32,
            response_ring_stalls: self.stalls,
        }
    }

    /// Writes this step's tokens, failures and cancel acknowledgements, and the gauges when they
    /// changed.
    fn publish(&mut self, events: &[TokenEvent]) -> Result<(), ServeError> {
        let gauges = self.gauges();
        let changed = self
            .last_gauges
            .is_none_or(|g| EngineGauges { step: 0, ..g } != EngineGauges { step: 0, ..gauges });
        if events.is_empty() && self.failed.is_empty() && self.cancelled.is_empty() && !changed {
            return Ok(());
        }
        let mut entries: Vec<OwnedEntry> = Vec::with_capacity(events.len() + self.failed.len());
        for e in events {
            let prompt_tokens = self.prompt_lens.get(&e.id.0).copied().unwrap_or(0);
            if e.finish.is_some() {
                self.prompt_lens.remove(&e.id.0);
            }
            entries.push(OwnedEntry::from_event(e, prompt_tokens));
        }
        for (id, code) in self.failed.drain(..) {
            entries.push(OwnedEntry::finished(id, Finish::Error, code));
        }
        for id in self.cancelled.drain(..) {
            entries.push(OwnedEntry::finished(id, Finish::Cancelled, ErrorCode::None));
        }
        self.write_entries(&entries, gauges)?;
        self.last_gauges = Some(gauges);
        Ok(())
    }

    /// Packs entries into as few Tokens records as fit the ring's record size.
    fn write_entries(
        &mut self,
        entries: &[OwnedEntry],
        gauges: EngineGauges,
    ) -> Result<(), ServeError> {
        let max = self.tx.max_payload();
        let mut start = 0;
        loop {
            let mut len = TokensWriter::HEADER_LEN;
            let mut end = start;
            while end < entries.len() && len + entries[end].len() <= max {
                len += entries[end].len();
                end += 1;
            }
            if end == start && start < entries.len() {
                // A single entry larger than the ring allows cannot happen with the ring sizes
                // used (an entry holds one step's tokens); fail it rather than the worker.
                tracing::error!(request_id = entries[start].id, "token entry too large");
                start += 1;
                continue;
            }
            let chunk = &entries[start..end];
            self.write(len, RecordKind::Tokens, |out| {
                let mut w = TokensWriter::new(out, gauges)?;
                for e in chunk {
                    w.push(&e.as_entry())?;
                }
                Ok(w.finish())
            })?;
            start = end;
            if start >= entries.len() {
                return Ok(());
            }
        }
    }
}

/// Logprobs of an entry's one token: its own and `num_top` alternatives.
struct OwnedLogprobs {
    num_top: u8,
    chosen: Vec<f32>,
    top: Vec<(u32, f32)>,
}

/// An entry built from engine output, before it is written.
struct OwnedEntry {
    id: u64,
    tokens: Vec<u32>,
    logprobs: Option<OwnedLogprobs>,
    finish: Finish,
    error: ErrorCode,
    prompt_tokens: u32,
}

impl OwnedEntry {
    fn from_event(e: &TokenEvent, prompt_tokens: u32) -> Self {
        let logprobs = e.logprobs.as_ref().map(|lp| {
            let top: Vec<(u32, f32)> = lp
                .top
                .iter()
                .take(u8::MAX as usize)
                .map(|t| (t.token, t.logprob))
                .collect();
            OwnedLogprobs {
                num_top: top.len() as u8,
                chosen: vec![lp.sampled.logprob],
                top,
            }
        });
        Self {
            id: e.id.0,
            tokens: vec![e.token],
            logprobs,
            finish: match e.finish {
                None => Finish::None,
                Some(FinishReason::Length) => Finish::Length,
                Some(FinishReason::Stop) => Finish::Stop,
            },
            error: ErrorCode::None,
            prompt_tokens,
        }
    }

    fn finished(id: u64, finish: Finish, error: ErrorCode) -> Self {
        Self {
            id,
            tokens: Vec::new(),
            logprobs: None,
            finish,
            error,
            prompt_tokens: 0,
        }
    }

    fn len(&self) -> usize {
        TokensWriter::entry_len(self.tokens.len(), self.logprobs.as_ref().map(|l| l.num_top))
    }

    fn as_entry(&self) -> TokenEntry<'_> {
        TokenEntry {
            request_id: self.id,
            tokens: &self.tokens,
            logprobs: self.logprobs.as_ref().map(|l| EntryLogprobs {
                num_top: l.num_top,
                chosen: &l.chosen,
                top: &l.top,
            }),
            finish: self.finish,
            error: self.error,
            prompt_tokens: self.prompt_tokens,
        }
    }
}

#[cfg(test)]
mod tests;
