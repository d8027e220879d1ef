//! One worker as the gateway sees it: the producer end of its request ring, the reader thread on its
//! response ring, and the table of its in-flight requests.
//!
//! Writers (request tasks) take the producer with `try_lock` and write the record straight into the
//! ring with reserve/commit. When the ring is full, or another writer holds it, the write moves to
//! the blocking pool and waits there (futex, no spinning on the runtime), so the async runtime never
//! blocks and no request is dropped.
//!
//! The reader thread pops Tokens records in batches and dispatches each entry into its request's
//! bounded channel, sized by the request's token budget so it cannot fill up; should a worker send
//! more than that, the request is failed rather than stalling every other stream of the worker. When the worker dies the table is emptied, which
//! closes every in-flight request's channel: each request then resumes on a live worker
//! ([`crate::stream`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use protos::records::{
    Cancel, EngineGauges, ErrorCode, Finish, HelloInfo, RecordKind, Submit, Tokens, WireError,
    peek_kind,
};
use ringbuf::{Consumer, Producer};
use tokio::sync::mpsc;

use crate::metrics as m;

/// Events a request's channel holds beyond its token budget (its finish and a cancel
/// acknowledgement).
const CHANNEL_SLACK: usize = 4;

/// What the reader thread hands a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub tokens: Vec<u32>,
    /// Per token: its logprob and the top alternatives.
    pub logprobs: Vec<(f32, Vec<(u32, f32)>)>,
    pub finish: Finish,
    pub error: ErrorCode,
}

