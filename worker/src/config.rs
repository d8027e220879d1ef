//! The model's shape, as parsed from a HuggingFace `config.json` (+ `generation_config.json`).
//!
//! Both ways transformers writes RoPE settings are read: top-level `rope_theta` / `rope_scaling`
//! (checkpoints saved before transformers 5, most of the Hub) and transformers-5 `rope_parameters`.
//! Everything this engine cannot run exactly is rejected with an error naming the field and value.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use thiserror::Error;

use crate::quant::StoredQuant;

#[path = "config_quant.rs"]
mod quant;

/// Why a `config.json` (or `generation_config.json`) cannot describe a model this engine runs.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A required field is absent (or null).
    #[error("{path}: missing field `{field}`")]
    MissingField { path: PathBuf, field: String },
    /// A field has the wrong type or an impossible value.
    #[error("{path}: field `{field}` = {value}: {reason}")]
    InvalidField {
        path: PathBuf,
        field: String,
        value: String,
        reason: String,
    },
    /// A field names something this engine does not implement (architecture, RoPE type, activation...).
    #[error("{path}: `{field}` = {value} is not supported yet ({reason})")]
    Unsupported {
        path: PathBuf,
        field: String,
        value: String,
        reason: String,
    },
    /// Fields that are each valid but do not fit together.
    #[error("{path}: inconsistent config: {reason}")]
    InconsistentConfig { path: PathBuf, reason: String },
    /// A GGUF file's header or metadata cannot describe a model.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

/// Which HuggingFace architecture a checkpoint declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `LlamaForCausalLM`: Llama 2, 3, 3.1, 3.2.
    Llama,
    /// `MistralForCausalLM` without a sliding window.
    Mistral,
    /// `Qwen2ForCausalLM`: Llama with biases on q, k and v.
    Qwen2,
}

impl Architecture {
    /// The HuggingFace class name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
        }
    }
}

/// How rotary position embeddings turn positions into angles.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/d)`.
    Default,
    /// Positions divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// Rotary embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base `theta` of the frequencies.
    pub theta: f32,
    /// Scaling applied on top of the base frequencies.
    pub scaling: RopeScaling,
    /// Per-frequency divisors applied after the scaling (`head_dim / 2` of them, finite and
    /// positive): a GGUF file's `rope_freqs.weight`, as llama.cpp applies it (Llama 3.1 files carry
    /// their frequency-dependent scaling this way). Read from the `rope_freq_factors` key.
    pub freq_factors: Option<Vec<f32>>,
}

impl RopeConfig {
    /// The `head_dim / 2` inverse frequencies, computed in f32 the way transformers does
    /// (`1 / theta^(2i/d)`, then the scaling). The angle of pair `i` at position `p` is
    /// `p as f32 * inv_freq[i]`; HF rotates pair `(x[i], x[i + d/2])` by it (`rotate_half`).
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let half = head_dim / 2;
        let base: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / head_dim as f32;
                let pow = (f64::from(self.theta)).powf(f64::from(exponent)) as f32;
                1.0 / pow
            })
            .collect();
        let scaled = match self.scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old_ctx = original_max_position_embeddings as f32;
                let low_freq_wavelen = old_ctx / low_freq_factor;
                let high_freq_wavelen = old_ctx / high_freq_factor;
                base.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_freq_wavelen {
                            f
                        } else if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            let smooth = (old_ctx / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        };
        match &self.freq_factors {
            None => scaled,
            Some(factors) => scaled.iter().zip(factors).map(|(f, d)| f / d).collect(),
        }
    }
}

/// Everything about a model's shape the backends need; validated, so every field is consistent.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: RopeConfig,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2, or Llama with `attention_bias`).
    pub qkv_bias: bool,
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids (config and `generation_config.json` may list several).
    pub eos_token_ids: Vec<u32>,
    /// The quantized layout `quantization_config` declares; `None` for an unquantized checkpoint.
    pub quantization: Option<StoredQuant>,
}

