//! The shared-memory wire records exchanged between the gateway and a worker.
//!
//! Every record payload starts with the same 8 bytes — `version: u16`, `kind: u16`, then a `u32`
//! whose meaning depends on the kind — followed by a fixed `#[repr(C)]` header and, for some kinds,
//! arrays of native-endian `u32`/`f32`. Layouts are asserted at compile time. Records are built
//! straight into a ring's write grant ([`Submit::encode`], [`TokensWriter`]) and decoded from a
//! borrowed ring slice; the bytes come from another process, so decoding checks the version, the kind
//! and every count against the slice's length, and returns a [`WireError`] instead of panicking.
//!
//! Direction: gateway → worker carries [`Submit`], [`Cancel`] and [`Release`] (a draining worker
//! may leave); worker → gateway carries [`Hello`] (once, when the worker is ready), one [`Tokens`]
//! record per engine step, and [`Draining`] (once, when it was told to leave).
//!
//! Version history: 2 → 3 added [`Draining`] and [`Release`]. A peer of another version is refused
//! at its first record ([`WireError::Version`] names both), never misread.

use thiserror::Error;
use zerocopy::byteorder::native_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The layout version written into every record; a record with another version is rejected.
pub const WIRE_VERSION: u16 = 3;

/// Largest number of top logprobs a request may ask for per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// What a record is. Also used as the ring record's `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum RecordKind {
    /// Worker → gateway: the worker is ready; describes its engine.
    Hello = 1,
    /// Gateway → worker: a new request.
    Submit = 2,
    /// Gateway → worker: stop a request and free its memory.
    Cancel = 3,
    /// Worker → gateway: one engine step's new tokens for every sequence, plus engine gauges.
    Tokens = 4,
    /// Worker → gateway: the worker is draining; route it nothing new.
    Draining = 5,
    /// Gateway → worker: nothing more will come; a draining worker may exit once idle.
    Release = 6,
}

impl RecordKind {
    /// The kind for a raw value, if any.
    pub fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::Hello),
            2 => Some(Self::Submit),
            3 => Some(Self::Cancel),
            4 => Some(Self::Tokens),
            5 => Some(Self::Draining),
            6 => Some(Self::Release),
            _ => None,
        }
    }
}

/// A record could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The record is shorter than its header or its counts say.
    #[error("{what}: record is {got} bytes, needs {need}")]
    Truncated {
        what: &'static str,
        got: usize,
        need: usize,
    },
    /// The record is longer than its header and counts say (beyond 8-byte padding).
    #[error("{what}: record is {got} bytes, expected {expected}")]
    TrailingBytes {
        what: &'static str,
        got: usize,
        expected: usize,
    },
    /// The record was written with another layout version.
    #[error("record version {got}, this build speaks {WIRE_VERSION}")]
    Version { got: u16 },
    /// The record's kind is not the one expected, or unknown.
    #[error("record kind {got}, expected {expected:?}")]
    Kind { got: u16, expected: RecordKind },
    /// A field holds an impossible value.
    #[error("{what}: invalid value {value}")]
    Invalid { what: &'static str, value: u64 },
    /// The output buffer is too small for the record.
    #[error("buffer of {got} bytes is too small for a {need}-byte record")]
    BufferTooSmall { got: usize, need: usize },
}

/// The first 8 bytes of every record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Preamble {
    /// [`WIRE_VERSION`].
    pub version: u16,
    /// A [`RecordKind`].
    pub kind: u16,
    /// Kind-specific.
    pub extra: u32,
}
const _: () = assert!(size_of::<Preamble>() == 8);

/// Reads the kind of a record after checking its version.
pub fn peek_kind(bytes: &[u8]) -> Result<RecordKind, WireError> {
    let (p, _) = Preamble::read_from_prefix(bytes).map_err(|_| WireError::Truncated {
        what: "record preamble",
        got: bytes.len(),
        need: size_of::<Preamble>(),
    })?;
    if p.version != WIRE_VERSION {
        return Err(WireError::Version { got: p.version });
    }
    RecordKind::from_u16(p.kind).ok_or(WireError::Invalid {
        what: "record kind",
        value: u64::from(p.kind),
    })
}

fn preamble(kind: RecordKind, extra: u32) -> Preamble {
    Preamble {
        version: WIRE_VERSION,
        kind: kind as u16,
        extra,
    }
}

