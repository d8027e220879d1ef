//! The OpenAI-compatible HTTP API (vLLM's routes and extras), served with axum beside the gRPC
//! server: `POST /v1/completions`, `POST /v1/chat/completions` (JSON or server-sent events),
//! `GET /v1/models`, `POST /tokenize`, `POST /detokenize`, `GET /health`, `GET /version`.
//!
//! A thin adapter: each request becomes a `GenerateRequest` for [`Shared::generate`], the pipeline
//! the gRPC service uses, so validation, admission, routing, failover and cancellation are the same
//! code. The API key ([`ApiKey`]) guards every route but `/health` and `/version`.

pub mod error;
pub mod request;
pub mod respond;
mod serve;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use self::error::ApiError;
use self::request::{
    ChatRequest, CompletionRequest, DEFAULT_COMPLETION_MAX_TOKENS, Prompt, Shape, chat_messages,
    completion_prompts, generate_request, grammar_param, openai_param, parse, parse_generation,
    with_chat, with_prompt,
};
use self::respond::{Api, Envelope, TokenText, streamed, whole};
pub use self::serve::{HttpServeError, HttpTls, serve};
use crate::auth::ApiKey;
use crate::pipeline::{ResponseStream, Shared};
use crate::validate;

/// Bytes of a request body at most (as the gRPC API's 4 MiB message limit).
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// Prompts in one completions request at most.
pub const MAX_PROMPTS: usize = 64;

/// What the handlers share.
#[derive(Debug)]
pub struct ApiState {
    pub shared: Arc<Shared>,
    pub api_key: Option<ApiKey>,
}

/// The API's routes over `state`.
pub fn router(state: Arc<ApiState>) -> Router {
    let guarded = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), check_key));
    Router::new()
        .merge(guarded)
        .route("/health", get(health))
        .route("/version", get(version))
        .fallback(|req: Request| async move { ApiError::no_route(req.uri().path()) })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn check_key(State(state): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key
        && let Err(e) = key.verify(req.headers())
    {
        metrics::counter!(crate::metrics::AUTH_FAILURES).increment(1);
        return ApiError::unauthorized(e.to_string()).into_response();
    }
    next.run(req).await
}

/// The body, or a 413/400 in OpenAI's shape.
fn body(body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError {
        status: e.status(),
        ..ApiError::bad_body(e.body_text())
    })
}

fn check_model(state: &ApiState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != state.shared.model_name => {
            Err(ApiError::unknown_model(m, &state.shared.model_name))
        }
        _ => Ok(()),
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Starts one `GenerateRequest` per prompt; errors name OpenAI's fields.
async fn start(
    state: &ApiState,
    requests: Vec<protos::v1::GenerateRequest>,
    api: Api,
    grammar_param: &'static str,
) -> Result<Vec<ResponseStream>, ApiError> {
    let several = requests.len() > 1;
    let mut streams = Vec::with_capacity(requests.len());
    for (i, req) in requests.into_iter().enumerate() {
        let at = several.then_some(i);
        let stream = state.shared.generate(req, None).await.map_err(|e| {
            ApiError::from_start(e, |f| {
                if f.starts_with("structured_output") {
                    grammar_param.to_owned()
                } else {
                    openai_param(f, at, api == Api::Chat)
                }
            })
        })?;
        streams.push(stream);
    }
    Ok(streams)
}

async fn completions(
    State(state): State<Arc<ApiState>>,
    raw: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_generation(&body(raw)?)?;
    check_model(&state, req.common.model.as_deref())?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "not supported"));
    }
    let n = req.common.n.unwrap_or(1);
    if req.best_of.is_some_and(|b| b != n) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = n is supported (every sample is returned)",
        ));
    }
    let echo = req.echo.unwrap_or(false);
    if echo && req.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo with logprobs needs the prompt's logprobs, which ringserve does not compute",
        ));
    }
    let prompts = completion_prompts(&req.prompt)?;
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts is over the limit of {MAX_PROMPTS}",
                prompts.len()
            ),
        ));
    }
    let id = new_id("cmpl");
    let max_tokens = req.max_tokens.or(Some(DEFAULT_COMPLETION_MAX_TOKENS));
    let (base, shape) = generate_request(&req.common, max_tokens, req.logprobs, id.clone())?;
    let echo: Vec<Option<String>> = prompts
        .iter()
        .map(|p| echo.then(|| echo_text(&state, p)))
        .collect();
    let requests = prompts.into_iter().map(|p| with_prompt(&base, p)).collect();
    let streams = start(
        &state,
        requests,
        Api::Completions,
        grammar_param(&req.common),
    )
    .await?;
    let env = envelope(&state, Api::Completions, id, shape, echo);
    Ok(respond(env, streams, &state).await)
}

