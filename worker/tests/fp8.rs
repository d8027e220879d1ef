//! FP8 checkpoints and `--quantization fp8` on the CPU reference backend, against the fixtures
//! `scripts/make_fp8_checkpoint.py` writes from tiny-llama (compressed-tensors FP8_DYNAMIC and FP8,
//! AutoFP8): the configs are detected, the stored codes equal this engine's quantizer bit for bit,
//! the models run close to the float32 reference, and every kind of bad scale is a typed error
//! naming the tensor.

mod common;

use std::path::Path;

use common::{Tensors, edited, fixture, last_logits, rel_l2};
use safetensors::Dtype as StDtype;
use serde_json::Value;
use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::checkpoint::names::{LINEAR_WEIGHTS, layer_tensor};
use worker::checkpoint::{Checkpoint, CheckpointError};
use worker::config::{ConfigError, ModelConfig};
use worker::quant::fp8::{amax, e4m3_from_f32, scale_for};
use worker::quant::{ActivationScheme, Fp8Format, Quantization, ScaleGranularity, StoredQuant};

fn expected() -> Vec<(Vec<u32>, Vec<f32>)> {
    let text = std::fs::read_to_string(fixture("tiny-llama/expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["prompt"].as_array().unwrap();
            let logits = c["last_logits"].as_array().unwrap();
            (
                ids.iter().map(|t| t.as_u64().unwrap() as u32).collect(),
                logits.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
            )
        })
        .collect()
}

/// The last position's logits of `prompt` on the CPU backend.
fn cpu_last_logits(dir: &Path, quantization: Option<Quantization>, prompt: &[u32]) -> Vec<f32> {
    let (config, ckpt) = Checkpoint::load(dir).unwrap();
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 16,
        quantization,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    let mut backend = CpuBackend::new(&config, &ckpt, options).unwrap();
    last_logits(&mut backend, prompt)
}

#[test]
fn configs_are_detected() {
    let q = |name: &str| match ModelConfig::load(&fixture(name)).unwrap().quantization {
        Some(StoredQuant::Fp8(c)) => Some(c),
        None => None,
        Some(other) => panic!("{name}: {other:?}"),
    };
    assert_eq!(q("tiny-llama"), None);
    let dynamic = q("tiny-llama-fp8-dynamic").unwrap();
    assert_eq!(dynamic.format, Fp8Format::CompressedTensors);
    assert_eq!(dynamic.weights, Some(ScaleGranularity::Channel));
    assert_eq!(dynamic.activations, ActivationScheme::DynamicPerToken);
    assert_eq!(dynamic.ignored, vec!["lm_head".to_owned()]);
    let stat = q("tiny-llama-fp8-static").unwrap();
    assert_eq!(
        (stat.weights, stat.activations),
        (Some(ScaleGranularity::Tensor), ActivationScheme::Static)
    );
    let auto = q("tiny-llama-autofp8").unwrap();
    assert_eq!(
        (auto.format, auto.weights, auto.activations),
        (Fp8Format::Fp8, None, ActivationScheme::DynamicPerToken)
    );
}