fn check_preamble(p: &Preamble, expected: RecordKind) -> Result<(), WireError> {
    if p.version != WIRE_VERSION {
        return Err(WireError::Version { got: p.version });
    }
    if p.kind != expected as u16 {
        return Err(WireError::Kind {
            got: p.kind,
            expected,
        });
    }
    Ok(())
}

/// Reads a fixed header from the front of `bytes`.
fn read_header<T: FromBytes>(bytes: &[u8], what: &'static str) -> Result<T, WireError> {
    T::read_from_prefix(bytes)
        .map(|(h, _)| h)
        .map_err(|_| WireError::Truncated {
            what,
            got: bytes.len(),
            need: size_of::<T>(),
        })
}

/// A record of `need` bytes may be followed by at most 7 bytes of alignment padding.
fn check_exact(bytes: &[u8], need: usize, what: &'static str) -> Result<(), WireError> {
    if bytes.len() < need {
        return Err(WireError::Truncated {
            what,
            got: bytes.len(),
            need,
        });
    }
    if bytes.len() > need.next_multiple_of(8) {
        return Err(WireError::TrailingBytes {
            what,
            got: bytes.len(),
            expected: need,
        });
    }
    Ok(())
}

fn out_of(out: &mut [u8], need: usize) -> Result<&mut [u8], WireError> {
    let got = out.len();
    out.get_mut(..need)
        .ok_or(WireError::BufferTooSmall { got, need })
}

fn write_u32s(out: &mut [u8], values: &[u32]) {
    for (chunk, v) in out.chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
}

/// A borrowed array of native-endian `u32` inside a record (alignment 1, so any slice works).
#[derive(Debug, Clone, Copy)]
pub struct U32s<'a>(&'a [U32]);

impl<'a> U32s<'a> {
    fn split(bytes: &'a [u8], n: usize, what: &'static str) -> Result<(Self, &'a [u8]), WireError> {
        let (arr, rest) =
            <[U32]>::ref_from_prefix_with_elems(bytes, n).map_err(|_| WireError::Truncated {
                what,
                got: bytes.len(),
                need: n.saturating_mul(4),
            })?;
        Ok((Self(arr), rest))
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u32> + 'a {
        self.0.iter().map(|v| v.get())
    }

    /// The values, copied.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Hello

/// Worker → gateway, once: the worker is attached, its model loaded and its engine ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Hello {
    preamble: Preamble,
    /// The worker's process id.
    pub pid: u32,
    /// KV blocks the engine manages (the null block included).
    pub num_kv_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Longest prompt + completion the engine accepts.
    pub max_model_len: u32,
    /// The model's vocabulary size.
    pub vocab_size: u32,
    /// Most sequences the engine runs at once.
    pub max_num_seqs: u32,
}
const _: () = assert!(size_of::<Hello>() == 32);

/// The engine facts a worker announces in its [`Hello`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloInfo {
    pub pid: u32,
    pub num_kv_blocks: u32,
    pub block_size: u32,
    pub max_model_len: u32,
    pub vocab_size: u32,
    pub max_num_seqs: u32,
}

impl Hello {
    /// Encoded size.
    pub const LEN: usize = size_of::<Hello>();

    /// A hello record.
    pub fn new(info: HelloInfo) -> Self {
        Self {
            preamble: preamble(RecordKind::Hello, 0),
            pid: info.pid,
            num_kv_blocks: info.num_kv_blocks,
            block_size: info.block_size,
            max_model_len: info.max_model_len,
            vocab_size: info.vocab_size,
            max_num_seqs: info.max_num_seqs,
        }
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        out_of(out, Self::LEN)?.copy_from_slice(self.as_bytes());
        Ok(Self::LEN)
    }

