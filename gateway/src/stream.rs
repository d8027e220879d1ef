//! One request's life after it is in a worker's ring: events from the reader thread in, detokenized
//! and stop-string-checked `GenerateResponse` messages out, until the request finishes, the client
//! goes away, or its deadline passes.
//!
//! When its worker dies the request is resumed on a live worker (see `failover` below): the prompt plus
//! every token already streamed, the remaining budget, and `prior_output_len` so penalties and the
//! seeded random stream continue where they were. The client sees one unbroken stream.
//!
//! Whenever the request ends early on the gateway's side (client gone, deadline, stop string), a
//! Cancel record goes to the worker so it frees the request's KV blocks at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protos::records::{ErrorCode, Finish};
use protos::v1::{FinishReason, GenerateResponse, TokenLogprob, TokenLogprobs, Usage};
use tokio::sync::mpsc;
use tonic::Status;

use crate::admission::Permit;
use crate::detok::Detokenizer;
use crate::link::{Event, WorkerLink};
use crate::metrics as m;
use crate::router::{PlaceError, Router};
use crate::stop::{StopMatcher, StopOutcome};
use crate::tokenizer::TextModel;
use crate::validate::ValidRequest;

/// Everything a request's task owns.
pub struct RequestTask {
    /// The gateway's id (the worker's request id).
    pub id: u64,
    /// Which of the request's `n` completions this is.
    pub index: u32,
    /// The client's id, echoed in responses.
    pub request_id: String,
    pub link: Arc<WorkerLink>,
    pub events: mpsc::Receiver<Event>,
    pub out: mpsc::Sender<Result<GenerateResponse, Status>>,
    pub permit: Permit,
    pub text: Option<Arc<TextModel>>,
    pub request: ValidRequest,
    pub arrived: Instant,
    pub deadline: Option<Instant>,
    /// Outstanding work this request added to its worker.
    pub work: i64,
    /// Where to find a live worker when this one dies.
    pub failover: Failover,
}

/// How a request whose worker died is resumed.
#[derive(Debug, Clone)]
pub struct Failover {
    /// Where live workers are found.
    pub router: Arc<Router>,
    /// How long to wait for a live worker before ending the stream with `UNAVAILABLE`.
    pub timeout: Duration,
}

/// How a request ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Length,
    Stop,
    StopString,
    ClientGone,
    Deadline,
    WorkerLost,
    WorkerError,
}

impl End {
    fn label(self) -> &'static str {
        match self {
            End::Length => "finished_length",
            End::Stop => "finished_stop",
            End::StopString => "finished_stop_string",
            End::ClientGone => "cancelled",
            End::Deadline => "deadline_exceeded",
            End::WorkerLost => "worker_lost",
            End::WorkerError => "worker_error",
        }
    }

    /// Whether the worker may still be running the request.
    fn needs_cancel(self) -> bool {
        matches!(self, End::StopString | End::ClientGone | End::Deadline)
    }
}

struct Progress {
    detok: Option<(Detokenizer, Arc<TextModel>)>,
    stop: StopMatcher,
    generated: u32,
    first_at: Option<Instant>,
    last_at: Instant,
    remaining_work: i64,
    prompt_len: usize,
    /// Every token id handed to the client so far (a resumed request's prior output).
    emitted: Vec<u32>,
}

/// Runs a request to its end.
pub async fn run_request(mut t: RequestTask) {
    let prompt_len = t.request.prompt.len();
    let mut p = Progress {
        detok: t.text.clone().map(|tm| {
            let skip = t.request.skip_special_tokens.then(|| tm.special.clone());
            (Detokenizer::new(&t.request.prompt, skip), tm)
        }),
        stop: StopMatcher::new(&t.request.stop),
        generated: 0,
        first_at: None,
        last_at: t.arrived,
        remaining_work: t.work,
        prompt_len,
        emitted: Vec::new(),
    };
    metrics::gauge!(m::IN_FLIGHT).increment(1.0);
    let end = drive(&mut t, &mut p).await;
    metrics::gauge!(m::IN_FLIGHT).decrement(1.0);
    t.link.unregister(t.id);
    t.link.add_outstanding(-p.remaining_work);
    if end.needs_cancel()
        && t.link.is_alive()
        && let Err(e) = t.link.cancel(t.id).await
    {
        tracing::debug!(id = t.id, error = %e, "cancel not delivered");
    }
    metrics::counter!(m::REQUESTS, "outcome" => end.label()).increment(1);
    metrics::histogram!(m::E2E).record(t.arrived.elapsed().as_secs_f64());
    tracing::debug!(
        request_id = t.request_id,
        outcome = end.label(),
        generated = p.generated,
        "request ended"
    );
}

