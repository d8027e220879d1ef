//! The ring stress test (`ringserve bench ring --stress`): `pairs` producer and consumer processes,
//! one data ring and one echo ring per pair, records of random sizes whose every byte is checked,
//! round trips timed under that load, and — in fault mode — producers SIGKILLed at random moments
//! and restarted.
//!
//! Each record's first word is its tag, `incarnation << 48 | sequence`; its length and every
//! following byte are functions of the tag, so the consumer recomputes the record it should have
//! got and counts any difference as torn, and any gap in an incarnation's sequence as lost. A
//! producer incarnation starts at sequence 0. Every `PING_EVERY`th batch begins with a ping record
//! carrying the producer's clock; the consumer echoes it on the echo ring, and the producer records
//! the round trip.
//!
//! The children report on stdout, one line per event (`tick`, `rtt`, `dead`, `done`), and the parent
//! folds the lines into a [`StressReport`].

use super::{Launcher, pin_current_thread};
use crate::error::{Error, Result};
use crate::liveness::now_ns;
use crate::{Consumer, Memory, Producer, Segment, WaitConfig};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Capacity of each stress ring (a 4-KiB record is 1/256 of it).
pub const CAPACITY: usize = 1 << 20;
/// Smallest record payload (the tag).
pub const MIN_SIZE: usize = 8;
/// Largest record payload.
pub const MAX_SIZE: usize = 4096;

const KIND_DATA: u16 = 1;
const KIND_PING: u16 = 2;
const PING_EVERY: u64 = 16;
const MAX_BATCH: u64 = 32;
const WAIT: Duration = Duration::from_millis(20);
/// How long after the deadline a consumer waits for its producer's last records.
const GRACE: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// Producer/consumer process pairs.
    pub pairs: usize,
    /// How long the producers write.
    pub duration: Duration,
    /// Width of one bucket of the time series.
    pub interval: Duration,
    /// Fault mode: the mean time between SIGKILLs of a random producer (`None`: no faults).
    pub kill_every: Option<Duration>,
    /// Seed of the record sizes, batch sizes and kill times.
    pub seed: u64,
    /// Pin pair `i`'s producer and consumer to CPUs `2i` and `2i + 1` of the allowed set (when
    /// there are enough).
    pub pin: bool,
}

impl StressConfig {
    /// One pair per two allowed CPUs (at least one), 30 s, no faults.
    pub fn new() -> Self {
        StressConfig {
            pairs: (super::allowed_cpus().len() / 2).max(1),
            duration: Duration::from_secs(30),
            interval: Duration::from_secs(1),
            kill_every: None,
            seed: 0x5EED,
            pin: true,
        }
    }
}

impl Default for StressConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Latency percentiles in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    /// Samples behind them.
    pub count: usize,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
}

impl Percentiles {
    /// The percentiles of `samples` (sorted in place).
    pub fn of(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: samples.len(),
            p50: super::quantile(samples, 0.5),
            p99: super::quantile(samples, 0.99),
            p999: super::quantile(samples, 0.999),
            max: samples[samples.len() - 1],
        }
    }
}

/// One pair's totals.
#[derive(Clone, Debug, Default)]
pub struct PairReport {
    /// Records the consumer checked.
    pub records: u64,
    /// Payload bytes the consumer checked.
    pub bytes: u64,
    /// Records whose length or bytes differed from what their tag says.
    pub torn: u64,
    /// Sequence numbers missing inside a producer incarnation.
    pub lost: u64,
    /// Round trips under load.
    pub latency: Percentiles,
    /// Producer incarnations that ran (1 + restarts).
    pub incarnations: u32,
}

/// One bucket of the time series, over all pairs.
#[derive(Clone, Copy, Debug, Default)]
pub struct SeriesPoint {
    /// End of the bucket, seconds since the start.
    pub t: f64,
    /// Records checked per second in the bucket.
    pub records_per_s: f64,
    /// Payload gigabytes checked per second in the bucket.
    pub gb_per_s: f64,
    /// Round trips that ended in the bucket.
    pub latency: Percentiles,
}

