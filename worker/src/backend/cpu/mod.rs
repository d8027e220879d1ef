//! The CPU backend: the f32 reference every other backend is checked against.
//!
//! Weights are converted to f32 once at load (q/k/v and gate/up fused into one matrix each). A step
//! runs over the flattened tokens of all its sequences: one GEMM per projection for the whole step
//! (the `gemm` crate, all cores through rayon), RoPE at each token's own position, K/V written into
//! the paged cache through each sequence's block table, then causal attention over the sequence's
//! whole context read through that table (so chunked prefill and prefix-cache hits need nothing
//! special): GEMMs per KV head for prefill chunks, dot products per token and head for decodes.
//! Matmuls of at most 16 rows (decode steps) stream the weight once with dot products instead of
//! packing it for GEMM (`gemv`).
//! Logits are computed only for the rows that sample.
//!
//! With a [`CpuTp`] the backend holds one tensor-parallel shard (see [`shard`] for the split) and
//! meets the other ranks in an all-reduce after `o_proj` and `down_proj` and an all-gather of the
//! logits.

mod attention;
mod gemv;
mod ops;
pub mod shard;

use rayon::prelude::*;

use crate::backend::{Backend, BackendError, BatchLimits, ForwardBatch, Logits};
use crate::checkpoint::names::{self, layer, layer_tensor};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::ModelConfig;
use crate::quant::kv::{self, KvCacheDtype, KvScales};
use crate::quant::load::{InputQuant, fused_input, linear_f32};
use crate::quant::{LinearQuant, Quantization};

use attention::{AttentionDims, Chunk, TokenContext};
pub use shard::CpuTp;
use shard::{LocalDims, cols, rows, times};

/// Chunks of at least this many tokens are attended with GEMMs ([`attention::chunk_attention`]);
/// shorter ones (decodes) token by token.
const CHUNK_ATTENTION_MIN_TOKENS: usize = 16;

/// KV cache geometry of a [`CpuBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks to allocate, the null block 0 included (so at least 2).
    pub num_kv_blocks: usize,
    /// `--quantization`: `Some(Fp8)` quantizes a bf16/f16/f32 checkpoint's linear layers while it
    /// loads; an FP8 checkpoint runs FP8 either way.
    pub quantization: Option<Quantization>,
    /// `--kv-cache-dtype`: with [`KvCacheDtype::Fp8E4m3`] every K and V value is stored as its
    /// FP8 round trip (`e4m3(x / scale) · scale`, [`kv::round_trip`]) — the values an FP8 cache
    /// reads back, held in f32: the reference arithmetic, not the memory saving.
    pub kv_cache_dtype: KvCacheDtype,
}

/// One decoder layer's weights in f32, HF layout (`[out, in]`). Quantized layers hold their
/// dequantized weights and say how their input is quantized (`*_in`), so the products see exactly
/// the FP8 values a quantized kernel multiplies.
struct LayerWeights {
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    /// `[q_dim + 2·kv_dim, hidden]`: q, k, v projections stacked.
    qkv: Vec<f32>,
    qkv_bias: Option<Vec<f32>>,
    o: Vec<f32>,
    /// `[2·intermediate, hidden]`: gate then up.
    gate_up: Vec<f32>,
    down: Vec<f32>,
    qkv_in: Option<InputQuant>,
    o_in: Option<InputQuant>,
    gate_up_in: Option<InputQuant>,
    down_in: Option<InputQuant>,
}

/// `x`, quantized as a product's input sees it (borrowed unchanged when it is not quantized).
fn product_input<'a>(
    x: &'a [f32],
    width: usize,
    quant: Option<InputQuant>,
) -> std::borrow::Cow<'a, [f32]> {
    match quant {
        None => std::borrow::Cow::Borrowed(x),
        Some(q) => {
            let mut owned = x.to_vec();
            q.apply(&mut owned, width);
            std::borrow::Cow::Owned(owned)
        }
    }
}

