//! GGUF model files (llama.cpp's format), read memory-mapped and bounds-checked.
//!
//! [`GgufFile::open`] parses the header, the metadata and the tensor table of a GGUF v2/v3 file
//! and checks every tensor's bytes lie inside the file; nothing in the file is trusted. The [`hf`]
//! module turns what it holds into what a HuggingFace model folder holds — `config.json`,
//! `tokenizer.json` and `tokenizer_config.json` as JSON values, and the weights under their HF
//! names, dequantized to f32 ([`quants`]) with llama's q/k rows back in HF order — so the engine
//! and the gateway read a `.gguf` through the same code as a folder.

pub mod hf;
pub mod quants;
mod reader;
mod spm;

pub use quants::GgmlType;
pub use reader::{GgufError, GgufFile, TensorInfo, Value};

/// Whether `path` names a GGUF file (by its `.gguf` extension; the contents are checked on open).
pub fn is_gguf_path(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}