/// What a stress run saw.
#[derive(Clone, Debug, Default)]
pub struct StressReport {
    /// Pairs that ran.
    pub pairs: Vec<PairReport>,
    /// From the start of the producers until the last consumer finished.
    pub elapsed: Duration,
    /// Round trips of all pairs.
    pub latency: Percentiles,
    /// Producers SIGKILLed.
    pub kills: u64,
    /// Kills the consumer reported as `PeerDead` before the producer was restarted.
    pub detected: u64,
    /// From the SIGKILL to the consumer's `PeerDead`.
    pub detection: Percentiles,
    /// The time series, one point per interval.
    pub series: Vec<SeriesPoint>,
    /// The duration the producers were asked to run.
    pub duration: Duration,
}

impl StressReport {
    /// Records checked, all pairs.
    pub fn records(&self) -> u64 {
        self.pairs.iter().map(|p| p.records).sum()
    }
    /// Payload bytes checked, all pairs.
    pub fn bytes(&self) -> u64 {
        self.pairs.iter().map(|p| p.bytes).sum()
    }
    /// Torn records, all pairs (must be 0).
    pub fn torn(&self) -> u64 {
        self.pairs.iter().map(|p| p.torn).sum()
    }
    /// Lost records, all pairs (must be 0).
    pub fn lost(&self) -> u64 {
        self.pairs.iter().map(|p| p.lost).sum()
    }
    /// Whether no record was torn or lost and every kill was detected.
    pub fn clean(&self) -> bool {
        self.torn() == 0 && self.lost() == 0 && self.detected == self.kills
    }

    /// The report as a table.
    pub fn to_text(&self) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let mut out = String::new();
        let _ = writeln!(
            out,
            "ring stress: {} pairs, records of {MIN_SIZE}-{MAX_SIZE} B, {:.1} s",
            self.pairs.len(),
            secs
        );
        let _ = writeln!(
            out,
            "{:>6} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6}",
            "pair", "records", "M rec/s", "GB/s", "rtt p50", "p99", "p99.9", "max", "torn", "lost"
        );
        let row = |out: &mut String, name: &str, p: &PairReport| {
            let _ = writeln!(
                out,
                "{:>6} {:>12} {:>10.2} {:>9.2} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6}",
                name,
                p.records,
                p.records as f64 / secs / 1e6,
                p.bytes as f64 / secs / 1e9,
                super::ns(p.latency.p50),
                super::ns(p.latency.p99),
                super::ns(p.latency.p999),
                super::ns(p.latency.max),
                p.torn,
                p.lost
            );
        };
        for (i, p) in self.pairs.iter().enumerate() {
            row(&mut out, &i.to_string(), p);
        }
        let total = PairReport {
            records: self.records(),
            bytes: self.bytes(),
            torn: self.torn(),
            lost: self.lost(),
            latency: self.latency,
            incarnations: 0,
        };
        row(&mut out, "total", &total);
        if self.kills > 0 {
            let _ = writeln!(
                out,
                "faults: {} producers SIGKILLed, {} seen as PeerDead; detection p50 {}, p99 {}, max {}",
                self.kills,
                self.detected,
                super::ns(self.detection.p50),
                super::ns(self.detection.p99),
                super::ns(self.detection.max)
            );
        }
        let _ = writeln!(
            out,
            "{}",
            if self.clean() {
                "result: clean (no torn or lost record)"
            } else {
                "result: FAILED"
            }
        );
        out
    }
}

/// SplitMix64: the stress test's one source of pseudo-randomness.
#[derive(Clone, Copy, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }
    /// Uniform-ish in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The payload length a record with this tag has: random, except that in every fourth block of
