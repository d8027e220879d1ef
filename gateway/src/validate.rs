//! Request validation: a [`GenerateRequest`] becomes a [`ValidRequest`] or an `INVALID_ARGUMENT`
//! that names the offending field.
//!
//! Validation runs in two stages around tokenization: [`check`] looks at everything that needs no
//! tokenizer (so bad requests never reach the blocking pool), [`finish`] checks the token ids against
//! the vocabulary and the context length.

use grammar::GrammarSpec;
use protos::records::GrammarWire;
use protos::records::{MAX_TOP_LOGPROBS, SamplingWire, Submit};
use protos::v1::{
    ChatMessages, GenerateRequest, StructuredOutput, TokenizeRequest, generate_request,
    structured_output, tokenize_request,
};

use crate::chat::{Message, ROLES};

/// A request field is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidArgument {
    /// The field's path in the request, e.g. `sampling.top_p`.
    pub field: String,
    pub message: String,
}

impl InvalidArgument {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl From<InvalidArgument> for tonic::Status {
    fn from(e: InvalidArgument) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

/// What the served model accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLimits {
    pub vocab_size: u32,
    pub max_model_len: u32,
}

/// A prompt before tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Chat(Vec<Message>),
}

/// A request whose fields are individually valid; its prompt is not tokenized yet.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRequest {
    pub request_id: String,
    pub prompt: Prompt,
    pub sampling: SamplingWire,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub logprobs: u32,
    pub ignore_eos: bool,
    /// Completions of this prompt (at least 1).
    pub n: u32,
    pub skip_special_tokens: bool,
    pub min_tokens: u32,
    /// Structured output (not compiled yet).
    pub grammar: Option<GrammarSpec>,
}

/// A request ready for a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub sampling: SamplingWire,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub logprobs: u32,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// Output tokens before EOS, stop ids and stop strings count (at most `max_tokens`).
    pub min_tokens: u32,
    /// Structured output: the grammar the output must match.
    pub grammar: Option<GrammarSpec>,
}

impl ValidRequest {
    /// The worker's Submit record for this request as gateway request `id`, resumed after the
    /// `emitted` tokens the client already has (none for a new request): they extend the prompt,
    /// come off the budget, and set `prior_output_len` so penalties and the seeded random stream
    /// continue where they were.
    pub fn submit(&self, id: u64, emitted: &[u32]) -> Submit {
        let mut prompt = Vec::with_capacity(self.prompt.len() + emitted.len());
        prompt.extend_from_slice(&self.prompt);
        prompt.extend_from_slice(emitted);
        Submit {
            request_id: id,
            sampling: self.sampling,
            max_tokens: self.max_tokens.saturating_sub(emitted.len() as u32),
            min_tokens: self.min_tokens,
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.clone(),
            prompt,
            prior_output_len: emitted.len() as u32,
            grammar: self.grammar.as_ref().map(|g| GrammarWire {
                kind: g.wire_kind(),
                text: g.wire_text(),
            }),
        }
    }
}

/// The `structured_output` that asks for `spec` (the inverse of `check_structured_output`).
pub fn structured_output_of(spec: GrammarSpec) -> StructuredOutput {
    use structured_output::Kind;
    StructuredOutput {
        kind: Some(match spec {
            GrammarSpec::JsonObject => Kind::JsonObject(true),
            GrammarSpec::JsonSchema(s) => Kind::JsonSchema(s),
            GrammarSpec::Regex(r) => Kind::Regex(r),
            GrammarSpec::Choice(choices) => Kind::Choice(protos::v1::Choices { choices }),
        }),
    }
}

