//! Reading one decoder linear layer under a [`LinearQuant`]: its weight as the FP8 product sees it
//! (dequantized to f32 for the CPU reference) and how its input is quantized.
//!
//! An FP8 checkpoint's `…proj.weight` is `F8_E4M3` with a `…proj.weight_scale` (one value, or one
//! per output row; F32, BF16 or F16) and, with static activations, a one-value `…proj.input_scale`.
//! Every scale is checked: present, the right shape, finite and positive.

use crate::checkpoint::{Checkpoint, CheckpointError, Dtype, TensorView, names};
use crate::config::ModelConfig;
use crate::quant::fp8::{self, Fp8Rows};
use crate::quant::int4::{self, Int4Checkpoint, Int4Format, Int4Weight};
use crate::quant::{ActivationScheme, Fp8Checkpoint, LinearQuant, ScaleGranularity};

/// How a linear layer's input is quantized before the product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InputQuant {
    /// One scale per token, from its largest magnitude.
    DynamicPerToken,
    /// One fixed scale.
    Static(f32),
}

impl InputQuant {
    /// Replaces each `width`-wide token of `x` by the FP8 value the product sees.
    pub fn apply(self, x: &mut [f32], width: usize) {
        match self {
            Self::DynamicPerToken => fp8::fake_quant_tokens(x, width),
            Self::Static(scale) => fp8::fake_quant_static(x, scale),
        }
    }
}

/// A linear layer's `[out, in]` weight in f32, as the product sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearF32 {
    pub weight: Vec<f32>,
    /// `None`: the input is used as it is (unquantized layers).
    pub input: Option<InputQuant>,
}

/// The module name of a weight tensor (`….q_proj` for `….q_proj.weight`).
fn module_of(weight: &str) -> &str {
    weight.strip_suffix(".weight").unwrap_or(weight)
}

/// Loads the linear layer whose weight tensor is `weight` (`model.layers.3.self_attn.q_proj.weight`).
pub fn linear_f32(
    ckpt: &Checkpoint,
    config: &ModelConfig,
    weight: &str,
    quant: &LinearQuant,
) -> Result<LinearF32, CheckpointError> {
    let view = || ckpt.tensor(weight);
    match quant {
        LinearQuant::None => Ok(LinearF32 {
            weight: unquantized(&view()?)?,
            input: None,
        }),
        LinearQuant::Fp8 { stored: None } => {
            let view = view()?;
            let w = unquantized(&view)?;
            let width = view.shape.get(1).copied().unwrap_or(1);
            Ok(LinearF32 {
                weight: Fp8Rows::quantize(&w, width).dequantize(),
                input: Some(InputQuant::DynamicPerToken),
            })
        }
        LinearQuant::Int4(spec) => {
            let module = module_of(weight);
            if spec.skips(module) {
                return Ok(LinearF32 {
                    weight: unquantized(&ckpt.tensor(weight)?)?,
                    input: None,
                });
            }
            let (rows, cols) =
                linear_shape_of(config, weight).ok_or_else(|| CheckpointError::MissingTensor {
                    path: ckpt.dir().join("config.json"),
                    tensor: weight.to_owned(),
                })?;
            Ok(LinearF32 {
                weight: int4_layer(ckpt, module, spec, rows, cols)?.dequantize(),
                input: None,
            })
        }
        LinearQuant::Fp8 {
            stored: Some(stored),
        } => match stored_fp8_layer(ckpt, weight, stored)? {
            None => Ok(LinearF32 {
                weight: unquantized(&view()?)?,
                input: None,
            }),
            Some(layer) => Ok(LinearF32 {
                weight: layer.dequantize(),
                input: Some(layer.input),
            }),
        },
    }
}

/// The `[out, in]` shape `config` gives decoder linear `weight`, if it is one.
pub fn linear_shape_of(config: &ModelConfig, weight: &str) -> Option<(usize, usize)> {
    names::expected_tensors(config)
        .find(|(n, _)| n == weight)
        .and_then(|(_, s)| Some((*s.first()?, *s.get(1)?)))
}

