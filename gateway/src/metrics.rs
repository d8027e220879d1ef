//! Prometheus metrics: names, registration, and the `/metrics` HTTP endpoint.
//!
//! Metrics are recorded through the `metrics` crate facade; [`install`] installs the Prometheus
//! recorder (histograms with explicit buckets) and [`serve_metrics`] answers `GET /metrics` on a
//! listener the caller bound (so port 0 works in tests).

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Time from a request's arrival to its first streamed token (histogram, seconds).
pub const TTFT: &str = "ringserve_time_to_first_token_seconds";
/// Time between consecutive streamed tokens of a request (histogram, seconds).
pub const ITL: &str = "ringserve_inter_token_latency_seconds";
/// Time from arrival to the last message (histogram, seconds).
pub const E2E: &str = "ringserve_e2e_request_latency_seconds";
/// Time from arrival until the request's Submit record is in the worker's ring (histogram, seconds).
pub const QUEUE: &str = "ringserve_request_queue_time_seconds";
/// Prompt tokens of admitted requests (counter).
pub const PROMPT_TOKENS: &str = "ringserve_prompt_tokens_total";
/// Generated tokens streamed (counter).
pub const GENERATION_TOKENS: &str = "ringserve_generation_tokens_total";
/// Requests by outcome (counter, label `outcome`).
pub const REQUESTS: &str = "ringserve_requests_total";
/// Requests admitted and not finished (gauge).
pub const IN_FLIGHT: &str = "ringserve_requests_in_flight";
/// Sequences running in the workers' engines (gauge, label `worker`).
pub const RUNNING: &str = "ringserve_num_requests_running";
/// Sequences waiting in the workers' engines (gauge, label `worker`).
pub const WAITING: &str = "ringserve_num_requests_waiting";
/// KV blocks in use (gauge, label `worker`).
pub const KV_USED: &str = "ringserve_kv_blocks_used";
/// KV blocks managed (gauge, label `worker`).
pub const KV_TOTAL: &str = "ringserve_kv_blocks_total";
/// Bytes published and not yet consumed in a ring (gauge, labels `worker`, `ring`).
pub const RING_OCCUPANCY: &str = "ringserve_ring_occupancy_bytes";
/// Engine steps that waited for room in the response ring (gauge of the worker's counter).
pub const RESPONSE_STALLS: &str = "ringserve_response_ring_stalls";
/// Live workers (gauge).
pub const WORKERS_LIVE: &str = "ringserve_workers_live";
/// Worker restarts (counter).
pub const WORKER_RESTARTS: &str = "ringserve_worker_restarts_total";
/// Requests resumed on another worker after theirs died (counter).
pub const RESUMED: &str = "ringserve_requests_resumed_total";
/// Requests routed to the worker that holds their prompt prefix (counter).
pub const AFFINITY_HITS: &str = "ringserve_prefix_affinity_hits_total";
/// Requests (and resumed requests) routed to each worker (counter, label `worker`).
pub const ROUTED: &str = "ringserve_worker_requests_routed_total";
/// Workers found hung: alive but with a stale heartbeat (counter).
pub const WORKERS_HUNG: &str = "ringserve_workers_hung_total";
/// Workers that joined at run time (counter).
pub const WORKERS_JOINED: &str = "ringserve_workers_joined_total";
/// Join registrations refused (counter).
pub const JOINS_REFUSED: &str = "ringserve_join_refused_total";
/// Workers that drained and left (counter).
pub const WORKERS_DRAINED: &str = "ringserve_workers_drained_total";
/// Calls refused for a missing or wrong API key (counter).
pub const AUTH_FAILURES: &str = "ringserve_auth_failures_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Installs the global Prometheus recorder and describes the metrics.
pub fn install() -> Result<PrometheusHandle, String> {
    let builder = PrometheusBuilder::new();
    let builder = [TTFT, ITL, E2E, QUEUE]
        .into_iter()
        .try_fold(builder, |b, name| {
            b.set_buckets_for_metric(Matcher::Full(name.to_owned()), LATENCY_BUCKETS)
        })
        .map_err(|e| e.to_string())?;
    let handle = builder.install_recorder().map_err(|e| e.to_string())?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        RESUMED,
        "Requests resumed on another worker after theirs died"
    );
    describe_histogram!(TTFT, Unit::Seconds, "Time to first token");
    describe_histogram!(ITL, Unit::Seconds, "Inter-token latency");
    describe_histogram!(E2E, Unit::Seconds, "End-to-end request latency");
    describe_histogram!(
        QUEUE,
        Unit::Seconds,
        "Time from arrival to the request being in a worker's ring"
    );
    describe_counter!(PROMPT_TOKENS, "Prompt tokens of admitted requests");
    describe_counter!(GENERATION_TOKENS, "Generated tokens streamed");
    describe_counter!(REQUESTS, "Requests by outcome");
    describe_gauge!(IN_FLIGHT, "Requests admitted and not finished");
    describe_gauge!(RUNNING, "Sequences running in the engine");
    describe_gauge!(WAITING, "Sequences waiting in the engine");
    describe_gauge!(KV_USED, "KV cache blocks in use");
    describe_gauge!(KV_TOTAL, "KV cache blocks managed");
    describe_gauge!(RING_OCCUPANCY, Unit::Bytes, "Ring bytes not yet consumed");
    describe_gauge!(
        RESPONSE_STALLS,
        "Engine steps that waited for room in the response ring"
    );
    describe_gauge!(WORKERS_LIVE, "Live worker processes");
    describe_counter!(WORKER_RESTARTS, "Worker processes restarted");
    describe_counter!(
        AFFINITY_HITS,
        "Requests routed to the worker holding their prompt prefix"
    );
    describe_counter!(ROUTED, "Requests routed to each worker");
    describe_counter!(WORKERS_HUNG, "Workers found hung (stale heartbeat)");
    describe_counter!(WORKERS_JOINED, "Workers that joined at run time");
    describe_counter!(JOINS_REFUSED, "Join registrations refused");
    describe_counter!(WORKERS_DRAINED, "Workers that drained and left");
}

/// How often histogram samples are folded into their buckets when nobody scrapes.
pub const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds recorded histogram samples into their buckets every [`UPKEEP_INTERVAL`]. The recorder
/// buffers every sample (one per streamed token for the inter-token latency) until it is drained,
/// which otherwise happens only when `/metrics` is scraped: a server nobody scrapes would hold
/// every sample it ever recorded.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        tick.tick().await;
        handle.run_upkeep();
    }
}

/// Answers every HTTP request on `listener` with the rendered metrics, and runs the recorder's
/// [`upkeep`] (until the task is dropped).
pub async fn serve_metrics(listener: TcpListener, handle: PrometheusHandle) {
    let upkeep = upkeep(handle.clone());
    tokio::pin!(upkeep);
    loop {
        let accepted = tokio::select! {
            () = &mut upkeep => continue,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut sock, _)) = accepted else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            // One read is enough for a scrape's request line; the body is ignored.
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics") || head.starts_with("GET / ") {
                ("200 OK", handle.render())
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(response.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
