//! `ringserve bench ring`: the ring's throughput and latency table, and `--stress` (many pairs of
//! processes, random record sizes, checksums, optional producer kills) with a JSON report and a plot.

use anyhow::Context;
use clap::{Args, ValueEnum};
use ringbuf::bench::stress::{Percentiles, StressConfig, StressReport};
use ringbuf::bench::{Fill, Launcher, Pinning, ReportConfig, WaitMode};
use std::path::PathBuf;
use std::time::Duration;

/// Which wait modes the throughput table measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WaitChoice {
    /// Both sides poll.
    Spin,
    /// Both sides spin briefly, then sleep on the futex when the ring is full or empty.
    Futex,
    /// Each case twice, spinning and with futex waits.
    Both,
}

/// How the throughput table's sender writes records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FillChoice {
    /// Each record in place through a reservation (zero copy).
    InPlace,
    /// Each batch copied from an array of equal records with `push_slice` (the bulk path).
    Slice,
}

#[derive(Args)]
pub struct BenchRingArgs {
    /// Records per throughput measurement.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Round trips per latency measurement.
    #[arg(long, default_value_t = 100_000)]
    round_trips: usize,
    /// Measurements per cell, round-robin between cross-process and in-process (the median is
    /// shown).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Wait modes of the throughput table.
    #[arg(long, value_enum, default_value_t = WaitChoice::Both)]
    wait: WaitChoice,
    /// How the sender writes the throughput table's records.
    #[arg(long, value_enum, default_value_t = FillChoice::InPlace)]
    fill: FillChoice,
    /// Leave the two sides (or, with --stress, every process) wherever the scheduler puts them
    /// instead of pinning them to separate CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Run the stress test instead: --pairs producer/consumer process pairs, random record sizes
    /// (8 B – 4 KiB), every byte checked, round trips timed under load.
    #[arg(long)]
    stress: bool,
    /// Stress: producer/consumer pairs (default: one per two allowed CPUs).
    #[arg(long, requires = "stress")]
    pairs: Option<usize>,
    /// Stress: seconds the producers write.
    #[arg(long, default_value_t = 30.0, requires = "stress")]
    duration: f64,
    /// Stress: seconds per point of the time series.
    #[arg(long, default_value_t = 1.0, requires = "stress")]
    interval: f64,
    /// Stress fault mode: SIGKILL a random producer at random moments, on average every this many
    /// milliseconds, and restart it once its consumer saw `PeerDead`.
    #[arg(long, value_name = "MS", requires = "stress")]
    kill_every: Option<f64>,
    /// Stress: seed of the record sizes, batches and kill times.
    #[arg(long, default_value_t = 0x5EED, requires = "stress")]
    seed: u64,
    /// Stress: write the report as JSON to this file.
    #[arg(long, requires = "stress")]
    json: Option<PathBuf>,
    /// Stress: draw records/s and round-trip percentiles over time to this PNG.
    #[arg(long, requires = "stress")]
    plot: Option<PathBuf>,
}

fn seconds(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{name} {v}: must be a positive number of seconds"))
}

