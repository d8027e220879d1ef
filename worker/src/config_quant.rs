//! `quantization_config` of a `config.json` (included from `config.rs`): the FP8 layouts vLLM and
//! llm-compressor write, and AutoAWQ's and AutoGPTQ/GPTQModel's INT4 ones. Anything else quantized
//! is rejected with the field and value at fault.

use serde_json::Value;

use super::{ConfigError, Fields};
use crate::quant::{
    ActivationScheme, Fp8Checkpoint, Fp8Format, Int4Checkpoint, Int4Format, ScaleGranularity,
    StoredQuant,
};

/// The checkpoint's quantized layout, `None` when it declares no quantization.
pub(super) fn parse_quantization(f: &Fields<'_>) -> Result<Option<StoredQuant>, ConfigError> {
    if f.get("quantization_config").is_none() {
        return Ok(None);
    }
    let q = f.nested("quantization_config")?;
    let method = q
        .str_opt("quant_method")?
        .ok_or_else(|| q.missing("quant_method"))?;
    match method {
        "fp8" => parse_fp8(&q).map(|c| Some(StoredQuant::Fp8(c))),
        "compressed-tensors" => parse_compressed(&q).map(Some),
        "awq" => parse_awq(&q).map(|c| Some(StoredQuant::Int4(c))),
        "gptq" => parse_gptq(&q).map(|c| Some(StoredQuant::Int4(c))),
        other => Err(q.unsupported(
            "quant_method",
            other,
            "only fp8, compressed-tensors (float-quantized), awq and gptq checkpoints load",
        )),
    }
}

/// `bits: 4` (AWQ also calls it `w_bit`).
fn check_bits(q: &Fields<'_>, name: &str) -> Result<(), ConfigError> {
    match q.usize_opt(name)? {
        Some(4) => Ok(()),
        Some(n) => Err(q.unsupported(name, &n.to_string(), "only 4-bit weights are implemented")),
        None => Err(q.missing(name)),
    }
}

/// `group_size` (AWQ: `q_group_size`): 32, 64 or 128 (or any multiple of 32), or -1 for one group.
fn group_size(q: &Fields<'_>, name: &str) -> Result<Option<usize>, ConfigError> {
    let v = q.get(name).ok_or_else(|| q.missing(name))?;
    match v.as_i64() {
        Some(-1) => Ok(None),
        Some(g) if g >= 32 && g % 32 == 0 => Ok(Some(g as usize)),
        _ => Err(q.unsupported(
            name,
            &v.to_string(),
            "expected -1 or a positive multiple of 32 (32, 64, 128)",
        )),
    }
}

/// AutoAWQ's `quant_method: "awq"` (`version: "gemm"`, `zero_point: true`).
fn parse_awq(q: &Fields<'_>) -> Result<Int4Checkpoint, ConfigError> {
    check_bits(
        q,
        if q.get("bits").is_some() {
            "bits"
        } else {
            "w_bit"
        },
    )?;
    let group = group_size(
        q,
        if q.get("group_size").is_some() {
            "group_size"
        } else {
            "q_group_size"
        },
    )?;
    if group.is_none() {
        return Err(q.unsupported("group_size", "-1", "AWQ checkpoints have groups of 32–128"));
    }
    match q.str_opt("version")?.unwrap_or("gemm") {
        "gemm" | "GEMM" => {}
        other => {
            return Err(q.unsupported(
                "version",
                other,
                "only AutoAWQ's GEMM layout is implemented (gemv and marlin pack differently)",
            ));
        }
    }
    if q.bool_opt("zero_point")? == Some(false) {
        return Err(q.unsupported(
            "zero_point",
            "false",
            "AWQ GEMM checkpoints store zero points",
        ));
    }
    Ok(Int4Checkpoint {
        format: Int4Format::Awq,
        group_size: group,
        desc_act: false,
        sym: false,
        ignored: strings(q, "modules_to_not_convert")?,
    })
}

