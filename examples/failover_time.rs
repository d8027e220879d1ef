//! Failover time: SIGKILL a worker of a running `ringserve serve` while many greedy streams are
//! in flight, and measure, for each stream the kill interrupted, the time from the kill to its next
//! token (the gateway noticing, resubmitting prompt + streamed tokens to a live worker, that worker
//! prefilling them, and the first new token arriving). Every stream must still end with exactly its
//! `max_tokens` tokens. `scripts/bench_failover.sh` starts the server and runs this.
//!
//! ```text
//! cargo run --release --example failover_time -- --pid 12345 [--addr http://127.0.0.1:50051]
//!     [--streams 32] [--max-tokens 400] [--kill-at 0.25]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use protos::v1::inference_client::InferenceClient;
use protos::v1::{GenerateRequest, SamplingParams, TokenIds, generate_request};

struct Args {
    addr: String,
    pid: u32,
    streams: usize,
    max_tokens: u32,
    /// Kill once this fraction of all tokens has arrived.
    kill_at: f64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        addr: "http://127.0.0.1:50051".into(),
        pid: 0,
        streams: 32,
        max_tokens: 400,
        kill_at: 0.25,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag}: missing value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag} {value:?}: {e}");
        match flag.as_str() {
            "--addr" => args.addr = value,
            "--pid" => args.pid = value.parse().map_err(bad)?,
            "--streams" => args.streams = value.parse().map_err(bad)?,
            "--max-tokens" => args.max_tokens = value.parse().map_err(bad)?,
            "--kill-at" => {
                args.kill_at = value
                    .parse()
                    .ok()
                    .filter(|f| (0.0..1.0).contains(f))
                    .ok_or(format!("--kill-at {value:?}: a fraction in [0, 1)"))?
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.pid == 0 {
        return Err("--pid: the worker to kill is required".into());
    }
    Ok(args)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let start = Instant::now();
    let received = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..args.streams {
        let received = received.clone();
        let mut client = InferenceClient::connect(args.addr.clone()).await?;
        let request = GenerateRequest {
            prompt: Some(generate_request::Prompt::TokenIds(TokenIds {
                ids: (0..16)
                    .map(|j| 1 + ((i * 37 + j * 11) % 300) as u32)
                    .collect(),
            })),
            sampling: Some(SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            max_tokens: Some(args.max_tokens),
            ignore_eos: true,
            ..Default::default()
        };
        tasks.push(tokio::spawn(async move {
            let mut stream = client.generate(request).await?.into_inner();
            // (seconds since start, tokens in the message)
            let mut arrivals = Vec::new();
            while let Some(msg) = stream.message().await? {
                arrivals.push((start.elapsed().as_secs_f64(), msg.token_ids.len()));
                received.fetch_add(msg.token_ids.len(), Ordering::Relaxed);
            }
            Ok::<_, tonic::Status>(arrivals)
        }));
    }
    let kill_after = (args.kill_at * (args.streams * args.max_tokens as usize) as f64) as usize;
    while received.load(Ordering::Relaxed) < kill_after {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let killed_at = start.elapsed().as_secs_f64();
    // SAFETY: kill(2) takes two integers and touches no memory of this process.
    if unsafe { libc::kill(args.pid as libc::pid_t, libc::SIGKILL) } != 0 {
        return Err(format!("kill {}: {}", args.pid, std::io::Error::last_os_error()).into());
    }
    // (kill -> next token, whether the kill interrupted the stream) per stream in flight.
    let mut interrupted = Vec::new();
    let mut itls = Vec::new();
    for t in tasks {
        let arrivals = t.await??;
        let total: usize = arrivals.iter().map(|a| a.1).sum();
        if total != args.max_tokens as usize {
            return Err(format!(
                "a stream ended with {total} tokens, not {}",
                args.max_tokens
            )
            .into());
        }
        let before: Vec<f64> = arrivals
            .iter()
            .map(|a| a.0)
            .filter(|&t| t < killed_at)
            .collect();
        for w in before.windows(2) {
            itls.push(w[1] - w[0]);
        }
        let last_before = before.last().copied();
        let next_after = arrivals.iter().map(|a| a.0).find(|&t| t >= killed_at);
        if let (Some(b), Some(a)) = (last_before, next_after) {
            let mut own: Vec<f64> = before.windows(2).map(|w| w[1] - w[0]).collect();
            own.sort_by(f64::total_cmp);
            // Interrupted: the pause across the kill is far longer than this stream's usual gap.
            let usual = percentile(&own, 0.5);
            interrupted.push((a - killed_at, a - b > (20.0 * usual).max(0.02)));
        }
    }
    itls.sort_by(f64::total_cmp);
    let itl = percentile(&itls, 0.5);
    let mut affected: Vec<f64> = interrupted
        .iter()
        .filter(|(_, hit)| *hit)
        .map(|(to_next, _)| *to_next)
        .collect();
    affected.sort_by(f64::total_cmp);
    println!(
        "{} streams x {} tokens, SIGKILL of pid {} at {:.3} s; message gap before the kill p50 {:.2} ms",
        args.streams,
        args.max_tokens,
        args.pid,
        killed_at,
        itl * 1e3
    );
    println!(
        "interrupted streams: {} of {} in flight (paused > 20x their usual gap); SIGKILL -> next token: p50 {:.1} ms, max {:.1} ms",
        affected.len(),
        interrupted.len(),
        percentile(&affected, 0.5) * 1e3,
        affected.last().copied().unwrap_or(f64::NAN) * 1e3
    );
    println!("every stream ended with exactly {} tokens", args.max_tokens);
    Ok(())
}
