//! [`Tokens`]: one engine step's new tokens for every sequence, worker → gateway.

use zerocopy::byteorder::native_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    MAX_TOP_LOGPROBS, Preamble, RecordKind, U32s, WireError, check_preamble, count_u32, out_of,
    preamble, read_header, write_u32s,
};

/// Why a request finished, as carried in a [`TokenEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Finish {
    /// Still running.
    None = 0,
    /// Max tokens or the context length reached.
    Length = 1,
    /// EOS or a stop token id.
    Stop = 2,
    /// Cancelled by the gateway (acknowledgement; carries no tokens).
    Cancelled = 3,
    /// The worker could not serve the request; see the entry's [`ErrorCode`].
    Error = 4,
}

impl Finish {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::Length,
            2 => Self::Stop,
            3 => Self::Cancelled,
            4 => Self::Error,
            _ => return None,
        })
    }
}

/// Why the worker failed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// No error.
    None = 0,
    /// The submit record could not be decoded.
    CorruptRecord = 1,
    /// The engine refused the request (too long for the context or the KV cache, bad token id, ...).
    Rejected = 2,
    /// A request with this id is already running.
    DuplicateId = 3,
    /// The engine failed.
    Engine = 4,
}

impl ErrorCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::None,
            1 => Self::CorruptRecord,
            2 => Self::Rejected,
            3 => Self::DuplicateId,
            4 => Self::Engine,
            _ => return None,
        })
    }
}

/// Engine gauges carried by every [`Tokens`] record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineGauges {
    /// The engine step this record belongs to.
    pub step: u64,
    /// Sequences running.
    pub running: u32,
    /// Sequences waiting.
    pub waiting: u32,
    /// KV blocks in use.
    pub kv_blocks_used: u32,
    /// KV blocks managed.
    pub kv_blocks_total: u32,
    /// Steps so far whose Tokens record had to wait for room in the response ring.
    pub response_ring_stalls: u32,
}

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct TokensHeader {
    /// `extra`: number of entries.
    preamble: Preamble,
    step: u64,
    running: u32,
    waiting: u32,
    kv_blocks_used: u32,
    kv_blocks_total: u32,
    response_ring_stalls: u32,
    reserved: u32,
}
const _: () = assert!(size_of::<TokensHeader>() == 40);

#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
struct EntryHeader {
    request_id: u64,
    num_tokens: u32,
    finish: u8,
    error: u8,
    /// Top logprobs per token; meaningful only with `has_logprobs`.
    num_top: u8,
    has_logprobs: u8,
    prompt_tokens: u32,
    reserved: u32,
}
const _: () = assert!(size_of::<EntryHeader>() == 24);

/// One request's share of a step, to be written by [`TokensWriter::push`].
#[derive(Debug, Clone, Copy)]
pub struct TokenEntry<'a> {
    pub request_id: u64,
    /// New tokens this step (often one; none for a finish without a token).
    pub tokens: &'a [u32],
    /// For each token: its logprob followed by `num_top` `(id, logprob)` pairs; empty without logprobs.
    pub logprobs: Option<EntryLogprobs<'a>>,
    pub finish: Finish,
    pub error: ErrorCode,
    /// Prompt length, reported in usage.
    pub prompt_tokens: u32,
}

/// Logprobs of an entry's tokens: `chosen[i]` is token `i`'s logprob, `top[i * num_top + j]` its
/// `j`-th alternative.
#[derive(Debug, Clone, Copy)]
pub struct EntryLogprobs<'a> {
    pub num_top: u8,
    pub chosen: &'a [f32],
    pub top: &'a [(u32, f32)],
}

fn entry_len(num_tokens: usize, logprobs: Option<u8>) -> usize {
    let lp = logprobs.map_or(0, |top| num_tokens * (4 + 8 * top as usize));
    (size_of::<EntryHeader>() + 4 * num_tokens + lp).next_multiple_of(8)
}

/// Builds a [`Tokens`] record in place in a caller's buffer (a ring grant).
pub struct TokensWriter<'a> {
    out: &'a mut [u8],
    len: usize,
    entries: u32,
}

impl<'a> TokensWriter<'a> {
    /// Size of a record with no entries.
    pub const HEADER_LEN: usize = size_of::<TokensHeader>();