/// AutoGPTQ's / GPTQModel's `quant_method: "gptq"`.
fn parse_gptq(q: &Fields<'_>) -> Result<Int4Checkpoint, ConfigError> {
    check_bits(q, "bits")?;
    let group = group_size(q, "group_size")?;
    let v1_zeros = match q.str_opt("checkpoint_format")?.unwrap_or("gptq") {
        "gptq" => true,
        "gptq_v2" => false,
        other => {
            return Err(q.unsupported(
                "checkpoint_format",
                other,
                "expected gptq (zero points stored minus one) or gptq_v2",
            ));
        }
    };
    if q.bool_opt("lm_head")? == Some(true) {
        return Err(q.unsupported("lm_head", "true", "a quantized LM head is not implemented"));
    }
    Ok(Int4Checkpoint {
        format: Int4Format::Gptq { v1_zeros },
        group_size: group,
        desc_act: q.bool_opt("desc_act")?.unwrap_or(false),
        sym: q.bool_opt("sym")?.unwrap_or(true),
        ignored: strings(q, "modules_to_not_convert")?,
    })
}

/// vLLM's / AutoFP8's `quant_method: "fp8"`.
fn parse_fp8(q: &Fields<'_>) -> Result<Fp8Checkpoint, ConfigError> {
    if q.get("weight_block_size").is_some() {
        return Err(q.unsupported(
            "weight_block_size",
            &q.get("weight_block_size")
                .map_or(String::new(), Value::to_string),
            "block-wise FP8 scales are not implemented; per-tensor and per-channel are",
        ));
    }
    let activations = match q.str_opt("activation_scheme")?.unwrap_or("dynamic") {
        "dynamic" => ActivationScheme::DynamicPerToken,
        "static" => ActivationScheme::Static,
        other => {
            return Err(q.unsupported("activation_scheme", other, "expected dynamic or static"));
        }
    };
    let mut ignored = strings(q, "modules_to_not_convert")?;
    ignored.extend(strings(q, "ignored_layers")?);
    Ok(Fp8Checkpoint {
        format: Fp8Format::Fp8,
        weights: None,
        activations,
        ignored,
    })
}

/// llm-compressor's `compressed-tensors` with one config group targeting `Linear`:
/// `float-quantized` (FP8) or `pack-quantized` (INT4 weights, W4A16).
fn parse_compressed(q: &Fields<'_>) -> Result<StoredQuant, ConfigError> {
    let format = q.str_opt("format")?.ok_or_else(|| q.missing("format"))?;
    let g = single_group(q)?;
    match format {
        "float-quantized" => parse_compressed_fp8(q, &g).map(StoredQuant::Fp8),
        "pack-quantized" => parse_pack_quantized(q, &g).map(StoredQuant::Int4),
        other => Err(q.unsupported(
            "format",
            other,
            "only float-quantized (FP8) and pack-quantized (INT4) compressed-tensors checkpoints load",
        )),
    }
}

/// `pack-quantized` W4A16: 4-bit integer weights in groups (or one per output channel), bf16
/// activations.
fn parse_pack_quantized(q: &Fields<'_>, g: &Fields<'_>) -> Result<Int4Checkpoint, ConfigError> {
    let w = g.nested("weights")?;
    match w.usize_opt("num_bits")? {
        Some(4) => {}
        Some(n) => return Err(w.unsupported("num_bits", &n.to_string(), "only 4-bit weights")),
        None => return Err(w.missing("num_bits")),
    }
    match w.str_opt("type")? {
        Some("int") => {}
        Some(t) => return Err(w.unsupported("type", t, "pack-quantized weights are integers")),
        None => return Err(w.missing("type")),
    }
    let group_size = match w
        .str_opt("strategy")?
        .ok_or_else(|| w.missing("strategy"))?
    {
        "group" => group_size(&w, "group_size")?,
        "channel" => None,
        other => {
            return Err(w.unsupported("strategy", other, "expected group or channel"));
        }
    };
    // compressed-tensors' activation orders: `group` (alias `dynamic`) saves the columns in their
    // original order with `weight_g_idx` naming each one's group, as GPTQ's `desc_act`; `weight`
    // (alias `static`) changes only the calibration, not the layout.
    let desc_act = match w.get("actorder").filter(|v| !v.is_null()) {
        None => false,
        Some(order) => match order.as_str() {
            Some("group" | "dynamic") => true,
            Some("weight" | "static") => false,
            _ => {
                return Err(w.unsupported(
                    "actorder",
                    &order.to_string(),
                    "expected null, group (dynamic) or weight (static)",
                ));
            }
        },
    };
    if w.bool_opt("dynamic")?.unwrap_or(false) {
        return Err(w.unsupported("dynamic", "true", "weights must have stored scales"));
    }
    if let Some(a) = g.get("input_activations").filter(|v| !v.is_null()) {
        return Err(g.unsupported(
            "input_activations",
            &a.to_string(),
            "INT4 weights with quantized activations (W4A8) are not implemented",
        ));
    }
    Ok(Int4Checkpoint {
        format: Int4Format::CompressedTensors,
        group_size,
        desc_act,
        sym: w.bool_opt("symmetric")?.unwrap_or(true),
        ignored: strings(q, "ignore")?,
    })
}

