//! The engine benchmark behind `ringserve bench engine`: offline throughput over batch sizes and
//! prompt lengths, with prefill and decode measured separately.
//!
//! For each `(batch, prompt_len)` a batch of greedy requests with distinct pseudo-random prompts
//! (no prefix-cache hits) and `output_len` tokens each runs to completion. Steps that compute any
//! prefill token count as prefill time; steps of decodes only as decode time. Prefill throughput is
//! prompt tokens over prefill time, decode throughput generated tokens (after each request's first)
//! over decode time.
//!
//! With `warmup` on (the default) each point first runs once untimed, on other prompts of the same
//! shape: one-time costs of a shape (a CUDA backend captures a graph the first time it meets a
//! batch bucket and context capacity, tens of milliseconds) then stay out of the step times.
//!
//! With `peer_decode` each point also runs once with one output token, and decode throughput is
//! given the way the vLLM peer script measures it too: `batch × (output_len − 1) / (t(output_len) −
//! t(1))`, both wall times of the whole batch in this warmed-up process — so the two systems' decode
//! figures come from one method, prefill steps and the ragged tail included — and prefill
//! throughput as it measures it, `batch × prompt_len / t(1)`.

use std::time::{Duration, Instant};

use crate::engine::{Engine, EngineError};
use crate::kv::{SeqId, block_hash_mix as mix64};
use crate::request::{Request, RequestError};
use crate::sampler::SamplingParams;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchConfig {
    pub batch_sizes: Vec<usize>,
    pub prompt_lens: Vec<usize>,
    /// Tokens generated per request.
    pub output_len: usize,
    /// Run each point once untimed first.
    pub warmup: bool,
    /// Also run each point with one output token, for [`BenchRow::peer_decode_tokens_per_s`].
    pub peer_decode: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            batch_sizes: vec![1, 8, 32],
            prompt_lens: vec![128, 512],
            output_len: 32,
            warmup: true,
            peer_decode: false,
        }
    }
}

/// One measured point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchRow {
    pub batch: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub prefill_tokens: usize,
    pub prefill_time: Duration,
    pub decode_tokens: usize,
    pub decode_time: Duration,
    pub decode_steps: usize,
    /// Decode-only steps in which every request of the point decoded (before the first finished),
    /// and their time: the step time at exactly `batch` sequences.
    pub full_steps: usize,
    pub full_time: Duration,
    /// Of `full_time`, the time inside the backend's forward call.
    pub full_backend_time: Duration,
    /// Wall time of the whole point, first request added to last token.
    pub wall_time: Duration,
    /// Wall time of the same point with one output token (with [`BenchConfig::peer_decode`]).
    pub one_token_wall_time: Option<Duration>,
    /// When every request of the point had its first token, and the decode tokens computed
    /// before then (by requests whose prompt finished earlier, in steps that also carry prompt
    /// chunks): `t(N) − t(1)` is this time less `t(1)`, plus the rest of the run.
    pub all_first_time: Duration,
    pub decode_tokens_before_all_first: usize,
}

impl BenchRow {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        per_second(self.prefill_tokens, self.prefill_time)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        per_second(self.decode_tokens, self.decode_time)
    }

    /// Mean time of a decode step of all `batch` requests (0 if none ran).
    pub fn ms_per_full_step(&self) -> f64 {
        if self.full_steps == 0 {
            0.0
        } else {
            self.full_time.as_secs_f64() * 1e3 / self.full_steps as f64
        }
    }

    /// Mean time a full-batch step spends outside the backend (the engine's host work).
    pub fn ms_host_per_full_step(&self) -> f64 {
        if self.full_steps == 0 {
            0.0
        } else {
            (self.full_time.saturating_sub(self.full_backend_time)).as_secs_f64() * 1e3
                / self.full_steps as f64
        }
    }

    /// Mean time of a decode-only step.
    pub fn ms_per_decode_step(&self) -> f64 {
        if self.decode_steps == 0 {
            0.0
        } else {
            self.decode_time.as_secs_f64() * 1e3 / self.decode_steps as f64
        }
    }
}

