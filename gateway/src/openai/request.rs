//! The OpenAI request bodies and their translation into the pipeline's [`GenerateRequest`].
//!
//! Only what is OpenAI-specific is checked here (the shape of `prompt` and `messages`, fields
//! ringserve does not implement); every bound on a value — temperatures, stop strings, `n`,
//! logprobs, the context length — is checked by [`crate::validate`], the same code the gRPC API
//! runs, and its field names are translated back by [`openai_param`].

use grammar::GrammarSpec;
use protos::v1::{
    ChatMessage, ChatMessages, GenerateRequest, SamplingParams, StructuredOutput, TokenIds,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage of the whole request.
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// vLLM's: every chunk carries its choice's usage so far.
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// The fields `/v1/completions` and `/v1/chat/completions` share (OpenAI's and vLLM's extras).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Accepted and logged (OpenAI's end-user id).
    pub user: Option<String>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub skip_special_tokens: Option<bool>,
    pub min_tokens: Option<u32>,
    pub response_format: Option<Value>,
    /// vLLM's: exactly one of `json`, `regex`, `choice`, `json_object`.
    pub structured_outputs: Option<Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    pub max_tokens: Option<u32>,
    pub logprobs: Option<u32>,
    pub echo: Option<bool>,
    pub best_of: Option<u32>,
    pub suffix: Option<String>,
    /// Read from the same body by [`parse`].
    #[serde(skip)]
    pub common: CommonParams,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// Read from the same body by [`parse`].
    #[serde(skip)]
    pub common: CommonParams,
}

/// A request body with the fields both generation APIs share.
pub trait WithCommon {
    fn set_common(&mut self, common: CommonParams);
}

impl WithCommon for CompletionRequest {
    fn set_common(&mut self, common: CommonParams) {
        self.common = common;
    }
}

impl WithCommon for ChatRequest {
    fn set_common(&mut self, common: CommonParams) {
        self.common = common;
    }
}

fn path_error<E: std::fmt::Display>(e: serde_path_to_error::Error<E>) -> ApiError {
    let path = e.path().to_string();
    let inner = e.into_inner();
    if path.is_empty() || path == "." {
        ApiError::bad_body(format!("the body is not a valid request: {inner}"))
    } else {
        ApiError::invalid(path, inner)
    }
}

/// Parses a JSON body; an error names the field at fault.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(path_error)
}

/// Parses a generation request's body: its own fields and the shared ones, each error naming
/// the field at fault (serde's `flatten` would lose the name).
pub fn parse_generation<T: DeserializeOwned + WithCommon>(body: &[u8]) -> Result<T, ApiError> {
    let value: Value = parse(body)?;
    if !value.is_object() {
        return Err(ApiError::bad_body("the body is not a JSON object"));
    }
    let mut request: T = serde_path_to_error::deserialize(&value).map_err(path_error)?;
    request.set_common(serde_path_to_error::deserialize(&value).map_err(path_error)?);
    Ok(request)
}

/// Completions `max_tokens` when absent (OpenAI's and vLLM's default).
pub const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

/// A completions `prompt`: one or more prompts, each text or token ids.
pub fn completion_prompts(prompt: &Value) -> Result<Vec<Prompt>, ApiError> {
    const SHAPE: &str = "must be a string, a list of strings, a list of token ids, or a list of \
                         lists of token ids";
    let ids = |v: &Vec<Value>, field: &str| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| ApiError::invalid(format!("{field}[{i}]"), "not a token id"))
            })
            .collect()
    };
    match prompt {
        Value::String(s) => Ok(vec![Prompt::Text(s.clone())]),
        Value::Array(items) if items.is_empty() => Err(ApiError::invalid("prompt", "empty")),
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(Prompt::Text(s.clone())),
                    _ => Err(ApiError::invalid(format!("prompt[{i}]"), "not a string")),
                })
                .collect(),
            Value::Number(_) => Ok(vec![Prompt::Ids(ids(items, "prompt")?)]),
            Value::Array(_) => items
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::Array(v) => Ok(Prompt::Ids(ids(v, &format!("prompt[{i}]"))?)),
                    _ => Err(ApiError::invalid(
                        format!("prompt[{i}]"),
                        "not a list of token ids",
                    )),
                })
                .collect(),
            _ => Err(ApiError::invalid("prompt", SHAPE)),
        },
        _ => Err(ApiError::invalid("prompt", SHAPE)),
    }
}

