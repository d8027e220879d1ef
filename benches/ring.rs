//! Ring benchmarks: this crate's shared-memory ring across two processes and between two threads
//! (through its bulk path, `push_slice` / `pop_runs`, as rtrb's chunk API for batches), against
//! `rtrb` and crossbeam's `ArrayQueue` between two threads, in the same run, every
//! contestant's two sides pinned to the same two separate CPUs; one group per record size (8, 64,
//! 512, 4096 B) with batches of 1 and 32, a ping-pong round-trip group (spinning and with futex
//! waits, beside rtrb and a bare shared word across processes), and the stress test (one pair of
//! processes, random sizes, checksums) as a group of its own.
//!
//! `cargo bench --bench ring` (criterion); `cargo bench --bench ring -- --interleaved [ROUNDS]`
//! runs the 8 and 64 B contestants round-robin instead and prints each ratio to rtrb taken within
//! its round. The cross-process child is this binary re-executed with `--ring-child`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use ringbuf::bench::{
    BATCHES, CAPACITY, Fill, Launcher, Peer, Pinning, WaitMode, WordLines, pin_current_thread,
    quantile,
};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const CHILD_FLAG: &str = "--ring-child";
/// Records per criterion iteration: large enough that per-sample overheads (thread start, the
/// begin/acknowledge handshake) vanish, so the samples measure throughput, not set-up.
const BLOCK: u64 = 4096;

/// Pins this thread to `pin.this` and returns the CPU for the other side's thread.
fn pin_sides(pin: Option<Pinning>) -> Option<usize> {
    let pin = pin?;
    pin_current_thread(pin.this).expect("pin the measuring thread");
    Some(pin.peer)
}

fn pin_peer(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        pin_current_thread(cpu).expect("pin the peer thread");
    }
}