async fn chat_completions(
    State(state): State<Arc<ApiState>>,
    raw: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse_generation(&body(raw)?)?;
    check_model(&state, req.common.model.as_deref())?;
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::invalid("tools", "tool calling is not supported"));
    }
    if req
        .tool_choice
        .as_ref()
        .is_some_and(|c| !(c.is_null() || c == "none"))
    {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool calling is not supported",
        ));
    }
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, k) => Some(k.unwrap_or(0)),
        (false, Some(k)) if k > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "needs \"logprobs\": true",
            ));
        }
        (false, _) => None,
    };
    let messages = chat_messages(&req.messages)?;
    let id = new_id("chatcmpl");
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let (base, shape) = generate_request(&req.common, max_tokens, logprobs, id.clone())?;
    let streams = start(
        &state,
        vec![with_chat(base, messages)],
        Api::Chat,
        grammar_param(&req.common),
    )
    .await?;
    let env = envelope(&state, Api::Chat, id, shape, vec![None]);
    Ok(respond(env, streams, &state).await)
}

fn envelope(
    state: &ApiState,
    api: Api,
    id: String,
    shape: Shape,
    echo: Vec<Option<String>>,
) -> Envelope {
    Envelope {
        api,
        id,
        created: now_secs(),
        model: state.shared.model_name.clone(),
        shape,
        echo,
    }
}

async fn respond(env: Envelope, streams: Vec<ResponseStream>, state: &ApiState) -> Response {
    let spell = TokenText(state.shared.text.clone());
    if env.shape.stream {
        streamed(env, streams, spell)
    } else {
        whole(env, streams, spell).await
    }
}

/// The text `echo` puts before a completion: the prompt as sent, or its ids decoded.
fn echo_text(state: &ApiState, prompt: &Prompt) -> String {
    match prompt {
        Prompt::Text(t) => t.clone(),
        Prompt::Ids(ids) => state
            .shared
            .text
            .as_ref()
            .and_then(|t| t.tokenizer.decode(ids, false).ok())
            .unwrap_or_default(),
    }
}

async fn models(State(state): State<Arc<ApiState>>) -> Result<Response, ApiError> {
    let s = &state.shared;
    let max_model_len = s.limits().ok().map(|l| l.max_model_len);
    Ok(axum::Json(json!({
        "object": "list",
        "data": [{
            "id": s.model_name, "object": "model", "created": now_secs(),
            "owned_by": "ringserve", "root": s.model_name, "parent": Value::Null,
            "max_model_len": max_model_len,
        }],
    }))
    .into_response())
}

/// `POST /tokenize` (vLLM's): `{"prompt": ...}` or `{"messages": [...]}`.
#[derive(Debug, Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    add_special_tokens: Option<bool>,
}

async fn tokenize(
    State(state): State<Arc<ApiState>>,
    raw: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeBody = parse(&body(raw)?)?;
    check_model(&state, req.model.as_deref())?;
    let input = match (req.prompt, req.messages) {
        (Some(text), None) => protos::v1::tokenize_request::Input::Text(text),
        (None, Some(messages)) => {
            protos::v1::tokenize_request::Input::Chat(chat_messages(&messages)?)
        }
        _ => {
            return Err(ApiError::bad_body(
                "send exactly one of \"prompt\" and \"messages\"",
            ));
        }
    };
    if req.add_special_tokens == Some(false) {
        return Err(ApiError::invalid(
            "add_special_tokens",
            "only true is supported (prompts are tokenized as /v1/completions does)",
        ));
    }
    // Tokenize names its input `input.*` where Generate says `prompt.*`.
    let to_openai = |f: &str| openai_param(&f.replacen("input", "prompt", 1), None, false);
    let prompt = validate::check_tokenize(protos::v1::TokenizeRequest { input: Some(input) })
        .map_err(|e| ApiError::invalid(to_openai(&e.field), e.message))?;
    let ids = state
        .shared
        .tokenize(prompt, "input")
        .await
        .map_err(|e| ApiError::from_start(e, to_openai))?;
    let max_model_len = state.shared.limits().ok().map(|l| l.max_model_len);
    Ok(axum::Json(json!({
        "count": ids.len(), "max_model_len": max_model_len, "tokens": ids,
    }))
    .into_response())
}

/// `POST /detokenize` (vLLM's): `{"tokens": [ids]}` → `{"prompt": text}`.
#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<u32>,
}

async fn detokenize(
    State(state): State<Arc<ApiState>>,
    raw: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeBody = parse(&body(raw)?)?;
    check_model(&state, req.model.as_deref())?;
    let text = state
        .shared
        .text
        .clone()
        .ok_or_else(|| ApiError::invalid("tokens", "this model has no tokenizer"))?;
    if let Ok(limits) = state.shared.limits()
        && let Some((i, id)) = req
            .tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id >= limits.vocab_size)
    {
        return Err(ApiError::invalid(
            format!("tokens[{i}]"),
            format!(
                "token id {id} is outside the vocabulary (size {})",
                limits.vocab_size
            ),
        ));
    }
    let decoded = tokio::task::spawn_blocking(move || text.tokenizer.decode(&req.tokens, false))
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?
        .map_err(|e| ApiError::invalid("tokens", e))?;
    Ok(axum::Json(json!({ "prompt": decoded })).into_response())
}

/// `GET /health`: 200 while a worker is ready and the server is not draining, else 503.
async fn health(State(state): State<Arc<ApiState>>) -> Response {
    let s = &state.shared;
    if s.is_draining() {
        ApiError::unavailable("the server is shutting down").into_response()
    } else if s.router.any().is_none() {
        ApiError::unavailable("no worker is ready").into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn version() -> Response {
    axum::Json(json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}

#[cfg(test)]
mod tests;
