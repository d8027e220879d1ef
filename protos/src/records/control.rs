//! [`Cancel`], [`Draining`] and [`Release`]: the fixed-size control records.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{
    Preamble, RecordKind, WireError, check_exact, check_preamble, out_of, preamble, read_header,
};

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
