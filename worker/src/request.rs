//! What a client asks the engine for, and how a sequence ends.

use grammar::{GrammarError, GrammarSpec};
use thiserror::Error;

use crate::kv::SeqId;
use crate::sampler::SamplingParams;

/// A generation request, as handed to [`crate::engine::Engine::add_request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Unique among the engine's live requests (the gateway's request id).
    pub id: SeqId,
    /// Prompt token ids (for a resumed request, followed by the tokens it already generated).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Tokens to generate at most (for a resumed request: the tokens still allowed).
    pub max_tokens: usize,
    /// Generating any of these ends the request with [`FinishReason::Stop`].
    pub stop_token_ids: Vec<u32>,
    /// Output tokens (a resumed request's earlier output included) before which neither the
    /// end-of-sequence tokens nor `stop_token_ids` may be sampled (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// Keep going past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Return the top-n logprobs of the raw distribution for each generated token.
    pub logprobs: Option<usize>,
    /// A resumed request: the last `prior_output_len` tokens of `prompt` are its own earlier output.
    /// They count as output for the frequency / presence penalties, and the random stream continues at
    /// output index `prior_output_len`, so the request continues exactly as it would have.
    pub prior_output_len: usize,
    /// Structured output: the output must match this grammar (it ends when the grammar is complete).
    pub grammar: Option<GrammarSpec>,
}

impl Request {
    /// A request with default sampling (temperature 1), no stops, no logprobs.
    pub fn new(id: SeqId, prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            id,
            prompt,
            params: SamplingParams::default(),
            max_tokens,
            stop_token_ids: Vec::new(),
            min_tokens: 0,
            ignore_eos: false,
            logprobs: None,
            prior_output_len: 0,
            grammar: None,
        }
    }
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// `max_tokens` generated, or the model's context is full.
    Length,
    /// An end-of-sequence token or a stop token was generated (it is the last token).
    Stop,
}

impl FinishReason {
    /// The OpenAI / vLLM name: `length` or `stop`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Stop => "stop",
        }
    }
}

/// A request the engine refuses; the engine itself is fine.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RequestError {
    #[error("request {0} is already running")]
    DuplicateId(u64),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("min_tokens {min_tokens} is more than the {allowed} output tokens max_tokens allows")]
    MinTokensOverMax { min_tokens: usize, allowed: usize },
    #[error("prompt token {token} at position {position} is outside the vocabulary (size {vocab})")]
    TokenOutOfVocab {
        token: u32,
        position: usize,
        vocab: usize,
    },
    #[error(
        "prompt has {prompt_len} tokens; the maximum context is {max_model_len} (one must be left to generate)"
    )]
    PromptTooLong {
        prompt_len: usize,
        max_model_len: usize,
    },
    #[error("prior_output_len {prior} exceeds the prompt length {prompt_len}")]
    BadPriorOutput { prior: usize, prompt_len: usize },
    #[error("invalid sampling parameters: {0}")]
    InvalidParams(String),
    #[error("structured output needs the model's tokenizer.json, and this model has none")]
    NoGrammarSupport,
    #[error("grammar: {0}")]
    Grammar(#[from] GrammarError),
}