/// One prompt of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

impl Prompt {
    fn into_proto(self) -> protos::v1::generate_request::Prompt {
        use protos::v1::generate_request::Prompt as P;
        match self {
            Prompt::Text(t) => P::Text(t),
            Prompt::Ids(ids) => P::TokenIds(TokenIds { ids }),
        }
    }
}

/// Chat `messages`: each `{role, content}` with content a string, a list of text parts, or null.
pub fn chat_messages(messages: &[Value]) -> Result<ChatMessages, ApiError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let field = format!("messages[{i}]");
        let obj = m
            .as_object()
            .ok_or_else(|| ApiError::invalid(&field, "not an object"))?;
        let role = match obj.get("role") {
            Some(Value::String(r)) => r.clone(),
            _ => return Err(ApiError::invalid(format!("{field}.role"), "missing")),
        };
        if obj.get("tool_calls").is_some_and(|t| !t.is_null()) {
            return Err(ApiError::invalid(
                format!("{field}.tool_calls"),
                "tool calls are not supported",
            ));
        }
        let content = match obj.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    let pf = format!("{field}.content[{j}]");
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => match part.get("text") {
                            Some(Value::String(t)) => text.push_str(t),
                            _ => return Err(ApiError::invalid(format!("{pf}.text"), "missing")),
                        },
                        Some(other) => {
                            return Err(ApiError::invalid(
                                format!("{pf}.type"),
                                format!("{other:?} parts are not supported (only \"text\")"),
                            ));
                        }
                        None => return Err(ApiError::invalid(format!("{pf}.type"), "missing")),
                    }
                }
                text
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{field}.content"),
                    "must be a string or a list of text parts",
                ));
            }
        };
        out.push(ChatMessage { role, content });
    }
    Ok(ChatMessages { messages: out })
}

/// What the adapter needs to know about a request beyond its [`GenerateRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub stream: bool,
    pub include_usage: bool,
    /// Every chunk carries its choice's usage so far (vLLM's `continuous_usage_stats`).
    pub continuous_usage: bool,
    /// Top logprobs the client asked for (`None`: no logprobs at all).
    pub logprobs: Option<u32>,
    pub n: u32,
}

/// Checks the fields ringserve does not implement and builds the request every prompt shares
/// (its `prompt` is set per prompt by [`with_prompt`]).
pub fn generate_request(
    c: &CommonParams,
    max_tokens: Option<u32>,
    logprobs: Option<u32>,
    request_id: String,
) -> Result<(GenerateRequest, Shape), ApiError> {
    if c.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
        return Err(ApiError::invalid("logit_bias", "not supported"));
    }
    let structured_output = structured_output(c)?;
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "only allowed with \"stream\": true",
        ));
    }
    let n = c.n.unwrap_or(1);
    if n == 0 {
        return Err(ApiError::invalid("n", "must be at least 1"));
    }
    // vLLM's top_k: -1 (or 0) means no limit.
    let top_k = match c.top_k {
        None | Some(-1) => 0,
        Some(k) => i32::try_from(k)
            .map_err(|_| ApiError::invalid("top_k", format!("{k} is out of range")))?,
    };
    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if let Some(user) = &c.user {
        tracing::debug!(request_id, user, "request from user");
    }
    let request = GenerateRequest {
        request_id,
        prompt: None,
        sampling: Some(SamplingParams {
            temperature: c.temperature,
            top_p: c.top_p,
            top_k,
            min_p: c.min_p.unwrap_or(0.0),
            repetition_penalty: c.repetition_penalty,
            frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
            presence_penalty: c.presence_penalty.unwrap_or(0.0),
            // Any 64-bit seed is a seed; negative ones reinterpret their bits.
            seed: c.seed.map(|s| s as u64),
        }),
        max_tokens,
        stop,
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        // The stream asks for at least one alternative so the chosen token's logprob comes too;
        // the adapter trims the alternatives to what the client asked for.
        logprobs: logprobs.map_or(0, |k| k.max(1)),
        ignore_eos: c.ignore_eos.unwrap_or(false),
        n,
        skip_special_tokens: c.skip_special_tokens.unwrap_or(true),
        min_tokens: c.min_tokens.unwrap_or(0),
        structured_output,
    };
    let shape = Shape {
        stream,
        include_usage: c
            .stream_options
            .is_some_and(|o| o.include_usage.unwrap_or(false)),
        continuous_usage: c
            .stream_options
            .is_some_and(|o| o.continuous_usage_stats.unwrap_or(false)),
        logprobs,
        n,
    };
    Ok((request, shape))
}

