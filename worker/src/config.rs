//! The model's shape, as parsed from a HuggingFace `config.json`.

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
}
