//! Uploading a checkpoint's weights to the device, in the compute type, with q/k/v and gate/up
//! fused into one matrix each, and only this rank's share of them in a tensor-parallel group
//! ([`LocalDims`]: row slices of q/k/v and gate/up, column slices of o and down).
//!
//! A tensor (or row slice) already in the compute type (bf16 → bf16, f32 → f32) is streamed
//! straight from the memory map through pinned chunks ([`Staging`]); column slices are gathered on
//! the host, and other types converted there first (f16/f32 → bf16 rounds to nearest even).

use std::borrow::Cow;
use std::ops::Range;

use half::{bf16, f16};
use rayon::prelude::*;

use super::device::{Buf, DType, Gpu};
use super::fp8::{QuantRows, quant_rows};
use super::int4::{self, Int4Scales};
use super::staging::{CopyStats, Staging};
use crate::backend::BackendError;
use crate::checkpoint::names::{self, layer, layer_tensor};
use crate::checkpoint::{Checkpoint, Dtype as StoredDtype, TensorView};
use crate::config::ModelConfig;
use crate::quant::LinearQuant;
use crate::quant::int4::{Int4Checkpoint, Int4Weight};
use crate::quant::load::{
    InputQuant, fused_input, gguf_int4, int4_layer, linear_shape_of, stored_fp8_layer,
};
use crate::tp::LocalDims;

/// An FP8 linear layer's scales on the device; its weight buffer then holds E4M3 codes (U8).
pub struct Fp8Scales {
    /// F32 `[n]`: one per output row.
    pub rows: Buf,
    /// The input's static scale; `None`: per-token dynamic.
    pub static_input: Option<f32>,
}

/// The scales of a layer's four FP8 products.
pub struct Fp8Layer {
    pub qkv: Fp8Scales,
    pub o: Fp8Scales,
    pub gate_up: Fp8Scales,
    pub down: Fp8Scales,
}

/// The scales of a layer's four INT4 products.
pub struct Int4Layer {
    pub qkv: Int4Scales,
    pub o: Int4Scales,
    pub gate_up: Int4Scales,
    pub down: Int4Scales,
}

/// A layer's quantized products' scales (the weight buffers then hold codes).
pub enum LayerQuant {
    Fp8(Box<Fp8Layer>),
    Int4(Box<Int4Layer>),
}

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
    /// With quantized linear layers: their scales (`qkv`, `o`, `gate_up`, `down` then hold E4M3
    /// codes, or packed INT4 codes).
    pub quant: Option<LayerQuant>,
}

impl LayerWeights {
    /// The FP8 scales, with FP8 layers.
    pub fn fp8(&self) -> Option<&Fp8Layer> {
        match &self.quant {
            Some(LayerQuant::Fp8(f)) => Some(f.as_ref()),
            _ => None,
        }
    }

    /// The INT4 scales, with INT4 layers.
    pub fn int4(&self) -> Option<&Int4Layer> {
        match &self.quant {
            Some(LayerQuant::Int4(f)) => Some(f.as_ref()),
            _ => None,
        }
    }
}

/// A product's scales, as [`upload_product`] returns them.
enum ProductScales {
    Fp8(Fp8Scales),
    Int4(Box<Int4Scales>),
}

/// The whole model (or this rank's share of it) on the device.
pub struct Weights {
    pub embed: Buf,
    /// `None` when tied to `embed` or not loaded (ranks other than 0 compute no logits).
    pub lm_head: Option<Buf>,
    /// Whether the output projection is `embed`.
    pub tied: bool,
    pub final_norm: Buf,
    pub layers: Vec<LayerWeights>,
    /// Bytes uploaded.
    pub bytes: usize,
    /// The host-to-device copy: bytes and seconds (conversion included).
    pub copy: CopyStats,
}

impl Weights {
    /// The output projection, if this rank holds one.
    pub fn lm_head(&self) -> Option<&Buf> {
        self.lm_head
            .as_ref()
            .or(if self.tied { Some(&self.embed) } else { None })
    }
}

fn weights_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Weights(e.to_string())
}

