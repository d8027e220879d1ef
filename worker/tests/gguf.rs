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
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
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

/// A SentencePiece vocabulary (`tokenizer.ggml.model = llama`: pieces with scores and types, byte
/// fallback, a space prefix; `scripts/make_gguf_spm.py`) encodes hard strings as the SentencePiece
/// library itself does, adds BOS as the file asks, and decodes back to the text.
#[test]
fn a_sentencepiece_vocabulary_encodes_as_sentencepiece_does() {
    let dir = fixture("gguf-spm");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tokenizer = worker::open::load_tokenizer(&dir.join("vocab.gguf"))
        .unwrap()
        .unwrap();
    let texts = want["texts"].as_array().unwrap();
    for (text, spm) in texts.iter().zip(want["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let ours = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ours, ids(spm), "{text:?}");
        assert_eq!(
            tokenizer.decode(&ours, false).unwrap(),
            text,
            "decoding {text:?}"
        );
        let with_bos = tokenizer.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(with_bos[0], 1, "BOS first: {text:?}");
        assert_eq!(&with_bos[1..], &ours[..], "{text:?}");
    }
    // A special token in the text is its control piece, and the text after it gets its own space
    // prefix, as llama.cpp tokenizes.
    let ours = tokenizer
        .encode("</s>the", false)
        .unwrap()
        .get_ids()
        .to_vec();
    let the = tokenizer.encode("the", false).unwrap().get_ids().to_vec();
    assert_eq!(ours[0], 2);
    assert_eq!(&ours[1..], &the[..], "`▁the` after </s>");
}

/// A SentencePiece vocabulary without its scores, or with a model name nobody maps, is an error
/// naming the key, not a tokenizer that splits differently.
#[test]
fn bad_sentencepiece_vocabularies_are_errors_naming_the_key() {
    let bytes = std::fs::read(fixture("gguf-spm").join("vocab.gguf")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for (from, to, want) in [
        (
            &b"tokenizer.ggml.scores"[..],
            &b"tokenizer.ggml.scorez"[..],
            "tokenizer.ggml.scores",
        ),
        (
            b"tokenizer.ggml.model\x08\0\0\0\x05\0\0\0\0\0\0\0llama",
            b"tokenizer.ggml.model\x08\0\0\0\x05\0\0\0\0\0\0\0lllma",
            "\"lllma\"",
        ),
    ] {
        let mut b = bytes.clone();
        replace_once(&mut b, from, to);
        let path = tmp.path().join("vocab.gguf");
        std::fs::write(&path, &b).unwrap();
        let err = worker::open::load_tokenizer(&path).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}

/// A llama GGUF carrying Llama 3.1's RoPE scaling as llama.cpp's converter stores it (a
/// `rope_freqs.weight` divisor per frequency; `scripts/make_gguf_llama3_rope.py`) runs as the same
/// weights do from safetensors with the `llama3` `rope_scaling` it was computed from — and unlike
/// them without it, so the factors are applied, not dropped.
#[test]
fn rope_freqs_act_as_the_llama3_scaling_they_encode() {
    let dir = fixture("gguf-llama3-rope");
    let scaling: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("rope_scaling.json")).unwrap())
            .unwrap();
    let scaled = common::edited("tiny-llama", |config, _| {
        let theta = config["rope_parameters"]["rope_theta"].clone();
        let mut params = scaling.clone();
        params["rope_theta"] = theta;
        config["rope_parameters"] = params;
    });
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 16,
        quantization: None,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    let logits = |path: &std::path::Path| {
        let (config, ckpt) = Checkpoint::load(path).unwrap();
        let mut cpu = CpuBackend::new(&config, &ckpt, options).unwrap();
        let prompt: Vec<u32> = (0..96).map(|i| (i * 37 + 5) % 512).collect();
        (config, last_logits(&mut cpu, &prompt))
    };
    let (config, from_gguf) = logits(&dir.join("model.gguf"));
    assert_eq!(config.rope.freq_factors.as_ref().map(Vec::len), Some(8));
    let (_, from_config) = logits(scaled.path());
    let (_, unscaled) = logits(&fixture("tiny-llama"));
    let err = rel_l2(&from_gguf, &from_config);
    assert!(
        err < 1e-5,
        "GGUF rope_freqs against llama3 rope_scaling: relative L2 {err:.2e}"
    );
    let apart = rel_l2(&unscaled, &from_config);
    assert!(
        apart > 1e-3,
        "the scaling changes the logits by only {apart:.2e}"
    );
}

/// llama.cpp's own tokenizer test vectors (`models/ggml-vocab-NAME.gguf`, vocabulary-only files,
/// with `.inp` texts and `.out` ids made by the original tokenizers) for two SentencePiece
/// vocabularies (Llama 2, Phi-3) and three byte-level BPE ones (Llama 3, Qwen2, GPT-2): 46 hard
/// strings each. They ship in the llama.cpp that llama-cpp-python's PyPI sdist vendors, fetched by
/// `scripts/get-llama-vocabs.sh` into `$RINGSERVE_LLAMA_VOCABS`. Skipped, saying so, when that folder is not given; CI gives it
/// and sets `RINGSERVE_REQUIRE_LLAMA_VOCABS=1`, so there it cannot skip.
#[test]
fn llama_cpp_tokenizer_test_vectors() {
    let Some(dir) = std::env::var_os("RINGSERVE_LLAMA_VOCABS").map(std::path::PathBuf::from) else {
        assert!(
            std::env::var_os("RINGSERVE_REQUIRE_LLAMA_VOCABS").is_none(),
            "RINGSERVE_REQUIRE_LLAMA_VOCABS is set but RINGSERVE_LLAMA_VOCABS is not"
        );
        eprintln!("SKIPPED: RINGSERVE_LLAMA_VOCABS is not set (scripts/get-llama-vocabs.sh)");
        return;
    };
    for name in ["llama-spm", "phi-3", "llama-bpe", "qwen2", "gpt-2"] {
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let tokenizer = worker::open::load_tokenizer(&path).unwrap().unwrap();
        let read =
            |ext: &str| std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.{ext}")));
        let inputs = read("inp").unwrap();
        let outputs = read("out").unwrap();
        let marker = "\n__ggml_vocab_test__\n";
        let inputs = inputs.strip_suffix(marker).unwrap_or(&inputs);
        let texts: Vec<&str> = inputs.split(marker).collect();
        let want: Vec<&str> = outputs.split('\n').take(texts.len()).collect();
        assert_eq!(texts.len(), want.len(), "{name}: inputs and outputs");
        for (text, want) in texts.iter().zip(&want) {
            let want: Vec<u32> = want
                .split_whitespace()
                .map(|t| t.parse().unwrap())
                .collect();
            let ours = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
            assert_eq!(ours, want, "{name}: {text:?}");
        }
        eprintln!("{name}: {} texts as llama.cpp's vectors", texts.len());
    }
}

/// Every decoder linear of `path` that the file stores as `Q4_0` / `Q4_1`, read as its 4-bit
/// blocks (what the CUDA backend's INT4 kernels run), dequantizes to exactly the f32 weight the
/// checkpoint decodes from the same bytes (llama's q/k rows un-permuted the same way); other
/// types read as `None`. Returns how many of each type were checked.
fn q4_blocks_equal_the_decoded_weights(path: &std::path::Path) -> (usize, usize) {
    let (config, ckpt) = Checkpoint::load(path).unwrap();
    let (mut q4_0, mut q4_1) = (0, 0);
    for i in 0..config.num_hidden_layers {
        for suffix in worker::checkpoint::names::LINEAR_WEIGHTS {
            let name = worker::checkpoint::names::layer_tensor(i, suffix);
            let w = worker::quant::load::gguf_int4(&ckpt, &name).unwrap();
            match ckpt.gguf_type(&name).unwrap() {
                gguf::GgmlType::Q4_0 => q4_0 += 1,
                gguf::GgmlType::Q4_1 => q4_1 += 1,
                other => {
                    assert!(w.is_none(), "{name}: {other:?} read as 4-bit blocks");
                    continue;
                }
            }
            let w = w.unwrap_or_else(|| panic!("{name}: no 4-bit blocks"));
            assert_eq!(w.group_size, 32);
            assert_eq!(
                w.mins.is_some(),
                ckpt.gguf_type(&name) == Some(gguf::GgmlType::Q4_1)
            );
            let want = ckpt.tensor(&name).unwrap().to_f32_vec();
            let got = w.dequantize();
            assert_eq!(got.len(), want.len(), "{name}");
            let bad = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(bad, None, "{name}: first differing weight");
        }
    }
    assert_eq!(
        worker::quant::load::gguf_int4(&ckpt, "model.embed_tokens.weight").unwrap(),
        None
    );
    (q4_0, q4_1)
}

/// `tests/fixtures/gguf-q4` (`scripts/make_gguf_q4.py`: layer 0 in Q4_0, layer 1 in Q4_1, by
/// gguf-py's quantizers) and, when present, SmolLM2's Q4_1 file (9 heads, 3 KV heads: the q/k
/// un-permutation of blocks on a real model).
#[test]
fn q4_0_and_q4_1_blocks_read_as_the_weights_they_encode() {
    let fixture_counts =
        q4_blocks_equal_the_decoded_weights(&fixture("gguf-q4").join("model.gguf"));
    assert_eq!(fixture_counts, (7, 7));
    let smol = std::env::var_os("RINGSERVE_SMOLLM2_GGUF").map_or_else(
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../models/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        std::path::PathBuf::from,
    );
    if smol.is_file() {
        assert_eq!(q4_blocks_equal_the_decoded_weights(&smol), (0, 30 * 7));
    } else {
        assert!(
            std::env::var_os("RINGSERVE_REQUIRE_SMOLLM2").is_none_or(|v| v != "1"),
            "RINGSERVE_REQUIRE_SMOLLM2=1 but {} is missing",
            smol.display()
        );
        eprintln!("SKIPPED (SmolLM2 part): {} is missing", smol.display());
    }
}
