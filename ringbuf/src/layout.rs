//! The segment layout shared by two processes: `#[repr(C)]` throughout, every offset asserted at
//! compile time.
//!
//! ```text
//! offset  size  block (each a CachePadded, 128-byte aligned)   written by
//!      0   128  meta: magic u64, version u32, poisoned u32,    creator (poisoned: either side)
//!                     capacity u64, epoch u64, creator u64
//!    128   128  producer hot: tail u64, cached head u64        producer
//!    256   128  consumer hot: head u64, unused u64             consumer
//!    384   128  producer side: owner u64, heartbeat u64,       producer
//!                     sleeping u32, doorbell u32, flags u32
//!    512   128  consumer side: owner u64, heartbeat u64,       consumer
//!                     sleeping u32, doorbell u32, flags u32
//!    640        (unused up to DATA_OFFSET)
//!   4096   cap  data: records [len u32][kind u16][flags u16][payload][pad to 8], then a zero word
//! ```
//!
//! Words written by the producer and words written by the consumer sit in different 128-byte blocks,
//! so the adjacent-line prefetcher never pairs one side's line with the other's.
//!
//! The consumer learns of new records from the data area itself, not from the producer's tail: a
//! record header is never zero ([`LIVE_BIT`]), the producer keeps a zero word (the terminator)
//! where its next header will go, and a publish stores the zero after its last record before it
//! stores its first header with `Release`. So a consumer that has caught up polls the line its next
//! record arrives in, and a small record hands it one cache line, not two. The tail is still
//! published (after the header), for a producer that takes the role over and for the waits.

use crate::sync::{AtomicU32, AtomicU64};
use crossbeam_utils::CachePadded;

/// `"RSRING"` + two zero bytes, little-endian: identifies a ringserve ring segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RSRING\0\0");
/// Layout version; bump on any change to this file or to the record format. 2: runs. 3: headers
/// carry [`LIVE_BIT`] and the consumer polls them (the terminator word after the last record).
pub const VERSION: u32 = 3;
/// Offset of the data area from the start of the segment (one page).
pub const DATA_OFFSET: usize = 4096;
/// Smallest capacity of a shared-memory ring.
pub const MIN_CAPACITY: usize = 4096;
/// Largest capacity of any ring.
pub const MAX_CAPACITY: usize = 1 << 30;
/// Smallest capacity of a heap ring (for tests and models).
pub const MIN_HEAP_CAPACITY: usize = 32;
/// Size of a record header: `[len u32][kind u16][flags u16]`.
pub const RECORD_HEADER: usize = 8;
/// Bit 29 of `len` is set in every record header, so that no header is zero: a zero word at the
/// consumer's head is the terminator (no record yet). Payloads stay below 2^29 bytes.
pub const LIVE_BIT: u32 = 1 << 29;
/// Bit 31 of `len` marks a padding record that fills the data area up to the wrap.
pub(crate) const PAD_BIT: u32 = 1 << 31;
/// Bit 30 of `len` marks a run: `flags` (2 or more) records of `len` payload bytes, kind `kind`
/// and flags 0, one after another at 8-byte strides behind the one header. A batch writes equal
/// records this way, so their headers and per-record checks are paid once per run.
pub(crate) const RUN_BIT: u32 = 1 << 30;
/// Most records one run holds (its count lives in the 16-bit `flags` field).
pub(crate) const MAX_RUN: u64 = u16::MAX as u64;
/// Positions never exceed this (2^62 bytes: decades at any rate), so sums of positions cannot overflow.
pub(crate) const MAX_POSITION: u64 = 1 << 62;