    /// Decodes and checks a hello record.
    pub fn decode(bytes: &[u8]) -> Result<HelloInfo, WireError> {
        let h: Hello = read_header(bytes, "hello")?;
        check_preamble(&h.preamble, RecordKind::Hello)?;
        check_exact(bytes, Self::LEN, "hello")?;
        if h.block_size == 0 {
            return Err(WireError::Invalid {
                what: "hello block_size",
                value: 0,
            });
        }
        Ok(HelloInfo {
            pid: h.pid,
            num_kv_blocks: h.num_kv_blocks,
            block_size: h.block_size,
            max_model_len: h.max_model_len,
            vocab_size: h.vocab_size,
            max_num_seqs: h.max_num_seqs,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Submit

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
}
const _: () = assert!(size_of::<SubmitHeader>() == 72);

const SUBMIT_IGNORE_EOS: u32 = 1;

/// Gateway → worker: a new request. Encoded as a fixed header, the stop token ids, then the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Submit {
    /// The gateway's id for the request (unique per worker while in flight).
    pub request_id: u64,
    pub sampling: SamplingWire,
    /// Tokens to generate at most (at least 1).
    pub max_tokens: u32,
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
}

impl Submit {
    /// The encoded size of a submit with these counts.
    pub fn encoded_len_for(num_stop: usize, num_prompt: usize) -> usize {
        size_of::<SubmitHeader>() + 4 * (num_stop + num_prompt)
    }

    /// The encoded size of this record.
    pub fn encoded_len(&self) -> usize {
        Self::encoded_len_for(self.stop_token_ids.len(), self.prompt.len())
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let need = self.encoded_len();
        let out = out_of(out, need)?;
        let s = &self.sampling;
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
        };
        let (head, rest) = out.split_at_mut(size_of::<SubmitHeader>());
        head.copy_from_slice(header.as_bytes());
        let (stops, prompt) = rest.split_at_mut(4 * self.stop_token_ids.len());
        write_u32s(stops, &self.stop_token_ids);
        write_u32s(prompt, &self.prompt);
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
        check_exact(bytes, Self::encoded_len_for(n_stop, n_prompt), "submit")?;
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
        let (prompt, _) = U32s::split(rest, n_prompt, "submit prompt")?;
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
            logprobs: h.logprobs,
            ignore_eos: h.preamble.extra & SUBMIT_IGNORE_EOS != 0,
            stop_token_ids: stops.to_vec(),
            prompt: prompt.to_vec(),
            prior_output_len: h.prior_output_len,
        })
    }
}

fn count_u32(n: usize, what: &'static str) -> Result<u32, WireError> {
    u32::try_from(n).map_err(|_| WireError::Invalid {
        what,
        value: n as u64,
    })
}

// ---------------------------------------------------------------------------------------------
// Cancel

/// Gateway → worker: stop the request and free its KV blocks now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Cancel {
    preamble: Preamble,
    /// The request to stop.
    pub request_id: u64,
}
const _: () = assert!(size_of::<Cancel>() == 16);

impl Cancel {
    /// Encoded size.
    pub const LEN: usize = size_of::<Cancel>();

    /// A cancel record for `request_id`.
    pub fn new(request_id: u64) -> Self {
        Self {
            preamble: preamble(RecordKind::Cancel, 0),
            request_id,
        }
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        out_of(out, Self::LEN)?.copy_from_slice(self.as_bytes());
        Ok(Self::LEN)
    }

    /// Decodes and checks a cancel record, returning the request id.
    pub fn decode(bytes: &[u8]) -> Result<u64, WireError> {
        let c: Cancel = read_header(bytes, "cancel")?;
        check_preamble(&c.preamble, RecordKind::Cancel)?;
        check_exact(bytes, Self::LEN, "cancel")?;
        Ok(c.request_id)
    }
}

// ---------------------------------------------------------------------------------------------
// Draining and Release

/// Worker → gateway: the worker was asked to leave (SIGTERM). It keeps serving what it has and
/// what is already on its way, and exits once the gateway's [`Release`] came and it is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Draining {
    preamble: Preamble,
}
const _: () = assert!(size_of::<Draining>() == 8);

impl Draining {
    /// Encoded size.
    pub const LEN: usize = size_of::<Draining>();

    /// A draining record.
    pub fn new() -> Self {
        Self {
            preamble: preamble(RecordKind::Draining, 0),
        }
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        out_of(out, Self::LEN)?.copy_from_slice(self.as_bytes());
        Ok(Self::LEN)
    }

    /// Decodes and checks a draining record.
    pub fn decode(bytes: &[u8]) -> Result<(), WireError> {
        let d: Draining = read_header(bytes, "draining")?;
        check_preamble(&d.preamble, RecordKind::Draining)?;
        check_exact(bytes, Self::LEN, "draining")
    }
}

impl Default for Draining {
    fn default() -> Self {
        Self::new()
    }
}

/// Gateway → worker: the gateway routes nothing more to this draining worker and every request
/// it sent has ended on the gateway's side; the worker exits once its engine is idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Release {
    preamble: Preamble,
}
const _: () = assert!(size_of::<Release>() == 8);

