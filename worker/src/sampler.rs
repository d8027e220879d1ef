//! The host sampler: penalties, temperature, top-k / top-p / min-p, a per-request random stream, and
//! top-n logprobs of the raw model distribution.
//!
//! Order of operations (as HuggingFace's logits processors and vLLM apply them): repetition penalty
//! (HF semantics: a seen token's positive logit is divided by the penalty, a negative one multiplied),
//! frequency and presence penalties (OpenAI semantics, over output tokens), then temperature, top-k,
//! top-p and min-p, each filter renormalizing what the previous one kept. Temperature 0 is greedy.
//!
//! Randomness is counter-based: the draw for a request's `i`-th output token is a pure function of
//! `(seed, i)` ([`uniform`]), so a request's tokens never depend on what it was batched with, and a
//! request resumed elsewhere continues its random stream from the right index.

use std::collections::HashMap;

use grammar::TokenMask;
use protos::records::SamplingWire;

use crate::kv::block_hash_mix as mix64;

/// Temperatures at or below this are treated as greedy.
const GREEDY_EPS: f32 = 1e-5;

/// How to pick the next token. `Default` is vLLM's: temperature 1, no filters, no penalties.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 means all.
    pub top_k: u32,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (in `(0, 1]`).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (in `[0, 1]`).
    pub min_p: f32,
    /// HF repetition penalty over prompt and output tokens; 1 means none.
    pub repetition_penalty: f32,
    /// Subtracted once per earlier occurrence in the output.
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurred in the output.
    pub presence_penalty: f32,
    /// Seed of the request's random stream (the engine picks one when `None`).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            ..Self::GREEDY
        }
    }
}

/// A Submit record's settings (the gateway always picks the seed), converted once as the request
/// enters the engine.
impl From<SamplingWire> for SamplingParams {
    fn from(w: SamplingWire) -> Self {
        Self {
            temperature: w.temperature,
            top_k: w.top_k,
            top_p: w.top_p,
            min_p: w.min_p,
            repetition_penalty: w.repetition_penalty,
            frequency_penalty: w.frequency_penalty,
            presence_penalty: w.presence_penalty,
            seed: Some(w.seed),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding, no filters, no penalties.
    pub const GREEDY: Self = Self {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed: None,
    };

    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::GREEDY
    }

    /// Whether this picks the arg-max.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= GREEDY_EPS
    }

    /// Whether any penalty applies (these need the token history, so only the host applies them).
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }

    /// Checks ranges; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |name: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be finite, got {v}"))
            }
        };
        finite("temperature", self.temperature)?;
        finite("top_p", self.top_p)?;
        finite("min_p", self.min_p)?;
        finite("repetition_penalty", self.repetition_penalty)?;
        finite("frequency_penalty", self.frequency_penalty)?;
        finite("presence_penalty", self.presence_penalty)?;
        if self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(format!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency_penalty
            ));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(format!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence_penalty
            ));
        }
        Ok(())
    }
}

/// The uniform draw in `[0, 1)` for output token `index` of a request seeded with `seed`.
///
/// `u = (mix64(seed ^ mix64(index + 1)) >> 40) / 2^24`, with SplitMix64's finalizer as `mix64`. The
/// CUDA sampler (`kernels/src/sampling.cu`) uses the same formula and also walks the kept tokens in
/// vocabulary order, so a seeded request picks the same tokens on either (up to a draw landing
/// within f32 rounding of a CDF boundary).
pub fn uniform(seed: u64, index: u64) -> f32 {
    let bits = mix64(seed ^ mix64(index.wrapping_add(1)));
    (bits >> 40) as f32 / (1u64 << 24) as f32
}

/// One token and its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
}

/// Log-probabilities of the raw model distribution at one generated position.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The sampled token's.
    pub sampled: TokenLogprob,
    /// The `n` most likely tokens, highest first (ties: lower id first).
    pub top: Vec<TokenLogprob>,
}

/// `log_softmax(logits)[token]` and the top `n`, of the unmodified logits.
pub fn raw_logprobs(logits: &[f32], token: u32, n: usize) -> Logprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_z = max + sum.ln() as f32;
    let lp = |t: u32| {
        logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - log_z)
    };
    let order = top_n(logits, n);
    Logprobs {
        sampled: TokenLogprob {
            token,
            logprob: lp(token),
        },
        top: order
            .into_iter()
            .map(|t| TokenLogprob {
                token: t,
                logprob: lp(t),
            })
            .collect(),
    }
}

