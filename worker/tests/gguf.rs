//! A GGUF file of the `qwen2` architecture (`tests/fixtures/gguf-qwen2`, written by
//! `scripts/make_gguf_qwen2.py` with gguf-py: random weights in seven tensor types, q/k/v biases,
//! the `qwen2` pre-tokenizer) read the way HF transformers reads it: the same config, prompt ids,
//! last-position logits and greedy tokens (its `expected.json`, float32); and a GGUF whose tensors
//! do not describe the model is a typed error naming the tensor.

mod common;

use common::{fixture, last_logits, rel_l2};
use serde_json::Value;
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::checkpoint::Checkpoint;
use worker::config::{Architecture, ModelConfig};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(x: &[f32]) -> u32 {
    (0..x.len()).fold(0, |best, i| if x[i] > x[best] { i } else { best }) as u32
}

#[test]
fn a_qwen2_gguf_reads_as_hf_transformers_reads_it() {
    let path = fixture("gguf-qwen2").join("model.gguf");
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("gguf-qwen2").join("expected.json")).unwrap(),
    )
    .unwrap();
    let config = ModelConfig::load(&path).unwrap();
    assert_eq!(config.architecture, Architecture::Qwen2);
    assert!(config.qkv_bias && !config.tie_word_embeddings);
    assert_eq!(
        (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim
        ),
        (4, 2, 16)
    );
    assert_eq!(config.eos_token_ids, vec![2]);
    let (config, ckpt) = Checkpoint::load(&path).unwrap();
    let tokenizer = worker::open::load_tokenizer(&path).unwrap().unwrap();
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 16,
        quantization: None,
    };
    let mut cpu = CpuBackend::new(&config, &ckpt, options).unwrap();
    for case in want["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let prompt = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(prompt, ids(&case["prompt_ids"]), "{text:?}");
        let hf: Vec<f32> = case["last_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let ours = last_logits(&mut cpu, &prompt);
        let err = rel_l2(&ours, &hf);
        assert!(err < 1e-4, "{text:?}: relative L2 {err:.2e}");
        let mut seq = prompt.clone();
        for &t in &ids(&case["greedy"]) {
            let next = argmax(&last_logits(&mut cpu, &seq));
            assert_eq!(next, t, "{text:?} after {seq:?}");
            seq.push(next);
        }
    }
}

/// A copy of the fixture with `from` replaced by `to` (same length) once in its bytes, or cut to
/// `len` bytes.
fn altered(tag: &str, edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut bytes = std::fs::read(fixture("gguf-qwen2").join("model.gguf")).unwrap();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{tag}.gguf"));
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn replace_once(bytes: &mut [u8], from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let at = bytes.windows(from.len()).position(|w| w == from).unwrap();
    bytes[at..at + to.len()].copy_from_slice(to);
}

#[test]
fn bad_gguf_models_are_errors_naming_what_is_wrong() {
    let err = |path: &std::path::Path| Checkpoint::load(path).unwrap_err().to_string();
    // A tensor with no HF counterpart.
    let (_d, p) = altered("unknown-tensor", |b| {
        replace_once(b, b"blk.0.attn_q.weight", b"blk.0.attn_x.weight")
    });
    let e = err(&p);
    assert!(
        e.contains("blk.0.attn_x.weight") && e.contains("unknown-tensor.gguf"),
        "{e}"
    );
    // A missing layer's tensor (renamed into another layer's, which then appears twice).
    let (_d, p) = altered("twice", |b| {
        replace_once(b, b"blk.1.ffn_up.weight", b"blk.0.ffn_up.weight")
    });
    let e = err(&p);
    assert!(
        e.contains("blk.0.ffn_up.weight") && e.contains("twice"),
        "{e}"
    );
    // Cut short: the tensor reaching past the end is named.
    let (_d, p) = altered("cut", |b| b.truncate(b.len() - 100));
    let e = err(&p);
    assert!(
        e.contains("truncated") && e.contains("output.weight"),
        "{e}"
    );
    // An architecture this engine does not run.
    let (_d, p) = altered("arch", |b| replace_once(b, b"qwen2", b"gemma"));
    let e = ModelConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("architecture `gemma`"), "{e}");
    // A head count that does not divide the width reaches the config's own checks.
    let (_d, p) = altered("heads", |b| {
        let key = b"qwen2.attention.head_count";
        let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
        // The value type (u32) then the value.
        b[at + 4..at + 8].copy_from_slice(&3u32.to_le_bytes());
    });
    let e = ModelConfig::load(&p).unwrap_err().to_string();
    assert!(e.contains("not divisible by num_attention_heads 3"), "{e}");
}

#[test]
fn every_mapped_pre_tokenizer_splits_as_hf_transformers_does() {
    let dir = fixture("gguf-tokenizers");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let texts = want["texts"].as_array().unwrap();
    let pres = want["ids"].as_object().unwrap();
    assert_eq!(pres.len(), 4);
    for (pre, per_text) in pres {
        let tokenizer = worker::open::load_tokenizer(&dir.join(format!("{pre}.gguf")))
            .unwrap()
            .unwrap();
        for (text, hf) in texts.iter().zip(per_text.as_array().unwrap()) {
            let text = text.as_str().unwrap();
            let ours = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
            assert_eq!(ours, ids(hf), "pre-tokenizer {pre}: {text:?}");
            let back = tokenizer.decode(&ours, false).unwrap();
            assert_eq!(back, text, "pre-tokenizer {pre}: decoding");
        }
    }
}
