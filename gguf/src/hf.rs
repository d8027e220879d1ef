//! What a GGUF file holds, as a HuggingFace model folder would hold it: `config.json`,
//! `tokenizer.json` and `tokenizer_config.json` as JSON values, the weights under their HF names.
//!
//! Architectures `llama` (Mistral-style files included) and `qwen2`. llama.cpp's converter stores
//! llama's q/k projection rows permuted for its interleaved RoPE (the two halves of each head
//! interleaved pairwise); [`read_hf`](GgufFile::read_hf) puts them back in HF order. qwen2
//! files are stored unpermuted.

use serde_json::{Map, Value as Json, json};

use crate::quants::{Q4Matrix, unpack_q4};
use crate::reader::{GgufError, GgufFile, TensorInfo, Value};

/// One weight under its HF name, row-major, dequantized.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// How one weight of the file is read: its HF name and shape, its tensor, and (llama's q and k)
/// the heads whose rows are un-permuted.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensorPlan {
    pub name: String,
    pub shape: Vec<usize>,
    index: usize,
    unpermute_heads: Option<usize>,
}

/// A GGUF architecture this module maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    Llama,
    Qwen2,
}

impl Arch {
    fn key(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
        }
    }
}

/// The pre-tokenizer of `tokenizer.ggml.pre` values whose splitting this module reproduces.
fn pre_tokenizer(pre: &str) -> Option<Json> {
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let split = |pattern: &str| {
        json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
               "invert": false})
    };
    Some(match pre {
        // GPT-2's own regex, inside ByteLevel.
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        // Every digit alone, then GPT-2's regex.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        // Llama 3's and Qwen2's regexes (numbers in runs of up to three digits, or one by one).
        "llama3" | "llama-bpe" | "llama-v3" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        _ => return None,
    })
}

/// Llama 3.1-style per-frequency RoPE divisors, read into the config.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// `tokenizer.ggml.token_type` values.
pub(crate) const TOKEN_NORMAL: u64 = 1;
const TOKEN_UNKNOWN: u64 = 2;
const TOKEN_CONTROL: u64 = 3;
const TOKEN_USER_DEFINED: u64 = 4;
const TOKEN_BYTE: u64 = 6;

impl GgufFile {
    fn arch(&self) -> Result<Arch, GgufError> {
        let key = "general.architecture";
        match self.get(key).and_then(Value::as_str) {
            Some("llama") => Ok(Arch::Llama),
            Some("qwen2") => Ok(Arch::Qwen2),
            Some(other) => Err(GgufError::Unsupported {
                path: self.path().to_path_buf(),
                what: format!("architecture `{other}`"),
                reason: "llama (and Mistral-style llama files) and qwen2 are".into(),
            }),
            None => Err(self.metadata_error(key, "missing (or not a string)")),
        }
    }