/// The grammar a `structured_output` asks for (its source is checked when it is compiled).
fn check_structured_output(so: StructuredOutput) -> Result<GrammarSpec, InvalidArgument> {
    match so.kind {
        None => Err(InvalidArgument::new(
            "structured_output",
            "names no kind (json_object, json_schema, regex or choice)",
        )),
        Some(structured_output::Kind::JsonObject(true)) => Ok(GrammarSpec::JsonObject),
        Some(structured_output::Kind::JsonObject(false)) => Err(InvalidArgument::new(
            "structured_output.json_object",
            "must be true when set",
        )),
        Some(structured_output::Kind::JsonSchema(s)) => Ok(GrammarSpec::JsonSchema(s)),
        Some(structured_output::Kind::Regex(r)) => Ok(GrammarSpec::Regex(r)),
        Some(structured_output::Kind::Choice(c)) => Ok(GrammarSpec::Choice(c.choices)),
    }
}

fn in_range(field: &str, v: f32, ok: bool, what: &str) -> Result<(), InvalidArgument> {
    if ok && v.is_finite() {
        Ok(())
    } else {
        Err(InvalidArgument::new(field, format!("{v} is not {what}")))
    }
}

/// `request_id` at most: it is echoed in every response message, so its size multiplies.
pub const MAX_REQUEST_ID_LEN: usize = 128;
/// Stop strings per request at most.
pub const MAX_STOP_STRINGS: usize = 64;
/// Bytes of one stop string at most (text this long is held back before it is streamed).
pub const MAX_STOP_STRING_LEN: usize = 512;
/// Bytes of all of a request's stop strings together at most.
pub const MAX_STOP_TOTAL_LEN: usize = 8192;
/// Stop token ids per request at most.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// Completions per prompt (`n`) at most.
pub const MAX_N: u32 = 64;

fn check_request_id(id: &str) -> Result<(), InvalidArgument> {
    if id.len() > MAX_REQUEST_ID_LEN {
        return Err(InvalidArgument::new(
            "request_id",
            format!(
                "{} bytes is over the limit of {MAX_REQUEST_ID_LEN}",
                id.len()
            ),
        ));
    }
    if let Some(i) = id.bytes().position(|b| !(b' '..=b'~').contains(&b)) {
        return Err(InvalidArgument::new(
            "request_id",
            format!("byte {i} is not printable ASCII (at most {MAX_REQUEST_ID_LEN} of ' '..='~')"),
        ));
    }
    Ok(())
}

fn check_stops(stop: &[String], stop_token_ids: &[u32]) -> Result<(), InvalidArgument> {
    if stop.len() > MAX_STOP_STRINGS {
        return Err(InvalidArgument::new(
            "stop",
            format!(
                "{} stop strings is over the limit of {MAX_STOP_STRINGS}",
                stop.len()
            ),
        ));
    }
    for (i, s) in stop.iter().enumerate() {
        if s.is_empty() {
            return Err(InvalidArgument::new(format!("stop[{i}]"), "empty"));
        }
        if s.len() > MAX_STOP_STRING_LEN {
            return Err(InvalidArgument::new(
                format!("stop[{i}]"),
                format!(
                    "{} bytes is over the limit of {MAX_STOP_STRING_LEN}",
                    s.len()
                ),
            ));
        }
    }
    let total: usize = stop.iter().map(String::len).sum();
    if total > MAX_STOP_TOTAL_LEN {
        return Err(InvalidArgument::new(
            "stop",
            format!("{total} bytes in all is over the limit of {MAX_STOP_TOTAL_LEN}"),
        ));
    }
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(InvalidArgument::new(
            "stop_token_ids",
            format!(
                "{} ids is over the limit of {MAX_STOP_TOKEN_IDS}",
                stop_token_ids.len()
            ),
        ));
    }
    Ok(())
}

/// A text prompt at `field`: it must not be empty.
fn check_text(field: &str, text: String) -> Result<Prompt, InvalidArgument> {
    if text.is_empty() {
        return Err(InvalidArgument::new(field, "empty"));
    }
    Ok(Prompt::Text(text))
}

