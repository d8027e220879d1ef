//! `ringserve bench serve`: a load generator for a running server.
//!
//! Closed loop (`concurrency` clients, each sending its next request when the last one ends) or open
//! loop (requests arrive as a Poisson process at `request_rate` per second, whatever the server's
//! state). Prompts are random token ids and outputs run to their length (`ignore_eos`), with lengths
//! drawn uniformly from `len × [1 - range_ratio, 1 + range_ratio]`, as vLLM's random dataset does.
//! Reports time to first token, inter-token latency and end-to-end latency percentiles, output
//! tokens/s, requests/s and errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use protos::v1::inference_client::InferenceClient;
use protos::v1::{GenerateRequest, ModelInfoRequest, SamplingParams, TokenIds, generate_request};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::bench_openai::HttpTarget;
use crate::connect::{Bearer, Client};

/// How to load the server.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Server address (`http://host:port`).
    pub addr: String,
    /// Requests to send.
    pub num_requests: usize,
    /// Closed loop: clients in flight. Ignored when `request_rate` is set.
    pub concurrency: usize,
    /// Open loop: Poisson arrivals per second.
    pub request_rate: Option<f64>,
    /// Mean prompt length in tokens.
    pub input_len: usize,
    /// Mean output length in tokens.
    pub output_len: usize,
    /// Lengths are uniform in `len × [1 - r, 1 + r]`.
    pub range_ratio: f64,
    /// Seed of the prompts and lengths.
    pub seed: u64,
    /// gRPC connections to spread the streams over.
    pub connections: usize,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// API key and TLS settings.
    pub security: crate::connect::ClientSecurity,
    /// Send the requests through the OpenAI-compatible HTTP API at this `host:port` instead of
    /// gRPC (the model's vocabulary and context length still come from gRPC's `ModelInfo`).
    pub openai_addr: Option<String>,
    /// With `openai_addr`: HTTP/2 (cleartext), the clients sharing `connections` connections,
    /// instead of one HTTP/1.1 connection per client.
    pub openai_http2: bool,
}

/// Percentiles of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Percentiles {
    /// Percentiles of `samples` (seconds), reported in ms.
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[i] * 1e3
        };
        Self {
            mean: samples.iter().sum::<f64>() / samples.len() as f64 * 1e3,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
        }
    }
}

/// The result of one run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BenchReport {
    /// `closed` or `open`.
    pub mode: String,
    pub concurrency: Option<usize>,
    pub request_rate: Option<f64>,
    pub num_requests: usize,
    pub completed: usize,
    pub errors: usize,
    /// The first few distinct error messages.
    pub error_samples: Vec<String>,
    pub duration_s: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub ttft_ms: Percentiles,
    pub itl_ms: Percentiles,
    pub e2e_ms: Percentiles,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let load = match (self.concurrency, self.request_rate) {
            (_, Some(r)) => format!("open loop, {r} req/s"),
            (Some(c), None) => format!("closed loop, concurrency {c}"),
            (None, None) => String::new(),
        };
        writeln!(
            f,
            "{load}: {} requests in {:.2} s",
            self.num_requests, self.duration_s
        )?;
        writeln!(
            f,
            "  completed {}  errors {}  {:.1} req/s  {:.0} output tok/s  ({} in, {} out)",
            self.completed,
            self.errors,
            self.requests_per_s,
            self.output_tokens_per_s,
            self.input_tokens,
            self.output_tokens
        )?;
        for (name, p) in [
            ("TTFT", self.ttft_ms),
            ("ITL ", self.itl_ms),
            ("E2E ", self.e2e_ms),
        ] {
            writeln!(
                f,
                "  {name} ms  mean {:>9.3}  p50 {:>9.3}  p90 {:>9.3}  p99 {:>9.3}",
                p.mean, p.p50, p.p90, p.p99
            )?;
        }
        for e in &self.error_samples {
            writeln!(f, "  error: {e}")?;
        }
        Ok(())
    }
}

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Connect(#[from] crate::connect::ConnectError),
    #[error("asking for the model's info: {0}")]
    ModelInfo(tonic::Status),
    #[error("{0}")]
    Options(String),
}

/// One request's measurements.
#[derive(Debug, Default)]
pub(crate) struct Sample {
    pub(crate) ttft: Option<f64>,
    pub(crate) itl: Vec<f64>,
    pub(crate) e2e: f64,
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) error: Option<String>,
}

