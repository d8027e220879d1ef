//! HuggingFace tensor names of a Llama-family checkpoint, and the shape each must have.

use crate::config::ModelConfig;

/// Token embedding table, `[vocab, hidden]`.
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// Final RMSNorm weight, `[hidden]`.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Output projection, `[vocab, hidden]` (absent when embeddings are tied).
pub const LM_HEAD: &str = "lm_head.weight";

/// The name of a tensor of layer `layer`, e.g. `layer_tensor(3, "self_attn.q_proj.weight")`.
pub fn layer_tensor(layer: usize, suffix: &str) -> String {
    format!("model.layers.{layer}.{suffix}")
}

/// Per-layer tensor suffixes (see [`layer_tensor`]).
pub mod layer {
    pub const INPUT_NORM: &str = "input_layernorm.weight";
    pub const POST_ATTENTION_NORM: &str = "post_attention_layernorm.weight";
    pub const Q_PROJ: &str = "self_attn.q_proj.weight";
    pub const K_PROJ: &str = "self_attn.k_proj.weight";
    pub const V_PROJ: &str = "self_attn.v_proj.weight";
    pub const O_PROJ: &str = "self_attn.o_proj.weight";
    pub const Q_BIAS: &str = "self_attn.q_proj.bias";
    pub const K_BIAS: &str = "self_attn.k_proj.bias";
    pub const V_BIAS: &str = "self_attn.v_proj.bias";
    pub const GATE_PROJ: &str = "mlp.gate_proj.weight";
    pub const UP_PROJ: &str = "mlp.up_proj.weight";
    pub const DOWN_PROJ: &str = "mlp.down_proj.weight";
}

/// The decoder linear weights (the layers FP8 and other schemes quantize).
pub const LINEAR_WEIGHTS: [&str; 7] = [
    layer::Q_PROJ,
    layer::K_PROJ,
    layer::V_PROJ,
    layer::O_PROJ,
    layer::GATE_PROJ,
    layer::UP_PROJ,
    layer::DOWN_PROJ,
];

/// Whether `name` is a decoder linear weight (`model.layers.N.` + one of [`LINEAR_WEIGHTS`]).
pub fn is_linear_weight(name: &str) -> bool {
    name.strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(n, suffix)| {
            n.bytes().all(|b| b.is_ascii_digit()) && LINEAR_WEIGHTS.contains(&suffix)
        })
}

/// The tensor that holds the output projection: `lm_head.weight`, or the embeddings when tied.
pub fn lm_head_name(config: &ModelConfig) -> &'static str {
    if config.tie_word_embeddings {
        EMBED_TOKENS
    } else {
        LM_HEAD
    }
}

/// Every tensor `config` needs, with its expected shape (HF layout: linear weights are `[out, in]`),
/// made as it is asked for: a config naming billions of layers costs nothing until its tensors are
/// looked up (and the first missing one ends a validation).
pub fn expected_tensors(config: &ModelConfig) -> impl Iterator<Item = (String, Vec<usize>)> + '_ {
    let h = config.hidden_size;
    let q = config.q_dim();
    let kv = config.kv_dim();
    let inter = config.intermediate_size;
    let layers = (0..config.num_hidden_layers).flat_map(move |i| {
        let bias = config.qkv_bias.then(|| {
            [
                (layer::Q_BIAS, vec![q]),
                (layer::K_BIAS, vec![kv]),
                (layer::V_BIAS, vec![kv]),
            ]
        });
        [
            (layer::INPUT_NORM, vec![h]),
            (layer::POST_ATTENTION_NORM, vec![h]),
            (layer::Q_PROJ, vec![q, h]),
            (layer::K_PROJ, vec![kv, h]),
            (layer::V_PROJ, vec![kv, h]),
            (layer::O_PROJ, vec![h, q]),
        ]
        .into_iter()
        .chain(bias.into_iter().flatten())
        .chain([
            (layer::GATE_PROJ, vec![inter, h]),
            (layer::UP_PROJ, vec![inter, h]),
            (layer::DOWN_PROJ, vec![h, inter]),
        ])
        .map(move |(suffix, shape)| (layer_tensor(i, suffix), shape))
    });
    std::iter::once((EMBED_TOKENS.to_owned(), vec![config.vocab_size, h]))
        .chain(layers)
        .chain([(FINAL_NORM.to_owned(), vec![h])])
        .chain(
            (!config.tie_word_embeddings).then(|| (LM_HEAD.to_owned(), vec![config.vocab_size, h])),
        )
}