/// Chat messages at `field` (e.g. `prompt.chat`): at least one, each with a known role.
fn check_chat(field: &str, chat: ChatMessages) -> Result<Prompt, InvalidArgument> {
    if chat.messages.is_empty() {
        return Err(InvalidArgument::new(format!("{field}.messages"), "empty"));
    }
    let mut out = Vec::with_capacity(chat.messages.len());
    for (i, m) in chat.messages.into_iter().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(InvalidArgument::new(
                format!("{field}.messages[{i}].role"),
                format!("unknown role {:?} (expected one of {ROLES:?})", m.role),
            ));
        }
        out.push(Message {
            role: m.role,
            content: m.content,
        });
    }
    Ok(Prompt::Chat(out))
}

/// Checks a `Tokenize` request's input by the same rules as a `Generate` prompt.
pub fn check_tokenize(req: TokenizeRequest) -> Result<Prompt, InvalidArgument> {
    match req.input {
        None => Err(InvalidArgument::new("input", "missing")),
        Some(tokenize_request::Input::Text(t)) => check_text("input.text", t),
        Some(tokenize_request::Input::Chat(c)) => check_chat("input.chat", c),
    }
}

/// Checks everything that needs no tokenizer. `seed` is used when the request has none.
pub fn check(req: GenerateRequest, seed: u64) -> Result<CheckedRequest, InvalidArgument> {
    check_request_id(&req.request_id)?;
    let prompt = match req.prompt {
        None => return Err(InvalidArgument::new("prompt", "missing")),
        Some(generate_request::Prompt::Text(t)) => check_text("prompt.text", t)?,
        Some(generate_request::Prompt::TokenIds(ids)) => {
            if ids.ids.is_empty() {
                return Err(InvalidArgument::new("prompt.token_ids", "empty"));
            }
            Prompt::Ids(ids.ids)
        }
        Some(generate_request::Prompt::Chat(chat)) => check_chat("prompt.chat", chat)?,
    };
    check_stops(&req.stop, &req.stop_token_ids)?;
    let s = req.sampling.unwrap_or_default();
    let temperature = s.temperature.unwrap_or(1.0);
    in_range(
        "sampling.temperature",
        temperature,
        temperature >= 0.0,
        ">= 0",
    )?;
    let top_p = s.top_p.unwrap_or(1.0);
    in_range(
        "sampling.top_p",
        top_p,
        top_p > 0.0 && top_p <= 1.0,
        "in (0, 1]",
    )?;
    if s.top_k < 0 {
        return Err(InvalidArgument::new(
            "sampling.top_k",
            format!("{} is negative (0 means no limit)", s.top_k),
        ));
    }
    in_range(
        "sampling.min_p",
        s.min_p,
        (0.0..=1.0).contains(&s.min_p),
        "in [0, 1]",
    )?;
    let repetition_penalty = s.repetition_penalty.unwrap_or(1.0);
    in_range(
        "sampling.repetition_penalty",
        repetition_penalty,
        repetition_penalty > 0.0,
        "> 0",
    )?;
    for (field, v) in [
        ("sampling.frequency_penalty", s.frequency_penalty),
        ("sampling.presence_penalty", s.presence_penalty),
    ] {
        in_range(field, v, (-2.0..=2.0).contains(&v), "in [-2, 2]")?;
    }
    if req.max_tokens == Some(0) {
        return Err(InvalidArgument::new("max_tokens", "must be at least 1"));
    }
    if req.logprobs > MAX_TOP_LOGPROBS {
        return Err(InvalidArgument::new(
            "logprobs",
            format!("{} is over the limit of {MAX_TOP_LOGPROBS}", req.logprobs),
        ));
    }
    if let Some(max) = req.max_tokens
        && req.min_tokens > max
    {
        return Err(InvalidArgument::new(
            "min_tokens",
            format!("{} is more than max_tokens {max}", req.min_tokens),
        ));
    }
    if req.n > MAX_N {
        return Err(InvalidArgument::new(
            "n",
            format!("{} is over the limit of {MAX_N}", req.n),
        ));
    }
    let grammar = req
        .structured_output
        .map(check_structured_output)
        .transpose()?;
    Ok(CheckedRequest {
        request_id: req.request_id,
        prompt,
        sampling: SamplingWire {
            temperature,
            top_p,
            top_k: s.top_k as u32,
            min_p: s.min_p,
            repetition_penalty,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            seed: s.seed.unwrap_or(seed),
        },
        max_tokens: req.max_tokens,
        stop: req.stop,
        stop_token_ids: req.stop_token_ids,
        logprobs: req.logprobs,
        ignore_eos: req.ignore_eos,
        n: req.n.max(1),
        skip_special_tokens: req.skip_special_tokens,
        min_tokens: req.min_tokens,
        grammar,
    })
}