/// Elements stored as `stored` converted to little-endian bytes of `dtype`.
fn convert(data: &[u8], stored: StoredDtype, dtype: DType) -> Vec<u8> {
    let widen = |c: &[u8]| -> f32 {
        match stored {
            StoredDtype::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            StoredDtype::BF16 => bf16::from_le_bytes([c[0], c[1]]).to_f32(),
            StoredDtype::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
            // An E4M3 code without its scale; `CudaBackend::new_sharded` refuses FP8 tensors
            // (`quant::load::check_unquantized`) before any weight is converted.
            StoredDtype::F8E4M3 => crate::quant::fp8::e4m3_to_f32(c[0]),
            // Integers are only INT4 layers' packed tensors, read by `quant::load::int4_layer`;
            // `Checkpoint::validate` refuses them anywhere else.
            StoredDtype::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32,
        }
    };
    let size = stored.size();
    match dtype {
        DType::Bf16 => data
            .par_chunks(size * 4096)
            .flat_map_iter(|block| {
                block
                    .chunks_exact(size)
                    .flat_map(move |c| bf16::from_f32(widen(c)).to_le_bytes())
                    .collect::<Vec<u8>>()
            })
            .collect(),
        _ => data
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

/// Which part of a tensor (rows are the first axis; a 1-D tensor is a column of rows) to upload.
#[derive(Debug, Clone)]
enum Part {
    All,
    Rows(Range<usize>),
    Cols(Range<usize>),
}

/// The bytes of `part` of `view`, borrowed from the memory map when contiguous.
fn part_bytes<'a>(
    view: &TensorView<'a>,
    part: &Part,
) -> Result<(Cow<'a, [u8]>, usize), BackendError> {
    let size = view.dtype.size();
    let rows = view.shape.first().copied().unwrap_or(1);
    let width = view.numel().checked_div(rows).unwrap_or(0);
    let bad = |r: &Range<usize>, of: usize| {
        BackendError::Weights(format!(
            "{}: slice {r:?} is outside its {of} {}",
            view.name,
            if matches!(part, Part::Cols(_)) {
                "columns"
            } else {
                "rows"
            }
        ))
    };
    if width == 0 {
        return Ok((Cow::Borrowed(&view.data[..0]), 0));
    }
    match part {
        Part::All => Ok((Cow::Borrowed(view.data), view.numel())),
        Part::Rows(r) => {
            if r.start > r.end || r.end > rows {
                return Err(bad(r, rows));
            }
            let bytes = &view.data[r.start * width * size..r.end * width * size];
            Ok((Cow::Borrowed(bytes), r.len() * width))
        }
        Part::Cols(r) => {
            if r.start > r.end || r.end > width {
                return Err(bad(r, width));
            }
            let mut out = Vec::with_capacity(rows * r.len() * size);
            for row in view.data.chunks_exact(width * size) {
                out.extend_from_slice(&row[r.start * size..r.end * size]);
            }
            Ok((Cow::Owned(out), rows * r.len()))
        }
    }
}

/// Uploads the named tensors' parts stacked along their first axis.
fn upload_stacked(
    gpu: &Gpu,
    staging: &mut Staging,
    ckpt: &Checkpoint,
    parts: &[(String, Part)],
    dtype: DType,
) -> Result<Buf, BackendError> {
    let pieces = parts
        .iter()
        .map(|(name, part)| {
            let view = ckpt.tensor(name).map_err(weights_err)?;
            let (bytes, numel) = part_bytes(&view, part)?;
            Ok((view.dtype, bytes, numel))
        })
        .collect::<Result<Vec<_>, BackendError>>()?;
    let total: usize = pieces.iter().map(|p| p.2).sum();
    let mut buf = gpu.alloc(dtype, total)?;
    let mut offset = 0;
    for (stored, bytes, numel) in &pieces {
        let same = matches!(
            (stored, dtype),
            (StoredDtype::BF16, DType::Bf16)
                | (StoredDtype::F32, DType::F32)
                | (StoredDtype::F8E4M3, DType::U8)
        );
        if (*stored == StoredDtype::F8E4M3) != (dtype == DType::U8) {
            return Err(BackendError::Weights(format!(
                "{}: {stored:?} weights cannot be uploaded as {dtype:?}",
                parts[0].0
            )));
        }
        if same {
            staging.write(gpu, &mut buf, offset, bytes)?;
        } else {
            staging.write(gpu, &mut buf, offset, &convert(bytes, *stored, dtype))?;
        }
        offset += numel * dtype.size();
    }
    Ok(buf)
}

/// `--quantization fp8` for a product with column shards (o and down under `--tp`): every row
/// is quantized whole on the host — its bf16 values with the quantizer `quant_fp8_rows_bf16`
/// matches bit for bit — and then split, so each rank holds TP=1's codes and row scales (a shard
/// quantized on its own would take its half row's amax). Returns the parts' codes stacked and
/// their row scales.
fn quantize_column_shard(
    ckpt: &Checkpoint,
    parts: &[(String, Part)],
) -> Result<(Vec<u8>, Vec<f32>), BackendError> {
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    for (name, part) in parts {
        let view = ckpt.tensor(name).map_err(weights_err)?;
        let rows = view.shape.first().copied().unwrap_or(1);
        let width = view.numel().checked_div(rows).unwrap_or(0);
        let w: Vec<f32> = view
            .to_f32_vec()
            .into_iter()
            .map(|x| bf16::from_f32(x).to_f32())
            .collect();
        let quantized: Vec<crate::quant::fp8::Fp8Rows> = w
            .par_chunks(width.max(1))
            .map(|row| crate::quant::fp8::Fp8Rows::quantize(row, width))
            .collect();
        let (cols, row_range) = match part {
            Part::All => (0..width, 0..rows),
            Part::Cols(c) if c.end <= width => (c.clone(), 0..rows),
            Part::Rows(r) if r.end <= rows => (0..width, r.clone()),
            other => {
                return Err(BackendError::Weights(format!(
                    "{name}: slice {other:?} outside its {rows} × {width}"
                )));
            }
        };
        for q in &quantized[row_range] {
            codes.extend_from_slice(&q.codes[cols.clone()]);
            scales.extend_from_slice(&q.scales);
        }
    }
    Ok((codes, scales))
}

/// One linear product's weights (its parts stacked) of `n` rows × `k`, as `quant` asks: `dtype`
/// values, or E4M3 codes with their row scales — the checkpoint's own, or quantized here on the
/// device from bf16, row by row with the kernel that quantizes activations (the CPU reference's
/// arithmetic, bit for bit).
fn upload_product(
    gpu: &Gpu,
    staging: &mut Staging,
    (config, ckpt): (&ModelConfig, &Checkpoint),
    parts: &[(String, Part)],
    (dtype, quant): (DType, &LinearQuant),
    (n, k): (usize, usize),
) -> Result<(Buf, Option<ProductScales>), BackendError> {
    match quant {
        LinearQuant::None => Ok((upload_stacked(gpu, staging, ckpt, parts, dtype)?, None)),
        LinearQuant::Int4(spec) => {
            let w = int4_product(config, parts, checkpoint_int4(ckpt, spec), (n, k))?;
            upload_int4(gpu, &w, &parts[0].0)
        }
        LinearQuant::Fp8 { stored: None }
            if parts.iter().any(|(_, p)| matches!(p, Part::Cols(_))) =>
        {
            let (codes, row_scales) = quantize_column_shard(ckpt, parts)?;
            if (codes.len(), row_scales.len()) != (n * k, n) {
                return Err(BackendError::Weights(format!(
                    "{}: {} codes and {} row scales for a {n} × {k} product",
                    parts[0].0,
                    codes.len(),
                    row_scales.len()
                )));
            }
            let scales = Fp8Scales {
                rows: gpu.upload_f32(&row_scales, DType::F32)?,
                static_input: None,
            };
            Ok((
                gpu.upload_bytes(&codes, DType::U8)?,
                Some(ProductScales::Fp8(scales)),
            ))
        }
        LinearQuant::Fp8 { stored: None } => {
            let dense = upload_stacked(gpu, staging, ckpt, parts, DType::Bf16)?;
            let (codes, rows) = (gpu.alloc(DType::U8, n * k)?, gpu.alloc(DType::F32, n)?);
            let q = QuantRows {
                x: &dense,
                q: &codes,
                scales: &rows,
                m: n,
                k,
                static_scale: 0.0,
            };
            quant_rows(gpu, &q)?;
            // The bf16 copy is freed in stream order after the kernel that reads it.
            drop(dense);
            let scales = Fp8Scales {
                rows,
                static_input: None,
            };
            Ok((codes, Some(ProductScales::Fp8(scales))))
        }
        LinearQuant::Fp8 {
            stored: Some(stored),
        } => {
            // The scales first: reading them checks each part (an FP8 weight, its scales' shape
            // and values) and names the tensor at fault before anything is uploaded.
            let mut row_scales = Vec::with_capacity(n);
            let mut inputs = Vec::with_capacity(parts.len());
            for (name, part) in parts {
                let layer = stored_fp8_layer(ckpt, name, stored)
                    .map_err(weights_err)?
                    .ok_or_else(|| {
                        BackendError::Weights(format!(
                            "{name}: unquantized layers inside an FP8 checkpoint (its `ignore` \
                             list) run on the CPU backend only so far"
                        ))
                    })?;
                let rows = match part {
                    Part::Rows(r) => layer.row_scales.get(r.clone()).ok_or_else(|| {
                        BackendError::Weights(format!(
                            "{name}: rows {r:?} outside its {} scales",
                            layer.row_scales.len()
                        ))
                    })?,
                    Part::All | Part::Cols(_) => &layer.row_scales[..],
                };
                row_scales.extend_from_slice(rows);
                inputs.push((name.as_str(), Some(layer.input)));
            }
            if row_scales.len() != n {
                return Err(BackendError::Weights(format!(
                    "{}: {} row scales for {n} rows",
                    parts[0].0,
                    row_scales.len()
                )));
            }
            let codes = upload_stacked(gpu, staging, ckpt, parts, DType::U8)?;
            let static_input = match fused_input(ckpt, &inputs).map_err(weights_err)? {
                Some(InputQuant::Static(s)) => Some(s),
                _ => None,
            };
            let scales = Fp8Scales {
                rows: gpu.upload_f32(&row_scales, DType::F32)?,
                static_input,
            };
            Ok((codes, Some(ProductScales::Fp8(scales))))
        }
    }
}

/// One INT4 product's parts, each read by `read` (module, rows, cols; unpacked on the host),
/// sliced to `parts` and stacked: a shard's rows of q/k/v and gate/up, or its whole groups of
/// o's and down's columns (a column shard must start and end on group boundaries).
fn int4_product(
    config: &ModelConfig,
    parts: &[(String, Part)],
    read: impl Fn(&str, usize, usize) -> Result<Int4Weight, BackendError>,
    (n, k): (usize, usize),
) -> Result<Int4Weight, BackendError> {
    let mut pieces = Vec::with_capacity(parts.len());
    for (name, part) in parts {
        let module = name.trim_end_matches(".weight");
        let (rows, cols) = linear_shape_of(config, name)
            .ok_or_else(|| BackendError::Weights(format!("{name}: not a decoder linear layer")))?;
        let w = read(module, rows, cols)?;
        pieces.push(match part {
            Part::All => w,
            Part::Rows(r) if r.end <= w.rows => w.row_slice(r.clone()),
            Part::Cols(c) if c.end <= w.cols => w.col_slice(c.clone()).ok_or_else(|| {
                BackendError::Weights(format!(
                    "{module}: this rank's input columns {c:?} do not start and end on groups of \
                     {} (act order and group-splitting shards are not supported on CUDA)",
                    w.group_size
                ))
            })?,
            other => {
                return Err(BackendError::Weights(format!(
                    "{module}: slice {other:?} outside its {rows} × {cols}"
                )));
            }
        });
    }
    let w = Int4Weight::stack(pieces)
        .map_err(|e| BackendError::Weights(format!("{}: {e}", parts[0].0)))?;
    if (w.rows, w.cols) != (n, k) {
        return Err(BackendError::Weights(format!(
            "{}: {} × {} INT4 weights for a {n} × {k} product",
            parts[0].0, w.rows, w.cols
        )));
    }
    Ok(w)
}

/// An INT4 checkpoint's module as `spec`'s tool packed it.
fn checkpoint_int4<'a>(
    ckpt: &'a Checkpoint,
    spec: &'a Int4Checkpoint,
) -> impl Fn(&str, usize, usize) -> Result<Int4Weight, BackendError> + 'a {
    move |module, rows, cols| {
        if spec.skips(module) {
            return Err(BackendError::Weights(format!(
                "{module}: unquantized layers inside an INT4 checkpoint (modules_to_not_convert) \
                 run on the CPU backend only so far"
            )));
        }
        int4_layer(ckpt, module, spec, rows, cols).map_err(weights_err)
    }
}

