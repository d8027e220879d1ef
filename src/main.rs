//! `ringserve`: the one command line. Every subcommand parses its flags and calls into a library crate.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

/// mimalloc instead of glibc's malloc: the gateway's stream pipeline (detokenizing, building each
/// message) spent 28–31 % of its CPU in glibc's malloc and free (perf, 128 streaming clients).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod engine_cli;
mod ring_cli;
mod scale_cli;
mod security_cli;
mod serve_cli;

#[derive(Parser)]
#[command(
    name = "ringserve",
    version,
    about = "Serve Llama-family models over gRPC, fast"
)]
struct Cli {
    /// Log lines as text (coloured on a terminal) or as JSON objects, one per line (timestamp,
    /// level, target, message and fields such as request_id), for log collectors. Levels come
    /// from RUST_LOG (default: info).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// The flag that gives a child process the same format.
    pub fn to_args(self) -> [String; 2] {
        let name = self.to_possible_value().map(|v| v.get_name().to_owned());
        ["--log-format".into(), name.unwrap_or_default()]
    }
}

/// Installs the stderr logger: levels from RUST_LOG (default info), colours only on a terminal.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::INFO.into())
        .from_env_lossy();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// Reports a failed command: one line, then the chain of causes, never a backtrace (whatever
/// RUST_BACKTRACE says: these are errors of input or environment, not of the program).
fn report(error: &anyhow::Error, format: LogFormat) {
    // Many errors already spell out their source in their own message: print a cause only when
    // the line before it does not already say it.
    let mut causes: Vec<String> = Vec::new();
    let mut last = error.to_string();
    for cause in error.chain().skip(1) {
        let text = cause.to_string();
        if !last.contains(&text) {
            causes.push(text.clone());
        }
        last = text;
    }
    match format {
        LogFormat::Text => {
            eprintln!("error: {error}");
            for cause in &causes {
                eprintln!("  caused by: {cause}");
            }
        }
        LogFormat::Json => {
            tracing::error!(causes = ?causes, "{error}");
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Offline batch generation: JSONL requests in, JSONL results out.
    Generate(engine_cli::GenerateArgs),
    /// Serve a model over gRPC and the OpenAI-compatible HTTP API: the gateway plus worker
    /// processes (default: the demo model on the CPU).
    Serve(Box<serve_cli::ServeArgs>),
    /// One worker process serving a gateway's rings (started by `serve`, or joining a running one
    /// with --join NAME). SIGTERM drains it: it finishes its streams, then exits 0.
    Worker(serve_cli::WorkerArgs),
    /// Stream a completion from a running server to the terminal.
    Client(serve_cli::ClientArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write the built-in demo model (a small random-weight Llama with a real tokenizer) to a folder.
    DemoModel {
        /// Output folder (created if missing; existing files are overwritten).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Shared-memory ring across two processes: throughput per record size, batch and wait mode
    /// (with each side's full/empty stalls, futex sleeps and wakes), and ping-pong round-trip
    /// latency; or, with --stress, many pairs of processes under checksummed random load.
    Ring(ring_cli::BenchRingArgs),
    /// The child process of `bench ring` (started by it).
    #[command(hide = true)]
    RingChild { args: Vec<String> },
    /// Offline engine throughput over batch sizes and prompt lengths (prefill and decode tokens/s).
    Engine(engine_cli::BenchEngineArgs),
    /// Load a running server: TTFT, inter-token and end-to-end latency, throughput.
    Serve(serve_cli::BenchServeArgs),
    /// Draw ringserve's `bench serve --sweep` results beside `vllm bench serve` results on one
    /// throughput–latency PNG (TTFT and inter-token latency, p50 and p99).
    Plot(serve_cli::BenchPlotArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let format = cli.log_format;
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e, format);
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(args) => engine_cli::generate(args),
        Command::Serve(args) => serve_cli::serve(*args, cli.log_format),
        Command::Worker(args) => serve_cli::worker(args),
        Command::Client(args) => serve_cli::client(args),
        Command::Bench(BenchCommand::Ring(args)) => ring_cli::bench_ring(args),
        Command::Bench(BenchCommand::RingChild { args }) => {
            ringbuf::bench::child_main(&args)?;
            Ok(())
        }
        Command::Bench(BenchCommand::Engine(args)) => engine_cli::bench_engine(args),
        Command::Bench(BenchCommand::Serve(args)) => serve_cli::bench_serve(args),
        Command::Bench(BenchCommand::Plot(args)) => serve_cli::bench_plot(args),
        Command::DemoModel { out } => {
            worker::demo::write_demo_model(&out)
                .with_context(|| format!("writing the demo model to {}", out.display()))?;
            eprintln!("wrote the demo model to {}", out.display());
            Ok(())
        }
    }
}

/// A local path for `--model`: a folder or `.gguf` file as given, or a Hub id (`org/name`,
/// `org/name@revision`, `org/name:QUANT`) fetched into — or, with `HF_HUB_OFFLINE=1`, found in —
/// the HuggingFace cache. `gguf_file` (`--gguf-file`) names the GGUF file of a repository.
fn resolve_model(model: &std::path::Path, gguf_file: Option<&str>) -> anyhow::Result<PathBuf> {
    let name = model
        .to_str()
        .with_context(|| format!("--model {}: not UTF-8", model.display()))?;
    let path = hub::resolve(name, gguf_file, &hub::HubOptions::from_env())
        .with_context(|| format!("--model {name}"))?;
    if path.as_path() != model {
        tracing::info!(model = name, path = %path.display(), "model resolved");
    }
    Ok(path)
}

/// The demo model's folder, written on first use under the user's cache directory.
fn demo_model_dir() -> anyhow::Result<PathBuf> {
    worker::demo::cached_demo_model_dir().context("preparing the demo model")
}
