//! A tokenizer for tests and examples: byte-level BPE with no merges, so token id `b` is the byte
//! `b`, plus the special token `<|eos|>` at id 256.

use tokenizers::Tokenizer;

/// The byte tokenizer described in the module docs.
pub fn byte_tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> = crate::vocab::byte_level_chars()
        .iter()
        .enumerate()
        .map(|(b, c)| (c.to_string(), serde_json::Value::from(b)))
        .collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true
    });
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": 256, "content": "<|eos|>", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": vocab, "merges": []
        }
    });
    json.to_string()
        .parse()
        .unwrap_or_else(|e| panic!("the byte tokenizer's JSON is valid: {e}"))
}
