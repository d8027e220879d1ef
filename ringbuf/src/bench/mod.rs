//! Benchmark drivers shared by `ringserve bench ring` and the criterion benchmarks
//! (`benches/ring.rs`): a peer that sinks or echoes records runs in a thread (heap rings) or in a
//! child process (shared-memory rings), and the caller measures throughput or round trips. Both
//! sides can be pinned to separate CPUs ([`Pinning`]), and every throughput run reports both sides'
//! [`SideStats`]: how often the ring was full or empty, and how many futex sleeps and wakes it took.
//! [`stress`] is the many-pair, random-size, checksummed stress test with a producer-killing fault
//! mode.
//!
//! The child is the running program re-executed: the caller says how (a [`Launcher`]), and the
//! child's `main` hands its arguments to [`child_main`] (or [`stress::child_main`]).

pub mod stress;

use crate::error::{Error, Result};
use crate::memory::{HeapMemory, Memory};
use crate::{Consumer, Producer, Ring, Segment, SideStats, WaitConfig};
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
    /// `spin` or `futex`.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitMode::Spin => "spin",
            WaitMode::Futex => "futex",
        }
    }
}

/// How the sending side writes a throughput run's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Each record written in place through a reservation (`Batch::reserve`), the zero-copy path.
    InPlace,
    /// Each batch copied from an array of equal records with `Batch::push_slice` (one header and
    /// one copy for the batch): the bulk path, like rtrb's `write_chunk_uninit`. Sizes outside
    /// [`SIZES`] fall back to [`Fill::InPlace`].
    Slice,
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

/// The CPUs the calling thread may run on, in increasing order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed; pid 0 is the calling thread.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        set
    };
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `i` is below CPU_SETSIZE, the number of CPUs a cpu_set_t holds.
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
}

/// Pins the calling thread (and threads and processes it starts afterwards) to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(Error::Os {
            call: "sched_setaffinity",
            name: format!("cpu {cpu}"),
            source: std::io::Error::from_raw_os_error(libc::EINVAL),
        });
    }
    // SAFETY: `set` is a valid cpu_set_t given one CPU below CPU_SETSIZE; pid 0 is this thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(Error::Os {
            call: "sched_setaffinity",
            name: format!("cpu {cpu}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Where the two sides of a benchmark run: the measuring thread on `this`, the peer on `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pinning {
    /// CPU of the measuring side.
    pub this: usize,
    /// CPU of the peer (thread or child process).
    pub peer: usize,
}

impl Pinning {
    /// The last two CPUs this thread may use (CPU 0 takes most interrupts), or `None` with fewer
    /// than two.
    pub fn separate() -> Option<Pinning> {
        let cpus = allowed_cpus();
        match cpus[..] {
            [.., this, peer] => Some(Pinning { this, peer }),
            _ => None,
        }
    }
}

/// One throughput measurement: the time from the first push until the peer acknowledged the last
/// record, and both sides' slow-path counters over the run.
#[derive(Clone, Copy, Debug)]
pub struct Throughput {
    /// Wall time of the run.
    pub took: Duration,
    /// The sending side (full-ring stalls, sleeps waiting for room, wakes of the sink).
    pub producer: SideStats,
    /// The sink (empty-ring stalls, sleeps waiting for data, wakes of the sender).
    pub consumer: SideStats,
}

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

/// [`touch`] for each record of a run, through the typed view where the size has one (the way
/// rtrb's contestant reads its `[u8; N]` items).
#[inline]
fn touch_run(recs: &crate::Records<'_>) -> u64 {
    fn arrays<const N: usize>(items: &[[u8; N]]) -> u64 {
        items.iter().fold(0, |sum, item| sum ^ touch(item))
    }
    if let Some(items) = recs.as_arrays::<8>() {
        arrays(items)
    } else if let Some(items) = recs.as_arrays::<64>() {
        arrays(items)
    } else {
        recs.iter().fold(0, |sum, r| sum ^ touch(r))
    }
}