impl ModelConfig {
    /// Reads `dir/config.json` and, when present, `dir/generation_config.json`; or, when `dir` is a
    /// `.gguf` file, the config its metadata describes.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        if gguf::is_gguf_path(dir) {
            let file = gguf::GgufFile::open(dir)?;
            return Self::from_json(dir, &file.hf_config()?, None);
        }
        let path = dir.join("config.json");
        let config = read_json(&path)?;
        let gen_path = dir.join("generation_config.json");
        let generation = if gen_path.exists() {
            Some(read_json(&gen_path)?)
        } else {
            None
        };
        Self::from_json(
            &path,
            &config,
            generation.as_ref().map(|g| (gen_path.as_path(), g)),
        )
    }

    /// Parses already-read JSON; `path` (and the generation config's path) only label errors.
    pub fn from_json(
        path: &Path,
        config: &Value,
        generation: Option<(&Path, &Value)>,
    ) -> Result<Self, ConfigError> {
        let f = Fields::root(path, config)?;
        let architecture = parse_architecture(&f)?;
        check_supported_features(&f, architecture)?;
        let quantization = quant::parse_quantization(&f)?;

        let vocab_size = f.usize_req("vocab_size")?;
        let hidden_size = f.usize_req("hidden_size")?;
        let intermediate_size = f.usize_req("intermediate_size")?;
        let num_hidden_layers = f.usize_req("num_hidden_layers")?;
        let num_attention_heads = f.usize_req("num_attention_heads")?;
        let num_key_value_heads = f
            .usize_opt("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        let inconsistent = |reason: String| ConfigError::InconsistentConfig {
            path: path.to_path_buf(),
            reason,
        };
        for (name, v) in [
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("intermediate_size", intermediate_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("num_key_value_heads", num_key_value_heads),
        ] {
            if v == 0 {
                return Err(inconsistent(format!("`{name}` is 0")));
            }
        }
        let head_dim = match f.usize_opt("head_dim")? {
            Some(d) => d,
            None => {
                if hidden_size % num_attention_heads != 0 {
                    return Err(inconsistent(format!(
                        "hidden_size {hidden_size} is not divisible by num_attention_heads \
                         {num_attention_heads} (and no head_dim is given)"
                    )));
                }
                hidden_size / num_attention_heads
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(inconsistent(format!(
                "head_dim {head_dim} must be a positive even number (RoPE rotates pairs)"
            )));
        }
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(inconsistent(format!(
                "num_attention_heads {num_attention_heads} is not divisible by \
                 num_key_value_heads {num_key_value_heads}"
            )));
        }
        let rms_norm_eps = f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6) as f32;
        if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
            return Err(f.invalid("rms_norm_eps", "must be a positive number"));
        }
        let default_max_pos = match architecture {
            Architecture::Llama => 2048,
            Architecture::Mistral => 32768,
            Architecture::Qwen2 => 32768,
        };
        let max_position_embeddings = f
            .usize_opt("max_position_embeddings")?
            .unwrap_or(default_max_pos);
        let rope = parse_rope(&f, head_dim)?;
        let tie_word_embeddings = f.bool_opt("tie_word_embeddings")?.unwrap_or(false);
        let qkv_bias = match architecture {
            Architecture::Qwen2 => true,
            Architecture::Llama | Architecture::Mistral => {
                f.bool_opt("attention_bias")?.unwrap_or(false)
            }
        };

        let mut bos_token_id = token_id_opt(&f, "bos_token_id")?;
        let mut eos_token_ids = Vec::new();
        if let Some((gen_path, gen_value)) = generation {
            let g = Fields::root(gen_path, gen_value)?;
            if let Some(bos) = token_id_opt(&g, "bos_token_id")? {
                bos_token_id = Some(bos);
            }
            eos_token_ids = token_ids(&g, "eos_token_id")?;
        }
        for id in token_ids(&f, "eos_token_id")? {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        Ok(Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope,
            max_position_embeddings,
            tie_word_embeddings,
            qkv_bias,
            bos_token_id,
            eos_token_ids,
            quantization,
        })
    }

    /// Width of all query heads together (`num_attention_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Width of all key (or value) heads together (`num_key_value_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }
}

