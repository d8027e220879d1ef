//! Benchmark drivers shared by `ringserve bench ring` and the criterion benchmarks
//! (`benches/ring.rs`): a peer that sinks or echoes records runs in a thread (heap rings) or in a
//! child process (shared-memory rings), and the caller measures throughput or round trips.
//!
//! The child is the running program re-executed: the caller says how (a [`Launcher`]), and the
//! child's `main` hands its arguments to [`child_main`].

use crate::error::{Error, Result};
use crate::memory::{HeapMemory, Memory};
use crate::{Consumer, Producer, Ring, Segment, WaitConfig};
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Record sizes the benchmarks sweep (payload bytes).
pub const SIZES: [usize; 4] = [8, 64, 512, 4096];
/// Batch sizes the benchmarks sweep.
pub const BATCHES: [usize; 2] = [1, 32];
/// Capacity of each benchmark ring.
pub const CAPACITY: usize = 256 * 1024;

const KIND_BEGIN: u16 = 1;
const KIND_ACK: u16 = 2;
const KIND_PING: u16 = 3;
const KIND_EXIT: u16 = 4;
const KIND_READY: u16 = 5;

/// How a side waits for its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-poll (`try_pop` / `try_push` with a spin hint).
    Spin,
    /// `pop_wait` / `push_wait`: a short spin, then a futex sleep.
    Futex,
}

impl WaitMode {
    fn as_str(self) -> &'static str {
        match self {
            WaitMode::Spin => "spin",
            WaitMode::Futex => "futex",
        }
    }
}

/// How to start the running program again in benchmark-child mode: `program args... <ring args>`.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The executable.
    pub program: PathBuf,
    /// Arguments that select child mode; the child's `main` passes what follows to [`child_main`].
    pub args: Vec<String>,
}

impl Launcher {
    /// This executable with `args` selecting child mode.
    pub fn current_exe(args: &[&str]) -> std::io::Result<Self> {
        Ok(Launcher {
            program: std::env::current_exe()?,
            args: args.iter().map(|s| s.to_string()).collect(),
        })
    }
}

const PATIENCE: Duration = Duration::from_secs(30);

fn stalled() -> Error {
    Error::Os {
        call: "benchmark peer",
        name: String::new(),
        source: std::io::Error::other("peer stalled"),
    }
}

fn pop<M: Memory>(
    rx: &mut Consumer<M>,
    mode: WaitMode,
    mut f: impl FnMut(u16, &[u8]),
) -> Result<()> {
    loop {
        let grant = match mode {
            WaitMode::Spin => rx.try_pop()?,
            WaitMode::Futex => rx.pop_wait(PATIENCE)?,
        };
        if let Some(g) = grant {
            f(g.kind(), &g);
            return Ok(());
        }
        if mode == WaitMode::Futex {
            return Err(stalled());
        }
        std::hint::spin_loop();
    }
}

fn push<M: Memory>(tx: &mut Producer<M>, mode: WaitMode, kind: u16, payload: &[u8]) -> Result<()> {
    match mode {
        WaitMode::Spin => {
            while !tx.try_push_kind(kind, payload)? {
                std::hint::spin_loop();
            }
            Ok(())
        }
        WaitMode::Futex => {
            let mut g = tx
                .reserve_wait(payload.len(), PATIENCE)?
                .ok_or_else(stalled)?;
            g.copy_from_slice(payload);
            g.set_kind(kind);
            g.commit();
            Ok(())
        }
    }
}

/// Reads a record's payload the way a real consumer would at least: first and last word.
#[inline]
fn touch(payload: &[u8]) -> u64 {
    let n = payload.len();
    let first = u64::from_le_bytes(payload[..8.min(n)].try_into().unwrap_or([0; 8]));
    let last = u64::from_le_bytes(payload[n.saturating_sub(8)..].try_into().unwrap_or([0; 8]));
    first ^ last
}

/// The peer's loop: sinks `BEGIN(count, batch)` streams of (kind 0) records and acknowledges
/// them, echoes pings, and returns on anything else.
fn serve<M: Memory>(rx: &mut Consumer<M>, tx: &mut Producer<M>, mode: WaitMode) -> Result<()> {
    let no_spin = WaitConfig {
        spin: 0,
        ..WaitConfig::default()
    };
    if mode == WaitMode::Futex {
        rx.set_wait_config(no_spin);
        tx.set_wait_config(no_spin);
    }
    loop {
        let mut cmd = (KIND_EXIT, Vec::new());
        pop(rx, mode, |kind, p| cmd = (kind, p.to_vec()))?;
        match cmd.0 {
            KIND_BEGIN => {
                let count = u64::from_le_bytes(cmd.1[..8].try_into().map_err(|_| stalled())?);
                let batch =
                    u64::from_le_bytes(cmd.1[8..16].try_into().map_err(|_| stalled())?) as usize;
                let mut left = count;
                let mut sum = 0u64;
                while left > 0 {
                    let n = rx.pop_batch(batch.min(left as usize), |r| sum ^= touch(r.payload))?;
                    if n == 0 {
                        std::hint::spin_loop();
                    }
                    left -= n as u64;
                }
                black_box(sum);
                push(tx, mode, KIND_ACK, &[])?;
            }
            KIND_PING => push(tx, mode, KIND_PING, &cmd.1)?,
            _ => return Ok(()),
        }
    }
}

