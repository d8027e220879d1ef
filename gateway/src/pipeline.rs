//! The request pipeline every front door shares: validate → tokenize → admit → place → stream.
//!
//! The gRPC service ([`crate::service`]) and the OpenAI-compatible HTTP API ([`crate::openai`]) are
//! thin adapters: each turns its request into a [`GenerateRequest`] and calls
//! [`Shared::generate`], so both get the same validation, limits, admission, routing, failover and
//! cancellation. [`Shared::generate`] writes each completion's Submit record into a worker's ring
//! and returns a stream fed by one task per completion (see [`crate::stream`]).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use grammar::GrammarSpec;
use protos::v1::{GenerateRequest, GenerateResponse};
use tokio_stream::StreamMap;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::admission::{Admission, Permit, Refused};
use crate::metrics as m;
use crate::router::{PlaceError, Router};
use crate::stream::{Failover, RequestTask, run_request};
use crate::tokenizer::TextModel;
use crate::validate::{self, InvalidArgument, ModelLimits, Prompt};

/// How often a request waiting for a ready worker looks for one.
const WORKER_POLL: Duration = Duration::from_millis(50);

/// Picks tried per request when the picked worker died or began draining meanwhile.
const MAX_ROUTE_ATTEMPTS: usize = 4;

/// A request did not start.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StartError {
    /// A field is invalid (the error names it).
    #[error(transparent)]
    Invalid(#[from] InvalidArgument),
    /// The server is at its admission limit; retry later.
    #[error(transparent)]
    Overloaded(#[from] Refused),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Draining,
    /// No worker is ready, or none took the request.
    #[error("{0}")]
    Unavailable(String),
    /// A fault inside the gateway.
    #[error("{0}")]
    Internal(String),
}

impl From<StartError> for Status {
    fn from(e: StartError) -> Self {
        match e {
            StartError::Invalid(e) => e.into(),
            StartError::Overloaded(e) => Status::resource_exhausted(e.to_string()),
            StartError::Draining | StartError::Unavailable(_) => Status::unavailable(e.to_string()),
            StartError::Internal(e) => Status::internal(e),
        }
    }
}

/// What every request handler shares.
#[derive(Debug)]
pub struct Shared {
    /// The model's name (`--served-model-name`).
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

fn outcome(label: &'static str) {
    metrics::counter!(m::REQUESTS, "outcome" => label).increment(1);
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

    /// Whether new requests are refused because shutdown began.
    pub fn is_draining(&self) -> bool {
        // Relaxed: a plain flag; a request racing the switch is drained like any in flight.
        self.draining.load(Ordering::Relaxed)
    }

    /// Waits until a worker is ready (every 50 ms), at most until `give_up`; then, or when the
    /// server starts shutting down, an error. Health says NOT_SERVING meanwhile.
    async fn wait_for_worker(&self, give_up: Instant) -> Result<(), StartError> {
        loop {
            if self.router.any().is_some() {
                return Ok(());
            }
            if self.is_draining() {
                return Err(StartError::Draining);
            }
            if Instant::now() >= give_up {
                return Err(StartError::Unavailable(format!(
                    "no worker became ready within {:.1} s (--failover-timeout)",
                    self.failover_timeout.as_secs_f64()
                )));
            }
            tokio::time::sleep(WORKER_POLL).await;
        }
    }

    /// The served model's vocabulary size and context length (from a ready worker).
    pub fn limits(&self) -> Result<ModelLimits, StartError> {
        let link = self
            .router
            .any()
            .ok_or_else(|| StartError::Unavailable("no worker is ready".into()))?;
        Ok(ModelLimits {
            vocab_size: link.info.vocab_size,
            max_model_len: link.info.max_model_len,
        })
    }

    /// Tokenizes a prompt on the blocking pool; errors name the field under `base` (`prompt` for
    /// `Generate`, `input` for `Tokenize`).
    pub async fn tokenize(&self, prompt: Prompt, base: &str) -> Result<Vec<u32>, StartError> {
        let field = match prompt {
            Prompt::Ids(ids) => return Ok(ids),
            Prompt::Text(_) => format!("{base}.text"),
            Prompt::Chat(_) => format!("{base}.chat"),
        };
        let text = self.text.clone().ok_or_else(|| {
            InvalidArgument::new(&field, "this model has no tokenizer; send token ids")
        })?;
        let encoded = tokio::task::spawn_blocking(move || match prompt {
            Prompt::Text(t) => text.encode_text(&t),
            Prompt::Chat(msgs) => text.encode_chat(&msgs),
            Prompt::Ids(ids) => Ok(ids),
        })
        .await
        .map_err(|e| StartError::Internal(format!("tokenizer task: {e}")))?;
        Ok(encoded.map_err(|e| InvalidArgument::new(field, e))?)
    }

    /// Compiles a request's grammar on the blocking pool, to refuse one that cannot run.
    async fn check_grammar(&self, spec: &GrammarSpec) -> Result<(), StartError> {
        let text = self.text.clone().ok_or_else(|| {
            InvalidArgument::new(
                "structured_output",
                "this model has no tokenizer.json, which structured output needs",
            )
        })?;
        let spec = spec.clone();
        let compiled = tokio::task::spawn_blocking(move || {
            text.grammar.get().and_then(|c| c.compile(&spec)).map(drop)
        })
        .await
        .map_err(|e| StartError::Internal(format!("grammar task: {e}")))?;
        Ok(compiled.map_err(|e| InvalidArgument::new("structured_output", e.to_string()))?)
    }

    /// Starts a request: validates it, tokenizes its prompt once, admits it (once, whatever its
    /// `n`), places each of its `n` completions, and returns their merged stream. `deadline` (the call's, if any) ends the
    /// streams with `DEADLINE_EXCEEDED` and cancels the work.
    pub async fn generate(
        &self,
        request: GenerateRequest,
        deadline: Option<Instant>,
    ) -> Result<ResponseStream, StartError> {
        let arrived = Instant::now();
        if self.is_draining() {
            outcome("refused_draining");
            return Err(StartError::Draining);
        }
        let checked =
            validate::check(request, rand::random()).inspect_err(|_| outcome("invalid"))?;
        // With no worker ready (all dead, restarting), wait up to the failover timeout (or the
        // call's deadline) for one rather than failing at once.
        let give_up = deadline.map_or(arrived + self.failover_timeout, |d| {
            d.min(arrived + self.failover_timeout)
        });
        self.wait_for_worker(give_up)
            .await
            .inspect_err(|_| outcome("no_worker"))?;
        if let Some(spec) = &checked.grammar {
            self.check_grammar(spec)
                .await
                .inspect_err(|_| outcome("invalid"))?;
        }
        let limits = self.limits()?;
        let n = checked.n;
        let prompt = self
            .tokenize(checked.prompt.clone(), "prompt")
            .await
            .inspect_err(|_| outcome("invalid"))?;
        let valid =
            validate::finish(checked, prompt, limits).inspect_err(|_| outcome("invalid"))?;
        // One admission for the request, whatever its `n`: each completion holds a share.
        let permit = self
            .admission
            .try_admit(valid.prompt.len())
            .inspect_err(|_| outcome("rejected_overload"))?;
        let mut streams = StreamMap::with_capacity(n as usize);
        for index in 0..n {
            let mut child = valid.clone();
            child.sampling.seed = valid.sampling.seed.wrapping_add(u64::from(index));
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let request_id = if child.request_id.is_empty() {
                format!("req-{id}")
            } else {
                child.request_id.clone()
            };
            let submit = child.submit(id, &[]);
            // A worker may die or start draining between the pick and the Submit: place again.
            let mut attempt = 0;
            let placed = loop {
                match self.router.place(&submit).await {
                    Ok(placed) => break placed,
                    Err(PlaceError::NoWorker) => self
                        .wait_for_worker(give_up)
                        .await
                        .inspect_err(|_| outcome("no_worker"))?,
                    Err(e) if attempt >= MAX_ROUTE_ATTEMPTS => {
                        outcome("worker_unavailable");
                        return Err(StartError::Unavailable(e.to_string()));
                    }
                    Err(_) => attempt += 1,
                }
            };
            let prompt_len = child.prompt.len();
            metrics::histogram!(m::QUEUE).record(arrived.elapsed().as_secs_f64());
            metrics::counter!(m::PROMPT_TOKENS).increment(prompt_len as u64);
            tracing::debug!(
                request_id,
                id,
                index,
                worker = placed.link.slot,
                prompt_len,
                "submitted"
            );
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            streams.insert(index, ReceiverStream::new(rx));
            let task = RequestTask {
                id,
                index,
                request_id,
                link: placed.link,
                events: placed.events,
                out: tx,
                permit: permit.share(),
                text: self.text.clone(),
                request: child,
                arrived,
                deadline,
                work: placed.work,
                failover: Failover {
                    router: self.router.clone(),
                    timeout: self.failover_timeout,
                },
            };
            tokio::spawn(run_request(task));
        }
        Ok(ResponseStream {
            prompt_tokens: valid.prompt.len(),
            messages: streams,
            _permit: permit,
        })
    }
}

/// The merged stream of a request's completions (each message's `index` says whose). It holds a
/// share of the request's admission, so tokens buffered for a client that has not read them yet
/// still count as in flight. Dropping it cancels every completion still running.
pub struct ResponseStream {
    /// Tokens of the request's prompt (as tokenized).
    pub prompt_tokens: usize,
    messages: StreamMap<u32, ReceiverStream<Result<GenerateResponse, Status>>>,
    _permit: Permit,
}

impl tokio_stream::Stream for ResponseStream {
    type Item = Result<GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.messages)
            .poll_next(cx)
            .map(|item| item.map(|(_, msg)| msg))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.messages.size_hint()
    }
}
