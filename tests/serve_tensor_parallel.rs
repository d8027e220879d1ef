//! End to end, tensor parallelism across worker processes (CPU backend, tiny-llama fixture: 4 query
//! heads, 2 KV heads, intermediate 176):
//! - `serve --workers 2 --tp 2` streams the greedy tokens of `serve --workers 1` and of
//!   transformers (`expected.json`) for a batch of concurrent streams;
//! - `serve --workers 4 --tp 2`: rank 1 of one group SIGKILLed mid-stream; every stream completes
//!   with the undisturbed tokens (resumed on the other group), and the whole group restarts;
//! - `serve --workers 2 --tp 2` (one group): rank 1 SIGKILLed; the streams wait for the restarted
//!   group and resume identically.
//!
//! - `ringserve worker` ranks on their own: a follower exits non-zero (no hang) when rank 0 dies;
//!   bad flag combinations are errors naming the flag.
//!
//! No timing assertions: waits are generous so a loaded 2-core machine passes.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Server, greedy_ids, ids_of, runtime, signal, tiny_llama, tiny_llama_cases};
use protos::v1::FinishReason;

const WAIT: Duration = Duration::from_secs(240);

/// The fixture's cases followed by `extra` more prompts: (prompt, max tokens).
fn workload(extra: usize, max_tokens: u32) -> Vec<(Vec<u32>, u32)> {
    let mut all: Vec<(Vec<u32>, u32)> = tiny_llama_cases()
        .into_iter()
        .map(|(p, want)| (p, want.len() as u32))
        .collect();
    for i in 0..extra {
        let prompt = (0..3 + i % 6)
            .map(|j| 1 + ((i * 41 + j * 13) % 500) as u32)
            .collect();
        all.push((prompt, max_tokens));
    }
    all
}

