//! Incremental detokenization that never emits a broken UTF-8 sequence.
//!
//! Byte-level tokenizers split multi-byte characters (emoji, CJK) across tokens; decoding such a
//! token alone gives U+FFFD. Following vLLM and TGI, the detokenizer decodes a short window twice —
//! the tokens already emitted (`prefix..read`) and the window with the new tokens (`prefix..`) — and
//! emits the difference only when the window's text does not end in a replacement character, so a
//! character split across tokens is sent once it is complete. The window also keeps
//! SentencePiece-style leading spaces right, since a token is never decoded without its left
//! neighbours.

use tokenizers::Tokenizer;

/// How many prompt tokens seed the window (enough context for leading-space rules).
const PROMPT_CONTEXT: usize = 5;

/// Turns a stream of token ids into a stream of complete UTF-8 text deltas.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
    /// Bytes of the open tokens' text (`read..`) already sent.
    partial: usize,
    /// Leave special tokens (BOS, EOS, chat markers) out of the text.
    skip_special: bool,
}

impl Detokenizer {
    /// A detokenizer for a completion of `prompt` (its last tokens serve as context only);
    /// `skip_special` leaves special tokens out of the text.
    pub fn new(prompt: &[u32], skip_special: bool) -> Self {
        let ctx = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        Self {
            ids: ctx.to_vec(),
            prefix: 0,
            read: ctx.len(),
            partial: 0,
            skip_special,
        }
    }

    /// Adds generated tokens; returns the text they complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, tokens: &[u32]) -> String {
        self.ids.extend_from_slice(tokens);
        let emitted = decode(
            tokenizer,
            self.skip_special,
            &self.ids[self.prefix..self.read],
        );
        let window = decode(tokenizer, self.skip_special, &self.ids[self.prefix..]);
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
        let emitted = decode(
            tokenizer,
            self.skip_special,
            &self.ids[self.prefix..self.read],
        );
        let window = decode(tokenizer, self.skip_special, &self.ids[self.prefix..]);
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

fn decode(tokenizer: &Tokenizer, skip_special: bool, ids: &[u32]) -> String {
    tokenizer.decode(ids, skip_special).unwrap_or_default()
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
            let mut d = Detokenizer::new(&[], false);
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
        let mut d = Detokenizer::new(&prompt, false);
        let mut out = String::new();
        for chunk in ids.chunks(3) {
            out.push_str(&d.push(&t, chunk));
        }
        out.push_str(&d.flush(&t));
        assert_eq!(out, text);
    }

    #[test]
    fn an_incomplete_character_at_the_end_is_flushed_lossily() {
        let t = byte_tokenizer();
        let ids = t.encode("ok 👋", false).unwrap().get_ids().to_vec();
        let mut d = Detokenizer::new(&[], false);
        let mut out = d.push(&t, &ids[..ids.len() - 1]);
        assert_eq!(out, "ok ");
        out.push_str(&d.flush(&t));
        assert!(out.starts_with("ok ") && out.ends_with('\u{FFFD}'));
    }
}