    /// Bytes an entry with `num_tokens` tokens (and `num_top` top logprobs, if any) takes.
    pub fn entry_len(num_tokens: usize, logprobs: Option<u8>) -> usize {
        entry_len(num_tokens, logprobs)
    }

    /// Starts a record in `out`.
    pub fn new(out: &'a mut [u8], gauges: EngineGauges) -> Result<Self, WireError> {
        let header = TokensHeader {
            preamble: preamble(RecordKind::Tokens, 0),
            step: gauges.step,
            running: gauges.running,
            waiting: gauges.waiting,
            kv_blocks_used: gauges.kv_blocks_used,
            kv_blocks_total: gauges.kv_blocks_total,
            response_ring_stalls: gauges.response_ring_stalls,
            reserved: 0,
        };
        out_of(out, Self::HEADER_LEN)?.copy_from_slice(header.as_bytes());
        Ok(Self {
            out,
            len: Self::HEADER_LEN,
            entries: 0,
        })
    }

    /// Appends one entry.
    pub fn push(&mut self, e: &TokenEntry<'_>) -> Result<(), WireError> {
        let n = e.tokens.len();
        if let Some(lp) = &e.logprobs
            && (lp.chosen.len() != n || lp.top.len() != n * lp.num_top as usize)
        {
            return Err(WireError::Invalid {
                what: "entry logprobs length",
                value: lp.chosen.len() as u64,
            });
        }
        let need = entry_len(n, e.logprobs.map(|l| l.num_top));
        let got = self.out.len() - self.len;
        let out = self
            .out
            .get_mut(self.len..self.len + need)
            .ok_or(WireError::BufferTooSmall { got, need })?;
        out.fill(0);
        let header = EntryHeader {
            request_id: e.request_id,
            num_tokens: count_u32(n, "entry tokens")?,
            finish: e.finish as u8,
            error: e.error as u8,
            num_top: e.logprobs.map_or(0, |l| l.num_top),
            has_logprobs: u8::from(e.logprobs.is_some()),
            prompt_tokens: e.prompt_tokens,
            reserved: 0,
        };
        let (head, rest) = out.split_at_mut(size_of::<EntryHeader>());
        head.copy_from_slice(header.as_bytes());
        let (toks, rest) = rest.split_at_mut(4 * n);
        write_u32s(toks, e.tokens);
        if let Some(lp) = &e.logprobs {
            let mut chunks = rest.chunks_exact_mut(4);
            let top = lp.num_top as usize;
            for (i, chosen) in lp.chosen.iter().enumerate() {
                if let Some(c) = chunks.next() {
                    c.copy_from_slice(&chosen.to_ne_bytes());
                }
                for &(id, l) in &lp.top[i * top..(i + 1) * top] {
                    if let Some(c) = chunks.next() {
                        c.copy_from_slice(&id.to_ne_bytes());
                    }
                    if let Some(c) = chunks.next() {
                        c.copy_from_slice(&l.to_ne_bytes());
                    }
                }
            }
        }
        self.len += need;
        self.entries += 1;
        Ok(())
    }

    /// Finishes the record, returning its length.
    pub fn finish(self) -> usize {
        self.out[4..8].copy_from_slice(&self.entries.to_ne_bytes());
        self.len
    }
}

/// A decoded entry of a [`Tokens`] record, borrowing the record's bytes.
#[derive(Debug, Clone, Copy)]
pub struct TokenEntryRef<'a> {
    pub request_id: u64,
    pub tokens: U32s<'a>,
    pub finish: Finish,
    pub error: ErrorCode,
    pub prompt_tokens: u32,
    /// Logprobs, when the request asked for them.
    pub logprobs: Option<LogprobsRef<'a>>,
}

/// Borrowed logprobs of an entry: for token `i`, [`LogprobsRef::chosen`] and [`LogprobsRef::top`].
#[derive(Debug, Clone, Copy)]
pub struct LogprobsRef<'a> {
    num_top: usize,
    raw: &'a [U32],
}