/// Checks the tokenized prompt against the model and settles `max_tokens`.
pub fn finish(
    req: CheckedRequest,
    prompt: Vec<u32>,
    limits: ModelLimits,
) -> Result<ValidRequest, InvalidArgument> {
    let field = match req.prompt {
        Prompt::Text(_) => "prompt.text",
        Prompt::Ids(_) => "prompt.token_ids",
        Prompt::Chat(_) => "prompt.chat",
    };
    if prompt.is_empty() {
        return Err(InvalidArgument::new(field, "tokenizes to no tokens"));
    }
    if let Some((i, id)) = prompt
        .iter()
        .enumerate()
        .find(|(_, id)| **id >= limits.vocab_size)
    {
        return Err(InvalidArgument::new(
            format!("{field}[{i}]"),
            format!(
                "token id {id} is outside the vocabulary (size {})",
                limits.vocab_size
            ),
        ));
    }
    if let Some((i, id)) = req
        .stop_token_ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id >= limits.vocab_size)
    {
        return Err(InvalidArgument::new(
            format!("stop_token_ids[{i}]"),
            format!(
                "token id {id} is outside the vocabulary (size {})",
                limits.vocab_size
            ),
        ));
    }
    let len = prompt.len() as u64;
    let max_len = u64::from(limits.max_model_len);
    if len >= max_len {
        return Err(InvalidArgument::new(
            field,
            format!(
                "{len} prompt tokens leave no room to generate within the context of {max_len}"
            ),
        ));
    }
    let max_tokens = match req.max_tokens {
        Some(n) if len + u64::from(n) > max_len => {
            return Err(InvalidArgument::new(
                "max_tokens",
                format!(
                    "{len} prompt tokens + {n} max_tokens exceed the context of {max_len} tokens"
                ),
            ));
        }
        Some(n) => n,
        None => (max_len - len) as u32,
    };
    if req.min_tokens > max_tokens {
        return Err(InvalidArgument::new(
            "min_tokens",
            format!(
                "{} is more than the {max_tokens} tokens the context leaves",
                req.min_tokens
            ),
        ));
    }
    Ok(ValidRequest {
        request_id: req.request_id,
        prompt,
        sampling: req.sampling,
        max_tokens,
        stop: req.stop,
        stop_token_ids: req.stop_token_ids,
        logprobs: req.logprobs,
        ignore_eos: req.ignore_eos,
        skip_special_tokens: req.skip_special_tokens,
        min_tokens: req.min_tokens,
        grammar: req.grammar,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use protos::v1::{ChatMessage, SamplingParams, TokenIds};

    const LIMITS: ModelLimits = ModelLimits {
        vocab_size: 100,
        max_model_len: 32,
    };

    fn ids(v: &[u32]) -> GenerateRequest {
        GenerateRequest {
            prompt: Some(generate_request::Prompt::TokenIds(TokenIds {
                ids: v.to_vec(),
            })),
            ..Default::default()
        }
    }

    fn field_of(req: GenerateRequest) -> String {
        let checked = match check(req, 1) {
            Err(e) => return e.field,
            Ok(c) => c,
        };
        let prompt = match &checked.prompt {
            Prompt::Ids(v) => v.clone(),
            _ => vec![1],
        };
        finish(checked, prompt, LIMITS).unwrap_err().field
    }

    fn with_sampling(s: SamplingParams) -> GenerateRequest {
        GenerateRequest {
            sampling: Some(s),
            ..ids(&[1, 2])
        }
    }

    #[test]
    fn each_invalid_field_is_named() {
        assert_eq!(field_of(GenerateRequest::default()), "prompt");
        assert_eq!(field_of(ids(&[])), "prompt.token_ids");
        let text = GenerateRequest {
            prompt: Some(generate_request::Prompt::Text(String::new())),
            ..Default::default()
        };
        assert_eq!(field_of(text), "prompt.text");
        assert_eq!(field_of(ids(&[1, 100])), "prompt.token_ids[1]");
        assert_eq!(field_of(ids(&[1; 32])), "prompt.token_ids");
        let long = GenerateRequest {
            max_tokens: Some(31),
            ..ids(&[1, 2])
        };
        assert_eq!(field_of(long), "max_tokens");
        let zero = GenerateRequest {
            max_tokens: Some(0),
            ..ids(&[1])
        };
        assert_eq!(field_of(zero), "max_tokens");
        let many = GenerateRequest {
            n: MAX_N + 1,
            ..ids(&[1])
        };
        assert_eq!(field_of(many), "n");
        let min_over_max = GenerateRequest {
            max_tokens: Some(3),
            min_tokens: 4,
            ..ids(&[1])
        };
        assert_eq!(field_of(min_over_max), "min_tokens");
        let min_over_context = GenerateRequest {
            min_tokens: 31,
            ..ids(&[1, 2])
        };
        assert_eq!(field_of(min_over_context), "min_tokens");
        let t = SamplingParams {
            temperature: Some(-0.1),
            ..Default::default()
        };
        assert_eq!(field_of(with_sampling(t)), "sampling.temperature");
        for p in [0.0, 1.5, f32::NAN] {
            let s = SamplingParams {
                top_p: Some(p),
                ..Default::default()
            };
            assert_eq!(field_of(with_sampling(s)), "sampling.top_p");
        }
        let k = SamplingParams {
            top_k: -1,
            ..Default::default()
        };
        assert_eq!(field_of(with_sampling(k)), "sampling.top_k");
        for m in [-0.1, 1.1] {
            let s = SamplingParams {
                min_p: m,
                ..Default::default()
            };
            assert_eq!(field_of(with_sampling(s)), "sampling.min_p");
        }
        let chat = GenerateRequest {
            prompt: Some(generate_request::Prompt::Chat(ChatMessages {
                messages: vec![
                    ChatMessage {
                        role: "user".into(),
                        content: "hi".into(),
                    },
                    ChatMessage {
                        role: "wizard".into(),
                        content: "hi".into(),
                    },
                ],
            })),
            ..Default::default()
        };
        assert_eq!(field_of(chat), "prompt.chat.messages[1].role");
        let stops = GenerateRequest {
            stop_token_ids: vec![5, 500],
            ..ids(&[1])
        };
        assert_eq!(field_of(stops), "stop_token_ids[1]");
        let lp = GenerateRequest {
            logprobs: 21,
            ..ids(&[1])
        };
        assert_eq!(field_of(lp), "logprobs");
    }

    #[test]
    fn defaults_follow_vllm_and_max_tokens_fills_the_context() {
        let c = check(ids(&[1, 2, 3]), 77).unwrap();
        assert_eq!(c.sampling.temperature, 1.0);
        assert_eq!(c.sampling.top_p, 1.0);
        assert_eq!(c.sampling.seed, 77);
        let v = finish(c, vec![1, 2, 3], LIMITS).unwrap();
        assert_eq!(v.max_tokens, 29);
        let exact = GenerateRequest {
            max_tokens: Some(29),
            ..ids(&[1, 2, 3])
        };
        let v = finish(check(exact, 1).unwrap(), vec![1, 2, 3], LIMITS).unwrap();
        assert_eq!(v.max_tokens, 29);
    }

    #[test]
    fn request_ids_and_stops_are_bounded() {
        let with_id = |id: String| GenerateRequest {
            request_id: id,
            ..ids(&[1])
        };
        assert!(check(with_id("a".repeat(MAX_REQUEST_ID_LEN)), 1).is_ok());
        let long = check(with_id("a".repeat(MAX_REQUEST_ID_LEN + 1)), 1).unwrap_err();
        assert_eq!(long.field, "request_id");
        assert!(long.message.contains("128"), "{long}");
        for bad in ["tab\there", "new\nline", "caf\u{e9}", "\u{7f}"] {
            let e = check(with_id(bad.to_owned()), 1).unwrap_err();
            assert_eq!(e.field, "request_id", "{bad:?}");
        }
        let with_stops = |stop: Vec<String>| GenerateRequest { stop, ..ids(&[1]) };
        let many = vec!["x".to_owned(); MAX_STOP_STRINGS + 1];
        assert_eq!(field_of(with_stops(many)), "stop");
        let one_long = vec!["ok".to_owned(), "x".repeat(MAX_STOP_STRING_LEN + 1)];
        assert_eq!(field_of(with_stops(one_long)), "stop[1]");
        let total =
            vec!["x".repeat(MAX_STOP_STRING_LEN); MAX_STOP_TOTAL_LEN / MAX_STOP_STRING_LEN + 1];
        assert!(total.len() <= MAX_STOP_STRINGS);
        assert_eq!(field_of(with_stops(total)), "stop");
        let fits = vec!["x".repeat(MAX_STOP_STRING_LEN); MAX_STOP_TOTAL_LEN / MAX_STOP_STRING_LEN];
        assert!(check(with_stops(fits), 1).is_ok());
        let ids_req = GenerateRequest {
            stop_token_ids: vec![1; MAX_STOP_TOKEN_IDS + 1],
            ..ids(&[1])
        };
        assert_eq!(field_of(ids_req), "stop_token_ids");
    }

    #[test]
    fn tokenize_and_generate_share_the_prompt_rules() {
        let chat = |messages: Vec<ChatMessage>| ChatMessages { messages };
        let msg = |role: &str| ChatMessage {
            role: role.into(),
            content: "hi".into(),
        };
        let cases = [
            (chat(vec![]), "messages", "empty"),
            (
                chat(vec![msg("user"), msg("wizard")]),
                "messages[1].role",
                "expected one of",
            ),
        ];
        for (c, field, message) in cases {
            let generate = check(
                GenerateRequest {
                    prompt: Some(generate_request::Prompt::Chat(c.clone())),
                    ..Default::default()
                },
                1,
            )
            .unwrap_err();
            let tokenize = check_tokenize(TokenizeRequest {
                input: Some(tokenize_request::Input::Chat(c)),
            })
            .unwrap_err();
            assert_eq!(generate.field, format!("prompt.chat.{field}"));
            assert_eq!(tokenize.field, format!("input.chat.{field}"));
            assert_eq!(generate.message, tokenize.message);
            assert!(tokenize.message.contains(message), "{tokenize}");
        }
        let empty = check_tokenize(TokenizeRequest {
            input: Some(tokenize_request::Input::Text(String::new())),
        })
        .unwrap_err();
        assert_eq!(empty.field, "input.text");
        assert_eq!(
            check_tokenize(TokenizeRequest { input: None })
                .unwrap_err()
                .field,
            "input"
        );
        let ok = check_tokenize(TokenizeRequest {
            input: Some(tokenize_request::Input::Chat(chat(vec![msg("user")]))),
        })
        .unwrap();
        assert!(matches!(ok, Prompt::Chat(m) if m.len() == 1));
    }

    fn hostile_f32() -> impl proptest::strategy::Strategy<Value = f32> {
        use proptest::prelude::*;
        prop_oneof![
            any::<f32>(),
            Just(f32::NAN),
            Just(f32::INFINITY),
            Just(f32::NEG_INFINITY),
            -3.0f32..3.0
        ]
    }

    fn hostile_request() -> impl proptest::strategy::Strategy<Value = GenerateRequest> {
        use proptest::collection::vec;
        use proptest::prelude::*;
        let prompt = prop_oneof![
            Just(None),
            "\\PC{0,40}".prop_map(|t| Some(generate_request::Prompt::Text(t))),
            vec(any::<u32>(), 0..8)
                .prop_map(|ids| Some(generate_request::Prompt::TokenIds(TokenIds { ids }))),
            vec(("[a-z]{0,10}", "\\PC{0,20}"), 0..4).prop_map(|m| {
                let messages = m
                    .into_iter()
                    .map(|(role, content)| ChatMessage { role, content })
                    .collect();
                Some(generate_request::Prompt::Chat(ChatMessages { messages }))
            }),
        ];
        let sampling = (
            proptest::option::of(hostile_f32()),
            proptest::option::of(hostile_f32()),
            any::<i32>(),
            hostile_f32(),
            proptest::option::of(hostile_f32()),
            hostile_f32(),
            hostile_f32(),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(|(t, p, k, min_p, rep, freq, pres, seed)| SamplingParams {
                temperature: t,
                top_p: p,
                top_k: k,
                min_p,
                repetition_penalty: rep,
                frequency_penalty: freq,
                presence_penalty: pres,
                seed,
            });
        let id = prop_oneof!["\\PC{0,20}", "[ -~]{120,140}", Just(String::new())];
        let stops = vec(prop_oneof!["\\PC{0,6}", "x{500,520}"], 0..70);
        (
            id,
            prompt,
            proptest::option::of(sampling),
            proptest::option::of(any::<u32>()),
            stops,
            vec(any::<u32>(), 0..8),
            any::<u32>(),
            any::<bool>(),
        )
            .prop_map(
                |(request_id, prompt, sampling, max_tokens, stop, stop_token_ids, lp, ignore)| {
                    GenerateRequest {
                        request_id,
                        prompt,
                        sampling,
                        max_tokens,
                        stop,
                        stop_token_ids,
                        logprobs: lp % 64,
                        ignore_eos: ignore,
                        n: lp % 70,
                        ..Default::default()
                    }
                },
            )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1024, ..Default::default() })]

        #[test]
        fn hostile_requests_are_valid_or_name_a_field(
            req in hostile_request(),
            tokens in proptest::collection::vec(0u32..140, 0..40),
        ) {
            let checked = match check(req, 5) {
                Ok(c) => c,
                Err(e) => {
                    proptest::prop_assert!(!e.field.is_empty() && !e.message.is_empty());
                    return Ok(());
                }
            };
            // What passes holds every bound the server relies on.
            proptest::prop_assert!(checked.request_id.len() <= MAX_REQUEST_ID_LEN);
            proptest::prop_assert!(checked.stop.len() <= MAX_STOP_STRINGS);
            proptest::prop_assert!(checked.stop.iter().map(String::len).sum::<usize>() <= MAX_STOP_TOTAL_LEN);
            let s = checked.sampling;
            for v in [s.temperature, s.top_p, s.min_p, s.repetition_penalty, s.frequency_penalty, s.presence_penalty] {
                proptest::prop_assert!(v.is_finite());
            }
            proptest::prop_assert!(s.top_p > 0.0 && s.repetition_penalty > 0.0);
            let prompt = match &checked.prompt {
                Prompt::Ids(ids) => ids.clone(),
                _ => tokens,
            };
            match finish(checked, prompt, LIMITS) {
                Ok(v) => {
                    proptest::prop_assert!(v.prompt.iter().all(|&t| t < LIMITS.vocab_size));
                    proptest::prop_assert!(v.max_tokens >= 1);
                    proptest::prop_assert!(
                        v.prompt.len() as u64 + u64::from(v.max_tokens)
                            <= u64::from(LIMITS.max_model_len)
                    );
                }
                Err(e) => proptest::prop_assert!(!e.field.is_empty()),
            }
        }
    }
}
