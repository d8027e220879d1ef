//! The engine: requests in, one scheduled step at a time through a [`Backend`], tokens out.
//!
//! `Engine` ties the [`Scheduler`] (which sequences compute how many tokens), the backend (one forward
//! pass over the step's flattened tokens, reading and writing KV through the block tables) and the
//! sampler together. It is synchronous and owns no thread: the worker's ring loop, offline
//! `generate` and the benchmarks each drive it with [`Engine::step`].
//!
//! ```
//! use worker::backend::testing::ToyBackend;
//! use worker::engine::{Engine, EngineConfig};
//! use worker::kv::SeqId;
//! use worker::request::Request;
//! use worker::sampler::SamplingParams;
//!
//! let (backend, model) = ToyBackend::with_config(64, 16, 32);
//! let mut engine = Engine::new(Box::new(backend), &model, EngineConfig::default()).unwrap();
//! let mut req = Request::new(SeqId(1), vec![1, 2, 3], 4);
//! req.params = SamplingParams::greedy();
//! engine.add_request(req).unwrap();
//! let mut tokens = Vec::new();
//! while engine.has_unfinished() {
//!     tokens.extend(engine.step().unwrap().into_iter().map(|e| e.token));
//! }
//! assert!(!tokens.is_empty() && tokens.len() <= 4);
//! ```

use grammar::TokenMask;
use rayon::prelude::*;
use thiserror::Error;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::backend::{Backend, BackendError, DeviceSampling, ForwardBatch, SeqInput, TokenFeed};
use crate::config::ModelConfig;
use crate::constrain::Constraints;
use crate::kv::{KvError, SeqId, block_hash_mix as mix64};
use crate::request::{FinishReason, Request, RequestError};
use crate::sampler::{History, Logprobs, SampleRequest, sample_row};
use crate::scheduler::{Scheduler, SchedulerConfig, Sequence, StepPlan};

/// Engine knobs (vLLM's names). The KV pool's size and block size come from the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Tokens computed per step at most (default 8192).
    pub max_num_batched_tokens: usize,
    /// Prompt tokens a step may carry while it decodes running sequences (default: no cap below
    /// `max_num_batched_tokens`); bounds the decoding streams' inter-token latency.
    pub max_prefill_tokens_while_decoding: Option<usize>,
    /// Sequences running at once at most (default 256).
    pub max_num_seqs: usize,
    /// Context length limit; default: the model's `max_position_embeddings`, capped by the KV pool.
    pub max_model_len: Option<usize>,
    /// Reuse cached KV blocks across requests with equal prefixes (default on).
    pub enable_prefix_caching: bool,
    /// Seed from which requests without a seed get theirs (default: from the clock).
    pub seed: Option<u64>,
    /// Plan and launch the next decode step while the device runs this one, its input tokens
    /// taken from this step's draws on the device (vLLM's `--async-scheduling`); where the
    /// backend can (CUDA) and no request of the step needs the host sampler or a grammar.
    pub async_scheduling: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8192,
            max_prefill_tokens_while_decoding: None,
            max_num_seqs: 256,
            max_model_len: None,
            enable_prefix_caching: true,
            seed: None,
            async_scheduling: false,
        }
    }
}

/// One generated token of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: SeqId,
    pub token: u32,
    /// Raw-distribution logprobs, when the request asked for them.
    pub logprobs: Option<Logprobs>,
    /// Set on the request's last token.
    pub finish: Option<FinishReason>,
}

/// Gauges for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// KV blocks held by sequences.
    pub kv_blocks_used: usize,
    /// KV blocks that can be handed out (the null block excluded).
    pub kv_blocks_total: usize,
    pub preemptions: u64,
    /// Prompt tokens admitted, and how many of them came from the prefix cache.
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Steps launched ahead of their predecessors' tokens (async scheduling).
    pub planned_ahead: u64,
}

/// What the last [`Engine::step`] computed (for benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepStats {
    /// Tokens of sequences that did not sample (prefill chunks) plus non-final tokens of those that did.
    pub prefill_tokens: usize,
    /// Sampling sequences computing exactly one token.
    pub decode_tokens: usize,
    pub num_seqs: usize,
    /// Wall time inside the backend's forward calls (both, where `forward_sampled` declines and
    /// `forward` follows; the rest of a step is the engine's own host work: scheduling, gathering
    /// inputs, applying tokens).
    pub backend_time: std::time::Duration,
}

