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
//! One file a record: `hello.rs`, `submit.rs`, `control.rs` (cancel, draining, release),
//! `tokens.rs`; this file holds the preamble, the errors and the checks they share.
//!
//! Version history: 2 → 3 added [`Draining`] and [`Release`]; 3 → 4 `min_tokens`; 4 → 5 a
//! [`Submit`]'s grammar ([`GrammarWire`]). A peer of another version is refused
//! at its first record ([`WireError::Version`] names both), never misread.

use thiserror::Error;
use zerocopy::byteorder::native_endian::U32;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

mod control;
mod hello;
mod submit;
#[cfg(test)]
mod tests;
mod tokens;

pub use control::{Cancel, Draining, Release};
pub use hello::{Hello, HelloInfo};
pub use submit::{GrammarWire, SamplingWire, Submit};
pub use tokens::{
    EngineGauges, EntryLogprobs, ErrorCode, Finish, LogprobsRef, TokenEntry, TokenEntryRef, Tokens,
    TokensWriter,
};

/// The layout version written into every record; a record with another version is rejected.
pub const WIRE_VERSION: u16 = 5;

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

fn count_u32(n: usize, what: &'static str) -> Result<u32, WireError> {
    u32::try_from(n).map_err(|_| WireError::Invalid {
        what,
        value: n as u64,
    })
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