/// The child side: `args` are `<to-ring> <from-ring> <spin|futex>` as written by [`Peer::process`].
pub fn child_main(args: &[String]) -> Result<()> {
    let [to, from, mode] = args else {
        return Err(Error::InvalidName(format!(
            "benchmark child arguments {args:?}"
        )));
    };
    let mode = if mode == "futex" {
        WaitMode::Futex
    } else {
        WaitMode::Spin
    };
    let mut rx = crate::attach(to)?.consumer()?;
    let mut tx = crate::attach(from)?.producer()?;
    push(&mut tx, WaitMode::Spin, KIND_READY, &[])?;
    serve(&mut rx, &mut tx, mode)
}

/// The measuring side's ends of two rings to a sink/echo peer.
pub struct Peer<M: Memory> {
    to: Producer<M>,
    from: Consumer<M>,
    child: Option<Child>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Peer<HeapMemory> {
    /// A peer on another thread of this process, over heap rings.
    pub fn thread(mode: WaitMode) -> Result<Self> {
        let (to, from) = (Ring::heap(CAPACITY)?, Ring::heap(CAPACITY)?);
        let (mut rx, mut tx) = (to.consumer()?, from.producer()?);
        let thread = std::thread::spawn(move || serve(&mut rx, &mut tx, mode));
        Ok(Peer {
            to: to.producer()?,
            from: from.consumer()?,
            child: None,
            thread: Some(thread),
        })
    }
}

impl Peer<Segment> {
    /// A peer in a child process, over shared-memory rings.
    pub fn process(launcher: &Launcher, mode: WaitMode) -> Result<Self> {
        let (to_name, from_name) = (
            crate::unique_name("ringserve-bench"),
            crate::unique_name("ringserve-bench"),
        );
        let (to, from) = (
            crate::create(&to_name, CAPACITY)?,
            crate::create(&from_name, CAPACITY)?,
        );
        let (tx, mut rx) = (to.producer()?, from.consumer()?);
        let child = Command::new(&launcher.program)
            .args(&launcher.args)
            .args([to_name.as_str(), from_name.as_str(), mode.as_str()])
            .spawn()
            .map_err(|source| Error::Os {
                call: "spawn benchmark child",
                name: to_name.clone(),
                source,
            })?;
        let mut ready = false;
        while !ready {
            // Until the child claims its roles its side is absent, so the wait times out, not fails.
            match rx.pop_wait(Duration::from_millis(100))? {
                Some(g) => ready = g.kind() == KIND_READY,
                None if child_exited(&child) => return Err(stalled()),
                None => {}
            }
        }
        // The rings stay alive through the producer/consumer handles (and unlink when they drop).
        Ok(Peer {
            to: tx,
            from: rx,
            child: Some(child),
            thread: None,
        })
    }
}

fn child_exited(child: &Child) -> bool {
    // SAFETY: kill with signal 0 only checks existence of our own (unreaped) child.
    unsafe { libc::kill(child.id() as libc::pid_t, 0) != 0 }
}

impl<M: Memory> Peer<M> {
    /// Sends `count` records of `size` bytes, published in batches of `batch`; returns the time
    /// from the first push until the peer acknowledged the last record.
    pub fn throughput(&mut self, size: usize, batch: usize, count: u64) -> Result<Duration> {
        let payload = vec![0xA5u8; size];
        let mut begin = [0u8; 16];
        begin[..8].copy_from_slice(&count.to_le_bytes());
        begin[8..].copy_from_slice(&(batch as u64).to_le_bytes());
        let start = Instant::now();
        push(&mut self.to, WaitMode::Spin, KIND_BEGIN, &begin)?;
        let mut sent = 0u64;
        while sent < count {
            let want = (batch as u64).min(count - sent);
            let mut b = self.to.batch();
            let mut k = 0;
            while k < want {
                let Some(mut g) = b.reserve(size)? else { break };
                g.copy_from_slice(&payload);
                g.commit();
                k += 1;
            }
            b.commit();
            sent += k;
            if k == 0 {
                std::hint::spin_loop();
            }
        }
        pop(&mut self.from, WaitMode::Spin, |_, _| ())?;
        Ok(start.elapsed())
    }

