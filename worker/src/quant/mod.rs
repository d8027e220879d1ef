//! Quantized linear layers: what `--quantization` asks for, what a checkpoint's
//! `quantization_config` declares, and the one scheme a backend runs with.
//!
//! Two schemes exist, each covering every decoder linear (q/k/v, o, gate/up, down):
//! - FP8 ([`fp8`]): E4M3 weights with one scale per output channel (or per tensor, as a checkpoint
//!   stores it), and E4M3 activations with one scale per token computed on the fly (or one static
//!   scale per tensor from the checkpoint);
//! - INT4 ([`int4`]): AWQ, GPTQ and compressed-tensors checkpoints' 4-bit weights with a scale and zero point per group
//!   of input columns, bf16 activations.
//!
//! Embeddings, norms and the LM head stay in the checkpoint's precision, as vLLM keeps them.

pub mod fp8;
pub mod int4;
pub mod kv;
pub mod load;

pub use int4::{Int4Checkpoint, Int4Format};

use std::fmt;
use std::str::FromStr;

/// What `--quantization` asks for (vLLM's names and meaning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    /// FP8 E4M3: a bf16/f16 checkpoint is quantized while it loads; an FP8 checkpoint loads as is.
    Fp8,
    /// An AWQ checkpoint (`awq`, or vLLM's kernel-named alias `awq_marlin`).
    Awq,
    /// A GPTQ checkpoint (`gptq`, or `gptq_marlin`).
    Gptq,
}

impl fmt::Display for Quantization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fp8 => "fp8",
            Self::Awq => "awq",
            Self::Gptq => "gptq",
        })
    }
}

/// A `--quantization` value this engine does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown quantization `{0}` (supported: fp8, awq, awq_marlin, gptq, gptq_marlin)")]
pub struct ParseQuantizationError(pub String);

impl FromStr for Quantization {
    type Err = ParseQuantizationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fp8" => Ok(Self::Fp8),
            "awq" | "awq_marlin" => Ok(Self::Awq),
            "gptq" | "gptq_marlin" => Ok(Self::Gptq),
            _ => Err(ParseQuantizationError(s.to_owned())),
        }
    }
}

/// What a checkpoint's `quantization_config` declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredQuant {
    Fp8(Fp8Checkpoint),
    Int4(Int4Checkpoint),
}

impl StoredQuant {
    /// The `--quantization` name this checkpoint answers to.
    pub fn method(&self) -> &'static str {
        match self {
            Self::Fp8(_) => "fp8",
            Self::Int4(c) => c.method(),
        }
    }
}

/// `--quantization` asked for something the checkpoint is not (vLLM refuses the same way).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantizationMismatch {
    #[error(
        "--quantization {requested} needs a checkpoint whose config.json declares \
         quantization_config.quant_method \"{requested}\"; this one is not quantized"
    )]
    NotQuantized { requested: Quantization },
    #[error(
        "--quantization {requested} does not match the checkpoint's quantization_config \
         (quant_method \"{stored}\"); leave the flag out: a checkpoint runs its own scheme"
    )]
    Different {
        requested: Quantization,
        stored: &'static str,
    },
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
    /// A checkpoint's INT4 weights (AWQ, GPTQ, compressed-tensors), activations as they are.
    Int4(Int4Checkpoint),
}

impl LinearQuant {
    /// The scheme for a checkpoint declaring `stored` when `requested` was asked for. A quantized
    /// checkpoint runs its own scheme whether or not `--quantization` names it; naming another is
    /// an error, as is naming AWQ or GPTQ for an unquantized checkpoint.
    pub fn resolve(
        requested: Option<Quantization>,
        stored: Option<&StoredQuant>,
    ) -> Result<Self, QuantizationMismatch> {
        if let (Some(requested), Some(stored)) = (requested, stored)
            && requested.to_string() != stored.method()
        {
            return Err(QuantizationMismatch::Different {
                requested,
                stored: stored.method(),
            });
        }
        match (requested, stored) {
            (_, Some(StoredQuant::Fp8(stored))) => Ok(Self::Fp8 {
                stored: Some(stored.clone()),
            }),
            (_, Some(StoredQuant::Int4(stored))) => Ok(Self::Int4(stored.clone())),
            (Some(Quantization::Fp8), None) => Ok(Self::Fp8 { stored: None }),
            (Some(requested), None) => Err(QuantizationMismatch::NotQuantized { requested }),
            (None, None) => Ok(Self::None),
        }
    }

    /// The INT4 layout, when the scheme is INT4.
    pub fn int4(&self) -> Option<&Int4Checkpoint> {
        match self {
            Self::Int4(c) => Some(c),
            _ => None,
        }
    }

    /// How activations are quantized (`None` when they are not).
    pub fn activations(&self) -> Option<ActivationScheme> {
        match self {
            Self::None | Self::Int4(_) => None,
            Self::Fp8 { stored: None } => Some(ActivationScheme::DynamicPerToken),
            Self::Fp8 { stored: Some(s) } => Some(s.activations),
        }
    }

    /// What the scheme is, for logs and errors (`none`, or `fp8 (...)` with where its scales come from).
    pub fn describe(&self) -> String {
        match self {
            Self::None => "none".into(),
            Self::Int4(c) => format!(
                "{} int4 ({}, {}{})",
                c.method(),
                match c.group_size {
                    Some(g) => format!("groups of {g}"),
                    None => "one group per row".into(),
                },
                if c.sym { "symmetric" } else { "zero points" },
                if c.desc_act {
                    ", act order (g_idx)"
                } else {
                    ""
                }
            ),
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
