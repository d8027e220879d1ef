//! `ringserve`: the one command line. Every subcommand parses its flags and calls into a library crate.

use clap::{Parser, Subcommand};

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
enum Command {}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {}
}