impl Sample {
    /// `n` tokens arrived at `now` (the request started at `start`, the previous tokens came at
    /// `last`): the first arrival is the TTFT, later ones spread their gap over their tokens.
    pub(crate) fn record(&mut self, n: u64, start: Instant, last: &mut Instant) {
        let now = Instant::now();
        match self.ttft {
            None => self.ttft = Some(now.duration_since(start).as_secs_f64()),
            Some(_) => {
                let gap = now.duration_since(*last).as_secs_f64() / n as f64;
                self.itl.extend(std::iter::repeat_n(gap, n as usize));
            }
        }
        *last = now;
        self.output += n;
    }
}

fn draw_len(rng: &mut StdRng, mean: usize, ratio: f64) -> usize {
    let lo = ((mean as f64) * (1.0 - ratio)).round().max(1.0) as usize;
    let hi = ((mean as f64) * (1.0 + ratio)).round().max(lo as f64) as usize;
    rng.random_range(lo..=hi)
}

/// The requests of a run, drawn up front so every run with a seed sends the same ones.
fn requests(opts: &BenchOptions, vocab: u32, max_len: u32) -> Vec<GenerateRequest> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    (0..opts.num_requests)
        .map(|_| {
            let input = draw_len(&mut rng, opts.input_len, opts.range_ratio);
            let output = draw_len(&mut rng, opts.output_len, opts.range_ratio);
            let input = input.min(max_len as usize - 1);
            let output = output.min(max_len as usize - input);
            let ids = (0..input).map(|_| rng.random_range(0..vocab)).collect();
            GenerateRequest {
                prompt: Some(generate_request::Prompt::TokenIds(TokenIds { ids })),
                sampling: Some(SamplingParams {
                    temperature: Some(0.0),
                    ..Default::default()
                }),
                max_tokens: Some(output as u32),
                ignore_eos: true,
                ..Default::default()
            }
        })
        .collect()
}

async fn one(mut client: Client, req: GenerateRequest) -> Sample {
    let input = match &req.prompt {
        Some(generate_request::Prompt::TokenIds(t)) => t.ids.len() as u64,
        _ => 0,
    };
    let start = Instant::now();
    let mut s = Sample {
        input,
        ..Sample::default()
    };
    let result = async {
        let mut stream = client.generate(req).await?.into_inner();
        let mut last = start;
        while let Some(msg) = stream.message().await? {
            let n = msg.token_ids.len() as u64;
            if n > 0 {
                s.record(n, start, &mut last);
            }
        }
        Ok::<(), tonic::Status>(())
    }
    .await;
    s.e2e = start.elapsed().as_secs_f64();
    if let Err(e) = result {
        s.error = Some(format!("{:?}: {}", e.code(), e.message()));
    }
    s
}