/// The engine cannot go on; the worker must stop (the KV cache may be half written).
#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("KV bookkeeping: {0}")]
    Kv(#[from] KvError),
    #[error("backend returned {got}, expected {expected}")]
    BadOutput { got: String, expected: String },
    #[error("engine configuration: {0}")]
    Config(String),
    /// The step plan could not be sent to the other tensor-parallel ranks.
    #[error("tensor-parallel plan broadcast: {0}")]
    PlanBroadcast(String),
}

/// Receives every step plan before the step runs (tensor parallelism: rank 0 forwards each plan
/// to ranks 1..T-1). Called also for plans that compute nothing but free sequences.
pub trait PlanSink: Send {
    /// Sends `plan`; `scheduler` gives the scheduled sequences' tokens.
    fn send(&mut self, plan: &StepPlan, scheduler: &Scheduler) -> Result<(), EngineError>;
}

/// Continuous batching over one backend.
pub struct Engine {
    backend: Box<dyn Backend>,
    scheduler: Scheduler,
    vocab: usize,
    seed_base: u64,
    seeds_issued: u64,
    last_step: StepStats,
    last_plan: StepPlan,
    plan_sink: Option<Box<dyn PlanSink>>,
    constraints: Constraints,
    async_scheduling: bool,
    /// Steps launched on the device whose tokens are not applied yet, oldest first (at most
    /// two: async scheduling).
    in_flight: VecDeque<InFlight>,
    planned_ahead: u64,
}

/// A launched step: its plan and what it computes.
struct InFlight {
    plan: StepPlan,
    stats: StepStats,
}

/// A step's inputs gathered from the scheduler: tokens, positions, and each sequence's block
/// table. A token not known yet (a decode planned ahead of its draw) is a placeholder 0.
struct Gathered {
    token_ids: Vec<u32>,
    positions: Vec<u32>,
    tables: Vec<Vec<u32>>,
}

impl Engine {
    /// Sends every step's plan to `sink` before the step runs (see [`PlanSink`]).
    pub fn set_plan_sink(&mut self, sink: Box<dyn PlanSink>) {
        self.plan_sink = Some(sink);
    }

    /// An engine over `backend`, which holds `model`'s weights and the KV pool.
    pub fn new(
        backend: Box<dyn Backend>,
        model: &ModelConfig,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let block_size = backend.block_size();
        let num_kv_blocks = backend.num_kv_blocks();
        if block_size == 0 || num_kv_blocks < 2 {
            return Err(EngineError::Config(format!(
                "the backend has {num_kv_blocks} KV blocks of {block_size} tokens; need at least 2 blocks of 1"
            )));
        }
        if config.max_num_batched_tokens == 0
            || config.max_num_seqs == 0
            || config.max_prefill_tokens_while_decoding == Some(0)
        {
            return Err(EngineError::Config(
                "max_num_batched_tokens, max_num_seqs and max_prefill_tokens_while_decoding must \
                 be at least 1"
                    .into(),
            ));
        }
        let kv_capacity = (num_kv_blocks - 1) * block_size;
        let max_model_len = match config.max_model_len {
            Some(len) if len > kv_capacity => {
                return Err(EngineError::Config(format!(
                    "max_model_len {len} exceeds the KV cache's {kv_capacity} tokens ({} blocks of {block_size})",
                    num_kv_blocks - 1
                )));
            }
            Some(len) => len,
            None => model.max_position_embeddings.min(kv_capacity),
        };
        if max_model_len < 2 {
            return Err(EngineError::Config(format!(
                "max_model_len {max_model_len} leaves no room to generate"
            )));
        }
        let seed_base = config.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let scheduler = Scheduler::new(SchedulerConfig {
            max_num_batched_tokens: config.max_num_batched_tokens,
            max_prefill_tokens_while_decoding: config.max_prefill_tokens_while_decoding,
            max_num_seqs: config.max_num_seqs,
            max_model_len,
            num_kv_blocks,
            block_size,
            enable_prefix_caching: config.enable_prefix_caching,
            eos_token_ids: model.eos_token_ids.clone(),
        });
        Ok(Self {
            backend,
            scheduler,
            vocab: model.vocab_size,
            seed_base,
            seeds_issued: 0,
            last_step: StepStats::default(),
            last_plan: StepPlan::default(),
            plan_sink: None,
            constraints: Constraints::default(),
            async_scheduling: config.async_scheduling,
            in_flight: VecDeque::new(),
            planned_ahead: 0,
        })
    }

