//! A named POSIX shared-memory segment private to this user: created with mode 0600, opened only
//! after checking its owner, permission bits and size, and unlinked when its creator drops it.
//!
//! Rings ([`crate::create`], [`crate::attach`]) and the tensor-parallel communicator both live in
//! such segments; what they store there, and how they validate it, is theirs. This type hands out
//! only a raw pointer, never a slice: the memory is shared with another process that may write it at
//! any time, so it must be accessed through atomics or volatile copies.

use crate::error::{Error, Result};
use shared_memory::{Shmem, ShmemConf, ShmemError};
use std::ffi::CString;
use std::os::unix::fs::MetadataExt;

/// A mapped, owner-only shared-memory segment.
pub struct PrivateShm {
    shm: Shmem,
    name: String,
}

// SAFETY: the handle holds the mapping's address and a descriptor, neither tied to a thread; it
// gives out only a raw pointer, so every access to the memory is the caller's `unsafe` and follows
// the caller's own synchronisation protocol.
unsafe impl Send for PrivateShm {}
// SAFETY: as above; `&PrivateShm` allows nothing but reading the pointer, length and name.
unsafe impl Sync for PrivateShm {}

impl std::fmt::Debug for PrivateShm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateShm")
            .field("name", &self.name)
            .field("len", &self.len())
            .field("creator", &self.is_creator())
            .finish()
    }
}

impl PrivateShm {
    /// Creates segment `name` of `len` zeroed bytes, mode 0600. Dropping the result unlinks the name.
    pub fn create(name: &str, len: usize) -> Result<Self> {
        check_name(name)?;
        match ShmemConf::new()
            .os_id(format!("/{name}"))
            .size(len)
            .create()
        {
            Ok(shm) => Ok(Self {
                shm,
                name: name.to_owned(),
            }),
            Err(ShmemError::MappingIdExists) => Err(Error::AlreadyExists { name: name.into() }),
            Err(e) => Err(os_error("shm create", name, e)),
        }
    }

    /// Maps the existing segment `name` after checking that this user owns it, that group and others
    /// have no access, and that its creator has sized it (else [`Error::NotReady`]: retry shortly).
    /// Dropping the result only unmaps.
    pub fn open(name: &str) -> Result<Self> {
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
        // /dev/shm is sticky, so no other user can replace the checked segment before this open.
        let mut shm = match ShmemConf::new().os_id(format!("/{name}")).open() {
            Ok(shm) => shm,
            Err(ShmemError::MapOpenFailed(code)) if code as i32 == libc::ENOENT => {
                return Err(Error::NotFound { name: name.into() });
            }
            Err(e) => return Err(os_error("shm open", name, e)),
        };
        shm.set_owner(false);
        Ok(Self {
            shm,
            name: name.to_owned(),
        })
    }

    /// The page-aligned start of the mapping, valid for [`PrivateShm::len`] bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shm.as_ptr()
    }

    /// Bytes mapped (the segment's real size when it was mapped, not a size read from its contents).
    pub fn len(&self) -> usize {
        self.shm.len()
    }

    /// Whether nothing is mapped (never true for a segment that passed `open` or `create`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The segment's name, without the leading `/`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether dropping this handle unlinks the name (true for the creator).
    pub fn is_creator(&self) -> bool {
        self.shm.is_owner()
    }

    /// Makes dropping this handle unlink the name (used to reap a dead creator's segment).
    pub(crate) fn unlink_on_drop(&mut self) {
        self.shm.set_owner(true);
    }
}

/// Names are 1–200 characters of `[A-Za-z0-9._-]`: no `/`, so a name cannot leave `/dev/shm`.
pub(crate) fn check_name(name: &str) -> Result<()> {
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

/// Owner uid, permission bits and size of a segment, from `fstat` on a read-only descriptor.
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