    /// `count` round trips of one `size`-byte record; returns each round trip in nanoseconds.
    pub fn ping_pong(&mut self, size: usize, count: usize, mode: WaitMode) -> Result<Vec<u64>> {
        let no_spin = WaitConfig {
            spin: 0,
            ..WaitConfig::default()
        };
        let config = if mode == WaitMode::Futex {
            no_spin
        } else {
            WaitConfig::default()
        };
        self.to.set_wait_config(config);
        self.from.set_wait_config(config);
        let payload = vec![0x5Au8; size];
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            push(&mut self.to, mode, KIND_PING, &payload)?;
            pop(&mut self.from, mode, |_, p| {
                black_box(touch(p));
            })?;
            samples.push(t.elapsed().as_nanos() as u64);
        }
        Ok(samples)
    }
}

impl<M: Memory> Drop for Peer<M> {
    fn drop(&mut self) {
        if let Ok(Some(mut g)) = self.to.reserve_wait(0, Duration::from_secs(1)) {
            g.set_kind(KIND_EXIT);
            g.commit();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `q`-quantile (0..=1) of `samples` (sorted in place).
pub fn quantile(samples: &mut [u64], q: f64) -> u64 {
    if samples.is_empty() {
        return 0;
    }
    samples.sort_unstable();
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[i.min(samples.len() - 1)]
}

/// Settings of [`report`].
#[derive(Clone, Copy, Debug)]
pub struct ReportConfig {
    /// Records per throughput measurement.
    pub records: u64,
    /// Round trips per ping-pong measurement.
    pub round_trips: usize,
    /// Measurements per cell; the table shows the best (least disturbed by other load).
    pub repeats: usize,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            records: 2_000_000,
            round_trips: 100_000,
            repeats: 3,
        }
    }
}

/// Runs the cross-process benchmark (and the same ring between two threads for reference) and
/// returns a table as text.
pub fn report(launcher: &Launcher, config: ReportConfig) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ring throughput ({} records per run, best of {}):",
        config.records, config.repeats
    );
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>22} {:>22}",
        "record", "batch", "cross-process", "in-process (threads)"
    );
    let mut xproc = Peer::process(launcher, WaitMode::Spin)?;
    let mut inproc = Peer::thread(WaitMode::Spin)?;
    for size in SIZES {
        for batch in BATCHES {
            let best = |peer: &mut dyn FnMut() -> Result<Duration>| -> Result<Duration> {
                let mut best = Duration::MAX;
                for _ in 0..config.repeats {
                    best = best.min(peer()?);
                }
                Ok(best)
            };
            let x = best(&mut || xproc.throughput(size, batch, config.records))?;
            let i = best(&mut || inproc.throughput(size, batch, config.records))?;
            let _ = writeln!(
                out,
                "{:>7}B {:>6} {:>22} {:>22}",
                size,
                batch,
                rate(config.records, size, x),
                rate(config.records, size, i)
            );
        }
    }
    drop((xproc, inproc));
    let _ = writeln!(
        out,
        "\nping-pong round trip, 64-byte records ({} round trips, best of {}):",
        config.round_trips, config.repeats
    );
    let _ = writeln!(
        out,
        "{:>26} {:>10} {:>10} {:>10}",
        "", "p50", "p99", "p99.9"
    );
    for mode in [WaitMode::Spin, WaitMode::Futex] {
        for (label, cross) in [("cross-process", true), ("in-process", false)] {
            let mut best: Option<[u64; 3]> = None;
            for _ in 0..config.repeats {
                let mut samples = if cross {
                    Peer::process(launcher, mode)?.ping_pong(64, config.round_trips, mode)?
                } else {
                    Peer::thread(mode)?.ping_pong(64, config.round_trips, mode)?
                };
                let q = [0.5, 0.99, 0.999].map(|q| quantile(&mut samples, q));
                best = Some(match best {
                    Some(b) if b[0] <= q[0] => b,
                    _ => q,
                });
            }
            let [p50, p99, p999] = best.unwrap_or_default();
            let _ = writeln!(
                out,
                "{:>26} {:>10} {:>10} {:>10}",
                format!("{label}, {}", mode.as_str()),
                ns(p50),
                ns(p99),
                ns(p999)
            );
        }
    }
    Ok(out)
}

fn rate(records: u64, size: usize, took: Duration) -> String {
    let secs = took.as_secs_f64();
    format!(
        "{:.1} M/s {:.2} GB/s",
        records as f64 / secs / 1e6,
        records as f64 * size as f64 / secs / 1e9
    )
}

fn ns(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1} µs", v as f64 / 1000.0)
    } else {
        format!("{v} ns")
    }
}
