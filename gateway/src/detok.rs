//! Incremental detokenization that never emits a broken UTF-8 sequence.
//!
//! Byte-level tokenizers split multi-byte characters (emoji, CJK) across tokens; decoding such a
//! token alone gives U+FFFD. Following vLLM and TGI, the detokenizer decodes a short window twice —
//! the tokens already emitted (`prefix..read`) and the window with the new tokens (`prefix..`) — and
//! emits the difference only when the window's text does not end in a replacement character, so a
//! character split across tokens is sent once it is complete. The window also keeps
//! SentencePiece-style leading spaces right, since a token is never decoded without its left
//! neighbours.

use std::sync::Arc;

use tokenizers::Tokenizer;

/// How many prompt tokens seed the window (enough context for leading-space rules).
const PROMPT_CONTEXT: usize = 5;

/// The ids `Tokenizer::decode(.., skip_special_tokens = true)` leaves out — those whose token
/// string is one of the special added tokens — as a bitset, so that the detokenizer drops them
/// with one bit test when they arrive instead of `decode` hashing every token's string on every
/// window it decodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    bits: Vec<u64>,
}

impl SpecialIds {
    /// The special ids of `tokenizer`'s vocabulary (added tokens included): every id whose
    /// token string, looked up as `decode` looks it up, is a special token's.
    pub fn of(tokenizer: &Tokenizer) -> Self {
        let added = tokenizer.get_added_vocabulary();
        let ids = added
            .get_vocab()
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0)
            .max(tokenizer.get_vocab_size(true));
        let mut bits = vec![0u64; ids.div_ceil(64)];
        for id in 0..ids as u32 {
            if tokenizer
                .id_to_token(id)
                .is_some_and(|t| added.is_special_token(&t))
            {
                bits[id as usize / 64] |= 1 << (id % 64);
            }
        }
        Self { bits }
    }

    /// Whether `id` is special.
    pub fn contains(&self, id: u32) -> bool {
        self.bits
            .get(id as usize / 64)
            .is_some_and(|w| w >> (id % 64) & 1 == 1)
    }
}

/// Turns a stream of token ids into a stream of complete UTF-8 text deltas.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    /// Bytes of the open tokens' text (`read..`) already sent.
    partial: usize,
    /// The special tokens (BOS, EOS, chat markers) to leave out of the text, if any: dropped as
    /// they arrive, so `ids` holds only what is decoded.
    skip: Option<Arc<SpecialIds>>,
}

impl Detokenizer {
    /// A detokenizer for a completion of `prompt` (its last tokens serve as context only); with
    /// `skip`, the text leaves those special tokens out (what `decode`'s `skip_special_tokens`
    /// does).
    pub fn new(prompt: &[u32], skip: Option<Arc<SpecialIds>>) -> Self {
        let ctx = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        let mut d = Self {
            ids: Vec::with_capacity(ctx.len()),
            prefix: 0,
            read: 0,
            partial: 0,
            skip,
        };
        d.extend(ctx);
        d.read = d.ids.len();
        d
    }

    fn extend(&mut self, tokens: &[u32]) {
        match &self.skip {
            Some(special) => self
                .ids
                .extend(tokens.iter().filter(|&&id| !special.contains(id))),
            None => self.ids.extend_from_slice(tokens),
        }
    }

    /// Adds generated tokens; returns the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> String {
        self.extend(tokens);
        let emitted = decode(tokenizer, &self.ids[self.prefix..self.read]);
        let window = decode(tokenizer, &self.ids[self.prefix..]);
        // Where the new text starts: after what the emitted tokens spell, plus any complete
        // characters of the still-open tokens already sent.
        let mut start = if window.starts_with(emitted.as_str()) {
            emitted.len()
        } else {
            // The window re-spelled earlier text (rare: normalizers); resume at the same byte count.
            emitted.len().min(window.len())
        } + self.partial;
        start = start.min(window.len());
        while !window.is_char_boundary(start) {
            start += 1;
        }
        let complete = window.trim_end_matches('\u{FFFD}');
        if complete.len() < window.len() {
            // An incomplete character at the end: send the complete text before it, keep the tokens
            // open.
            let end = complete.len().max(start);
            self.partial += end - start;
            return window[start..end].to_owned();
        }
        let delta = window[start..].to_owned();
        self.prefix = self.read;
        self.read = self.ids.len();
        self.partial = 0;
        // Keep the buffer short: only the window is ever decoded again.
        if self.prefix > 64 {
            self.ids.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
        delta
    }

    /// Text still held back (an incomplete character at the end of the output), decoded lossily.
    /// Call once when the completion ends.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> String {
        let emitted = decode(tokenizer, &self.ids[self.prefix..self.read]);
        let window = decode(tokenizer, &self.ids[self.prefix..]);
        let mut start = (emitted.len() + self.partial).min(window.len());
        while !window.is_char_boundary(start) {
            start += 1;
        }
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        self.partial = 0;
        window[start..].to_owned()
    }
}

