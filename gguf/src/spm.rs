//! SentencePiece-style vocabularies (`tokenizer.ggml.model = llama`: Llama 2, Mistral v0.1,
//! TinyLlama) as a `tokenizers` BPE model.
//!
//! Such a file holds every piece with a score and a type, and no merges. SentencePiece's BPE merges,
//! at each step, the adjacent pair whose concatenation is the best-scoring piece; a BPE model whose
//! merges are every split of every normal piece into two normal pieces, ranked by the merged piece's
//! score, merges in the same order. Characters no piece covers fall back to their UTF-8 bytes
//! (`<0xNN>` pieces); spaces are `▁`, with one put before the text when the vocabulary asks for it
//! (`tokenizer.ggml.add_space_prefix`, default on) — before every run of text, the one after a
//! special token too, as llama.cpp tokenizes, and even when the text starts with a space, as
//! SentencePiece does.

use std::collections::HashMap;

use serde_json::{Value as Json, json};

// The token type of an ordinary piece (the only kind merges produce or consume).
use crate::hf::TOKEN_NORMAL;

/// The merges that reproduce SentencePiece's BPE: for every normal piece, each split into two normal
/// pieces (ordered by their ids), all ranked by the piece's score, best first (ties in id order).
pub(crate) fn merges(tokens: &[&str], types: &[u64], scores: &[f32]) -> Vec<Json> {
    let normal: HashMap<&str, usize> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, ty))| **ty == TOKEN_NORMAL)
        .map(|(id, (t, _))| (*t, id))
        .collect();
    let mut ranked: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if types[id] != TOKEN_NORMAL {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (normal.get(l), normal.get(r)) {
                ranked.push((scores[id], id, li, ri));
            }
        }
    }
    // Best score first; among equal scores the piece's id, then the split's ids.
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then((a.2, a.3).cmp(&(b.2, b.3)))
    });
    ranked
        .into_iter()
        .map(|(_, _, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}

/// The normalizer: one `▁` before each run of text if `space_prefix`, spaces to `▁`.
pub(crate) fn normalizer(space_prefix: bool) -> Json {
    let mut steps = Vec::new();
    if space_prefix {
        steps.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    steps.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    json!({"type": "Sequence", "normalizers": steps})
}

/// The decoder: `▁` back to spaces, byte pieces back to bytes, and the prepended space dropped.
pub(crate) fn decoder(space_prefix: bool) -> Json {
    let mut steps = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if space_prefix {
        steps.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    json!({"type": "Sequence", "decoders": steps})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_rank_by_the_merged_pieces_score_and_skip_special_pieces() {
        let tokens = ["<unk>", "<0x41>", "a", "b", "c", "ab", "bc", "abc", "<s>"];
        let types = [2, 6, 1, 1, 1, 1, 1, 1, 3];
        let scores = [0.0, 0.0, -5.0, -6.0, -7.0, -2.0, -1.0, -3.0, 0.0];
        let got = merges(&tokens, &types, &scores);
        // bc (-1) before ab (-2) before abc (-3, two splits in id order: a|bc then ab|c).
        assert_eq!(
            got,
            vec![
                json!(["b", "c"]),
                json!(["a", "b"]),
                json!(["a", "bc"]),
                json!(["ab", "c"])
            ]
        );
    }
}
