//! Tensor parallelism across real processes on the CPU backend: rank 0 (this test process) runs the
//! engine and broadcasts plans over shared-memory rings; ranks 1..T-1 are this test binary
//! re-executed (`tp_child_rank`), mirroring plans and running their shard. TP=2 and TP=4 give the
//! greedy tokens of transformers (and so of TP=1) on tiny-llama; a killed rank makes rank 0's next
//! step fail instead of hanging.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;
use worker::backend::cpu::{CpuBackend, CpuOptions, CpuTp};
use worker::checkpoint::Checkpoint;
use worker::engine::{Engine, EngineConfig};
use worker::kv::SeqId;
use worker::request::Request;
use worker::serve::tp::follower::{RingPlanSink, run_follower};
use worker::tp::{CommOptions, ShmComm, TpShard};

const CHILD_ENV: &str = "RINGSERVE_TP_TEST_CHILD";
const OPTIONS: CpuOptions = CpuOptions {
    block_size: 4,
    num_kv_blocks: 200,
    quantization: None,
    kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

fn comm_options() -> CommOptions {
    CommOptions {
        timeout: Duration::from_secs(60),
        ..CommOptions::default()
    }
}

/// The follower ranks' entry point: does nothing unless started by `Group::start`.
#[test]
fn tp_child_rank() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let (ring_name, comm_name) = (parts[0], parts[1]);
    let rank: usize = parts[2].parse().expect("rank");
    let world: usize = parts[3].parse().expect("world");
    let (config, ckpt) = Checkpoint::load(&fixture()).expect("fixture");
    let ring = ringbuf::attach(ring_name).expect("attach plan ring");
    let mut consumer = ring.consumer().expect("consumer");
    let comm = ShmComm::attach(comm_name, rank, comm_options()).expect("attach communicator");
    let tp = CpuTp {
        shard: TpShard { rank, world },
        comm: Box::new(comm),
    };
    let mut backend = CpuBackend::new_sharded(&config, &ckpt, OPTIONS, Some(tp)).expect("backend");
    match run_follower(&mut consumer, &mut backend, Some(Duration::from_secs(60))) {
        Ok(_) => std::process::exit(0),
        Err(e) => {
            eprintln!("rank {rank}: {e}");
            std::process::exit(3);
        }
    }
}

/// Rank 0's view of a running group.
struct Group {
    engine: Engine,
    children: Vec<Child>,
}

impl Group {
    fn start(world: usize) -> Group {
        let (config, ckpt) = Checkpoint::load(&fixture()).expect("fixture");
        let comm_name = ringbuf::unique_name("rs-tptest-comm");
        let mut producers = Vec::new();
        let mut children = Vec::new();
        let mut rings = Vec::new();
        for rank in 1..world {
            let name = ringbuf::unique_name("rs-tptest-plan");
            let ring = ringbuf::create(&name, 1 << 20).expect("plan ring");
            producers.push(ring.producer().expect("producer"));
            rings.push(ring);
            let child = Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "tp_child_rank",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(CHILD_ENV, format!("{name} {comm_name} {rank} {world}"))
                .spawn()
                .expect("spawn rank");
            children.push(child);
        }
        let comm = ShmComm::create(&comm_name, world, comm_options()).expect("communicator");
        let tp = CpuTp {
            shard: TpShard { rank: 0, world },
            comm: Box::new(comm),
        };
        let backend = CpuBackend::new_sharded(&config, &ckpt, OPTIONS, Some(tp)).expect("backend");
        let mut engine = Engine::new(
            Box::new(backend),
            &config,
            EngineConfig {
                seed: Some(1),
                max_num_batched_tokens: 16, // chunked prefill and mixed batches
                ..EngineConfig::default()
            },
        )
        .expect("engine");
        engine.set_plan_sink(Box::new(RingPlanSink::new(
            producers,
            Duration::from_secs(10),
        )));
        // The rings stay mapped through the producers; the creator handles may go.
        drop(rings);
        Group { engine, children }
    }

    /// Drops the engine (sending shutdown) and checks that every follower exited cleanly.
    fn finish(self) {
        drop(self.engine);
        for mut child in self.children {
            let status = child.wait().expect("wait rank");
            assert!(status.success(), "follower rank exited with {status}");
        }
    }
}

fn greedy_request(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut req = Request::new(SeqId(id), prompt, max_tokens);
    req.params.temperature = 0.0;
    req.ignore_eos = true;
    req
}

fn check_world(world: usize) {
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("expected.json")).expect("expected.json"),
    )
    .expect("json");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    let cases: Vec<(Vec<u32>, Vec<u32>)> = expected["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| (ids(&c["prompt"]), ids(&c["greedy"])))
        .collect();
    let mut group = Group::start(world);
    // All cases at once: continuous batching, chunked prefill, several finishes.
    for (i, (prompt, want)) in cases.iter().enumerate() {
        group
            .engine
            .add_request(greedy_request(i as u64, prompt.clone(), want.len()))
            .expect("request");
    }
    let mut got = vec![Vec::new(); cases.len()];
    while group.engine.has_unfinished() {
        for ev in group.engine.step().expect("step") {
            got[ev.id.0 as usize].push(ev.token);
        }
    }
    for ((prompt, want), got) in cases.iter().zip(&got) {
        assert_eq!(got, want, "TP={world}, prompt {prompt:?}");
    }
    group.finish();
}

#[test]
fn tp2_processes_match_transformers_greedy() {
    check_world(2);
}

#[test]
fn tp4_processes_match_transformers_greedy() {
    check_world(4);
}

#[test]
fn killed_rank_makes_rank0_fail_instead_of_hanging() {
    let mut group = Group::start(2);
    group
        .engine
        .add_request(greedy_request(0, vec![5, 6, 7], 150))
        .expect("request");
    let first = group.engine.step().expect("first step");
    assert!(!first.is_empty());
    group.children[0].kill().expect("kill rank 1");
    // The child is a zombie until reaped: liveness must see through that.
    let mut failed = None;
    for _ in 0..150 {
        match group.engine.step() {
            Ok(_) => {}
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let err = failed.expect("a step after the kill must fail");
    assert!(
        err.contains("died") || err.contains("rank 1"),
        "unexpected error: {err}"
    );
    let _ = group.children[0].wait();
}
