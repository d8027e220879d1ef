//! Collectives between the ranks of a TP group: the [`Communicator`] trait (NCCL can implement it
//! for the CUDA backend) and [`ShmComm`], a shared-memory implementation for `T` processes of one
//! host, used by the CPU backend so tensor parallelism is tested in CI.
//!
//! # Segment layout (one POSIX shm segment, mode 0600, created by rank 0)
//!
//! ```text
//! 0        Header   magic u64, version u32, world u32, slot_floats u64, wake u32, sleepers u32
//! 128      RankCtl  world × 64 bytes: pid, arrived, done, len (u32 atomics)
//! data     slots    world × slot_floats f32 (as u32 atomics), data = align64(128 + 64·world)
//! ```
//!
//! # One round (all-reduce and all-gather alike; `g` counts rounds, wrapping)
//!
//! 1. wait until every peer's `done ≥ g-1` (they have finished reading my slot of the last round);
//! 2. write my chunk into my slot, store `len`, then `arrived = g` (Release);
//! 3. wait until every peer's `arrived ≥ g` (Acquire), read every slot (sum in rank order 0..T, so
//!    every rank gets bit-identical results), then `done = g` (Release).
//!
//! Waiting spins a bounded number of polls, then sleeps on the `wake` futex word (bumped after
//! every `arrived`/`done` store) for at most `poll` at a time; after each sleep it checks the peers'
//! pids, so a dead peer (or one that detached) is a [`CommError::PeerDead`] within about `poll`.
//! Slot contents are accessed only through atomics, so even a misbehaving peer cannot cause a data
//! race; every length read from the segment is checked.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringbuf::PrivateShm;
use thiserror::Error;

const MAGIC: u64 = 0x5250_5443_4f4d_4d31; // "RPTCOMM1"
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 128;
const CTL_BYTES: usize = 64;
/// Largest group the segment format allows.
pub const MAX_WORLD: usize = 256;

/// A collective failed. Fatal to the group: the ranks can no longer agree on where they are.
#[derive(Debug, Error)]
pub enum CommError {
    /// A peer's process died (or is a zombie) while we waited for it.
    #[error("tensor-parallel rank {rank} (pid {pid}) died")]
    PeerDead { rank: usize, pid: u32 },
    /// A peer detached (dropped its communicator) while the group still needed it.
    #[error("tensor-parallel rank {rank} left the group")]
    PeerLeft { rank: usize },
    /// A peer did not arrive within the configured timeout although its process lives.
    #[error("tensor-parallel rank {rank} did not respond within {timeout:?}")]
    Timeout { rank: usize, timeout: Duration },
    /// Ranks called the collective with different lengths (a bug, or a corrupted segment).
    #[error("rank {rank} contributed {theirs} floats, this rank {ours}")]
    LengthMismatch {
        rank: usize,
        theirs: usize,
        ours: usize,
    },
    /// Arguments that cannot work (world 0, rank out of range, output of the wrong size).
    #[error("invalid communicator arguments: {0}")]
    Invalid(String),
    /// The segment is not what a communicator writes (magic, version, sizes).
    #[error("communicator segment {name:?} is corrupt: {what}")]
    Corrupt { name: String, what: String },
    /// The rank's slot is held by another live process.
    #[error("rank {rank} of segment {name:?} is already taken by pid {pid}")]
    RankTaken { name: String, rank: usize, pid: u32 },
    /// The segment cannot be created or opened: a bad name, another user's segment, one readable
    /// by others, or an operating-system failure.
    #[error("communicator segment: {0}")]
    Segment(#[source] ringbuf::Error),
}

/// Collectives over `f32` slices among the ranks of one TP group. Every rank must call the same
/// sequence of collectives with the same lengths.
pub trait Communicator: Send {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world_size(&self) -> usize;
    /// Replaces `data` on every rank with the element-wise sum over the ranks. Every rank receives
    /// bit-identical results.
    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError>;
    /// Concatenates every rank's `input` (equal lengths) into `output`, rank 0 first:
    /// `output.len() == input.len() * world_size()`.
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError>;
}

/// Tuning of [`ShmComm`]'s waits and buffer.
#[derive(Debug, Clone, Copy)]
pub struct CommOptions {
    /// Floats per rank slot; longer collectives run in several rounds.
    pub slot_floats: usize,
    /// Polls of the peers' counters before sleeping (each a `spin_loop` hint).
    pub spin: u32,
    /// Longest single futex sleep; peers' liveness is checked at least this often.
    pub poll: Duration,
    /// A live peer that does not arrive within this long is an error.
    pub timeout: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        Self {
            slot_floats: 1 << 18,
            spin: 200,
            poll: Duration::from_millis(20),
            timeout: Duration::from_secs(300),
        }
    }
}