/// 32 sequence numbers all records have one small size (so batches there form runs).
fn size_of_tag(tag: u64) -> usize {
    let block = (tag & ((1 << 48) - 1)) >> 5;
    if run_block(tag) {
        return MIN_SIZE + (mix(block ^ tag >> 48) % 121) as usize;
    }
    MIN_SIZE + (mix(tag ^ 0xA076_1D64_78BD_642F) % (MAX_SIZE - MIN_SIZE + 1) as u64) as usize
}

/// Whether the record with this tag lies in a block of equal-size records.
fn run_block(tag: u64) -> bool {
    ((tag & ((1 << 48) - 1)) >> 5).is_multiple_of(4)
}

/// Writes the record for `tag` into `buf` (its length is `size_of_tag(tag)`).
fn fill(tag: u64, buf: &mut [u8]) {
    let mut word = mix(tag);
    let (first, rest) = buf.split_at_mut(8);
    first.copy_from_slice(&tag.to_le_bytes());
    let mut chunks = rest.chunks_exact_mut(8);
    for c in &mut chunks {
        word = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
        c.copy_from_slice(&word.to_le_bytes());
    }
    let tail = chunks.into_remainder();
    word = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let n = tail.len();
    tail.copy_from_slice(&word.to_le_bytes()[..n]);
}

/// Whether `payload` is exactly the record its tag says.
fn check(payload: &[u8]) -> Option<u64> {
    let tag = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
    if payload.len() != size_of_tag(tag) {
        return None;
    }
    let mut word = mix(tag);
    let mut chunks = payload[8..].chunks_exact(8);
    for c in &mut chunks {
        word = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
        if c != word.to_le_bytes() {
            return None;
        }
    }
    let tail = chunks.remainder();
    word = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (tail == &word.to_le_bytes()[..tail.len()]).then_some(tag)
}

fn bad_args(args: &[String]) -> Error {
    Error::InvalidName(format!("stress child arguments {args:?}"))
}

fn parse<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| bad_args(args))
}

/// A stress child: `producer|consumer <data-ring> <echo-ring> <incarnation> <seed> <deadline-ns>
/// <interval-ns> <cpu|none>`, as started by [`run`].
pub fn child_main(args: &[String]) -> Result<()> {
    if args.len() != 8 {
        return Err(bad_args(args));
    }
    let (data, echo) = (&args[1], &args[2]);
    let incarnation: u64 = parse(args, 3)?;
    let seed: u64 = parse(args, 4)?;
    let deadline: u64 = parse(args, 5)?;
    let interval: u64 = parse(args, 6)?;
    if args[7] != "none" {
        pin_current_thread(parse(args, 7)?)?;
    }
    let out = std::io::stdout();
    match args[0].as_str() {
        "producer" => {
            let mut tx = crate::attach(data)?.producer()?;
            let mut rx = crate::attach(echo)?.consumer()?;
            produce(&mut tx, &mut rx, incarnation, seed, deadline, interval, out)
        }
        "consumer" => {
            let mut rx = crate::attach(data)?.consumer()?;
            let mut tx = crate::attach(echo)?.producer()?;
            consume(&mut rx, &mut tx, deadline, interval, out)
        }
        _ => Err(bad_args(args)),
    }
}

fn say(out: &std::io::Stdout, line: std::fmt::Arguments<'_>) {
    let mut lock = out.lock();
    let _ = lock.write_fmt(line);
    let _ = lock.write_all(b"\n");
    let _ = lock.flush();
}