/// Writing to a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the worker is gone")]
    WorkerGone,
    #[error("ring: {0}")]
    Ring(#[from] ringbuf::Error),
    #[error("record: {0}")]
    Wire(#[from] WireError),
}

type Table = HashMap<u64, mpsc::Sender<Event>>;

/// A live worker.
pub struct WorkerLink {
    /// The worker's slot in the supervisor.
    pub slot: usize,
    /// What the worker announced.
    pub info: HelloInfo,
    producer: Mutex<Producer>,
    table: Mutex<Table>,
    alive: AtomicBool,
    /// Outstanding work, in tokens: prompt tokens not yet prefilled plus tokens still to generate.
    outstanding: AtomicI64,
}

impl std::fmt::Debug for WorkerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerLink")
            .field("slot", &self.slot)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WorkerLink {
    /// A link over the producer end of the worker's request ring; start [`reader`] with the consumer
    /// end of its response ring.
    pub fn new(slot: usize, info: HelloInfo, producer: Producer) -> Arc<Self> {
        Arc::new(Self {
            slot,
            info,
            producer: Mutex::new(producer),
            table: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            outstanding: AtomicI64::new(0),
        })
    }

    /// Whether the worker is serving.
    pub fn is_alive(&self) -> bool {
        // Acquire: pairs with the Release in `mark_dead`, so a reader that sees `false` also sees the
        // emptied table.
        self.alive.load(Ordering::Acquire)
    }

    /// Outstanding work in tokens (for routing).
    pub fn outstanding(&self) -> i64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Adds (or with a negative value, removes) outstanding work.
    pub fn add_outstanding(&self, tokens: i64) {
        self.outstanding.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Requests in flight on this worker.
    pub fn in_flight(&self) -> usize {
        lock(&self.table).len()
    }

    /// Registers a request that generates at most `max_tokens`; its events arrive on the returned
    /// receiver. The channel is bounded by the request's own budget (each event carries at least
    /// one token, or ends the request), so the reader thread never waits on a slow client and a
    /// client can never make the gateway hold more than its request asked for.
    pub fn register(&self, id: u64, max_tokens: u32) -> Result<mpsc::Receiver<Event>, LinkError> {
        let (tx, rx) = mpsc::channel(max_tokens as usize + CHANNEL_SLACK);
        let mut table = lock(&self.table);
        if !self.is_alive() {
            return Err(LinkError::WorkerGone);
        }
        table.insert(id, tx);
        Ok(rx)
    }

    /// Forgets a request (it finished, or its client went away).
    pub fn unregister(&self, id: u64) {
        lock(&self.table).remove(&id);
    }

    /// Marks the worker dead and closes every in-flight request's channel.
    pub fn mark_dead(&self) {
        let mut table = lock(&self.table);
        // Release: pairs with the Acquire in `is_alive`.
        self.alive.store(false, Ordering::Release);
        table.clear();
    }

    /// Writes a Submit record (waiting off the runtime if the ring is full).
    pub async fn submit(self: &Arc<Self>, submit: Submit) -> Result<(), LinkError> {
        let len = submit.encoded_len();
        self.write(len, RecordKind::Submit, move |out| submit.encode(out))
            .await
    }

    /// Writes a Cancel record (waiting off the runtime if the ring is full).
    pub async fn cancel(self: &Arc<Self>, request_id: u64) -> Result<(), LinkError> {
        let cancel = Cancel::new(request_id);
        self.write(Cancel::LEN, RecordKind::Cancel, move |out| {
            cancel.encode(out)
        })
        .await
    }

    /// Writes a Cancel without waiting for it, from a context that cannot await (a `Drop`).
    pub fn cancel_detached(self: &Arc<Self>, request_id: u64) {
        let cancel = Cancel::new(request_id);
        let fill = move |out: &mut [u8]| cancel.encode(out);
        match self.try_write(Cancel::LEN, RecordKind::Cancel, &fill) {
            Ok(true) => {}
            Ok(false) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    let link = self.clone();
                    rt.spawn(async move { link.cancel(request_id).await });
                }
            }
            Err(e) => tracing::debug!(error = %e, request_id, "cancel not written"),
        }
    }

    /// The fast path: the producer is free and the ring has room. `Ok(false)`: take the slow path.
    fn try_write(
        &self,
        len: usize,
        kind: RecordKind,
        fill: &impl Fn(&mut [u8]) -> Result<usize, WireError>,
    ) -> Result<bool, LinkError> {
        if !self.is_alive() {
            return Err(LinkError::WorkerGone);
        }
        let Ok(mut producer) = self.producer.try_lock() else {
            return Ok(false);
        };
        let occupancy = producer.len_hint();
        match producer.reserve(len)? {
            Some(mut grant) => {
                fill(&mut grant)?;
                grant.set_kind(kind as u16);
                grant.commit();
                let slot = self.slot.to_string();
                metrics::gauge!(m::RING_OCCUPANCY, "worker" => slot, "ring" => "request")
                    .set((occupancy + len) as f64);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn write(
        self: &Arc<Self>,
        len: usize,
        kind: RecordKind,
        fill: impl Fn(&mut [u8]) -> Result<usize, WireError> + Send + 'static,
    ) -> Result<(), LinkError> {
        if self.try_write(len, kind, &fill)? {
            return Ok(());
        }
        let link = self.clone();
        tokio::task::spawn_blocking(move || link.write_blocking(len, kind, &fill))
            .await
            .map_err(|_| LinkError::WorkerGone)?
    }

    fn write_blocking(
        &self,
        len: usize,
        kind: RecordKind,
        fill: &impl Fn(&mut [u8]) -> Result<usize, WireError>,
    ) -> Result<(), LinkError> {
        let mut producer = lock(&self.producer);
        loop {
            if !self.is_alive() {
                return Err(LinkError::WorkerGone);
            }
            if let Some(mut grant) = producer.reserve_wait(len, Duration::from_millis(100))? {
                fill(&mut grant)?;
                grant.set_kind(kind as u16);
                grant.commit();
                return Ok(());
            }
        }
    }

    fn dispatch(&self, bytes: &[u8]) -> Result<EngineGauges, WireError> {
        let mut table = lock(&self.table);
        let mut overflowed = Vec::new();
        let gauges = Tokens::decode(bytes, |e| {
            let Some(tx) = table.get(&e.request_id) else {
                // Finished or abandoned here; the worker's late tokens are dropped.
                return;
            };
            let logprobs = match e.logprobs {
                Some(lp) => (0..e.tokens.len())
                    .map(|i| (lp.chosen(i).unwrap_or(f32::NAN), lp.top(i).collect()))
                    .collect(),
                None => Vec::new(),
            };
            let event = Event {
                tokens: e.tokens.to_vec(),
                logprobs,
                finish: e.finish,
                error: e.error,
            };
            if tx.try_send(event).is_err() {
                overflowed.push(e.request_id);
            }
        })?;
        for id in overflowed {
            // Closing the channel ends the stream; it then cancels the request on the worker.
            tracing::warn!(
                request_id = id,
                "worker sent more events than the request's budget; failing the request"
            );
            table.remove(&id);
        }
        Ok(gauges)
    }
}

/// How long a worker may take to announce readiness.
pub const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// Waits for the worker's Hello on its response ring (blocking).
pub fn wait_hello(
    consumer: &mut Consumer,
    give_up: &AtomicBool,
) -> Result<Option<HelloInfo>, LinkError> {
    let start = std::time::Instant::now();
    while start.elapsed() < READY_TIMEOUT {
        // Relaxed: a plain stop flag.
        if give_up.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if let Some(rec) = consumer.pop_wait(Duration::from_millis(100))? {
            return Ok(Some(protos::records::Hello::decode(&rec)?));
        }
    }
    Ok(None)
}

/// The reader loop of one response ring: runs on its own thread until the worker dies or `stop` is
/// set, then marks the link dead.
pub fn reader(link: Arc<WorkerLink>, mut consumer: Consumer, stop: Arc<AtomicBool>) {
    let slot = link.slot.to_string();
    loop {
        // Relaxed: a plain stop flag.
        if stop.load(Ordering::Relaxed) || !link.is_alive() {
            break;
        }
        let mut last = None;
        let mut bad = None;
        let r = consumer.pop_batch_wait(64, Duration::from_millis(100), |rec| {
            match peek_kind(rec.payload) {
                Ok(RecordKind::Tokens) => match link.dispatch(rec.payload) {
                    Ok(g) => last = Some(g),
                    Err(e) => bad = Some(e),
                },
                Ok(other) => tracing::warn!(?other, "unexpected record on a response ring"),
                Err(e) => bad = Some(e),
            }
        });
        if let Some(e) = bad {
            // A corrupt Tokens record cannot be attributed to one request: the worker is unusable.
            tracing::error!(worker = link.slot, error = %e, "corrupt record from worker");
            break;
        }
        if let Some(g) = last {
            let w = slot.clone();
            metrics::gauge!(m::RUNNING, "worker" => w.clone()).set(f64::from(g.running));
            metrics::gauge!(m::WAITING, "worker" => w.clone()).set(f64::from(g.waiting));
            metrics::gauge!(m::KV_USED, "worker" => w.clone()).set(f64::from(g.kv_blocks_used));
            metrics::gauge!(m::KV_TOTAL, "worker" => w.clone()).set(f64::from(g.kv_blocks_total));
            metrics::gauge!(m::RESPONSE_STALLS, "worker" => w)
                .set(f64::from(g.response_ring_stalls));
        }
        match r {
            Ok(_) => {}
            Err(ringbuf::Error::PeerDead { pid }) => {
                tracing::warn!(worker = link.slot, pid, "worker died");
                break;
            }
            Err(e) => {
                tracing::error!(worker = link.slot, error = %e, "response ring failed");
                break;
            }
        }
    }
    link.mark_dead();
}
