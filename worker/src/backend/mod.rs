//! The compute backend trait: one forward pass over the flattened tokens of a scheduled step.
//!
//! A step holds several sequences. Their new tokens are laid out back to back in
//! [`ForwardBatch::token_ids`]; each [`SeqInput`] says where its tokens start, how many there are, how
//! long its context is once they are written, and which KV blocks hold that context. A backend writes
//! the new tokens' K and V into the paged cache (token at position `p` goes to block
//! `block_table[p / block_size]`, slot `p % block_size`), attends over the whole context, and returns
//! logits only for the sequences that sample this step (the last token of each such sequence).

pub mod testing;

use thiserror::Error;

use crate::sampler::SamplingParams;

pub mod cpu;
pub mod launches;
mod load;
pub mod null;
pub mod switches;

#[cfg(feature = "cuda")]
pub use load::cuda_options;
pub use load::{
    BackendOptions, CPU_DEFAULT_KV_BYTES, ComputeDtype, Device, ParseDeviceError,
    cpu_default_kv_blocks, load_backend,
};

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Index of this sequence's first new token in [`ForwardBatch::token_ids`].
    pub query_start: usize,
    /// Number of new tokens this step (a prefill chunk, or 1 for a decode).
    pub query_len: usize,
    /// Tokens in the KV cache after this step: cached prefix + earlier chunks + this step's tokens.
    /// The new tokens occupy positions `context_len - query_len .. context_len`.
    pub context_len: usize,
    /// Physical KV block ids covering positions `0..context_len` (possibly more).
    pub block_table: &'a [u32],
    /// Whether logits are wanted for this sequence's last new token.
    pub sample: bool,
}

/// The inputs of one forward pass.
#[derive(Debug, Clone, Copy)]
pub struct ForwardBatch<'a> {
    /// The new tokens of every sequence, back to back.
    pub token_ids: &'a [u32],
    /// The absolute position of each token in `token_ids`.
    pub positions: &'a [u32],
    /// The sequences, in the order their tokens appear.
    pub seqs: &'a [SeqInput<'a>],
}

/// What a batch is checked against by [`ForwardBatch::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Token ids must be below this.
    pub vocab_size: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks allocated (block 0, the null block, included).
    pub num_blocks: usize,
}

impl<'a> ForwardBatch<'a> {
    /// Checks every index a backend will follow: lengths agree, token ids are in the vocabulary,
    /// sequences are contiguous and cover every token, each token's position is
    /// `context_len - query_len + i`, and each block table covers its context with allocated,
    /// non-null blocks. Returns each sequence's block table cut to its context.
    pub fn validate(&self, lim: BatchLimits) -> Result<Vec<&'a [u32]>, BackendError> {
        let bad = |msg: String| Err(BackendError::InvalidBatch(msg));
        let n = self.token_ids.len();
        if self.positions.len() != n {
            return bad(format!(
                "{n} token ids but {} positions",
                self.positions.len()
            ));
        }
        if let Some(&t) = self
            .token_ids
            .iter()
            .find(|&&t| t as usize >= lim.vocab_size)
        {
            return bad(format!(
                "token id {t} is outside the vocabulary ({})",
                lim.vocab_size
            ));
        }
        let mut tables = Vec::with_capacity(self.seqs.len());
        let mut next = 0usize;
        for (i, seq) in self.seqs.iter().enumerate() {
            if seq.query_start != next {
                return bad(format!(
                    "sequence {i} starts at token {} but the previous one ends at {next}",
                    seq.query_start
                ));
            }
            if seq.query_len == 0 || seq.query_len > seq.context_len {
                return bad(format!(
                    "sequence {i}: query_len {} with context_len {}",
                    seq.query_len, seq.context_len
                ));
            }
            let end = seq.query_start + seq.query_len;
            if end > n {
                return bad(format!("sequence {i} runs past the {n} tokens of the step"));
            }
            let needed = seq.context_len.div_ceil(lim.block_size);
            if seq.block_table.len() < needed {
                return bad(format!(
                    "sequence {i}: context of {} tokens needs {needed} blocks, the table has {}",
                    seq.context_len,
                    seq.block_table.len()
                ));
            }
            let table = &seq.block_table[..needed];
            if let Some(&b) = table
                .iter()
                .find(|&&b| b == 0 || b as usize >= lim.num_blocks)
            {
                return bad(format!(
                    "sequence {i}: block {b} is the null block or beyond the {} allocated",
                    lim.num_blocks
                ));
            }
            let first = seq.context_len - seq.query_len;
            for (j, &p) in self.positions[seq.query_start..end].iter().enumerate() {
                if p as usize != first + j {
                    return bad(format!(
                        "sequence {i}: token {j} has position {p}, expected {}",
                        first + j
                    ));
                }
            }
            tables.push(table);
            next = end;
        }
        if next != n {
            return bad(format!("the sequences cover {next} of the {n} tokens"));
        }
        Ok(tables)
    }

    /// Number of sequences that produce a logits row.
    pub fn num_samples(&self) -> usize {
        self.seqs.iter().filter(|s| s.sample).count()
    }
}

