//! Helpers the quantization tests share (`mod common;` in each): fixture paths, one prompt's
//! last-position logits, greedy tokens through the engine, relative L2, and edited copies of a
//! fixture.
// Each test crate uses its own subset.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView as StView;
use serde_json::Value;
use worker::backend::{Backend, ForwardBatch, SeqInput};
use worker::engine::{Engine, EngineConfig};
use worker::kv::SeqId;
use worker::request::Request;
use worker::sampler::SamplingParams;

/// `tests/fixtures/NAME`, or `$FIXTURES_DIR/NAME` where the fixtures are not at their source path
/// (the GPU machine).
pub fn fixture(name: &str) -> PathBuf {
    std::env::var_os("FIXTURES_DIR")
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
            PathBuf::from,
        )
        .join(name)
}

/// The last position's logits of `prompt`, prefilled in one step from block 1 on.
pub fn last_logits(b: &mut dyn Backend, prompt: &[u32]) -> Vec<f32> {
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let table: Vec<u32> = (1..=prompt.len().div_ceil(16) as u32).collect();
    let seqs = [SeqInput {
        query_start: 0,
        query_len: prompt.len(),
        context_len: prompt.len(),
        block_table: &table,
        sample: true,
    }];
    let batch = ForwardBatch {
        token_ids: prompt,
        positions: &positions,
        seqs: &seqs,
    };
    b.forward(&batch).expect("forward").data
}

/// 24 greedy tokens of each of `prompts`, batched together through the engine (its decode
/// steps, and their graphs where the backend captures them).
pub fn greedy_of(
    backend: Box<dyn Backend>,
    config: &worker::config::ModelConfig,
    prompts: &[Vec<u32>],
) -> Vec<Vec<u32>> {
    let mut engine = Engine::new(backend, config, EngineConfig::default()).expect("engine");
    for (i, p) in prompts.iter().enumerate() {
        let mut req = Request::new(SeqId(i as u64), p.clone(), 24);
        req.params = SamplingParams::greedy();
        req.ignore_eos = true;
        engine.add_request(req).expect("request");
    }
    let mut out = vec![Vec::new(); prompts.len()];
    while engine.has_unfinished() {
        for ev in engine.step().expect("step") {
            out[ev.id.0 as usize].push(ev.token);
        }
    }
    out
}

/// `‖a − b‖ / ‖b‖`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den).sqrt()
}

/// A fixture's tensors by name: dtype, shape, bytes.
pub type Tensors = HashMap<String, (StDtype, Vec<usize>, Vec<u8>)>;

/// A copy of fixture `name` in a temporary folder, its tensors and config changed by `edit`.
pub fn edited(name: &str, edit: impl FnOnce(&mut Value, &mut Tensors)) -> tempfile::TempDir {
    let src = fixture(name);
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Tensors = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, (v.dtype(), v.shape().to_vec(), v.data().to_vec())))
        .collect();
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config, &mut tensors);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let views: Vec<(String, StView<'_>)> = tensors
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), StView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// The CUDA backend's options the quantization tests start from: bf16, 64 blocks of 16 tokens,
/// every kernel switch at its default, `quantization` (set `kernels` over it to vary switches).
#[cfg(feature = "cuda")]
pub fn cuda_options(
    enforce_eager: bool,
    quantization: Option<worker::quant::Quantization>,
) -> worker::backend::cuda::CudaOptions {
    worker::backend::cuda::CudaOptions {
        ordinal: 0,
        dtype: worker::backend::cuda::DType::Bf16,
        block_size: 16,
        num_kv_blocks: Some(64),
        gpu_memory_utilization: 0.9,
        enforce_eager,
        max_batch_tokens: 512,
        batch_invariant: false,
        kernels: worker::backend::switches::KernelSwitches::default(),
        quantization,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    }
}