/// A GGUF file's `Q4_0` / `Q4_1` module as its blocks.
fn gguf_q4(
    ckpt: &Checkpoint,
) -> impl Fn(&str, usize, usize) -> Result<Int4Weight, BackendError> + '_ {
    move |module, rows, cols| {
        let name = format!("{module}.weight");
        match gguf_int4(ckpt, &name).map_err(weights_err)? {
            Some(w) if (w.rows, w.cols) == (rows, cols) => Ok(w),
            Some(w) => Err(BackendError::Weights(format!(
                "{name}: {} × {} blocks for a {rows} × {cols} layer",
                w.rows, w.cols
            ))),
            None => Err(BackendError::Weights(format!(
                "{name}: not stored as Q4_0 or Q4_1"
            ))),
        }
    }
}

/// Whether every decoder linear weight of layer `i` is a GGUF `Q4_0` / `Q4_1` tensor (the layer
/// then runs on the INT4 kernels instead of being dequantized to the compute type).
fn gguf_layer_is_q4(ckpt: &Checkpoint, i: usize) -> bool {
    names::LINEAR_WEIGHTS.iter().all(|suffix| {
        matches!(
            ckpt.gguf_type(&layer_tensor(i, suffix)),
            Some(gguf::GgmlType::Q4_0 | gguf::GgmlType::Q4_1)
        )
    })
}