impl LogprobsRef<'_> {
    /// Alternatives per token.
    pub fn num_top(&self) -> usize {
        self.num_top
    }

    fn stride(&self) -> usize {
        1 + 2 * self.num_top
    }

    /// The logprob of token `i`.
    pub fn chosen(&self, i: usize) -> Option<f32> {
        self.raw
            .get(i * self.stride())
            .map(|v| f32::from_bits(v.get()))
    }

    /// The `(token id, logprob)` alternatives of token `i`, most likely first.
    pub fn top(&self, i: usize) -> impl Iterator<Item = (u32, f32)> + '_ {
        let start = i * self.stride() + 1;
        let end = start + 2 * self.num_top;
        self.raw
            .get(start..end)
            .unwrap_or(&[])
            .chunks_exact(2)
            .map(|p| (p[0].get(), f32::from_bits(p[1].get())))
    }
}

/// Reads [`Tokens`] records.
pub struct Tokens;

impl Tokens {
    /// Decodes a tokens record: checks it whole first, then returns its gauges and calls `each` for
    /// every entry. A corrupt record calls `each` for nothing.
    pub fn decode<'a>(
        bytes: &'a [u8],
        mut each: impl FnMut(TokenEntryRef<'a>),
    ) -> Result<EngineGauges, WireError> {
        let gauges = Self::validate(bytes)?;
        let mut rest = &bytes[size_of::<TokensHeader>()..];
        while let Some((entry, next)) = parse_entry(rest)? {
            each(entry);
            rest = next;
        }
        Ok(gauges)
    }

    fn validate(bytes: &[u8]) -> Result<EngineGauges, WireError> {
        let h: TokensHeader = read_header(bytes, "tokens")?;
        check_preamble(&h.preamble, RecordKind::Tokens)?;
        let mut rest = &bytes[size_of::<TokensHeader>()..];
        for _ in 0..h.preamble.extra {
            match parse_entry(rest)? {
                Some((_, next)) => rest = next,
                None => {
                    return Err(WireError::Truncated {
                        what: "tokens entries",
                        got: bytes.len(),
                        need: bytes.len() + size_of::<EntryHeader>(),
                    });
                }
            }
        }
        if rest.len() >= 8 {
            return Err(WireError::TrailingBytes {
                what: "tokens",
                got: bytes.len(),
                expected: bytes.len() - rest.len(),
            });
        }
        Ok(EngineGauges {
            step: h.step,
            running: h.running,
            waiting: h.waiting,
            kv_blocks_used: h.kv_blocks_used,
            kv_blocks_total: h.kv_blocks_total,
            response_ring_stalls: h.response_ring_stalls,
        })
    }
}

type Parsed<'a> = Option<(TokenEntryRef<'a>, &'a [u8])>;

fn parse_entry(bytes: &[u8]) -> Result<Parsed<'_>, WireError> {
    if bytes.len() < size_of::<EntryHeader>() {
        return Ok(None);
    }
    let h: EntryHeader = read_header(bytes, "tokens entry")?;
    let n = h.num_tokens as usize;
    let finish = Finish::from_u8(h.finish).ok_or(WireError::Invalid {
        what: "entry finish",
        value: u64::from(h.finish),
    })?;
    let error = ErrorCode::from_u8(h.error).ok_or(WireError::Invalid {
        what: "entry error",
        value: u64::from(h.error),
    })?;
    if h.has_logprobs > 1 || u32::from(h.num_top) > MAX_TOP_LOGPROBS {
        return Err(WireError::Invalid {
            what: "entry logprobs",
            value: u64::from(h.num_top),
        });
    }
    let lp = (h.has_logprobs == 1).then_some(h.num_top);
    let total = entry_len(n, lp);
    if bytes.len() < total {
        return Err(WireError::Truncated {
            what: "tokens entry",
            got: bytes.len(),
            need: total,
        });
    }
    let body = &bytes[size_of::<EntryHeader>()..total];
    let (tokens, body) = U32s::split(body, n, "entry tokens")?;
    let logprobs = match lp {
        Some(top) => {
            let words = n * (1 + 2 * top as usize);
            let (raw, _) = U32s::split(body, words, "entry logprobs")?;
            Some(LogprobsRef {
                num_top: top as usize,
                raw: raw.0,
            })
        }
        None => None,
    };
    let entry = TokenEntryRef {
        request_id: h.request_id,
        tokens,
        finish,
        error,
        prompt_tokens: h.prompt_tokens,
        logprobs,
    };
    Ok(Some((entry, &bytes[total..])))
}
