//! The `ringserve.v1.Inference` tonic service.
//!
//! `Generate` validates the request, tokenizes it on the blocking pool, admits it, routes it to a
//! worker, writes its Submit record into that worker's ring, and returns a stream fed by a
//! per-request task (see [`crate::stream`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use protos::v1::inference_server::Inference;
use protos::v1::{
    GenerateRequest, GenerateResponse, ModelInfoRequest, ModelInfoResponse, TokenizeRequest,
    TokenizeResponse,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::admission::{Admission, Permit};
use crate::metrics as m;
use crate::router::{PlaceError, Router};
use crate::stream::{Failover, RequestTask, run_request};
use crate::tokenizer::TextModel;
use crate::validate::{self, ModelLimits, Prompt};

/// How often a request waiting for a ready worker looks for one.
const WORKER_POLL: Duration = Duration::from_millis(50);

/// Picks tried per request when the picked worker died or began draining meanwhile.
const MAX_ROUTE_ATTEMPTS: usize = 4;

/// What every request handler shares.
#[derive(Debug)]
pub struct Shared {
    /// The model's name (its folder name).
    pub model_name: String,
    /// End-of-sequence ids from the model's config.
    pub eos_token_ids: Vec<u32>,
    /// Tokenizer and chat template, when the model has them.
    pub text: Option<Arc<TextModel>>,
    pub router: Arc<Router>,
    pub admission: Admission,
    /// Set when shutdown begins: new requests are refused.
    pub draining: AtomicBool,
    /// How long a request whose worker died waits for a live worker to resume on.
    pub failover_timeout: Duration,
    next_id: AtomicU64,
}

impl Shared {
    /// Shared state for a model.
    pub fn new(
        model_name: String,
        eos_token_ids: Vec<u32>,
        text: Option<Arc<TextModel>>,
        router: Router,
        admission: Admission,
        failover_timeout: Duration,
    ) -> Self {
        Self {
            failover_timeout,
            model_name,
            eos_token_ids,
            text,
            router: Arc::new(router),
            admission,
            draining: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
        }
    }

    /// Waits until a worker is ready (every 50 ms), at most until `give_up`; then, or when the
    /// server starts shutting down, `UNAVAILABLE`. Health says NOT_SERVING meanwhile.
    async fn wait_for_worker(&self, give_up: Instant) -> Result<(), Status> {
        loop {
            if self.router.any().is_some() {
                return Ok(());
            }
            // Relaxed: a plain flag.
            if self.draining.load(Ordering::Relaxed) {
                return Err(Status::unavailable("the server is shutting down"));
            }
            if Instant::now() >= give_up {
                return Err(Status::unavailable(format!(
                    "no worker became ready within {:.1} s (--failover-timeout)",
                    self.failover_timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep(WORKER_POLL).await;
        }
    }

    fn limits(&self) -> Result<ModelLimits, Status> {
        let link = self
            .router
            .any()
            .ok_or_else(|| Status::unavailable("no worker is ready"))?;
        Ok(ModelLimits {
            vocab_size: link.info.vocab_size,
            max_model_len: link.info.max_model_len,
        })
    }
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct InferenceService {
    shared: Arc<Shared>,
}

impl InferenceService {
    /// A service over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn outcome(label: &'static str) {
    metrics::counter!(m::REQUESTS, "outcome" => label).increment(1);
}

/// Tokenizes a prompt on the blocking pool; errors name the field under `base` (`prompt` for
/// `Generate`, `input` for `Tokenize`).
async fn tokenize(
    text: Option<Arc<TextModel>>,
    prompt: Prompt,
    base: &str,
) -> Result<Vec<u32>, Status> {
    let field = match prompt {
        Prompt::Ids(ids) => return Ok(ids),
        Prompt::Text(_) => format!("{base}.text"),
        Prompt::Chat(_) => format!("{base}.chat"),
    };
    let text = text.ok_or_else(|| {
        Status::invalid_argument(format!(
            "{field}: this model has no tokenizer; send token ids"
        ))
    })?;
    tokio::task::spawn_blocking(move || match prompt {
        Prompt::Text(t) => text.encode_text(&t),
        Prompt::Chat(msgs) => text.encode_chat(&msgs),
        Prompt::Ids(ids) => Ok(ids),
    })
    .await
    .map_err(|e| Status::internal(format!("tokenizer task: {e}")))?
    .map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

/// The deadline a client set with `grpc-timeout`, if any.
fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + d)
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let deadline = deadline_of(&request);
        let s = &self.shared;
        // Relaxed: a plain flag; a request racing the switch is drained like any in flight.
        if s.draining.load(Ordering::Relaxed) {
            outcome("refused_draining");
            return Err(Status::unavailable("the server is shutting down"));
        }
        let checked = validate::check(request.into_inner(), rand::random()).inspect_err(|_| {
            outcome("invalid");
        })?;
        // With no worker ready (all dead, restarting), wait up to the failover timeout (or the
        // call's deadline) for one rather than failing at once.
        let give_up = deadline.map_or(arrived + s.failover_timeout, |d| {
            d.min(arrived + s.failover_timeout)
        });
        s.wait_for_worker(give_up)
            .await
            .inspect_err(|_| outcome("no_worker"))?;
        let limits = s.limits()?;
        let prompt = tokenize(s.text.clone(), checked.prompt.clone(), "prompt")
            .await
            .inspect_err(|_| outcome("invalid"))?;
        let valid =
            validate::finish(checked, prompt, limits).inspect_err(|_| outcome("invalid"))?;
        let permit = s.admission.try_admit(valid.prompt.len()).map_err(|e| {
            outcome("rejected_overload");
            Status::resource_exhausted(e.to_string())
        })?;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = if valid.request_id.is_empty() {
            format!("req-{id}")
        } else {
            valid.request_id.clone()
        };
        let submit = valid.submit(id, &[]);
        // A worker may die or start draining between the pick and the Submit: place again.
        let mut attempt = 0;
        let placed = loop {
            match s.router.place(&submit).await {
                Ok(placed) => break placed,
                Err(PlaceError::NoWorker) => s
                    .wait_for_worker(give_up)
                    .await
                    .inspect_err(|_| outcome("no_worker"))?,
                Err(e) if attempt >= MAX_ROUTE_ATTEMPTS => {
                    outcome("worker_unavailable");
                    return Err(Status::unavailable(e.to_string()));
                }
                Err(_) => attempt += 1,
            }
        };
        let prompt_len = valid.prompt.len();
        metrics::histogram!(m::QUEUE).record(arrived.elapsed().as_secs_f64());
        metrics::counter!(m::PROMPT_TOKENS).increment(prompt_len as u64);
        tracing::debug!(
            request_id,
            id,
            worker = placed.link.slot,
            prompt_len,
            "submitted"
        );
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let stream = ResponseStream {
            messages: ReceiverStream::new(rx),
            _permit: permit.share(),
        };
        let task = RequestTask {
            id,
            request_id,
            link: placed.link,
            events: placed.events,
            out: tx,
            permit,
            text: s.text.clone(),
            request: valid,
            arrived,
            deadline,
            work: placed.work,
            failover: Failover {
                router: s.router.clone(),
                timeout: s.failover_timeout,
            },
        };
        tokio::spawn(run_request(task));
        Ok(Response::new(stream))
    }

    async fn tokenize(
        &self,
        request: Request<TokenizeRequest>,
    ) -> Result<Response<TokenizeResponse>, Status> {
        let prompt = validate::check_tokenize(request.into_inner())?;
        let ids = tokenize(self.shared.text.clone(), prompt, "input").await?;
        let tokens = self
            .shared
            .text
            .as_ref()
            .map(|t| t.token_strings(&ids))
            .unwrap_or_default();
        Ok(Response::new(TokenizeResponse {
            token_ids: ids,
            tokens,
        }))
    }

    async fn model_info(
        &self,
        _request: Request<ModelInfoRequest>,
    ) -> Result<Response<ModelInfoResponse>, Status> {
        let s = &self.shared;
        let limits = s.limits()?;
        Ok(Response::new(ModelInfoResponse {
            model_name: s.model_name.clone(),
            max_model_len: limits.max_model_len,
            vocab_size: limits.vocab_size,
            eos_token_ids: s.eos_token_ids.clone(),
            has_tokenizer: s.text.is_some(),
            has_chat_template: s.text.as_ref().is_some_and(|t| t.chat.is_some()),
        }))
    }
}

/// A `Generate` response stream. It holds a share of the request's admission, so a request whose
/// tokens are buffered for a client that has not read them yet still counts as in flight.
pub struct ResponseStream {
    messages: ReceiverStream<Result<GenerateResponse, Status>>,
    _permit: Permit,
}

impl tokio_stream::Stream for ResponseStream {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.messages).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.messages.size_hint()
    }
}