/// Runs every stream at once. With `kill = Some((pid, after))`, SIGKILLs `pid` once `after` tokens
/// have arrived over all streams. Returns each stream's ids and finish reason.
async fn run_all(
    server: &Server,
    work: &[(Vec<u32>, u32)],
    kill: Option<(u32, usize)>,
) -> Vec<(Vec<u32>, i32)> {
    let seen = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (prompt, max_tokens) in work.iter().cloned() {
        let mut client = server.client().await;
        let (seen, killed) = (seen.clone(), killed.clone());
        tasks.push(tokio::spawn(async move {
            let mut stream = client
                .generate(greedy_ids(&prompt, max_tokens))
                .await
                .expect("request accepted")
                .into_inner();
            let mut msgs = Vec::new();
            while let Some(msg) = stream.message().await.expect("the stream survives") {
                let n = msg.token_ids.len();
                msgs.push(msg);
                let total = seen.fetch_add(n, Ordering::SeqCst) + n;
                if let Some((pid, after)) = kill
                    && total >= after
                    && killed.swap(1, Ordering::SeqCst) == 0
                {
                    signal(pid, "KILL");
                }
            }
            let finish = msgs.last().map(|m| m.finish_reason).unwrap_or_default();
            (ids_of(&msgs), finish)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("stream task"));
    }
    out
}

fn check_complete(got: &[(Vec<u32>, i32)], work: &[(Vec<u32>, u32)]) {
    for ((ids, finish), (_, max)) in got.iter().zip(work) {
        assert_eq!(ids.len(), *max as usize);
        assert_eq!(*finish, FinishReason::Length as i32);
    }
}

/// SIGTERMs the server and checks it leaves no shared-memory segment behind.
fn stop_clean(mut server: Server) {
    server.sigterm();
    let status = server.wait_exit(WAIT).expect("serve exits after SIGTERM");
    assert!(status.success(), "serve exited with {status}");
    let left = server.leftover_segments();
    assert!(left.is_empty(), "leftover segments: {left:?}");
}

/// Segments of one generation of one worker slot still in /dev/shm.
fn segments_of(server: &Server, slot: usize, generation: u32) -> Vec<String> {
    let prefix = format!("{}-w{slot}g{generation}-", server.rings);
    server
        .leftover_segments()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn model_arg() -> String {
    tiny_llama().to_str().expect("utf-8 path").to_owned()
}

#[test]
fn tp2_streams_the_tokens_of_one_worker_and_of_transformers() {
    let model = model_arg();
    let work = workload(12, 24);
    let rt = runtime();

    let solo = Server::start(&["--model", &model, "--workers", "1"], 1);
    let want = rt.block_on(run_all(&solo, &work, None));
    stop_clean(solo);
    check_complete(&want, &work);
    for ((prompt, expected), (got, _)) in tiny_llama_cases().iter().zip(&want) {
        assert_eq!(got, expected, "TP=1 vs transformers, prompt {prompt:?}");
    }

    let tp = Server::start(&["--model", &model, "--workers", "2", "--tp", "2"], 1);
    assert_eq!(tp.group_pids[0].len(), 2, "one group of two ranks");
    assert_eq!(
        tp.group_pids[0][0], tp.worker_pids[0],
        "rank 0 is the router's worker"
    );
    let got = rt.block_on(run_all(&tp, &work, None));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "stream {i}: TP=2 vs TP=1");
    }
    // Two processes, one router slot. Both ranks sized their KV cache with the per-rank default
    // (no --num-kv-blocks): had they disagreed, rank 0's block ids would have failed the follower.
    assert_eq!(tp.metric("ringserve_workers_live"), Some(1.0));
    stop_clean(tp);
}

#[test]
fn a_killed_rank_restarts_its_group_while_the_other_group_serves() {
    let model = model_arg();
    // Long enough streams that the kill lands mid-stream (see the lone-group test).
    let work = workload(12, 200);
    let mut server = Server::start(
        &[
            "--model",
            &model,
            "--workers",
            "4",
            "--tp",
            "2",
            "--num-kv-blocks",
            "2048",
            "--failover-timeout",
            "240",
        ],
        2,
    );
    for pids in &server.group_pids {
        assert_eq!(pids.len(), 2);
    }
    let rt = runtime();
    let want = rt.block_on(run_all(&server, &work, None));
    check_complete(&want, &work);

    let victim = 0;
    let old = server.group_pids[victim].clone();
    let other = server.group_pids[1 - victim].clone();
    let restarts = server
        .metric("ringserve_worker_restarts_total")
        .unwrap_or(0.0);
    eprintln!("SIGKILL rank 1 (pid {}) of group {victim}", old[1]);
    let got = rt.block_on(run_all(&server, &work, Some((old[1], 30))));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "stream {i}");
    }
    let (slot, _) = server.wait_worker_ready(WAIT);
    assert_eq!(slot, victim, "the killed rank's group restarts");
    let new = server.group_pids[victim].clone();
    assert_eq!(new.len(), 2);
    for (rank, (o, n)) in old.iter().zip(&new).enumerate() {
        assert_ne!(o, n, "rank {rank} of the group got a new process");
    }
    assert_eq!(
        server.group_pids[1 - victim],
        other,
        "the other group kept serving"
    );
    assert!(
        server.wait_metric("ringserve_worker_restarts_total", WAIT, |v| v > restarts),
        "the restart is counted"
    );
    // The dead generation's segments (gateway rings, plan rings, communicator) are gone.
    let stale = segments_of(&server, victim, 0);
    assert!(stale.is_empty(), "stale segments: {stale:?}");
    // The restarted group serves the same tokens.
    let again = rt.block_on(run_all(&server, &work, None));
    assert_eq!(again, want);
    stop_clean(server);
}

