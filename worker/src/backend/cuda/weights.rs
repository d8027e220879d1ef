//! Uploading a checkpoint's weights to the device, in the compute type, with q/k/v and gate/up
//! fused into one matrix each.
//!
//! A tensor already in the compute type (bf16 → bf16, f32 → f32) is streamed straight from the
//! memory map through pinned chunks ([`Staging`]); others are converted on the host first
//! (f16/f32 → bf16 rounds to nearest even).

use half::{bf16, f16};
use rayon::prelude::*;

use super::device::{Buf, DType, Gpu};
use super::staging::{CopyStats, Staging};
use crate::backend::BackendError;
use crate::checkpoint::names::{self, layer, layer_tensor};
use crate::checkpoint::{Checkpoint, Dtype as StoredDtype, TensorView};
use crate::config::ModelConfig;

/// One decoder layer on the device (HF `[out, in]` layout).
pub struct LayerWeights {
    pub input_norm: Buf,
    pub post_norm: Buf,
    /// `[q_dim + 2 kv_dim, hidden]`.
    pub qkv: Buf,
    pub qkv_bias: Option<Buf>,
    pub o: Buf,
    /// `[2 intermediate, hidden]`: gate rows then up rows.
    pub gate_up: Buf,
    pub down: Buf,
}

/// The whole model on the device.
pub struct Weights {
    pub embed: Buf,
    /// `None` when tied to `embed`.
    pub lm_head: Option<Buf>,
    pub final_norm: Buf,
    pub layers: Vec<LayerWeights>,
    /// Bytes uploaded.
    pub bytes: usize,
    /// The host-to-device copy: bytes and seconds (conversion included).
    pub copy: CopyStats,
}

impl Weights {
    /// The output projection.
    pub fn lm_head(&self) -> &Buf {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

fn weights_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Weights(e.to_string())
}

/// A tensor's elements as little-endian bytes of `dtype`.
fn convert(view: &TensorView<'_>, dtype: DType) -> Vec<u8> {
    let widen = |c: &[u8]| -> f32 {
        match view.dtype {
            StoredDtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            StoredDtype::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f32(),
            StoredDtype::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
        }
    };
    let size = view.dtype.size();
    match dtype {
        DType::Bf16 => view
            .data
            .par_chunks(size * 4096)
            .flat_map_iter(|block| {
                block
                    .chunks_exact(size)
                    .flat_map(move |c| bf16::from_f32(widen(c)).to_le_bytes())
                    .collect::<Vec<u8>>()
            })
            .collect(),
        _ => view
            .data
            .par_chunks(size * 4096)
            .flat_map_iter(|block| {
                block
                    .chunks_exact(size)
                    .flat_map(move |c| widen(c).to_le_bytes())
                    .collect::<Vec<u8>>()
            })
            .collect(),
    }
}

/// Uploads the named tensors stacked along their first axis.
fn upload_stacked(
    gpu: &Gpu,
    staging: &mut Staging,
    ckpt: &Checkpoint,
    names: &[String],
    dtype: DType,
) -> Result<Buf, BackendError> {
    let views = names
        .iter()
        .map(|n| ckpt.tensor(n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(weights_err)?;
    let total: usize = views.iter().map(|v| v.numel()).sum();
    let mut buf = gpu.alloc(dtype, total)?;
    let mut offset = 0;
    for v in &views {
        let same = matches!(
            (v.dtype, dtype),
            (StoredDtype::BF16, DType::Bf16) | (StoredDtype::F32, DType::F32)
        );
        if same {
            staging.write(gpu, &mut buf, offset, v.data)?;
        } else {
            staging.write(gpu, &mut buf, offset, &convert(v, dtype))?;
        }
        offset += v.numel() * dtype.size();
    }
    Ok(buf)
}

/// Validates the checkpoint against `config` and uploads every weight as `dtype`.
pub fn upload(
    gpu: &Gpu,
    config: &ModelConfig,
    ckpt: &Checkpoint,
    dtype: DType,
) -> Result<Weights, BackendError> {
    ckpt.validate(config).map_err(weights_err)?;
    let mut staging = Staging::new(gpu)?;
    let st = &mut staging;
    let one =
        |st: &mut Staging, name: &str| upload_stacked(gpu, st, ckpt, &[name.to_string()], dtype);
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let t = |s: &str| layer_tensor(i, s);
        let stacked = |st: &mut Staging, parts: &[&str]| {
            let names: Vec<String> = parts.iter().map(|p| t(p)).collect();
            upload_stacked(gpu, st, ckpt, &names, dtype)
        };
        layers.push(LayerWeights {
            input_norm: one(st, &t(layer::INPUT_NORM))?,
            post_norm: one(st, &t(layer::POST_ATTENTION_NORM))?,
            qkv: stacked(st, &[layer::Q_PROJ, layer::K_PROJ, layer::V_PROJ])?,
            qkv_bias: if config.qkv_bias {
                Some(stacked(st, &[layer::Q_BIAS, layer::K_BIAS, layer::V_BIAS])?)
            } else {
                None
            },
            o: one(st, &t(layer::O_PROJ))?,
            gate_up: stacked(st, &[layer::GATE_PROJ, layer::UP_PROJ])?,
            down: one(st, &t(layer::DOWN_PROJ))?,
        });
    }
    let embed = one(st, names::EMBED_TOKENS)?;
    let lm_head = if config.tie_word_embeddings {
        None
    } else {
        Some(one(st, names::LM_HEAD)?)
    };
    let final_norm = one(st, names::FINAL_NORM)?;
    let copy = staging.finish(gpu)?;
    let mut bytes = embed.bytes() + final_norm.bytes() + lm_head.as_ref().map_or(0, Buf::bytes);
    for l in &layers {
        bytes += l.input_norm.bytes()
            + l.post_norm.bytes()
            + l.qkv.bytes()
            + l.qkv_bias.as_ref().map_or(0, Buf::bytes)
            + l.o.bytes()
            + l.gate_up.bytes()
            + l.down.bytes();
    }
    Ok(Weights {
        embed,
        lm_head,
        final_norm,
        layers,
        bytes,
        copy,
    })
}