/// The one entry of `config_groups`, checked to target `Linear`.
fn single_group<'a>(q: &Fields<'a>) -> Result<Fields<'a>, ConfigError> {
    let groups = q.nested("config_groups")?;
    let names: Vec<&String> = groups.obj.keys().collect();
    let [name] = names.as_slice() else {
        return Err(q.unsupported(
            "config_groups",
            &format!("{} groups", names.len()),
            "exactly one quantization group (targets [\"Linear\"]) is supported",
        ));
    };
    let g = groups.nested(name)?;
    let targets = strings(&g, "targets")?;
    if !targets.iter().any(|t| t == "Linear") {
        return Err(g.unsupported(
            "targets",
            &targets.join(","),
            "the group must target Linear",
        ));
    }
    Ok(g)
}

/// `float-quantized`: FP8 weights and activations.
fn parse_compressed_fp8(q: &Fields<'_>, g: &Fields<'_>) -> Result<Fp8Checkpoint, ConfigError> {
    let w = g.nested("weights")?;
    check_fp8_args(&w)?;
    let weights = match w
        .str_opt("strategy")?
        .ok_or_else(|| w.missing("strategy"))?
    {
        "channel" => ScaleGranularity::Channel,
        "tensor" => ScaleGranularity::Tensor,
        other => {
            return Err(w.unsupported("strategy", other, "expected channel or tensor weights"));
        }
    };
    if w.bool_opt("dynamic")?.unwrap_or(false) {
        return Err(w.unsupported("dynamic", "true", "weights must have stored scales"));
    }
    if g.get("input_activations").is_none() {
        return Err(g.unsupported(
            "input_activations",
            "null",
            "FP8 weight-only checkpoints (bf16 activations) are not implemented",
        ));
    }
    let a = g.nested("input_activations")?;
    check_fp8_args(&a)?;
    let strategy = a
        .str_opt("strategy")?
        .ok_or_else(|| a.missing("strategy"))?;
    let dynamic = a.bool_opt("dynamic")?.unwrap_or(false);
    let activations = match (strategy, dynamic) {
        ("token", true) => ActivationScheme::DynamicPerToken,
        ("tensor", false) => ActivationScheme::Static,
        (s, d) => {
            return Err(a.unsupported(
                "strategy",
                &format!("{s} (dynamic: {d})"),
                "activations must be token with dynamic: true, or tensor with dynamic: false",
            ));
        }
    };
    if let Some(out) = g.get("output_activations") {
        return Err(g.unsupported(
            "output_activations",
            &out.to_string(),
            "output quantization is not implemented",
        ));
    }
    Ok(Fp8Checkpoint {
        format: Fp8Format::CompressedTensors,
        weights: Some(weights),
        activations,
        ignored: strings(q, "ignore")?,
    })
}

/// `num_bits: 8`, `type: "float"`, symmetric.
fn check_fp8_args(a: &Fields<'_>) -> Result<(), ConfigError> {
    match a.usize_opt("num_bits")? {
        Some(8) => {}
        Some(n) => return Err(a.unsupported("num_bits", &n.to_string(), "only 8-bit float")),
        None => return Err(a.missing("num_bits")),
    }
    match a.str_opt("type")? {
        Some("float") => {}
        Some(t) => return Err(a.unsupported("type", t, "only float (FP8 E4M3)")),
        None => return Err(a.missing("type")),
    }
    if a.bool_opt("symmetric")? == Some(false) {
        return Err(a.unsupported("symmetric", "false", "FP8 scales are symmetric"));
    }
    Ok(())
}

/// An optional list of strings.
fn strings(f: &Fields<'_>, name: &str) -> Result<Vec<String>, ConfigError> {
    match f.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| f.invalid(name, "expected a list of strings"))
            })
            .collect(),
        Some(_) => Err(f.invalid(name, "expected a list of strings")),
    }
}