/// The producer's loop: batches of 1–32 records until the deadline, a ping every `PING_EVERY`th
/// batch, echoes read between batches.
fn produce(
    tx: &mut Producer<Segment>,
    rx: &mut Consumer<Segment>,
    incarnation: u64,
    seed: u64,
    deadline: u64,
    interval: u64,
    out: std::io::Stdout,
) -> Result<()> {
    let mut rng = Rng(seed ^ incarnation.wrapping_mul(0xD1B5_4A32_D192_ED03));
    let mut seq = 0u64;
    let mut batches = 0u64;
    let mut scratch = Vec::with_capacity(MAX_SIZE);
    let mut rtts = Vec::new();
    // Round trips go out at least every 20 ms, so a producer killed soon after it started has
    // reported most of its samples.
    let flush_every = interval.min(20_000_000);
    let mut next_tick = now_ns() + flush_every;
    while now_ns() < deadline {
        let n = rng.range(1, MAX_BATCH);
        let ping = batches.is_multiple_of(PING_EVERY);
        batches += 1;
        let tag = |seq: u64| incarnation << 48 | seq;
        let first = tag(seq);
        // Wait until the batch's first record fits; the rest go in while they fit.
        if tx.reserve_wait(size_of_tag(first), WAIT)?.is_none() {
            continue;
        }
        let mut batch = tx.batch();
        if ping {
            let mut p = [0u8; 16];
            p[..8].copy_from_slice(&incarnation.to_le_bytes());
            p[8..].copy_from_slice(&now_ns().to_le_bytes());
            if !batch.try_push_kind(KIND_PING, &p)? {
                continue;
            }
        }
        let mut written = 0;
        for k in 0..n {
            let t = tag(seq + k);
            if run_block(t) {
                // Copied in, so equal records join one run.
                scratch.resize(size_of_tag(t), 0);
                fill(t, &mut scratch);
                if !batch.try_push_kind(KIND_DATA, &scratch)? {
                    break;
                }
            } else {
                // Written in place.
                let Some(mut g) = batch.reserve(size_of_tag(t))? else {
                    break;
                };
                fill(t, &mut g);
                g.set_kind(KIND_DATA);
                g.commit();
            }
            written += 1;
        }
        batch.commit();
        seq += written;
        while let Some(g) = rx.try_pop()? {
            if g.len() == 16 && g[..8] == incarnation.to_le_bytes() {
                let sent = u64::from_le_bytes(g[8..16].try_into().unwrap_or_default());
                rtts.push(now_ns().saturating_sub(sent));
            }
        }
        let now = now_ns();
        if now >= next_tick {
            next_tick = now + flush_every;
            flush_rtts(&out, &mut rtts);
        }
    }
    flush_rtts(&out, &mut rtts);
    say(&out, format_args!("done {seq}"));
    Ok(())
}

fn flush_rtts(out: &std::io::Stdout, rtts: &mut Vec<u64>) {
    if rtts.is_empty() {
        return;
    }
    let mut line = format!("rtt {}", now_ns());
    for v in rtts.drain(..) {
        let _ = write!(line, " {v}");
    }
    say(out, format_args!("{line}"));
}

/// Per-incarnation progress of the consumer.
#[derive(Default)]
struct Checked {
    records: u64,
    bytes: u64,
    torn: u64,
    lost: u64,
    /// Next sequence number expected from each incarnation.
    next: HashMap<u64, u64>,
}