/// The f32 CPU backend; owns the weights and the paged KV cache.
pub struct CpuBackend {
    config: ModelConfig,
    embed: Vec<f32>,
    /// `None` when tied to `embed`.
    lm_head: Option<Vec<f32>>,
    final_norm: Vec<f32>,
    layers: Vec<LayerWeights>,
    inv_freq: Vec<f32>,
    block_size: usize,
    num_blocks: usize,
    /// Per layer, `[blocks × block_size × kv_heads × head_dim]`.
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    /// With an FP8 cache: its per-layer scales.
    kv_scales: Option<KvScales>,
    /// This rank's share of the model (everything when not tensor-parallel).
    dims: LocalDims,
    tp: Option<CpuTp>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("layers", &self.layers.len())
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .finish_non_exhaustive()
    }
}

fn weights_err(e: CheckpointError) -> BackendError {
    BackendError::Weights(e.to_string())
}

impl CpuBackend {
    /// Validates `checkpoint` against `config`, converts the weights to f32 and allocates the cache.
    pub fn new(
        config: &ModelConfig,
        checkpoint: &Checkpoint,
        options: CpuOptions,
    ) -> Result<Self, BackendError> {
        Self::new_sharded(config, checkpoint, options, None)
    }

    /// Like [`CpuBackend::new`], holding only `tp.shard`'s share of the weights and KV heads and
    /// running every forward pass together with the group's other ranks through `tp.comm`.
    pub fn new_sharded(
        config: &ModelConfig,
        checkpoint: &Checkpoint,
        options: CpuOptions,
        tp: Option<CpuTp>,
    ) -> Result<Self, BackendError> {
        let shard = tp.as_ref().map_or(crate::tp::TpShard::SOLO, |t| t.shard);
        if let Some(t) = &tp
            && (t.comm.world_size() != shard.world || t.comm.rank() != shard.rank)
        {
            return Err(BackendError::InvalidOptions(format!(
                "communicator is rank {} of {}, shard says {} of {}",
                t.comm.rank(),
                t.comm.world_size(),
                shard.rank,
                shard.world
            )));
        }
        let dims = LocalDims::new(config, shard)?;
        if options.block_size == 0 {
            return Err(BackendError::InvalidOptions(
                "block_size must be positive".into(),
            ));
        }
        if options.num_kv_blocks < 2 {
            return Err(BackendError::InvalidOptions(format!(
                "num_kv_blocks is {}; at least 2 are needed (block 0 is the null block)",
                options.num_kv_blocks
            )));
        }
        let cache_len = options
            .num_kv_blocks
            .checked_mul(options.block_size)
            .and_then(|n| n.checked_mul(dims.kv_dim))
            .filter(|n| n.checked_mul(4 * 2 * config.num_hidden_layers).is_some())
            .ok_or_else(|| BackendError::InvalidOptions("KV cache size overflows".into()))?;
        checkpoint.validate(config).map_err(weights_err)?;
        let quant = LinearQuant::resolve(options.quantization, config.quantization.as_ref())
            .map_err(|e| BackendError::InvalidOptions(e.to_string()))?;
        if quant != LinearQuant::None {
            tracing::info!(quantization = %quant.describe(), "CPU linear layers");
        }

        let layers = (0..config.num_hidden_layers)
            .into_par_iter()
            .map(|i| load_layer(config, checkpoint, i, &dims, &quant))
            .collect::<Result<Vec<_>, _>>()
            .map_err(weights_err)?;
        let embed = checkpoint
            .tensor_f32(names::EMBED_TOKENS)
            .map_err(weights_err)?;
        let h = config.hidden_size;
        let lm_head = if config.tie_word_embeddings {
            (shard.world > 1).then(|| rows(&embed, h, dims.vocab_range.clone()))
        } else {
            let full = checkpoint.tensor_f32(names::LM_HEAD).map_err(weights_err)?;
            Some(rows(&full, h, dims.vocab_range.clone()))
        };
        let final_norm = checkpoint
            .tensor_f32(names::FINAL_NORM)
            .map_err(weights_err)?;
        let kv_scales = options
            .kv_cache_dtype
            .scales(checkpoint, config.num_hidden_layers)
            .map_err(weights_err)?;
        let mut k_cache = Vec::with_capacity(config.num_hidden_layers);
        let mut v_cache = Vec::with_capacity(config.num_hidden_layers);
        for _ in 0..config.num_hidden_layers {
            k_cache.push(zeroed(cache_len)?);
            v_cache.push(zeroed(cache_len)?);
        }
        Ok(Self {
            config: config.clone(),
            embed,
            lm_head,
            final_norm,
            layers,
            inv_freq: config.rope.inv_freq(config.head_dim),
            block_size: options.block_size,
            num_blocks: options.num_kv_blocks,
            k_cache,
            v_cache,
            kv_scales,
            dims,
            tp,
        })
    }

