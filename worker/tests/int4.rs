//! INT4 checkpoints (AWQ, GPTQ, compressed-tensors pack-quantized) on the CPU reference backend, against the fixtures
//! `scripts/make_int4_checkpoint.py` writes (see `tests/fixtures/int4-awq/README.md`): the configs
//! are detected, each model's logits equal its dequantized twin's bit for bit (the twin is a plain
//! float32 checkpoint the script dequantized with its own code), the twin's greedy tokens and
//! logits are HuggingFace transformers' (its `expected.json`), and every kind of bad INT4 tensor or
//! option is a typed error naming it.

mod common;

use std::path::Path;

use common::{Tensors, edited, fixture, last_logits};
use safetensors::Dtype as StDtype;
use serde_json::Value;
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::checkpoint::Checkpoint;
use worker::config::{ConfigError, ModelConfig};
use worker::quant::int4::{self, AWQ_PACK_ORDER};
use worker::quant::{Int4Format, Quantization, StoredQuant};

/// INT4 fixtures whose twin holds HF transformers' run (`expected.json`).
const FIXTURES: [&str; 6] = [
    "int4-awq",
    "int4-gptq",
    "int4-gptq-sym",
    "int4-ct-sym",
    "int4-ct-asym",
    "int4-ct-group",
];

fn backend(dir: &Path, quantization: Option<Quantization>) -> Result<CpuBackend, String> {
    let (config, ckpt) = Checkpoint::load(dir).map_err(|e| e.to_string())?;
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 16,
        quantization,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    CpuBackend::new(&config, &ckpt, options).map_err(|e| e.to_string())
}

/// The error of a backend that must not build.
fn refused(r: Result<CpuBackend, String>, what: &str) -> String {
    match r {
        Ok(_) => panic!("{what}: built"),
        Err(e) => e,
    }
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = x.iter().map(|v| (*v as f64 - m).exp()).sum();
    x.iter().map(|v| *v as f64 - m - sum.ln()).collect()
}

/// Greedy continuation of `prompt` by `steps` tokens, re-running the whole sequence each step (the
/// CPU backend is exact either way; this keeps the test free of cache bookkeeping).
fn greedy(b: &mut CpuBackend, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<Vec<f64>>) {
    let mut seq = prompt.to_vec();
    let (mut out, mut logprobs) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let logits = last_logits(b, &seq);
        let t = argmax(&logits);
        logprobs.push(log_softmax(&logits));
        out.push(t);
        seq.push(t);
    }
    (out, logprobs)
}

#[test]
fn int4_configs_are_detected() {
    let q = |name: &str| match ModelConfig::load(&fixture(name)).unwrap().quantization {
        Some(StoredQuant::Int4(c)) => c,
        other => panic!("{name}: {other:?}"),
    };
    let awq = q("int4-awq");
    assert_eq!(
        (awq.format, awq.group_size, awq.desc_act),
        (Int4Format::Awq, Some(32), false)
    );
    let gptq = q("int4-gptq");
    assert_eq!(
        (gptq.format, gptq.group_size, gptq.desc_act, gptq.sym),
        (Int4Format::Gptq { v1_zeros: true }, Some(64), true, false)
    );
    let sym = q("int4-gptq-sym");
    assert_eq!((sym.group_size, sym.sym), (Some(128), true));
    let ct = q("int4-ct-sym");
    assert_eq!(
        (ct.format, ct.group_size, ct.sym, ct.ignored),
        (
            Int4Format::CompressedTensors,
            Some(128),
            true,
            vec!["lm_head".to_owned()]
        )
    );
    let ct = q("int4-ct-asym");
    assert_eq!((ct.group_size, ct.sym), (Some(64), false));
    let ct = q("int4-ct-group");
    assert_eq!(
        (ct.format, ct.group_size, ct.sym, ct.desc_act),
        (Int4Format::CompressedTensors, Some(32), false, true)
    );
    assert_eq!(
        ModelConfig::load(&fixture("int4-awq-twin"))
            .unwrap()
            .quantization,
        None
    );
}

#[test]
fn int4_models_equal_their_dequantized_twins_bit_for_bit() {
    let prompts: [&[u32]; 3] = [&[1, 17, 42, 99, 3], &[1, 200, 5], &[7; 20]];
    for name in FIXTURES {
        let mut int4 = backend(&fixture(name), None).unwrap();
        let mut twin = backend(&fixture(&format!("{name}-twin")), None).unwrap();
        for p in prompts {
            let (a, b) = (last_logits(&mut int4, p), last_logits(&mut twin, p));
            assert_eq!(a, b, "{name}: prompt {p:?}");
        }
    }
}

/// `expected.json` of a twin: HF transformers' float32 run (written by
/// `scripts/int4_hf_reference.py`; see the fixtures' README).
fn hf_cases(twin: &str) -> Vec<(Vec<u32>, Vec<f32>, Vec<u32>)> {
    let text = std::fs::read_to_string(fixture(twin).join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let logits = c["last_logits"].as_array().unwrap();
            (
                ids(&c["prompt"]),
                logits.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
                ids(&c["greedy"]),
            )
        })
        .collect()
}

