//! Turning the pipeline's response streams into OpenAI's responses: one JSON body, or server-sent
//! events (`data: {chunk}` ..., a usage chunk when asked, `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use protos::v1::{FinishReason, GenerateResponse};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{StreamExt, StreamMap};

use super::error::ApiError;
use super::request::Shape;
use crate::pipeline::ResponseStream;
use crate::tokenizer::TextModel;

/// Which API a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

impl Api {
    fn object(self, stream: bool) -> &'static str {
        match (self, stream) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        }
    }
}

/// What every chunk of one response repeats.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub shape: Shape,
    /// Per prompt: the text put before its completions (`echo`), if any.
    pub echo: Vec<Option<String>>,
}

/// Spells tokens for logprobs.
#[derive(Debug, Clone)]
pub struct TokenText(pub Option<Arc<TextModel>>);

impl TokenText {
    fn text(&self, id: u32) -> String {
        match &self.0 {
            Some(t) => t.tokenizer.decode(&[id], false).unwrap_or_default(),
            None => format!("token_id:{id}"),
        }
    }
}

fn finish_reason(msg: &GenerateResponse) -> Option<&'static str> {
    match FinishReason::try_from(msg.finish_reason) {
        Ok(FinishReason::Length) => Some("length"),
        Ok(FinishReason::Stop) => Some("stop"),
        _ => None,
    }
}

/// One choice's state across messages.
#[derive(Debug, Default)]
struct Choice {
    text: String,
    /// Completions' `text_offset`: bytes of text before the next token.
    offset: usize,
    finish: Option<&'static str>,
    tokens: Vec<String>,
    text_offsets: Vec<usize>,
    token_logprobs: Vec<f32>,
    top: Vec<Value>,
    /// Chat's `logprobs.content` entries.
    content: Vec<Value>,
    /// Tokens generated so far.
    generated: usize,
}

impl Choice {
    /// Adds a message's logprobs in the API's shape (up to `k` alternatives each).
    fn add_logprobs(&mut self, api: Api, msg: &GenerateResponse, k: usize, spell: &TokenText) {
        for lp in &msg.logprobs {
            let token = spell.text(lp.token_id);
            let alternatives = lp
                .top
                .iter()
                .take(k)
                .map(|t| (spell.text(t.token_id), t.logprob));
            match api {
                Api::Completions => {
                    let mut top = serde_json::Map::new();
                    for (text, logprob) in alternatives {
                        top.entry(text).or_insert(json!(logprob));
                    }
                    self.top.push(Value::Object(top));
                    self.token_logprobs.push(lp.logprob);
                    self.text_offsets.push(self.offset);
                    self.offset += token.len();
                    self.tokens.push(token);
                }
                Api::Chat => {
                    let top: Vec<Value> = alternatives
                        .map(|(text, logprob)| {
                            json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()})
                        })
                        .collect();
                    self.content.push(json!({
                        "token": token, "logprob": lp.logprob, "bytes": token.as_bytes(),
                        "top_logprobs": top,
                    }));
                }
            }
        }
    }

    /// The logprobs gathered since the last call, in the API's shape.
    fn take_logprobs(&mut self, api: Api) -> Value {
        match api {
            Api::Completions => json!({
                "tokens": std::mem::take(&mut self.tokens),
                "token_logprobs": std::mem::take(&mut self.token_logprobs),
                "top_logprobs": std::mem::take(&mut self.top),
                "text_offset": std::mem::take(&mut self.text_offsets),
            }),
            Api::Chat => json!({"content": std::mem::take(&mut self.content)}),
        }
    }
}

/// Token counts of the whole response.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    prompt: u32,
    completion: u32,
}