async fn drive(t: &mut RequestTask, p: &mut Progress) -> End {
    let until = t.deadline;
    let deadline = async move {
        match until {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    loop {
        let first = tokio::select! {
            ev = t.events.recv() => ev,
            () = &mut deadline => {
                let _ = t.out.send(Err(Status::deadline_exceeded("deadline exceeded"))).await;
                return End::Deadline;
            }
            () = t.out.closed() => return End::ClientGone,
        };
        let first = match first {
            Some(ev) => ev,
            None if t.link.is_alive() => {
                let msg = "the worker sent more tokens than the request allows";
                let _ = t.out.send(Err(Status::unavailable(msg))).await;
                return End::WorkerLost;
            }
            None => match failover(t, p).await {
                Resumed::Yes => continue,
                Resumed::AllGenerated => Event {
                    tokens: Default::default(),
                    logprobs: Vec::new(),
                    finish: Finish::Length,
                    error: ErrorCode::None,
                },
                Resumed::No(status, end) => {
                    if let Some(status) = status {
                        let _ = t.out.send(Err(status)).await;
                    }
                    return end;
                }
            },
        };
        // Coalesce whatever else already arrived into one message, up to a bound that keeps a
        // message far below clients' decode limits (tonic's default is 4 MiB) even with logprobs.
        let mut tokens = first.tokens.len();
        let mut batch = vec![first];
        while tokens < MAX_TOKENS_PER_MESSAGE
            && batch.last().is_some_and(|e| e.finish == Finish::None)
        {
            match t.events.try_recv() {
                Ok(ev) => {
                    tokens += ev.tokens.len();
                    batch.push(ev);
                }
                Err(_) => break,
            }
        }
        let (msg, end) = match build(t, p, batch) {
            Ok(x) => x,
            Err((status, end)) => {
                let _ = t.out.send(Err(status)).await;
                return end;
            }
        };
        if let Some(msg) = msg
            && t.out.send(Ok(msg)).await.is_err()
        {
            return end.unwrap_or(End::ClientGone);
        }
        if let Some(end) = end {
            return end;
        }
    }
}

/// Coalescing stops once a message holds this many tokens. With 20 logprobs a token takes about
/// 200 bytes on the wire, so a message stays near 50 KB.
pub const MAX_TOKENS_PER_MESSAGE: usize = 256;

enum Resumed {
    /// Running on a live worker again.
    Yes,
    /// Every token of the budget was already streamed; only the finish was lost.
    AllGenerated,
    /// The stream ends (the status, if any, goes to the client).
    No(Option<Status>, End),
}

/// How often a request whose worker died looks for a live one.
const FAILOVER_POLL: Duration = Duration::from_millis(50);

/// Resubmits a request whose worker died to a live worker, waiting up to the failover timeout for
/// one: the prompt plus the tokens already streamed, the remaining budget, and
/// `prior_output_len` = the number of streamed tokens. The engine regenerates nothing the client
/// has seen (greedy continues identically, seeded sampling at the same index of its stream).
async fn failover(t: &mut RequestTask, p: &mut Progress) -> Resumed {
    // The dead worker's share of the outstanding work is gone with it.
    t.link.add_outstanding(-p.remaining_work);
    p.remaining_work = 0;
    let generated = p.emitted.len() as u32;
    if t.request.max_tokens <= generated {
        return Resumed::AllGenerated;
    }
    let submit = t.request.submit(t.id, &p.emitted);
    let give_up = Instant::now() + t.failover.timeout;
    loop {
        if t.out.is_closed() {
            return Resumed::No(None, End::ClientGone);
        }
        let now = Instant::now();
        if t.deadline.is_some_and(|d| now >= d) {
            let status = Status::deadline_exceeded("deadline exceeded");
            return Resumed::No(Some(status), End::Deadline);
        }
        if now >= give_up {
            let status = Status::unavailable(
                "the worker serving this request died and no worker became ready in time",
            );
            return Resumed::No(Some(status), End::WorkerLost);
        }
        let placed = match t.failover.router.place(&submit).await {
            Ok(placed) => placed,
            Err(PlaceError::NoWorker) => {
                tokio::time::sleep(FAILOVER_POLL).await;
                continue;
            }
            Err(e) => {
                tracing::debug!(id = t.id, error = %e, "resubmit failed");
                tokio::time::sleep(FAILOVER_POLL).await;
                continue;
            }
        };
        let link = placed.link;
        tracing::info!(
            request_id = t.request_id,
            from = t.link.slot,
            to = link.slot,
            streamed = generated,
            "request resumed on another worker"
        );
        metrics::counter!(m::RESUMED).increment(1);
        t.link = link;
        t.events = placed.events;
        p.remaining_work = placed.work;
        return Resumed::Yes;
    }
}

type Built = (Option<GenerateResponse>, Option<End>);

/// Turns a batch of events into one response message, and says whether the request ended.
fn build(t: &mut RequestTask, p: &mut Progress, batch: Vec<Event>) -> Result<Built, (Status, End)> {
    let now = Instant::now();
    let mut ids = Vec::with_capacity(batch.iter().map(|e| e.tokens.len()).sum());
    let mut logprobs = Vec::new();
    let mut finish = Finish::None;
    for ev in &batch {
        match ev.finish {
            Finish::Error => {
                let what = match ev.error {
                    ErrorCode::Rejected => "the worker rejected the request",
                    ErrorCode::CorruptRecord => "the request reached the worker corrupted",
                    ErrorCode::DuplicateId => "the worker already runs a request with this id",
                    ErrorCode::Engine | ErrorCode::None => "the worker failed",
                };
                return Err((Status::internal(what), End::WorkerError));
            }
            Finish::Cancelled => {
                return Err((
                    Status::cancelled("the request was cancelled"),
                    End::ClientGone,
                ));
            }
            f => finish = f,
        }
        ids.extend_from_slice(&ev.tokens);
        p.emitted.extend_from_slice(&ev.tokens);
        for (&tok, (lp, top)) in ev.tokens.iter().zip(&ev.logprobs) {
            logprobs.push(TokenLogprobs {
                token_id: tok,
                logprob: *lp,
                top: top
                    .iter()
                    .map(|&(token_id, logprob)| TokenLogprob { token_id, logprob })
                    .collect(),
            });
        }
    }
    let n = ids.len() as u32;
    if n > 0 {
        match p.first_at {
            None => {
                p.first_at = Some(now);
                t.permit.prefilled();
                metrics::histogram!(m::TTFT).record(now.duration_since(t.arrived).as_secs_f64());
                t.link.add_outstanding(-(p.prompt_len as i64));
                p.remaining_work -= p.prompt_len as i64;
            }
            Some(_) => {
                let gap = now.duration_since(p.last_at).as_secs_f64() / f64::from(n);
                // One registry lookup per batch, not per token.
                let itl = metrics::histogram!(m::ITL);
                for _ in 0..n {
                    itl.record(gap);
                }
            }
        }
        p.last_at = now;
        p.generated += n;
        t.link.add_outstanding(-i64::from(n));
        p.remaining_work -= i64::from(n);
        metrics::counter!(m::GENERATION_TOKENS).increment(u64::from(n));
    }
    let mut text = match &mut p.detok {
        Some((d, tm)) => d.push(&tm.tokenizer, &ids),
        None => String::new(),
    };
    let mut end = match finish {
        Finish::Length => Some(End::Length),
        Finish::Stop => Some(End::Stop),
        _ => None,
    };
    if end.is_some()
        && let Some((d, tm)) = &mut p.detok
    {
        text.push_str(&d.flush(&tm.tokenizer));
    }
    // Stop strings are looked for in the text after the first `min_tokens` tokens.
    if p.emitted.len() >= t.request.min_tokens as usize {
        match p.stop.push(&text) {
            StopOutcome::Continue(t) => text = t,
            StopOutcome::Stopped(t) => {
                text = t;
                end = Some(End::StopString);
            }
        }
    }
    if end.is_some() && end != Some(End::StopString) {
        text.push_str(&p.stop.flush());
    }
    let reason = match end {
        Some(End::Length) => FinishReason::Length,
        Some(_) => FinishReason::Stop,
        None => FinishReason::Unspecified,
    };
    if ids.is_empty() && text.is_empty() && end.is_none() {
        return Ok((None, None));
    }
    let usage = end.map(|_| Usage {
        prompt_tokens: p.prompt_len as u32,
        completion_tokens: p.generated,
    });
    let msg = GenerateResponse {
        request_id: t.request_id.clone(),
        token_ids: ids,
        text,
        logprobs,
        finish_reason: reason as i32,
        usage,
        index: t.index,
    };
    Ok((Some(msg), end))
}
