//! End to end, no worker alive: while the only worker cannot come back (its model file is gone, so
//! every restart fails), health says NOT_SERVING and a new request waits up to `--failover-timeout`
//! for a ready worker, then ends with UNAVAILABLE; once the worker can start again, a waiting
//! request is served by it. And while the only worker drains, health says NOT_SERVING.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Server, collect, greedy_ids, ids_of, runtime, signal, tiny_llama, wait_health};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

/// A copy of the tiny-llama fixture whose weights the test can take away and give back.
fn model_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(tiny_llama()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

fn weights(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    (
        dir.join("model.safetensors"),
        dir.join("model.safetensors.away"),
    )
}

/// Kills the only worker with its weights gone: no restart can succeed.
fn kill_for_good(server: &Server, dir: &Path) {
    let (present, away) = weights(dir);
    std::fs::rename(&present, &away).unwrap();
    signal(server.worker_pids[0], "KILL");
}

#[test]
fn with_no_worker_a_request_waits_for_the_failover_timeout_then_is_unavailable() {
    let dir = model_copy();
    let server = Server::start(
        &[
            "--model",
            dir.path().to_str().unwrap(),
            "--failover-timeout",
            "1",
        ],
        1,
    );
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        assert_eq!(
            ids_of(
                &collect(&mut client, greedy_ids(&[1, 2, 3], 4))
                    .await
                    .unwrap()
            )
            .len(),
            4
        );
        kill_for_good(&server, dir.path());
        wait_health(&server, ServingStatus::NotServing, Duration::from_secs(60)).await;
        let asked = Instant::now();
        let err = collect(&mut client, greedy_ids(&[1, 2, 3], 4))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(err.message().contains("no worker became ready"), "{err:?}");
        // It waited for a worker first (a lower bound, not a speed check).
        assert!(asked.elapsed() >= Duration::from_millis(900));
    });
}

#[test]
fn a_request_waiting_for_a_worker_is_served_once_one_is_ready() {
    let dir = model_copy();
    let mut server = Server::start(
        &[
            "--model",
            dir.path().to_str().unwrap(),
            "--failover-timeout",
            "120",
        ],
        1,
    );
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let want = ids_of(
            &collect(&mut client, greedy_ids(&[5, 6, 7], 8))
                .await
                .unwrap(),
        );
        assert_eq!(want.len(), 8);
        let old = server.worker_pids[0];
        kill_for_good(&server, dir.path());
        wait_health(&server, ServingStatus::NotServing, Duration::from_secs(60)).await;
        let waiting = tokio::spawn(async move {
            collect(&mut client, greedy_ids(&[5, 6, 7], 8))
                .await
                .map(|m| ids_of(&m))
        });
        // The request is waiting: no worker can be ready while the weights are away.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished());
        let (present, away) = weights(dir.path());
        std::fs::rename(&away, &present).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), want);
        wait_health(&server, ServingStatus::Serving, Duration::from_secs(60)).await;
        let (_, new) = server.wait_worker_ready(Duration::from_secs(120));
        assert_ne!(new, old);
    });
}

#[test]
fn health_is_not_serving_while_the_only_worker_drains_and_serving_once_replaced() {
    let model = tiny_llama();
    let mut server = Server::start(
        &[
            "--model",
            model.to_str().unwrap(),
            "--device",
            "null",
            "--max-model-len",
            "200000",
            "--num-kv-blocks",
            "20000",
        ],
        1,
    );
    let old = server.worker_pids[0];
    let rt = runtime();
    rt.block_on(async {
        wait_health(&server, ServingStatus::Serving, Duration::from_secs(60)).await;
        let mut client = server.client().await;
        // A long stream keeps the worker draining for a while after SIGTERM.
        let mut stream = client
            .generate(greedy_ids(&[1, 2, 3], 190_000))
            .await
            .unwrap()
            .into_inner();
        let mut n = stream.message().await.unwrap().unwrap().token_ids.len();
        signal(old, "TERM");
        // It takes no new requests while it drains: nothing does, so the server is not serving.
        wait_health(&server, ServingStatus::NotServing, Duration::from_secs(60)).await;
        // ... while it is still alive: its request is unfinished until this client reads it all
        // (the gateway holds at most a few dozen messages of it), so it cannot have left yet.
        let stat = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
        assert!(
            !stat.is_empty() && !stat.contains(") Z"),
            "the draining worker is still running: {stat:?}"
        );
        while let Some(m) = stream.message().await.unwrap() {
            n += m.token_ids.len();
        }
        assert_eq!(n, 190_000, "the draining worker finished its stream");
    });
    let (_, new) = server.wait_worker_ready(Duration::from_secs(120));
    assert_ne!(new, old);
    rt.block_on(wait_health(
        &server,
        ServingStatus::Serving,
        Duration::from_secs(60),
    ));
}