    fn u64_key(&self, key: &str) -> Result<Option<u64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.metadata_error(key, format!("{v:?} is not an integer"))),
        }
    }

    fn u64_req(&self, key: &str) -> Result<u64, GgufError> {
        self.u64_key(key)?
            .ok_or_else(|| self.metadata_error(key, "missing"))
    }

    fn f64_key(&self, key: &str) -> Result<Option<f64>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.metadata_error(key, format!("{v:?} is not a number"))),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let arr = self
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| self.metadata_error(key, "missing (or not an array)"))?;
        arr.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| self.metadata_error(key, format!("element {i} is not a string")))
            })
            .collect()
    }

    fn token_id(&self, key: &str, vocab: usize) -> Result<Option<u32>, GgufError> {
        match self.u64_key(key)? {
            Some(id) if id < vocab as u64 => Ok(Some(id as u32)),
            Some(id) => {
                Err(self.metadata_error(key, format!("{id} is past the vocabulary ({vocab})")))
            }
            None => Ok(None),
        }
    }

    /// The model's `config.json`, for the engine's config parser (which checks it further).
    pub fn hf_config(&self) -> Result<Json, GgufError> {
        let arch = self.arch()?;
        let k = |name: &str| format!("{}.{name}", arch.key());
        let heads = self.u64_req(&k("attention.head_count"))?;
        let hidden = self.u64_req(&k("embedding_length"))?;
        let kv_heads = self
            .u64_key(&k("attention.head_count_kv"))?
            .unwrap_or(heads);
        let vocab = match self.u64_key(&k("vocab_size"))? {
            Some(v) => v,
            None => self.strings("tokenizer.ggml.tokens")?.len() as u64,
        };
        let mut c = Map::new();
        let arch_name = match arch {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
        };
        c.insert("architectures".into(), json!([arch_name]));
        c.insert("model_type".into(), json!(arch.key()));
        c.insert("vocab_size".into(), json!(vocab));
        c.insert("hidden_size".into(), json!(hidden));
        c.insert(
            "intermediate_size".into(),
            json!(self.u64_req(&k("feed_forward_length"))?),
        );
        c.insert(
            "num_hidden_layers".into(),
            json!(self.u64_req(&k("block_count"))?),
        );
        c.insert("num_attention_heads".into(), json!(heads));
        c.insert("num_key_value_heads".into(), json!(kv_heads));
        let key_len = self.u64_key(&k("attention.key_length"))?;
        let value_len = self.u64_key(&k("attention.value_length"))?;
        if key_len != value_len && key_len.is_some() && value_len.is_some() {
            return Err(self.metadata_error(
                &k("attention.value_length"),
                format!("{value_len:?} differs from key_length {key_len:?}"),
            ));
        }
        // Without a key length the config parser derives (and checks) hidden / heads itself.
        let head_dim = match key_len.or(value_len) {
            Some(d) => {
                c.insert("head_dim".into(), json!(d));
                d
            }
            None if heads > 0 && hidden.is_multiple_of(heads) => hidden / heads,
            None => 0,
        };
        if let Some(rot) = self.u64_key(&k("rope.dimension_count"))?
            && head_dim > 0
            && rot != head_dim
        {
            return Err(GgufError::Unsupported {
                path: self.path().to_path_buf(),
                what: format!(
                    "`{}` = {rot} (RoPE on part of a head)",
                    k("rope.dimension_count")
                ),
                reason: format!("heads are rotated whole, {head_dim} dimensions"),
            });
        }
        if let Some(eps) = self.f64_key(&k("attention.layer_norm_rms_epsilon"))? {
            c.insert("rms_norm_eps".into(), json!(eps));
        }
        c.insert(
            "rope_theta".into(),
            json!(self.f64_key(&k("rope.freq_base"))?.unwrap_or(10_000.0)),
        );
        if let Some(ctx) = self.u64_key(&k("context_length"))? {
            c.insert("max_position_embeddings".into(), json!(ctx));
        }
        let scaling_key = k("rope.scaling.type");
        match self.get(&scaling_key).map(|v| v.as_str()) {
            None | Some(Some("none")) => {}
            Some(Some("linear")) => {
                let factor_key = k("rope.scaling.factor");
                let factor = self
                    .f64_key(&factor_key)?
                    .ok_or_else(|| self.metadata_error(&factor_key, "missing"))?;
                c.insert(
                    "rope_scaling".into(),
                    json!({"rope_type": "linear", "factor": factor}),
                );
            }
            Some(other) => {
                return Err(GgufError::Unsupported {
                    path: self.path().to_path_buf(),
                    what: format!("`{scaling_key}` = {other:?}"),
                    reason: "none and linear are".into(),
                });
            }
        }
        if let Some(info) = self.tensor(ROPE_FREQS) {
            // llama.cpp divides each frequency by its factor (Llama 3.1's scaling); the config
            // parser checks the count against head_dim / 2 and that each is finite and positive.
            if info.shape().len() != 1 {
                return Err(GgufError::Malformed {
                    path: self.path().to_path_buf(),
                    what: format!("tensor `{ROPE_FREQS}`"),
                    reason: format!("shape {:?}, expected one dimension", info.shape()),
                });
            }
            let factors: Vec<f64> = self.read_f32(info).into_iter().map(f64::from).collect();
            c.insert("rope_freq_factors".into(), json!(factors));
        }
        c.insert(
            "tie_word_embeddings".into(),
            json!(self.tensor("output.weight").is_none()),
        );
        let n_tokens = self.strings("tokenizer.ggml.tokens").map(|t| t.len()).ok();
        let vocab_len = n_tokens.unwrap_or(vocab as usize);
        if let Some(bos) = self.token_id("tokenizer.ggml.bos_token_id", vocab_len)? {
            c.insert("bos_token_id".into(), json!(bos));
        }
        let mut eos = Vec::new();
        for key in [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ] {
            if let Some(id) = self.token_id(key, vocab_len)?
                && !eos.contains(&id)
            {
                eos.push(id);
            }
        }
        if !eos.is_empty() {
            c.insert("eos_token_id".into(), json!(eos));
        }
        Ok(Json::Object(c))
    }

    /// The model's `tokenizer.json`, for the `tokenizers` crate: GPT-2-style byte-level BPE
    /// vocabularies (`tokenizer.ggml.model = gpt2`, with their merges) and SentencePiece-style ones
    /// (`llama`, with their scores; `spm.rs`).
    pub fn hf_tokenizer(&self) -> Result<Json, GgufError> {
        let model_key = "tokenizer.ggml.model";
        let model = self
            .get(model_key)
            .and_then(Value::as_str)
            .ok_or_else(|| self.metadata_error(model_key, "missing (or not a string)"))?;
        let spm = match model {
            "gpt2" => false,
            "llama" => true,
            other => {
                return Err(GgufError::Unsupported {
                    path: self.path().to_path_buf(),
                    what: format!("`{model_key}` = {other:?}"),
                    reason: "byte-level BPE (gpt2) and SentencePiece (llama) vocabularies are"
                        .into(),
                });
            }
        };
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        let types: Vec<u64> = match self.get("tokenizer.ggml.token_type") {
            None => vec![1; tokens.len()],
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let arr = v
                    .as_array()
                    .ok_or_else(|| self.metadata_error(key, "not an array"))?;
                if arr.len() != tokens.len() {
                    return Err(self.metadata_error(
                        key,
                        format!("{} entries for {} tokens", arr.len(), tokens.len()),
                    ));
                }
                arr.iter().map(|v| v.as_u64().unwrap_or(1)).collect()
            }
        };
        let mut vocab = Map::with_capacity(tokens.len());
        let mut added = Vec::new();
        for (id, (&token, &ty)) in tokens.iter().zip(&types).enumerate() {
            if vocab.insert(token.to_owned(), json!(id)).is_some() {
                return Err(self.metadata_error(
                    "tokenizer.ggml.tokens",
                    format!("token {token:?} appears twice (again at id {id})"),
                ));
            }
            let special = ty == TOKEN_CONTROL || (spm && ty == TOKEN_UNKNOWN);
            if special || ty == TOKEN_USER_DEFINED {
                added.push(json!({"id": id, "content": token, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false,
                    "special": special}));
            }
        }
        let add_bos = self
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let post = match self.token_id("tokenizer.ggml.bos_token_id", tokens.len())? {
            Some(bos) if add_bos => {
                let t = tokens[bos as usize];
                json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": t, "type_id": 0}},
                               {"Sequence": {"id": "A", "type_id": 0}}],
                    "pair": [{"SpecialToken": {"id": t, "type_id": 0}},
                             {"Sequence": {"id": "A", "type_id": 0}},
                             {"SpecialToken": {"id": t, "type_id": 1}},
                             {"Sequence": {"id": "B", "type_id": 1}}],
                    "special_tokens": {t: {"id": t, "ids": [bos], "tokens": [t]}}})
            }
            _ => Json::Null,
        };
        let (normalizer, pre, decoder, model) = if spm {
            self.spm_parts(&tokens, &types, vocab)?
        } else {
            let (pre, decoder, model) = self.byte_level_parts(vocab)?;
            (Json::Null, pre, decoder, model)
        };
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": normalizer,
            "pre_tokenizer": pre,
            "post_processor": post,
            "decoder": decoder,
            "model": model,
        }))
    }

    /// Pre-tokenizer, decoder and model of a byte-level BPE vocabulary.
    fn byte_level_parts(&self, vocab: Map<String, Json>) -> Result<(Json, Json, Json), GgufError> {
        let pre_key = "tokenizer.ggml.pre";
        let pre_name = self
            .get(pre_key)
            .and_then(Value::as_str)
            .unwrap_or("default");
        let pre = pre_tokenizer(pre_name).ok_or_else(|| GgufError::Unsupported {
            path: self.path().to_path_buf(),
            what: format!("`{pre_key}` = {pre_name:?}"),
            reason: "default, gpt2/gpt-2, smollm, llama3/llama-bpe and qwen2 are".into(),
        })?;
        let merges_key = "tokenizer.ggml.merges";
        let merges = self
            .strings(merges_key)?
            .into_iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    Ok(json!([a, b]))
                }
                _ => Err(self.metadata_error(
                    merges_key,
                    format!("merge {i} ({m:?}) is not two tokens split by one space"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Llama 3's tokenizer takes a pre-token that is itself in the vocabulary whole, before
        // any merge (`ignore_merges`), as llama.cpp does for this pre-tokenizer.
        let ignore_merges = matches!(pre_name, "llama3" | "llama-bpe" | "llama-v3");
        let decoder = json!({"type": "ByteLevel", "add_prefix_space": true,
                             "trim_offsets": true, "use_regex": true});
        let model = json!({"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
                      "vocab": vocab, "merges": merges});
        Ok((pre, decoder, model))
    }

    /// Normalizer, pre-tokenizer (none), decoder and model of a SentencePiece vocabulary: merges
    /// from the scores, byte fallback, the unknown piece.
    fn spm_parts(
        &self,
        tokens: &[&str],
        types: &[u64],
        vocab: Map<String, Json>,
    ) -> Result<(Json, Json, Json, Json), GgufError> {
        let key = "tokenizer.ggml.scores";
        let scores: Vec<f32> = self
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| self.metadata_error(key, "missing (or not an array)"))?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32).filter(|x| x.is_finite()))
            .collect::<Option<_>>()
            .ok_or_else(|| self.metadata_error(key, "an entry is not a finite number"))?;
        if scores.len() != tokens.len() {
            return Err(self.metadata_error(
                key,
                format!("{} entries for {} tokens", scores.len(), tokens.len()),
            ));
        }
        if !types.contains(&TOKEN_BYTE) {
            return Err(GgufError::Unsupported {
                path: self.path().to_path_buf(),
                what: "a SentencePiece vocabulary without byte pieces (`<0xNN>`)".into(),
                reason: "characters outside the vocabulary fall back to bytes".into(),
            });
        }
        let unk = match self.token_id("tokenizer.ggml.unknown_token_id", tokens.len())? {
            Some(id) => Some(id as usize),
            None => types.iter().position(|&t| t == TOKEN_UNKNOWN),
        };
        let space_prefix = self
            .get("tokenizer.ggml.add_space_prefix")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let merges = crate::spm::merges(tokens, types, &scores);
        let model = json!({"type": "BPE", "dropout": null,
                      "unk_token": unk.map(|id| tokens[id]),
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                      "vocab": vocab, "merges": merges});
        Ok((
            crate::spm::normalizer(space_prefix),
            Json::Null,
            crate::spm::decoder(space_prefix),
            model,
        ))
    }

    /// The model's `tokenizer_config.json`: the chat template and the BOS/EOS spellings it uses.
    pub fn hf_tokenizer_config(&self) -> Result<Json, GgufError> {
        let mut c = Map::new();
        if let Some(t) = self.get("tokenizer.chat_template") {
            let t = t
                .as_str()
                .ok_or_else(|| self.metadata_error("tokenizer.chat_template", "not a string"))?;
            c.insert("chat_template".into(), json!(t));
        }
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        for (field, key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
        ] {
            if let Some(id) = self.token_id(key, tokens.len())? {
                c.insert(field.into(), json!(tokens[id as usize]));
            }
        }
        Ok(Json::Object(c))
    }

    /// Every weight of the file under its HF name and shape, in file order, to read one at a
    /// time with [`read_hf`](Self::read_hf) (so a loader holds one dequantized tensor beyond what
    /// it keeps). A tensor this mapping does not know is an error naming it.
    pub fn hf_tensor_plan(&self) -> Result<Vec<HfTensorPlan>, GgufError> {
        let arch = self.arch()?;
        let k = |name: &str| format!("{}.{name}", arch.key());
        let heads = self.u64_req(&k("attention.head_count"))? as usize;
        let kv_heads = self
            .u64_key(&k("attention.head_count_kv"))?
            .map_or(heads, |v| v as usize);
        let mut out = Vec::with_capacity(self.tensors().len());
        for (index, info) in self.tensors().iter().enumerate() {
            if info.name == ROPE_FREQS {
                continue; // part of the config (`hf_config`), not a weight
            }
            let name = hf_name(&info.name).ok_or_else(|| GgufError::Unsupported {
                path: self.path().to_path_buf(),
                what: format!("tensor `{}`", info.name),
                reason: "it has no counterpart in a Llama/Qwen2 HF checkpoint".into(),
            })?;
            let unpermute_heads = match arch {
                Arch::Llama if info.name.contains(".attn_q.") => Some(heads),
                Arch::Llama if info.name.contains(".attn_k.") => Some(kv_heads),
                _ => None,
            };
            out.push(HfTensorPlan {
                name,
                shape: info.shape(),
                index,
                unpermute_heads,
            });
        }
        Ok(out)
    }

    /// One weight of [`hf_tensor_plan`](Self::hf_tensor_plan), dequantized to f32, llama's q/k
    /// rows in HF order.
    pub fn read_hf(&self, plan: &HfTensorPlan) -> Result<HfTensor, GgufError> {
        let info = &self.tensors()[plan.index];
        let mut data = self.read_f32(info);
        if let Some(n_head) = plan.unpermute_heads {
            data = unpermute_rows(self, info, &data, n_head)?;
        }
        Ok(HfTensor {
            name: plan.name.clone(),
            shape: plan.shape.clone(),
            data,
        })
    }

    /// The stored type of one weight of [`hf_tensor_plan`](Self::hf_tensor_plan).
    pub fn hf_tensor_type(&self, plan: &HfTensorPlan) -> crate::GgmlType {
        self.tensors()[plan.index].ty
    }

    /// One weight of [`hf_tensor_plan`](Self::hf_tensor_plan) as its `Q4_0` / `Q4_1` blocks
    /// (`[out, in]` rows, llama's q/k rows in HF order): what a backend with 4-bit kernels runs
    /// without dequantizing. `None` for a tensor of another type or not 2-D.
    pub fn read_hf_q4(&self, plan: &HfTensorPlan) -> Result<Option<Q4Matrix>, GgufError> {
        let info = &self.tensors()[plan.index];
        let [rows, cols] = plan.shape[..] else {
            return Ok(None);
        };
        let Some(mut q) = unpack_q4(info.ty, self.data(info), rows, cols) else {
            return Ok(None);
        };
        if let Some(n_head) = plan.unpermute_heads {
            q.codes = unpermute_rows(self, info, &q.codes, n_head)?;
            q.scales = unpermute_rows(self, info, &q.scales, n_head)?;
            if let Some(m) = &q.mins {
                q.mins = Some(unpermute_rows(self, info, m, n_head)?);
            }
        }
        Ok(Some(q))
    }
}