    /// Lets requests carry a structured-output grammar, compiled by `compiler` (built over the
    /// model's tokenizer). Without one, such requests are refused.
    pub fn set_grammar_compiler(&mut self, compiler: grammar::BackgroundCompiler) {
        self.constraints.set_compiler(compiler);
    }

    /// The context length limit in force.
    pub fn max_model_len(&self) -> usize {
        self.scheduler.config().max_model_len
    }

    /// The model's vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Validates and queues a request.
    pub fn add_request(&mut self, req: Request) -> Result<(), RequestError> {
        if self.scheduler.contains(req.id) {
            return Err(RequestError::DuplicateId(req.id.0));
        }
        if req.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(RequestError::ZeroMaxTokens);
        }
        let allowed = req.max_tokens.saturating_add(req.prior_output_len);
        if req.min_tokens > allowed {
            return Err(RequestError::MinTokensOverMax {
                min_tokens: req.min_tokens,
                allowed,
            });
        }
        if req.prior_output_len > req.prompt.len() {
            return Err(RequestError::BadPriorOutput {
                prior: req.prior_output_len,
                prompt_len: req.prompt.len(),
            });
        }
        let max_model_len = self.max_model_len();
        if req.prompt.len() >= max_model_len {
            return Err(RequestError::PromptTooLong {
                prompt_len: req.prompt.len(),
                max_model_len,
            });
        }
        if let Some((position, &token)) = req
            .prompt
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= self.vocab)
        {
            return Err(RequestError::TokenOutOfVocab {
                token,
                position,
                vocab: self.vocab,
            });
        }
        req.params.validate().map_err(RequestError::InvalidParams)?;
        if let Some(spec) = &req.grammar {
            let prior = &req.prompt[req.prompt.len() - req.prior_output_len..];
            self.constraints.add(req.id, spec, prior)?;
        }
        let seed = req.params.seed.unwrap_or_else(|| {
            self.seeds_issued += 1;
            mix64(self.seed_base ^ mix64(self.seeds_issued))
        });
        self.scheduler.add(req, seed);
        Ok(())
    }

    /// Drops a request and frees its KV blocks at once. Returns whether it was live.
    pub fn cancel(&mut self, id: SeqId) -> Result<bool, EngineError> {
        self.constraints.remove(id);
        Ok(self.scheduler.abort(id)?)
    }

    /// Whether any request is waiting or running, or a launched step is still to be collected.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.num_running() + self.scheduler.num_waiting() > 0
            || !self.in_flight.is_empty()
    }

    /// Current gauges.
    pub fn stats(&self) -> EngineStats {
        let pool = self.scheduler.kv().pool();
        let (queried, hit) = self.scheduler.kv().prefix_cache_stats();
        EngineStats {
            running: self.scheduler.num_running(),
            waiting: self.scheduler.num_waiting(),
            kv_blocks_used: pool.num_used(),
            kv_blocks_total: pool.num_usable(),
            preemptions: self.scheduler.num_preemptions(),
            prefix_queried_tokens: queried,
            prefix_hit_tokens: hit,
            planned_ahead: self.planned_ahead,
        }
    }

    /// What the last step computed.
    pub fn last_step(&self) -> StepStats {
        self.last_step
    }

    /// The plan the last [`Engine::step`] ran (what TP ranks would receive).
    pub fn last_plan(&self) -> &StepPlan {
        &self.last_plan
    }

    /// The scheduler (read-only; for tests and introspection).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Plans and runs one step; returns one event per sequence that produced a token.
    ///
    /// With async scheduling, a step is launched and, while the device runs it, the step after
    /// it is planned and launched too where it only decodes (its input tokens are this step's
    /// draws, taken on the device); then this step's tokens are applied and returned. The next
    /// call finds that step on the device and does the same with it. A step that cannot be
    /// planned ahead (prompt tokens to compute, a running sequence left out of the step before,
    /// blocks that run out, the host sampler) waits for the one before it, so its plan sees
    /// every token drawn and every request arrived so far. Every request's tokens and ending are
    /// those of the synchronous engine; a sequence that ends with a stop token computes one
    /// token more, dropped.
    pub fn step(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        if self.in_flight.is_empty() {
            let plan = self.scheduler.schedule()?;
            let stats = step_stats(&plan);
            if let Some(sink) = &mut self.plan_sink
                && !(plan.is_empty() && plan.finished.is_empty() && plan.preempted.is_empty())
            {
                sink.send(&plan, &self.scheduler)?;
            }
            if plan.is_empty() || !self.launch(&plan, stats, TokenFeed::Host)? {
                self.last_step = stats;
                let events = if plan.is_empty() {
                    Ok(Vec::new())
                } else {
                    self.execute(&plan)
                };
                self.last_plan = plan;
                return events;
            }
        }
        if self.in_flight.len() == 1
            && self.async_ok()
            && let Some(next) = self
                .in_flight
                .back()
                .and_then(|f| self.scheduler.plan_ahead(&f.plan))
        {
            let stats = step_stats(&next.plan);
            if self.launch(&next.plan, stats, TokenFeed::PreviousStep(&next.fed))? {
                self.planned_ahead += 1;
                if self.planned_ahead == 1 {
                    tracing::debug!(
                        backend = self.backend.name(),
                        "async scheduling: the first step planned ahead"
                    );
                }
            }
        }
        self.collect()
    }

    /// Whether steps may be launched ahead of their predecessors' tokens at all.
    fn async_ok(&self) -> bool {
        self.async_scheduling && self.plan_sink.is_none() && self.constraints.is_empty()
    }

    /// Launches `plan` without waiting for its tokens, where async scheduling allows it, every
    /// sampling row can be drawn on the device and the backend takes it; `Ok(false)`: nothing
    /// was launched. With [`TokenFeed::PreviousStep`], `plan` was planned ahead of the step
    /// still on the device, whose draws are its input tokens.
    fn launch(
        &mut self,
        plan: &StepPlan,
        mut stats: StepStats,
        feed: TokenFeed,
    ) -> Result<bool, EngineError> {
        if !self.async_ok() {
            return Ok(false);
        }
        // The first `fed` entries decode a token drawn by the step on the device (not applied
        // yet): their draw is one further down their stream.
        let fed = match feed {
            TokenFeed::Host => 0,
            TokenFeed::PreviousStep(rows) => rows.len(),
        };
        let mut sampling = Vec::new();
        for (i, entry) in plan.seqs.iter().enumerate().filter(|(_, e)| e.sample) {
            let pending = usize::from(i < fed);
            let seq = self
                .scheduler
                .seq(entry.seq)
                .ok_or(EngineError::Kv(KvError::UnknownSeq(entry.seq.0)))?;
            if seq.logprobs.is_some()
                || seq.params.has_penalties()
                || !seq.banned_after(pending).is_empty()
            {
                return Ok(false);
            }
            sampling.push(DeviceSampling {
                params: seq.params,
                seed: seq.seed,
                step: (seq.output().len() + pending) as u64,
            });
        }
        let g = self.gather(plan, fed)?;
        let seqs = seq_inputs(plan, &g.tables);
        let batch = ForwardBatch {
            token_ids: &g.token_ids,
            positions: &g.positions,
            seqs: &seqs,
        };
        let started = Instant::now();
        let launched = self.backend.launch_sampled(&batch, &sampling, feed)?;
        stats.backend_time += started.elapsed();
        if launched {
            self.in_flight.push_back(InFlight {
                plan: plan.clone(),
                stats,
            });
        } else if matches!(feed, TokenFeed::Host) {
            // The backend launches no step at all (no device sampling, a tensor-parallel rank):
            // stop gathering inputs twice a step.
            tracing::debug!(
                backend = self.backend.name(),
                "async scheduling off: the backend launches no steps"
            );
            self.async_scheduling = false;
        }
        Ok(launched)
    }

    /// Waits for the oldest launched step's tokens and applies them. Entries of sequences that
    /// ended or were cancelled while the step was on the device are dropped with their tokens.
    fn collect(&mut self) -> Result<Vec<TokenEvent>, EngineError> {
        let Some(InFlight { plan, mut stats }) = self.in_flight.pop_front() else {
            return Ok(Vec::new());
        };
        let started = Instant::now();
        let tokens = self.backend.collect_sampled()?;
        stats.backend_time += started.elapsed();
        self.last_step = stats;
        let rows = plan.seqs.iter().filter(|e| e.sample).count();
        check_tokens(&tokens, rows, self.vocab)?;
        let mut live = StepPlan::default();
        let mut kept = Vec::with_capacity(tokens.len());
        let mut drawn = tokens.iter();
        for entry in &plan.seqs {
            let token = if entry.sample { drawn.next() } else { None };
            let current = self
                .scheduler
                .seq(entry.seq)
                .is_some_and(|s| s.num_computed() == entry.num_computed);
            if current {
                live.seqs.push(entry.clone());
                kept.extend(token);
            }
        }
        let updates = self.scheduler.update(&live, &kept)?;
        self.last_plan = plan;
        Ok(updates
            .into_iter()
            .map(|u| TokenEvent {
                id: u.seq,
                token: u.token,
                logprobs: None,
                finish: u.finish,
            })
            .collect())
    }

    /// The token ids, positions and block tables of `plan`'s sequences. The first `fed` entries'
    /// token may be the one the step on the device draws (not applied yet): a placeholder 0.
    fn gather(&self, plan: &StepPlan, fed: usize) -> Result<Gathered, EngineError> {
        let num_tokens = plan.num_tokens();
        let mut token_ids = Vec::with_capacity(num_tokens);
        let mut positions = Vec::with_capacity(num_tokens);
        let mut tables: Vec<Vec<u32>> = Vec::with_capacity(plan.seqs.len());
        for (i, entry) in plan.seqs.iter().enumerate() {
            let seq = self
                .scheduler
                .seq(entry.seq)
                .ok_or(EngineError::Kv(KvError::UnknownSeq(entry.seq.0)))?;
            let range = entry.num_computed..entry.num_computed + entry.num_tokens;
            let known = seq.tokens().len();
            if range.end > known + usize::from(i < fed) {
                return Err(EngineError::BadOutput {
                    got: format!(
                        "a step of positions {range:?} for sequence {} of {known} tokens",
                        entry.seq.0
                    ),
                    expected: "positions of the sequence's tokens".into(),
                });
            }
            token_ids.extend(
                range
                    .clone()
                    .map(|p| seq.tokens().get(p).copied().unwrap_or(0)),
            );
            positions.extend(range.map(|p| p as u32));
            tables.push(
                self.scheduler
                    .kv()
                    .block_table(entry.seq)
                    .iter()
                    .map(|b| b.0)
                    .collect(),
            );
        }
        Ok(Gathered {
            token_ids,
            positions,
            tables,
        })
    }

    /// Runs `plan` and applies its sampled tokens.
    fn execute(&mut self, plan: &StepPlan) -> Result<Vec<TokenEvent>, EngineError> {
        let (tokens, logprobs) = self.run(plan)?;
        let mut updates = self.scheduler.update(plan, &tokens)?;
        if !self.constraints.is_empty() {
            for u in &mut updates {
                if !self.constraints.contains(u.seq) {
                    continue;
                }
                if u.finish.is_none() && self.constraints.accept(u.seq, u.token) {
                    u.finish = Some(FinishReason::Stop);
                    self.scheduler.abort(u.seq)?;
                }
                if u.finish.is_some() {
                    self.constraints.remove(u.seq);
                }
            }
        }
        let mut logprobs = logprobs.into_iter();
        Ok(updates
            .into_iter()
            .map(|u| TokenEvent {
                id: u.seq,
                token: u.token,
                logprobs: logprobs.next().flatten(),
                finish: u.finish,
            })
            .collect())
    }

    /// Runs the backend over `plan`; returns the sampled tokens and logprobs per sampling row.
    fn run(&mut self, plan: &StepPlan) -> Result<(Vec<u32>, Vec<Option<Logprobs>>), EngineError> {
        let g = self.gather(plan, 0)?;
        let mut rows = Vec::new();
        for entry in plan.seqs.iter().filter(|e| e.sample) {
            rows.push(
                self.scheduler
                    .seq(entry.seq)
                    .ok_or(EngineError::Kv(KvError::UnknownSeq(entry.seq.0)))?,
            );
        }
        let seqs = seq_inputs(plan, &g.tables);
        let batch = ForwardBatch {
            token_ids: &g.token_ids,
            positions: &g.positions,
            seqs: &seqs,
        };
        let device_ok = rows
            .iter()
            .all(|s| s.logprobs.is_none() && !s.params.has_penalties() && s.banned().is_empty());
        let constrained =
            !self.constraints.is_empty() && rows.iter().any(|s| self.constraints.contains(s.id));
        let ids: Vec<SeqId> = rows.iter().map(|s| s.id).collect();
        let eos = &self.scheduler.config().eos_token_ids;
        let (backend, constraints, vocab) = (&mut self.backend, &mut self.constraints, self.vocab);
        let mut backend_time = Duration::ZERO;
        let result = std::thread::scope(|scope| {
            // The grammars' masks for this step's draws, computed while the forward pass runs;
            // whichever sampler draws takes them (once: a backend that took them must draw).
            let job = std::cell::Cell::new(
                constrained.then(|| scope.spawn(|| constraints.masks(&ids, eos))),
            );
            let taken = std::cell::Cell::new(false);
            let mut take_masks = || -> Vec<Option<TokenMask>> {
                taken.set(true);
                match job.take() {
                    Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    None => vec![None; ids.len()],
                }
            };
            if device_ok {
                let sampling: Vec<DeviceSampling> = rows
                    .iter()
                    .map(|s| DeviceSampling {
                        params: s.params,
                        seed: s.seed,
                        step: s.output().len() as u64,
                    })
                    .collect();
                let started = Instant::now();
                let sampled = if constrained {
                    backend.forward_sampled_masked(&batch, &sampling, &mut take_masks)
                } else {
                    backend.forward_sampled(&batch, &sampling)
                };
                backend_time += started.elapsed();
                if let Some(tokens) = sampled? {
                    check_tokens(&tokens, rows.len(), vocab)?;
                    let none = vec![None; rows.len()];
                    return Ok((tokens, none));
                }
                if taken.get() {
                    return Err(EngineError::BadOutput {
                        got: "grammar masks taken, no tokens drawn".into(),
                        expected: "a backend that takes the masks draws the step".into(),
                    });
                }
            }
            let started = Instant::now();
            let logits = backend.forward(&batch);
            backend_time += started.elapsed();
            let logits = logits?;
            let masks = take_masks();
            host_sample(&rows, &logits, &masks, vocab)
        });
        self.last_step.backend_time += backend_time;
        result
    }
}