/// The peer's loop: sinks `BEGIN(count, batch)` streams of (kind 0) records and acknowledges
/// them, echoes pings, and returns on anything else.
fn serve<M: Memory>(rx: &mut Consumer<M>, tx: &mut Producer<M>, mode: WaitMode) -> Result<()> {
    // Between commands the peer waits on the futex after a spin: long enough (1 ms) that a
    // spinning ping-pong never sleeps, short enough that an idle peer (the other contestant of a
    // group, pinned to the same CPU) does not steal the CPU from the one being measured. Pings
    // are request/response traffic: the consumer prefetches the line after its head's.
    let idle = WaitConfig {
        spin: match mode {
            WaitMode::Spin => Duration::from_millis(1),
            WaitMode::Futex => Duration::ZERO,
        },
        prefetch_next_line: true,
        ..WaitConfig::default()
    };
    rx.set_wait_config(idle);
    tx.set_wait_config(idle);
    let mut cmd = (KIND_EXIT, Vec::new());
    loop {
        // A dead parent ends the wait with `PeerDead`; an idle one just keeps us waiting.
        let g = loop {
            if let Some(g) = rx.pop_wait(Duration::from_secs(1))? {
                break g;
            }
        };
        if g.kind() == KIND_PING {
            // Echoed from the borrowed record: no copy on the round trip's path.
            push(tx, mode, KIND_PING, &g)?;
            continue;
        }
        cmd.0 = g.kind();
        cmd.1.clear();
        cmd.1.extend_from_slice(&g);
        drop(g);
        match cmd.0 {
            KIND_BEGIN => {
                let word = |i: usize| -> Result<u64> {
                    let bytes = cmd.1.get(i * 8..i * 8 + 8).ok_or_else(stalled)?;
                    Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| stalled())?))
                };
                let (count, batch) = (word(0)?, word(1)? as usize);
                let runs = word(3)? == 1;
                let sink_mode = if word(2)? == 1 {
                    WaitMode::Futex
                } else {
                    WaitMode::Spin
                };
                rx.set_wait_config(match sink_mode {
                    WaitMode::Futex => WaitConfig::default(),
                    WaitMode::Spin => WaitConfig {
                        prefetch_next_line: false,
                        ..idle
                    },
                });
                let before = rx.stats();
                let mut left = count;
                let mut sum = 0u64;
                while left > 0 {
                    let max = batch.min(left as usize);
                    // The bulk sender's records are read a run at a time, the others one by one.
                    let run = |recs: crate::Records<'_>| sum ^= touch_run(&recs);
                    let n = match (sink_mode, runs) {
                        (WaitMode::Spin, false) => {
                            rx.pop_batch(max, |r| sum ^= touch(r.payload))?
                        }
                        (WaitMode::Spin, true) => rx.pop_runs(max, run)?,
                        (WaitMode::Futex, false) => {
                            rx.pop_batch_wait(max, PATIENCE, |r| sum ^= touch(r.payload))?
                        }
                        (WaitMode::Futex, true) => rx.pop_runs_wait(max, PATIENCE, run)?,
                    };
                    if n == 0 {
                        if sink_mode == WaitMode::Futex {
                            return Err(stalled());
                        }
                        std::hint::spin_loop();
                    }
                    left -= n as u64;
                }
                black_box(sum);
                let stats = rx.stats().since(&before);
                rx.set_wait_config(idle);
                push(tx, mode, KIND_ACK, &stats.to_bytes())?;
            }
            _ => return Ok(()),
        }
    }
}

/// The child side: `args` are `<to-ring> <from-ring> <spin|futex> [cpu]` as written by
/// [`Peer::process`].
pub fn child_main(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("stress") => return stress::child_main(&args[1..]),
        Some("word") => {
            let lines = match args.get(2).map(String::as_str) {
                Some("1") => WordLines::One,
                Some("2") => WordLines::Two,
                other => {
                    return Err(Error::InvalidName(format!(
                        "benchmark child word lines {other:?}"
                    )));
                }
            };
            if let Some(cpu) = args.get(3) {
                let cpu = cpu
                    .parse()
                    .map_err(|_| Error::InvalidName(format!("benchmark child cpu {cpu:?}")))?;
                pin_current_thread(cpu)?;
            }
            let name = args
                .get(1)
                .ok_or_else(|| Error::InvalidName(format!("benchmark child arguments {args:?}")))?;
            return word_child(name, lines);
        }
        _ => {}
    }
    let (to, from, mode, cpu) = match args {
        [to, from, mode] => (to, from, mode, None),
        [to, from, mode, cpu] => (to, from, mode, Some(cpu)),
        _ => {
            return Err(Error::InvalidName(format!(
                "benchmark child arguments {args:?}"
            )));
        }
    };
    if let Some(cpu) = cpu {
        let cpu = cpu
            .parse()
            .map_err(|_| Error::InvalidName(format!("benchmark child cpu {cpu:?}")))?;
        pin_current_thread(cpu)?;
    }
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
    /// A peer on another thread of this process, over heap rings. With `pin`, the peer thread runs
    /// on `pin.peer` and the calling thread is moved to `pin.this`.
    pub fn thread(mode: WaitMode, pin: Option<Pinning>) -> Result<Self> {
        let (to, from) = (Ring::heap(CAPACITY)?, Ring::heap(CAPACITY)?);
        let (mut rx, mut tx) = (to.consumer()?, from.producer()?);
        if let Some(pin) = pin {
            pin_current_thread(pin.this)?;
        }
        let thread = std::thread::spawn(move || {
            if let Some(pin) = pin {
                pin_current_thread(pin.peer)?;
            }
            serve(&mut rx, &mut tx, mode)
        });
        Ok(Peer {
            to: to.producer()?,
            from: from.consumer()?,
            child: None,
            thread: Some(thread),
        })
    }
}

