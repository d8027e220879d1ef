//! Starting a worker process: open the model on its device (or the `null` device), build the
//! engine, and run the serving loop.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use thiserror::Error;

use super::tp::{TpError, TpOptions, run_rank};
use super::{ServeConfig, ServeError, ServeExit, serve};
use crate::backend::null::NullBackend;
use crate::backend::{BackendOptions, Device};
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineConfig, EngineError};
use crate::open::{OpenError, enable_grammars, load_tokenizer, open_model};

/// KV blocks of the null device when not given (it holds no memory per block).
pub const NULL_DEFAULT_KV_BLOCKS: usize = 1 << 16;

/// Where a worker computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerDevice {
    /// A real backend (`cpu`, `cuda`, `cuda:N`).
    Model(Device),
    /// No math: deterministic tokens from the model's config alone (no weights are read).
    Null,
}

impl std::str::FromStr for WorkerDevice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "null" {
            return Ok(Self::Null);
        }
        s.parse::<Device>()
            .map(Self::Model)
            .map_err(|e| format!("{e} (or null)"))
    }
}

impl std::fmt::Display for WorkerDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Model(d) => d.fmt(f),
            Self::Null => f.write_str("null"),
        }
    }
}

/// Everything `ringserve worker` needs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub model: PathBuf,
    pub device: WorkerDevice,
    pub backend: BackendOptions,
    pub engine: EngineConfig,
    /// Prefix of the gateway's rings; only rank 0 of a tensor-parallel group has them.
    pub rings: Option<String>,
    /// Capacity of each ring the worker creates (gateway rings if absent, plan rings), in bytes.
    pub ring_capacity: usize,
    /// This worker's place in a tensor-parallel group (the default: a group of one).
    pub tp: TpOptions,
    /// Heartbeats and draining.
    pub lifecycle: super::lifecycle::Lifecycle,
}

/// A worker could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error(transparent)]
    Tp(#[from] TpError),
    #[error(transparent)]
    Join(#[from] super::join::JoinClientError),
    /// Joining registers one process; a tensor-parallel group is started by `serve --tp`.
    #[error(
        "--join does not take --tensor-parallel-size above 1 (start tensor-parallel groups with serve --tp)"
    )]
    JoinTensorParallel,
}

/// Opens the model and serves it until the gateway goes away or `stop` is set. A rank of a
/// tensor-parallel group (`opts.tp.world > 1`) runs [`run_rank`] instead.
pub fn run_worker(opts: &WorkerOptions, stop: Arc<AtomicBool>) -> Result<ServeExit, LaunchError> {
    opts.tp.check(opts.device, opts.rings.is_some())?;
    if opts.tp.is_parallel() {
        return Ok(run_rank(opts, stop)?);
    }
    let rings = opts.rings.clone().ok_or(TpError::MissingRings)?;
    let (engine, vocab) = build_engine(opts)?;
    serve_rings(engine, vocab, opts, rings, stop)
}

/// Opens the model, then registers with the running gateway `name` (`serve --name NAME`) and serves
/// the rings it created for this worker until the gateway goes away, `stop` is set, or the worker
/// drained.
pub fn run_joined_worker(
    opts: &WorkerOptions,
    name: &str,
    stop: Arc<AtomicBool>,
) -> Result<ServeExit, LaunchError> {
    if opts.tp.is_parallel() {
        return Err(LaunchError::JoinTensorParallel);
    }
    let (engine, vocab) = build_engine(opts)?;
    let (slot, rings) = super::join::register(name)?;
    tracing::info!(gateway = name, slot, %rings, "joined");
    serve_rings(engine, vocab, opts, rings, stop)
}

fn serve_rings(
    engine: Engine,
    vocab: usize,
    opts: &WorkerOptions,
    rings: String,
    stop: Arc<AtomicBool>,
) -> Result<ServeExit, LaunchError> {
    let config = ServeConfig {
        rings,
        ring_capacity: opts.ring_capacity,
        vocab_size: vocab,
        stop,
        lifecycle: opts.lifecycle.clone(),
    };
    Ok(serve(engine, &config)?)
}

/// Opens the model on its device (or the null device) and builds the engine; returns it and the
/// model's vocabulary size.
fn build_engine(opts: &WorkerOptions) -> Result<(Engine, usize), LaunchError> {
    let (engine, vocab) = match opts.device {
        WorkerDevice::Model(device) => {
            let backend = BackendOptions {
                device,
                ..opts.backend.clone()
            };
            let opened = open_model(&opts.model, &backend, opts.engine.clone())?;
            (opened.engine, opened.config.vocab_size)
        }
        WorkerDevice::Null => {
            let config = ModelConfig::load(&opts.model)?;
            let backend = NullBackend::new(
                config.vocab_size,
                config.eos_token_ids.clone(),
                opts.backend.block_size,
                opts.backend.num_kv_blocks.unwrap_or(NULL_DEFAULT_KV_BLOCKS),
            );
            let mut engine = Engine::new(Box::new(backend), &config, opts.engine.clone())?;
            if let Some(tokenizer) = load_tokenizer(&opts.model)? {
                enable_grammars(&mut engine, &tokenizer, &config);
            }
            (engine, config.vocab_size)
        }
    };
    tracing::info!(
        model = %opts.model.display(),
        device = %opts.device,
        backend = engine.backend_name(),
        max_model_len = engine.max_model_len(),
        "engine ready"
    );
    Ok((engine, vocab))
}