/// The request parameter a structured-output error names: the one the client used.
pub fn grammar_param(c: &CommonParams) -> &'static str {
    if c.structured_outputs.is_some() {
        "structured_outputs"
    } else {
        "response_format"
    }
}

/// `response_format` (OpenAI's `text`, `json_object`, `json_schema`) or vLLM's
/// `structured_outputs`, as the pipeline's [`StructuredOutput`]; at most one of the two.
fn structured_output(c: &CommonParams) -> Result<Option<StructuredOutput>, ApiError> {
    let from_format = match &c.response_format {
        None => None,
        Some(format) => match format.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(GrammarSpec::JsonObject),
            Some("json_schema") => {
                let schema = format
                    .get("json_schema")
                    .ok_or_else(|| ApiError::invalid("response_format.json_schema", "missing"))?
                    .get("schema")
                    .ok_or_else(|| {
                        ApiError::invalid("response_format.json_schema.schema", "missing")
                    })?;
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "must be a JSON schema (an object)",
                    ));
                }
                Some(GrammarSpec::JsonSchema(schema.to_string()))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    format!(
                        "unknown type {other:?} (expected \"text\", \"json_object\" or \"json_schema\")"
                    ),
                ));
            }
            None => return Err(ApiError::invalid("response_format.type", "missing")),
        },
    };
    let from_vllm = c
        .structured_outputs
        .as_ref()
        .map(|v| {
            GrammarSpec::from_structured_outputs(v)
                .map_err(|e| ApiError::invalid("structured_outputs", e))
        })
        .transpose()?;
    let spec = match (from_format, from_vllm) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "structured_outputs",
                "give either response_format or structured_outputs, not both",
            ));
        }
        (a, b) => a.or(b),
    };
    Ok(spec.map(crate::validate::structured_output_of))
}

/// `request` with `prompt`.
pub fn with_prompt(request: &GenerateRequest, prompt: Prompt) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(prompt.into_proto()),
        ..request.clone()
    }
}

/// `request` with chat `messages`.
pub fn with_chat(request: GenerateRequest, messages: ChatMessages) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(protos::v1::generate_request::Prompt::Chat(messages)),
        ..request
    }
}

/// The OpenAI name of a field the shared validation names (`sampling.top_p` → `top_p`,
/// `prompt.chat.messages[2].role` → `messages[2].role`, `prompt.token_ids[5]` → `prompt[5]`);
/// `prompt_index` is the prompt's place in a list of prompts, `chat` says which API it is.
pub fn openai_param(field: &str, prompt_index: Option<usize>, chat: bool) -> String {
    if let Some(rest) = field.strip_prefix("sampling.") {
        return rest.to_owned();
    }
    if let Some(rest) = field.strip_prefix("prompt.chat") {
        let rest = rest.strip_prefix(".messages").unwrap_or(rest);
        return format!("messages{rest}");
    }
    for form in ["prompt.text", "prompt.token_ids"] {
        if let Some(rest) = field.strip_prefix(form) {
            let at = prompt_index.map_or_else(String::new, |i| format!("[{i}]"));
            return format!("prompt{at}{rest}");
        }
    }
    match (field, chat) {
        ("logprobs", true) => "top_logprobs".into(),
        _ => field.to_owned(),
    }
}