/// Logits for the sampling sequences of a step, row-major `[rows, vocab]`, in the order of
/// the sequences with `sample == true`.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.data.len().checked_div(self.vocab).unwrap_or(0)
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

use grammar::TokenMask;

/// One sampling row for a backend that samples on the device: the request's settings (the device
/// applies temperature, top-k, top-p and min-p; rows with penalties or logprobs never get here) and
/// where in the request's random stream this draw is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSampling {
    pub params: SamplingParams,
    /// The request's seed.
    pub seed: u64,
    /// Index of the token being sampled within the request's output (selects the random draw, so a
    /// request's stream does not depend on what it was batched with).
    pub step: u64,
}

impl DeviceSampling {
    /// A greedy row (what padding rows and benchmarks use).
    pub const GREEDY: Self = Self {
        params: SamplingParams::GREEDY,
        seed: 0,
        step: 0,
    };
}

/// A backend failure. Per-step errors are fatal to the worker: the KV cache may be half written.
#[derive(Debug, Error)]
pub enum BackendError {
    /// The batch is malformed (lengths disagree, a position is beyond a block table, ...).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),
    /// The device failed (a condition this backend found itself).
    #[error("device error: {0}")]
    Device(String),
    /// A device library failed (the CUDA driver, cuBLAS, cuBLASLt, NVRTC); its error is kept as
    /// the source.
    #[error("device error: {0}")]
    DeviceLibrary(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The checkpoint could not be turned into this backend's weights.
    #[error("weights: {0}")]
    Weights(String),
    /// The backend options are unusable (zero block size, too few KV blocks, ...).
    #[error("invalid backend options: {0}")]
    InvalidOptions(String),
    /// The model cannot be split over this tensor-parallel group.
    #[error("invalid backend options: {0}")]
    Shard(#[from] crate::tp::ShardError),
    /// A tensor-parallel collective failed (a peer rank died, left or timed out).
    #[error("tensor parallelism: {0}")]
    Comm(#[from] crate::tp::CommError),
    /// This backend was not compiled in.
    #[error("backend `{0}` is not available in this build (rebuild with `--features {0}`)")]
    NotCompiled(&'static str),
}

/// A compute backend: owns the weights and the paged KV cache.
pub trait Backend: Send {
    /// Short name for logs and metrics (`cpu`, `cuda`, `null`).
    fn name(&self) -> &'static str;

    /// Number of KV blocks this backend allocated (block 0, the null block, included).
    fn num_kv_blocks(&self) -> usize;

    /// Tokens per KV block.
    fn block_size(&self) -> usize;

    /// Runs the model over `batch`, writing K/V into the cache, and returns logits for sampling rows.
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Logits, BackendError>;

    /// Runs the model and samples on the device, returning one token id per sampling row, or
    /// `Ok(None)` when this backend does not sample on the device (the engine then calls
    /// [`Backend::forward`] and samples on the host). `sampling` has one entry per sampling row.
    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
    ) -> Result<Option<Vec<u32>>, BackendError> {
        let _ = (batch, sampling);
        Ok(None)
    }

    /// As [`Backend::forward_sampled`], where some rows are constrained by a structured-output
    /// grammar: once the forward pass is under way, `masks` gives one entry per sampling row (the
    /// tokens it may draw; `None`: any) — the engine computes them meanwhile — and the draw keeps
    /// to them. `Ok(None)` (the default) sends the step to the host sampler instead; a backend
    /// that asked for the masks must draw (they are handed over once).
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        masks: &mut dyn FnMut() -> Vec<Option<TokenMask>>,
    ) -> Result<Option<Vec<u32>>, BackendError> {
        let _ = (batch, sampling, masks);
        Ok(None)
    }

    /// Starts a step sampled on the device without waiting for its tokens (the engine's async
    /// scheduling: the host plans and launches the next step while this one runs). Returns
    /// `Ok(false)`, having done nothing, where the backend cannot (the default); the engine then
    /// runs the step through [`Backend::forward_sampled`]. At most two launched steps are
    /// uncollected at once; [`Backend::collect_sampled`] returns their tokens in launch order.
    /// With [`TokenFeed::PreviousStep`] the first sequences' input tokens are draws of the
    /// previously launched step (`batch.token_ids` holds placeholders there).
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        feed: TokenFeed<'_>,
    ) -> Result<bool, BackendError> {
        let _ = (batch, sampling, feed);
        Ok(false)
    }

    /// The tokens of the oldest launched, uncollected step (waiting for them), one per sampling
    /// row.
    fn collect_sampled(&mut self) -> Result<Vec<u32>, BackendError> {
        Err(BackendError::InvalidBatch(format!(
            "backend `{}` launched no step to collect",
            self.name()
        )))
    }
}

/// Where a launched step's input tokens come from ([`Backend::launch_sampled`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFeed<'a> {
    /// `batch.token_ids`, from the host.
    Host,
    /// `batch.token_ids`, except that sequence `i < draws.len()` — a one-token decode that
    /// samples — takes draw `draws[i]` of the previously launched step, on the device. `draws`
    /// rises strictly.
    PreviousStep(&'a [u32]),
}

#[cfg(feature = "cuda")]
pub mod cuda;
