//! Opening a HuggingFace model folder as a ready [`Engine`]: config, weights, backend, tokenizer.

use std::path::{Path, PathBuf};

use thiserror::Error;
use tokenizers::Tokenizer;

use crate::backend::{BackendError, BackendOptions, load_backend};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineConfig, EngineError};

/// A loaded model: the engine over it, its config, and its tokenizer when the folder has one.
pub struct OpenedModel {
    pub engine: Engine,
    pub config: ModelConfig,
    pub tokenizer: Option<Tokenizer>,
}

/// Why a model folder could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
}

/// Loads `dir` onto the backend `backend` describes and builds an engine with `config`.
pub fn open_model(
    dir: &Path,
    backend: &BackendOptions,
    config: EngineConfig,
) -> Result<OpenedModel, OpenError> {
    let (model, checkpoint) = Checkpoint::load(dir)?;
    let backend = load_backend(&model, &checkpoint, backend)?;
    let mut engine = Engine::new(backend, &model, config)?;
    let tokenizer = load_tokenizer(dir)?;
    if let Some(tokenizer) = &tokenizer {
        enable_grammars(&mut engine, tokenizer, &model);
    }
    Ok(OpenedModel {
        engine,
        config: model,
        tokenizer,
    })
}

/// `dir/tokenizer.json`, or `None` when the folder has none; a `.gguf` file's own vocabulary.
pub fn load_tokenizer(dir: &Path) -> Result<Option<Tokenizer>, OpenError> {
    if gguf::is_gguf_path(dir) {
        let tokenizer = gguf::GgufFile::open(dir).and_then(|f| f.hf_tokenizer());
        let json = tokenizer.map_err(|e| OpenError::Checkpoint(e.into()))?;
        return json
            .to_string()
            .parse::<Tokenizer>()
            .map(Some)
            .map_err(|e| OpenError::Tokenizer {
                path: dir.to_path_buf(),
                message: e.to_string(),
            });
    }
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        return Ok(None);
    }
    Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| OpenError::Tokenizer {
            path,
            message: e.to_string(),
        })
}

/// Lets `engine` run structured-output requests over `tokenizer`'s vocabulary, which is read on a
/// thread of its own meanwhile (the first such request waits for it). A tokenizer the grammar
/// engine cannot use makes those requests fail with its error; the model still serves.
pub fn enable_grammars(engine: &mut Engine, tokenizer: &Tokenizer, model: &ModelConfig) {
    engine.set_grammar_compiler(grammar::BackgroundCompiler::start(
        tokenizer.clone(),
        model.vocab_size,
        model.eos_token_ids.clone(),
    ));
}