/// The text of `ids`, special ones already dropped by [`Detokenizer::extend`] where asked.
fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    tokenizer.decode(ids, false).unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokenizers::pre_tokenizers;

    /// A byte-level BPE with no merges: every byte is its own token, so every multi-byte character
    /// is split across tokens — the hardest case for a detokenizer.
    pub(crate) fn byte_tokenizer() -> Tokenizer {
        let mut alphabet: Vec<String> = pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .map(|c| c.to_string())
            .collect();
        alphabet.sort();
        let vocab: serde_json::Map<String, serde_json::Value> = alphabet
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s, serde_json::Value::from(i)))
            .collect();
        let json = serde_json::json!({
            "version": "1.0",
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        });
        json.to_string().parse().unwrap()
    }

    #[test]
    fn emoji_and_cjk_round_trip_one_token_at_a_time() {
        let t = byte_tokenizer();
        for text in [
            "héllo 👋 世界!",
            "🎉🎉",
            "日本語のテキスト",
            "a\u{1F468}\u{200D}\u{1F4BB}b",
        ] {
            let ids = t.encode(text, false).unwrap().get_ids().to_vec();
            assert!(ids.len() > text.chars().count(), "bytes are split");
            let mut d = Detokenizer::new(&[], None);
            let mut out = String::new();
            for &id in &ids {
                let delta = d.push(&t, &[id]);
                assert!(
                    !delta.contains('\u{FFFD}'),
                    "{text}: broken delta {delta:?}"
                );
                out.push_str(&delta);
            }
            out.push_str(&d.flush(&t));
            assert_eq!(out, text);
        }
    }

    #[test]
    fn chunks_of_tokens_round_trip_too() {
        let t = byte_tokenizer();
        let text = "mixed 😀 text 中文 and more 🎊 end";
        let ids = t.encode(text, false).unwrap().get_ids().to_vec();
        let prompt = t.encode("prompt ", false).unwrap().get_ids().to_vec();
        let mut d = Detokenizer::new(&prompt, None);
        let mut out = String::new();
        for chunk in ids.chunks(3) {
            out.push_str(&d.push(&t, chunk));
        }
        out.push_str(&d.flush(&t));
        assert_eq!(out, text);
    }

    /// The byte tokenizer with two special tokens and one added token that is not special.
    fn tokenizer_with_specials() -> (Tokenizer, [u32; 3]) {
        use tokenizers::AddedToken;
        let mut t = byte_tokenizer();
        t.add_special_tokens([
            AddedToken::from("<s>", true),
            AddedToken::from("</s>", true),
        ])
        .unwrap();
        t.add_tokens([AddedToken::from("<tool>", false)]).unwrap();
        let id = |s: &str| t.token_to_id(s).unwrap();
        let ids = [id("<s>"), id("</s>"), id("<tool>")];
        (t, ids)
    }

    #[test]
    fn special_ids_are_what_decode_skips() {
        let (t, [bos, eos, tool]) = tokenizer_with_specials();
        let special = SpecialIds::of(&t);
        assert!(special.contains(bos) && special.contains(eos));
        assert!(!special.contains(tool));
        for id in 0..t.get_vocab_size(true) as u32 + 10 {
            let skipped = t.decode(&[id], true).unwrap().is_empty()
                && !t.decode(&[id], false).unwrap().is_empty();
            assert_eq!(special.contains(id), skipped, "id {id}");
        }
    }

    #[test]
    fn skipping_special_tokens_gives_decodes_text_in_any_chunks() {
        let (t, [bos, eos, tool]) = tokenizer_with_specials();
        let special = Arc::new(SpecialIds::of(&t));
        let piece = |s: &str| t.encode(s, false).unwrap().get_ids().to_vec();
        let mut ids = vec![bos];
        for (i, text) in ["héllo 👋", " 世界", " plain", "🎉 end"].iter().enumerate() {
            ids.extend(piece(text));
            ids.push([eos, tool, bos][i % 3]);
        }
        let prompt = [piece("prompt "), vec![eos, bos]].concat();
        for skip in [true, false] {
            let want = t.decode(&ids, skip).unwrap();
            for chunk in 1..=5 {
                let mut d = Detokenizer::new(&prompt, skip.then(|| special.clone()));
                let mut out = String::new();
                for c in ids.chunks(chunk) {
                    out.push_str(&d.push(&t, c));
                }
                out.push_str(&d.flush(&t));
                assert_eq!(out, want, "skip {skip}, chunks of {chunk}");
            }
        }
        assert!(!t.decode(&ids, true).unwrap().contains("</s>"));
        assert!(t.decode(&ids, true).unwrap().contains("<tool>"));
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed_lossily() {
        let t = byte_tokenizer();
        let ids = t.encode("ok 👋", false).unwrap().get_ids().to_vec();
        let mut d = Detokenizer::new(&[], None);
        let mut out = d.push(&t, &ids[..ids.len() - 1]);
        assert_eq!(out, "ok ");
        out.push_str(&d.flush(&t));
        assert!(out.starts_with("ok ") && out.ends_with('\u{FFFD}'));
    }
}