/// The consumer's loop: checks every record, echoes pings, reports a dead producer once per pid,
/// and stops when the producers' deadline and a grace period have passed with the ring empty.
fn consume(
    rx: &mut Consumer<Segment>,
    tx: &mut Producer<Segment>,
    deadline: u64,
    interval: u64,
    out: std::io::Stdout,
) -> Result<()> {
    rx.set_wait_config(WaitConfig {
        liveness_poll: Duration::from_millis(5),
        ..WaitConfig::default()
    });
    let mut c = Checked::default();
    let mut last_dead = None;
    let mut next_tick = now_ns() + interval;
    let (mut tick_records, mut tick_bytes) = (0u64, 0u64);
    let end = deadline + GRACE.as_nanos() as u64;
    loop {
        let mut pings = Vec::new();
        let before = (c.records, c.bytes);
        let got = rx.pop_batch_wait(64, WAIT, |r| match r.kind {
            KIND_PING => pings.push(r.payload.to_vec()),
            _ => note(&mut c, r.payload),
        });
        let empty = matches!(got, Ok(0) | Err(Error::PeerDead { .. }));
        match got {
            Ok(_) => {}
            Err(Error::PeerDead { pid }) => {
                if last_dead != Some(pid) {
                    last_dead = Some(pid);
                    say(&out, format_args!("dead {} {pid}", now_ns()));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
        for p in pings {
            // A full echo ring (or a dead reader) drops the ping: it never blocks the data path.
            let _ = tx.try_push_kind(KIND_PING, &p)?;
        }
        tick_records += c.records - before.0;
        tick_bytes += c.bytes - before.1;
        let now = now_ns();
        if now >= next_tick {
            next_tick = now + interval;
            say(&out, format_args!("tick {now} {tick_records} {tick_bytes}"));
            (tick_records, tick_bytes) = (0, 0);
        }
        if now >= end || (now >= deadline && empty && producer_done(rx)) {
            break;
        }
    }
    say(
        &out,
        format_args!(
            "tick {} {tick_records} {tick_bytes}\ndone {} {} {} {}",
            now_ns(),
            c.records,
            c.bytes,
            c.torn,
            c.lost
        ),
    );
    Ok(())
}

/// Whether no live producer holds the data ring's role (it finished and dropped it).
fn producer_done(rx: &Consumer<Segment>) -> bool {
    !matches!(
        rx.peer_state(),
        crate::PeerState::Alive { .. } | crate::PeerState::Unresponsive { .. }
    )
}

fn note(c: &mut Checked, payload: &[u8]) {
    match check(payload) {
        Some(tag) => {
            let (inc, seq) = (tag >> 48, tag & ((1 << 48) - 1));
            let next = c.next.entry(inc).or_insert(0);
            if seq >= *next {
                c.lost += seq - *next;
                *next = seq + 1;
            } else {
                // Delivered twice or out of order: as wrong as torn.
                c.torn += 1;
            }
            c.records += 1;
            c.bytes += payload.len() as u64;
        }
        None => c.torn += 1,
    }
}

/// What a child said.
enum Line {
    Tick {
        t: u64,
        records: u64,
        bytes: u64,
    },
    Rtt {
        t: u64,
        samples: Vec<u64>,
    },
    Dead {
        t: u64,
    },
    ConsumerDone {
        records: u64,
        bytes: u64,
        torn: u64,
        lost: u64,
    },
    ProducerDone,
    /// The consumer's stdout closed (it exited).
    ConsumerClosed,
}

fn parse_line(line: &str) -> Option<Line> {
    let mut it = line.split_ascii_whitespace();
    let word = it.next()?;
    let mut num = || -> Option<u64> { it.next()?.parse().ok() };
    Some(match word {
        "tick" => Line::Tick {
            t: num()?,
            records: num()?,
            bytes: num()?,
        },
        "dead" => Line::Dead { t: num()? },
        "rtt" => {
            let t = num()?;
            let mut samples = Vec::new();
            while let Some(v) = num() {
                samples.push(v);
            }
            Line::Rtt { t, samples }
        }
        "done" => match (num(), num(), num(), num()) {
            (Some(records), Some(bytes), Some(torn), Some(lost)) => Line::ConsumerDone {
                records,
                bytes,
                torn,
                lost,
            },
            _ => Line::ProducerDone,
        },
        _ => return None,
    })
}

/// Forwards a child's stdout, line by line, tagged with its pair; a consumer's end of output too.
fn forward(pair: usize, child: &mut Child, consumer: bool, tx: &mpsc::Sender<(usize, Line)>) {
    let (Some(stdout), tx) = (child.stdout.take(), tx.clone()) else {
        return;
    };
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(parsed) = parse_line(&line)
                && tx.send((pair, parsed)).is_err()
            {
                return;
            }
        }
        if consumer {
            let _ = tx.send((pair, Line::ConsumerClosed));
        }
    });
}