/// Reads and parses one JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ConfigError::Json {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_architecture(f: &Fields<'_>) -> Result<Architecture, ConfigError> {
    let name = match f.get("architectures") {
        Some(Value::Array(list)) => match list.first() {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(f.invalid("architectures", "expected a list of class names")),
        },
        Some(_) => return Err(f.invalid("architectures", "expected a list of class names")),
        None => match f.str_opt("model_type")? {
            Some("llama") => "LlamaForCausalLM".to_owned(),
            Some("mistral") => "MistralForCausalLM".to_owned(),
            Some("qwen2") => "Qwen2ForCausalLM".to_owned(),
            Some(other) => other.to_owned(),
            None => return Err(f.missing("architectures")),
        },
    };
    match name.as_str() {
        "LlamaForCausalLM" => Ok(Architecture::Llama),
        "MistralForCausalLM" => Ok(Architecture::Mistral),
        "Qwen2ForCausalLM" => Ok(Architecture::Qwen2),
        _ => Err(f.unsupported(
            "architectures",
            &name,
            "supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM",
        )),
    }
}

/// Rejects features of the format the backends do not implement.
fn check_supported_features(f: &Fields<'_>, arch: Architecture) -> Result<(), ConfigError> {
    if let Some(act) = f.str_opt("hidden_act")?
        && act != "silu"
    {
        return Err(f.unsupported("hidden_act", act, "only silu is implemented"));
    }
    let window_used = match arch {
        Architecture::Mistral => true,
        // Qwen2 ships a `sliding_window` but only uses it with `use_sliding_window: true`.
        Architecture::Qwen2 => f.bool_opt("use_sliding_window")?.unwrap_or(false),
        Architecture::Llama => false,
    };
    if window_used && let Some(window) = f.get("sliding_window") {
        return Err(f.unsupported(
            "sliding_window",
            &window.to_string(),
            "sliding-window attention is not implemented; only full attention",
        ));
    }
    if f.bool_opt("mlp_bias")?.unwrap_or(false) {
        return Err(f.unsupported("mlp_bias", "true", "MLP projections without bias only"));
    }
    Ok(())
}

fn parse_rope(f: &Fields<'_>, head_dim: usize) -> Result<RopeConfig, ConfigError> {
    let top_theta = f.f64_opt("rope_theta")?;
    let (theta, scaling) = if f.get("rope_parameters").is_some() {
        let p = f.nested("rope_parameters")?;
        let theta = p.f64_opt("rope_theta")?.or(top_theta);
        (theta, parse_scaling(&p)?)
    } else if f.get("rope_scaling").is_some() {
        let s = f.nested("rope_scaling")?;
        (top_theta, parse_scaling(&s)?)
    } else {
        (top_theta, RopeScaling::Default)
    };
    if let Some(partial) = f.f64_opt("partial_rotary_factor")?
        && partial != 1.0
    {
        return Err(f.unsupported(
            "partial_rotary_factor",
            &partial.to_string(),
            "RoPE over the full head only",
        ));
    }
    let theta = theta.unwrap_or(10_000.0) as f32;
    if !(theta.is_finite() && theta > 0.0) {
        return Err(f.invalid("rope_theta", "must be a positive number"));
    }
    let freq_factors = match f.get(FREQ_FACTORS) {
        None => None,
        Some(v) => Some(parse_freq_factors(f, v, head_dim)?),
    };
    Ok(RopeConfig {
        theta,
        scaling,
        freq_factors,
    })
}

/// The config key of [`RopeConfig::freq_factors`].
pub const FREQ_FACTORS: &str = "rope_freq_factors";

fn parse_freq_factors(f: &Fields<'_>, v: &Value, head_dim: usize) -> Result<Vec<f32>, ConfigError> {
    let expected = format!(
        "an array of {} positive numbers (head_dim / 2)",
        head_dim / 2
    );
    let items = v
        .as_array()
        .filter(|a| a.len() == head_dim / 2)
        .ok_or_else(|| f.invalid(FREQ_FACTORS, &expected))?;
    items
        .iter()
        .map(|x| {
            x.as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| f.invalid(FREQ_FACTORS, &expected))
        })
        .collect()
}