fn bad_int4(view: &TensorView<'_>, reason: String) -> CheckpointError {
    CheckpointError::BadQuantization {
        path: view.file.to_path_buf(),
        tensor: view.name.to_owned(),
        reason,
    }
}

/// A tensor of `dtype` in `allowed` with exactly `shape`, else an error naming it.
fn int4_tensor<'a>(
    ckpt: &'a Checkpoint,
    name: &str,
    allowed: &[Dtype],
    shape: &[usize],
    why: &str,
) -> Result<TensorView<'a>, CheckpointError> {
    let view = ckpt.tensor(name)?;
    if !allowed.contains(&view.dtype) {
        return Err(bad_int4(
            &view,
            format!("stored as {:?}; expected {allowed:?} ({why})", view.dtype),
        ));
    }
    if view.shape != shape {
        return Err(bad_int4(
            &view,
            format!("shape {:?}, expected {shape:?} ({why})", view.shape),
        ));
    }
    Ok(view)
}

/// Reads INT4 linear `module` (`model.layers.3.mlp.down_proj`) of an `[rows, cols]` (`[out, in]`)
/// layer as `spec`'s tool packed it, checking every tensor's dtype and shape, the group size
/// against the input width, the scales (finite) and the act-order `g_idx` or `weight_g_idx` (present
/// with `desc_act`, in range).
pub fn int4_layer(
    ckpt: &Checkpoint,
    module: &str,
    spec: &Int4Checkpoint,
    rows: usize,
    cols: usize,
) -> Result<Int4Weight, CheckpointError> {
    let name = |t: &str| format!("{module}.{t}");
    let gs = spec.group_for(cols);
    let ct = spec.format == Int4Format::CompressedTensors;
    let qweight = name(if ct { "weight_packed" } else { "qweight" });
    let shape_err = |reason: String| CheckpointError::BadQuantization {
        path: ckpt.dir().join("config.json"),
        tensor: qweight.clone(),
        reason,
    };
    if !rows.is_multiple_of(8) {
        return Err(shape_err(format!(
            "{rows} output features: INT4 packs eight per int32, so they must be a multiple of 8"
        )));
    }
    if spec.format == Int4Format::Awq && !cols.is_multiple_of(gs) {
        return Err(shape_err(format!(
            "group_size {gs} does not divide the layer's {cols} input features"
        )));
    }
    if spec.format != Int4Format::Awq && !cols.is_multiple_of(8) {
        return Err(shape_err(format!(
            "{cols} input features: the layout packs eight per int32, so they must be a multiple \
             of 8"
        )));
    }
    let groups = cols.div_ceil(gs);
    let scale_types = [Dtype::F16, Dtype::BF16, Dtype::F32];
    let scales_view = if ct {
        int4_tensor(
            ckpt,
            &name("weight_scale"),
            &scale_types,
            &[rows, groups],
            "one scale per output feature and group",
        )?
    } else {
        int4_tensor(
            ckpt,
            &name("scales"),
            &scale_types,
            &[groups, rows],
            "one scale per group and output feature",
        )?
    };
    let scales_t = scales_view.to_f32_vec();
    if let Some((i, v)) = scales_t.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(bad_int4(
            &scales_view,
            format!("value {v} at index {i}: scales must be finite"),
        ));
    }
    // Zero points `[rows, groups]`.
    let (codes, zeros, g_idx) = match spec.format {
        Int4Format::Awq => {
            let q = int4_tensor(
                ckpt,
                &qweight,
                &[Dtype::I32],
                &[cols, rows / 8],
                "AutoAWQ GEMM",
            )?;
            let z = int4_tensor(
                ckpt,
                &name("qzeros"),
                &[Dtype::I32],
                &[groups, rows / 8],
                "AutoAWQ GEMM",
            )?;
            (
                int4::unpack_awq_transposed(&q.to_i32_vec(), cols, rows),
                int4::transpose(
                    &int4::unpack_awq_rows(&z.to_i32_vec(), groups, rows),
                    groups,
                    rows,
                ),
                None,
            )
        }
        Int4Format::Gptq { v1_zeros } => {
            let q = int4_tensor(ckpt, &qweight, &[Dtype::I32], &[cols / 8, rows], "GPTQ")?;
            let z = int4_tensor(
                ckpt,
                &name("qzeros"),
                &[Dtype::I32],
                &[groups, rows / 8],
                "GPTQ",
            )?;
            let mut zeros = int4::unpack_gptq_rows(&z.to_i32_vec(), groups, rows);
            if v1_zeros {
                zeros.iter_mut().for_each(|z| *z += 1);
            }
            let g_idx = spec
                .desc_act
                .then(|| g_idx(ckpt, &name("g_idx"), cols, groups))
                .transpose()?;
            (
                int4::unpack_gptq_transposed(&q.to_i32_vec(), cols, rows),
                int4::transpose(&zeros, groups, rows),
                g_idx,
            )
        }
        Int4Format::CompressedTensors => {
            let q = int4_tensor(
                ckpt,
                &qweight,
                &[Dtype::I32],
                &[rows, cols / 8],
                "compressed-tensors pack-quantized",
            )?;
            let zeros = if spec.sym {
                vec![8u8; rows * groups]
            } else {
                let z = int4_tensor(
                    ckpt,
                    &name("weight_zero_point"),
                    &[Dtype::I32],
                    &[rows / 8, groups],
                    "asymmetric pack-quantized: zero points packed along the output features",
                )?;
                int4::unpack_cols_in_order(&z.to_i32_vec(), rows, groups)
            };
            let g_idx = spec
                .desc_act
                .then(|| g_idx(ckpt, &name("weight_g_idx"), cols, groups))
                .transpose()?;
            (
                int4::unpack_rows_in_order(&q.to_i32_vec(), rows, cols),
                zeros,
                g_idx,
            )
        }
    };
    Ok(Int4Weight {
        rows,
        cols,
        group_size: gs,
        codes,
        scales: if ct {
            scales_t
        } else {
            int4::transpose(&scales_t, groups, rows)
        },
        zeros,
        g_idx,
        mins: None,
    })
}

