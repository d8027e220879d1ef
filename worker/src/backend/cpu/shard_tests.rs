//! TP=2 and TP=4 on the tiny-llama fixture (4 query heads, 2 KV heads: TP=4 replicates KV heads),
//! one thread per rank over the shared-memory communicator: greedy tokens identical to TP=1 and to
//! transformers' (`expected.json`), logits close to TP=1's.

use std::path::Path;

use super::*;
use crate::backend::BackendError;
use crate::backend::cpu::{CpuBackend, CpuOptions};
use crate::backend::{Backend, ForwardBatch, SeqInput};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::tp::{CommOptions, ShardError, ShmComm};

fn fixture() -> (ModelConfig, Checkpoint, serde_json::Value) {
    fixture_named("tiny-llama")
}

/// A fixture folder with tiny-llama's prompts and expected tokens (an INT4 fixture's: its twin's).
fn fixture_named(name: &str) -> (ModelConfig, Checkpoint, serde_json::Value) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let (config, ckpt) = Checkpoint::load(&root.join(name)).expect("fixture");
    let reference = if name.starts_with("int4-") {
        root.join(format!("{name}-twin/expected.json"))
    } else {
        root.join("tiny-llama/expected.json")
    };
    let expected = std::fs::read_to_string(reference).expect("expected.json");
    (config, ckpt, serde_json::from_str(&expected).expect("json"))
}

const OPTIONS: CpuOptions = CpuOptions {
    block_size: 4,
    num_kv_blocks: 64,
    quantization: None,
    kv_cache_dtype: crate::quant::kv::KvCacheDtype::Auto,
};

/// Greedy decoding of `new_tokens` tokens one step at a time; returns the tokens and the logits
/// of the prompt's last position.
fn greedy(backend: &mut CpuBackend, prompt: &[u32], new_tokens: usize) -> (Vec<u32>, Vec<f32>) {
    let table: Vec<u32> = (1..OPTIONS.num_kv_blocks as u32).collect();
    let mut tokens = prompt.to_vec();
    let mut first_logits = Vec::new();
    let mut done = 0;
    while tokens.len() < prompt.len() + new_tokens {
        let ids = &tokens[done..];
        let positions: Vec<u32> = (done as u32..tokens.len() as u32).collect();
        let seqs = [SeqInput {
            query_start: 0,
            query_len: ids.len(),
            context_len: tokens.len(),
            block_table: &table,
            sample: true,
        }];
        let batch = ForwardBatch {
            token_ids: ids,
            positions: &positions,
            seqs: &seqs,
        };
        let logits = backend.forward(&batch).expect("forward");
        if first_logits.is_empty() {
            first_logits = logits.data.clone();
        }
        let next = logits
            .row(0)
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .expect("vocab");
        done = tokens.len();
        tokens.push(next);
    }
    (tokens[prompt.len()..].to_vec(), first_logits)
}

fn cases(expected: &serde_json::Value) -> Vec<(Vec<u32>, Vec<u32>)> {
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|t| t.as_u64().expect("id") as u32)
            .collect()
    };
    expected["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| (ids(&c["prompt"]), ids(&c["greedy"])))
        .collect()
}

