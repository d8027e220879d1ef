//! `ringserve`: the one command line. Every subcommand parses its flags and calls into a library crate.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod engine_cli;

#[derive(Parser)]
#[command(
    name = "ringserve",
    version,
    about = "Serve Llama-family models over gRPC, fast"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Offline batch generation: JSONL requests in, JSONL results out.
    Generate(engine_cli::GenerateArgs),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Write the built-in demo model (a small random-weight Llama with a real tokenizer) to a folder.
    DemoModel {
        /// Output folder (created if missing; existing files are overwritten).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Offline engine throughput over batch sizes and prompt lengths (prefill and decode tokens/s).
    Engine(engine_cli::BenchEngineArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(args) => engine_cli::generate(args),
        Command::Bench { which } => match which {
            BenchCommand::Engine(args) => engine_cli::bench_engine(args),
        },
        Command::DemoModel { out } => {
            worker::demo::write_demo_model(&out)
                .with_context(|| format!("writing the demo model to {}", out.display()))?;
            eprintln!("wrote the demo model to {}", out.display());
            Ok(())
        }
    }
}