/// The HF name of a GGUF tensor name (`blk.N.attn_q.weight` → `model.layers.N.self_attn.q_proj.weight`).
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    if !matches!(param, "weight" | "bias") {
        return None;
    }
    let hf = match (module, param) {
        ("attn_norm", "weight") => "input_layernorm",
        ("ffn_norm", "weight") => "post_attention_layernorm",
        ("attn_q", _) => "self_attn.q_proj",
        ("attn_k", _) => "self_attn.k_proj",
        ("attn_v", _) => "self_attn.v_proj",
        ("attn_output", _) => "self_attn.o_proj",
        ("ffn_gate", "weight") => "mlp.gate_proj",
        ("ffn_up", "weight") => "mlp.up_proj",
        ("ffn_down", "weight") => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{param}"))
}

/// Undoes llama.cpp's q/k permutation: within each of `n_head` heads of `head_dim` rows, stored row
/// `2i + j` is HF row `j * head_dim / 2 + i` (j = 0, 1 the two RoPE halves). `data` holds the
/// tensor's rows as runs of `data.len() / rows` values (elements, or per-block scales).
fn unpermute_rows<T: Copy + Default>(
    file: &GgufFile,
    info: &TensorInfo,
    data: &[T],
    n_head: usize,
) -> Result<Vec<T>, GgufError> {
    let rows = info.shape()[0];
    if n_head == 0 || !rows.is_multiple_of(n_head) || !(rows / n_head).is_multiple_of(2) {
        return Err(GgufError::Malformed {
            path: file.path().to_path_buf(),
            what: format!("tensor `{}`", info.name),
            reason: format!("{rows} rows are not {n_head} heads of an even size"),
        });
    }
    let cols = data.len() / rows;
    let head_dim = rows / n_head;
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let src = (h * head_dim + 2 * i + j) * cols;
                let dst = (h * head_dim + j * half + i) * cols;
                out[dst..dst + cols].copy_from_slice(&data[src..src + cols]);
            }
        }
    }
    Ok(out)
}