pub fn bench_ring(args: BenchRingArgs) -> anyhow::Result<()> {
    let launcher = Launcher::current_exe(&["bench", "ring-child"])?;
    if !args.stress {
        let config = ReportConfig {
            records: args.records,
            round_trips: args.round_trips,
            repeats: args.repeats,
            pin: if args.no_pin {
                None
            } else {
                Pinning::separate()
            },
            modes: match args.wait {
                WaitChoice::Spin => &[WaitMode::Spin],
                WaitChoice::Futex => &[WaitMode::Futex],
                WaitChoice::Both => &[WaitMode::Spin, WaitMode::Futex],
            },
            fill: match args.fill {
                FillChoice::InPlace => Fill::InPlace,
                FillChoice::Slice => Fill::Slice,
            },
        };
        print!("{}", ringbuf::bench::report(&launcher, config)?);
        return Ok(());
    }
    let mut config = StressConfig::new();
    if let Some(pairs) = args.pairs {
        anyhow::ensure!(pairs > 0, "--pairs 0: at least one pair");
        config.pairs = pairs;
    }
    config.duration = seconds("duration", args.duration)?;
    config.interval = seconds("interval", args.interval)?;
    config.kill_every = args
        .kill_every
        .map(|ms| seconds("kill-every", ms / 1000.0))
        .transpose()?;
    config.seed = args.seed;
    config.pin = !args.no_pin;
    eprintln!(
        "ring stress: {} pairs for {:.0} s{}",
        config.pairs,
        config.duration.as_secs_f64(),
        match config.kill_every {
            Some(d) => format!(", a producer SIGKILLed every ~{} ms", d.as_millis()),
            None => String::new(),
        }
    );
    let report = ringbuf::bench::stress::run(&launcher, &config, |p| {
        eprintln!(
            "{:>6.1} s  {:>8.2} M rec/s  {:>6.2} GB/s  rtt p50 {:>8} ns  p99 {:>8} ns",
            p.t,
            p.records_per_s / 1e6,
            p.gb_per_s,
            p.latency.p50,
            p.latency.p99
        )
    })?;
    print!("{}", report.to_text());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&to_json(&report, &config))?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "ringbuf stress: {} pairs, 8 B - 4 KiB records{}",
            config.pairs,
            if config.kill_every.is_some() {
                ", producers killed"
            } else {
                ""
            }
        );
        gateway::bench_plot::plot_ring_stress(&report, &title, path)
            .with_context(|| format!("drawing {}", path.display()))?;
    }
    anyhow::ensure!(
        report.clean(),
        "the stress test found {} torn and {} lost records, {} of {} kills undetected",
        report.torn(),
        report.lost(),
        report.kills - report.detected,
        report.kills
    );
    Ok(())
}

fn percentiles(p: &Percentiles) -> serde_json::Value {
    serde_json::json!({"count": p.count, "p50_ns": p.p50, "p99_ns": p.p99, "p999_ns": p.p999, "max_ns": p.max})
}

fn to_json(r: &StressReport, c: &StressConfig) -> serde_json::Value {
    let secs = r.elapsed.as_secs_f64().max(1e-9);
    let pairs: Vec<_> = r
        .pairs
        .iter()
        .map(|p| {
            serde_json::json!({
                "records": p.records, "bytes": p.bytes,
                "records_per_s": p.records as f64 / secs, "gb_per_s": p.bytes as f64 / secs / 1e9,
                "torn": p.torn, "lost": p.lost, "incarnations": p.incarnations,
                "round_trip": percentiles(&p.latency),
            })
        })
        .collect();
    let series: Vec<_> = r
        .series
        .iter()
        .map(|p| {
            serde_json::json!({
                "t_s": p.t, "records_per_s": p.records_per_s, "gb_per_s": p.gb_per_s,
                "round_trip": percentiles(&p.latency),
            })
        })
        .collect();
    serde_json::json!({
        "config": {
            "pairs": c.pairs, "duration_s": c.duration.as_secs_f64(),
            "interval_s": c.interval.as_secs_f64(),
            "kill_every_ms": c.kill_every.map(|d| d.as_secs_f64() * 1e3),
            "seed": c.seed, "pinned": c.pin,
            "min_record": ringbuf::bench::stress::MIN_SIZE, "max_record": ringbuf::bench::stress::MAX_SIZE,
        },
        "elapsed_s": secs,
        "records": r.records(), "bytes": r.bytes(),
        "records_per_s": r.records() as f64 / secs, "gb_per_s": r.bytes() as f64 / secs / 1e9,
        "torn": r.torn(), "lost": r.lost(), "clean": r.clean(),
        "round_trip": percentiles(&r.latency),
        "faults": {"kills": r.kills, "detected": r.detected, "detection": percentiles(&r.detection)},
        "pairs": pairs,
        "series": series,
    })
}
