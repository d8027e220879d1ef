//! [`Submit`]: a new request, gateway → worker.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    MAX_TOP_LOGPROBS, Preamble, RecordKind, U32s, WireError, check_exact, check_preamble,
    count_u32, out_of, preamble, read_header, write_u32s,
};

/// Sampling settings carried by a [`Submit`], with the engine's meaning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingWire {
    /// 0 is greedy.
    pub temperature: f32,
    /// In (0, 1].
    pub top_p: f32,
    /// 0 means no limit.
    pub top_k: u32,
    /// In [0, 1].
    pub min_p: f32,
    /// 1.0 means none.
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingWire {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct SubmitHeader {
    /// `extra`: flags ([`SUBMIT_IGNORE_EOS`]).
    preamble: Preamble,
    request_id: u64,
    seed: u64,
    temperature: f32,
    top_p: f32,
    top_k: u32,
    min_p: f32,
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
    max_tokens: u32,
    logprobs: u32,
    num_stop_token_ids: u32,
    num_prompt_tokens: u32,
    prior_output_len: u32,
    min_tokens: u32,
    /// 0: no grammar; else [`GrammarWire::kind`].
    grammar_kind: u32,
    grammar_len: u32,
    reserved: u32,
}
const _: () = assert!(size_of::<SubmitHeader>() == 88);

const SUBMIT_IGNORE_EOS: u32 = 1;

/// A structured-output grammar as the wire carries it: a kind and its UTF-8 source, both opaque
/// here (the `grammar` crate gives them meaning and checks them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarWire {
    /// Not 0.
    pub kind: u32,
    pub text: String,
}

/// Gateway → worker: a new request. Encoded as a fixed header, the stop token ids, the prompt, then
/// the grammar's source bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Submit {
    /// The gateway's id for the request (unique per worker while in flight).
    pub request_id: u64,
    pub sampling: SamplingWire,
    /// Tokens to generate at most (at least 1).
    pub max_tokens: u32,
    /// Output tokens before which EOS and the stop token ids may not be sampled (a resumed
    /// request's earlier output counts). At most `max_tokens + prior_output_len`.
    pub min_tokens: u32,
    /// Top logprobs per generated token (0: none; at most [`MAX_TOP_LOGPROBS`]).
    pub logprobs: u32,
    /// Keep going after EOS.
    pub ignore_eos: bool,
    /// Finish after generating one of these.
    pub stop_token_ids: Vec<u32>,
    /// The prompt (not empty).
    pub prompt: Vec<u32>,
    /// A resumed request (failover): the last `prior_output_len` prompt tokens are its own earlier
    /// output, so penalties count them and seeded sampling continues at that index. At most the
    /// prompt's length.
    pub prior_output_len: u32,
    /// Structured output: the grammar the output must match.
    pub grammar: Option<GrammarWire>,
}

impl Submit {
    /// The encoded size of a submit with these counts (the grammar's source in bytes).
    pub fn encoded_len_for(num_stop: usize, num_prompt: usize, grammar_len: usize) -> usize {
        size_of::<SubmitHeader>() + 4 * (num_stop + num_prompt) + grammar_len
    }

    /// The encoded size of this record.
    pub fn encoded_len(&self) -> usize {
        Self::encoded_len_for(
            self.stop_token_ids.len(),
            self.prompt.len(),
            self.grammar.as_ref().map_or(0, |g| g.text.len()),
        )
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let need = self.encoded_len();
        let out = out_of(out, need)?;
        let s = &self.sampling;
        let (grammar_kind, grammar_text) = match &self.grammar {
            Some(g) if g.kind == 0 => {
                return Err(WireError::Invalid {
                    what: "submit grammar kind",
                    value: 0,
                });
            }
            Some(g) => (g.kind, g.text.as_bytes()),
            None => (0, &[][..]),
        };
        let header = SubmitHeader {
            preamble: preamble(
                RecordKind::Submit,
                if self.ignore_eos {
                    SUBMIT_IGNORE_EOS
                } else {
                    0
                },
            ),
            request_id: self.request_id,
            seed: s.seed,
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            min_p: s.min_p,
            repetition_penalty: s.repetition_penalty,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            max_tokens: self.max_tokens,
            logprobs: self.logprobs,
            num_stop_token_ids: count_u32(self.stop_token_ids.len(), "stop_token_ids")?,
            num_prompt_tokens: count_u32(self.prompt.len(), "prompt")?,
            prior_output_len: self.prior_output_len,
            min_tokens: self.min_tokens,
            grammar_kind,
            grammar_len: count_u32(grammar_text.len(), "grammar")?,
            reserved: 0,
        };
        let (head, rest) = out.split_at_mut(size_of::<SubmitHeader>());
        head.copy_from_slice(header.as_bytes());
        let (stops, rest) = rest.split_at_mut(4 * self.stop_token_ids.len());
        write_u32s(stops, &self.stop_token_ids);
        let (prompt, grammar) = rest.split_at_mut(4 * self.prompt.len());
        write_u32s(prompt, &self.prompt);
        grammar.copy_from_slice(grammar_text);
        Ok(need)
    }