/// The token history a request's penalties look at.
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// Prompt tokens (for a resumed request: the original prompt only).
    pub prompt: &'a [u32],
    /// Output tokens so far (for a resumed request: including those generated before).
    pub output: &'a [u32],
}

/// Applies repetition, frequency and presence penalties to `logits` in place.
pub fn apply_penalties(logits: &mut [f32], params: &SamplingParams, history: History<'_>) {
    if params.repetition_penalty != 1.0 {
        let p = params.repetition_penalty;
        let mut seen = vec![false; logits.len()];
        for &t in history.prompt.iter().chain(history.output) {
            if let Some(s) = seen.get_mut(t as usize) {
                *s = true;
            }
        }
        for (l, _) in logits.iter_mut().zip(&seen).filter(|(_, s)| **s) {
            *l = if *l > 0.0 { *l / p } else { *l * p };
        }
    }
    if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in history.output {
            *counts.entry(t).or_default() += 1;
        }
        for (t, c) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= c as f32 * params.frequency_penalty + params.presence_penalty;
            }
        }
    }
}

/// Index of the largest logit (lowest index on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    // Two simple passes vectorize better than one with a NaN-aware branch; `f32::max` skips NaN.
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&l| l == max).unwrap_or(0) as u32
}

/// The `n` largest logits' ids, highest first (ties: lower id first), in one pass.
fn top_n(logits: &[f32], n: usize) -> Vec<u32> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let better = |a: u32, b: u32| {
        logits[a as usize]
            .total_cmp(&logits[b as usize])
            .then(b.cmp(&a))
            .is_gt()
    };
    // Kept sorted, best first; most tokens fail the comparison with the last one and cost nothing.
    let mut top: Vec<u32> = Vec::with_capacity(n + 1);
    for t in 0..logits.len() as u32 {
        if top.len() == n && !better(t, top[n - 1]) {
            continue;
        }
        let at = top.partition_point(|&k| better(k, t));
        top.insert(at, t);
        top.truncate(n);
    }
    top
}

/// The tokens that may be sampled after temperature, top-k, top-p and min-p, with their renormalized
/// probabilities, most likely first. `logits` must already carry the penalties. Never empty for a
/// non-empty row. For greedy params: the arg-max alone, with probability 1.
pub fn candidates(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    filtered(logits, params, true)
}

/// How many of the most likely tokens are sorted first when looking for the top-p cut; only if they
/// do not reach `top_p` is the whole row sorted.
const TOP_P_HEAD: usize = 1024;

