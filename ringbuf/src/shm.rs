//! Named POSIX shared-memory segments: create (mode 0600), attach (with ownership, permission and
//! header checks), unlink on the creator's drop, and `reap` of segments whose creator died.
//!
//! The `shared_memory` crate creates, opens and unlinks; the mapping is then used only through raw
//! pointers and atomics (never its `as_slice()`, which would hand out references to memory another
//! process mutates).

use crate::error::{Error, Result};
use crate::layout::{DATA_OFFSET, Header, MAGIC, MAX_CAPACITY, MIN_CAPACITY, VERSION};
use crate::liveness::{self, Holder};
use crate::memory::Memory;
use crate::ring::Ring;
use crate::sync::Ordering;
use shared_memory::{Shmem, ShmemConf, ShmemError};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;

/// A mapped shared-memory segment holding one ring.
pub struct Segment {
    shm: Shmem,
    base: *mut u8,
    capacity: u64,
    name: String,
}

// SAFETY: the mapping is process-wide memory valid from any thread; after creation it is accessed
// only through atomics and the ring's grants, which follow the SPSC protocol. `Shmem` holds a raw
// pointer and a file descriptor, neither tied to a thread.
unsafe impl Send for Segment {}
// SAFETY: as above; shared access goes through atomics only.
unsafe impl Sync for Segment {}

// SAFETY: `base` is the page-aligned start of a mapping of DATA_OFFSET + capacity bytes (checked at
// create/attach against the mapping's real size), which lives as long as `shm`; a zero-filled or
// initialised header is a valid `Header` (atomics only); capacity is a checked power of two.
unsafe impl Memory for Segment {
    fn header(&self) -> &Header {
        // SAFETY: see the impl's SAFETY comment.
        unsafe { &*self.base.cast::<Header>() }
    }
    fn data(&self) -> *mut u8 {
        // SAFETY: DATA_OFFSET < mapping length.
        unsafe { self.base.add(DATA_OFFSET) }
    }
    fn capacity(&self) -> u64 {
        self.capacity
    }
}

impl Segment {
    /// The segment's name (without the leading `/`).
    pub fn name(&self) -> &str {
        &self.name
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
        self.shm.is_owner()
    }
}

fn check_name(name: &str) -> Result<()> {
    let ok = (1..=200).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName(name.to_owned()))
    }
}

fn os_error(call: &'static str, name: &str, e: ShmemError) -> Error {
    let source = match e {
        ShmemError::MapCreateFailed(code)
        | ShmemError::MapOpenFailed(code)
        | ShmemError::UnknownOsError(code) => std::io::Error::from_raw_os_error(code as i32),
        other => std::io::Error::other(other.to_string()),
    };
    Error::Os {
        call,
        name: name.to_owned(),
        source,
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
    let shm = match ShmemConf::new()
        .os_id(format!("/{name}"))
        .size(DATA_OFFSET + capacity)
        .create()
    {
        Ok(shm) => shm,
        Err(ShmemError::MappingIdExists) => return Err(Error::AlreadyExists { name: name.into() }),
        Err(e) => return Err(os_error("shm create", name, e)),
    };
    let seg = Segment {
        base: shm.as_ptr(),
        shm,
        capacity: capacity as u64,
        name: name.to_owned(),
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

/// Ownership and size of a segment, from `fstat` on a read-only descriptor.
fn inspect(name: &str) -> Result<(u32, u32, u64)> {
    let cname = CString::new(format!("/{name}")).map_err(|_| Error::InvalidName(name.into()))?;
    // SAFETY: `cname` is a valid NUL-terminated string; the flags open read-only without creating.
    let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOENT) => Error::NotFound { name: name.into() },
            _ => Error::Os {
                call: "shm_open",
                name: name.into(),
                source: err,
            },
        });
    }
    // SAFETY: `fd` is an open descriptor we own; `File` closes it exactly once.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let meta = file.metadata().map_err(|source| Error::Os {
        call: "fstat",
        name: name.into(),
        source,
    })?;
    Ok((meta.uid(), meta.mode() & 0o7777, meta.size()))
}

/// Attaches to segment `name`: checks owner (must be us), mode (no group/other access), layout
/// version, magic, and capacity against the mapping's real size.
pub fn attach(name: &str) -> Result<Ring<Segment>> {
    check_name(name)?;
    let (uid, mode, size) = inspect(name)?;
    // SAFETY: geteuid has no preconditions.
    if uid != unsafe { libc::geteuid() } {
        return Err(Error::ForeignOwner {
            name: name.into(),
            uid,
        });
    }
    if mode & 0o077 != 0 {
        return Err(Error::InsecureMode {
            name: name.into(),
            mode,
        });
    }
    if size == 0 {
        return Err(Error::NotReady { name: name.into() });
    }
    if size < (DATA_OFFSET + MIN_CAPACITY) as u64 {
        return Err(Error::Corrupt {
            what: "segment size",
        });
    }
    // /dev/shm is sticky, so no other user can replace the checked segment before this open.
    let shm = match ShmemConf::new().os_id(format!("/{name}")).open() {
        Ok(shm) => shm,
        Err(ShmemError::MapOpenFailed(code)) if code as i32 == libc::ENOENT => {
            return Err(Error::NotFound { name: name.into() });
        }
        Err(e) => return Err(os_error("shm open", name, e)),
    };
    let len = shm.len();
    let mut seg = Segment {
        base: shm.as_ptr(),
        shm,
        capacity: 0,
        name: name.to_owned(),
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
        let Ok((uid, _, size)) = inspect(&name) else {
            continue;
        };
        // SAFETY: geteuid has no preconditions.
        if uid != unsafe { libc::geteuid() } || size < (DATA_OFFSET + MIN_CAPACITY) as u64 {
            continue;
        }
        let Ok(mut shm) = ShmemConf::new().os_id(format!("/{name}")).open() else {
            continue;
        };
        if shm.len() < DATA_OFFSET {
            continue;
        }
        // SAFETY: the mapping is at least DATA_OFFSET bytes, page-aligned, so it holds a Header.
        let hdr = unsafe { &*shm.as_ptr().cast::<Header>() };
        if hdr.meta.magic.load(Ordering::Relaxed) != MAGIC {
            continue;
        }
        if let Holder::Dead(_) = liveness::holder(hdr.meta.creator.load(Ordering::Relaxed)) {
            shm.set_owner(true); // dropping an owning Shmem unlinks the name
            drop(shm);
            reaped.push(name);
        }
    }
    Ok(reaped)
}