impl Usage {
    fn add(&mut self, msg: &GenerateResponse) {
        if let Some(u) = &msg.usage {
            // Each prompt's tokens count once, however many completions it has.
            if msg.index == 0 {
                self.prompt += u.prompt_tokens;
            }
            self.completion += u.completion_tokens;
        }
    }

    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

/// The merged stream of every prompt's completions, tagged with each message's choice index
/// (`prompt * n + index`, as OpenAI numbers them).
fn merge(streams: Vec<ResponseStream>, n: u32) -> impl tokio_stream::Stream<Item = Tagged> {
    let mut map = StreamMap::with_capacity(streams.len());
    for (i, s) in streams.into_iter().enumerate() {
        map.insert(i, s);
    }
    map.map(move |(prompt, item)| match item {
        Ok(msg) => Tagged {
            choice: prompt * n as usize + msg.index as usize,
            msg: Ok(msg),
        },
        Err(status) => Tagged {
            choice: 0,
            msg: Err(status),
        },
    })
}

struct Tagged {
    choice: usize,
    msg: Result<GenerateResponse, tonic::Status>,
}

/// Answers with the whole response at once, after every completion finished.
pub async fn whole(env: Envelope, streams: Vec<ResponseStream>, spell: TokenText) -> Response {
    let n = env.shape.n;
    let mut choices: Vec<Choice> = (0..env.echo.len() * n as usize)
        .map(|_| Choice::default())
        .collect();
    for (c, choice) in choices.iter_mut().enumerate() {
        if let Some(echo) = &env.echo[c / n as usize] {
            choice.text.push_str(echo);
            choice.offset = echo.len();
        }
    }
    let k = env.shape.logprobs.unwrap_or(0) as usize;
    let mut usage = Usage::default();
    let mut merged = std::pin::pin!(merge(streams, n));
    while let Some(t) = merged.next().await {
        let msg = match t.msg {
            Ok(msg) => msg,
            Err(status) => return ApiError::from_status(&status).into_response(),
        };
        let Some(choice) = choices.get_mut(t.choice) else {
            continue;
        };
        choice.text.push_str(&msg.text);
        if env.shape.logprobs.is_some() {
            choice.add_logprobs(env.api, &msg, k, &spell);
        }
        if let Some(reason) = finish_reason(&msg) {
            choice.finish = Some(reason);
        }
        usage.add(&msg);
    }
    let body_choices: Vec<Value> = choices
        .iter_mut()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = match env.shape.logprobs {
                Some(_) => c.take_logprobs(env.api),
                None => Value::Null,
            };
            match env.api {
                Api::Completions => json!({
                    "index": i, "text": c.text, "logprobs": logprobs,
                    "finish_reason": c.finish, "stop_reason": Value::Null,
                }),
                Api::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": logprobs, "finish_reason": c.finish,
                }),
            }
        })
        .collect();
    axum::Json(json!({
        "id": env.id, "object": env.api.object(false), "created": env.created,
        "model": env.model, "choices": body_choices, "usage": usage.json(),
    }))
    .into_response()
}

/// A streamed chunk of one choice's new text: built from borrowed parts, so a token costs no
/// JSON tree and no copy of the id or the model name.
#[derive(Serialize)]
struct TokenChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [TokenChoice<'a>; 1],
    /// Absent; `null` with `include_usage`; the choice's usage so far with `continuous_usage_stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageJson>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum TokenChoice<'a> {
    Completion {
        index: usize,
        text: &'a str,
        logprobs: &'a Value,
        finish_reason: Option<&'static str>,
        stop_reason: (),
    },
    Chat {
        index: usize,
        delta: Delta<'a>,
        logprobs: &'a Value,
        finish_reason: Option<&'static str>,
    },
}

#[derive(Serialize)]
struct Delta<'a> {
    /// Left out of a last chunk that brings no text.
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
}

