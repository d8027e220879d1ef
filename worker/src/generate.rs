//! Offline batch generation over JSONL: `ringserve generate --input IN.jsonl --output OUT.jsonl`.
//!
//! Each input line is one request: `{"prompt": "..."}` (needs `tokenizer.json`) or
//! `{"prompt_token_ids": [..]}`, plus optional `max_tokens` (default 16), `temperature` (default 1;
//! 0 is greedy), `top_p`, `top_k`, `min_p`, `seed`, `logprobs` (top-n per generated token),
//! `stop` (strings, matched on the decoded text, which is cut before them), `stop_token_ids`,
//! `min_tokens` (no EOS or stop id before that many output tokens), `ignore_eos`, and the penalties
//! `repetition_penalty`, `frequency_penalty`, `presence_penalty`, and `structured_outputs` (vLLM's:
//! exactly one of `json` (a JSON schema), `regex`, `choice` (a list of strings) or
//! `json_object: true`; needs `tokenizer.json`). An unknown field is an error naming it. Blank lines are ignored.
//!
//! Each output line, in input order: `{"token_ids": [..], "text": ".." (with a tokenizer),
//! "logprobs": [[{"token_id": n, "logprob": x}, ..], ..] (when asked; the raw distribution, highest
//! first), "finish_reason": "length" | "stop"}`.
//!
//! [`prepare`] reads and validates every line and queues the good ones in the engine (so a run that
//! must fail on a bad line fails before generating anything); [`run`] then drives the engine and
//! writes the results, each as soon as every line before it is written.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokenizers::Tokenizer;

use crate::engine::{Engine, EngineError};
use crate::kv::SeqId;
use crate::request::{FinishReason, Request};
use crate::sampler::SamplingParams;

/// `max_tokens` when a line does not say.
pub const DEFAULT_MAX_TOKENS: usize = 16;

/// One input line, exactly as the contract allows.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputLine {
    prompt: Option<String>,
    prompt_token_ids: Option<Vec<u32>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<u64>,
    logprobs: Option<usize>,
    stop: Option<Vec<String>>,
    stop_token_ids: Option<Vec<u32>>,
    min_tokens: Option<usize>,
    ignore_eos: Option<bool>,
    repetition_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    structured_outputs: Option<serde_json::Value>,
}

/// One candidate of an output line's `logprobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogprobEntry {
    pub token_id: u32,
    pub logprob: f32,
}

/// One output line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputLine {
    pub token_ids: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub logprobs: Option<Vec<Vec<LogprobEntry>>>,
    pub finish_reason: String,
}

/// A line that could not become a request.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("line {line}: {message}")]
pub struct LineError {
    /// 1-based line number in the input.
    pub line: usize,
    pub message: String,
}

/// What to do with a bad line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Report it and go on without it.
    #[default]
    Skip,
    /// Stop before generating anything.
    Fail,
}

/// Why a generation run stopped.
#[derive(Debug, Error)]
pub enum GenerateError {
    #[error(transparent)]
    BadLine(#[from] LineError),
    #[error("reading the input: {0}")]
    Read(std::io::Error),
    #[error("writing the output: {0}")]
    Write(std::io::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("decoding tokens: {0}")]
    Decode(String),
}

/// A queued line: where its output goes and what to do with it.
#[derive(Debug)]
struct Pending {
    id: SeqId,
    stop: Vec<String>,
    logprobs: bool,
}

/// The good lines of an input, queued in the engine.
#[derive(Debug, Default)]
pub struct Prepared {
    pending: Vec<Pending>,
    /// Prompt tokens over all queued requests.
    pub prompt_tokens: usize,
    /// Lines that were skipped.
    pub skipped: Vec<LineError>,
}

impl Prepared {
    /// Requests queued.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// No request queued.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Reads every line of `input`, queueing good ones in `engine` (request ids are 0, 1, 2, ...).
/// With [`OnError::Fail`] the first bad line is the error; with [`OnError::Skip`] bad lines are
/// collected in [`Prepared::skipped`].
pub fn prepare(
    engine: &mut Engine,
    tokenizer: Option<&Tokenizer>,
    input: impl BufRead,
    on_error: OnError,
) -> Result<Prepared, GenerateError> {
    let mut prepared = Prepared::default();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(GenerateError::Read)?;
        if line.trim().is_empty() {
            continue;
        }
        let id = SeqId(prepared.pending.len() as u64);
        let result = parse_line(&line, id, tokenizer).and_then(|(req, pending)| {
            let n = req.prompt.len();
            engine.add_request(req).map_err(|e| e.to_string())?;
            Ok((n, pending))
        });
        match result {
            Ok((n, pending)) => {
                prepared.prompt_tokens += n;
                prepared.pending.push(pending);
            }
            Err(message) => {
                let err = LineError {
                    line: i + 1,
                    message,
                };
                match on_error {
                    OnError::Fail => return Err(err.into()),
                    OnError::Skip => prepared.skipped.push(err),
                }
            }
        }
    }
    Ok(prepared)
}

/// Parses one line; an error names the offending field.
fn parse_input(line: &str) -> Result<InputLine, String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| {
        // serde_json's message ends in "at line 1 column N": the line is the input's, not the JSON's.
        let msg = e.to_string();
        match msg.rsplit_once(" at line ") {
            Some((head, _)) => format!("invalid JSON: {head} (column {})", e.column()),
            None => format!("invalid JSON: {msg}"),
        }
    })?;
    let serde_json::Value::Object(map) = &value else {
        return Err("expected a JSON object".into());
    };
    InputLine::deserialize(&value).map_err(|whole| {
        // Find the field at fault by reading each one alone (every field is optional).
        for (key, v) in map {
            let one = serde_json::Value::Object([(key.clone(), v.clone())].into_iter().collect());
            if let Err(e) = InputLine::deserialize(&one) {
                let msg = e.to_string();
                return if msg.starts_with("unknown field") {
                    msg
                } else {
                    format!("field `{key}`: {msg}")
                };
            }
        }
        whole.to_string()
    })
}