impl BenchRow {
    /// Decode tokens/s as the peer script measures it: `batch × (output_len − 1) / (t(output_len) −
    /// t(1))` (0 without a one-token run, or if it was not faster).
    pub fn peer_decode_tokens_per_s(&self) -> f64 {
        match self.one_token_wall_time {
            Some(t1) if self.wall_time > t1 => per_second(
                self.batch * self.output_len.saturating_sub(1),
                self.wall_time - t1,
            ),
            _ => 0.0,
        }
    }

    /// Prefill tokens/s as the peer script measures it: `batch × prompt_len / t(1)`, the whole
    /// batch's wall time with one output token (0 without a one-token run).
    pub fn peer_prefill_tokens_per_s(&self) -> f64 {
        self.one_token_wall_time
            .map_or(0.0, |t1| per_second(self.batch * self.prompt_len, t1))
    }
}

fn per_second(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

/// A benchmark point that could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("batch {batch} x prompt {prompt_len}: {source}")]
    Request {
        batch: usize,
        prompt_len: usize,
        source: RequestError,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Runs every `(batch, prompt_len)` point on `engine`, calling `report` after each.
pub fn run_bench(
    engine: &mut Engine,
    config: &BenchConfig,
    mut report: impl FnMut(&BenchRow),
) -> Result<Vec<BenchRow>, BenchError> {
    let mut rows = Vec::new();
    let mut next_id = 0u64;
    for &prompt_len in &config.prompt_lens {
        for &batch in &config.batch_sizes {
            if config.warmup {
                run_point(engine, batch, prompt_len, config.output_len, &mut next_id)?;
            }
            let one_token = if config.peer_decode {
                Some(run_point(engine, batch, prompt_len, 1, &mut next_id)?.wall_time)
            } else {
                None
            };
            let mut row = run_point(engine, batch, prompt_len, config.output_len, &mut next_id)?;
            row.one_token_wall_time = one_token;
            if let Some(t1) = one_token {
                // Where t(N) − t(1) goes: the prompt phase's extra length (the decodes that ride
                // in its steps, whatever else they cost), then the steps after the last request's
                // first token.
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                tracing::info!(
                    batch,
                    prompt_len,
                    t1_ms = ms(t1),
                    all_first_ms = ms(row.all_first_time),
                    decodes_before = row.decode_tokens_before_all_first,
                    after_ms = ms(row.wall_time.saturating_sub(row.all_first_time)),
                    "peer decode: t(N) - t(1) = (all_first - t1) + after"
                );
            }
            report(&row);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Runs `batch` requests of `prompt_len` prompt tokens to completion and times their steps; request
/// ids (and the prompts derived from them) start at `next_id`, which moves past them.
fn run_point(
    engine: &mut Engine,
    batch: usize,
    prompt_len: usize,
    output_len: usize,
    next_id: &mut u64,
) -> Result<BenchRow, BenchError> {
    let vocab = engine.vocab_size() as u64;
    // Marks where a point's steps begin in a debug log (scripts/step_log_summary.py --points).
    tracing::debug!(batch, prompt_len, output_len, "bench point");
    let began = Instant::now();
    for _ in 0..batch {
        let prompt = (0..prompt_len as u64)
            .map(|i| (mix64(*next_id << 32 | i) % vocab) as u32)
            .collect();
        let mut req = Request::new(SeqId(*next_id), prompt, output_len);
        req.params = SamplingParams::greedy();
        req.ignore_eos = true;
        *next_id += 1;
        engine
            .add_request(req)
            .map_err(|source| BenchError::Request {
                batch,
                prompt_len,
                source,
            })?;
    }
    let mut row = BenchRow {
        batch,
        prompt_len,
        output_len,
        prefill_tokens: 0,
        prefill_time: Duration::ZERO,
        decode_tokens: 0,
        decode_time: Duration::ZERO,
        decode_steps: 0,
        full_steps: 0,
        full_time: Duration::ZERO,
        full_backend_time: Duration::ZERO,
        wall_time: Duration::ZERO,
        one_token_wall_time: None,
        all_first_time: Duration::ZERO,
        decode_tokens_before_all_first: 0,
    };
    let mut started = std::collections::HashSet::new();
    while engine.has_unfinished() {
        let start = Instant::now();
        let events = engine.step()?;
        let took = start.elapsed();
        let step = engine.last_step();
        if started.len() < batch {
            row.decode_tokens_before_all_first += step.decode_tokens;
            started.extend(events.iter().map(|e| e.id));
            if started.len() == batch {
                row.all_first_time = began.elapsed();
            }
        }
        // The line `ringserve generate` logs (scripts/step_log_summary.py reads both).
        tracing::debug!(
            prefill_tokens = step.prefill_tokens,
            decode_tokens = step.decode_tokens,
            seqs = step.num_seqs,
            backend_ms = step.backend_time.as_secs_f64() * 1e3,
            step_ms = took.as_secs_f64() * 1e3,
            "step"
        );
        if step.prefill_tokens > 0 {
            row.prefill_tokens += step.prefill_tokens;
            row.prefill_time += took;
        } else {
            row.decode_tokens += step.decode_tokens;
            row.decode_time += took;
            row.decode_steps += 1;
            if step.decode_tokens == batch {
                row.full_steps += 1;
                row.full_time += took;
                row.full_backend_time += step.backend_time;
            }
        }
    }
    row.wall_time = began.elapsed();
    Ok(row)
}

/// The header of [`markdown_row`]'s table.
pub const MARKDOWN_HEADER: &str = "| batch | prompt | output | prefill tok/s | decode tok/s | ms / decode step | ms / full-batch step | of which engine host ms | decode tok/s, (t(N) − t(1)) | prefill tok/s, n · prompt / t(1) |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";

/// One row of a markdown table.
pub fn markdown_row(r: &BenchRow) -> String {
    format!(
        "| {} | {} | {} | {:.0} | {:.1} | {:.2} | {:.2} | {:.3} | {} | {} |",
        r.batch,
        r.prompt_len,
        r.output_len,
        r.prefill_tokens_per_s(),
        r.decode_tokens_per_s(),
        r.ms_per_decode_step(),
        r.ms_per_full_step(),
        r.ms_host_per_full_step(),
        match r.one_token_wall_time {
            Some(_) => format!("{:.1}", r.peer_decode_tokens_per_s()),
            None => "—".into(),
        },
        match r.one_token_wall_time {
            Some(_) => format!("{:.0}", r.peer_prefill_tokens_per_s()),
            None => "—".into(),
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testing::ToyBackend;
    use crate::engine::EngineConfig;

    fn toy_engine() -> Engine {
        let (backend, model) = ToyBackend::with_config(50, 4, 200);
        Engine::new(Box::new(backend), &model, EngineConfig::default()).expect("engine")
    }

    #[test]
    fn counts_prefill_and_decode_tokens() {
        let mut engine = toy_engine();
        let config = BenchConfig {
            batch_sizes: vec![1, 3],
            prompt_lens: vec![5, 9],
            output_len: 4,
            warmup: false,
            peer_decode: false,
        };
        let rows = run_bench(&mut engine, &config, |_| {}).expect("bench");
        assert_eq!(rows.len(), 4);
        for r in &rows {
            assert_eq!(r.prefill_tokens, r.batch * r.prompt_len);
            assert_eq!(r.decode_tokens, r.batch * (r.output_len - 1));
            assert_eq!(r.decode_steps, r.output_len - 1);
            // Small prompts prefill in one step: every decode step has the whole batch.
            assert_eq!(r.full_steps, r.decode_steps);
            // ... and every request has its first token after that step, before any decode.
            assert_eq!(r.decode_tokens_before_all_first, 0);
            assert!(r.all_first_time > Duration::ZERO && r.all_first_time < r.wall_time);
        }
        assert!(markdown_row(&rows[0]).starts_with("| 1 | 5 | 4 |"));
    }

    #[test]
    fn decodes_in_prompt_steps_are_counted_before_every_first_token() {
        // 3 prompts of 9 tokens through 10-token steps: the first request finishes its prompt
        // in the first step and decodes while the others' chunks run.
        let (backend, model) = ToyBackend::with_config(50, 4, 200);
        let config = EngineConfig {
            max_num_batched_tokens: 10,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(Box::new(backend), &model, config).expect("engine");
        let config = BenchConfig {
            batch_sizes: vec![3],
            prompt_lens: vec![9],
            output_len: 6,
            warmup: false,
            peer_decode: false,
        };
        let rows = run_bench(&mut engine, &config, |_| {}).expect("bench");
        let r = &rows[0];
        assert!(r.decode_tokens_before_all_first > 0, "{r:?}");
        assert!(r.decode_tokens_before_all_first < 3 * 5);
        assert!(r.all_first_time > Duration::ZERO && r.all_first_time < r.wall_time);
    }

    #[test]
    fn warmup_runs_each_point_untimed_on_other_prompts() {
        let mut engine = toy_engine();
        let config = BenchConfig {
            batch_sizes: vec![2],
            prompt_lens: vec![6],
            output_len: 3,
            warmup: true,
            peer_decode: false,
        };
        let mut reported = 0;
        let rows = run_bench(&mut engine, &config, |_| reported += 1).expect("bench");
        // One reported row, counting only the measured run's tokens.
        assert_eq!((rows.len(), reported), (1, 1));
        assert_eq!(rows[0].prefill_tokens, 2 * 6);
        assert_eq!(rows[0].decode_tokens, 2 * 2);
        // The warm-up's two requests were scheduled too (the prefix cache was asked about both
        // runs' prompts) and hit nothing: its prompts differ from the measured run's.
        let stats = engine.stats();
        assert_eq!(stats.prefix_queried_tokens, 2 * 2 * 6);
        assert_eq!(stats.prefix_hit_tokens, 0);
    }

    #[test]
    fn full_batch_steps_exclude_the_ragged_tail() {
        // Prefill in chunks of 10 tokens: the three 9-token prompts start decoding steps apart,
        // so the last decode steps run without the requests that finished first.
        let (backend, model) = ToyBackend::with_config(50, 4, 200);
        let engine_config = EngineConfig {
            max_num_batched_tokens: 10,
            ..EngineConfig::default()
        };
        let mut engine = Engine::new(Box::new(backend), &model, engine_config).expect("engine");
        let config = BenchConfig {
            batch_sizes: vec![3],
            prompt_lens: vec![9],
            output_len: 6,
            warmup: false,
            peer_decode: false,
        };
        let r = run_bench(&mut engine, &config, |_| {}).expect("bench")[0];
        assert!(r.decode_steps > 0);
        assert!(
            r.full_steps < r.decode_steps,
            "{} full of {} decode steps",
            r.full_steps,
            r.decode_steps
        );
        assert!(r.full_time <= r.decode_time);
        assert!(r.full_backend_time <= r.full_time);
    }

    #[test]
    fn peer_decode_runs_a_one_token_point_and_uses_the_wall_times() {
        let mut engine = toy_engine();
        let config = BenchConfig {
            batch_sizes: vec![2],
            prompt_lens: vec![6],
            output_len: 5,
            warmup: false,
            peer_decode: true,
        };
        let r = run_bench(&mut engine, &config, |_| {}).expect("bench")[0];
        let t1 = r.one_token_wall_time.expect("one-token run");
        assert!(r.wall_time > Duration::ZERO);
        // The one-token run's prompts were new ones: 2 runs × 2 prompts asked, none hit.
        assert_eq!(engine.stats().prefix_queried_tokens, 2 * 2 * 6);
        assert_eq!(engine.stats().prefix_hit_tokens, 0);
        if r.wall_time > t1 {
            let want = 2.0 * 4.0 / (r.wall_time - t1).as_secs_f64();
            assert!((r.peer_decode_tokens_per_s() - want).abs() < 1e-6 * want);
        } else {
            assert_eq!(r.peer_decode_tokens_per_s(), 0.0);
        }
        let prefill = 2.0 * 6.0 / t1.as_secs_f64();
        assert!((r.peer_prefill_tokens_per_s() - prefill).abs() < 1e-6 * prefill);
        let cells = markdown_row(&r).matches('|').count();
        assert_eq!(
            cells,
            MARKDOWN_HEADER.lines().next().unwrap().matches('|').count()
        );
    }
}