fn parse_scaling(s: &Fields<'_>) -> Result<RopeScaling, ConfigError> {
    let (field, kind) = match (s.str_opt("rope_type")?, s.str_opt("type")?) {
        (Some(t), _) => ("rope_type", t),
        (None, Some(t)) => ("type", t),
        (None, None) => ("rope_type", "default"),
    };
    let positive = |name: &str| -> Result<f32, ConfigError> {
        let v = s.f64_opt(name)?.ok_or_else(|| s.missing(name))? as f32;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(s.invalid(name, "must be a positive number"))
        }
    };
    match kind {
        "default" => Ok(RopeScaling::Default),
        "linear" => Ok(RopeScaling::Linear {
            factor: positive("factor")?,
        }),
        "llama3" => {
            let factor = positive("factor")?;
            let low_freq_factor = positive("low_freq_factor")?;
            let high_freq_factor = positive("high_freq_factor")?;
            if high_freq_factor <= low_freq_factor {
                return Err(s.inconsistent(format!(
                    "high_freq_factor {high_freq_factor} must exceed low_freq_factor \
                     {low_freq_factor}"
                )));
            }
            let original_max_position_embeddings = s
                .usize_opt("original_max_position_embeddings")?
                .ok_or_else(|| s.missing("original_max_position_embeddings"))?;
            if original_max_position_embeddings == 0 {
                return Err(s.invalid("original_max_position_embeddings", "must be positive"));
            }
            Ok(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            })
        }
        other => Err(s.unsupported(
            field,
            other,
            "supported RoPE types: default, linear, llama3",
        )),
    }
}

fn token_id_opt(f: &Fields<'_>, name: &str) -> Result<Option<u32>, ConfigError> {
    match f.get(name) {
        None => Ok(None),
        Some(v) => as_token_id(v)
            .map(Some)
            .ok_or_else(|| f.invalid(name, "expected a token id")),
    }
}

/// A token id field that may be one id, a list of ids, or null.
fn token_ids(f: &Fields<'_>, name: &str) -> Result<Vec<u32>, ConfigError> {
    match f.get(name) {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| as_token_id(v).ok_or_else(|| f.invalid(name, "expected token ids")))
            .collect(),
        Some(v) => as_token_id(v)
            .map(|id| vec![id])
            .ok_or_else(|| f.invalid(name, "expected a token id or a list of them")),
    }
}

fn as_token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

/// Typed access to one JSON object's fields, with errors that name file and field.
struct Fields<'a> {
    path: &'a Path,
    /// Dotted prefix for nested objects (`rope_scaling.`), empty at the root.
    prefix: String,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn root(path: &'a Path, value: &'a Value) -> Result<Self, ConfigError> {
        match value {
            Value::Object(obj) => Ok(Self {
                path,
                prefix: String::new(),
                obj,
            }),
            _ => Err(ConfigError::InvalidField {
                path: path.to_path_buf(),
                field: "(root)".to_owned(),
                value: abbreviate(value),
                reason: "expected a JSON object".to_owned(),
            }),
        }
    }

    fn nested(&self, name: &str) -> Result<Fields<'a>, ConfigError> {
        match self.obj.get(name) {
            Some(Value::Object(obj)) => Ok(Fields {
                path: self.path,
                prefix: format!("{}{name}.", self.prefix),
                obj,
            }),
            _ => Err(self.invalid(name, "expected an object")),
        }
    }

    fn full(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The field's value; `null` counts as absent.
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    fn usize_opt(&self, name: &str) -> Result<Option<usize>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected a non-negative integer")),
        }
    }

    fn usize_req(&self, name: &str) -> Result<usize, ConfigError> {
        self.usize_opt(name)?.ok_or_else(|| self.missing(name))
    }

    fn f64_opt(&self, name: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected a number")),
        }
    }

    fn bool_opt(&self, name: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected true or false")),
        }
    }

    fn str_opt(&self, name: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.invalid(name, "expected a string")),
        }
    }

    fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    fn missing(&self, name: &str) -> ConfigError {
        ConfigError::MissingField {
            path: self.path_buf(),
            field: self.full(name),
        }
    }

    fn invalid(&self, name: &str, reason: &str) -> ConfigError {
        ConfigError::InvalidField {
            path: self.path_buf(),
            field: self.full(name),
            value: self.obj.get(name).map_or("null".to_owned(), abbreviate),
            reason: reason.to_owned(),
        }
    }

    fn unsupported(&self, name: &str, value: &str, reason: &str) -> ConfigError {
        ConfigError::Unsupported {
            path: self.path_buf(),
            field: self.full(name),
            value: value.to_owned(),
            reason: reason.to_owned(),
        }
    }

    fn inconsistent(&self, reason: String) -> ConfigError {
        ConfigError::InconsistentConfig {
            path: self.path_buf(),
            reason,
        }
    }
}

/// A JSON value for an error message, cut to a readable length.
fn abbreviate(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 80 {
        let cut: String = s.chars().take(77).collect();
        format!("{cut}...")
    } else {
        s
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