struct Pair {
    data: String,
    echo: String,
    producer: Child,
    consumer: Child,
    incarnation: u64,
    cpus: (i64, i64),
    done: bool,
    consumer_failed: bool,
}

/// Runs the stress test: starts the pairs, kills producers in fault mode, and folds what the
/// children report into a [`StressReport`]. `progress` sees each series point as it completes.
pub fn run(
    launcher: &Launcher,
    config: &StressConfig,
    mut progress: impl FnMut(&SeriesPoint),
) -> Result<StressReport> {
    let pairs = config.pairs.max(1);
    let cpus = super::allowed_cpus();
    let start = Instant::now();
    let start_ns = now_ns();
    let deadline = start_ns + config.duration.as_nanos() as u64;
    let interval = config.interval.max(Duration::from_millis(10)).as_nanos() as u64;
    let (line_tx, line_rx) = mpsc::channel();
    // The parent creates every ring, so they outlive a killed producer, and unlinks them on return.
    let mut rings = Vec::new();
    let mut live = Vec::new();
    for i in 0..pairs {
        let (data, echo) = (
            crate::unique_name("ringserve-stress"),
            crate::unique_name("ringserve-stress"),
        );
        rings.push(crate::create(&data, CAPACITY)?);
        rings.push(crate::create(&echo, CAPACITY)?);
        let cpu = |k: usize| -> i64 {
            match cpus.get(2 * i + k) {
                Some(&c) if config.pin && cpus.len() >= 2 * pairs => c as i64,
                _ => -1,
            }
        };
        let cpus = (cpu(0), cpu(1));
        let consumer = spawn(
            launcher,
            "consumer",
            &data,
            &echo,
            0,
            config.seed,
            deadline,
            interval,
            cpus.1,
        )?;
        let producer = spawn(
            launcher,
            "producer",
            &data,
            &echo,
            0,
            config.seed + i as u64,
            deadline,
            interval,
            cpus.0,
        )?;
        live.push(Pair {
            data,
            echo,
            producer,
            consumer,
            incarnation: 0,
            cpus,
            done: false,
            consumer_failed: false,
        });
    }
    for (i, p) in live.iter_mut().enumerate() {
        forward(i, &mut p.producer, false, &line_tx);
        forward(i, &mut p.consumer, true, &line_tx);
    }

    let mut report = StressReport {
        pairs: vec![PairReport::default(); pairs],
        duration: config.duration,
        ..StressReport::default()
    };
    let buckets = (config.duration.as_nanos() as u64 + GRACE.as_nanos() as u64) / interval + 2;
    let mut series: Vec<(u64, u64, Vec<u64>)> = vec![(0, 0, Vec::new()); buckets as usize];
    // A tick at `t` covers the interval before it: file it by its middle.
    let bucket = |t: u64| {
        ((t.saturating_sub(start_ns + interval / 2) / interval) as usize).min(buckets as usize - 1)
    };
    let mut all_rtts = Vec::new();
    let mut pair_rtts: Vec<Vec<u64>> = vec![Vec::new(); pairs];
    let mut detections = Vec::new();
    let mut rng = Rng(config.seed ^ 0xFA17);
    let mut next_kill = config
        .kill_every
        .map(|mean| start_ns + exp_delay(&mut rng, mean));
    // A killed pair waits for its consumer's `dead` line before its producer restarts.
    let mut killed: Option<(usize, u64)> = None;
    let mut emitted = 0usize;
    let mut consumers_done = 0;
    while consumers_done < pairs {
        let msg = line_rx.recv_timeout(Duration::from_millis(5));
        let now = now_ns();
        // A timeout only; never disconnected (`line_tx` lives here for the restarts' forwarders).
        if let Ok((i, line)) = msg {
            match line {
                Line::Tick { t, records, bytes } => {
                    let b = &mut series[bucket(t)];
                    b.0 += records;
                    b.1 += bytes;
                }
                Line::Rtt { t, samples } => {
                    series[bucket(t)].2.extend_from_slice(&samples);
                    pair_rtts[i].extend_from_slice(&samples);
                    all_rtts.extend_from_slice(&samples);
                }
                Line::Dead { t } => {
                    if let Some((k, t_kill)) = killed
                        && k == i
                    {
                        detections.push(t.saturating_sub(t_kill));
                        report.detected += 1;
                        killed = None;
                        restart(
                            launcher,
                            &mut live[i],
                            i,
                            config.seed + i as u64,
                            deadline,
                            interval,
                            &line_tx,
                        )?;
                    }
                }
                Line::ConsumerDone {
                    records,
                    bytes,
                    torn,
                    lost,
                } => {
                    let r = &mut report.pairs[i];
                    (r.records, r.bytes, r.torn, r.lost) = (records, bytes, torn, lost);
                    live[i].done = true;
                    consumers_done += 1;
                }
                Line::ProducerDone => {}
                Line::ConsumerClosed => {
                    // Exited without its report: counted as finished, and a failure below.
                    if !live[i].done {
                        live[i].consumer_failed = true;
                        live[i].done = true;
                        consumers_done += 1;
                    }
                }
            }
        }
        // A kill the consumer never reported (it must report within its liveness poll).
        if let Some((i, t_kill)) = killed
            && now.saturating_sub(t_kill) > 2_000_000_000
        {
            killed = None;
            restart(
                launcher,
                &mut live[i],
                i,
                config.seed + i as u64,
                deadline,
                interval,
                &line_tx,
            )?;
        }
        if let (Some(at), Some(mean)) = (next_kill, config.kill_every)
            && now >= at
            && killed.is_none()
            && now + 100_000_000 < deadline
        {
            let i = (rng.next() % pairs as u64) as usize;
            let p = &mut live[i];
            // Only a producer that holds its role: one killed before it claimed the role was
            // never the consumer's peer, so there is no death for the consumer to see.
            let owner = rings[2 * i]
                .memory()
                .header()
                .prod_side
                .owner
                .load(std::sync::atomic::Ordering::Relaxed);
            if !p.done && crate::liveness::owner_pid(owner) == p.producer.id() {
                let _ = p.producer.kill();
                let t_kill = now_ns();
                let _ = p.producer.wait();
                report.kills += 1;
                killed = Some((i, t_kill));
            }
            next_kill = Some(now + exp_delay(&mut rng, mean));
        }
        let current = bucket(now);
        while emitted + 1 < current && emitted < series.len() {
            progress(&point(&series[emitted], emitted, interval));
            emitted += 1;
        }
    }
    let mut failed = Vec::new();
    for (i, p) in live.iter_mut().enumerate() {
        for (role, child) in [("producer", &mut p.producer), ("consumer", &mut p.consumer)] {
            // Done, both exit on their own (the producer at the deadline, the consumer after its
            // report); a pair that never reported is stopped.
            if !p.done && matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            match child.wait() {
                Ok(status) if status.success() => {}
                status => failed.push(format!("pair {i} {role}: {status:?}")),
            }
        }
        if p.consumer_failed {
            failed.push(format!("pair {i} consumer: no final report"));
        }
    }
    if !failed.is_empty() {
        return Err(Error::Os {
            call: "stress child",
            name: failed.join("; "),
            source: std::io::Error::other("a stress process failed (its error is on stderr)"),
        });
    }
    report.elapsed = start.elapsed();
    let last = bucket(now_ns()).min(series.len() - 1);
    report.series = (0..=last).map(|b| point(&series[b], b, interval)).collect();
    for (r, (samples, p)) in report.pairs.iter_mut().zip(pair_rtts.iter_mut().zip(&live)) {
        r.latency = Percentiles::of(samples);
        r.incarnations = p.incarnation as u32 + 1;
    }
    report.latency = Percentiles::of(&mut all_rtts);
    report.detection = Percentiles::of(&mut detections);
    drop(rings);
    Ok(report)
}