fn parse_line(
    line: &str,
    id: SeqId,
    tokenizer: Option<&Tokenizer>,
) -> Result<(Request, Pending), String> {
    let input = parse_input(line)?;
    let prompt = match (input.prompt, input.prompt_token_ids) {
        (Some(_), Some(_)) => {
            return Err("give either `prompt` or `prompt_token_ids`, not both".into());
        }
        (None, None) => return Err("missing `prompt` or `prompt_token_ids`".into()),
        (None, Some(ids)) => ids,
        (Some(text), None) => {
            let tok = tokenizer.ok_or(
                "a text `prompt` needs the model's tokenizer.json (or use `prompt_token_ids`)",
            )?;
            tok.encode(text.as_str(), true)
                .map_err(|e| format!("tokenizing the prompt: {e}"))?
                .get_ids()
                .to_vec()
        }
    };
    let stop = input.stop.unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err("`stop` strings must not be empty".into());
    }
    if !stop.is_empty() && tokenizer.is_none() {
        return Err("`stop` strings need the model's tokenizer.json".into());
    }
    let top_k = match input.top_k {
        None | Some(-1) => 0,
        Some(k) => u32::try_from(k).map_err(|_| format!("top_k must be -1 or >= 0, got {k}"))?,
    };
    let defaults = SamplingParams::default();
    let params = SamplingParams {
        temperature: input.temperature.unwrap_or(defaults.temperature),
        top_k,
        top_p: input.top_p.unwrap_or(defaults.top_p),
        min_p: input.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: input
            .repetition_penalty
            .unwrap_or(defaults.repetition_penalty),
        frequency_penalty: input
            .frequency_penalty
            .unwrap_or(defaults.frequency_penalty),
        presence_penalty: input.presence_penalty.unwrap_or(defaults.presence_penalty),
        seed: input.seed,
    };
    let req = Request {
        id,
        prompt,
        params,
        max_tokens: input.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        stop_token_ids: input.stop_token_ids.unwrap_or_default(),
        min_tokens: input.min_tokens.unwrap_or(0),
        ignore_eos: input.ignore_eos.unwrap_or(false),
        logprobs: input.logprobs,
        prior_output_len: 0,
        grammar: input
            .structured_outputs
            .as_ref()
            .map(grammar::GrammarSpec::from_structured_outputs)
            .transpose()?,
    };
    let pending = Pending {
        id,
        stop,
        logprobs: input.logprobs.is_some(),
    };
    Ok((req, pending))
}

/// Totals of a run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    pub requests: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
}

impl Summary {
    /// Generated tokens per second.
    pub fn tokens_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.generated_tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} requests, {} prompt tokens, {} generated tokens in {:.2} s: {:.1} tokens/s",
            self.requests,
            self.prompt_tokens,
            self.generated_tokens,
            self.seconds,
            self.tokens_per_second()
        )
    }
}