#[test]
fn a_lone_group_with_a_killed_rank_restarts_and_its_streams_resume() {
    let model = model_arg();
    // Streams long enough that the kill (after 20 tokens have reached the client) lands while
    // they still run, even when the client reads far behind the workers on a loaded machine.
    let work = workload(6, 200);
    let mut server = Server::start(
        &[
            "--model",
            &model,
            "--workers",
            "2",
            "--tp",
            "2",
            "--num-kv-blocks",
            "2048",
            "--failover-timeout",
            "240",
        ],
        1,
    );
    let rt = runtime();
    let want = rt.block_on(run_all(&server, &work, None));
    check_complete(&want, &work);

    let old = server.group_pids[0].clone();
    eprintln!("SIGKILL rank 1 (pid {}) of the only group", old[1]);
    let got = rt.block_on(run_all(&server, &work, Some((old[1], 20))));
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "stream {i}");
    }
    let (slot, _) = server.wait_worker_ready(WAIT);
    assert_eq!(slot, 0);
    for (rank, (o, n)) in old.iter().zip(&server.group_pids[0]).enumerate() {
        assert_ne!(o, n, "rank {rank} of the group got a new process");
    }
    assert!(
        server.wait_metric("ringserve_requests_resumed_total", WAIT, |v| v >= 1.0),
        "the cut streams were resumed"
    );
    assert!(
        server
            .metric("ringserve_worker_restarts_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    stop_clean(server);
}

/// A child process killed (and reaped) when dropped, so a failing test leaks none.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `ringserve worker ARGS` on the fixture.
fn spawn_worker(args: &[&str]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_ringserve"))
            .args(["worker", "--model", &model_arg()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning ringserve worker"),
    )
}

/// Removes this test's segments from /dev/shm (a SIGKILLed rank 0 cannot).
fn unlink_prefix(prefix: &str) {
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[test]
fn a_follower_exits_nonzero_when_rank0_dies() {
    // This test plays the gateway: it creates rank 0's rings and reads its Hello.
    let prefix = ringbuf::unique_name("rs-tpw");
    let group = format!("{prefix}-tp");
    let req = ringbuf::create(&format!("{prefix}-req"), 1 << 16).expect("request ring");
    let resp = ringbuf::create(&format!("{prefix}-resp"), 1 << 16).expect("response ring");
    let _producer = req.producer().expect("producer");
    let mut consumer = resp.consumer().expect("consumer");
    let common = ["--tp", "2", "--tp-group", &group, "--num-kv-blocks", "64"];
    let mut follower = spawn_worker(&[&common[..], &["--rank", "1"]].concat());
    let mut rank0 = spawn_worker(&[&common[..], &["--rank", "0", "--rings", &prefix]].concat());

    let deadline = Instant::now() + WAIT;
    let hello = loop {
        assert!(Instant::now() < deadline, "rank 0 never said hello");
        if let Some(rec) = consumer
            .pop_wait(Duration::from_millis(100))
            .expect("response ring")
        {
            break protos::records::Hello::decode(&rec).expect("a hello record");
        }
    };
    assert_eq!(hello.pid, rank0.0.id());
    assert_eq!(
        hello.num_kv_blocks, 63,
        "64 blocks, the null block excluded"
    );
    assert!(
        follower.0.try_wait().expect("follower status").is_none(),
        "the follower serves while rank 0 lives"
    );

    rank0.0.kill().expect("SIGKILL rank 0");
    let _ = rank0.0.wait();
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = follower.0.try_wait().expect("follower status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = follower.0.kill();
            panic!("the follower hangs after rank 0 died");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "the follower must fail: {status}");
    unlink_prefix(&group);
}

/// Runs `ringserve ARGS` to its end; returns (success, stderr).
fn run_cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running ringserve");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_tensor_parallel_flags_are_errors_naming_the_flag() {
    let model = model_arg();
    // 4 attention heads: 3 ranks cannot shard them (checked before any worker starts).
    let (ok, err) = run_cli(&[
        "serve",
        "--model",
        &model,
        "--tp",
        "3",
        "--addr",
        "127.0.0.1:0",
    ]);
    assert!(!ok);
    assert!(err.contains("--tensor-parallel-size 3"), "{err}");
    let (ok, err) = run_cli(&["serve", "--model", &model, "--workers", "3", "--tp", "2"]);
    assert!(!ok);
    assert!(
        err.contains("multiple of --tensor-parallel-size 2"),
        "{err}"
    );
    // NCCL needs a GPU per rank (checked before any worker starts, so no GPU is needed here).
    let (ok, err) = run_cli(&["serve", "--model", &model, "--device", "cuda", "--tp", "2"]);
    assert!(!ok);
    assert!(err.contains("--gpus"), "{err}");
    let (ok, err) = run_cli(&[
        "worker",
        "--model",
        &model,
        "--tp",
        "2",
        "--rank",
        "2",
        "--tp-group",
        "x",
    ]);
    assert!(!ok);
    assert!(err.contains("--rank 2"), "{err}");
    let (ok, err) = run_cli(&[
        "worker",
        "--model",
        &model,
        "--tp",
        "3",
        "--rank",
        "1",
        "--tp-group",
        "x",
    ]);
    assert!(!ok);
    assert!(err.contains("--tensor-parallel-size 3"), "{err}");
}