/// Draws every row of `logits` on the host (penalties, bans, grammar masks, logprobs).
fn host_sample(
    rows: &[&Sequence],
    logits: &crate::backend::Logits,
    masks: &[Option<TokenMask>],
    vocab: usize,
) -> Result<(Vec<u32>, Vec<Option<Logprobs>>), EngineError> {
    if logits.vocab != vocab
        || logits.rows() != rows.len()
        || logits.data.len() != rows.len() * vocab
    {
        return Err(EngineError::BadOutput {
            got: format!("{} logits with vocab {}", logits.data.len(), logits.vocab),
            expected: format!("{} rows of vocab {vocab}", rows.len()),
        });
    }
    let sample = |(i, s): (usize, &&Sequence)| {
        sample_row(
            logits.row(i),
            &SampleRequest {
                params: &s.params,
                seed: s.seed,
                output_index: s.output().len() as u64,
                history: History {
                    prompt: s.prompt(),
                    output: s.output(),
                },
                logprobs: s.logprobs,
                banned: s.banned(),
                allowed: masks[i].as_ref(),
            },
        )
    };
    // Rows are independent; spread big ones over the cores (each draw depends only on its row).
    let sampled: Vec<(u32, Option<Logprobs>)> = if rows.len() > 1 && rows.len() * vocab >= 1 << 16 {
        rows.par_iter().enumerate().map(sample).collect()
    } else {
        rows.iter().enumerate().map(sample).collect()
    };
    Ok(sampled.into_iter().unzip())
}