/// Immutable-after-creation facts about the segment (plus the poison flag).
#[repr(C)]
pub struct Meta {
    /// [`MAGIC`], written by the creator just before `version`.
    pub magic: AtomicU64,
    /// [`VERSION`], written last by the creator with `Release`; zero while initialising.
    pub version: AtomicU32,
    /// Non-zero once either side has found the ring corrupt.
    pub poisoned: AtomicU32,
    /// Data-area capacity in bytes (a power of two).
    pub capacity: AtomicU64,
    /// Random value chosen at creation; also part of the segment's name.
    pub epoch: AtomicU64,
    /// The creator's owner word (pid and start time, see `liveness`).
    pub creator: AtomicU64,
}

/// A side's position and its cached copy of the peer's position.
#[repr(C)]
pub struct Hot {
    /// Producer: tail (end of published records). Consumer: head (end of released records).
    pub pos: AtomicU64,
    /// Producer: the last value of the consumer's head it loaded (informational). Consumer:
    /// unused since layout 3 (it reads record headers, not the tail).
    pub cached_peer: AtomicU64,
}

/// A side's identity, liveness and wait words.
#[repr(C)]
pub struct Side {
    /// Owner word of the process holding this role (0: free).
    pub owner: AtomicU64,
    /// CLOCK_MONOTONIC nanoseconds of this side's last sign of life.
    pub heartbeat: AtomicU64,
    /// Odd while this side is (about to be) asleep waiting for the peer; bumped on entry and exit.
    pub sleeping: AtomicU32,
    /// Futex word the *peer* sleeps on; this side bumps it to wake the peer.
    pub doorbell: AtomicU32,
    /// Bit 0: this side issues a global membarrier before sleeping (see `barrier`).
    pub flags: AtomicU32,
    /// Zero.
    pub reserved: AtomicU32,
}

/// The segment header.
#[repr(C)]
pub struct Header {
    /// Segment facts.
    pub meta: CachePadded<Meta>,
    /// Written by the producer only.
    pub prod: CachePadded<Hot>,
    /// Written by the consumer only.
    pub cons: CachePadded<Hot>,
    /// Written by the producer only.
    pub prod_side: CachePadded<Side>,
    /// Written by the consumer only.
    pub cons_side: CachePadded<Side>,
}

#[cfg(loom)]
impl Header {
    /// A zeroed header built from loom atomics.
    pub(crate) fn new() -> Self {
        let hot = || {
            CachePadded::new(Hot {
                pos: AtomicU64::new(0),
                cached_peer: AtomicU64::new(0),
            })
        };
        let side = || {
            CachePadded::new(Side {
                owner: AtomicU64::new(0),
                heartbeat: AtomicU64::new(0),
                sleeping: AtomicU32::new(0),
                doorbell: AtomicU32::new(0),
                flags: AtomicU32::new(0),
                reserved: AtomicU32::new(0),
            })
        };
        Header {
            meta: CachePadded::new(Meta {
                magic: AtomicU64::new(0),
                version: AtomicU32::new(0),
                poisoned: AtomicU32::new(0),
                capacity: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                creator: AtomicU64::new(0),
            }),
            prod: hot(),
            cons: hot(),
            prod_side: side(),
            cons_side: side(),
        }
    }
}

// The layout is shared between processes: pin every offset. (Loom's atomics have another layout.)
#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(offset_of!(Meta, magic) == 0);
    assert!(offset_of!(Meta, version) == 8);
    assert!(offset_of!(Meta, poisoned) == 12);
    assert!(offset_of!(Meta, capacity) == 16);
    assert!(offset_of!(Meta, epoch) == 24);
    assert!(offset_of!(Meta, creator) == 32);
    assert!(size_of::<Meta>() == 40);
    assert!(offset_of!(Hot, pos) == 0);
    assert!(offset_of!(Hot, cached_peer) == 8);
    assert!(size_of::<Hot>() == 16);
    assert!(offset_of!(Side, owner) == 0);
    assert!(offset_of!(Side, heartbeat) == 8);
    assert!(offset_of!(Side, sleeping) == 16);
    assert!(offset_of!(Side, doorbell) == 20);
    assert!(offset_of!(Side, flags) == 24);
    assert!(offset_of!(Side, reserved) == 28);
    assert!(size_of::<Side>() == 32);
    assert!(align_of::<CachePadded<Hot>>() == 128);
    assert!(offset_of!(Header, meta) == 0);
    assert!(offset_of!(Header, prod) == 128);
    assert!(offset_of!(Header, cons) == 256);
    assert!(offset_of!(Header, prod_side) == 384);
    assert!(offset_of!(Header, cons_side) == 512);
    assert!(size_of::<Header>() == 640);
    assert!(size_of::<Header>() <= DATA_OFFSET);
    assert!(DATA_OFFSET.is_multiple_of(align_of::<Header>()));
};

