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
    Cancel, Draining, EngineGauges, ErrorCode, Finish, HelloInfo, RecordKind, Release, Submit,
    Tokens, WireError, peek_kind,
};
use ringbuf::{Consumer, PeerState, Producer};
use tokio::sync::mpsc;

use crate::metrics as m;

/// Events a request's channel holds beyond its token budget (its finish and a cancel
/// acknowledgement).
const CHANNEL_SLACK: usize = 4;

/// What the reader thread hands a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Inline up to [`EVENT_INLINE_TOKENS`]: an event is usually one step's token, and a heap
    /// buffer per event cost an allocation, a free and a cache miss where the stream reads it.
    pub tokens: EventTokens,
    /// Per token: its logprob and the top alternatives.
    pub logprobs: Vec<(f32, Vec<(u32, f32)>)>,
    pub finish: Finish,
    pub error: ErrorCode,
}

/// Tokens an [`Event`] holds without a heap allocation.
pub const EVENT_INLINE_TOKENS: usize = 4;

/// An [`Event`]'s token ids.
pub type EventTokens = smallvec::SmallVec<[u32; EVENT_INLINE_TOKENS]>;

/// Writing to a worker failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the worker is gone")]
    WorkerGone,
    #[error("the worker is draining")]
    Draining,
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
    /// The worker announced it is draining: no new requests; its own finish normally.
    draining: AtomicBool,
    /// The Release record (the worker may leave) was written.
    released: AtomicBool,
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
            draining: AtomicBool::new(false),
            released: AtomicBool::new(false),
            outstanding: AtomicI64::new(0),
        })
    }

    /// Whether the worker is serving.
    pub fn is_alive(&self) -> bool {
        // Acquire: pairs with the Release in `mark_dead`, so a reader that sees `false` also sees the
        // emptied table.
        self.alive.load(Ordering::Acquire)
    }

    /// Whether the worker announced that it is draining.
    pub fn is_draining(&self) -> bool {
        // Acquire: pairs with the Release in `set_draining`.
        self.draining.load(Ordering::Acquire)
    }

    /// Whether new requests may go to this worker (alive and not draining).
    pub fn takes_requests(&self) -> bool {
        self.is_alive() && !self.is_draining()
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
        if self.is_draining() {
            return Err(LinkError::Draining);
        }
        table.insert(id, tx);
        Ok(rx)
    }

    /// Forgets a request (it finished, or its client went away). The last one of a draining
    /// worker lets it leave.
    pub fn unregister(self: &Arc<Self>, id: u64) {
        let empty = {
            let mut table = lock(&self.table);
            table.remove(&id);
            table.is_empty()
        };
        if empty && self.is_draining() {
            self.release_detached();
        }
    }

    /// Marks the worker draining (it said so): the router sends it nothing new, and once its last
    /// request is unregistered the gateway writes a Release record so it may exit.
    pub fn set_draining(&self) {
        let empty = {
            // Under the table lock, so a concurrent `register` either lands before (and is waited
            // for) or sees the flag and fails.
            let table = lock(&self.table);
            // Release: pairs with the Acquire in `is_draining`.
            self.draining.store(true, Ordering::Release);
            table.is_empty()
        };
        if empty {
            self.release_blocking();
        }
    }

    /// Whether the Release record was written.
    pub fn is_released(&self) -> bool {
        // Relaxed: informational.
        self.released.load(Ordering::Relaxed)
    }

    fn take_release(&self) -> bool {
        // AcqRel: exactly one caller writes the record.
        !self.released.swap(true, Ordering::AcqRel)
    }

    /// Writes the Release record from a plain thread (the reader).
    fn release_blocking(&self) {
        if !self.take_release() {
            return;
        }
        let fill = |out: &mut [u8]| Release::new().encode(out);
        if let Err(e) = self.write_blocking(Release::LEN, RecordKind::Release, &fill) {
            tracing::debug!(worker = self.slot, error = %e, "release not written");
        }
    }

    /// Writes the Release record from async code or a `Drop` (never blocks the runtime).
    fn release_detached(self: &Arc<Self>) {
        if !self.take_release() {
            return;
        }
        let fill = |out: &mut [u8]| Release::new().encode(out);
        match self.try_write(Release::LEN, RecordKind::Release, &fill) {
            Ok(true) => {}
            Ok(false) => {
                let link = self.clone();
                let write = move || {
                    if let Err(e) = link.write_blocking(Release::LEN, RecordKind::Release, &fill) {
                        tracing::debug!(worker = link.slot, error = %e, "release not written");
                    }
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => drop(rt.spawn_blocking(write)),
                    Err(_) => write(),
                }
            }
            Err(e) => tracing::debug!(worker = self.slot, error = %e, "release not written"),
        }
        tracing::info!(worker = self.slot, "draining worker released");
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
                tokens: e.tokens.iter().collect(),
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

/// Waits up to `timeout` for the worker's Hello on its response ring (blocking); `Ok(None)` on
/// timeout or when `give_up` is set.
pub fn wait_hello_within(
    consumer: &mut Consumer,
    give_up: &AtomicBool,
    timeout: Duration,
) -> Result<Option<HelloInfo>, LinkError> {
    let start = std::time::Instant::now();
    while start.elapsed() < timeout {
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

/// A worker slot's ring-reader thread: it waits for the worker's Hello, then, once [`serve`]
/// hands it the worker's link, runs [`reader`] until the worker dies or hangs or [`join`] stops it.
///
/// [`serve`]: RingReader::serve
/// [`join`]: RingReader::join
pub struct RingReader {
    stop: Arc<AtomicBool>,
    /// The worker's Hello: `Ok(None)` when none came within the timeout.
    pub hello: tokio::sync::oneshot::Receiver<Result<Option<HelloInfo>, LinkError>>,
    /// Why the reader loop ended (after [`RingReader::serve`]).
    pub end: tokio::sync::oneshot::Receiver<ReaderEnd>,
    link: std::sync::mpsc::Sender<Arc<WorkerLink>>,
    thread: std::thread::JoinHandle<()>,
}

impl RingReader {
    /// Starts the thread `ring-reader-{slot}` on `consumer`, the response ring's consumer end.
    pub fn spawn(
        slot: usize,
        mut consumer: Consumer,
        hello_timeout: Duration,
        heartbeat_limit: Duration,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (hello_tx, hello) = tokio::sync::oneshot::channel();
        let (link, link_rx) = std::sync::mpsc::channel::<Arc<WorkerLink>>();
        let (end_tx, end) = tokio::sync::oneshot::channel();
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("ring-reader-{slot}"))
            .spawn(move || {
                let got = wait_hello_within(&mut consumer, &thread_stop, hello_timeout);
                let ok = matches!(got, Ok(Some(_)));
                let _ = hello_tx.send(got);
                if ok && let Ok(link) = link_rx.recv() {
                    let _ = end_tx.send(reader(link, consumer, thread_stop, heartbeat_limit));
                }
            })?;
        Ok(Self {
            stop,
            hello,
            end,
            link,
            thread,
        })
    }

    /// Starts reading tokens for `link` (after a good Hello).
    pub fn serve(&self, link: Arc<WorkerLink>) {
        let _ = self.link.send(link);
    }

    /// Stops the thread (wherever it is: waiting for the Hello or the link, or reading) and waits
    /// for it to end.
    pub async fn join(self) {
        let Self {
            stop, link, thread, ..
        } = self;
        // Relaxed: a plain stop flag.
        stop.store(true, Ordering::Relaxed);
        drop(link);
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

/// Why a reader loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReaderEnd {
    /// The gateway asked it to stop.
    Stopped,
    /// The worker's process died or let go of its ring.
    WorkerGone,
    /// The worker's process lives but its heartbeat is older than the limit: it is hung (or
    /// stopped) and must be killed.
    Hung,
    /// The worker wrote something unreadable: it is unusable and must be killed.
    Corrupt,
}

/// The reader loop of one response ring: runs on its own thread until the worker dies, hangs
/// (heartbeat older than `heartbeat_limit`), writes garbage, or `stop` is set; then marks the link
/// dead, which resumes its requests elsewhere.
pub fn reader(
    link: Arc<WorkerLink>,
    mut consumer: Consumer,
    stop: Arc<AtomicBool>,
    heartbeat_limit: Duration,
) -> ReaderEnd {
    consumer.set_wait_config(ringbuf::WaitConfig {
        heartbeat_limit,
        ..ringbuf::WaitConfig::default()
    });
    let slot = link.slot.to_string();
    let end = loop {
        // Relaxed: a plain stop flag.
        if stop.load(Ordering::Relaxed) || !link.is_alive() {
            break ReaderEnd::Stopped;
        }
        let mut last = None;
        let mut bad = None;
        let mut draining = false;
        let r = consumer.pop_batch_wait(64, Duration::from_millis(100), |rec| {
            match peek_kind(rec.payload) {
                Ok(RecordKind::Tokens) => match link.dispatch(rec.payload) {
                    Ok(g) => last = Some(g),
                    Err(e) => bad = Some(e),
                },
                Ok(RecordKind::Draining) => match Draining::decode(rec.payload) {
                    Ok(()) => draining = true,
                    Err(e) => bad = Some(e),
                },
                Ok(other) => tracing::warn!(?other, "unexpected record on a response ring"),
                Err(e) => bad = Some(e),
            }
        });
        if let Some(e) = bad {
            // A corrupt Tokens record cannot be attributed to one request: the worker is unusable.
            tracing::error!(worker = link.slot, error = %e, "corrupt record from worker");
            break ReaderEnd::Corrupt;
        }
        if draining && !link.is_draining() {
            tracing::info!(worker = link.slot, "worker is draining");
            link.set_draining();
            // Tests and tools read this line.
            println!("worker {} draining", link.slot);
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
            Ok(0) => {}
            Ok(_) => continue,
            Err(ringbuf::Error::PeerDead { pid }) => {
                tracing::warn!(worker = link.slot, pid, "worker died");
                break ReaderEnd::WorkerGone;
            }
            Err(e) => {
                tracing::error!(worker = link.slot, error = %e, "response ring failed");
                break ReaderEnd::Corrupt;
            }
        }
        // Nothing arrived for a while: is the worker still there, and still beating?
        match consumer.peer_state() {
            PeerState::Alive { .. } => {}
            PeerState::Absent => {
                tracing::info!(worker = link.slot, "worker left its ring");
                break ReaderEnd::WorkerGone;
            }
            PeerState::Dead { pid } => {
                tracing::warn!(worker = link.slot, pid, "worker died");
                break ReaderEnd::WorkerGone;
            }
            PeerState::Unresponsive { pid, silent_for } => {
                tracing::error!(worker = link.slot, pid, ?silent_for, "worker is hung");
                metrics::counter!(m::WORKERS_HUNG).increment(1);
                break ReaderEnd::Hung;
            }
        }
    };
    link.mark_dead();
    end
}
