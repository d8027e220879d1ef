//! Flag validation of tensor-parallel workers and the per-rank KV default.

use std::path::{Path, PathBuf};

use super::*;
use crate::backend::BackendOptions;
use crate::engine::EngineConfig;
use crate::serve::launch::run_worker;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama")
}

fn tp(world: usize, rank: usize, group: Option<&str>) -> TpOptions {
    TpOptions {
        world,
        rank,
        group: group.map(str::to_owned),
        ..TpOptions::default()
    }
}

const CPU: WorkerDevice = WorkerDevice::Model(Device::Cpu);

#[test]
fn valid_layouts_pass() {
    tp(1, 0, None).check(CPU, true).unwrap();
    tp(1, 0, None).check(WorkerDevice::Null, true).unwrap();
    tp(1, 0, None)
        .check(WorkerDevice::Model(Device::Cuda(0)), true)
        .unwrap();
    tp(2, 0, Some("g")).check(CPU, true).unwrap();
    tp(4, 3, Some("g")).check(CPU, false).unwrap();
}

#[test]
fn bad_layouts_are_typed_errors_naming_the_flag() {
    let err = tp(0, 0, None).check(CPU, true).unwrap_err();
    assert!(matches!(err, TpError::ZeroSize));
    assert!(err.to_string().contains("--tensor-parallel-size"));

    let err = tp(2, 2, Some("g")).check(CPU, false).unwrap_err();
    assert!(matches!(err, TpError::RankOutOfRange { rank: 2, world: 2 }));
    assert!(err.to_string().contains("--rank 2"));
    let err = tp(1, 1, None).check(CPU, false).unwrap_err();
    assert!(matches!(err, TpError::RankOutOfRange { rank: 1, world: 1 }));

    let err = tp(2, 0, None).check(CPU, true).unwrap_err();
    assert!(matches!(err, TpError::MissingGroup { world: 2 }));
    assert!(err.to_string().contains("--tp-group"));
    let err = tp(1, 0, Some("g")).check(CPU, true).unwrap_err();
    assert!(matches!(err, TpError::GroupWithoutTp));

    let err = tp(2, 0, Some("g")).check(CPU, false).unwrap_err();
    assert!(matches!(err, TpError::MissingRings));
    assert!(err.to_string().contains("--rings"));
    let err = tp(2, 1, Some("g")).check(CPU, true).unwrap_err();
    assert!(matches!(err, TpError::FollowerRings { rank: 1 }));
}

#[test]
fn cuda_ranks_pass_and_null_refuses() {
    for device in [Device::Cuda(0), Device::Cuda(3)] {
        tp(2, 0, Some("g"))
            .check(WorkerDevice::Model(device), true)
            .expect("CUDA ranks");
    }
    let err = tp(4, 1, Some("g"))
        .check(WorkerDevice::Null, false)
        .unwrap_err();
    assert!(matches!(err, TpError::NullDevice { world: 4 }));
    assert!(err.to_string().contains("--device null"));
}

#[test]
fn a_cuda_rank_reads_the_model_before_touching_the_gpu() {
    let opts = WorkerOptions {
        model: PathBuf::from("/nonexistent/model"),
        device: WorkerDevice::Model(Device::Cuda(0)),
        backend: BackendOptions::default(),
        engine: EngineConfig::default(),
        rings: Some("unused".into()),
        ring_capacity: 1 << 16,
        tp: tp(2, 0, Some("unused")),
        lifecycle: Default::default(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let err = run_worker(&opts, stop).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model"), "{err}");
}

#[test]
fn model_shapes_are_checked() {
    let config = ModelConfig::load(&fixture()).unwrap();
    // tiny-llama: 4 query heads, 2 KV heads, intermediate 176.
    for world in [1, 2, 4] {
        check_model(world, &config).unwrap();
    }
    let err = check_model(3, &config).unwrap_err();
    assert!(matches!(err, TpError::Heads { world: 3, heads: 4 }));
    assert!(err.to_string().contains("--tensor-parallel-size 3"));
    assert!(matches!(check_model(0, &config), Err(TpError::ZeroSize)));

    let odd_mlp = ModelConfig {
        intermediate_size: 178,
        ..config.clone()
    };
    let err = check_model(4, &odd_mlp).unwrap_err();
    assert!(matches!(
        err,
        TpError::Intermediate {
            world: 4,
            intermediate: 178
        }
    ));

    let gqa = ModelConfig {
        num_attention_heads: 12,
        num_key_value_heads: 4,
        intermediate_size: 180,
        ..config
    };
    check_model(2, &gqa).unwrap();
    check_model(12, &gqa).unwrap();
    let err = check_model(6, &gqa).unwrap_err();
    assert!(matches!(
        err,
        TpError::KvHeads {
            world: 6,
            kv_heads: 4
        }
    ));
}

#[test]
fn default_kv_blocks_agree_across_ranks_and_follow_the_shard() {
    let config = ModelConfig::load(&fixture()).unwrap();
    let blocks = |rank, world| cpu_default_kv_blocks(&config, 16, TpShard { rank, world });
    let solo = blocks(0, 1);
    // Every rank of a group computes the same count.
    assert_eq!(blocks(0, 2), blocks(1, 2));
    assert_eq!(blocks(0, 4), blocks(3, 4));
    // Two KV heads: TP=2 holds one per rank (twice the blocks in the same bytes); TP=4 replicates
    // one head per rank, so it cannot hold more than TP=2.
    assert_eq!(blocks(0, 2), 2 * solo);
    assert_eq!(blocks(0, 4), blocks(0, 2));
    // The unsharded default is what `load_backend` has always used.
    let per_block = 16 * config.kv_dim() * config.num_hidden_layers * 8;
    assert_eq!(solo, crate::backend::CPU_DEFAULT_KV_BYTES / per_block);
}

#[test]
fn segment_names_derive_from_the_group() {
    assert_eq!(plan_ring_name("rs-w0g1-tp", 3), "rs-w0g1-tp-plan3");
    assert_eq!(comm_name("rs-w0g1-tp"), "rs-w0g1-tp-comm");
}