/// [`candidates`], sorted only when `sorted` (or when top-p needs it): sampling does not care about
/// order, and sorting a 128k-token row per step would dominate the host sampler.
fn filtered(logits: &[f32], params: &SamplingParams, sorted: bool) -> Vec<(u32, f32)> {
    if logits.is_empty() {
        return Vec::new();
    }
    if params.is_greedy() {
        return vec![(argmax(logits), 1.0)];
    }
    let mut order: Vec<u32> = (0..logits.len() as u32)
        .filter(|&t| !logits[t as usize].is_nan())
        .collect();
    if order.is_empty() {
        return vec![(0, 1.0)];
    }
    let by_desc = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = match params.top_k as usize {
        0 => order.len(),
        k => k.min(order.len()),
    };
    if k < order.len() {
        order.select_nth_unstable_by(k - 1, by_desc);
        order.truncate(k);
    }
    // Weights relative to the most likely token (which has weight 1); `z` normalizes the top-k set.
    let inv_t = f64::from(1.0 / params.temperature);
    let max = order
        .iter()
        .map(|&t| logits[t as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    // One exp per token: weights are looked up from here on.
    let inv_t = inv_t as f32;
    let mut weights = vec![0f32; logits.len()];
    for &t in &order {
        weights[t as usize] = ((logits[t as usize] - max) * inv_t).exp();
    }
    let weight = |t: u32| f64::from(weights[t as usize]);
    let z: f64 = order.iter().map(|&t| weight(t)).sum();
    // min-p keeps a prefix of the sorted order: p / p_max = weight, whatever the normalization.
    if params.min_p > 0.0 {
        let min_p = f64::from(params.min_p);
        order.retain(|&t| weight(t) >= min_p);
    }
    if params.top_p < 1.0 {
        let top_p = f64::from(params.top_p) * z;
        let cut = |order: &[u32]| {
            let mut cum = 0.0;
            order.iter().position(|&t| {
                cum += weight(t);
                cum >= top_p
            })
        };
        // Sort a head of the most likely tokens; grow it until it reaches the top-p mass.
        let mut head = TOP_P_HEAD;
        let keep = loop {
            let h = head.min(order.len());
            if h < order.len() {
                order.select_nth_unstable_by(h - 1, by_desc);
            }
            order[..h].sort_by(by_desc);
            if let Some(i) = cut(&order[..h]) {
                break i + 1;
            }
            if h == order.len() {
                break h;
            }
            head *= 4;
        };
        order.truncate(keep);
    } else if sorted {
        order.sort_by(by_desc);
    }
    let kept: f64 = order.iter().map(|&t| weight(t)).sum();
    order
        .into_iter()
        .map(|t| (t, (weight(t) / kept) as f32))
        .collect()
}

/// Samples a token from `logits` (penalties already applied) with the draw `u` in `[0, 1)`.
pub fn sample_with(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    if params.is_greedy() {
        return argmax(logits);
    }
    if params.top_k == 0 && params.top_p >= 1.0 {
        return sample_unsorted(logits, params, u);
    }
    let mut cands = filtered(logits, params, false);
    // The inverse CDF walks the kept tokens in vocabulary order, as the device sampler does, so
    // both pick the same token for the same draw.
    cands.sort_unstable_by_key(|&(t, _)| t);
    let mut cum = 0.0f64;
    let u = f64::from(u);
    for &(t, p) in &cands {
        cum += f64::from(p);
        if u < cum {
            return t;
        }
    }
    cands.last().map_or(0, |&(t, _)| t)
}

/// Temperature and min-p only: no order needed, so no candidate list — weights in one pass, then
/// the inverse CDF in token order.
fn sample_unsorted(logits: &[f32], params: &SamplingParams, u: f32) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let inv_t = 1.0 / params.temperature;
    let min_p = params.min_p;
    let weight = |l: f32| {
        let w = ((l - max) * inv_t).exp();
        // NaN logits give NaN weights, which this also drops.
        if w >= min_p { w } else { 0.0 }
    };
    let z: f64 = logits.iter().map(|&l| f64::from(weight(l))).sum();
    let target = f64::from(u) * z;
    let mut cum = 0.0f64;
    let mut last = argmax(logits);
    for (t, &l) in logits.iter().enumerate() {
        let w = weight(l);
        if w > 0.0 {
            cum += f64::from(w);
            last = t as u32;
            if target < cum {
                return last;
            }
        }
    }
    last
}

/// What the sampler needs to know about one row.
#[derive(Debug, Clone, Copy)]
pub struct SampleRequest<'a> {
    pub params: &'a SamplingParams,
    /// The request's seed (resolved: never `None` here).
    pub seed: u64,
    /// Index of the token being sampled in the request's output.
    pub output_index: u64,
    pub history: History<'a>,
    /// Top-n logprobs wanted (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// Tokens this draw may not pick (`min_tokens`: EOS and stop ids); the logprobs stay those of
    /// the raw distribution.
    pub banned: &'a [u32],
    /// Structured output: only these tokens may be drawn (the logprobs stay raw). Where the mask
    /// and `banned` together leave nothing, the mask wins.
    pub allowed: Option<&'a TokenMask>,
}

/// Samples one row of raw logits: penalties, filters, the request's draw, and raw logprobs if asked.
pub fn sample_row(raw: &[f32], req: &SampleRequest<'_>) -> (u32, Option<Logprobs>) {
    let token = if req.params.has_penalties() || !req.banned.is_empty() || req.allowed.is_some() {
        let mut logits = raw.to_vec();
        apply_penalties(&mut logits, req.params, req.history);
        if let Some(mask) = req.allowed {
            for (t, l) in logits.iter_mut().enumerate() {
                if !mask.allows(t as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let before_ban = (req.allowed.is_some() && !req.banned.is_empty()).then(|| logits.clone());
        for &t in req.banned {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if let Some(masked) = before_ban
            && logits.iter().all(|l| *l == f32::NEG_INFINITY)
        {
            logits = masked;
        }
        pick(&logits, req)
    } else {
        pick(raw, req)
    };
    (token, req.logprobs.map(|n| raw_logprobs(raw, token, n)))
}

fn pick(logits: &[f32], req: &SampleRequest<'_>) -> u32 {
    if req.params.is_greedy() {
        argmax(logits)
    } else {
        sample_with(logits, req.params, uniform(req.seed, req.output_index))
    }
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
