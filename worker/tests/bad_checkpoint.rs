//! Every way a checkpoint folder can be broken gives its own typed error, naming file and tensor.

use std::collections::HashMap;
use std::path::Path;

use safetensors::Dtype as StDtype;
use safetensors::tensor::TensorView as StView;
use serde_json::{Value, json};
use worker::checkpoint::names::{self, expected_tensors, layer, layer_tensor};
use worker::checkpoint::{Checkpoint, CheckpointError, Dtype};
use worker::config::{ConfigError, ModelConfig};

fn config_json() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false
    })
}

/// A tensor to write: dtype, shape, raw bytes.
type Tensors = HashMap<String, (StDtype, Vec<usize>, Vec<u8>)>;

/// f32 tensors of the right shapes for `config`, with deterministic small values.
fn good_tensors(config: &Value) -> Tensors {
    let cfg = ModelConfig::from_json(Path::new("config.json"), config, None).unwrap();
    expected_tensors(&cfg)
        .enumerate()
        .map(|(k, (name, shape))| {
            let n: usize = shape.iter().product();
            let bytes = (0..n)
                .flat_map(|i| (((i * 7 + k * 13) % 17) as f32 * 0.01 - 0.08).to_le_bytes())
                .collect();
            (name, (StDtype::F32, shape, bytes))
        })
        .collect()
}

