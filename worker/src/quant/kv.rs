//! The KV cache's element type (`--kv-cache-dtype`, vLLM's name and meaning) and, for an FP8
//! cache, its per-layer scales.
//!
//! An FP8 cache stores each K (V) value as the E4M3 code of `x / k_scale` (`x / v_scale`), nearest
//! even, saturated at ±448 ([`fp8::quantize`]), and reads it back as `code · scale`. The scales
//! are one per layer: the checkpoint's `self_attn.k_scale` / `self_attn.v_scale` (or the older
//! `self_attn.kv_scale` for both) where it has them, else 1.0, as vLLM does.

use std::fmt;
use std::str::FromStr;

use crate::checkpoint::{Checkpoint, CheckpointError, TensorView};
use crate::quant::fp8;

/// What the paged KV cache holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The compute type (`auto`).
    #[default]
    Auto,
    /// E4M3 codes with per-layer scales (`fp8`, `fp8_e4m3`).
    Fp8E4m3,
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Fp8E4m3 => "fp8",
        })
    }
}

/// A `--kv-cache-dtype` value this engine does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown --kv-cache-dtype `{0}` (supported: auto, fp8, fp8_e4m3{hint})", hint = if .0 == "fp8_e5m2" { "; E5M2 is not implemented" } else { "" })]
pub struct ParseKvCacheDtypeError(pub String);

impl FromStr for KvCacheDtype {
    type Err = ParseKvCacheDtypeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "fp8" | "fp8_e4m3" => Ok(Self::Fp8E4m3),
            _ => Err(ParseKvCacheDtypeError(s.to_owned())),
        }
    }
}

/// An FP8 cache's scales: `k[l]`, `v[l]` for layer `l`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvScales {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Whether they came from the checkpoint (else all 1.0).
    pub from_checkpoint: bool,
}

impl KvScales {
    /// The checkpoint's per-layer scales for `layers` layers: `model.layers.N.self_attn.k_scale`
    /// and `.v_scale`, or `.kv_scale` for both; 1.0 for every layer when no layer has any. A
    /// checkpoint with scales for some layers only, a scale that is not one finite positive
    /// number, or a tensor of another shape is an error naming the tensor.
    pub fn load(ckpt: &Checkpoint, layers: usize) -> Result<Self, CheckpointError> {
        let name = |l: usize, s: &str| format!("model.layers.{l}.self_attn.{s}");
        let any = (0..layers).any(|l| {
            ["k_scale", "v_scale", "kv_scale"]
                .iter()
                .any(|s| ckpt.contains(&name(l, s)))
        });
        if !any {
            return Ok(Self {
                k: vec![1.0; layers],
                v: vec![1.0; layers],
                from_checkpoint: false,
            });
        }
        let (mut k, mut v) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
        for l in 0..layers {
            let one = |s: &str| -> Result<Option<f32>, CheckpointError> {
                let n = name(l, s);
                if !ckpt.contains(&n) {
                    return Ok(None);
                }
                scalar(&ckpt.tensor(&n)?).map(Some)
            };
            let kv = one("kv_scale")?;
            let (ks, vs) = (one("k_scale")?.or(kv), one("v_scale")?.or(kv));
            match (ks, vs) {
                (Some(a), Some(b)) => {
                    k.push(a);
                    v.push(b);
                }
                _ => {
                    let missing = if ks.is_none() { "k_scale" } else { "v_scale" };
                    return Err(CheckpointError::BadQuantization {
                        path: ckpt.dir().to_path_buf(),
                        tensor: name(l, missing),
                        reason: "missing, while other layers carry KV cache scales".into(),
                    });
                }
            }
        }
        Ok(Self {
            k,
            v,
            from_checkpoint: true,
        })
    }
}

impl KvCacheDtype {
    /// The scales a backend's cache of this type needs for `layers` layers: `None` for `auto`,
    /// else [`KvScales::load`]'s (and a log line saying where they came from).
    pub fn scales(
        self,
        ckpt: &Checkpoint,
        layers: usize,
    ) -> Result<Option<KvScales>, CheckpointError> {
        match self {
            Self::Auto => Ok(None),
            Self::Fp8E4m3 => {
                let s = KvScales::load(ckpt, layers)?;
                let from = if s.from_checkpoint {
                    "the checkpoint"
                } else {
                    "1.0 (none in the checkpoint)"
                };
                tracing::info!(scales = from, "KV cache in FP8 (E4M3)");
                Ok(Some(s))
            }
        }
    }
}

/// One positive finite scale (a tensor of shape `[]` or `[1]`).
fn scalar(view: &TensorView<'_>) -> Result<f32, CheckpointError> {
    let bad = |reason: String| CheckpointError::BadQuantization {
        path: view.file.to_path_buf(),
        tensor: view.name.to_owned(),
        reason,
    };
    if view.numel() != 1 || view.shape.len() > 1 {
        return Err(bad(format!(
            "shape {:?}: a KV cache scale is one number per layer",
            view.shape
        )));
    }
    let s = view.to_f32_vec()[0];
    if !(s.is_finite() && s > 0.0) {
        return Err(bad(format!(
            "{s}: a KV cache scale must be finite and positive"
        )));
    }
    Ok(s)
}

/// `x` as an FP8 cache stores and reads it back: `e4m3(x / scale) · scale`.
pub fn round_trip(x: f32, scale: f32) -> f32 {
    fp8::e4m3_to_f32(fp8::quantize(x, scale)) * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_as_vllm_spells_them() {
        assert_eq!("auto".parse(), Ok(KvCacheDtype::Auto));
        assert_eq!("fp8".parse(), Ok(KvCacheDtype::Fp8E4m3));
        assert_eq!("fp8_e4m3".parse(), Ok(KvCacheDtype::Fp8E4m3));
        let e = "fp8_e5m2".parse::<KvCacheDtype>().unwrap_err().to_string();
        assert!(e.contains("E5M2 is not implemented"), "{e}");
        assert!("int8".parse::<KvCacheDtype>().is_err());
    }

    #[test]
    fn the_round_trip_is_the_nearest_code_times_the_scale() {
        // 0.3 / 0.5 = 0.6 lies between codes 0.5625 and 0.625 (step 1/16 in [0.5, 1)): nearest 0.625.
        assert_eq!(round_trip(0.3, 0.5), 0.625 * 0.5);
        // Saturation: 1000 / 1 → 448.
        assert_eq!(round_trip(1000.0, 1.0), 448.0);
        assert_eq!(round_trip(-1000.0, 2.0), -896.0);
        // Exact codes come back exactly.
        assert_eq!(round_trip(1.5, 1.0), 1.5);
        assert_eq!(round_trip(0.0, 3.0), 0.0);
    }
}