#[derive(Serialize)]
struct UsageJson {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

fn event(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

/// Answers with server-sent events as the tokens arrive. A client that goes away drops the
/// receiver, the task ends, and dropping the pipeline's streams cancels every completion.
pub fn streamed(env: Envelope, streams: Vec<ResponseStream>, spell: TokenText) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(32);
    tokio::spawn(async move {
        let n = env.shape.n as usize;
        let chunk = |choices: Value| {
            let mut v = json!({
                "id": env.id, "object": env.api.object(true), "created": env.created,
                "model": env.model, "choices": choices,
            });
            if env.shape.include_usage {
                v["usage"] = Value::Null;
            }
            v
        };
        let mut states: Vec<Choice> = (0..env.echo.len() * n).map(|_| Choice::default()).collect();
        let prompt_tokens: Vec<usize> = streams.iter().map(|s| s.prompt_tokens).collect();
        // Chat: each choice opens with the role; completions: with the echoed prompt.
        for (c, state) in states.iter_mut().enumerate() {
            let first = match (env.api, &env.echo[c / n]) {
                (Api::Chat, _) => json!([{
                    "index": c, "delta": {"role": "assistant", "content": ""},
                    "logprobs": Value::Null, "finish_reason": Value::Null,
                }]),
                (Api::Completions, Some(echo)) => {
                    state.offset = echo.len();
                    json!([{"index": c, "text": echo, "logprobs": Value::Null, "finish_reason": Value::Null}])
                }
                (Api::Completions, None) => continue,
            };
            if tx.send(Ok(event(&chunk(first)))).await.is_err() {
                return;
            }
        }
        let k = env.shape.logprobs.unwrap_or(0) as usize;
        let mut usage = Usage::default();
        let mut merged = std::pin::pin!(merge(streams, env.shape.n));
        while let Some(t) = merged.next().await {
            let msg = match t.msg {
                Ok(msg) => msg,
                Err(status) => {
                    let body: Value = serde_json::from_str(&ApiError::from_status(&status).body())
                        .unwrap_or(Value::Null);
                    let _ = tx.send(Ok(event(&body))).await;
                    let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
                    return;
                }
            };
            usage.add(&msg);
            let finish = finish_reason(&msg);
            let Some(state) = states.get_mut(t.choice) else {
                continue;
            };
            state.generated += msg.token_ids.len();
            // A message with tokens is a chunk even when its text is held back (or there is no
            // tokenizer): the client sees the tokens arrive, and continuous usage counts them.
            if msg.token_ids.is_empty() && msg.text.is_empty() && finish.is_none() {
                continue;
            }
            let logprobs = match env.shape.logprobs {
                Some(_) => {
                    state.add_logprobs(env.api, &msg, k, &spell);
                    state.take_logprobs(env.api)
                }
                None => Value::Null,
            };
            let text = msg.text.as_str();
            let choice = match env.api {
                Api::Completions => TokenChoice::Completion {
                    index: t.choice,
                    text,
                    logprobs: &logprobs,
                    finish_reason: finish,
                    stop_reason: (),
                },
                Api::Chat => TokenChoice::Chat {
                    index: t.choice,
                    delta: Delta {
                        content: (!text.is_empty() || finish.is_none()).then_some(text),
                    },
                    logprobs: &logprobs,
                    finish_reason: finish,
                },
            };
            let usage = if env.shape.continuous_usage {
                let prompt = prompt_tokens.get(t.choice / n).copied().unwrap_or(0);
                Some(Some(UsageJson {
                    prompt_tokens: prompt,
                    completion_tokens: state.generated,
                    total_tokens: prompt + state.generated,
                }))
            } else {
                env.shape.include_usage.then_some(None)
            };
            let out = TokenChunk {
                id: &env.id,
                object: env.api.object(true),
                created: env.created,
                model: &env.model,
                choices: [choice],
                usage,
            };
            let data = serde_json::to_string(&out).unwrap_or_default();
            if tx.send(Ok(Event::default().data(data))).await.is_err() {
                return;
            }
        }
        if env.shape.include_usage {
            let mut last = chunk(json!([]));
            last["usage"] = usage.json();
            let _ = tx.send(Ok(event(&last))).await;
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(rx)).into_response()
}