/// The segment's fixed header.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    world: AtomicU32,
    slot_floats: AtomicU64,
    /// Futex word, bumped after every `arrived`/`done` store.
    wake: AtomicU32,
    /// Ranks sleeping (or about to sleep) on `wake`; wakers skip the syscall when 0.
    sleepers: AtomicU32,
}

/// One rank's control words.
#[repr(C)]
struct RankCtl {
    /// The rank's pid once attached; 0 before attach and after a clean detach.
    pid: AtomicU32,
    /// Last round whose data this rank has published.
    arrived: AtomicU32,
    /// Last round whose slots this rank has finished reading.
    done: AtomicU32,
    /// Floats in this rank's slot for its current round.
    len: AtomicU32,
    /// 1 once the rank has joined; never cleared (a rank that joined and left still counts).
    joined: AtomicU32,
}

const _: () = assert!(size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(size_of::<RankCtl>() <= CTL_BYTES);

fn data_offset(world: usize) -> usize {
    (HEADER_BYTES + CTL_BYTES * world).next_multiple_of(64)
}

/// Bytes of a segment for `world` ranks of `slot_floats`, or `None` on overflow.
fn segment_len(world: usize, slot_floats: usize) -> Option<usize> {
    slot_floats
        .checked_mul(4)?
        .checked_mul(world)?
        .checked_add(data_offset(world))
}

/// The shared-memory [`Communicator`] (see the module docs for the protocol).
pub struct ShmComm {
    shm: PrivateShm,
    base: *mut u8,
    rank: usize,
    world: usize,
    slot_floats: usize,
    round: u32,
    options: CommOptions,
}

// SAFETY: the mapping is process-wide memory valid from any thread; it is only accessed through
// atomics. `base` is `shm`'s address, and `PrivateShm` is itself Send.
unsafe impl Send for ShmComm {}

impl std::fmt::Debug for ShmComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmComm")
            .field("name", &self.shm.name())
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

impl ShmComm {
    /// Creates segment `name` for `world` ranks and joins it as rank 0, then waits (up to
    /// `options.timeout`) until every rank has attached.
    pub fn create(name: &str, world: usize, options: CommOptions) -> Result<Self, CommError> {
        if world == 0 || world > MAX_WORLD {
            return Err(CommError::Invalid(format!(
                "world size {world} (1..={MAX_WORLD})"
            )));
        }
        if options.slot_floats == 0 || options.slot_floats > u32::MAX as usize {
            return Err(CommError::Invalid("slot_floats must be 1..2^32".into()));
        }
        let len = segment_len(world, options.slot_floats)
            .ok_or_else(|| CommError::Invalid("segment size overflows".into()))?;
        let shm = PrivateShm::create(name, len).map_err(CommError::Segment)?;
        let mut comm = Self::from_shmem(shm, 0, world, options);
        let h = comm.header();
        h.world.store(world as u32, Ordering::Relaxed);
        h.slot_floats
            .store(options.slot_floats as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Relaxed);
        // SYNC: Release pairs with the Acquire load of `version` in `attach`: an attacher that sees
        // the version sees the header words above (and the zeroed control words).
        h.version.store(VERSION, Ordering::Release);
        comm.join()?;
        Ok(comm)
    }

    /// Attaches to segment `name` as `rank` (retrying until rank 0 has created it, up to
    /// `options.timeout`), then waits until every rank has attached. `options.slot_floats` is
    /// ignored: the creator's size is used.
    pub fn attach(name: &str, rank: usize, options: CommOptions) -> Result<Self, CommError> {
        let deadline = Instant::now() + options.timeout;
        loop {
            match Self::try_attach(name, rank, options) {
                Ok(Some(comm)) => {
                    let mut comm = comm;
                    comm.join()?;
                    return Ok(comm);
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(options.poll),
                Ok(None) => {
                    return Err(CommError::Timeout {
                        rank: 0,
                        timeout: options.timeout,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attach attempt; `Ok(None)` while the segment does not exist or is not initialised.
    fn try_attach(
        name: &str,
        rank: usize,
        options: CommOptions,
    ) -> Result<Option<Self>, CommError> {
        // `open` checks that the segment is this user's and private, and that it has been sized.
        let shm = match PrivateShm::open(name) {
            Ok(shm) => shm,
            Err(ringbuf::Error::NotFound { .. } | ringbuf::Error::NotReady { .. }) => {
                return Ok(None);
            }
            Err(e) => return Err(CommError::Segment(e)),
        };
        let mapped = shm.len();
        if mapped < HEADER_BYTES {
            return Ok(None); // sized by a creator that is not done yet
        }
        let base = shm.as_ptr();
        // SAFETY: the mapping is at least HEADER_BYTES long (its real size, checked just above),
        // page-aligned, and a `Header` of atomics is valid for any bit pattern.
        let h = unsafe { &*base.cast::<Header>() };
        // SYNC: Acquire pairs with the Release store of `version` in `create`.
        let version = h.version.load(Ordering::Acquire);
        if version == 0 {
            return Ok(None);
        }
        let corrupt = |what: String| CommError::Corrupt {
            name: name.to_owned(),
            what,
        };
        if version != VERSION || h.magic.load(Ordering::Relaxed) != MAGIC {
            return Err(corrupt(format!("magic/version {version}")));
        }
        let world = h.world.load(Ordering::Relaxed) as usize;
        let slot_floats = h.slot_floats.load(Ordering::Relaxed);
        if world == 0 || world > MAX_WORLD || slot_floats == 0 || slot_floats > u64::from(u32::MAX)
        {
            return Err(corrupt(format!("world {world}, slot_floats {slot_floats}")));
        }
        let slot_floats = slot_floats as usize;
        match segment_len(world, slot_floats) {
            Some(need) if need <= mapped => {}
            _ => return Err(corrupt(format!("mapping of {mapped} bytes is too small"))),
        }
        if rank >= world {
            return Err(CommError::Invalid(format!(
                "rank {rank} in a group of {world}"
            )));
        }
        let options = CommOptions {
            slot_floats,
            ..options
        };
        Ok(Some(Self::from_shmem(shm, rank, world, options)))
    }

    fn from_shmem(shm: PrivateShm, rank: usize, world: usize, options: CommOptions) -> Self {
        Self {
            base: shm.as_ptr(),
            shm,
            rank,
            world,
            slot_floats: options.slot_floats,
            round: 0,
            options,
        }
    }

    fn header(&self) -> &Header {
        // SAFETY: `base` starts a live mapping of at least `segment_len(world, slot_floats)` bytes
        // (checked at create/attach) that outlives `self`; a `Header` of atomics is valid for any
        // bits and is only accessed atomically.
        unsafe { &*self.base.cast::<Header>() }
    }

    fn ctl(&self, rank: usize) -> &RankCtl {
        assert!(rank < self.world, "rank index in range");
        // SAFETY: rank < world, so HEADER_BYTES + 64·rank + size_of::<RankCtl>() ≤ data_offset(world)
        // ≤ the mapping length; the offset is 4-byte aligned; atomics are valid for any bits.
        unsafe {
            &*self
                .base
                .add(HEADER_BYTES + CTL_BYTES * rank)
                .cast::<RankCtl>()
        }
    }

    fn slot(&self, rank: usize) -> &[AtomicU32] {
        assert!(rank < self.world, "rank index in range");
        let off = data_offset(self.world) + rank * self.slot_floats * 4;
        // SAFETY: off + 4·slot_floats ≤ segment_len(world, slot_floats) ≤ the mapping length
        // (checked at create/attach); `off` is 64-aligned; `AtomicU32` has `u32`'s layout and every
        // access to shared slots goes through it, so concurrent access is never a data race.
        unsafe {
            std::slice::from_raw_parts(self.base.add(off).cast::<AtomicU32>(), self.slot_floats)
        }
    }

    /// Registers this process's pid in its rank slot, then waits until every rank has.
    fn join(&mut self) -> Result<(), CommError> {
        let me = std::process::id();
        let ctl = self.ctl(self.rank);
        // SYNC: AcqRel pairs with the Release store of 0 in a previous holder's `Drop`, and with the
        // Acquire loads of `pid` by peers below.
        if let Err(pid) = ctl
            .pid
            .compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire)
        {
            if ringbuf::process_alive(pid) {
                return Err(CommError::RankTaken {
                    name: self.shm.name().to_owned(),
                    rank: self.rank,
                    pid,
                });
            }
            ctl.pid.store(me, Ordering::Release);
        }
        // SYNC: Release pairs with the Acquire load of `joined` by peers waiting below.
        ctl.joined.store(1, Ordering::Release);
        self.bump_wake();
        let deadline = Instant::now() + self.options.timeout;
        // Ranks attach in any order; a rank not attached yet has pid 0, which is not an error here.
        self.wait_until(
            deadline,
            |c, r| c.ctl(r).joined.load(Ordering::Acquire) != 0,
            false,
        )
    }

    /// Bumps the futex word and wakes sleepers, if any.
    fn bump_wake(&self) {
        let h = self.header();
        // SYNC: SeqCst, with the SeqCst `sleepers` load here and the waiter's SeqCst
        // `sleepers.fetch_add` + `wake` load in `wait_until`: either we see the sleeper and wake
        // it, or its futex_wait sees the bumped word and returns at once.
        h.wake.fetch_add(1, Ordering::SeqCst);
        if h.sleepers.load(Ordering::SeqCst) > 0 {
            ringbuf::futex::wake_all(&h.wake);
        }
    }

    /// Waits until `ready(self, r)` holds for every peer `r`. `check_pids`: a peer whose pid is 0
    /// has left (after join).
    fn wait_until(
        &self,
        deadline: Instant,
        ready: impl Fn(&Self, usize) -> bool,
        check_pids: bool,
    ) -> Result<(), CommError> {
        let h = self.header();
        let peers = || (0..self.world).filter(|&r| r != self.rank);
        let mut spins = 0u32;
        loop {
            let seen = h.wake.load(Ordering::SeqCst);
            let Some(waiting) = peers().find(|&r| !ready(self, r)) else {
                return Ok(());
            };
            if spins < self.options.spin {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            h.sleepers.fetch_add(1, Ordering::SeqCst);
            if !ready(self, waiting) {
                ringbuf::futex::wait(&h.wake, seen, self.options.poll);
            }
            h.sleepers.fetch_sub(1, Ordering::SeqCst);
            if ready(self, waiting) {
                spins = 0;
                continue;
            }
            // Only peers we still wait for: one that already did its part of this round and then
            // left (a group's last collective) is no error.
            for r in peers().filter(|&r| !ready(self, r)) {
                let pid = self.ctl(r).pid.load(Ordering::Acquire);
                if pid == 0 {
                    if check_pids {
                        return Err(CommError::PeerLeft { rank: r });
                    }
                } else if !ringbuf::process_alive(pid) {
                    return Err(CommError::PeerDead { rank: r, pid });
                }
            }
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: waiting,
                    timeout: self.options.timeout,
                });
            }
        }
    }

    /// One round: publishes `chunk` in this rank's slot, waits for every rank's, calls `read` with
    /// the slots (all of `chunk.len()` floats), then marks the round read.
    fn round(
        &mut self,
        chunk: &[f32],
        mut read: impl FnMut(&[&[AtomicU32]]),
    ) -> Result<(), CommError> {
        let n = chunk.len();
        debug_assert!(n <= self.slot_floats);
        let prev = self.round;
        let g = prev.wrapping_add(1);
        let deadline = Instant::now() + self.options.timeout;
        // SYNC: Acquire pairs with each peer's Release store of `done` (step 3 of the last round):
        // their reads of my slot happen before my writes below.
        self.wait_until(deadline, |c, r| reached(&c.ctl(r).done, prev), true)?;
        for (dst, &v) in self.slot(self.rank).iter().zip(chunk) {
            dst.store(v.to_bits(), Ordering::Relaxed);
        }
        let ctl = self.ctl(self.rank);
        ctl.len.store(n as u32, Ordering::Relaxed);
        // SYNC: Release pairs with the peers' Acquire load of my `arrived` in their step 3: my slot
        // and `len` writes above are visible to them once they see round `g`.
        ctl.arrived.store(g, Ordering::Release);
        self.bump_wake();
        // SYNC: Acquire pairs with each peer's Release store of `arrived` (their step 2).
        self.wait_until(deadline, |c, r| reached(&c.ctl(r).arrived, g), true)?;
        for r in 0..self.world {
            let theirs = self.ctl(r).len.load(Ordering::Relaxed) as usize;
            if theirs != n {
                return Err(CommError::LengthMismatch {
                    rank: r,
                    theirs,
                    ours: n,
                });
            }
        }
        let slots: Vec<&[AtomicU32]> = (0..self.world).map(|r| &self.slot(r)[..n]).collect();
        read(&slots);
        // SYNC: Release pairs with the peers' Acquire load of my `done` in their next step 1.
        self.ctl(self.rank).done.store(g, Ordering::Release);
        self.bump_wake();
        self.round = g;
        Ok(())
    }
}

/// Whether counter `word` has reached round `g` (counters wrap; peers are at most one round apart).
fn reached(word: &AtomicU32, g: u32) -> bool {
    word.load(Ordering::Acquire).wrapping_sub(g) as i32 >= 0
}

impl Communicator for ShmComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CommError> {
        let step = self.slot_floats;
        for start in (0..data.len()).step_by(step) {
            let end = (start + step).min(data.len());
            let chunk = &mut data[start..end];
            let mut sums = vec![0.0f32; chunk.len()];
            self.round(chunk, |slots| {
                // Rank order 0..T on every rank: bit-identical sums everywhere.
                for slot in slots {
                    for (s, v) in sums.iter_mut().zip(*slot) {
                        *s += f32::from_bits(v.load(Ordering::Relaxed));
                    }
                }
            })?;
            chunk.copy_from_slice(&sums);
        }
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        let len = input.len();
        if Some(output.len()) != len.checked_mul(self.world) {
            return Err(CommError::Invalid(format!(
                "all_gather output of {} floats for {} ranks × {len}",
                output.len(),
                self.world
            )));
        }
        let step = self.slot_floats;
        for start in (0..len).step_by(step) {
            let end = (start + step).min(len);
            self.round(&input[start..end], |slots| {
                for (r, slot) in slots.iter().enumerate() {
                    let dst = &mut output[r * len + start..r * len + end];
                    for (d, v) in dst.iter_mut().zip(*slot) {
                        *d = f32::from_bits(v.load(Ordering::Relaxed));
                    }
                }
            })?;
        }
        Ok(())
    }
}

impl Drop for ShmComm {
    fn drop(&mut self) {
        let ctl = self.ctl(self.rank);
        if ctl.pid.load(Ordering::Relaxed) == std::process::id() {
            // SYNC: Release pairs with the peers' Acquire loads of `pid` in `wait_until`.
            ctl.pid.store(0, Ordering::Release);
            self.bump_wake();
        }
        // The creator's `PrivateShm` unlinks the name on drop; attachers only unmap.
        let _ = &self.shm;
    }
}

#[cfg(test)]
#[path = "comm_tests.rs"]
mod tests;
