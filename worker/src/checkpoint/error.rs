//! Typed errors for reading a checkpoint folder: every variant names the file (and tensor) at fault.

use std::path::PathBuf;

use thiserror::Error;

use crate::config::ConfigError;

/// Why a checkpoint folder (config files or weights) could not be used.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A JSON file of the folder (`config.json`, `generation_config.json`, the shard index) cannot
    /// be read or parsed, or the config describes no model this engine runs.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A GGUF file is malformed or holds what this engine cannot run.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// A file could not be opened, read or mapped.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The folder holds neither `model.safetensors` nor `model.safetensors.index.json`.
    #[error("{dir}: no weights found (neither model.safetensors nor model.safetensors.index.json)")]
    NoWeights { dir: PathBuf },
    /// `model.safetensors.index.json` is malformed or points at an unusable shard.
    #[error("{path}: bad shard index: {reason}")]
    BadIndex { path: PathBuf, reason: String },
    /// A safetensors file has a malformed header.
    #[error("{path}: bad safetensors file: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    /// A safetensors file is shorter than its header says.
    #[error("{path}: truncated: header needs {expected} bytes, the file has {actual}")]
    Truncated {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    /// An expected tensor is absent.
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor { path: PathBuf, tensor: String },
    /// A tensor's shape disagrees with the config.
    #[error("{path}: tensor `{tensor}` has shape {actual:?}, expected {expected:?}")]
    WrongShape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        actual: Vec<usize>,
    },
    /// A tensor is stored in a dtype other than bf16, f16, f32 or (linear layers) F8_E4M3.
    #[error(
        "{path}: tensor `{tensor}` has dtype {dtype}; only BF16, F16, F32, (FP8 linear layers) F8_E4M3 and (INT4 linear layers) I32 are supported"
    )]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    /// A quantized layer's tensors do not fit its declared scheme: a scale of the wrong shape or
    /// dtype, a NaN/inf/non-positive scale, an FP8 weight where none is declared or the reverse.
    #[error("{path}: tensor `{tensor}`: {reason}")]
    BadQuantization {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
}