/// Each fixture's codes and scales, recomputed here with the engine's quantizer from the float32
/// source: equal bit for bit to what the independent Python quantizer wrote.
#[test]
fn stored_codes_equal_the_engine_quantizer() {
    let (config, source) = Checkpoint::load(&fixture("tiny-llama")).unwrap();
    for (name, per_channel, bf16_scales) in [
        ("tiny-llama-fp8-dynamic", true, true),
        ("tiny-llama-fp8-static", false, true),
        ("tiny-llama-autofp8", false, false),
    ] {
        let (_, fp8) = Checkpoint::load(&fixture(name)).unwrap();
        let mut checked = 0usize;
        for l in 0..config.num_hidden_layers {
            for suffix in LINEAR_WEIGHTS {
                let tensor = layer_tensor(l, suffix);
                let w = source.tensor_f32(&tensor).unwrap();
                let width = source.tensor(&tensor).unwrap().shape[1];
                let stored = fp8.tensor(&tensor).unwrap().data;
                let module = tensor.strip_suffix(".weight").unwrap();
                let scales = fp8.tensor_f32(&format!("{module}.weight_scale")).unwrap();
                let round = |s: f32| {
                    if bf16_scales {
                        half::bf16::from_f32(s).to_f32()
                    } else {
                        s
                    }
                };
                let tensor_scale = round(scale_for(amax(&w)));
                for (r, row) in w.chunks_exact(width).enumerate() {
                    let s = if per_channel {
                        round(scale_for(amax(row)))
                    } else {
                        tensor_scale
                    };
                    assert_eq!(
                        scales[if per_channel { r } else { 0 }],
                        s,
                        "{name} {tensor}"
                    );
                    for (c, &v) in row.iter().enumerate() {
                        let want = e4m3_from_f32(v / s);
                        assert_eq!(
                            stored[r * width + c],
                            want,
                            "{name} {tensor}[{r}, {c}] = {v}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 40_000, "{checked}");
    }
}

#[test]
fn fp8_models_run_close_to_float32() {
    for (prompt, reference) in expected() {
        let base = cpu_last_logits(&fixture("tiny-llama"), None, &prompt);
        assert!(rel_l2(&base, &reference) < 1e-4);
        let at_load = cpu_last_logits(&fixture("tiny-llama"), Some(Quantization::Fp8), &prompt);
        let err = rel_l2(&at_load, &reference);
        assert!(err > 1e-4 && err < 0.1, "--quantization fp8: {err}");
        eprintln!(
            "prompt of {}: --quantization fp8 relative L2 {err:.4}",
            prompt.len()
        );
        for name in [
            "tiny-llama-fp8-dynamic",
            "tiny-llama-fp8-static",
            "tiny-llama-autofp8",
        ] {
            let got = cpu_last_logits(&fixture(name), None, &prompt);
            let e = rel_l2(&got, &reference);
            assert!(e < 0.12, "{name}: relative L2 {e}");
            eprintln!("prompt of {}: {name} relative L2 {e:.4}", prompt.len());
            // `--quantization fp8` on an FP8 checkpoint changes nothing.
            assert_eq!(
                got,
                cpu_last_logits(&fixture(name), Some(Quantization::Fp8), &prompt)
            );
        }
        // The same scheme (channel weights, per-token activations) from the bf16-scaled fixture
        // and quantized at load differ only by the scales' bf16 rounding.
        let dynamic = cpu_last_logits(&fixture("tiny-llama-fp8-dynamic"), None, &prompt);
        assert!(rel_l2(&dynamic, &at_load) < 0.05);
    }
}

fn build(dir: &Path) -> Result<(), String> {
    let (config, ckpt) = Checkpoint::load(dir).map_err(|e| e.to_string())?;
    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 4,
        quantization: None,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    CpuBackend::new(&config, &ckpt, options)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A change to a fixture's config and tensors.
type Edit = Box<dyn FnOnce(&mut Value, &mut Tensors)>;

const Q0: &str = "model.layers.0.self_attn.q_proj";

#[test]
fn bad_scales_are_errors_naming_the_tensor() {
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "missing weight_scale",
            Box::new(|_, t| {
                t.remove(&format!("{Q0}.weight_scale"));
            }),
            "missing tensor `model.layers.0.self_attn.q_proj.weight_scale`",
        ),
        (
            "a scale of the wrong shape",
            Box::new(|_, t| {
                let s = t.get_mut(&format!("{Q0}.weight_scale")).unwrap();
                s.1 = vec![s.1[0] / 2, 2];
            }),
            "q_proj.weight_scale`: shape [32, 2]",
        ),
        (
            "a NaN scale",
            Box::new(|_, t| {
                let s = t.get_mut(&format!("{Q0}.weight_scale")).unwrap();
                s.2[2..4].copy_from_slice(&half::bf16::NAN.to_le_bytes());
            }),
            "value NaN at index 1",
        ),
        (
            "a zero scale",
            Box::new(|_, t| {
                let s = t.get_mut(&format!("{Q0}.weight_scale")).unwrap();
                s.2[0..2].copy_from_slice(&half::bf16::ZERO.to_le_bytes());
            }),
            "value 0 at index 0",
        ),
        (
            "a bf16 weight where FP8 is declared",
            Box::new(|_, t| {
                let w = t.get_mut(&format!("{Q0}.weight")).unwrap();
                w.0 = StDtype::BF16;
                w.2 = w.2.iter().flat_map(|&b| [0, b & 0x3f]).collect();
            }),
            "stored as BF16; config.json's quantization_config declares FP8",
        ),
        (
            "FP8 weights without a quantization_config",
            Box::new(|c, _| {
                c.as_object_mut().unwrap().remove("quantization_config");
            }),
            "stored as F8_E4M3, but config.json's quantization_config does not declare",
        ),
        (
            "an FP8 norm",
            Box::new(|_, t| {
                let n = t.get_mut("model.norm.weight").unwrap();
                n.0 = StDtype::F8_E4M3;
                n.2.truncate(n.2.len() / 4);
            }),
            "only decoder linear layers may be FP8",
        ),
    ];
    for (what, edit, want) in cases {
        let dir = edited("tiny-llama-fp8-dynamic", edit);
        let err = build(dir.path()).expect_err(what);
        assert!(err.contains(want), "{what}: {err}");
    }
    // A static scheme without its input scale.
    let dir = edited("tiny-llama-fp8-static", |_, t| {
        t.remove(&format!("{Q0}.input_scale"));
    });
    let err = build(dir.path()).expect_err("no input_scale");
    assert!(err.contains("q_proj.input_scale"), "{err}");
}

#[test]
fn unsupported_schemes_name_the_field() {
    let config = |edit: &dyn Fn(&mut Value)| {
        let dir = edited("tiny-llama-fp8-dynamic", |c, _| edit(c));
        ModelConfig::load(dir.path()).expect_err("unsupported")
    };
    let field = |e: &ConfigError| match e {
        ConfigError::Unsupported { field, .. } | ConfigError::MissingField { field, .. } => {
            field.clone()
        }
        other => panic!("{other:?}"),
    };
    let bnb =
        config(&|c| c["quantization_config"] = serde_json::json!({"quant_method": "bitsandbytes"}));
    assert_eq!(field(&bnb), "quantization_config.quant_method");
    let block = config(&|c| {
        c["quantization_config"] =
            serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]})
    });
    assert_eq!(field(&block), "quantization_config.weight_block_size");
    let int8 = config(&|c| {
        c["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] =
            serde_json::json!(4)
    });
    assert_eq!(
        field(&int8),
        "quantization_config.config_groups.group_0.weights.num_bits"
    );
    let per_tensor_dynamic = config(&|c| {
        c["quantization_config"]["config_groups"]["group_0"]["input_activations"]["strategy"] =
            serde_json::json!("tensor")
    });
    assert_eq!(
        field(&per_tensor_dynamic),
        "quantization_config.config_groups.group_0.input_activations.strategy"
    );
    // pack-quantized is INT4: this group's 8-bit float weights are refused by name.
    let pack = config(&|c| {
        c["quantization_config"]["format"] = serde_json::json!("pack-quantized");
    });
    assert_eq!(
        field(&pack),
        "quantization_config.config_groups.group_0.weights.num_bits"
    );
    let other = config(&|c| {
        c["quantization_config"]["format"] = serde_json::json!("marlin-24");
    });
    assert_eq!(field(&other), "quantization_config.format");
    // Through the checkpoint, the error keeps its type.
    let dir = edited("tiny-llama-fp8-dynamic", |c, _| {
        c["quantization_config"]["quant_method"] = serde_json::json!("bitsandbytes");
    });
    assert!(matches!(
        Checkpoint::load(dir.path()),
        Err(CheckpointError::Config(ConfigError::Unsupported { .. }))
    ));
}

/// `--kv-cache-dtype fp8`'s scales: the checkpoint's `self_attn.k_scale` / `v_scale` (or
/// `kv_scale` for both) per layer, else 1.0; scales on some layers only, a non-positive or
/// non-finite scale, or one of the wrong shape is an error naming the tensor. A scale changes
/// what the cache holds (and so the logits); the same model without scales runs with 1.0.
#[test]
fn kv_cache_scales_come_from_the_checkpoint_or_are_errors() {
    use worker::quant::kv::{KvCacheDtype, KvScales};
    let scalar = |v: f32| (StDtype::F32, vec![], v.to_le_bytes().to_vec());
    type Entry = (&'static str, (StDtype, Vec<usize>, Vec<u8>));
    let with = |entries: Vec<Entry>| {
        edited("tiny-llama", move |_, t: &mut Tensors| {
            for (name, value) in entries {
                t.insert(name.to_owned(), value);
            }
        })
    };
    let k0 = "model.layers.0.self_attn.k_scale";
    let dir = with(vec![
        (k0, scalar(0.5)),
        ("model.layers.0.self_attn.v_scale", scalar(0.25)),
        ("model.layers.1.self_attn.kv_scale", scalar(2.0)),
    ]);
    let (config, ckpt) = Checkpoint::load(dir.path()).unwrap();
    let s = KvScales::load(&ckpt, config.num_hidden_layers).unwrap();
    assert_eq!(
        (s.k, s.v, s.from_checkpoint),
        (vec![0.5, 2.0], vec![0.25, 2.0], true)
    );
    let (plain_config, plain) = Checkpoint::load(&fixture("tiny-llama")).unwrap();
    let none = KvScales::load(&plain, plain_config.num_hidden_layers).unwrap();
    assert_eq!(
        (none.k, none.v, none.from_checkpoint),
        (vec![1.0; 2], vec![1.0; 2], false)
    );

    let logits = |dir: &Path, kv_cache_dtype| {
        let (config, ckpt) = Checkpoint::load(dir).unwrap();
        let options = CpuOptions {
            block_size: 16,
            num_kv_blocks: 16,
            quantization: None,
            kv_cache_dtype,
        };
        let mut cpu = CpuBackend::new(&config, &ckpt, options).unwrap();
        last_logits(&mut cpu, &(1..40).collect::<Vec<u32>>())
    };
    let exact = logits(&fixture("tiny-llama"), KvCacheDtype::Auto);
    let unit = logits(&fixture("tiny-llama"), KvCacheDtype::Fp8E4m3);
    let scaled = logits(dir.path(), KvCacheDtype::Fp8E4m3);
    let (e_unit, e_scaled) = (rel_l2(&unit, &exact), rel_l2(&scaled, &exact));
    println!("FP8 KV on tiny-llama: scales 1.0 {e_unit:.2e}, checkpoint scales {e_scaled:.2e}");
    assert!(e_unit > 0.0 && e_unit < 0.05 && e_scaled < 0.05);
    assert_ne!(unit, scaled, "the checkpoint's scales are used");

    for (entries, tensor, says) in [
        (
            vec![(k0, scalar(0.5))],
            "model.layers.0.self_attn.v_scale",
            "missing",
        ),
        (
            vec![
                (k0, scalar(f32::NAN)),
                ("model.layers.0.self_attn.v_scale", scalar(1.0)),
            ],
            k0,
            "finite and positive",
        ),
        (
            vec![("model.layers.1.self_attn.kv_scale", scalar(-1.0))],
            "model.layers.0.self_attn.k_scale",
            "missing",
        ),
        (
            vec![
                (
                    k0,
                    (
                        StDtype::F32,
                        vec![2],
                        [1f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect(),
                    ),
                ),
                ("model.layers.0.self_attn.v_scale", scalar(1.0)),
            ],
            k0,
            "one number per layer",
        ),
    ] {
        let dir = with(entries);
        let (config, ckpt) = Checkpoint::load(dir.path()).unwrap();
        let err = KvScales::load(&ckpt, config.num_hidden_layers).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(tensor) && text.contains(says), "{text}");
        let options = CpuOptions {
            block_size: 16,
            num_kv_blocks: 16,
            quantization: None,
            kv_cache_dtype: KvCacheDtype::Fp8E4m3,
        };
        assert!(CpuBackend::new(&config, &ckpt, options).is_err());
    }
}