/// An act-order layer's group of each of its `cols` input features (GPTQ's `g_idx`,
/// compressed-tensors' `weight_g_idx`): I32 `[cols]`, every entry in `0..groups`.
fn g_idx(
    ckpt: &Checkpoint,
    tensor: &str,
    cols: usize,
    groups: usize,
) -> Result<Vec<u32>, CheckpointError> {
    let g = int4_tensor(
        ckpt,
        tensor,
        &[Dtype::I32],
        &[cols],
        "act order: each input feature's group",
    )?;
    let values = g.to_i32_vec();
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(0..groups as i32).contains(v))
    {
        return Err(bad_int4(
            &g,
            format!("value {v} at index {i}: groups are 0..{groups}"),
        ));
    }
    Ok(values.into_iter().map(|v| v as u32).collect())
}

/// A GGUF checkpoint's linear `weight` (`….q_proj.weight`) as an [`Int4Weight`] when the file
/// stores it as `Q4_0` (`(q − 8) · d`: zero points 8) or `Q4_1` (`q · d + m`: zero points 0 and
/// offsets), groups of 32 along the input; `None` for any other type or checkpoint.
pub fn gguf_int4(ckpt: &Checkpoint, weight: &str) -> Result<Option<Int4Weight>, CheckpointError> {
    let Some(q) = ckpt.gguf_q4(weight)? else {
        return Ok(None);
    };
    let groups = q.scales.len();
    let zero = if q.mins.is_some() { 0 } else { 8 };
    Ok(Some(Int4Weight {
        rows: q.rows,
        cols: q.cols,
        group_size: gguf::quants::Q4_BLOCK,
        codes: q.codes,
        scales: q.scales,
        zeros: vec![zero; groups],
        g_idx: None,
        mins: q.mins,
    }))
}

