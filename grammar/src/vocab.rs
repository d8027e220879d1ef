//! The bytes each token id stands for, read from a HuggingFace tokenizer.
//!
//! A grammar constrains bytes, so the mask needs every token's exact bytes — not its decoded text,
//! which loses the halves of multi-byte characters. Three vocabulary styles exist in practice:
//! byte-level BPE (GPT-2, Llama 3, Qwen: each byte is written as one printable character), and
//! SentencePiece-style (Llama 2, Mistral: `▁` for a space, `<0xNN>` for raw bytes), and plain
//! vocabularies whose token strings are their bytes. Special tokens get llguidance's marker byte in
//! front, so no grammar text can spell them.

use std::collections::HashMap;

use llguidance::toktrie::TokTrie;
use tokenizers::Tokenizer;

/// How a vocabulary writes bytes into its token strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabStyle {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// `▁` for a space, `<0xNN>` for a raw byte.
    SentencePiece,
    /// The token string is its bytes.
    Plain,
}

impl VocabStyle {
    /// The style `tokenizer`'s decoder implies.
    pub fn of(tokenizer: &Tokenizer) -> Self {
        let Some(decoder) = tokenizer.get_decoder() else {
            return Self::Plain;
        };
        let Ok(json) = serde_json::to_value(decoder) else {
            return Self::Plain;
        };
        let types: Vec<&str> = std::iter::once(&json)
            .chain(json["decoders"].as_array().into_iter().flatten())
            .filter_map(|d| d["type"].as_str())
            .collect();
        if types.contains(&"ByteLevel") {
            Self::ByteLevel
        } else if types
            .iter()
            .any(|t| matches!(*t, "ByteFallback" | "Metaspace"))
        {
            Self::SentencePiece
        } else {
            Self::Plain
        }
    }
}

/// The bytes of every token id below `vocab_size` (ids the tokenizer lacks get no bytes, so no
/// grammar ever allows them). Special tokens start with [`TokTrie::SPECIAL_TOKEN_MARKER`].
pub fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<Vec<u8>> {
    let style = VocabStyle::of(tokenizer);
    let byte_of = byte_level_table();
    let mut words = vec![Vec::new(); vocab_size];
    for (piece, id) in tokenizer.get_vocab(false) {
        if let Some(slot) = words.get_mut(id as usize) {
            *slot = piece_bytes(&piece, style, &byte_of);
        }
    }
    for (id, added) in tokenizer.get_added_tokens_decoder() {
        if let Some(slot) = words.get_mut(id as usize) {
            let mut bytes = Vec::with_capacity(added.content.len() + 1);
            if added.special {
                bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
            }
            bytes.extend_from_slice(added.content.as_bytes());
            *slot = bytes;
        }
    }
    words
}

fn piece_bytes(piece: &str, style: VocabStyle, byte_of: &HashMap<char, u8>) -> Vec<u8> {
    match style {
        VocabStyle::ByteLevel => {
            // A piece with a character outside the table is not byte-level text (an added
            // token stored in the model vocabulary): its UTF-8 is its bytes.
            piece
                .chars()
                .map(|c| byte_of.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| piece.as_bytes().to_vec())
        }
        VocabStyle::SentencePiece => match raw_byte(piece) {
            Some(b) => vec![b],
            None => piece.replace('\u{2581}', " ").into_bytes(),
        },
        VocabStyle::Plain => piece.as_bytes().to_vec(),
    }
}

/// `<0xNN>` → the byte `NN`.
fn raw_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's byte-to-character table: the printable character byte `b` is written as, at `[b]`.
/// Printable Latin-1 bytes stand for themselves; the other 68 take the characters from U+0100 on,
/// in byte order.
pub(crate) fn byte_level_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    std::array::from_fn(|b| {
        let b = b as u8;
        if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        }
    })
}

/// [`byte_level_chars`] reversed: character → byte.
fn byte_level_table() -> HashMap<char, u8> {
    byte_level_chars()
        .into_iter()
        .enumerate()
        .map(|(b, c)| (c, b as u8))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_is_a_bijection_onto_all_bytes() {
        let table = byte_level_table();
        assert_eq!(table.len(), 256);
        let mut bytes: Vec<u8> = table.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        assert_eq!(table[&'A'], b'A');
        assert_eq!(table[&'\u{0120}'], b' ', "Ġ is a space");
        assert_eq!(table[&'\u{010A}'], b'\n', "Ċ is a newline");
    }

    #[test]
    fn sentencepiece_pieces() {
        let table = byte_level_table();
        let sp = VocabStyle::SentencePiece;
        assert_eq!(piece_bytes("\u{2581}the", sp, &table), b" the");
        assert_eq!(piece_bytes("<0x0A>", sp, &table), b"\n");
        assert_eq!(piece_bytes("<0xZZ>", sp, &table), b"<0xZZ>");
        assert_eq!(piece_bytes("<0x1>", sp, &table), b"<0x1>");
    }
}