fn write_safetensors(path: &Path, tensors: &Tensors) {
    let views: Vec<(String, StView<'_>)> = tensors
        .iter()
        .map(|(name, (dtype, shape, bytes))| {
            (
                name.clone(),
                StView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn write_folder(dir: &Path, config: &Value, tensors: &Tensors) {
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors);
}

/// Writes a folder and loads it.
fn load_with(config: &Value, tensors: &Tensors) -> Result<(), CheckpointError> {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), config, tensors);
    Checkpoint::load(dir.path()).map(|_| ())
}

#[test]
fn good_checkpoint_loads_and_builds_a_backend() {
    let config = config_json();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &config, &good_tensors(&config));
    let (cfg, ckpt) = Checkpoint::load(dir.path()).unwrap();
    let view = ckpt.tensor(names::EMBED_TOKENS).unwrap();
    assert_eq!(view.shape, &[32, 16]);
    assert_eq!(view.dtype, Dtype::F32);
    assert_eq!(view.numel(), 512);
    let options = worker::backend::BackendOptions {
        num_kv_blocks: Some(8),
        ..Default::default()
    };
    let backend = worker::backend::load_backend(&cfg, &ckpt, &options).unwrap();
    assert_eq!((backend.name(), backend.num_kv_blocks()), ("cpu", 8));
    let cuda = worker::backend::BackendOptions {
        device: worker::backend::Device::Cuda(0),
        ..options
    };
    if !cfg!(feature = "cuda") {
        assert!(matches!(
            worker::backend::load_backend(&cfg, &ckpt, &cuda),
            Err(worker::backend::BackendError::NotCompiled("cuda"))
        ));
    }
}

#[test]
fn missing_tensor() {
    let config = config_json();
    let mut tensors = good_tensors(&config);
    let name = layer_tensor(1, layer::UP_PROJ);
    tensors.remove(&name);
    match load_with(&config, &tensors) {
        Err(CheckpointError::MissingTensor { path, tensor }) => {
            assert_eq!(tensor, name);
            assert!(path.ends_with("model.safetensors"));
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // Untied config without lm_head.
    let mut tensors = good_tensors(&config);
    tensors.remove(names::LM_HEAD);
    assert!(matches!(
        load_with(&config, &tensors),
        Err(CheckpointError::MissingTensor { tensor, .. }) if tensor == names::LM_HEAD
    ));
}

#[test]
fn wrong_shape() {
    let config = config_json();
    let mut tensors = good_tensors(&config);
    let name = layer_tensor(0, layer::K_PROJ);
    // [kv_dim = 8, hidden = 16] stored as [16, 8].
    tensors.get_mut(&name).unwrap().1 = vec![16, 8];
    let err = load_with(&config, &tensors).unwrap_err();
    match &err {
        CheckpointError::WrongShape {
            tensor,
            expected,
            actual,
            ..
        } => {
            assert_eq!(tensor, &name);
            assert_eq!(
                (expected.as_slice(), actual.as_slice()),
                (&[8, 16][..], &[16, 8][..])
            );
        }
        other => panic!("expected WrongShape, got {other:?}"),
    }
    assert!(err.to_string().contains("k_proj"), "{err}");
}

#[test]
fn wrong_dtype() {
    let config = config_json();
    let mut tensors = good_tensors(&config);
    let name = names::FINAL_NORM.to_owned();
    tensors.get_mut(&name).unwrap().0 = StDtype::I32;
    match load_with(&config, &tensors) {
        Err(CheckpointError::UnsupportedDtype { tensor, dtype, .. }) => {
            assert_eq!(tensor, name);
            assert_eq!(
                dtype,
                "I32 (only the packed tensors of INT4 linear layers may be integers)"
            );
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
    // A dtype no layer may have.
    let t = tensors.get_mut(&name).unwrap();
    t.0 = StDtype::I64;
    t.1 = vec![t.2.len() / 8];
    match load_with(&config, &tensors) {
        Err(CheckpointError::UnsupportedDtype { tensor, dtype, .. }) => {
            assert_eq!((tensor, dtype), (name, "I64".to_owned()));
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
}

#[test]
fn truncated_file() {
    let config = config_json();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &config, &good_tensors(&config));
    let path = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&path).unwrap().len();
    for cut in [len - 10, 100, 4] {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(cut).unwrap();
        match Checkpoint::open(dir.path()) {
            Err(CheckpointError::Truncated {
                path: p,
                expected,
                actual,
            }) => {
                assert!(p.ends_with("model.safetensors"));
                assert_eq!(actual, cut);
                assert!(expected > cut);
            }
            other => panic!("cut to {cut}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn garbage_header_is_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config_json().to_string()).unwrap();
    let mut bytes = 12u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"not json!!!!");
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::BadSafetensors { .. })
    ));
}

#[test]
fn config_errors_through_load() {
    let tensors = good_tensors(&config_json());
    let check = |key: &str, value: Value, want: &dyn Fn(&CheckpointError) -> bool| {
        let mut config = config_json();
        config[key] = value;
        let err = load_with(&config, &tensors).unwrap_err();
        assert!(want(&err), "{key}: unexpected {err:?}");
        assert!(err.to_string().contains("config.json"), "{err}");
    };
    check("hidden_size", json!(18), &|e| {
        matches!(
            e,
            CheckpointError::Config(ConfigError::InconsistentConfig { .. })
        )
    });
    check(
        "rope_scaling",
        json!({"rope_type": "longrope", "factor": 2.0}),
        &|e| {
            matches!(e, CheckpointError::Config(ConfigError::Unsupported { field, value, .. })
                if field == "rope_scaling.rope_type" && value == "longrope")
        },
    );
    check("architectures", json!(["FalconForCausalLM"]), &|e| {
        matches!(e, CheckpointError::Config(ConfigError::Unsupported { field, value, .. })
            if field == "architectures" && value == "FalconForCausalLM")
    });
    check(
        "hidden_act",
        json!("gelu_pytorch_tanh"),
        &|e| matches!(e, CheckpointError::Config(ConfigError::Unsupported { field, .. }) if field == "hidden_act"),
    );
    let mut mistral = config_json();
    mistral["architectures"] = json!(["MistralForCausalLM"]);
    mistral["sliding_window"] = json!(4096);
    let err = load_with(&mistral, &tensors).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Config(ConfigError::Unsupported { field, .. }) if field == "sliding_window"),
        "{err:?}"
    );
}

#[test]
fn sharded_checkpoint() {
    let config = config_json();
    let tensors = good_tensors(&config);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let (mut a, mut b) = (Tensors::new(), Tensors::new());
    let mut weight_map = serde_json::Map::new();
    for (name, t) in &tensors {
        let shard = if name.contains("layers.1") || name == names::LM_HEAD {
            b.insert(name.clone(), t.clone());
            "model-00002-of-00002.safetensors"
        } else {
            a.insert(name.clone(), t.clone());
            "model-00001-of-00002.safetensors"
        };
        weight_map.insert(name.clone(), json!(shard));
    }
    write_safetensors(&dir.path().join("model-00001-of-00002.safetensors"), &a);
    write_safetensors(&dir.path().join("model-00002-of-00002.safetensors"), &b);
    let index_path = dir.path().join("model.safetensors.index.json");
    let write_index = |map: &serde_json::Map<String, Value>| {
        let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
        std::fs::write(&index_path, index.to_string()).unwrap();
    };
    write_index(&weight_map);
    let (_, ckpt) = Checkpoint::load(dir.path()).unwrap();
    assert_eq!(ckpt.tensor_names().len(), tensors.len());
    let lm = ckpt.tensor(names::LM_HEAD).unwrap();
    assert!(lm.file.ends_with("model-00002-of-00002.safetensors"));
    assert_eq!(
        lm.to_f32_vec(),
        tensors[names::LM_HEAD]
            .2
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    );

    // The index names a shard that does not exist.
    let mut missing_shard = weight_map.clone();
    missing_shard.insert(names::FINAL_NORM.into(), json!("model-00003.safetensors"));
    write_index(&missing_shard);
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::BadIndex { .. })
    ));
    // The index puts a tensor in a shard that does not hold it.
    let mut wrong_shard = weight_map.clone();
    let moved = layer_tensor(0, layer::Q_PROJ);
    wrong_shard.insert(moved.clone(), json!("model-00002-of-00002.safetensors"));
    write_index(&wrong_shard);
    match Checkpoint::open(dir.path()) {
        Err(CheckpointError::MissingTensor { path, tensor }) => {
            assert_eq!(tensor, moved);
            assert!(path.ends_with("model-00002-of-00002.safetensors"));
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    // Escaping the folder, and malformed JSON.
    let mut escaping = weight_map.clone();
    escaping.insert(moved, json!("../model.safetensors"));
    write_index(&escaping);
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::BadIndex { .. })
    ));
    std::fs::write(&index_path, "{\"weight_map\": ").unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::Config(ConfigError::Json { .. }))
    ));
    std::fs::write(&index_path, "{\"weights\": {}}").unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::BadIndex { .. })
    ));
}