fn point(bucket: &(u64, u64, Vec<u64>), index: usize, interval: u64) -> SeriesPoint {
    let secs = interval as f64 / 1e9;
    let mut samples = bucket.2.clone();
    SeriesPoint {
        t: (index + 1) as f64 * secs,
        records_per_s: bucket.0 as f64 / secs,
        gb_per_s: bucket.1 as f64 / secs / 1e9,
        latency: Percentiles::of(&mut samples),
    }
}

/// An exponentially distributed delay with the given mean, in nanoseconds (at least 1 ms).
fn exp_delay(rng: &mut Rng, mean: Duration) -> u64 {
    let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let d = -(1.0 - u).ln() * mean.as_nanos() as f64;
    (d as u64).max(1_000_000)
}

/// Starts the pair's next producer incarnation and forwards its output.
fn restart(
    launcher: &Launcher,
    p: &mut Pair,
    pair: usize,
    seed: u64,
    deadline: u64,
    interval: u64,
    lines: &mpsc::Sender<(usize, Line)>,
) -> Result<()> {
    p.incarnation += 1;
    p.producer = spawn(
        launcher,
        "producer",
        &p.data,
        &p.echo,
        p.incarnation,
        seed,
        deadline,
        interval,
        p.cpus.0,
    )?;
    forward(pair, &mut p.producer, false, lines);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn spawn(
    launcher: &Launcher,
    role: &str,
    data: &str,
    echo: &str,
    incarnation: u64,
    seed: u64,
    deadline: u64,
    interval: u64,
    cpu: i64,
) -> Result<Child> {
    Command::new(&launcher.program)
        .args(&launcher.args)
        .arg("stress")
        .arg(role)
        .args([data, echo])
        .args([incarnation, seed, deadline, interval].map(|v| v.to_string()))
        .arg(if cpu < 0 {
            "none".to_string()
        } else {
            cpu.to_string()
        })
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Os {
            call: "spawn stress child",
            name: data.to_string(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_check_only_as_written() {
        let mut rng = Rng(7);
        for _ in 0..200 {
            let tag = rng.next() & ((1 << 60) - 1);
            let mut buf = vec![0u8; size_of_tag(tag)];
            fill(tag, &mut buf);
            assert_eq!(check(&buf), Some(tag));
            let i = (rng.next() as usize) % buf.len();
            buf[i] ^= 1 << (rng.next() % 8);
            assert_eq!(
                check(&buf),
                None,
                "a flipped bit at {i} of {} passed",
                buf.len()
            );
            fill(tag, &mut buf);
            buf.pop();
            assert_eq!(check(&buf), None, "a short record passed");
        }
    }

    #[test]
    fn gaps_count_as_lost_and_repeats_as_torn() {
        let mut c = Checked::default();
        let rec = |tag: u64| {
            let mut b = vec![0u8; size_of_tag(tag)];
            fill(tag, &mut b);
            b
        };
        for seq in [0u64, 1, 2, 5, 5] {
            note(&mut c, &rec(seq));
        }
        note(&mut c, &rec(1 << 48)); // a new incarnation starts at 0
        assert_eq!((c.records, c.lost, c.torn), (6, 2, 1));
    }

    #[test]
    fn lines_parse() {
        assert!(matches!(
            parse_line("tick 5 10 20"),
            Some(Line::Tick {
                t: 5,
                records: 10,
                bytes: 20
            })
        ));
        assert!(
            matches!(parse_line("rtt 9 1 2 3"), Some(Line::Rtt { t: 9, ref samples }) if samples == &[1, 2, 3])
        );
        assert!(matches!(parse_line("done 7"), Some(Line::ProducerDone)));
        assert!(matches!(
            parse_line("done 1 2 3 4"),
            Some(Line::ConsumerDone {
                records: 1,
                bytes: 2,
                torn: 3,
                lost: 4
            })
        ));
        assert!(parse_line("garbage").is_none());
    }
}