/// Packs a record header word: `[len | LIVE_BIT u32][kind u16][flags u16]` little-endian.
#[inline]
pub(crate) fn encode_record(len: u32, kind: u16, flags: u16) -> u64 {
    u64::from(len | LIVE_BIT) | (u64::from(kind) << 32) | (u64::from(flags) << 48)
}

/// Unpacks a record header word into `(len, kind, flags)`, `len` still carrying [`LIVE_BIT`]
/// (a header without it is corrupt).
#[inline]
pub(crate) fn decode_record(word: u64) -> (u32, u16, u16) {
    (word as u32, (word >> 32) as u16, (word >> 48) as u16)
}

/// What a non-zero header word at data offset `off` describes, validated against the data area.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Parsed {
    /// Padding: the next header is `skip` bytes on, at offset 0.
    Pad { skip: u64 },
    /// `count` records (1, or a run's count) of `len` payload bytes, `total` bytes in all.
    Records {
        len: u32,
        kind: u16,
        flags: u16,
        count: u64,
        total: u64,
    },
}

/// Decodes and checks a non-zero header word at data offset `off` (8-aligned, `< cap`): the live
/// bit, a padding record that ends exactly at the wrap, a run of at least two, a length within
/// `max_payload` and the whole record inside the data area. The error names what was wrong.
#[inline]
pub(crate) fn parse_header(
    word: u64,
    off: u64,
    cap: u64,
    max_payload: u64,
) -> Result<Parsed, &'static str> {
    let (len, kind, flags) = decode_record(word);
    if len & LIVE_BIT == 0 {
        return Err("record header");
    }
    let len = len & !LIVE_BIT;
    if len & PAD_BIT != 0 {
        let skip = cap - off;
        if off == 0
            || len & RUN_BIT != 0
            || u64::from(len & !PAD_BIT) + RECORD_HEADER as u64 != skip
        {
            return Err("padding record");
        }
        return Ok(Parsed::Pad { skip });
    }
    let (len, count, flags) = if len & RUN_BIT != 0 {
        // A run of `flags` records of `len & !RUN_BIT` bytes: at least two, flags 0.
        if flags < 2 {
            return Err("run length");
        }
        (len & !RUN_BIT, u64::from(flags), 0)
    } else {
        (len, 1, flags)
    };
    // A run's count is below 2^16 and a length below 2^29, so `total` cannot overflow.
    let total = if count == 1 {
        record_size(u64::from(len))
    } else {
        RECORD_HEADER as u64 + count * u64::from(len).next_multiple_of(8)
    };
    if u64::from(len) > max_payload
        || total > max_payload + RECORD_HEADER as u64
        || off + total > cap
    {
        return Err("record length");
    }
    Ok(Parsed::Records {
        len,
        kind,
        flags,
        count,
        total,
    })
}

/// Bytes a record with `len` payload bytes occupies: header plus payload rounded up to 8.
#[inline]
pub(crate) fn record_size(len: u64) -> u64 {
    RECORD_HEADER as u64 + len.next_multiple_of(8)
}

/// Largest payload a ring of `capacity` bytes accepts: a record may take at most half the ring, so a
/// record plus the padding before it always fits in an empty ring.
#[inline]
pub(crate) fn max_payload(capacity: u64) -> u64 {
    capacity / 2 - RECORD_HEADER as u64
}