#[test]
fn no_weights_and_no_config() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()),
        Err(CheckpointError::NoWeights { .. })
    ));
    assert!(matches!(
        ModelConfig::load(dir.path()),
        Err(ConfigError::Io { .. })
    ));
    std::fs::write(dir.path().join("config.json"), "{not json").unwrap();
    assert!(matches!(
        ModelConfig::load(dir.path()),
        Err(ConfigError::Json { .. })
    ));
}

#[test]
fn half_precision_and_tied_embeddings() {
    let mut config = config_json();
    config["tie_word_embeddings"] = json!(true);
    let mut tensors = good_tensors(&config);
    assert!(!tensors.contains_key(names::LM_HEAD));
    let values = [1.5f32, -0.25, 3.0, 0.0];
    let bf: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let f16: Vec<u8> = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    tensors.insert("extra.bf16".into(), (StDtype::BF16, vec![2, 2], bf));
    tensors.insert("extra.f16".into(), (StDtype::F16, vec![4], f16));
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &config, &tensors);
    let (cfg, ckpt) = Checkpoint::load(dir.path()).unwrap();
    assert!(cfg.tie_word_embeddings);
    assert_eq!(names::lm_head_name(&cfg), names::EMBED_TOKENS);
    assert_eq!(ckpt.tensor("extra.bf16").unwrap().dtype, Dtype::BF16);
    assert_eq!(ckpt.tensor_f32("extra.bf16").unwrap(), values);
    assert_eq!(ckpt.tensor_f32("extra.f16").unwrap(), values);
}

#[test]
fn backend_reports_bad_weights() {
    let config = config_json();
    let mut tensors = good_tensors(&config);
    tensors.remove(&layer_tensor(0, layer::DOWN_PROJ));
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &config, &tensors);
    let cfg = ModelConfig::load(dir.path()).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let options = worker::backend::cpu::CpuOptions {
        block_size: 16,
        num_kv_blocks: 4,
        quantization: None,
        kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
    };
    let err = worker::backend::cpu::CpuBackend::new(&cfg, &ckpt, options).unwrap_err();
    assert!(
        matches!(&err, worker::backend::BackendError::Weights(m) if m.contains("down_proj")),
        "{err}"
    );
}

#[test]
fn backend_rejects_bad_options() {
    let config = config_json();
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path(), &config, &good_tensors(&config));
    let (cfg, ckpt) = Checkpoint::load(dir.path()).unwrap();
    for (block_size, num_kv_blocks) in [(0, 8), (16, 1), (16, usize::MAX / 4)] {
        let options = worker::backend::cpu::CpuOptions {
            block_size,
            num_kv_blocks,
            quantization: None,
            kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
        };
        let err = worker::backend::cpu::CpuBackend::new(&cfg, &ckpt, options).unwrap_err();
        assert!(
            matches!(err, worker::backend::BackendError::InvalidOptions(_)),
            "{block_size} x {num_kv_blocks}: {err}"
        );
    }
}
