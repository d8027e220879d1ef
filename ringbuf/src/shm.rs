//! Named POSIX shared-memory segments: create (mode 0600), attach (with ownership, permission and
//! header checks), unlink on the creator's drop, and `reap` of segments whose creator died.
//!
//! [`PrivateShm`] creates, checks, opens and unlinks; the mapping is then used only through raw
//! pointers and atomics (never a slice, which would be a reference to memory another process
//! mutates).

use crate::error::{Error, Result};
use crate::layout::{DATA_OFFSET, Header, MAGIC, MAX_CAPACITY, MIN_CAPACITY, VERSION};
use crate::liveness::{self, Holder};
use crate::memory::Memory;
use crate::private::{PrivateShm, check_name};
use crate::ring::Ring;
use crate::sync::Ordering;

/// A mapped shared-memory segment holding one ring.
pub struct Segment {
    shm: PrivateShm,
    base: *mut u8,
    capacity: u64,
}

// SAFETY: the mapping is process-wide memory valid from any thread; after creation it is accessed
// only through atomics and the ring's grants, which follow the SPSC protocol. `PrivateShm` is Send.
unsafe impl Send for Segment {}
// SAFETY: as above; shared access goes through atomics only.
unsafe impl Sync for Segment {}

// SAFETY: `base` is the page-aligned start of a mapping of DATA_OFFSET + capacity bytes (checked at
// create/attach against the mapping's real size), which lives as long as `shm`; a zero-filled or
// initialised header is a valid `Header` (atomics only); capacity is a checked power of two.
unsafe impl Memory for Segment {
    #[inline]
    fn header(&self) -> &Header {
        // SAFETY: see the impl's SAFETY comment.
        unsafe { &*self.base.cast::<Header>() }
    }
    #[inline]
    fn data(&self) -> *mut u8 {
        // SAFETY: DATA_OFFSET < mapping length.
        unsafe { self.base.add(DATA_OFFSET) }
    }
    #[inline]
    fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Segment {
    /// The segment's name (without the leading `/`).
    pub fn name(&self) -> &str {
        self.shm.name()
    }

    /// The random epoch the creator stored in the header.
    pub fn epoch(&self) -> u64 {
        self.header().meta.epoch.load(Ordering::Relaxed)
    }

    /// Pid of the process that created the segment.
    pub fn creator_pid(&self) -> u32 {
        liveness::owner_pid(self.header().meta.creator.load(Ordering::Relaxed))
    }

    /// Whether this mapping unlinks the segment when dropped (true for the creator).
    pub fn is_creator(&self) -> bool {
        self.shm.is_creator()
    }
}

/// A fresh, unguessable segment name: `prefix` + pid + time + random bits. Names are never reused, so
/// a name from before a crash never attaches to stale memory.
pub fn unique_name(prefix: &str) -> String {
    let mut random = [0u8; 8];
    // SAFETY: `random` is a valid, writable 8-byte buffer.
    let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    let mut bits = u64::from_ne_bytes(random);
    if got != 8 {
        bits ^= liveness::now_ns().rotate_left(17);
    }
    format!(
        "{prefix}.{}.{:x}.{bits:016x}",
        std::process::id(),
        liveness::now_ns()
    )
}

/// Creates segment `name` (mode 0600) with a data area of `capacity` bytes and returns its ring.
/// The segment is unlinked when the last handle on it in this process drops.
pub fn create(name: &str, capacity: usize) -> Result<Ring<Segment>> {
    check_name(name)?;
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(Error::InvalidCapacity {
            capacity,
            min: MIN_CAPACITY,
            max: MAX_CAPACITY,
        });
    }
    let shm = PrivateShm::create(name, DATA_OFFSET + capacity)?;
    let seg = Segment {
        base: shm.as_ptr(),
        shm,
        capacity: capacity as u64,
    };
    let meta = &seg.header().meta;
    meta.capacity.store(capacity as u64, Ordering::Relaxed);
    meta.epoch.store(epoch_of(name), Ordering::Relaxed);
    meta.creator
        .store(liveness::self_owner(), Ordering::Relaxed);
    meta.magic.store(MAGIC, Ordering::Relaxed);
    // SYNC: Release pairs with the Acquire load of `version` in `attach`: an attacher that sees the
    // version sees every header word written above.
    meta.version.store(VERSION, Ordering::Release);
    Ok(Ring::from_memory(seg))
}

/// The random part of a `unique_name`, or a hash of the name otherwise.
fn epoch_of(name: &str) -> u64 {
    name.rsplit('.')
        .next()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
        .unwrap_or_else(|| {
            name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
        })
}

/// Attaches to segment `name`: checks owner (must be us), mode (no group/other access), layout
/// version, magic, and capacity against the mapping's real size.
pub fn attach(name: &str) -> Result<Ring<Segment>> {
    let shm = PrivateShm::open(name)?;
    let len = shm.len();
    let mut seg = Segment {
        base: shm.as_ptr(),
        shm,
        capacity: 0,
    };
    if len < DATA_OFFSET + MIN_CAPACITY || seg.base.align_offset(DATA_OFFSET) != 0 {
        return Err(Error::Corrupt {
            what: "segment size",
        });
    }
    let meta = &seg.header().meta;
    // SYNC: Acquire pairs with the creator's Release store of `version` in `create`.
    let version = meta.version.load(Ordering::Acquire);
    if version == 0 {
        return Err(Error::NotReady { name: name.into() });
    }
    if version != VERSION {
        return Err(Error::VersionMismatch {
            found: version,
            expected: VERSION,
        });
    }
    if meta.magic.load(Ordering::Relaxed) != MAGIC {
        return Err(Error::Corrupt { what: "magic" });
    }
    let capacity = meta.capacity.load(Ordering::Relaxed);
    let cap_ok = capacity.is_power_of_two()
        && (MIN_CAPACITY as u64..=MAX_CAPACITY as u64).contains(&capacity)
        && DATA_OFFSET as u64 + capacity == len as u64;
    if !cap_ok {
        return Err(Error::Corrupt { what: "capacity" });
    }
    seg.capacity = capacity;
    Ok(Ring::from_memory(seg))
}

/// Unlinks every segment whose name starts with `prefix`, that this user owns, and whose creator
/// process is dead. Returns the names removed. Segments that are not rings are left alone.
pub fn reap(prefix: &str) -> Result<Vec<String>> {
    let mut reaped = Vec::new();
    let dir = std::fs::read_dir("/dev/shm").map_err(|source| Error::Os {
        call: "read_dir /dev/shm",
        name: prefix.into(),
        source,
    })?;
    for entry in dir.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !name.starts_with(prefix) || check_name(&name).is_err() {
            continue;
        }
        // Not ours, not private, not sized or not there any more: not a ring we may reap.
        let Ok(mut shm) = PrivateShm::open(&name) else {
            continue;
        };
        if shm.len() < DATA_OFFSET + MIN_CAPACITY {
            continue;
        }
        // SAFETY: the mapping is at least DATA_OFFSET bytes, page-aligned, so it holds a Header.
        let hdr = unsafe { &*shm.as_ptr().cast::<Header>() };
        if hdr.meta.magic.load(Ordering::Relaxed) != MAGIC {
            continue;
        }
        if let Holder::Dead(_) = liveness::holder(hdr.meta.creator.load(Ordering::Relaxed)) {
            shm.unlink_on_drop();
            drop(shm);
            reaped.push(name);
        }
    }
    Ok(reaped)
}