/// Runs the benchmark.
pub async fn run(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    if opts.num_requests == 0 || opts.input_len == 0 || opts.output_len == 0 {
        return Err(BenchError::Options(
            "num-requests, input-len and output-len must be at least 1".into(),
        ));
    }
    if !(0.0..1.0).contains(&opts.range_ratio) {
        return Err(BenchError::Options("range-ratio must be in [0, 1)".into()));
    }
    let mut channels = Vec::new();
    for _ in 0..opts.connections.max(1) {
        channels.push(crate::connect::channel(&opts.addr, &opts.security).await?);
    }
    let bearer = Bearer::new(opts.security.api_key.as_deref())?;
    let info = InferenceClient::with_interceptor(channels[0].clone(), bearer.clone())
        .model_info(ModelInfoRequest {})
        .await
        .map_err(BenchError::ModelInfo)?
        .into_inner();
    let reqs = requests(opts, info.vocab_size, info.max_model_len);
    let bar = if opts.progress {
        let bar = ProgressBar::new(reqs.len() as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} requests {elapsed} ({eta} left)")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let samples = Arc::new(Mutex::new(Vec::with_capacity(reqs.len())));
    let key = opts.security.api_key.as_deref();
    let http = match &opts.openai_addr {
        Some(a) => Some(
            HttpTarget::connect(a, key, opts.openai_http2, opts.connections)
                .await
                .map_err(BenchError::Options)?,
        ),
        None => None,
    };
    let start = Instant::now();
    let client_for = |i: usize| {
        InferenceClient::with_interceptor(channels[i % channels.len()].clone(), bearer.clone())
    };
    match opts.request_rate {
        Some(rate) => {
            let mut rng = StdRng::seed_from_u64(opts.seed ^ 0x5eed);
            let mut tasks = Vec::with_capacity(reqs.len());
            let mut next = Instant::now();
            for (i, req) in reqs.into_iter().enumerate() {
                tokio::time::sleep_until(next.into()).await;
                let (client, samples, bar) = (client_for(i), samples.clone(), bar.clone());
                let http = http.as_ref().map(|t| t.conn(i));
                tasks.push(tokio::spawn(async move {
                    let s = match http {
                        Some(mut conn) => conn.one(&req).await,
                        None => one(client, req).await,
                    };
                    samples.lock().await.push(s);
                    bar.inc(1);
                }));
                // Exponential inter-arrival times: a Poisson process.
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                next += Duration::from_secs_f64(-u.ln() / rate);
            }
            for t in tasks {
                let _ = t.await;
            }
        }
        None => {
            let reqs = Arc::new(std::sync::Mutex::new(reqs.into_iter()));
            let counter = Arc::new(AtomicUsize::new(0));
            let mut tasks = Vec::new();
            for c in 0..opts.concurrency.max(1) {
                let (reqs, samples, bar, counter) =
                    (reqs.clone(), samples.clone(), bar.clone(), counter.clone());
                let channels = channels.clone();
                let bearer = bearer.clone();
                let mut http = http.as_ref().map(|t| t.conn(c));
                tasks.push(tokio::spawn(async move {
                    loop {
                        let next = reqs.lock().unwrap_or_else(|e| e.into_inner()).next();
                        let Some(req) = next else { break };
                        let i = counter.fetch_add(1, Ordering::Relaxed);
                        let channel = channels[i % channels.len()].clone();
                        let client = InferenceClient::with_interceptor(channel, bearer.clone());
                        let s = match &mut http {
                            Some(conn) => conn.one(&req).await,
                            None => one(client, req).await,
                        };
                        samples.lock().await.push(s);
                        bar.inc(1);
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        }
    }
    let duration = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let samples = std::mem::take(&mut *samples.lock().await);
    Ok(summarize(opts, samples, duration))
}

fn summarize(opts: &BenchOptions, samples: Vec<Sample>, duration: f64) -> BenchReport {
    let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    let mut report = BenchReport {
        mode: if opts.request_rate.is_some() {
            "open".into()
        } else {
            "closed".into()
        },
        concurrency: opts.request_rate.is_none().then_some(opts.concurrency),
        request_rate: opts.request_rate,
        num_requests: opts.num_requests,
        duration_s: duration,
        ..BenchReport::default()
    };
    for s in samples {
        report.output_tokens += s.output;
        match s.error {
            Some(e) => {
                report.errors += 1;
                if report.error_samples.len() < 5 && !report.error_samples.contains(&e) {
                    report.error_samples.push(e);
                }
            }
            None => {
                report.completed += 1;
                report.input_tokens += s.input;
                e2e.push(s.e2e);
                ttft.extend(s.ttft);
                itl.extend(s.itl);
            }
        }
    }
    report.requests_per_s = report.completed as f64 / duration;
    report.output_tokens_per_s = report.output_tokens as f64 / duration;
    report.ttft_ms = Percentiles::of(&mut ttft);
    report.itl_ms = Percentiles::of(&mut itl);
    report.e2e_ms = Percentiles::of(&mut e2e);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_sample() {
        let mut v: Vec<f64> = (1..=100).map(|i| f64::from(i) / 1000.0).collect();
        let p = Percentiles::of(&mut v);
        assert!((p.p50 - 51.0).abs() < 1e-9 || (p.p50 - 50.0).abs() < 1e-9);
        assert!((p.p99 - 99.0).abs() < 1e-9);
        assert!((p.mean - 50.5).abs() < 1e-9);
        assert_eq!(Percentiles::of(&mut []), Percentiles::default());
    }

    #[test]
    fn request_lengths_stay_in_range_and_are_reproducible() {
        let opts = BenchOptions {
            addr: String::new(),
            num_requests: 50,
            concurrency: 1,
            request_rate: None,
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
            seed: 3,
            connections: 1,
            progress: false,
            security: Default::default(),
            openai_addr: None,
            openai_http2: false,
        };
        let a = requests(&opts, 1000, 512);
        assert_eq!(a, requests(&opts, 1000, 512));
        for r in &a {
            let Some(generate_request::Prompt::TokenIds(t)) = &r.prompt else {
                panic!("token ids expected")
            };
            assert!((50..=150).contains(&t.ids.len()));
            assert!(t.ids.iter().all(|&i| i < 1000));
            assert!((10..=30).contains(&r.max_tokens.unwrap()));
        }
    }
}