/// Checks that no decoder linear weight is FP8: what a backend that reads only unquantized weights
/// calls before converting any.
pub fn check_unquantized(ckpt: &Checkpoint, config: &ModelConfig) -> Result<(), CheckpointError> {
    for i in 0..config.num_hidden_layers {
        for suffix in names::LINEAR_WEIGHTS {
            unquantized_dtype(&ckpt.tensor(&names::layer_tensor(i, suffix))?)?;
        }
    }
    Ok(())
}

fn unquantized_dtype(view: &TensorView<'_>) -> Result<(), CheckpointError> {
    if view.dtype == Dtype::I32 {
        return Err(CheckpointError::BadQuantization {
            path: view.file.to_path_buf(),
            tensor: view.name.to_owned(),
            reason: "stored as I32, but config.json's quantization_config does not declare this \
                     layer INT4"
                .into(),
        });
    }
    if view.dtype == Dtype::F8E4M3 {
        return Err(CheckpointError::BadQuantization {
            path: view.file.to_path_buf(),
            tensor: view.name.to_owned(),
            reason: "stored as F8_E4M3, but config.json's quantization_config does not declare \
                     this layer FP8"
                .into(),
        });
    }
    Ok(())
}

/// A weight that must not be FP8 (no scales to read it with).
fn unquantized(view: &TensorView<'_>) -> Result<Vec<f32>, CheckpointError> {
    unquantized_dtype(view)?;
    Ok(view.to_f32_vec())
}

/// An FP8 checkpoint's linear layer as stored: its E4M3 codes (borrowed from the memory map), one
/// scale per output row (a per-tensor scale repeated), and its input's quantization.
#[derive(Debug, Clone)]
pub struct StoredFp8<'a> {
    /// `rows × width` codes, row-major.
    pub codes: &'a [u8],
    pub rows: usize,
    pub width: usize,
    pub row_scales: Vec<f32>,
    pub input: InputQuant,
}

impl StoredFp8<'_> {
    /// `decode(code) · scale` for every weight, row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        fp8::dequantize_rows(self.codes, self.width, &self.row_scales)
    }
}

/// The stored FP8 layer `weight` of a checkpoint declaring `stored`; `None` when its module is
/// one the config leaves unquantized (`ignore`).
pub fn stored_fp8_layer<'a>(
    ckpt: &'a Checkpoint,
    weight: &str,
    stored: &Fp8Checkpoint,
) -> Result<Option<StoredFp8<'a>>, CheckpointError> {
    let module = module_of(weight);
    if stored.ignored.iter().any(|m| m == module) {
        return Ok(None);
    }
    let view = ckpt.tensor(weight)?;
    stored_fp8(ckpt, &view, module, stored).map(Some)
}

