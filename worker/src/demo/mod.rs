//! The built-in demo model: a small Llama with random weights from a fixed seed and a real byte-level
//! BPE tokenizer, so `ringserve serve` has something to run on a fresh machine without a download.
//!
//! Its text is gibberish (the weights are random), but everything around it is real: a HuggingFace
//! folder (`config.json` with Llama-3 RoPE scaling in the pre-transformers-5 form, bf16
//! `model.safetensors` with tied embeddings, `generation_config.json` with two EOS ids,
//! `tokenizer.json`, `tokenizer_config.json` with a chat template) that any HF loader reads too.
//!
//! ```no_run
//! let dir = worker::demo::cached_demo_model_dir()?;
//! let (config, checkpoint) = worker::checkpoint::Checkpoint::load(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod tokenizer;

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::TensorView as StView;
use serde_json::{Value, json};
use thiserror::Error;

use crate::checkpoint::names::expected_tensors;
use crate::config::ModelConfig;

/// Bumped whenever the demo's files change, so a stale cached copy is not reused.
pub const DEMO_VERSION: u32 = 2;
/// Seed of the weights.
pub const DEMO_SEED: u64 = 0x7269_6e67_7365_7276;

/// Shape of the demo model (besides its vocabulary, which is the tokenizer's).
const HIDDEN: usize = 256;
const INTERMEDIATE: usize = 768;
const LAYERS: usize = 4;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 64;
const MAX_POSITIONS: usize = 4096;

/// Why the demo model could not be written.
#[derive(Debug, Error)]
pub enum DemoError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the demo tokenizer: {0}")]
    Tokenizer(String),
    #[error("writing the demo weights: {0}")]
    Weights(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DemoError + '_ {
    move |source| DemoError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write_json(path: &Path, value: &Value) -> Result<(), DemoError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| DemoError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    text.push('\n');
    std::fs::write(path, text).map_err(io_err(path))
}

/// Writes the demo model folder into `dir` (created if needed; existing files are overwritten).
pub fn write_demo_model(dir: &Path) -> Result<(), DemoError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let tok = tokenizer::build_tokenizer()?;
    let tok_path = dir.join("tokenizer.json");
    tok.save(&tok_path, false)
        .map_err(|e| DemoError::Tokenizer(format!("{}: {e}", tok_path.display())))?;
    let id = |t: &str| {
        tok.token_to_id(t)
            .ok_or_else(|| DemoError::Tokenizer(format!("special token {t} has no id")))
    };
    let (bos, eot, eos) = (
        id(tokenizer::BOS)?,
        id(tokenizer::EOT)?,
        id(tokenizer::END_OF_TEXT)?,
    );
    let vocab = tok.get_vocab_size(true);

    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024
        },
        "tie_word_embeddings": true,
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": bos,
        "eos_token_id": eot,
        "torch_dtype": "bfloat16",
        "initializer_range": 0.02,
        "use_cache": true
    });
    let config_path = dir.join("config.json");
    write_json(&config_path, &config)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": bos, "eos_token_id": [eot, eos], "do_sample": true,
                "temperature": 0.8, "top_p": 0.95}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": tokenizer::BOS,
            "eos_token": tokenizer::EOT,
            "pad_token": tokenizer::END_OF_TEXT,
            "add_bos_token": true,
            "add_eos_token": false,
            "clean_up_tokenization_spaces": false,
            "model_max_length": MAX_POSITIONS,
            "chat_template": tokenizer::CHAT_TEMPLATE
        }),
    )?;

    let parsed = ModelConfig::from_json(&config_path, &config, None)
        .map_err(|e| DemoError::Weights(e.to_string()))?;
    write_weights(&dir.join("model.safetensors"), &parsed)
}

/// Random bf16 weights: norms at 1, embeddings ~U(±0.4), projections scaled by `1/sqrt(fan_in)`.
fn write_weights(path: &Path, config: &ModelConfig) -> Result<(), DemoError> {
    let mut rng = ChaCha8Rng::seed_from_u64(DEMO_SEED);
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = expected_tensors(config)
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if shape.len() == 1 {
                vec![1.0; n]
            } else {
                let bound = if name.contains("embed_tokens") {
                    0.4
                } else {
                    (3.0 / shape[1] as f32).sqrt()
                };
                (0..n).map(|_| rng.random_range(-bound..bound)).collect()
            };
            let bytes = values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect();
            (name, shape, bytes)
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            StView::new(safetensors::Dtype::BF16, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| DemoError::Weights(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = Some([("format".to_owned(), "pt".to_owned())].into());
    safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| DemoError::Weights(format!("{}: {e}", path.display())))
}

/// Files a complete demo folder holds.
const DEMO_FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
];

fn is_complete(dir: &Path) -> bool {
    DEMO_FILES.iter().all(|f| dir.join(f).is_file())
}

/// The demo model under the user's cache directory (`~/.cache/ringserve/demo-model-vN` on Linux;
/// the system temp dir when there is none), written on first use and reused afterwards.
pub fn cached_demo_model_dir() -> Result<PathBuf, DemoError> {
    let root = dirs::cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("ringserve");
    cached_demo_model_dir_in(&root)
}

/// [`cached_demo_model_dir`] under `root`. Concurrent callers are safe: each writes a private
/// temporary folder and renames it into place, so nobody ever sees half a model; a loser of the
/// race discards its copy and uses the winner's.
pub fn cached_demo_model_dir_in(root: &Path) -> Result<PathBuf, DemoError> {
    let target = root.join(format!("demo-model-v{DEMO_VERSION}"));
    if is_complete(&target) {
        return Ok(target);
    }
    std::fs::create_dir_all(root).map_err(io_err(root))?;
    // Private to this call: the process id separates processes, the counter separates the
    // threads of one process (two of them may read the same clock value).
    static NEXT_TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = NEXT_TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = root.join(format!(
        ".demo-model-v{DEMO_VERSION}.tmp-{}-{seq}",
        std::process::id()
    ));
    let result = write_demo_model(&tmp).and_then(|()| {
        match std::fs::rename(&tmp, &target) {
            Ok(()) => Ok(()),
            // Someone else finished first (renaming onto a non-empty folder fails).
            Err(_) if is_complete(&target) => Ok(()),
            Err(e) => Err(DemoError::Io {
                path: target.clone(),
                source: e,
            }),
        }
    });
    if tmp.exists() {
        // Best effort: a leftover temporary folder wastes space but harms nothing.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result.map(|()| target)
}

#[cfg(test)]
mod tests;
