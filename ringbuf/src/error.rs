//! The ring's one error type.

use std::fmt;

/// Which end of a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The writing end.
    Producer,
    /// The reading end.
    Consumer,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Producer => "producer",
            Role::Consumer => "consumer",
        })
    }
}

/// Everything that can go wrong with a ring. A full or empty ring is not an error (`Ok(None)`/`Ok(false)`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No segment of that name exists.
    #[error("shared-memory segment {name:?} not found")]
    NotFound {
        /// The segment name.
        name: String,
    },
    /// `create` found a segment of that name already there.
    #[error("shared-memory segment {name:?} already exists")]
    AlreadyExists {
        /// The segment name.
        name: String,
    },
    /// The segment exists but its creator has not finished initialising it; retry shortly.
    #[error("shared-memory segment {name:?} is not initialised yet")]
    NotReady {
        /// The segment name.
        name: String,
    },
    /// The segment was made by an incompatible version of this crate.
    #[error("segment layout version {found}, this build understands {expected}")]
    VersionMismatch {
        /// Version found in the segment.
        found: u32,
        /// Version this build writes.
        expected: u32,
    },
    /// The shared memory holds something impossible; the ring is poisoned from now on.
    #[error("ring corrupted: bad {what}")]
    Corrupt {
        /// Which word or record was bad.
        what: &'static str,
    },
    /// A live process already holds this role.
    #[error("the {role} role is held by live process {pid}")]
    RoleTaken {
        /// The role asked for.
        role: Role,
        /// Its holder.
        pid: u32,
    },
    /// The other side's process died while we waited for it.
    #[error("the peer process {pid} is dead")]
    PeerDead {
        /// The dead peer's pid.
        pid: u32,
    },
    /// The segment belongs to another user.
    #[error("segment {name:?} is owned by uid {uid}, not by us")]
    ForeignOwner {
        /// The segment name.
        name: String,
        /// Its owner.
        uid: u32,
    },
    /// The segment is accessible to group or others.
    #[error("segment {name:?} has mode {mode:o}; group and others must have no access")]
    InsecureMode {
        /// The segment name.
        name: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Capacity is not a power of two within the allowed range.
    #[error("invalid capacity {capacity}: must be a power of two between {min} and {max} bytes")]
    InvalidCapacity {
        /// The requested capacity.
        capacity: usize,
        /// Smallest allowed.
        min: usize,
        /// Largest allowed.
        max: usize,
    },
    /// A segment name must be 1–200 characters of `[A-Za-z0-9._-]`.
    #[error("invalid segment name {0:?}: use 1-200 characters of [A-Za-z0-9._-]")]
    InvalidName(String),
    /// The record does not fit in this ring (at most half the capacity, header included).
    #[error("record of {len} bytes exceeds this ring's maximum payload of {max} bytes")]
    TooLarge {
        /// Requested payload length.
        len: usize,
        /// Largest payload the ring accepts.
        max: usize,
    },
    /// An operating-system call failed.
    #[error("{call} failed for segment {name:?}: {source}")]
    Os {
        /// The call that failed.
        call: &'static str,
        /// The segment name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Result alias for ring operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