/// The backend's input of each of `plan`'s sequences, `tables` being their block tables.
fn seq_inputs<'a>(plan: &StepPlan, tables: &'a [Vec<u32>]) -> Vec<SeqInput<'a>> {
    let mut start = 0;
    plan.seqs
        .iter()
        .zip(tables)
        .map(|(entry, table)| {
            let input = SeqInput {
                query_start: start,
                query_len: entry.num_tokens,
                context_len: entry.num_computed + entry.num_tokens,
                block_table: table,
                sample: entry.sample,
            };
            start += entry.num_tokens;
            input
        })
        .collect()
}

/// A device's draws: one per sampling row, each in the vocabulary.
fn check_tokens(tokens: &[u32], rows: usize, vocab: usize) -> Result<(), EngineError> {
    if tokens.len() != rows {
        return Err(EngineError::BadOutput {
            got: format!("{} sampled tokens", tokens.len()),
            expected: format!("{rows}"),
        });
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::BadOutput {
            got: format!("sampled token {bad}"),
            expected: format!("ids below the vocabulary size {vocab}"),
        });
    }
    Ok(())
}

fn step_stats(plan: &StepPlan) -> StepStats {
    let decode_tokens = plan
        .seqs
        .iter()
        .filter(|s| s.sample && s.num_tokens == 1)
        .count();
    StepStats {
        prefill_tokens: plan.num_tokens() - decode_tokens,
        decode_tokens,
        num_seqs: plan.seqs.len(),
        backend_time: Duration::ZERO,
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "engine_async_tests.rs"]
mod async_tests;