fn run_group(world: usize, options: CpuOptions, model: &'static str) -> Vec<(Vec<u32>, Vec<f32>)> {
    let name = ringbuf::unique_name(&format!("rs-tpshard{world}"));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || {
                let (config, ckpt, expected) = fixture_named(model);
                let opts = CommOptions {
                    slot_floats: 1 << 12,
                    ..CommOptions::default()
                };
                let comm = if rank == 0 {
                    ShmComm::create(&name, world, opts)
                } else {
                    ShmComm::attach(&name, rank, opts)
                }
                .expect("communicator");
                let tp = CpuTp {
                    shard: TpShard { rank, world },
                    comm: Box::new(comm),
                };
                let mut backend =
                    CpuBackend::new_sharded(&config, &ckpt, options, Some(tp)).expect("backend");
                cases(&expected)
                    .iter()
                    .map(|(prompt, want)| greedy(&mut backend, prompt, want.len()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank"))
        .collect();
    // Every rank saw bit-identical logits, hence identical tokens.
    assert!(results.windows(2).all(|w| w[0] == w[1]));
    results.swap_remove(0)
}

fn check_world(world: usize) {
    let (config, ckpt, expected) = fixture();
    let mut solo = CpuBackend::new(&config, &ckpt, OPTIONS).expect("backend");
    let group = run_group(world, OPTIONS, "tiny-llama");
    for ((prompt, want), (tokens, logits)) in cases(&expected).iter().zip(&group) {
        let (solo_tokens, solo_logits) = greedy(&mut solo, prompt, want.len());
        assert_eq!(
            &solo_tokens, want,
            "TP=1 vs transformers, prompt {prompt:?}"
        );
        assert_eq!(
            tokens, &solo_tokens,
            "TP={world} vs TP=1, prompt {prompt:?}"
        );
        let max_diff = logits
            .iter()
            .zip(&solo_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max_diff < 1e-4, "TP={world} logits differ by {max_diff}");
    }
}

#[test]
fn tp2_matches_tp1_on_tiny_llama() {
    check_world(2);
}

#[test]
fn tp4_replicates_kv_heads_and_matches_tp1() {
    let (config, _, _) = fixture();
    let dims = LocalDims::new(&config, TpShard { rank: 3, world: 4 }).expect("dims");
    assert_eq!((dims.heads, dims.kv_heads, dims.kv_range), (1, 1, 1..2));
    check_world(4);
}

#[test]
fn unsplittable_sizes_are_rejected() {
    let (config, ckpt, _) = fixture();
    for world in [3, 8] {
        let err = LocalDims::new(&config, TpShard { rank: 0, world }).expect_err("bad split");
        assert!(
            matches!(err, ShardError::Indivisible { world: w, .. } if w == world),
            "{err}"
        );
    }
    let comm = ShmComm::create(
        &ringbuf::unique_name("rs-tpshard-bad"),
        1,
        CommOptions::default(),
    )
    .expect("comm");
    let tp = CpuTp {
        shard: TpShard { rank: 0, world: 2 },
        comm: Box::new(comm),
    };
    let err = CpuBackend::new_sharded(&config, &ckpt, OPTIONS, Some(tp)).expect_err("mismatch");
    assert!(matches!(err, BackendError::InvalidOptions(_)), "{err}");
}

/// FP8 shards: the weights are quantized whole and then split (every rank holds TP=1's scales), so
/// TP=2 differs from TP=1 only where o_proj and down_proj quantize their inputs per token over a
/// rank's half of the row instead of the whole row (as vLLM's FP8 shards do).
#[test]
fn fp8_tp2_stays_close_to_tp1() {
    let (config, ckpt, expected) = fixture();
    let fp8 = CpuOptions {
        quantization: Some(crate::quant::Quantization::Fp8),
        kv_cache_dtype: crate::quant::kv::KvCacheDtype::Auto,
        ..OPTIONS
    };
    let mut solo = CpuBackend::new(&config, &ckpt, fp8).expect("backend");
    let group = run_group(2, fp8, "tiny-llama");
    for ((prompt, want), (_, logits)) in cases(&expected).iter().zip(&group) {
        let (_, solo_logits) = greedy(&mut solo, prompt, want.len());
        let num: f64 = logits
            .iter()
            .zip(&solo_logits)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let den: f64 = solo_logits.iter().map(|b| f64::from(*b).powi(2)).sum();
        let rel = (num / den).sqrt();
        // A rank's half-row amax gives a different scale, so every code of those inputs may round
        // differently: about FP8's own error (0.02–0.05 from f32 on this model); a mis-split
        // weight or scale is off by the logits' own size.
        eprintln!(
            "FP8 TP=2 vs TP=1, prompt of {}: relative L2 {rel:.4}",
            prompt.len()
        );
        assert!(
            rel < 0.1,
            "FP8 TP=2 vs TP=1, prompt of {}: relative L2 {rel}",
            prompt.len()
        );
        assert!(rel > 0.0, "the row-parallel inputs are quantized per shard");
    }
}

/// An FP8 KV cache under TP=2: each rank holds its KV heads' codes with the layer's scales, so
/// the logits stay within the cache's own rounding noise of TP=1's with the same cache (a code
/// may flip where the all-reduce's summation order moves a value across a rounding boundary), and
/// clearly closer to them than to the unquantized cache's.
#[test]
fn fp8_kv_cache_tp2_stays_close_to_tp1() {
    let (config, ckpt, expected) = fixture();
    let fp8_kv = CpuOptions {
        kv_cache_dtype: crate::quant::kv::KvCacheDtype::Fp8E4m3,
        ..OPTIONS
    };
    let mut solo = CpuBackend::new(&config, &ckpt, fp8_kv).expect("backend");
    let mut exact = CpuBackend::new(&config, &ckpt, OPTIONS).expect("backend");
    let group = run_group(2, fp8_kv, "tiny-llama");
    let rel = |a: &[f32], b: &[f32]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (num / den).sqrt()
    };
    for ((prompt, want), (_, logits)) in cases(&expected).iter().zip(&group) {
        let (_, solo_logits) = greedy(&mut solo, prompt, want.len());
        let (_, exact_logits) = greedy(&mut exact, prompt, want.len());
        let (near, far) = (rel(logits, &solo_logits), rel(&solo_logits, &exact_logits));
        eprintln!(
            "FP8 KV TP=2 vs TP=1, prompt of {}: {near:.2e} (the FP8 cache against the f32 one: {far:.2e})",
            prompt.len()
        );
        assert!(
            near < 0.25 * far,
            "prompt of {}: {near} vs {far}",
            prompt.len()
        );
    }
}

/// With static input scales (the llm-compressor FP8 fixture) a shard quantizes its inputs exactly as
/// TP=1 does, so TP=2 must match TP=1 up to the all-reduce's summation order: this pins the split
/// of FP8 weights and their scales.
#[test]
fn static_fp8_tp2_matches_tp1() {
    let (config, ckpt, expected) = fixture_named("tiny-llama-fp8-static");
    let mut solo = CpuBackend::new(&config, &ckpt, OPTIONS).expect("backend");
    let group = run_group(2, OPTIONS, "tiny-llama-fp8-static");
    for ((prompt, want), (tokens, logits)) in cases(&expected).iter().zip(&group) {
        let (solo_tokens, solo_logits) = greedy(&mut solo, prompt, want.len());
        let max_diff = logits
            .iter()
            .zip(&solo_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_diff < 1e-4,
            "prompt of {}: max diff {max_diff}",
            prompt.len()
        );
        assert_eq!(tokens, &solo_tokens, "prompt of {}", prompt.len());
    }
}

/// INT4 shards (every layout, act order included): the CPU dequantizes a layer whole and then
/// splits it, so TP=2 gives TP=1's logits up to the all-reduce's summation order, and
/// HuggingFace's greedy tokens on the dequantized twin.
#[test]
fn int4_tp2_matches_tp1_and_transformers() {
    for name in [
        "int4-awq",
        "int4-gptq",
        "int4-gptq-sym",
        "int4-ct-sym",
        "int4-ct-asym",
    ] {
        let (config, ckpt, expected) = fixture_named(name);
        let mut solo = CpuBackend::new(&config, &ckpt, OPTIONS).expect("backend");
        let group = run_group(2, OPTIONS, name);
        for ((prompt, want), (tokens, logits)) in cases(&expected).iter().zip(&group) {
            let (_, solo_logits) = greedy(&mut solo, prompt, want.len());
            let max_diff = logits
                .iter()
                .zip(&solo_logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(max_diff < 1e-4, "{name}: max diff {max_diff}");
            assert_eq!(tokens, want, "{name}: prompt of {}", prompt.len());
        }
    }
}
