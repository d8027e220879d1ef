//! Typed errors for reading a checkpoint folder: every variant names the file (and tensor) at fault.

use std::path::PathBuf;

use thiserror::Error;

/// Why a checkpoint folder (config files or weights) could not be used.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// A file could not be opened, read or mapped.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file does not parse.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A required field is absent (or null).
    #[error("{path}: missing field `{field}`")]
    MissingField { path: PathBuf, field: String },
    /// A field has the wrong type or an impossible value.
    #[error("{path}: field `{field}` = {value}: {reason}")]
    InvalidField {
        path: PathBuf,
        field: String,
        value: String,
        reason: String,
    },
    /// A field names something this engine does not implement (architecture, RoPE type, activation...).
    #[error("{path}: `{field}` = {value} is not supported yet ({reason})")]
    Unsupported {
        path: PathBuf,
        field: String,
        value: String,
        reason: String,
    },
    /// Fields that are each valid but do not fit together.
    #[error("{path}: inconsistent config: {reason}")]
    InconsistentConfig { path: PathBuf, reason: String },
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
    /// A tensor is stored in a dtype other than bf16, f16 or f32.
    #[error("{path}: tensor `{tensor}` has dtype {dtype}; only BF16, F16 and F32 are supported")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
}