    /// Sums `data` over the TP group (nothing without one).
    fn all_reduce(&mut self, data: &mut [f32]) -> Result<(), BackendError> {
        match &mut self.tp {
            Some(tp) => Ok(tp.comm.all_reduce_sum(data)?),
            None => Ok(()),
        }
    }

    /// Turns this rank's logits `[rows × vocab_range]` into full `[rows × vocab]` logits.
    fn gather_logits(
        &mut self,
        local: Vec<f32>,
        num_rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let Some(tp) = &mut self.tp else {
            return Ok(local);
        };
        let (vocab, per, world) = (
            self.config.vocab_size,
            self.dims.vocab_per_rank,
            tp.shard.world,
        );
        let width = self.dims.vocab_range.len();
        let mut padded = vec![0.0f32; num_rows * per];
        for (dst, src) in padded
            .chunks_exact_mut(per)
            .zip(local.chunks_exact(width.max(1)))
        {
            dst[..width].copy_from_slice(&src[..width]);
        }
        let mut gathered = vec![0.0f32; padded.len() * world];
        tp.comm.all_gather(&padded, &mut gathered)?;
        let mut out = vec![0.0f32; num_rows * vocab];
        for r in 0..world {
            let range = crate::tp::TpShard { rank: r, world }.ceil_range(vocab);
            let part = &gathered[r * num_rows * per..(r + 1) * num_rows * per];
            for i in 0..num_rows {
                out[i * vocab + range.start..i * vocab + range.end]
                    .copy_from_slice(&part[i * per..i * per + range.len()]);
            }
        }
        Ok(out)
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Checks `batch` against the cache and the model, returning each token's attention context.
    fn check_batch<'b>(
        &self,
        batch: &ForwardBatch<'b>,
    ) -> Result<Vec<TokenContext<'b>>, BackendError> {
        let tables = batch.validate(BatchLimits {
            vocab_size: self.config.vocab_size,
            block_size: self.block_size,
            num_blocks: self.num_blocks,
        })?;
        let mut tokens = Vec::with_capacity(batch.token_ids.len());
        for (seq, table) in batch.seqs.iter().zip(tables) {
            let end = seq.query_start + seq.query_len;
            for &p in &batch.positions[seq.query_start..end] {
                tokens.push(TokenContext {
                    position: p as usize,
                    block_table: table,
                    in_chunk: seq.query_len >= CHUNK_ATTENTION_MIN_TOKENS,
                });
            }
        }
        Ok(tokens)
    }

    /// Writes each token's K and V (the k and v parts of its `qkv` row) into layer `l`'s cache.
    fn write_kv(&mut self, l: usize, qkv: &[f32], tokens: &[TokenContext<'_>]) {
        let (q_dim, kv_dim) = (self.dims.q_dim, self.dims.kv_dim);
        let width = q_dim + 2 * kv_dim;
        let bs = self.block_size;
        let (kc, vc) = (&mut self.k_cache[l], &mut self.v_cache[l]);
        let scales = self.kv_scales.as_ref().map(|s| (s.k[l], s.v[l]));
        for (t, ctx) in tokens.iter().enumerate() {
            let block = ctx.block_table[ctx.position / bs] as usize;
            let dst = (block * bs + ctx.position % bs) * kv_dim;
            let row = &qkv[t * width..(t + 1) * width];
            let (k, v) = (&mut kc[dst..dst + kv_dim], &mut vc[dst..dst + kv_dim]);
            k.copy_from_slice(&row[q_dim..q_dim + kv_dim]);
            v.copy_from_slice(&row[q_dim + kv_dim..]);
            if let Some((ks, vs)) = scales {
                k.iter_mut().for_each(|x| *x = kv::round_trip(*x, ks));
                v.iter_mut().for_each(|x| *x = kv::round_trip(*x, vs));
            }
        }
    }
}