impl Release {
    /// Encoded size.
    pub const LEN: usize = size_of::<Release>();

    /// A release record.
    pub fn new() -> Self {
        Self {
            preamble: preamble(RecordKind::Release, 0),
        }
    }

    /// Writes the record into `out`, returning its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        out_of(out, Self::LEN)?.copy_from_slice(self.as_bytes());
        Ok(Self::LEN)
    }

    /// Decodes and checks a release record.
    pub fn decode(bytes: &[u8]) -> Result<(), WireError> {
        let r: Release = read_header(bytes, "release")?;
        check_preamble(&r.preamble, RecordKind::Release)?;
        check_exact(bytes, Self::LEN, "release")
    }
}

impl Default for Release {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens

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

#[cfg(test)]
mod tests {
    use super::*;

    fn submit() -> Submit {
        Submit {
            request_id: 42,
            sampling: SamplingWire {
                temperature: 0.7,
                top_k: 5,
                seed: 9,
                ..SamplingWire::default()
            },
            max_tokens: 16,
            logprobs: 2,
            ignore_eos: true,
            stop_token_ids: vec![2, 3],
            prompt: vec![1, 100, 200, 300],
            prior_output_len: 1,
        }
    }

    #[test]
    fn submit_prior_output_longer_than_the_prompt_is_rejected() {
        let s = submit();
        let mut buf = vec![0u8; s.encoded_len()];
        s.encode(&mut buf).unwrap();
        // prior_output_len lives at byte 68.
        buf[68..72].copy_from_slice(&5u32.to_ne_bytes());
        assert!(matches!(
            Submit::decode(&buf),
            Err(WireError::Invalid {
                what: "submit prior_output_len",
                value: 5
            })
        ));
        buf[68..72].copy_from_slice(&4u32.to_ne_bytes());
        assert_eq!(Submit::decode(&buf).unwrap().prior_output_len, 4);
    }

    #[test]
    fn submit_round_trips() {
        let s = submit();
        let mut buf = vec![0u8; s.encoded_len() + 8];
        let n = s.encode(&mut buf).unwrap();
        assert_eq!(n, s.encoded_len());
        assert_eq!(peek_kind(&buf[..n]).unwrap(), RecordKind::Submit);
        assert_eq!(Submit::decode(&buf[..n]).unwrap(), s);
        // 8-byte padding after the record is tolerated, more is not.
        assert_eq!(Submit::decode(&buf[..n.next_multiple_of(8)]).unwrap(), s);
        assert!(Submit::decode(&buf[..n + 8]).is_err());
    }

    #[test]
    fn draining_and_release_round_trip_and_check_their_kind() {
        let mut buf = [0u8; 16];
        assert_eq!(Draining::new().encode(&mut buf).unwrap(), Draining::LEN);
        assert_eq!(peek_kind(&buf[..8]).unwrap(), RecordKind::Draining);
        Draining::decode(&buf[..8]).unwrap();
        assert!(matches!(
            Release::decode(&buf[..8]),
            Err(WireError::Kind { got: 5, .. })
        ));
        assert_eq!(Release::new().encode(&mut buf).unwrap(), Release::LEN);
        assert_eq!(peek_kind(&buf[..8]).unwrap(), RecordKind::Release);
        Release::decode(&buf[..8]).unwrap();
        assert!(Release::decode(&buf[..4]).is_err());
        assert!(Release::decode(&buf[..16]).is_err());
        // A record of the previous layout version is refused, naming it.
        buf[0..2].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(
            Release::decode(&buf[..8]),
            Err(WireError::Version { got: 2 })
        );
        assert_eq!(peek_kind(&buf[..8]), Err(WireError::Version { got: 2 }));
    }

    #[test]
    fn every_truncation_of_a_submit_is_an_error() {
        let s = submit();
        let mut buf = vec![0u8; s.encoded_len()];
        s.encode(&mut buf).unwrap();
        for len in 0..buf.len() {
            assert!(Submit::decode(&buf[..len]).is_err(), "len {len}");
        }
        assert_eq!(Submit::peek_request_id(&buf[..20]), Some(42));
        assert_eq!(Submit::peek_request_id(&buf[..10]), None);
    }

