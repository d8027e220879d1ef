//! A worker's liveness and leaving: the heartbeat thread ([`Pulse`]) and the drain request
//! (SIGTERM, or [`Lifecycle::drain`]).
//!
//! Heartbeats: the gateway declares a worker hung when its response ring's producer heartbeat is
//! older than a second. The serving loop cannot beat while an engine step runs (a long prefill on a
//! loaded CPU, a slow CUDA step), so a small thread beats every [`PULSE_INTERVAL`] for it — but
//! only while the loop keeps making progress: when the loop has not come around for
//! [`Lifecycle::long_step_timeout`] (a deadlock, a step that never ends), the thread withholds the
//! heartbeat and the gateway treats the worker as hung. A stopped process (SIGSTOP) beats nothing.
//!
//! Draining: SIGTERM sets a flag; the loop then tells the gateway ([`protos::records::Draining`]),
//! keeps serving what it has, and exits once the gateway released it and the engine is idle.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringbuf::Heartbeat;

/// How often the heartbeat thread beats (the gateway's limit is ten times this).
pub const PULSE_INTERVAL: Duration = Duration::from_millis(100);

/// Default [`Lifecycle::long_step_timeout`]: far above any healthy step (seconds on a large
/// prefill), short enough that a deadlocked worker is replaced within minutes.
pub const DEFAULT_LONG_STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// How the serving loop stays visibly alive and how it is asked to leave.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    /// The loop may go this long without coming around before its heartbeat stops.
    pub long_step_timeout: Duration,
    /// Set to make the worker drain and leave (as SIGTERM does once
    /// [`install_sigterm_drain`] ran).
    pub drain: Arc<AtomicBool>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            long_step_timeout: DEFAULT_LONG_STEP_TIMEOUT,
            drain: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Lifecycle {
    /// Whether the worker was asked to drain (by its flag or by SIGTERM).
    pub fn drain_requested(&self) -> bool {
        // Relaxed: plain flags; nothing is published through them.
        self.drain.load(Ordering::Relaxed) || SIGTERM_RECEIVED.load(Ordering::Relaxed)
    }
}

/// Set by the SIGTERM handler.
static SIGTERM_RECEIVED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_signal: libc::c_int) {
    // Async-signal-safe: one lock-free atomic store.
    SIGTERM_RECEIVED.store(true, Ordering::Relaxed);
}

/// Makes SIGTERM ask this process's serving loop to drain instead of killing the process.
pub fn install_sigterm_drain() -> std::io::Result<()> {
    // SAFETY: all-zero is a valid `sigaction` (no flags, empty mask) before the fields are set.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
    action.sa_flags = libc::SA_RESTART;
    // SAFETY: `action.sa_mask` is a valid, writable sigset_t owned by this frame.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialised, its handler only performs an atomic store (async-
    // signal-safe), and a null old-action pointer is allowed.
    let rc = unsafe { libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The heartbeat thread; it stops when dropped.
pub struct Pulse {
    shared: Arc<PulseShared>,
    thread: Option<JoinHandle<()>>,
}

struct PulseShared {
    start: Instant,
    /// Nanoseconds since `start` at the loop's last progress.
    progress: AtomicU64,
    stop: AtomicBool,
}

impl PulseShared {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
    }
}

impl Pulse {
    /// Starts beating `hearts` every [`PULSE_INTERVAL`] while [`Pulse::progress`] is called at
    /// least every `long_step_timeout`.
    pub fn start(hearts: Vec<Heartbeat>, long_step_timeout: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(PulseShared {
            start: Instant::now(),
            progress: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let limit = long_step_timeout.as_nanos().min(u128::from(u64::MAX)) as u64;
        let thread = std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let mut withheld = false;
                // Relaxed: a plain stop flag.
                while !s.stop.load(Ordering::Relaxed) {
                    // Relaxed: a timestamp; no data is published through it.
                    let since = s.now().saturating_sub(s.progress.load(Ordering::Relaxed));
                    if since <= limit {
                        for h in &hearts {
                            h.beat();
                        }
                        withheld = false;
                    } else if !withheld {
                        withheld = true;
                        tracing::error!(
                            stalled_for = ?Duration::from_nanos(since),
                            ?long_step_timeout,
                            "the serving loop made no progress: heartbeat withheld"
                        );
                    }
                    std::thread::park_timeout(PULSE_INTERVAL);
                }
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The loop came around (call at least once per step).
    pub fn progress(&self) {
        // Relaxed: a timestamp read by the heartbeat thread; nothing else depends on it.
        self.shared
            .progress
            .store(self.shared.now(), Ordering::Relaxed);
    }
}

impl Drop for Pulse {
    fn drop(&mut self) {
        // Relaxed: a plain stop flag; the join below synchronizes.
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringbuf::{PeerState, Ring, WaitConfig};

    #[test]
    fn beats_while_the_loop_progresses_and_stops_when_it_does_not() {
        let name = ringbuf::unique_name("rs-pulse-test");
        let ring: Ring = ringbuf::create(&name, 4096).unwrap();
        let producer = ring.producer().unwrap();
        let mut consumer = ring.consumer().unwrap();
        consumer.set_wait_config(WaitConfig {
            heartbeat_limit: Duration::from_secs(1),
            ..WaitConfig::default()
        });
        let pulse =
            Pulse::start(vec![producer.heartbeat_handle()], Duration::from_secs(2)).unwrap();
        // The loop is "in a step" longer than the heartbeat limit but within the long step
        // timeout: the thread beats for it.
        for _ in 0..2 {
            pulse.progress();
            std::thread::sleep(Duration::from_millis(1500));
            assert!(matches!(consumer.peer_state(), PeerState::Alive { .. }));
        }
        // No progress for well over the timeout plus the limit: the heartbeat goes stale.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if matches!(consumer.peer_state(), PeerState::Unresponsive { .. }) {
                break;
            }
            assert!(Instant::now() < deadline, "the heartbeat never went stale");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Progress again: beating resumes.
        pulse.progress();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !matches!(consumer.peer_state(), PeerState::Alive { .. }) {
            assert!(Instant::now() < deadline, "the heartbeat never resumed");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(pulse);
    }

    #[test]
    fn drain_flag_is_seen() {
        let l = Lifecycle::default();
        assert!(!l.drain.load(Ordering::Relaxed));
        l.drain.store(true, Ordering::Relaxed);
        assert!(l.drain_requested());
    }
}