/// A zeroed cache buffer; running out of memory is an error, not an abort.
fn zeroed(len: usize) -> Result<Vec<f32>, BackendError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        BackendError::InvalidOptions(format!(
            "cannot allocate a KV cache of {} MiB per layer; use fewer KV blocks",
            (len * 8) >> 20
        ))
    })?;
    v.resize(len, 0.0);
    Ok(v)
}

/// Loads layer `i`'s share `dims` (the whole layer for a single rank). Quantized weights are
/// quantized (or read with their scales) whole, then split, so every rank holds the scales TP=1 has.
fn load_layer(
    config: &ModelConfig,
    ckpt: &Checkpoint,
    i: usize,
    dims: &LocalDims,
    quant: &LinearQuant,
) -> Result<LayerWeights, CheckpointError> {
    let get = |suffix: &str| ckpt.tensor_f32(&layer_tensor(i, suffix));
    let linear = |suffix: &str| linear_f32(ckpt, config, &layer_tensor(i, suffix), quant);
    let (h, d) = (config.hidden_size, config.head_dim);
    let (q_rows, kv_rows) = (times(&dims.head_range, d), times(&dims.kv_range, d));
    // Row-split pieces, stacked: (tensor, row width, owned rows), and their common input scheme.
    let stack_linear = |parts: &[(&str, usize, &std::ops::Range<usize>)]| {
        let mut out = Vec::new();
        let mut inputs = Vec::new();
        for (suffix, width, range) in parts {
            let l = linear(suffix)?;
            out.extend(rows(&l.weight, *width, (*range).clone()));
            inputs.push((*suffix, l.input));
        }
        Ok::<_, CheckpointError>((out, fused_input(ckpt, &inputs)?))
    };
    let stack = |parts: &[(&str, usize, &std::ops::Range<usize>)]| {
        let mut out = Vec::new();
        for (name, width, range) in parts {
            out.extend(rows(&get(name)?, *width, (*range).clone()));
        }
        Ok::<_, CheckpointError>(out)
    };
    let inter = &dims.inter_range;
    let (qkv, qkv_in) = stack_linear(&[
        (layer::Q_PROJ, h, &q_rows),
        (layer::K_PROJ, h, &kv_rows),
        (layer::V_PROJ, h, &kv_rows),
    ])?;
    let (gate_up, gate_up_in) =
        stack_linear(&[(layer::GATE_PROJ, h, inter), (layer::UP_PROJ, h, inter)])?;
    let o = linear(layer::O_PROJ)?;
    let down = linear(layer::DOWN_PROJ)?;
    Ok(LayerWeights {
        input_norm: get(layer::INPUT_NORM)?,
        post_norm: get(layer::POST_ATTENTION_NORM)?,
        qkv,
        qkv_bias: if config.qkv_bias {
            Some(stack(&[
                (layer::Q_BIAS, 1, &q_rows),
                (layer::K_BIAS, 1, &kv_rows),
                (layer::V_BIAS, 1, &kv_rows),
            ])?)
        } else {
            None
        },
        o: cols(&o.weight, config.q_dim(), q_rows.clone()),
        o_in: o.input,
        gate_up,
        down: cols(&down.weight, config.intermediate_size, inter.clone()),
        down_in: down.input,
        qkv_in,
        gate_up_in,
    })
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn num_kv_blocks(&self) -> usize {
        self.num_blocks
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<Logits, BackendError> {
        let tokens = self.check_batch(batch)?;
        let cfg = &self.config;
        let (n, h, vocab) = (tokens.len(), cfg.hidden_size, cfg.vocab_size);
        let (q_dim, kv_dim, inter) = (self.dims.q_dim, self.dims.kv_dim, self.dims.inter);
        let (hd, eps) = (cfg.head_dim, cfg.rms_norm_eps);
        let width = q_dim + 2 * kv_dim;
        let dims = AttentionDims {
            num_heads: self.dims.heads,
            num_kv_heads: self.dims.kv_heads,
            head_dim: hd,
            block_size: self.block_size,
            q_stride: width,
        };

        let mut x = Vec::with_capacity(n * h);
        for &t in batch.token_ids {
            x.extend_from_slice(&self.embed[t as usize * h..(t as usize + 1) * h]);
        }
        let (cos, sin) = ops::rope_tables(batch.positions, &self.inv_freq);
        let half = hd / 2;
        let mut normed = vec![0.0f32; n * h];
        let mut qkv = vec![0.0f32; n * width];
        let mut attn = vec![0.0f32; n * q_dim];
        let mut proj = vec![0.0f32; n * h];
        let mut gate_up = vec![0.0f32; n * 2 * inter];
        let mut act = vec![0.0f32; n * inter];

        for l in 0..self.layers.len() {
            let w = &self.layers[l];
            ops::rms_norm(&x, &w.input_norm, eps, &mut normed);
            let input = product_input(&normed, h, w.qkv_in);
            ops::matmul_t(&input, &w.qkv, &mut qkv, (n, h, width));
            qkv.par_chunks_mut(width).enumerate().for_each(|(t, row)| {
                if let Some(bias) = &w.qkv_bias {
                    row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
                }
                let (c, s) = (
                    &cos[t * half..(t + 1) * half],
                    &sin[t * half..(t + 1) * half],
                );
                ops::rope_in_place(&mut row[..q_dim + kv_dim], hd, c, s);
            });
            self.write_kv(l, &qkv, &tokens);
            let caches = (self.k_cache[l].as_slice(), self.v_cache[l].as_slice());
            attention::paged_attention(&qkv, caches, &tokens, dims, &mut attn);
            for seq in batch.seqs {
                if seq.query_len >= CHUNK_ATTENTION_MIN_TOKENS {
                    let chunk = Chunk {
                        first_row: seq.query_start,
                        len: seq.query_len,
                        context_len: seq.context_len,
                        // The validated table, cut to the context.
                        block_table: tokens[seq.query_start].block_table,
                    };
                    attention::chunk_attention(&qkv, caches, &chunk, dims, &mut attn);
                }
            }
            let w = &self.layers[l];
            let input = product_input(&attn, q_dim, w.o_in);
            ops::matmul_t(&input, &w.o, &mut proj, (n, q_dim, h));
            self.all_reduce(&mut proj)?;
            let w = &self.layers[l];
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
            ops::rms_norm(&x, &w.post_norm, eps, &mut normed);
            let input = product_input(&normed, h, w.gate_up_in);
            ops::matmul_t(&input, &w.gate_up, &mut gate_up, (n, h, 2 * inter));
            ops::silu_mul(&gate_up, inter, &mut act);
            let input = product_input(&act, inter, w.down_in);
            ops::matmul_t(&input, &w.down, &mut proj, (n, inter, h));
            self.all_reduce(&mut proj)?;
            x.iter_mut().zip(&proj).for_each(|(x, p)| *x += p);
        }

        let rows: Vec<usize> = batch
            .seqs
            .iter()
            .filter(|s| s.sample)
            .map(|s| s.query_start + s.query_len - 1)
            .collect();
        let mut last = Vec::with_capacity(rows.len() * h);
        for &r in &rows {
            last.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        let mut last_normed = vec![0.0f32; last.len()];
        ops::rms_norm(&last, &self.final_norm, eps, &mut last_normed);
        let head = self.lm_head.as_deref().unwrap_or(&self.embed);
        let local_vocab = self.dims.vocab_range.len();
        let mut data = vec![0.0f32; rows.len() * local_vocab];
        ops::matmul_t(&last_normed, head, &mut data, (rows.len(), h, local_vocab));
        let data = self.gather_logits(data, rows.len())?;
        Ok(Logits { vocab, data })
    }
}
