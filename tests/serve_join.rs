//! End to end, workers join a running gateway and leave it by draining.
//!
//! - `ringserve worker --join NAME` registers with `serve --name NAME`: it gets a slot and rings,
//!   receives traffic (its slot's routed-requests counter rises and its streams are exact), a bad
//!   registration gets an error line without disturbing the gateway, and when the joined worker is
//!   SIGKILLed its streams resume elsewhere and it is not restarted.
//! - SIGTERM to a joined worker drains it: it tells the gateway, new requests go elsewhere, its
//!   in-flight streams finish on it (none is resumed), it exits 0, and its rings are unlinked.
//!
//! Each test uses its own runtime folder (`RINGSERVE_RUNTIME_DIR`) so names never collide.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Server, collect, greedy_ids, ids_of, runtime, signal, tiny_llama};
use protos::v1::FinishReason;

/// A worker joining gateway `name`, with `args` after `worker --model FIXTURE`.
fn join_worker(name: &str, runtime_dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .env("RINGSERVE_RUNTIME_DIR", runtime_dir)
        .args(["worker", "--model", tiny_llama().to_str().unwrap()])
        .args(args)
        .args(["--join", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawning ringserve worker --join")
}

/// The value of `name{worker="slot"}` in the metrics, 0 when absent.
fn per_worker(server: &Server, name: &str, slot: usize) -> f64 {
    let key = format!("{name}{{worker=\"{slot}\"}} ");
    server
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&key).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Kills a child left running by a failed assertion.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn prompt(i: usize) -> Vec<u32> {
    (0..4 + i % 6)
        .map(|j| 1 + ((i * 31 + j * 13) % 500) as u32)
        .collect()
}

/// Runs `n` concurrent greedy streams; when stream 0 has `kill_after` tokens, SIGKILLs `pid`.
async fn run_all(server: &Server, n: usize, max: u32, kill: Option<(u32, usize)>) -> Vec<Vec<u32>> {
    let killed = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut client = server.client().await;
        let killed = killed.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = client
                .generate(greedy_ids(&prompt(i), max))
                .await
                .unwrap()
                .into_inner();
            let mut msgs = Vec::new();
            while let Some(msg) = stream.message().await.expect("the stream survives") {
                msgs.push(msg);
                if let Some((pid, after)) = kill
                    && i == 0
                    && ids_of(&msgs).len() >= after
                    && !killed.swap(true, Ordering::SeqCst)
                {
                    signal(pid, "KILL");
                }
            }
            assert_eq!(
                msgs.last().unwrap().finish_reason,
                FinishReason::Length as i32
            );
            ids_of(&msgs)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[test]
fn a_worker_joined_at_run_time_serves_and_fails_over_when_it_dies() {
    let dir = tempfile::tempdir().unwrap();
    let name = "join-test-serves";
    let model = tiny_llama();
    let mut server = Server::start_with_env(
        &[
            "--model",
            model.to_str().unwrap(),
            "--workers",
            "1",
            "--name",
            name,
        ],
        1,
        &[("RINGSERVE_RUNTIME_DIR", dir.path())],
    );
    let rt = runtime();
    let want = rt.block_on(run_all(&server, 16, 32, None));

    // A bad registration is refused with a reason; the gateway goes on.
    let sock = dir.path().join(format!("{name}.sock"));
    let meta = std::fs::metadata(&sock).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(b"ringserve-join 1 wire=3 pid=1\n").unwrap();
    let mut reply = String::new();
    BufReader::new(&mut s).read_line(&mut reply).unwrap();
    assert!(reply.starts_with("error "), "{reply:?}");
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.write_all(&[0xff; 600]).unwrap();
    let mut reply = String::new();
    BufReader::new(&mut s).read_line(&mut reply).unwrap();
    assert!(reply.starts_with("error "), "{reply:?}");
    assert!(server.metric("ringserve_join_refused_total").unwrap_or(0.0) >= 2.0);

    // A real worker joins and takes slot 1.
    let joined = Reap(join_worker(name, dir.path(), &[]));
    let pid = joined.0.id();
    let line = server
        .wait_line(
            |l| l.starts_with("worker 1 ready"),
            Duration::from_secs(120),
        )
        .expect("the worker joined");
    assert_eq!(line, format!("worker 1 ready pid={pid} joined"));
    let before = per_worker(&server, "ringserve_worker_requests_routed_total", 1);
    let got = rt.block_on(run_all(&server, 16, 32, None));
    assert_eq!(got, want);
    let after = per_worker(&server, "ringserve_worker_requests_routed_total", 1);
    assert!(after > before, "the joined worker got no request");
    assert!(per_worker(&server, "ringserve_kv_blocks_total", 1) > 0.0);

    // It dies mid-stream: its streams resume on the supervised worker; it is not restarted.
    let got = rt.block_on(run_all(&server, 16, 32, Some((pid, 4))));
    assert_eq!(got, want);
    server
        .wait_line(|l| l.starts_with("worker 1 left"), Duration::from_secs(60))
        .expect("the joined worker was removed");
    drop(joined);
    let got = rt.block_on(run_all(&server, 4, 32, None));
    assert_eq!(got[..], want[..4]);
    assert!(
        server
            .wait_line(|l| l.starts_with("worker 1 ready"), Duration::from_secs(2))
            .is_none(),
        "a joined worker is not restarted by serve"
    );
    let rings = format!("{}-j", server.rings);
    assert!(
        server
            .leftover_segments()
            .iter()
            .all(|s| !s.starts_with(&rings)),
        "{:?}",
        server.leftover_segments()
    );
    // Shutdown removes the join socket.
    server.sigterm();
    assert!(server.wait_exit(Duration::from_secs(60)).is_some());
    assert!(!sock.exists());
}

/// Null-device flags (deterministic tokens, long requests) shared by the server and the joiner.
const NULL: &[&str] = &[
    "--device",
    "null",
    "--max-model-len",
    "200000",
    "--num-kv-blocks",
    "20000",
];
const LONG: u32 = 20_000;

#[test]
fn a_draining_worker_finishes_its_streams_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let name = "join-test-drain";
    let model = tiny_llama();
    let mut args = vec!["--model", model.to_str().unwrap(), "--workers", "1"];
    args.extend_from_slice(&["--name", name]);
    args.extend_from_slice(NULL);
    let mut server = Server::start_with_env(&args, 1, &[("RINGSERVE_RUNTIME_DIR", dir.path())]);
    let mut joined = Reap(join_worker(name, dir.path(), NULL));
    let pid = joined.0.id();
    server
        .wait_line(
            |l| l.starts_with("worker 1 ready"),
            Duration::from_secs(120),
        )
        .expect("the worker joined");
    let rt = runtime();
    rt.block_on(async {
        // Long streams on both workers, read only up to their first message. Whether the joined
        // worker is still generating them when it drains or has already handed every token to
        // the gateway (HTTP/2 windows and the gateway's buffers can hold them), the assertions
        // below hold: they finish whole, nothing is resumed, and no new request reaches it.
        let mut streams = Vec::new();
        for i in 0..6 {
            let mut client = server.client().await;
            let mut stream = client
                .generate(greedy_ids(&prompt(i), LONG))
                .await
                .unwrap()
                .into_inner();
            let first = stream.message().await.unwrap().unwrap();
            streams.push((i, first.token_ids, stream));
        }
        let on_joined = per_worker(&server, "ringserve_worker_requests_routed_total", 1);
        assert!(on_joined >= 1.0, "no stream went to the joined worker");

        signal(pid, "TERM");
        server
            .wait_line(|l| l == "worker 1 draining", Duration::from_secs(60))
            .expect("the worker announced its drain");
        // New requests go elsewhere while it drains.
        let mut client = server.client().await;
        for i in 0..6 {
            let msgs = collect(&mut client, greedy_ids(&prompt(100 + i), 8))
                .await
                .unwrap();
            assert_eq!(ids_of(&msgs).len(), 8);
        }
        assert_eq!(
            per_worker(&server, "ringserve_worker_requests_routed_total", 1),
            on_joined,
            "a draining worker got a new request"
        );
        // Its streams (and the others) finish normally.
        let mut done = Vec::new();
        for (i, mut ids, mut stream) in streams {
            let mut last = None;
            while let Some(msg) = stream.message().await.expect("the stream finishes") {
                ids.extend(msg.token_ids.iter());
                last = Some(msg.finish_reason);
            }
            assert_eq!(last, Some(FinishReason::Length as i32), "stream {i}");
            assert_eq!(ids.len(), LONG as usize, "stream {i}");
            done.push((i, ids));
        }
        // The same requests again, on the supervised worker alone: the same tokens.
        for (i, ids) in done.iter().take(2) {
            let msgs = collect(&mut client, greedy_ids(&prompt(*i), LONG))
                .await
                .unwrap();
            assert_eq!(&ids_of(&msgs), ids, "stream {i} replayed");
        }
    });
    let status = wait_exit(&mut joined.0, Duration::from_secs(60)).expect("the worker exited");
    assert!(status.success(), "drained worker exited with {status}");
    server
        .wait_line(|l| l.starts_with("worker 1 left"), Duration::from_secs(60))
        .expect("the gateway removed the worker");
    assert_eq!(server.metric("ringserve_requests_resumed_total"), None);
    assert_eq!(server.metric("ringserve_workers_drained_total"), Some(1.0));
    let rings = format!("{}-j", server.rings);
    assert!(
        server
            .leftover_segments()
            .iter()
            .all(|s| !s.starts_with(&rings)),
        "{:?}",
        server.leftover_segments()
    );
    assert!(
        server
            .metrics()
            .contains("ringserve_requests_total{outcome=\"finished_length\"}")
    );
}

#[test]
fn a_sigtermed_supervised_worker_drains_and_is_replaced() {
    let model = tiny_llama();
    let mut args = vec!["--model", model.to_str().unwrap(), "--workers", "2"];
    args.extend_from_slice(NULL);
    let mut server = Server::start(&args, 2);
    let victim = server.worker_pids[0];
    let rt = runtime();
    rt.block_on(async {
        let mut streams = Vec::new();
        for i in 0..4 {
            let mut client = server.client().await;
            let mut stream = client
                .generate(greedy_ids(&prompt(i), LONG))
                .await
                .unwrap()
                .into_inner();
            let first = stream.message().await.unwrap().unwrap();
            streams.push((first.token_ids, stream));
        }
        signal(victim, "TERM");
        server
            .wait_line(|l| l == "worker 0 draining", Duration::from_secs(60))
            .expect("the worker announced its drain");
        let mut client = server.client().await;
        let msgs = collect(&mut client, greedy_ids(&prompt(50), 8))
            .await
            .unwrap();
        assert_eq!(ids_of(&msgs).len(), 8);
        for (mut ids, mut stream) in streams {
            while let Some(msg) = stream.message().await.expect("the stream finishes") {
                ids.extend(msg.token_ids.iter());
            }
            assert_eq!(ids.len(), LONG as usize);
        }
    });
    // It left cleanly and the supervisor started a replacement in its slot.
    let (slot, pid) = server.wait_worker_ready(Duration::from_secs(120));
    assert_eq!(slot, 0);
    assert_ne!(pid, victim);
    assert_eq!(server.metric("ringserve_requests_resumed_total"), None);
    assert_eq!(server.metric("ringserve_workers_drained_total"), Some(1.0));
}
