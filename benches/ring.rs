//! Ring benchmarks: this crate's shared-memory ring across two processes and between two threads,
//! against `rtrb` and crossbeam's `ArrayQueue` between two threads, in the same run; one group per
//! record size (8, 64, 512, 4096 B) with batches of 1 and 32, and a ping-pong round-trip group
//! (spinning and with futex waits).
//!
//! `cargo bench --bench ring` (criterion). The cross-process child is this binary re-executed with
//! `--ring-child`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use ringbuf::bench::{BATCHES, CAPACITY, Launcher, Peer, WaitMode, quantile};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const CHILD_FLAG: &str = "--ring-child";
/// Records per criterion iteration: large enough that per-sample overheads (thread start, the
/// begin/acknowledge handshake) vanish, so the samples measure throughput, not set-up.
const BLOCK: u64 = 4096;

/// Moves `iters` items of `N` bytes through an rtrb ring between two threads, `batch` at a time.
fn rtrb_run<const N: usize>(iters: u64, batch: usize) -> Duration {
    let (mut tx, mut rx) = rtrb::RingBuffer::<[u8; N]>::new(CAPACITY / N);
    let start = Arc::new(Barrier::new(2));
    let go = Arc::clone(&start);
    let consumer = std::thread::spawn(move || {
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
fn crossbeam_run<const N: usize>(iters: u64) -> Duration {
    let queue = Arc::new(crossbeam_queue::ArrayQueue::<[u8; N]>::new(CAPACITY / N));
    let rx = Arc::clone(&queue);
    let start = Arc::new(Barrier::new(2));
    let go = Arc::clone(&start);
    let consumer = std::thread::spawn(move || {
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

fn size_group<const N: usize>(c: &mut Criterion, launcher: &Launcher) {
    let mut group = c.benchmark_group(format!("ring_{N}B"));
    group.throughput(Throughput::Elements(BLOCK));
    let mut xproc = Peer::process(launcher, WaitMode::Spin).expect("start cross-process peer");
    let mut inproc = Peer::thread(WaitMode::Spin).expect("start in-process peer");
    for batch in BATCHES {
        group.bench_function(
            BenchmarkId::new("ringbuf_xproc", format!("batch{batch}")),
            |b| {
                b.iter_custom(|iters| {
                    xproc
                        .throughput(N, batch, iters * BLOCK)
                        .expect("cross-process run")
                })
            },
        );
        group.bench_function(
            BenchmarkId::new("ringbuf_inproc", format!("batch{batch}")),
            |b| {
                b.iter_custom(|iters| {
                    inproc
                        .throughput(N, batch, iters * BLOCK)
                        .expect("in-process run")
                })
            },
        );
        group.bench_function(BenchmarkId::new("rtrb", format!("batch{batch}")), |b| {
            b.iter_custom(|iters| rtrb_run::<N>(iters * BLOCK, batch))
        });
    }
    group.bench_function(BenchmarkId::new("crossbeam_arrayqueue", "batch1"), |b| {
        b.iter_custom(|iters| crossbeam_run::<N>(iters * BLOCK))
    });
    group.finish();
}

/// Round trips between two threads over two rtrb rings (the in-process reference).
fn rtrb_ping_pong(iters: u64, samples: &mut Vec<u64>) -> Duration {
    let (mut ping_tx, mut ping_rx) = rtrb::RingBuffer::<[u8; 64]>::new(64);
    let (mut pong_tx, mut pong_rx) = rtrb::RingBuffer::<[u8; 64]>::new(64);
    let echo = std::thread::spawn(move || {
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

fn ping_pong(c: &mut Criterion, launcher: &Launcher) {
    let mut group = c.benchmark_group("pingpong_64B");
    for mode in [WaitMode::Spin, WaitMode::Futex] {
        let label = if mode == WaitMode::Spin {
            "spin"
        } else {
            "futex"
        };
        let mut peer = Peer::process(launcher, mode).expect("start cross-process peer");
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
    }
    let mut all = Vec::new();
    group.bench_function(BenchmarkId::new("rtrb_inproc", "spin"), |b| {
        b.iter_custom(|iters| rtrb_ping_pong(iters, &mut all))
    });
    print_quantiles("rtrb_inproc/spin", &mut all);
    group.finish();
}

fn benches(c: &mut Criterion) {
    let launcher = Launcher::current_exe(&[CHILD_FLAG]).expect("benchmark executable");
    size_group::<8>(c, &launcher);
    size_group::<64>(c, &launcher);
    size_group::<512>(c, &launcher);
    size_group::<4096>(c, &launcher);
    ping_pong(c, &launcher);
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        if let Err(e) = ringbuf::bench::child_main(&args[2..]) {
            eprintln!("ring benchmark child: {e}");
            std::process::exit(1);
        }
        return;
    }
    ring();
    Criterion::default().configure_from_args().final_summary();
}