impl Peer<Segment> {
    /// A peer in a child process, over shared-memory rings. With `pin`, the child runs on
    /// `pin.peer` and the calling thread is moved to `pin.this`.
    pub fn process(launcher: &Launcher, mode: WaitMode, pin: Option<Pinning>) -> Result<Self> {
        if let Some(pin) = pin {
            pin_current_thread(pin.this)?;
        }
        let (to_name, from_name) = (
            crate::unique_name("ringserve-bench"),
            crate::unique_name("ringserve-bench"),
        );
        let (to, from) = (
            crate::create(&to_name, CAPACITY)?,
            crate::create(&from_name, CAPACITY)?,
        );
        let (tx, mut rx) = (to.producer()?, from.consumer()?);
        let mut child = Command::new(&launcher.program)
            .args(&launcher.args)
            .args([to_name.as_str(), from_name.as_str(), mode.as_str()])
            .args(pin.map(|p| p.peer.to_string()))
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
                None if child_exited(&mut child) => return Err(stalled()),
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

fn child_exited(child: &mut Child) -> bool {
    // An exited child is a zombie until reaped, so ask `try_wait`, not `kill(pid, 0)`.
    !matches!(child.try_wait(), Ok(None))
}

impl<M: Memory> Peer<M> {
    /// Sends `count` records of `size` bytes, written as `fill` says and published in batches of
    /// `batch`; both sides poll when `mode` is [`WaitMode::Spin`] and sleep on the futex when the
    /// ring is full or empty with [`WaitMode::Futex`].
    pub fn throughput(
        &mut self,
        size: usize,
        batch: usize,
        count: u64,
        mode: WaitMode,
        fill: Fill,
    ) -> Result<Throughput> {
        let mut begin = [0u8; 32];
        begin[..8].copy_from_slice(&count.to_le_bytes());
        begin[8..16].copy_from_slice(&(batch as u64).to_le_bytes());
        begin[16..24].copy_from_slice(&u64::from(mode == WaitMode::Futex).to_le_bytes());
        begin[24..].copy_from_slice(&u64::from(fill == Fill::Slice).to_le_bytes());
        let before = self.to.stats();
        let start = Instant::now();
        push(&mut self.to, WaitMode::Spin, KIND_BEGIN, &begin)?;
        let tx = &mut self.to;
        match (fill, size) {
            (Fill::Slice, 8) => send_slices::<_, 8>(tx, batch, count, mode)?,
            (Fill::Slice, 64) => send_slices::<_, 64>(tx, batch, count, mode)?,
            (Fill::Slice, 512) => send_slices::<_, 512>(tx, batch, count, mode)?,
            (Fill::Slice, 4096) => send_slices::<_, 4096>(tx, batch, count, mode)?,
            _ => send_in_place(tx, size, batch, count, mode)?,
        }
        let mut consumer = None;
        pop(&mut self.from, WaitMode::Spin, |_, p| {
            consumer = SideStats::from_bytes(p)
        })?;
        Ok(Throughput {
            took: start.elapsed(),
            producer: self.to.stats().since(&before),
            consumer: consumer.ok_or_else(stalled)?,
        })
    }

    /// `count` round trips of one `size`-byte record; returns each round trip in nanoseconds.
    pub fn ping_pong(&mut self, size: usize, count: usize, mode: WaitMode) -> Result<Vec<u64>> {
        let config = WaitConfig {
            spin: match mode {
                WaitMode::Futex => Duration::ZERO,
                WaitMode::Spin => WaitConfig::default().spin,
            },
            prefetch_next_line: true,
            ..WaitConfig::default()
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

/// After a send found the ring full: a spin hint, or a sleep until one `size`-byte record fits.
fn wait_full<M: Memory>(tx: &mut Producer<M>, size: usize, mode: WaitMode) -> Result<()> {
    match mode {
        WaitMode::Spin => std::hint::spin_loop(),
        WaitMode::Futex => {
            // The grant is dropped, publishing nothing.
            tx.reserve_wait(size, PATIENCE)?.ok_or_else(stalled)?;
        }
    }
    Ok(())
}

/// [`Fill::InPlace`]: `count` records of `size` bytes through reservations, `batch` a commit.
fn send_in_place<M: Memory>(
    tx: &mut Producer<M>,
    size: usize,
    batch: usize,
    count: u64,
    mode: WaitMode,
) -> Result<()> {
    let payload = vec![0xA5u8; size];
    let mut sent = 0u64;
    while sent < count {
        let want = (batch as u64).min(count - sent);
        let mut b = tx.batch();
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
            wait_full(tx, size, mode)?;
        }
    }
    Ok(())
}

/// [`Fill::Slice`]: `count` records of `N` bytes, each batch one `push_slice` of up to `batch`.
fn send_slices<M: Memory, const N: usize>(
    tx: &mut Producer<M>,
    batch: usize,
    count: u64,
    mode: WaitMode,
) -> Result<()> {
    let items = vec![[0xA5u8; N]; batch.max(1)];
    let mut sent = 0u64;
    while sent < count {
        let want = (batch as u64).min(count - sent) as usize;
        let k = tx.push_slice(0, &items[..want])?;
        sent += k as u64;
        if k == 0 {
            wait_full(tx, N, mode)?;
        }
    }
    Ok(())
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

/// A page of shared memory holding the words of [`word_ping_pong`].
struct Word {
    shm: crate::PrivateShm,
}

/// Byte offset of the answer word when the answer has a line of its own: a 128-byte block apart,
/// so that the adjacent-line prefetcher never pairs it with the question's line.
const ANSWER_OFFSET: usize = 128;

impl Word {
    /// The question word (offset 0), or with `answer` the word the answer goes to.
    fn word(&self, lines: WordLines, answer: bool) -> &std::sync::atomic::AtomicU64 {
        let offset = match (lines, answer) {
            (WordLines::Two, true) => ANSWER_OFFSET,
            _ => 0,
        };
        // SAFETY: the mapping is page-aligned and at least ANSWER_OFFSET + 8 bytes long (checked
        // at create/open), so `offset` (0 or ANSWER_OFFSET) is in bounds and 8-byte aligned; it
        // lives as long as `self`, and both processes access these words only atomically.
        unsafe {
            std::sync::atomic::AtomicU64::from_ptr(self.shm.as_ptr().add(offset).cast::<u64>())
        }
    }
}

/// What a [`word_ping_pong`] moves between the two cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordLines {
    /// One word, question and answer: one cache line moves back and forth, and a core that read
    /// it may write it without asking again. The floor under any ping-pong.
    One,
    /// The question in one line, the answer in another: the floor under two rings (each side
    /// writes one line and polls the other's), rtrb's as ringbuf's.
    Two,
}

impl WordLines {
    fn as_str(self) -> &'static str {
        match self {
            WordLines::One => "1",
            WordLines::Two => "2",
        }
    }
}

const WORD_EXIT: u64 = u64::MAX;

/// The child of [`word_ping_pong`]: answers each new odd value with the next even one until told
/// to stop.
fn word_child(name: &str, lines: WordLines) -> Result<()> {
    let shm = crate::PrivateShm::open(name)?;
    if shm.len() < ANSWER_OFFSET + 8 {
        return Err(Error::InvalidName(format!("word segment {name} too short")));
    }
    let w = Word { shm };
    let (question, answer) = (w.word(lines, false), w.word(lines, true));
    let started = Instant::now();
    let mut answered = 0;
    let mut polls = 0u32;
    loop {
        // SYNC: Acquire/Release pair with the parent's stores and loads in `word_ping_pong`; a
        // round trip needs nothing else.
        let v = question.load(std::sync::atomic::Ordering::Acquire);
        if v == WORD_EXIT {
            return Ok(());
        }
        if v != answered && v % 2 == 1 {
            answer.store(v + 1, std::sync::atomic::Ordering::Release);
            answered = v;
        } else {
            polls = polls.wrapping_add(1);
            // The clock only now and then: reading it on every poll would delay the answer.
            if polls.is_multiple_of(1 << 16) && started.elapsed() > PATIENCE * 4 {
                return Err(stalled());
            }
        }
        std::hint::spin_loop();
    }
}

/// `count` round trips of bare shared words between this process and a child, both spinning:
/// the floor under any cross-process ping-pong (`One`) or under any pair of rings (`Two`) on this
/// machine. Returns nanoseconds per round trip.
pub fn word_ping_pong(
    launcher: &Launcher,
    lines: WordLines,
    count: usize,
    pin: Option<Pinning>,
) -> Result<Vec<u64>> {
    if let Some(pin) = pin {
        pin_current_thread(pin.this)?;
    }
    let name = crate::unique_name("ringserve-bench-word");
    let w = Word {
        shm: crate::PrivateShm::create(&name, 4096)?,
    };
    let mut child = Command::new(&launcher.program)
        .args(&launcher.args)
        .args(["word", name.as_str(), lines.as_str()])
        .args(pin.map(|p| p.peer.to_string()))
        .spawn()
        .map_err(|source| Error::Os {
            call: "spawn benchmark child",
            name: name.clone(),
            source,
        })?;
    let (question, answer) = (w.word(lines, false), w.word(lines, true));
    let mut samples = Vec::with_capacity(count);
    let result = (|| {
        // Warm-up: the first answer also says the child is running.
        let warm_up = count.min(1000) as u64;
        for i in 0..count as u64 + warm_up {
            let t = Instant::now();
            question.store(2 * i + 1, std::sync::atomic::Ordering::Release);
            // SYNC: Acquire pairs with the child's Release store of the answer.
            let mut polls = 0u32;
            while answer.load(std::sync::atomic::Ordering::Acquire) != 2 * i + 2 {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(1 << 16)
                    && (t.elapsed() > PATIENCE || child_exited(&mut child))
                {
                    return Err(stalled());
                }
                std::hint::spin_loop();
            }
            if i >= warm_up {
                samples.push(t.elapsed().as_nanos() as u64);
            }
        }
        Ok(())
    })();
    question.store(WORD_EXIT, std::sync::atomic::Ordering::Release);
    let _ = child.wait();
    result.map(|()| samples)
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
    /// Measurements per cell, taken round-robin between the contestants; the table shows the
    /// median.
    pub repeats: usize,
    /// Where the two sides run (`None`: wherever the scheduler puts them).
    pub pin: Option<Pinning>,
    /// The wait modes to measure throughput in.
    pub modes: &'static [WaitMode],
    /// How the sender writes records.
    pub fill: Fill,
}

impl Default for ReportConfig {
    fn default() -> Self {
        ReportConfig {
            records: 2_000_000,
            round_trips: 100_000,
            repeats: 5,
            pin: Pinning::separate(),
            modes: &[WaitMode::Spin, WaitMode::Futex],
            fill: Fill::InPlace,
        }
    }
}

/// The median measurement of `runs` (by time), with its counters.
fn median(runs: &mut [Throughput]) -> Throughput {
    runs.sort_by_key(|r| r.took);
    runs[runs.len() / 2]
}

fn stats_cell(s: &SideStats, records: u64) -> String {
    // Per million records, so cells compare across record counts.
    let per_m = |v: u64| v as f64 * 1e6 / records as f64;
    format!(
        "{:.0}/{:.0} {:.0}/{:.0}",
        per_m(s.stalls),
        per_m(s.refreshes),
        per_m(s.sleeps),
        per_m(s.wakes)
    )
}

/// Runs the cross-process benchmark (and the same ring between two threads for reference) and
/// returns a table as text: per record size, batch and wait mode, the median rate, and both sides'
/// counters in the cross-process run.
pub fn report(launcher: &Launcher, config: ReportConfig) -> Result<String> {
    let mut out = String::new();
    let repeats = config.repeats.max(1);
    let pin = match config.pin {
        Some(p) => format!("sides pinned to CPUs {} and {}", p.this, p.peer),
        None => "sides not pinned".to_string(),
    };
    let _ = writeln!(
        out,
        "ring throughput ({} records per run, written {}, median of {repeats}, {pin}):",
        config.records,
        match config.fill {
            Fill::InPlace => "in place through reservations",
            Fill::Slice => "from arrays with push_slice",
        }
    );
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>6} {:>22} {:>22}  {:>24} {:>24}",
        "record",
        "batch",
        "wait",
        "cross-process",
        "in-process (threads)",
        "producer full/reloads",
        "consumer empty/reloads"
    );
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>6} {:>22} {:>22}  {:>24} {:>24}",
        "", "", "", "", "", "sleeps/wakes per M", "sleeps/wakes per M"
    );
    // The machine's own cross-core latency, before and after: on a VM it changes when the host
    // moves the vCPUs (same core complex or not), and every figure below moves with it.
    let word_p50 = || -> Result<u64> {
        let mut samples = word_ping_pong(
            launcher,
            WordLines::One,
            config.round_trips.min(20_000),
            config.pin,
        )?;
        Ok(quantile(&mut samples, 0.5))
    };
    let word_before = word_p50()?;
    let mut xproc = Peer::process(launcher, WaitMode::Spin, config.pin)?;
    let mut inproc = Peer::thread(WaitMode::Spin, config.pin)?;
    for size in SIZES {
        for batch in BATCHES {
            for &mode in config.modes {
                let (mut xs, mut is) = (Vec::new(), Vec::new());
                for _ in 0..repeats {
                    xs.push(xproc.throughput(size, batch, config.records, mode, config.fill)?);
                    is.push(inproc.throughput(size, batch, config.records, mode, config.fill)?);
                }
                let (x, i) = (median(&mut xs), median(&mut is));
                let _ = writeln!(
                    out,
                    "{:>7}B {:>6} {:>6} {:>22} {:>22}  {:>24} {:>24}",
                    size,
                    batch,
                    mode.as_str(),
                    rate(config.records, size, x.took),
                    rate(config.records, size, i.took),
                    stats_cell(&x.producer, config.records),
                    stats_cell(&x.consumer, config.records),
                );
            }
        }
    }
    drop((xproc, inproc));
    let word_after = word_p50()?;
    let _ = writeln!(
        out,
        "(cache-line round trip between the two CPUs, a bare shared word: p50 {} before the \
         table, {} after)",
        ns(word_before),
        ns(word_after)
    );
    let _ = writeln!(
        out,
        "\nping-pong round trip, 64-byte records unless marked ({} round trips, median of \
         {repeats} by p50):",
        config.round_trips
    );
    let _ = writeln!(
        out,
        "{:>26} {:>10} {:>10} {:>10}",
        "", "p50", "p99", "p99.9"
    );
    // One row: the run with the median p50 of `repeats` runs of `measure`.
    let mut row = |label: &str, measure: &mut dyn FnMut() -> Result<Vec<u64>>| -> Result<()> {
        let mut runs = Vec::new();
        for _ in 0..repeats {
            let mut samples = measure()?;
            runs.push([0.5, 0.99, 0.999].map(|q| quantile(&mut samples, q)));
        }
        runs.sort_by_key(|q| q[0]);
        let [p50, p99, p999] = runs[runs.len() / 2];
        let _ = writeln!(
            out,
            "{label:>26} {:>10} {:>10} {:>10}",
            ns(p50),
            ns(p99),
            ns(p999)
        );
        Ok(())
    };
    row("bare shared word, spin", &mut || {
        word_ping_pong(launcher, WordLines::One, config.round_trips, config.pin)
    })?;
    row("two shared words, spin", &mut || {
        word_ping_pong(launcher, WordLines::Two, config.round_trips, config.pin)
    })?;
    for mode in [WaitMode::Spin, WaitMode::Futex] {
        row(&format!("cross-process, {}", mode.as_str()), &mut || {
            Peer::process(launcher, mode, config.pin)?.ping_pong(64, config.round_trips, mode)
        })?;
        row(&format!("in-process, {}", mode.as_str()), &mut || {
            Peer::thread(mode, config.pin)?.ping_pong(64, config.round_trips, mode)
        })?;
    }
    row("cross-process, spin, 8 B", &mut || {
        Peer::process(launcher, WaitMode::Spin, config.pin)?.ping_pong(
            8,
            config.round_trips,
            WaitMode::Spin,
        )
    })?;
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

pub(crate) fn ns(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1} µs", v as f64 / 1000.0)
    } else {
        format!("{v} ns")
    }
}