/// Moves `iters` items of `N` bytes through an rtrb ring between two threads, `batch` at a time.
fn rtrb_run<const N: usize>(iters: u64, batch: usize, pin: Option<Pinning>) -> Duration {
    let peer = pin_sides(pin);
    let (mut tx, mut rx) = rtrb::RingBuffer::<[u8; N]>::new(CAPACITY / N);
    let start = Arc::new(Barrier::new(2));
    let go = Arc::clone(&start);
    let consumer = std::thread::spawn(move || {
        pin_peer(peer);
        go.wait();
        let mut left = iters;
        let mut sum = 0u8;
        while left > 0 {
            let n = rx.slots().min(batch).min(left as usize);
            if n == 0 {
                std::hint::spin_loop();
                continue;
            }
            let chunk = rx.read_chunk(n).expect("slots were counted");
            let (a, b) = chunk.as_slices();
            for item in a.iter().chain(b) {
                sum ^= item[0] ^ item[N - 1];
            }
            chunk.commit_all();
            left -= n as u64;
        }
        black_box(sum);
    });
    start.wait();
    let t = Instant::now();
    let item = [0xA5u8; N];
    let mut sent = 0u64;
    while sent < iters {
        if batch == 1 {
            if tx.push(item).is_ok() {
                sent += 1;
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        let n = tx.slots().min(batch).min((iters - sent) as usize);
        if n == 0 {
            std::hint::spin_loop();
            continue;
        }
        let chunk = tx.write_chunk_uninit(n).expect("slots were counted");
        sent += chunk.fill_from_iter(std::iter::repeat(item)) as u64;
    }
    consumer.join().expect("rtrb consumer");
    t.elapsed()
}

/// Moves `iters` items of `N` bytes through a crossbeam `ArrayQueue` between two threads.
fn crossbeam_run<const N: usize>(iters: u64, pin: Option<Pinning>) -> Duration {
    let peer = pin_sides(pin);
    let queue = Arc::new(crossbeam_queue::ArrayQueue::<[u8; N]>::new(CAPACITY / N));
    let rx = Arc::clone(&queue);
    let start = Arc::new(Barrier::new(2));
    let go = Arc::clone(&start);
    let consumer = std::thread::spawn(move || {
        pin_peer(peer);
        go.wait();
        let mut sum = 0u8;
        let mut left = iters;
        while left > 0 {
            match rx.pop() {
                Some(item) => {
                    sum ^= item[0] ^ item[N - 1];
                    left -= 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        black_box(sum);
    });
    start.wait();
    let t = Instant::now();
    let item = [0xA5u8; N];
    for _ in 0..iters {
        while queue.push(item).is_err() {
            std::hint::spin_loop();
        }
    }
    consumer.join().expect("crossbeam consumer");
    t.elapsed()
}

fn size_group<const N: usize>(c: &mut Criterion, launcher: &Launcher, pin: Option<Pinning>) {
    let mut group = c.benchmark_group(format!("ring_{N}B"));
    group.throughput(Throughput::Elements(BLOCK));
    let mut xproc = Peer::process(launcher, WaitMode::Spin, pin).expect("start cross-process peer");
    let mut inproc = Peer::thread(WaitMode::Spin, pin).expect("start in-process peer");
    for batch in BATCHES {
        group.bench_function(
            BenchmarkId::new("ringbuf_xproc", format!("batch{batch}")),
            |b| {
                b.iter_custom(|iters| {
                    xproc
                        .throughput(N, batch, iters * BLOCK, WaitMode::Spin, Fill::Slice)
                        .expect("cross-process run")
                        .took
                })
            },
        );
        group.bench_function(
            BenchmarkId::new("ringbuf_inproc", format!("batch{batch}")),
            |b| {
                b.iter_custom(|iters| {
                    inproc
                        .throughput(N, batch, iters * BLOCK, WaitMode::Spin, Fill::Slice)
                        .expect("in-process run")
                        .took
                })
            },
        );
        group.bench_function(BenchmarkId::new("rtrb", format!("batch{batch}")), |b| {
            b.iter_custom(|iters| rtrb_run::<N>(iters * BLOCK, batch, pin))
        });
    }
    group.bench_function(BenchmarkId::new("crossbeam_arrayqueue", "batch1"), |b| {
        b.iter_custom(|iters| crossbeam_run::<N>(iters * BLOCK, pin))
    });
    group.finish();
}

/// Round trips between two threads over two rtrb rings (the in-process reference).
fn rtrb_ping_pong(iters: u64, samples: &mut Vec<u64>, pin: Option<Pinning>) -> Duration {
    let peer = pin_sides(pin);
    let (mut ping_tx, mut ping_rx) = rtrb::RingBuffer::<[u8; 64]>::new(64);
    let (mut pong_tx, mut pong_rx) = rtrb::RingBuffer::<[u8; 64]>::new(64);
    let echo = std::thread::spawn(move || {
        pin_peer(peer);
        for _ in 0..iters {
            let item = loop {
                match ping_rx.pop() {
                    Ok(item) => break item,
                    Err(_) => std::hint::spin_loop(),
                }
            };
            while pong_tx.push(item).is_err() {
                std::hint::spin_loop();
            }
        }
    });
    let start = Instant::now();
    for _ in 0..iters {
        let t = Instant::now();
        while ping_tx.push([0x5A; 64]).is_err() {
            std::hint::spin_loop();
        }
        loop {
            if let Ok(item) = pong_rx.pop() {
                black_box(item);
                break;
            }
            std::hint::spin_loop();
        }
        samples.push(t.elapsed().as_nanos() as u64);
    }
    let took = start.elapsed();
    echo.join().expect("rtrb echo");
    took
}

fn print_quantiles(name: &str, samples: &mut [u64]) {
    if samples.is_empty() {
        return;
    }
    let [p50, p99, p999] = [0.5, 0.99, 0.999].map(|q| quantile(samples, q));
    eprintln!(
        "{name}: {} round trips, p50 {p50} ns, p99 {p99} ns, p99.9 {p999} ns",
        samples.len()
    );
}

fn ping_pong(c: &mut Criterion, launcher: &Launcher, pin: Option<Pinning>) {
    let mut group = c.benchmark_group("pingpong_64B");
    for mode in [WaitMode::Spin, WaitMode::Futex] {
        let label = if mode == WaitMode::Spin {
            "spin"
        } else {
            "futex"
        };
        let mut peer = Peer::process(launcher, mode, pin).expect("start cross-process peer");
        let mut all = Vec::new();
        group.bench_function(BenchmarkId::new("ringbuf_xproc", label), |b| {
            b.iter_custom(|iters| {
                let samples = peer.ping_pong(64, iters as usize, mode).expect("ping-pong");
                let total = Duration::from_nanos(samples.iter().sum());
                all.extend(samples);
                total
            })
        });
        print_quantiles(&format!("ringbuf_xproc/{label}"), &mut all);
        if mode == WaitMode::Spin {
            // 8-byte records: header, payload and the terminator in one line (most of the time).
            let mut all = Vec::new();
            group.bench_function(BenchmarkId::new("ringbuf_xproc", "spin_8B"), |b| {
                b.iter_custom(|iters| {
                    let samples = peer.ping_pong(8, iters as usize, mode).expect("ping-pong");
                    let total = Duration::from_nanos(samples.iter().sum());
                    all.extend(samples);
                    total
                })
            });
            print_quantiles("ringbuf_xproc/spin_8B", &mut all);
        }
    }
    let mut all = Vec::new();
    group.bench_function(BenchmarkId::new("rtrb_inproc", "spin"), |b| {
        b.iter_custom(|iters| rtrb_ping_pong(iters, &mut all, pin))
    });
    print_quantiles("rtrb_inproc/spin", &mut all);
    for (lines, label) in [(WordLines::One, "spin"), (WordLines::Two, "spin_two_lines")] {
        let mut all = Vec::new();
        group.bench_function(BenchmarkId::new("shared_word_xproc", label), |b| {
            b.iter_custom(|iters| {
                let samples = ringbuf::bench::word_ping_pong(launcher, lines, iters as usize, pin)
                    .expect("shared-word ping-pong");
                let total = Duration::from_nanos(samples.iter().sum());
                all.extend(samples);
                total
            })
        });
        print_quantiles(&format!("shared_word_xproc/{label}"), &mut all);
    }
    group.finish();
}

/// The stress test as a criterion group: one pair of processes, random record sizes 8 B – 4 KiB,
/// every byte checked; each sample is a 1-second run, reported per record.
fn stress(c: &mut Criterion, launcher: &Launcher) {
    let mut group = c.benchmark_group("stress_random_8B_4KiB");
    group.throughput(Throughput::Elements(1));
    // Ten 1-second runs (plus process start-up each).
    group.measurement_time(Duration::from_secs(12));
    let config = ringbuf::bench::stress::StressConfig {
        pairs: 1,
        duration: Duration::from_secs(1),
        ..ringbuf::bench::stress::StressConfig::new()
    };
    group.bench_function("ringbuf_xproc_1pair", |b| {
        b.iter_custom(|iters| {
            let report =
                ringbuf::bench::stress::run(launcher, &config, |_| {}).expect("stress run");
            assert!(report.clean(), "{}", report.to_text());
            let per_record = report.elapsed.as_secs_f64() / report.records().max(1) as f64;
            Duration::from_secs_f64(per_record * iters as f64)
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let launcher = Launcher::current_exe(&[CHILD_FLAG]).expect("benchmark executable");
    let pin = Pinning::separate();
    size_group::<8>(c, &launcher, pin);
    size_group::<64>(c, &launcher, pin);
    size_group::<512>(c, &launcher, pin);
    size_group::<4096>(c, &launcher, pin);
    ping_pong(c, &launcher, pin);
    stress(c, &launcher);
}

/// Criterion without its plots: the workspace builds plotters without font rendering (for
/// `bench serve --sweep`), which criterion's plot backend would need.
fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! { name = ring; config = config(); targets = benches }

/// Records per run of the interleaved comparison.
const INTERLEAVED_RECORDS: u64 = 1 << 20;

/// The ratio goal measured so that every contestant meets the same machine: criterion measures one
/// contestant for a second or more before the next, and on a VM the host may move the two vCPUs
/// closer or apart in between (a bare shared word's round trip then moves 2–4×, and every rate with
/// it). Here each round runs ringbuf across processes, ringbuf between threads and rtrb between
/// threads back to back (1 Mi records each), and each ratio is taken within its round; prints the
/// median and quartiles over `rounds` rounds per record size and batch, as a markdown table.
fn interleaved(launcher: &Launcher, pin: Option<Pinning>, rounds: usize) {
    fn one<const N: usize>(
        xproc: &mut Peer<ringbuf::Segment>,
        inproc: &mut Peer<ringbuf::HeapMemory>,
        pin: Option<Pinning>,
        rounds: usize,
    ) {
        let rate = |took: Duration| INTERLEAVED_RECORDS as f64 / took.as_secs_f64() / 1e6;
        for batch in BATCHES {
            // Per round: hundredths of M/s, and thousandths of the ratios (integers for `quantile`).
            let (mut x, mut i, mut r, mut xr, mut ir) = (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..rounds {
                let xs = rate(
                    xproc
                        .throughput(N, batch, INTERLEAVED_RECORDS, WaitMode::Spin, Fill::Slice)
                        .expect("cross-process run")
                        .took,
                );
                let is = rate(
                    inproc
                        .throughput(N, batch, INTERLEAVED_RECORDS, WaitMode::Spin, Fill::Slice)
                        .expect("in-process run")
                        .took,
                );
                let rs = rate(rtrb_run::<N>(INTERLEAVED_RECORDS, batch, pin));
                x.push((xs * 100.0) as u64);
                i.push((is * 100.0) as u64);
                r.push((rs * 100.0) as u64);
                xr.push((xs / rs * 1000.0) as u64);
                ir.push((is / rs * 1000.0) as u64);
            }
            let quartiles = |v: &mut Vec<u64>, scale: f64| {
                [0.25, 0.5, 0.75].map(|p| quantile(v, p) as f64 / scale)
            };
            let [x25, x50, x75] = quartiles(&mut x, 100.0);
            let [_, i50, _] = quartiles(&mut i, 100.0);
            let [r25, r50, r75] = quartiles(&mut r, 100.0);
            let [xr25, xr50, xr75] = quartiles(&mut xr, 1000.0);
            let [ir25, ir50, ir75] = quartiles(&mut ir, 1000.0);
            println!(
                "| {N} B | {batch} | {x50:.1} M/s ({x25:.1}–{x75:.1}) | {i50:.1} M/s | \
                 {r50:.1} M/s ({r25:.1}–{r75:.1}) | **{xr50:.2}×** ({xr25:.2}–{xr75:.2}×) | \
                 {ir50:.2}× ({ir25:.2}–{ir75:.2}×) |"
            );
        }
    }
    let mut xproc = Peer::process(launcher, WaitMode::Spin, pin).expect("start cross-process peer");
    let mut inproc = Peer::thread(WaitMode::Spin, pin).expect("start in-process peer");
    println!(
        "interleaved: {rounds} rounds of {INTERLEAVED_RECORDS} records per contestant, \
         median (quartiles); ratios within each round"
    );
    println!(
        "| record | batch | ringbuf cross-process | ringbuf in-process | rtrb in-process | \
         cross-process / rtrb | in-process / rtrb |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    one::<8>(&mut xproc, &mut inproc, pin, rounds);
    one::<64>(&mut xproc, &mut inproc, pin, rounds);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        if let Err(e) = ringbuf::bench::child_main(&args[2..]) {
            eprintln!("ring benchmark child: {e}");
            std::process::exit(1);
        }
        return;
    }
    // `cargo bench --bench ring -- --interleaved [ROUNDS]`: the same contestants round-robin.
    if let Some(at) = args.iter().position(|a| a == "--interleaved") {
        let rounds = args
            .get(at + 1)
            .and_then(|r| r.parse().ok())
            .unwrap_or(15usize)
            .max(1);
        let launcher = Launcher::current_exe(&[CHILD_FLAG]).expect("benchmark executable");
        interleaved(&launcher, Pinning::separate(), rounds);
        return;
    }
    ring();
    Criterion::default().configure_from_args().final_summary();
}