    /// The request id of a submit record whose body may be corrupt, so the worker can fail just
    /// that request. `None` when even the id cannot be read.
    pub fn peek_request_id(bytes: &[u8]) -> Option<u64> {
        read_header::<SubmitHeader>(bytes, "submit")
            .ok()
            .map(|h| h.request_id)
            .or_else(|| {
                let id = bytes.get(8..16)?;
                Some(u64::from_ne_bytes(id.try_into().ok()?))
            })
    }

    /// Decodes and checks a submit record.
    pub fn decode(bytes: &[u8]) -> Result<Submit, WireError> {
        let h: SubmitHeader = read_header(bytes, "submit")?;
        check_preamble(&h.preamble, RecordKind::Submit)?;
        let (n_stop, n_prompt) = (h.num_stop_token_ids as usize, h.num_prompt_tokens as usize);
        let n_grammar = h.grammar_len as usize;
        check_exact(
            bytes,
            Self::encoded_len_for(n_stop, n_prompt, n_grammar),
            "submit",
        )?;
        if h.grammar_kind == 0 && n_grammar != 0 {
            return Err(WireError::Invalid {
                what: "submit grammar_len without a grammar kind",
                value: u64::from(h.grammar_len),
            });
        }
        if n_prompt == 0 {
            return Err(WireError::Invalid {
                what: "submit num_prompt_tokens",
                value: 0,
            });
        }
        if h.prior_output_len > h.num_prompt_tokens {
            return Err(WireError::Invalid {
                what: "submit prior_output_len",
                value: u64::from(h.prior_output_len),
            });
        }
        if h.max_tokens == 0 {
            return Err(WireError::Invalid {
                what: "submit max_tokens",
                value: 0,
            });
        }
        if h.reserved != 0 {
            return Err(WireError::Invalid {
                what: "submit reserved",
                value: u64::from(h.reserved),
            });
        }
        if u64::from(h.min_tokens) > u64::from(h.max_tokens) + u64::from(h.prior_output_len) {
            return Err(WireError::Invalid {
                what: "submit min_tokens",
                value: u64::from(h.min_tokens),
            });
        }
        if h.logprobs > MAX_TOP_LOGPROBS {
            return Err(WireError::Invalid {
                what: "submit logprobs",
                value: u64::from(h.logprobs),
            });
        }
        if h.preamble.extra & !SUBMIT_IGNORE_EOS != 0 {
            return Err(WireError::Invalid {
                what: "submit flags",
                value: u64::from(h.preamble.extra),
            });
        }
        let rest = &bytes[size_of::<SubmitHeader>()..];
        let (stops, rest) = U32s::split(rest, n_stop, "submit stop_token_ids")?;
        let (prompt, rest) = U32s::split(rest, n_prompt, "submit prompt")?;
        let grammar = match h.grammar_kind {
            0 => None,
            kind => {
                let text = rest.get(..n_grammar).ok_or(WireError::Truncated {
                    what: "submit grammar",
                    got: rest.len(),
                    need: n_grammar,
                })?;
                let text = std::str::from_utf8(text).map_err(|e| WireError::Invalid {
                    what: "submit grammar (not UTF-8) at byte",
                    value: e.valid_up_to() as u64,
                })?;
                Some(GrammarWire {
                    kind,
                    text: text.to_owned(),
                })
            }
        };
        Ok(Submit {
            request_id: h.request_id,
            sampling: SamplingWire {
                temperature: h.temperature,
                top_p: h.top_p,
                top_k: h.top_k,
                min_p: h.min_p,
                repetition_penalty: h.repetition_penalty,
                frequency_penalty: h.frequency_penalty,
                presence_penalty: h.presence_penalty,
                seed: h.seed,
            },
            max_tokens: h.max_tokens,
            min_tokens: h.min_tokens,
            logprobs: h.logprobs,
            ignore_eos: h.preamble.extra & SUBMIT_IGNORE_EOS != 0,
            stop_token_ids: stops.to_vec(),
            prompt: prompt.to_vec(),
            prior_output_len: h.prior_output_len,
            grammar,
        })
    }
}
