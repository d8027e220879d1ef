//! Quantized linear layers: what `--quantization` asks for, what a checkpoint's
//! `quantization_config` declares, and the one scheme a backend runs with.
//!
//! Only FP8 exists so far ([`fp8`]): every decoder linear (q/k/v, o, gate/up, down) with E4M3
//! weights and one scale per output channel (or per tensor, as a checkpoint stores it), and E4M3
//! activations with one scale per token computed on the fly (or one static scale per tensor from the
//! checkpoint). Embeddings, norms and the LM head stay in the checkpoint's precision, as vLLM keeps
//! them.

pub mod fp8;
pub mod load;

use std::fmt;
use std::str::FromStr;

/// What `--quantization` asks for (vLLM's names and meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// FP8 E4M3: a bf16/f16 checkpoint is quantized while it loads; an FP8 checkpoint loads as is.
    Fp8,
}

impl fmt::Display for Quantization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fp8 => "fp8",
        })
    }
}

/// A `--quantization` value this engine does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quantization `{0}` (supported: fp8)")]
pub struct ParseQuantizationError(pub String);

impl FromStr for Quantization {
    type Err = ParseQuantizationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp8" => Ok(Self::Fp8),
            _ => Err(ParseQuantizationError(s.to_owned())),
        }
    }
}

/// Which tool's layout an FP8 checkpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Format {
    /// `quant_method: "fp8"` (vLLM's and AutoFP8's serialisation): `weight_scale`, optional
    /// `input_scale`, both per tensor or per channel as their shapes say.
    Fp8,
    /// `quant_method: "compressed-tensors"`, `format: "float-quantized"` (llm-compressor's FP8 and
    /// FP8_DYNAMIC schemes).
    CompressedTensors,
}

/// How many weight scales a linear layer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleGranularity {
    /// One for the whole matrix.
    Tensor,
    /// One per output channel (row of the HF `[out, in]` matrix).
    Channel,
}

/// How activations are quantized before an FP8 product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationScheme {
    /// One scale per token, from the token's largest magnitude, computed on the fly.
    DynamicPerToken,
    /// One fixed scale per linear layer: the checkpoint's `input_scale`.
    Static,
}

/// The FP8 layout a checkpoint's `config.json` declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fp8Checkpoint {
    pub format: Fp8Format,
    /// `None` where the format lets the scale tensors' shapes say (`quant_method: "fp8"`).
    pub weights: Option<ScaleGranularity>,
    pub activations: ActivationScheme,
    /// Modules left unquantized (`ignore` / `modules_to_not_convert`), e.g. `lm_head`.
    pub ignored: Vec<String>,
}

/// The scheme a backend runs its decoder linears with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LinearQuant {
    /// The checkpoint's precision (bf16/f16/f32).
    #[default]
    None,
    /// FP8 weights and activations.
    Fp8 {
        /// The checkpoint's FP8 layout; `None`: a bf16/f16/f32 checkpoint quantized while it loads
        /// (per-channel weight scales, per-token dynamic activations).
        stored: Option<Fp8Checkpoint>,
    },
}

impl LinearQuant {
    /// The scheme for a checkpoint declaring `stored` when `requested` was asked for. An FP8
    /// checkpoint runs FP8 whether or not `--quantization fp8` was given.
    pub fn resolve(requested: Option<Quantization>, stored: Option<&Fp8Checkpoint>) -> Self {
        match (requested, stored) {
            (_, Some(stored)) => Self::Fp8 {
                stored: Some(stored.clone()),
            },
            (Some(Quantization::Fp8), None) => Self::Fp8 { stored: None },
            (None, None) => Self::None,
        }
    }

    /// How activations are quantized (`None` when they are not).
    pub fn activations(&self) -> Option<ActivationScheme> {
        match self {
            Self::None => None,
            Self::Fp8 { stored: None } => Some(ActivationScheme::DynamicPerToken),
            Self::Fp8 { stored: Some(s) } => Some(s.activations),
        }
    }

    /// What the scheme is, for logs and errors (`none`, or `fp8 (...)` with where its scales come from).
    pub fn describe(&self) -> String {
        match self {
            Self::None => "none".into(),
            Self::Fp8 { stored: None } => {
                "fp8 (quantized at load: channel weight scales, dynamic per-token activations)"
                    .into()
            }
            Self::Fp8 { stored: Some(s) } => format!(
                "fp8 ({} checkpoint, {} weight scales, {} activations)",
                match s.format {
                    Fp8Format::Fp8 => "fp8",
                    Fp8Format::CompressedTensors => "compressed-tensors",
                },
                match s.weights {
                    Some(ScaleGranularity::Tensor) => "tensor",
                    Some(ScaleGranularity::Channel) => "channel",
                    None => "stored",
                },
                match s.activations {
                    ActivationScheme::DynamicPerToken => "dynamic per-token",
                    ActivationScheme::Static => "static",
                }
            ),
        }
    }
}
