//! End to end, a worker hangs and nothing is lost: with `serve --workers 2` on the CPU and the
//! tiny-llama fixture, 24 concurrent greedy streams run while one worker is SIGSTOPped mid-stream.
//! Its process lives but its heartbeat stops, so the gateway declares it hung, every one of its
//! streams resumes on the other worker with exactly the tokens of an undisturbed run, and the
//! supervisor SIGKILLs the stopped process and starts a new one.
//!
//! No timing is asserted: the test waits for events (tokens, the replacement's ready line), and a
//! worker busy computing keeps beating (its heartbeat thread), so on a loaded machine the only
//! worker declared hung is the stopped one.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Server, greedy_ids, ids_of, runtime, signal, tiny_llama};
use protos::v1::FinishReason;

const STREAMS: usize = 24;
// Long enough that when stream 0 has at most a quarter of its tokens, no stream is finished
// (a client reading one stream slowly on a loaded machine lags the others by far less).
const MAX_TOKENS: u32 = 200;

fn prompt(i: usize) -> Vec<u32> {
    (0..3 + i % 7)
        .map(|j| 1 + ((i * 53 + j * 17) % 500) as u32)
        .collect()
}

/// Runs every stream; once stream 0 has `stop_after` tokens, SIGSTOPs `victim`. Returns each
/// stream's ids and finish reason.
async fn run_all(server: &Server, stop: Option<(u32, usize)>) -> Vec<(Vec<u32>, i32)> {
    let stopped = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        let mut client = server.client().await;
        let stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = client
                .generate(greedy_ids(&prompt(i), MAX_TOKENS))
                .await
                .unwrap()
                .into_inner();
            let mut msgs = Vec::new();
            while let Some(msg) = stream.message().await.expect("the stream survives") {
                msgs.push(msg);
                if let Some((pid, after)) = stop
                    && i == 0
                    && ids_of(&msgs).len() >= after
                    && !stopped.swap(true, Ordering::SeqCst)
                {
                    signal(pid, "STOP");
                }
            }
            let finish = msgs.last().map(|m| m.finish_reason).unwrap_or_default();
            (ids_of(&msgs), finish)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[test]
fn a_sigstopped_worker_is_declared_hung_replaced_and_loses_no_token() {
    let model = tiny_llama();
    let mut server = Server::start(&["--model", model.to_str().unwrap(), "--workers", "2"], 2);
    let rt = runtime();
    let pids_before = server.worker_pids.clone();
    let want = rt.block_on(run_all(&server, None));
    for (ids, finish) in &want {
        assert_eq!(ids.len(), MAX_TOKENS as usize);
        assert_eq!(*finish, FinishReason::Length as i32);
    }
    // Busy but healthy: the undisturbed run declared no worker hung and restarted none.
    assert_eq!(server.metric("ringserve_workers_hung_total"), None);
    assert_eq!(server.worker_pids, pids_before);

    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let victim = nanos % 2;
    let pid = server.worker_pids[victim];
    let after = 1 + nanos / 7 % (MAX_TOKENS as usize / 4);
    eprintln!("SIGSTOP worker {victim} (pid {pid}) after {after} tokens");
    let got = rt.block_on(run_all(&server, Some((pid, after))));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "stream {i}");
    }
    // The stopped worker was killed (a stopped process cannot exit by itself) and replaced.
    let (slot, new_pid) = server.wait_worker_ready(Duration::from_secs(120));
    assert_eq!(slot, victim);
    assert_ne!(new_pid, pid);
    let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z"));
    assert!(gone, "the hung worker {pid} was not killed");
    assert!(server.metric("ringserve_workers_hung_total").unwrap_or(0.0) >= 1.0);
    // Its streams were cut mid-way and resumed (all streams advance together, so when stream 0
    // has `after` <= MAX_TOKENS / 4 tokens every stream is unfinished).
    assert!(
        server
            .metric("ringserve_requests_resumed_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    // The replacement serves.
    let again = rt.block_on(run_all(&server, None));
    assert_eq!(again, want);
}