    #[test]
    fn submit_with_huge_counts_is_rejected_not_allocated() {
        let s = submit();
        let mut buf = vec![0u8; s.encoded_len()];
        s.encode(&mut buf).unwrap();
        // num_prompt_tokens lives at byte 64.
        buf[64..68].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(matches!(
            Submit::decode(&buf),
            Err(WireError::Truncated { .. })
        ));
    }

    #[test]
    fn wrong_version_and_kind_are_typed_errors() {
        let mut buf = vec![0u8; Cancel::LEN];
        Cancel::new(7).encode(&mut buf).unwrap();
        assert_eq!(Cancel::decode(&buf).unwrap(), 7);
        assert!(matches!(
            Submit::decode(&buf),
            Err(WireError::Truncated { .. }) | Err(WireError::Kind { .. })
        ));
        buf[0] = 99;
        assert!(matches!(
            Cancel::decode(&buf),
            Err(WireError::Version { .. })
        ));
    }

    #[test]
    fn hello_round_trips() {
        let info = HelloInfo {
            pid: 1,
            num_kv_blocks: 100,
            block_size: 16,
            max_model_len: 512,
            vocab_size: 512,
            max_num_seqs: 8,
        };
        let mut buf = [0u8; Hello::LEN];
        Hello::new(info).encode(&mut buf).unwrap();
        assert_eq!(Hello::decode(&buf).unwrap(), info);
    }

    fn tokens_record() -> (Vec<u8>, usize) {
        let mut buf = vec![0u8; 1024];
        let gauges = EngineGauges {
            step: 3,
            running: 2,
            waiting: 1,
            kv_blocks_used: 5,
            kv_blocks_total: 64,
            response_ring_stalls: 0,
        };
        let mut w = TokensWriter::new(&mut buf, gauges).unwrap();
        w.push(&TokenEntry {
            request_id: 1,
            tokens: &[10, 11, 12],
            logprobs: None,
            finish: Finish::None,
            error: ErrorCode::None,
            prompt_tokens: 4,
        })
        .unwrap();
        w.push(&TokenEntry {
            request_id: 2,
            tokens: &[20],
            logprobs: Some(EntryLogprobs {
                num_top: 2,
                chosen: &[-0.5],
                top: &[(20, -0.5), (21, -1.5)],
            }),
            finish: Finish::Length,
            error: ErrorCode::None,
            prompt_tokens: 7,
        })
        .unwrap();
        let n = w.finish();
        (buf, n)
    }

    #[test]
    fn tokens_round_trip() {
        let (buf, n) = tokens_record();
        let mut seen = Vec::new();
        let g = Tokens::decode(&buf[..n], |e| {
            let lp = e
                .logprobs
                .map(|l| (l.chosen(0), l.top(0).collect::<Vec<_>>()));
            seen.push((
                e.request_id,
                e.tokens.to_vec(),
                e.finish,
                e.prompt_tokens,
                lp,
            ));
        })
        .unwrap();
        assert_eq!(g.step, 3);
        assert_eq!(g.kv_blocks_used, 5);
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].1, vec![10, 11, 12]);
        assert_eq!(seen[0].4, None);
        assert_eq!(seen[1].2, Finish::Length);
        assert_eq!(seen[1].4, Some((Some(-0.5), vec![(20, -0.5), (21, -1.5)])));
    }

    #[test]
    fn corrupt_tokens_records_are_errors_and_deliver_nothing() {
        let (buf, n) = tokens_record();
        for len in 0..n {
            let mut calls = 0;
            let r = Tokens::decode(&buf[..len], |_| calls += 1);
            assert!(r.is_err(), "len {len}");
            assert_eq!(calls, 0);
        }
        // Flip every byte in turn: never a panic, and an error never delivers entries.
        for i in 0..n {
            let mut b = buf[..n].to_vec();
            b[i] ^= 0xA5;
            let mut calls = 0;
            if Tokens::decode(&b, |_| calls += 1).is_err() {
                assert_eq!(calls, 0);
            }
        }
    }

    #[test]
    fn writer_reports_a_small_buffer() {
        let mut buf = vec![0u8; TokensWriter::HEADER_LEN + 8];
        let mut w = TokensWriter::new(&mut buf, EngineGauges::default()).unwrap();
        let r = w.push(&TokenEntry {
            request_id: 1,
            tokens: &[1, 2, 3],
            logprobs: None,
            finish: Finish::None,
            error: ErrorCode::None,
            prompt_tokens: 1,
        });
        assert!(matches!(r, Err(WireError::BufferTooSmall { .. })));
    }
}