#[test]
fn int4_greedy_tokens_are_hf_transformers_on_the_twin() {
    for name in FIXTURES {
        let twin = format!("{name}-twin");
        let mut int4 = backend(&fixture(name), None).unwrap();
        for (prompt, hf_logits, hf_greedy) in hf_cases(&twin) {
            let ours = last_logits(&mut int4, &prompt);
            let (a, b) = (log_softmax(&ours), log_softmax(&hf_logits));
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-4, "{name}: logprobs differ by {worst}");
            let (tokens, _) = greedy(&mut int4, &prompt, hf_greedy.len());
            assert_eq!(tokens, hf_greedy, "{name}: prompt {prompt:?}");
        }
    }
}

#[test]
fn quantization_flag_is_checked_against_the_checkpoint() {
    for (name, ok) in [
        ("int4-awq", [Quantization::Awq]),
        ("int4-gptq", [Quantization::Gptq]),
    ] {
        backend(&fixture(name), Some(ok[0])).unwrap();
    }
    // The kernel-named aliases vLLM accepts.
    assert_eq!("awq_marlin".parse(), Ok(Quantization::Awq));
    assert_eq!("gptq_marlin".parse(), Ok(Quantization::Gptq));
    let err = |dir: &str, q| refused(backend(&fixture(dir), Some(q)), "refused");
    let e = err("int4-awq", Quantization::Gptq);
    assert!(
        e.contains("--quantization gptq does not match") && e.contains("\"awq\""),
        "{e}"
    );
    let e = err("int4-gptq", Quantization::Fp8);
    assert!(e.contains("--quantization fp8 does not match"), "{e}");
    let e = err("int4-awq-twin", Quantization::Awq);
    assert!(e.contains("this one is not quantized"), "{e}");
}

type Edit = Box<dyn FnOnce(&mut Value, &mut Tensors)>;

const Q0: &str = "model.layers.0.self_attn.q_proj";
const D1: &str = "model.layers.1.mlp.down_proj";

#[test]
fn bad_int4_tensors_are_errors_naming_the_tensor() {
    let cases: Vec<(&str, &str, Edit, &str)> = vec![
        (
            "int4-awq",
            "a missing qzeros",
            Box::new(|_, t| {
                t.remove(&format!("{Q0}.qzeros"));
            }),
            "missing tensor `model.layers.0.self_attn.q_proj.qzeros`",
        ),
        (
            "int4-awq",
            "a qweight of the wrong shape (GPTQ's, in an AWQ checkpoint)",
            Box::new(|_, t| {
                let q = t.get_mut(&format!("{Q0}.qweight")).unwrap();
                q.1 = vec![q.1[0] / 8, q.1[1] * 8];
            }),
            "q_proj.qweight`: shape [16, 128], expected [128, 16]",
        ),
        (
            "int4-awq",
            "a float qweight",
            Box::new(|_, t| {
                let q = t.get_mut(&format!("{Q0}.qweight")).unwrap();
                q.0 = StDtype::F32;
            }),
            "q_proj.qweight`: stored as F32; expected [I32]",
        ),
        (
            "int4-awq",
            "a group size that does not divide the input",
            Box::new(|c, _| c["quantization_config"]["group_size"] = 96.into()),
            "group_size 96 does not divide the layer's 128 input features",
        ),
        (
            "int4-awq",
            "a NaN scale",
            Box::new(|_, t| {
                let s = t.get_mut(&format!("{D1}.scales")).unwrap();
                s.2[2..4].copy_from_slice(&half::f16::NAN.to_le_bytes());
            }),
            "down_proj.scales`: value NaN at index 1",
        ),
        (
            "int4-gptq",
            "desc_act without g_idx",
            Box::new(|_, t| {
                t.remove(&format!("{D1}.g_idx"));
            }),
            "missing tensor `model.layers.1.mlp.down_proj.g_idx`",
        ),
        (
            "int4-gptq",
            "a g_idx out of range",
            Box::new(|_, t| {
                let g = t.get_mut(&format!("{D1}.g_idx")).unwrap();
                g.2[0..4].copy_from_slice(&9i32.to_le_bytes());
            }),
            "down_proj.g_idx`: value 9 at index 0: groups are 0..4",
        ),
        (
            "int4-ct-group",
            "actorder group without weight_g_idx",
            Box::new(|_, t| {
                t.remove(&format!("{D1}.weight_g_idx"));
            }),
            "missing tensor `model.layers.1.mlp.down_proj.weight_g_idx`",
        ),
        (
            "int4-ct-group",
            "a weight_g_idx out of range",
            Box::new(|_, t| {
                let g = t.get_mut(&format!("{D1}.weight_g_idx")).unwrap();
                g.2[4..8].copy_from_slice(&(-1i32).to_le_bytes());
            }),
            "down_proj.weight_g_idx`: value -1 at index 1: groups are 0..8",
        ),
        (
            "int4-ct-asym",
            "asymmetric pack-quantized without its zero points",
            Box::new(|_, t| {
                t.remove(&format!("{D1}.weight_zero_point"));
            }),
            "missing tensor `model.layers.1.mlp.down_proj.weight_zero_point`",
        ),
        (
            "int4-ct-sym",
            "a weight_scale laid out as AWQ's (transposed)",
            Box::new(|_, t| {
                let s = t.get_mut(&format!("{D1}.weight_scale")).unwrap();
                s.1 = vec![s.1[1], s.1[0]];
            }),
            "down_proj.weight_scale`: shape [2, 128], expected [128, 2]",
        ),
        (
            "int4-gptq",
            "an integer norm",
            Box::new(|_, t| {
                let n = t.get_mut("model.norm.weight").unwrap();
                n.0 = StDtype::I32;
            }),
            "only the packed tensors of INT4 linear layers may be integers",
        ),
        (
            "int4-gptq",
            "packed weights without a quantization_config",
            Box::new(|c, _| {
                c.as_object_mut().unwrap().remove("quantization_config");
            }),
            "missing tensor `model.layers.0.self_attn.q_proj.weight`",
        ),
    ];
    for (name, what, edit, want) in cases {
        let dir = edited(name, edit);
        let err = refused(backend(dir.path(), None), what);
        assert!(err.contains(want), "{what}: {err}");
    }
}