fn stored_fp8<'a>(
    ckpt: &'a Checkpoint,
    view: &TensorView<'a>,
    module: &str,
    stored: &Fp8Checkpoint,
) -> Result<StoredFp8<'a>, CheckpointError> {
    if view.dtype != Dtype::F8E4M3 {
        return Err(CheckpointError::BadQuantization {
            path: view.file.to_path_buf(),
            tensor: view.name.to_owned(),
            reason: format!(
                "stored as {:?}; config.json's quantization_config declares FP8 (F8_E4M3) linear \
                 layers (list unquantized modules in `ignore` / `modules_to_not_convert`)",
                view.dtype
            ),
        });
    }
    let rows = view.shape.first().copied().unwrap_or(0);
    let width = view.shape.get(1).copied().unwrap_or(1);
    let scale_name = format!("{module}.weight_scale");
    let (scales, granularity) = weight_scales(ckpt, &scale_name, rows)?;
    if let Some(want) = stored.weights
        && want != granularity
    {
        let scale = ckpt.tensor(&scale_name)?;
        return Err(bad_scale(
            &scale,
            format!(
                "shape {:?} is {granularity:?}-wise, but the config's strategy says {want:?}",
                scale.shape
            ),
        ));
    }
    let row_scales = if scales.len() == 1 {
        vec![scales[0]; rows]
    } else {
        scales
    };
    let input = match stored.activations {
        ActivationScheme::DynamicPerToken => InputQuant::DynamicPerToken,
        ActivationScheme::Static => {
            let name = format!("{module}.input_scale");
            let s = ckpt.tensor(&name)?;
            let values = checked_scales(&s)?;
            match values.as_slice() {
                [v] => InputQuant::Static(*v),
                _ => return Err(bad_scale(&s, "a static input scale is one value".into())),
            }
        }
    };
    Ok(StoredFp8 {
        codes: view.data,
        rows,
        width,
        row_scales,
        input,
    })
}

/// A weight's scales and whether they are per tensor or per output row.
fn weight_scales(
    ckpt: &Checkpoint,
    name: &str,
    rows: usize,
) -> Result<(Vec<f32>, ScaleGranularity), CheckpointError> {
    let s = ckpt.tensor(name)?;
    let values = checked_scales(&s)?;
    let granularity = match s.shape {
        [] | [1] | [1, 1] => ScaleGranularity::Tensor,
        [n] | [n, 1] if *n == rows => ScaleGranularity::Channel,
        other => {
            return Err(bad_scale(
                &s,
                format!(
                    "shape {other:?}: expected [] or [1] (per tensor), or [{rows}] or [{rows}, 1] (per output channel)"
                ),
            ));
        }
    };
    Ok((values, granularity))
}

/// A scale tensor's values, each finite and positive.
fn checked_scales(s: &TensorView<'_>) -> Result<Vec<f32>, CheckpointError> {
    if s.dtype == Dtype::F8E4M3 {
        return Err(bad_scale(s, "scales must be F32, BF16 or F16".into()));
    }
    let values = s.to_f32_vec();
    if values.is_empty() {
        return Err(bad_scale(s, "no values".into()));
    }
    if let Some((i, v)) = values
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v > 0.0))
    {
        return Err(bad_scale(
            s,
            format!("value {v} at index {i}: scales must be finite and positive"),
        ));
    }
    Ok(values)
}

fn bad_scale(s: &TensorView<'_>, reason: String) -> CheckpointError {
    CheckpointError::BadQuantization {
        path: s.file.to_path_buf(),
        tensor: s.name.to_owned(),
        reason,
    }
}

/// The input quantization of layers fused into one product (q/k/v, gate/up): the same for all
/// (else an error naming the first); static scales merge to their maximum, as vLLM does.
pub fn fused_input(
    ckpt: &Checkpoint,
    parts: &[(&str, Option<InputQuant>)],
) -> Result<Option<InputQuant>, CheckpointError> {
    let mut out = parts.first().and_then(|p| p.1);
    for (name, q) in parts {
        out = match (out, q) {
            (None, None) => None,
            (Some(InputQuant::DynamicPerToken), Some(InputQuant::DynamicPerToken)) => {
                Some(InputQuant::DynamicPerToken)
            }
            (Some(InputQuant::Static(a)), Some(InputQuant::Static(b))) => {
                Some(InputQuant::Static(a.max(*b)))
            }
            _ => {
                return Err(CheckpointError::BadQuantization {
                    path: ckpt.dir().join("config.json"),
                    tensor: (*name).to_owned(),
                    reason: "layers fused into one product (q/k/v or gate/up) must be quantized \
                             the same way"
                        .into(),
                });
            }
        };
    }
    Ok(out)
}