/// Packs and uploads one INT4 product.
fn upload_int4(
    gpu: &Gpu,
    w: &Int4Weight,
    what: &str,
) -> Result<(Buf, Option<ProductScales>), BackendError> {
    let packed = int4::pack(w)
        .map_err(|e| BackendError::Weights(format!("{}: {e}", what.trim_end_matches(".weight"))))?;
    let (words, scales) = Int4Scales::upload(gpu, &packed)?;
    Ok((words, Some(ProductScales::Int4(Box::new(scales)))))
}

/// Validates the checkpoint against `config` and uploads this rank's share (`dims`) of every
/// weight as `dtype` (the decoder linears as `quant` says; with `gguf_int4`, those of a GGUF
/// layer whose linears are all `Q4_0` / `Q4_1` as INT4 products); the output projection only
/// when `lm_head` (rank 0, which samples).
pub fn upload(
    gpu: &Gpu,
    config: &ModelConfig,
    ckpt: &Checkpoint,
    (dtype, quant, gguf_int4): (DType, &LinearQuant, bool),
    dims: &LocalDims,
    lm_head: bool,
) -> Result<Weights, BackendError> {
    ckpt.validate(config).map_err(weights_err)?;
    let mut staging = Staging::new(gpu)?;
    let st = &mut staging;
    let d = config.head_dim;
    let scaled = |r: &Range<usize>| r.start * d..r.end * d;
    let (q_rows, kv_rows) = (scaled(&dims.head_range), scaled(&dims.kv_range));
    let whole = |name: String| vec![(name, Part::All)];
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for i in 0..config.num_hidden_layers {
        let t = |s: &str| layer_tensor(i, s);
        let qkv_parts = |q: &str, k: &str, v: &str| {
            vec![
                (t(q), Part::Rows(q_rows.clone())),
                (t(k), Part::Rows(kv_rows.clone())),
                (t(v), Part::Rows(kv_rows.clone())),
            ]
        };
        let h = config.hidden_size;
        let q4 = gguf_int4 && gguf_layer_is_q4(ckpt, i);
        let mut product = |parts: Vec<(String, Part)>, nk: (usize, usize)| {
            if q4 {
                let w = int4_product(config, &parts, gguf_q4(ckpt), nk)?;
                upload_int4(gpu, &w, &parts[0].0)
            } else {
                upload_product(gpu, st, (config, ckpt), &parts, (dtype, quant), nk)
            }
        };
        let (qkv, qkv_s) = product(
            qkv_parts(layer::Q_PROJ, layer::K_PROJ, layer::V_PROJ),
            (dims.q_dim + 2 * dims.kv_dim, h),
        )?;
        let (o, o_s) = product(
            vec![(t(layer::O_PROJ), Part::Cols(q_rows.clone()))],
            (h, dims.q_dim),
        )?;
        let (gate_up, gate_up_s) = product(
            vec![
                (t(layer::GATE_PROJ), Part::Rows(dims.inter_range.clone())),
                (t(layer::UP_PROJ), Part::Rows(dims.inter_range.clone())),
            ],
            (2 * dims.inter, h),
        )?;
        let (down, down_s) = product(
            vec![(t(layer::DOWN_PROJ), Part::Cols(dims.inter_range.clone()))],
            (h, dims.inter),
        )?;
        let quant = match (qkv_s, o_s, gate_up_s, down_s) {
            (
                Some(ProductScales::Fp8(qkv)),
                Some(ProductScales::Fp8(o)),
                Some(ProductScales::Fp8(gate_up)),
                Some(ProductScales::Fp8(down)),
            ) => Some(LayerQuant::Fp8(Box::new(Fp8Layer {
                qkv,
                o,
                gate_up,
                down,
            }))),
            (
                Some(ProductScales::Int4(qkv)),
                Some(ProductScales::Int4(o)),
                Some(ProductScales::Int4(gate_up)),
                Some(ProductScales::Int4(down)),
            ) => Some(LayerQuant::Int4(Box::new(Int4Layer {
                qkv: *qkv,
                o: *o,
                gate_up: *gate_up,
                down: *down,
            }))),
            (None, None, None, None) => None,
            _ => {
                return Err(BackendError::Weights(format!(
                    "layer {i}: its products are quantized differently"
                )));
            }
        };
        let mut up = |parts: Vec<(String, Part)>| upload_stacked(gpu, st, ckpt, &parts, dtype);
        layers.push(LayerWeights {
            input_norm: up(whole(t(layer::INPUT_NORM)))?,
            post_norm: up(whole(t(layer::POST_ATTENTION_NORM)))?,
            qkv,
            qkv_bias: if config.qkv_bias {
                Some(up(qkv_parts(layer::Q_BIAS, layer::K_BIAS, layer::V_BIAS))?)
            } else {
                None
            },
            o,
            gate_up,
            down,
            quant,
        });
    }
    let mut one = |name: &str| upload_stacked(gpu, st, ckpt, &whole(name.to_string()), dtype);
    let embed = one(names::EMBED_TOKENS)?;
    let tied = config.tie_word_embeddings;
    let lm_head = if lm_head && !tied {
        Some(one(names::LM_HEAD)?)
    } else {
        None
    };
    let final_norm = one(names::FINAL_NORM)?;
    let copy = staging.finish(gpu)?;
    let mut bytes = embed.bytes() + final_norm.bytes() + lm_head.as_ref().map_or(0, Buf::bytes);
    for l in &layers {
        bytes += l.input_norm.bytes()
            + l.post_norm.bytes()
            + l.qkv.bytes()
            + l.qkv_bias.as_ref().map_or(0, Buf::bytes)
            + l.o.bytes()
            + l.gate_up.bytes()
            + l.down.bytes()
            + match &l.quant {
                None => 0,
                Some(LayerQuant::Fp8(f)) => [&f.qkv, &f.o, &f.gate_up, &f.down]
                    .iter()
                    .map(|s| s.rows.bytes())
                    .sum(),
                Some(LayerQuant::Int4(f)) => [&f.qkv, &f.o, &f.gate_up, &f.down]
                    .iter()
                    .map(|s| s.bytes())
                    .sum(),
            };
    }
    Ok(Weights {
        embed,
        lm_head,
        tied,
        final_norm,
        layers,
        bytes,
        copy,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// A 3 x 4 f32 matrix with element (r, c) = 10 r + c.
    fn matrix() -> Vec<u8> {
        (0..3)
            .flat_map(|r| (0..4).map(move |c| (10 * r + c) as f32))
            .flat_map(f32::to_le_bytes)
            .collect()
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn view<'a>(shape: &'a [usize], data: &'a [u8]) -> TensorView<'a> {
        TensorView {
            name: "w",
            file: Path::new("model.safetensors"),
            dtype: StoredDtype::F32,
            shape,
            data,
        }
    }

    #[test]
    fn parts_slice_rows_and_columns() {
        let data = matrix();
        let v = view(&[3, 4], &data);
        let (all, n) = part_bytes(&v, &Part::All).unwrap();
        assert_eq!((floats(&all).len(), n), (12, 12));
        let (rows, n) = part_bytes(&v, &Part::Rows(1..3)).unwrap();
        assert!(
            matches!(rows, Cow::Borrowed(_)),
            "row slices stream from the map"
        );
        assert_eq!(n, 8);
        assert_eq!(floats(&rows), [10., 11., 12., 13., 20., 21., 22., 23.]);
        let (cols, n) = part_bytes(&v, &Part::Cols(1..3)).unwrap();
        assert_eq!(n, 6);
        assert_eq!(floats(&cols), [1., 2., 11., 12., 21., 22.]);
        // A bias (1-D) splits by rows.
        let bias = view(&[4], &data[..16]);
        let (b, n) = part_bytes(&bias, &Part::Rows(2..4)).unwrap();
        assert_eq!((floats(&b), n), (vec![2., 3.], 2));
    }

    #[test]
    fn out_of_range_parts_are_errors_naming_the_tensor() {
        let data = matrix();
        let v = view(&[3, 4], &data);
        for part in [Part::Rows(2..4), Part::Cols(3..5)] {
            let e = part_bytes(&v, &part).unwrap_err().to_string();
            assert!(e.contains("w:") && e.contains("outside"), "{e}");
        }
        let empty = view(&[0, 4], &data[..0]);
        assert_eq!(part_bytes(&empty, &Part::Cols(0..2)).unwrap().1, 0);
    }

    /// A column shard of `--quantization fp8` holds TP=1's codes and row scales: each row
    /// quantized whole (its bf16 values) and then split; a row shard the rows it names.
    #[test]
    fn fp8_column_shards_carry_the_whole_rows_quantization() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama");
        let ckpt = Checkpoint::open(&dir).unwrap();
        let name = "model.layers.0.self_attn.o_proj.weight".to_string();
        let w: Vec<f32> = ckpt
            .tensor(&name)
            .unwrap()
            .to_f32_vec()
            .iter()
            .map(|&x| bf16::from_f32(x).to_f32())
            .collect();
        let whole = crate::quant::fp8::Fp8Rows::quantize(&w, 64);
        let (codes, scales) =
            quantize_column_shard(&ckpt, &[(name.clone(), Part::Cols(16..48))]).unwrap();
        assert_eq!(scales, whole.scales);
        let want: Vec<u8> = whole
            .codes
            .chunks(64)
            .flat_map(|r| r[16..48].to_vec())
            .collect();
        assert_eq!(codes, want);
        let (rows, row_scales) =
            quantize_column_shard(&ckpt, &[(name.clone(), Part::Rows(3..5))]).unwrap();
        assert_eq!(
            (rows, row_scales),
            (
                whole.codes[3 * 64..5 * 64].to_vec(),
                whole.scales[3..5].to_vec()
            )
        );
        let e = quantize_column_shard(&ckpt, &[(name, Part::Cols(60..70))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("o_proj") && e.contains("outside"), "{e}");
    }
}
