//! Tests of `config.json` parsing (included from `config.rs`).

use std::path::Path;

use serde_json::{Value, json};

use super::*;

fn base() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "bos_token_id": 1,
        "eos_token_id": 2
    })
}

fn parse(v: &Value) -> Result<ModelConfig, ConfigError> {
    ModelConfig::from_json(Path::new("config.json"), v, None)
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

#[test]
fn parses_plain_llama() {
    let c = parse(&base()).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.head_dim, 16);
    assert_eq!((c.q_dim(), c.kv_dim()), (64, 32));
    assert_eq!(c.rope.theta, 10_000.0);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert!(!c.tie_word_embeddings && !c.qkv_bias);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
}

#[test]
fn reads_the_fixture() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama");
    let c = ModelConfig::load(&dir).unwrap();
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.num_key_value_heads, 2);
    assert_eq!(c.rope.theta, 10_000.0);
    assert_eq!(c.eos_token_ids, vec![2]);
}

#[test]
fn both_rope_forms_agree() {
    let scaling = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let old = with(
        with(base(), "rope_theta", json!(500000.0)),
        "rope_scaling",
        scaling,
    );
    let mut params = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    params["rope_theta"] = json!(500000);
    let new = with(base(), "rope_parameters", params);
    let (a, b) = (parse(&old).unwrap(), parse(&new).unwrap());
    assert_eq!(a.rope, b.rope);
    assert_eq!(a.rope.theta, 500_000.0);
    assert_eq!(
        a.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
}

#[test]
fn type_is_an_alias_of_rope_type() {
    let v = with(
        base(),
        "rope_scaling",
        json!({"type": "linear", "factor": 2.0}),
    );
    assert_eq!(
        parse(&v).unwrap().rope.scaling,
        RopeScaling::Linear { factor: 2.0 }
    );
}

#[test]
fn unknown_rope_type_names_the_field() {
    let v = with(
        base(),
        "rope_scaling",
        json!({"rope_type": "yarn", "factor": 4.0}),
    );
    match parse(&v) {
        Err(ConfigError::Unsupported { field, value, .. }) => {
            assert_eq!(field, "rope_scaling.rope_type");
            assert_eq!(value, "yarn");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let v = with(base(), "rope_parameters", json!({"rope_type": "dynamic"}));
    assert!(matches!(
        parse(&v),
        Err(ConfigError::Unsupported { field, .. }) if field == "rope_parameters.rope_type"
    ));
}

/// Llama 3.1's scaling, in f64, written from the published formula.
fn llama3_reference(theta: f64, d: usize, factor: f64, lo: f64, hi: f64, old: f64) -> Vec<f64> {
    (0..d / 2)
        .map(|i| {
            let f = 1.0 / theta.powf((2 * i) as f64 / d as f64);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < old / hi {
                f
            } else if wavelen > old / lo {
                f / factor
            } else {
                let s = (old / wavelen - lo) / (hi - lo);
                (1.0 - s) * f / factor + s * f
            }
        })
        .collect()
}

#[test]
fn llama3_inv_freq_matches_formula() {
    let rope = RopeConfig {
        theta: 500_000.0,
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        },
        freq_factors: None,
    };
    let got = rope.inv_freq(128);
    let want = llama3_reference(500_000.0, 128, 8.0, 1.0, 4.0, 8192.0);
    assert_eq!(got.len(), 64);
    let (mut low, mut mid, mut high) = (0, 0, 0);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let rel = ((f64::from(g) - w) / w).abs();
        assert!(rel < 1e-5, "inv_freq[{i}] = {g}, expected {w}");
        let base = 1.0 / 500_000f64.powf((2 * i) as f64 / 128.0);
        let ratio = w / base;
        if (ratio - 1.0).abs() < 1e-12 {
            high += 1;
        } else if (ratio - 0.125).abs() < 1e-12 {
            low += 1;
        } else {
            mid += 1;
        }
    }
    // All three regimes are exercised.
    assert!(low > 0 && mid > 0 && high > 0, "{low} {mid} {high}");
    assert_eq!(got[0], 1.0);
}

#[test]
fn default_and_linear_inv_freq() {
    let mut rope = RopeConfig {
        theta: 10_000.0,
        scaling: RopeScaling::Default,
        freq_factors: None,
    };
    let d = rope.inv_freq(16);
    assert_eq!(d.len(), 8);
    for (i, &f) in d.iter().enumerate() {
        let want = 1.0 / 10_000f64.powf(i as f64 / 8.0);
        assert!(((f64::from(f) - want) / want).abs() < 1e-6);
    }
    rope.scaling = RopeScaling::Linear { factor: 4.0 };
    for (a, b) in rope.inv_freq(16).iter().zip(&d) {
        assert_eq!(*a, b / 4.0);
    }
}

/// A GGUF's `rope_freqs.weight` as llama.cpp's converter writes it for Llama 3.1 (one divisor per
/// frequency: 1 for high frequencies, `factor` for low ones, the smooth blend between), applied to
/// plain RoPE, gives what transformers computes from the `llama3` parameters.
#[test]
fn llama3_freq_factors_give_llama3_inv_freq() {
    let (factor, low, high, old_ctx) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let factors: Vec<f32> = (0..64)
        .map(|i| {
            let base = 1.0 / 500_000f64.powf((2 * i) as f64 / 128.0);
            let wavelen = 2.0 * std::f64::consts::PI / base;
            if wavelen < old_ctx / high {
                1.0
            } else if wavelen > old_ctx / low {
                factor as f32
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect();
    let v = with(
        with(base(), "rope_theta", json!(500_000.0)),
        "rope_freq_factors",
        json!(factors),
    );
    let v = with(v, "head_dim", json!(128));
    let c = parse(&v).unwrap();
    let got = c.rope.inv_freq(128);
    let want = llama3_reference(500_000.0, 128, factor, low, high, old_ctx);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            ((f64::from(g) - w) / w).abs() < 1e-5,
            "inv_freq[{i}] = {g}, expected {w}"
        );
    }
}

#[test]
fn bad_freq_factors_are_named() {
    for bad in [
        json!([1.0, 2.0]),
        json!("x"),
        json!(vec![-1.0; 4]),
        json!(vec![0.0; 4]),
    ] {
        let v = with(with(base(), "head_dim", json!(8)), "rope_freq_factors", bad);
        let err = parse(&v).unwrap_err();
        assert!(err.to_string().contains("rope_freq_factors"), "{err}");
    }
}

#[test]
fn explicit_head_dim_wins() {
    let v = with(base(), "head_dim", json!(32));
    let c = parse(&v).unwrap();
    assert_eq!((c.head_dim, c.q_dim(), c.kv_dim()), (32, 128, 64));
    // null head_dim falls back to hidden / heads.
    assert_eq!(
        parse(&with(base(), "head_dim", Value::Null))
            .unwrap()
            .head_dim,
        16
    );
}

#[test]
fn eos_lists_merge_with_generation_config() {
    let v = with(base(), "eos_token_id", json!([2, 7]));
    let generation = json!({"bos_token_id": 5, "eos_token_id": [9, 2]});
    let c = ModelConfig::from_json(
        Path::new("config.json"),
        &v,
        Some((Path::new("generation_config.json"), &generation)),
    )
    .unwrap();
    assert_eq!(c.eos_token_ids, vec![9, 2, 7]);
    assert_eq!(c.bos_token_id, Some(5));
    let bad = json!({"eos_token_id": "two"});
    let err = ModelConfig::from_json(
        Path::new("config.json"),
        &v,
        Some((Path::new("generation_config.json"), &bad)),
    )
    .unwrap_err();
    assert!(
        matches!(&err, ConfigError::InvalidField { path, field, .. }
            if field == "eos_token_id" && path.ends_with("generation_config.json")),
        "{err}"
    );
}

#[test]
fn qwen2_has_qkv_bias_and_tied_embeddings() {
    let mut v = with(base(), "architectures", json!(["Qwen2ForCausalLM"]));
    v["tie_word_embeddings"] = json!(true);
    v["sliding_window"] = json!(32768);
    v["use_sliding_window"] = json!(false);
    let c = parse(&v).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.qkv_bias && c.tie_word_embeddings);
    v["use_sliding_window"] = json!(true);
    assert!(matches!(
        parse(&v),
        Err(ConfigError::Unsupported { field, .. }) if field == "sliding_window"
    ));
}

#[test]
fn mistral_sliding_window_is_rejected() {
    let v = with(base(), "architectures", json!(["MistralForCausalLM"]));
    assert_eq!(
        parse(&with(v.clone(), "sliding_window", Value::Null))
            .unwrap()
            .architecture,
        Architecture::Mistral
    );
    let err = parse(&with(v, "sliding_window", json!(4096))).unwrap_err();
    assert!(
        matches!(&err, ConfigError::Unsupported { field, value, .. }
            if field == "sliding_window" && value == "4096"),
        "{err}"
    );
    assert!(err.to_string().contains("not supported yet"));
}

#[test]
fn rejects_what_cannot_run() {
    let cases = [
        ("architectures", json!(["GPT2LMHeadModel"]), "architectures"),
        ("hidden_act", json!("gelu"), "hidden_act"),
        ("mlp_bias", json!(true), "mlp_bias"),
        ("partial_rotary_factor", json!(0.5), "partial_rotary_factor"),
    ];
    for (key, value, field_want) in cases {
        match parse(&with(base(), key, value)) {
            Err(ConfigError::Unsupported { field, .. }) => assert_eq!(field, field_want),
            other => panic!("{key}: expected Unsupported, got {other:?}"),
        }
    }
}

#[test]
fn inconsistent_shapes_are_errors() {
    let cases = [
        with(base(), "hidden_size", json!(65)),
        with(base(), "num_key_value_heads", json!(3)),
        with(base(), "num_hidden_layers", json!(0)),
        with(base(), "head_dim", json!(15)),
    ];
    for v in cases {
        assert!(
            matches!(parse(&v), Err(ConfigError::InconsistentConfig { .. })),
            "{v}"
        );
    }
    let missing = {
        let mut v = base();
        v.as_object_mut().unwrap().remove("vocab_size");
        v
    };
    assert!(matches!(
        parse(&missing),
        Err(ConfigError::MissingField { field, .. }) if field == "vocab_size"
    ));
    assert!(matches!(
        parse(&with(base(), "hidden_size", json!("64"))),
        Err(ConfigError::InvalidField { field, .. }) if field == "hidden_size"
    ));
    let llama3_missing = with(
        base(),
        "rope_scaling",
        json!({"rope_type": "llama3", "factor": 8.0}),
    );
    assert!(matches!(
        parse(&llama3_missing),
        Err(ConfigError::MissingField { field, .. }) if field == "rope_scaling.low_freq_factor"
    ));
}