#[derive(Debug, Default)]
struct Progress {
    ids: Vec<u32>,
    logprobs: Vec<Vec<LogprobEntry>>,
    /// Text cut before a stop string, once one matched.
    text: Option<String>,
    done: Option<FinishReason>,
}

/// Runs the queued requests to completion, writing one line per request in input order.
/// `progress` shows a bar on stderr (hidden when stderr is not a terminal).
pub fn run(
    engine: &mut Engine,
    tokenizer: Option<&Tokenizer>,
    prepared: &Prepared,
    output: &mut dyn Write,
    progress: bool,
) -> Result<Summary, GenerateError> {
    let start = Instant::now();
    let bar = if progress {
        indicatif::ProgressBar::new(prepared.len() as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} requests, {msg} [{elapsed_precise}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let index: HashMap<SeqId, usize> = prepared
        .pending
        .iter()
        .enumerate()
        .map(|(i, p)| (p.id, i))
        .collect();
    let mut state: Vec<Progress> = prepared
        .pending
        .iter()
        .map(|_| Progress::default())
        .collect();
    let mut next_to_write = 0;
    let mut generated = 0;
    while engine.has_unfinished() {
        let step_start = Instant::now();
        let events = engine.step()?;
        let st = engine.last_step();
        tracing::debug!(
            prefill_tokens = st.prefill_tokens,
            decode_tokens = st.decode_tokens,
            seqs = st.num_seqs,
            backend_ms = st.backend_time.as_secs_f64() * 1e3,
            step_ms = step_start.elapsed().as_secs_f64() * 1e3,
            "step"
        );
        for ev in events {
            let Some(&i) = index.get(&ev.id) else {
                continue;
            };
            let (p, s) = (&prepared.pending[i], &mut state[i]);
            generated += 1;
            s.ids.push(ev.token);
            if let Some(lp) = ev.logprobs {
                s.logprobs.push(
                    lp.top
                        .iter()
                        .map(|t| LogprobEntry {
                            token_id: t.token,
                            logprob: t.logprob,
                        })
                        .collect(),
                );
            }
            s.done = ev.finish;
            if let (Some(tok), false) = (tokenizer, p.stop.is_empty()) {
                let text = decode(tok, &s.ids)?;
                if let Some(cut) = p
                    .stop
                    .iter()
                    .filter_map(|stop| text.find(stop.as_str()))
                    .min()
                {
                    s.text = Some(text[..cut].to_owned());
                    s.done = Some(FinishReason::Stop);
                    engine.cancel(ev.id)?;
                }
            }
            if s.done.is_some() {
                bar.inc(1);
            }
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{generated} tokens, {:.0} tokens/s",
            generated as f64 / secs
        ));
        while next_to_write < state.len() && state[next_to_write].done.is_some() {
            let line = finish_line(
                tokenizer,
                &prepared.pending[next_to_write],
                &mut state[next_to_write],
            )?;
            write_line(output, &line)?;
            next_to_write += 1;
        }
    }
    bar.finish_and_clear();
    if next_to_write < state.len() {
        return Err(GenerateError::Decode(format!(
            "request {next_to_write} ended without a finish reason (cancelled outside the run?)"
        )));
    }
    output.flush().map_err(GenerateError::Write)?;
    Ok(Summary {
        requests: prepared.len(),
        prompt_tokens: prepared.prompt_tokens,
        generated_tokens: generated,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn decode(tok: &Tokenizer, ids: &[u32]) -> Result<String, GenerateError> {
    tok.decode(ids, true)
        .map_err(|e| GenerateError::Decode(e.to_string()))
}

fn finish_line(
    tokenizer: Option<&Tokenizer>,
    p: &Pending,
    s: &mut Progress,
) -> Result<OutputLine, GenerateError> {
    let text = match (tokenizer, s.text.take()) {
        (_, Some(cut)) => Some(cut),
        (Some(tok), None) => Some(decode(tok, &s.ids)?),
        (None, None) => None,
    };
    Ok(OutputLine {
        token_ids: std::mem::take(&mut s.ids),
        text,
        logprobs: p.logprobs.then(|| std::mem::take(&mut s.logprobs)),
        finish_reason: s.done.unwrap_or(FinishReason::Length).as_str().to_owned(),
    })
}

fn write_line(output: &mut dyn Write, line: &OutputLine) -> Result<(), GenerateError> {
    let json = serde_json::to_string(line).map_err(|e| GenerateError::Write(e.into()))?;
    writeln!(output, "{json}").map_err(GenerateError::Write)
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
