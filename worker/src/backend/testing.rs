//! `ToyBackend`: a stand-in model for testing the engine without weights.
//!
//! It keeps its own paged "KV cache" — each slot stores the token id and position written there —
//! writes every new token through the block table exactly as a real backend writes K and V, and
//! computes each sampling row's logits as a deterministic hash of the whole context *read back through
//! the block table*. A wrong block table, a prefix-cache hit on the wrong block, a block reused while
//! still referenced, or a recompute that skips a token all change (or fail) the logits, so they show
//! up as different tokens or as an error — which is what the engine's tests check.

use grammar::TokenMask;

use crate::backend::launches::HostLaunches;
use crate::backend::{Backend, BackendError, DeviceSampling, ForwardBatch, Logits, TokenFeed};
use crate::config::{Architecture, ModelConfig, RopeConfig, RopeScaling};
use crate::kv::block_hash_mix as mix64;
use crate::sampler::{argmax, sample_with, uniform};

/// The toy model's logits after `context`: pseudo-random in `[-4, 4)`, a pure function of the context.
pub fn toy_logits(context: &[u32], vocab: usize) -> Vec<f32> {
    let mut h = 0x1234_5678_9abc_def0u64;
    for &t in context {
        h = mix64(h ^ u64::from(t));
    }
    (0..vocab as u64)
        .map(|v| {
            (mix64(h ^ v.wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 40) as f32 / (1u64 << 24) as f32
                * 8.0
                - 4.0
        })
        .collect()
}

/// A deterministic fake model with a paged token store (see the module docs).
#[derive(Debug)]
pub struct ToyBackend {
    vocab: usize,
    block_size: usize,
    num_blocks: usize,
    /// `(token, position)` per KV slot.
    slots: Vec<Option<(u32, u32)>>,
    /// Sample on the "device" in [`Backend::forward_sampled`] (with the host sampler's formulas).
    pub device_sampling: bool,
    /// Take launched steps ([`Backend::launch_sampled`]; needs `device_sampling`).
    pub launches: bool,
    /// Launched steps' draws.
    launched: HostLaunches,
    /// Steps launched with [`TokenFeed::PreviousStep`] (shared, as `masked_steps`).
    pub fed_steps: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Of those, steps whose draws skip some of the step before's (a sequence ended by length).
    pub fed_with_gaps: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Forward passes run so far.
    pub steps: usize,
    /// Steps sampled on the "device" with grammar masks (shared, so a test can read it while the
    /// engine owns the backend).
    pub masked_steps: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl ToyBackend {
    /// A toy backend with `num_blocks` blocks of `block_size` tokens.
    pub fn new(vocab: usize, block_size: usize, num_blocks: usize) -> Self {
        Self {
            vocab,
            block_size,
            num_blocks,
            slots: vec![None; num_blocks * block_size],
            device_sampling: false,
            launches: false,
            launched: HostLaunches::default(),
            fed_steps: Default::default(),
            fed_with_gaps: Default::default(),
            steps: 0,
            masked_steps: Default::default(),
        }
    }

    /// A toy backend and a matching model config (vocab `vocab`, EOS = `vocab - 1`, 4096 positions).
    pub fn with_config(vocab: usize, block_size: usize, num_blocks: usize) -> (Self, ModelConfig) {
        (
            Self::new(vocab, block_size, num_blocks),
            toy_model_config(vocab),
        )
    }

    fn slot(&self, table: &[u32], pos: usize) -> Result<usize, BackendError> {
        let block = *table.get(pos / self.block_size).ok_or_else(|| {
            BackendError::InvalidBatch(format!("position {pos} is beyond the block table"))
        })?;
        if block == 0 || block as usize >= self.num_blocks {
            return Err(BackendError::InvalidBatch(format!(
                "block {block} used for position {pos}"
            )));
        }
        Ok(block as usize * self.block_size + pos % self.block_size)
    }

    fn run(&mut self, batch: &ForwardBatch<'_>) -> Result<Vec<Vec<f32>>, BackendError> {
        if batch.token_ids.len() != batch.positions.len() {
            return Err(BackendError::InvalidBatch(
                "token_ids and positions differ in length".into(),
            ));
        }
        self.steps += 1;
        let mut rows = Vec::new();
        for seq in batch.seqs {
            let end = seq.query_start + seq.query_len;
            if end > batch.token_ids.len() || seq.query_len == 0 || seq.query_len > seq.context_len
            {
                return Err(BackendError::InvalidBatch(format!(
                    "bad sequence range {seq:?}"
                )));
            }
            for i in seq.query_start..end {
                let pos = seq.context_len - (end - i);
                if batch.positions[i] as usize != pos {
                    return Err(BackendError::InvalidBatch(format!(
                        "token {i} has position {} not {pos}",
                        batch.positions[i]
                    )));
                }
                let slot = self.slot(seq.block_table, pos)?;
                self.slots[slot] = Some((batch.token_ids[i], pos as u32));
            }
            if seq.sample {
                let mut context = Vec::with_capacity(seq.context_len);
                for pos in 0..seq.context_len {
                    match self.slots[self.slot(seq.block_table, pos)?] {
                        Some((t, p)) if p as usize == pos => context.push(t),
                        other => {
                            return Err(BackendError::InvalidBatch(format!(
                                "position {pos} reads a slot holding {other:?}"
                            )));
                        }
                    }
                }
                rows.push(toy_logits(&context, self.vocab));
            }
        }
        Ok(rows)
    }
}

impl Backend for ToyBackend {
    fn name(&self) -> &'static str {
        "toy"
    }

    fn num_kv_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Logits, BackendError> {
        let rows = self.run(batch)?;
        Ok(Logits {
            vocab: self.vocab,
            data: rows.concat(),
        })
    }

    fn forward_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
    ) -> Result<Option<Vec<u32>>, BackendError> {
        if !self.device_sampling {
            return Ok(None);
        }
        let rows = self.run(batch)?;
        if rows.len() != sampling.len() {
            return Err(BackendError::InvalidBatch(
                "one DeviceSampling per sampling row expected".into(),
            ));
        }
        Ok(Some(
            rows.iter()
                .zip(sampling)
                .map(|(row, s)| device_draw(row, s))
                .collect(),
        ))
    }

    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        masks: &mut dyn FnMut() -> Vec<Option<TokenMask>>,
    ) -> Result<Option<Vec<u32>>, BackendError> {
        if !self.device_sampling {
            return Ok(None);
        }
        let mut rows = self.run(batch)?;
        let masks = masks();
        if rows.len() != sampling.len() || masks.len() != rows.len() {
            return Err(BackendError::InvalidBatch(
                "one DeviceSampling and one mask per sampling row expected".into(),
            ));
        }
        self.masked_steps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (row, mask) in rows.iter_mut().zip(&masks) {
            if let Some(mask) = mask {
                // As the CUDA kernel does: masked logits become -inf before the draw.
                for (t, l) in row.iter_mut().enumerate() {
                    if !mask.allows(t as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        Ok(Some(
            rows.iter()
                .zip(sampling)
                .map(|(row, s)| device_draw(row, s))
                .collect(),
        ))
    }

    /// Runs the step at once and keeps its tokens until collected; fed steps read their input
    /// tokens from the last launched step's draws, as the CUDA backend does on the device.
    fn launch_sampled(
        &mut self,
        batch: &ForwardBatch<'_>,
        sampling: &[DeviceSampling],
        feed: TokenFeed<'_>,
    ) -> Result<bool, BackendError> {
        if !(self.device_sampling && self.launches) {
            return Ok(false);
        }
        if let TokenFeed::PreviousStep(draws) = feed {
            let count = |c: &std::sync::atomic::AtomicUsize| {
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            };
            count(&self.fed_steps);
            if draws.iter().enumerate().any(|(i, &d)| d as usize != i) {
                count(&self.fed_with_gaps);
            }
        }
        let mut launched = std::mem::take(&mut self.launched);
        let result = launched.launch(batch, feed, |b| {
            self.forward_sampled(b, sampling)?
                .ok_or_else(|| BackendError::Device("device sampling is off".into()))
        });
        self.launched = launched;
        result.map(|()| true)
    }

    fn collect_sampled(&mut self) -> Result<Vec<u32>, BackendError> {
        self.launched.collect()
    }
}

/// The device's draw, with the host sampler's formulas.
fn device_draw(row: &[f32], s: &DeviceSampling) -> u32 {
    if s.params.is_greedy() {
        argmax(row)
    } else {
        sample_with(row, &s.params, uniform(s.seed, s.step))
    }
}

/// A model config for a toy model of `vocab` tokens (EOS = `vocab - 1`).
pub fn toy_model_config(vocab: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size: vocab,
        hidden_size: 8,
        intermediate_size: 16,
        num_hidden_layers: 1,
        num_attention_heads: 1,
        num_key_value_heads: 1,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope: RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
            freq_factors: None,
        },
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        qkv_bias: false,
        bos_token_id: None,
        eos_token_ids: vec![vocab.saturating_sub(1) as u32],
        quantization: None,
    }
}
