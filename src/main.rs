//! `ringserve`: the one command line. Every subcommand parses its flags and calls into a library crate.

use clap::{Parser, Subcommand};

mod engine_cli;
mod serve_cli;

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
    /// Serve a model over gRPC: the gateway plus worker processes (default: the demo model on the CPU).
    Serve(serve_cli::ServeArgs),
    /// One worker process serving a gateway's rings (started by `serve`).
    Worker(serve_cli::WorkerArgs),
    /// Stream a completion from a running server to the terminal.
    Client(serve_cli::ClientArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(args) => engine_cli::generate(args),
        Command::Serve(args) => serve_cli::serve(args),
        Command::Worker(args) => serve_cli::worker(args),
        Command::Client(args) => serve_cli::client(args),
    }
}

/// The demo model's folder, written on first use under the user's cache directory.
fn demo_model_dir() -> anyhow::Result<std::path::PathBuf> {
    anyhow::bail!("no --model given and this build has no demo model yet; pass --model DIR")
}