#[test]
fn unsupported_int4_configs_name_the_field() {
    let config = |name: &str, edit: &dyn Fn(&mut Value)| {
        let dir = edited(name, |c, _| edit(c));
        ModelConfig::load(dir.path()).expect_err("unsupported")
    };
    let field = |e: &ConfigError| match e {
        ConfigError::Unsupported { field, .. } | ConfigError::MissingField { field, .. } => {
            field.clone()
        }
        other => panic!("{other:?}"),
    };
    let q = "quantization_config";
    let bits = config("int4-gptq", &|c| c[q]["bits"] = 8.into());
    assert_eq!(field(&bits), "quantization_config.bits");
    let gemv = config("int4-awq", &|c| c[q]["version"] = "gemv".into());
    assert_eq!(field(&gemv), "quantization_config.version");
    let group = config("int4-gptq", &|c| c[q]["group_size"] = 100.into());
    assert_eq!(field(&group), "quantization_config.group_size");
    let lm_head = config("int4-gptq", &|c| c[q]["lm_head"] = true.into());
    assert_eq!(field(&lm_head), "quantization_config.lm_head");
    let format = config("int4-gptq", &|c| {
        c[q]["checkpoint_format"] = "marlin".into()
    });
    assert_eq!(field(&format), "quantization_config.checkpoint_format");
    let w = "quantization_config.config_groups.group_0.weights";
    let order = config("int4-ct-sym", &|c| {
        c[q]["config_groups"]["group_0"]["weights"]["actorder"] = "random".into()
    });
    assert_eq!(field(&order), format!("{w}.actorder"));
    let w4a8 = config("int4-ct-sym", &|c| {
        c[q]["config_groups"]["group_0"]["input_activations"] =
            serde_json::json!({"num_bits": 8, "type": "int"})
    });
    assert_eq!(
        field(&w4a8),
        "quantization_config.config_groups.group_0.input_activations"
    );
    let tensor = config("int4-ct-sym", &|c| {
        c[q]["config_groups"]["group_0"]["weights"]["strategy"] = "tensor".into()
    });
    assert_eq!(field(&tensor), format!("{w}.strategy"));
}

/// Packs `[out, in]` codes the way AutoAWQ does (an implementation written from its docs, apart
/// from the engine's reader).
fn awq_pack(codes: &[u8], out: usize, inp: usize) -> Vec<i32> {
    let mut words = vec![0u32; inp * out / 8];
    for i in 0..inp {
        for c in 0..out / 8 {
            for (j, &o) in AWQ_PACK_ORDER.iter().enumerate() {
                words[i * out / 8 + c] |= u32::from(codes[(8 * c + o) * inp + i]) << (4 * j);
            }
        }
    }
    words.into_iter().map(|w| w as i32).collect()
}

#[test]
fn awq_and_gptq_unpacking_round_trip() {
    let (out, inp) = (16, 24);
    let codes: Vec<u8> = (0..out * inp)
        .map(|i| ((i * 7 + i / 5) % 16) as u8)
        .collect();
    assert_eq!(
        int4::unpack_awq_transposed(&awq_pack(&codes, out, inp), inp, out),
        codes
    );
    // GPTQ: input rows 8p + j in bits 4j of word [p, o].
    let mut words = vec![0u32; inp / 8 * out];
    for p in 0..inp / 8 {
        for o in 0..out {
            for j in 0..8 {
                words[p * out + o] |= u32::from(codes[o * inp + 8 * p + j]) << (4 * j);
            }
        }
    }
    let words: Vec<i32> = words.into_iter().map(|w| w as i32).collect();
    assert_eq!(int4::unpack_gptq_transposed(&words, inp, out), codes);
    // The v1 off-by-one: a stored 15 (zero 0, minus one, masked) reads back as 16.
    let zeros = int4::unpack_gptq_rows(&[0x0000_00f0u32 as i32], 1, 8);
    assert_eq!(zeros, [0, 15, 0, 0, 0, 0, 0, 0]);
}
