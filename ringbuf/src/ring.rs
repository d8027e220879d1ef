//! A ring handle (`Ring`), role claims, poisoning and wait settings shared by both ends.

use crate::consumer::Consumer;
use crate::error::{Error, Result, Role};
use crate::liveness::{self, Holder};
use crate::memory::{HeapMemory, Memory};
use crate::producer::Producer;
use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How the waiting calls behave.
#[derive(Clone, Copy, Debug)]
pub struct WaitConfig {
    /// How long a wait polls the peer's position before going to sleep (a few µs: longer than a
    /// cache-line round trip, much shorter than the ~50 µs a futex sleep and wake cost here).
    pub spin: Duration,
    /// Longest single futex sleep: the peer's liveness is re-checked at least this often, so a wait
    /// notices a dead peer within about this long.
    pub liveness_poll: Duration,
    /// A live peer whose heartbeat is older than this is reported `Unresponsive`.
    pub heartbeat_limit: Duration,
    /// Consumer: each poll that finds the ring empty also prefetches the line after the one it
    /// polls, so that a record spilling into it arrives with its header rather than one
    /// cross-core transfer later. For request/response traffic: a 64-byte record's round trip
    /// p50 535 → 410 ns in `bench ring`; off by default because a consumer streaming behind its
    /// producer takes that line away while it is being written (64-byte records: 38–42 against
    /// 48 M/s one at a time, 103–104 against 112 M/s in batches of 32; `ringbuf/README.md`).
    pub prefetch_next_line: bool,
}

impl Default for WaitConfig {
    fn default() -> Self {
        WaitConfig {
            spin: if cfg!(loom) {
                Duration::ZERO
            } else {
                Duration::from_micros(5)
            },
            liveness_poll: Duration::from_millis(50),
            heartbeat_limit: Duration::from_secs(1),
            prefetch_next_line: false,
        }
    }
}

/// Counts of one side's slow-path events since it claimed its role: where a ring's time goes when
/// it is not moving records. Plain counters in the side's own memory, bumped only off the fast path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SideStats {
    /// Reloads of the peer's position: the producer's of the consumer's head (its cached copy
    /// said full); the consumer's of the header at its head that found the terminator (it has
    /// no copy of the tail: every such poll reloads the line the producer writes next).
    pub refreshes: u64,
    /// Reloads that found the ring still full (producer) or empty (consumer: every one of its
    /// reloads).
    pub stalls: u64,
    /// Futex sleeps this side entered while waiting.
    pub sleeps: u64,
    /// Futex wake-ups this side issued to a sleeping peer.
    pub wakes: u64,
}

impl SideStats {
    /// Size of [`to_bytes`](Self::to_bytes).
    pub const BYTES: usize = 32;

    /// The four counters, little-endian (to carry them in a record).
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        for (chunk, v) in
            out.chunks_exact_mut(8)
                .zip([self.refreshes, self.stalls, self.sleeps, self.wakes])
        {
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Reads what [`to_bytes`](Self::to_bytes) wrote; `None` if `bytes` is shorter.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        Some(SideStats {
            refreshes: word(0)?,
            stalls: word(1)?,
            sleeps: word(2)?,
            wakes: word(3)?,
        })
    }

    /// Counts accumulated since `earlier` (a snapshot of the same side).
    pub fn since(&self, earlier: &SideStats) -> SideStats {
        SideStats {
            refreshes: self.refreshes.wrapping_sub(earlier.refreshes),
            stalls: self.stalls.wrapping_sub(earlier.stalls),
            sleeps: self.sleeps.wrapping_sub(earlier.sleeps),
            wakes: self.wakes.wrapping_sub(earlier.wakes),
        }
    }
}

/// Cache-line size of the machines the ring is tuned for (bytes).
pub(crate) const LINE: usize = 64;

/// A hint that this core will write the cache line at `p` soon (`prefetchw`; nothing elsewhere).
#[inline(always)]
pub(crate) fn prefetch_write(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a prefetch has no architectural effect and never faults, whatever the address
    // (`prefetchw` executes as a NOP on x86-64 processors without it).
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags));
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// A hint that this core will read the cache line at `p` soon (`prefetcht0`; nothing elsewhere).
#[inline(always)]
pub(crate) fn prefetch_read(p: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a prefetch has no architectural effect and never faults, whatever the address
    // (`prefetcht0` is part of SSE, which every x86-64 processor has).
    unsafe {
        std::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, preserves_flags));
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Polls `ready` until it holds or `limit` has passed (reading the clock every 32 polls).
#[inline]
pub(crate) fn spin(limit: Duration, mut ready: impl FnMut() -> Result<bool>) -> Result<bool> {
    if ready()? {
        return Ok(true);
    }
    if limit.is_zero() {
        return Ok(false);
    }
    let start = std::time::Instant::now();
    loop {
        for _ in 0..32 {
            crate::sync::spin_hint();
            if ready()? {
                return Ok(true);
            }
        }
        if start.elapsed() >= limit {
            return Ok(false);
        }
    }
}

/// A role held in an owner slot; released on drop of its `Producer`/`Consumer`.
pub(crate) struct Claim {
    word: u64,
}

impl Claim {
    /// Claims `slot` for this process: free, or held by a dead process (takeover).
    pub(crate) fn take(slot: &AtomicU64, role: Role) -> Result<Claim> {
        let me = liveness::self_owner();
        // SYNC: Acquire pairs with the Release in `Claim::release` / the AcqRel CAS below by a
        // previous holder: its last writes to the ring happen before our take-over.
        let mut current = slot.load(Ordering::Acquire);
        loop {
            match liveness::holder(current) {
                Holder::Alive(pid) => return Err(Error::RoleTaken { role, pid }),
                Holder::None | Holder::Dead(_) => {}
            }
            // SYNC: AcqRel: Acquire as above; Release pairs with a later claimant's Acquire.
            match slot.compare_exchange(current, me, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Claim { word: me }),
                Err(actual) => current = actual,
            }
        }
    }

    /// Frees the slot if we still hold it.
    pub(crate) fn release(&self, slot: &AtomicU64) {
        // SYNC: Release pairs with the Acquire in `Claim::take` of the next holder.
        let _ = slot.compare_exchange(self.word, 0, Ordering::Release, Ordering::Relaxed);
    }
}

/// Marks the ring poisoned (locally and in the header) and returns the error to report.
pub(crate) fn poison(
    hdr: &crate::layout::Header,
    local: &mut Option<&'static str>,
    what: &'static str,
) -> Error {
    *local = Some(what);
    hdr.meta.poisoned.store(1, Ordering::Relaxed);
    Error::Corrupt { what }
}

/// Fails if this side or the peer found the ring corrupt.
#[inline]
pub(crate) fn check_poison(
    hdr: &crate::layout::Header,
    local: &mut Option<&'static str>,
) -> Result<()> {
    if local.is_none() && hdr.meta.poisoned.load(Ordering::Relaxed) == 0 {
        return Ok(());
    }
    Err(poisoned(local))
}

#[cold]
fn poisoned(local: &mut Option<&'static str>) -> Error {
    let what = *local.get_or_insert("ring (poisoned by the peer)");
    Error::Corrupt { what }
}

/// A ring's memory with its header and data-area addresses read once. Through `Arc<M>` the hot
/// paths reload both from the shared allocation after every write to the data area (the compiler
/// cannot tell the writes apart from writes to it); fields of the `Producer`/`Consumer` itself stay
/// in registers. Derefs to `M` for everything else.
pub(crate) struct Mapped<M: Memory> {
    mem: Arc<M>,
    header: std::ptr::NonNull<crate::layout::Header>,
    data: *mut u8,
    /// `capacity - 8`: a position's 8-aligned offset in the data area.
    word_mask: u64,
}

// SAFETY: the two pointers point into the memory `mem` owns, which is `Send + Sync` (a `Memory`
// bound) and lives as long as this value; they are only read through, as `M`'s own accessors are.
unsafe impl<M: Memory> Send for Mapped<M> {}
// SAFETY: as above; `&Mapped` hands out only `&Header` (atomics) and the raw data pointer.
unsafe impl<M: Memory> Sync for Mapped<M> {}

impl<M: Memory> Mapped<M> {
    pub(crate) fn new(mem: Arc<M>) -> Self {
        let header = std::ptr::NonNull::from(mem.header());
        let data = mem.data();
        let word_mask = (mem.capacity() - 1) & !7;
        Mapped {
            mem,
            header,
            data,
            word_mask,
        }
    }

    /// The record-header word at position `pos` of the data area (taken modulo the capacity,
    /// rounded down to 8 bytes). Record headers and terminators are only ever accessed through it.
    #[inline]
    pub(crate) fn word(&self, pos: u64) -> &AtomicU64 {
        let off = pos & self.word_mask;
        #[cfg(not(loom))]
        {
            // SAFETY: `off` is a multiple of 8 below the capacity, and `data` is 8-aligned and valid
            // for reads and writes of `capacity` bytes while `mem` (owned by `self`) lives, so the
            // 8 bytes are a valid `AtomicU64` for the borrow. Header words are accessed atomically
            // (here) by both sides; the payload copies that reuse those bytes in another lap of the
            // ring are ordered with these accesses by the ring's protocol (Release/Acquire on the
            // header words and positions), so no non-atomic access races with an atomic one.
            unsafe { AtomicU64::from_ptr(self.data.add(off as usize).cast::<u64>()) }
        }
        #[cfg(loom)]
        self.mem.header_word(off)
    }

    /// The shared header (as `M::header`, without the reload).
    #[inline]
    pub(crate) fn header(&self) -> &crate::layout::Header {
        // SAFETY: `header` came from `mem.header()`, which `Memory` guarantees is an aligned,
        // initialised `Header` for as long as `mem` lives, and `mem` lives as long as `self`.
        unsafe { self.header.as_ref() }
    }

    /// Start of the data area (as `M::data`).
    #[inline]
    pub(crate) fn data(&self) -> *mut u8 {
        self.data
    }

    /// The shared handle on the memory.
    pub(crate) fn arc(&self) -> &Arc<M> {
        &self.mem
    }
}

impl<M: Memory> std::ops::Deref for Mapped<M> {
    type Target = M;
    #[inline]
    fn deref(&self) -> &M {
        &self.mem
    }
}

/// A handle on one ring: from it, claim the producer or the consumer role (each at most once
/// at a time across all processes). Cheap to clone; the memory lives while any handle, producer or
/// consumer does.
pub struct Ring<M: Memory = crate::DefaultMemory> {
    mem: Arc<M>,
}

impl<M: Memory> Clone for Ring<M> {
    fn clone(&self) -> Self {
        Ring {
            mem: Arc::clone(&self.mem),
        }
    }
}

impl<M: Memory> Ring<M> {
    /// Wraps an initialised memory region.
    pub(crate) fn from_memory(mem: M) -> Self {
        Ring { mem: Arc::new(mem) }
    }

    /// Claims the producer role.
    pub fn producer(&self) -> Result<Producer<M>> {
        Producer::claim(Arc::clone(&self.mem))
    }

    /// Claims the consumer role.
    pub fn consumer(&self) -> Result<Consumer<M>> {
        Consumer::claim(Arc::clone(&self.mem))
    }

    /// Data-area capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.mem.capacity() as usize
    }

    /// The underlying memory (for example the [`Segment`](crate::Segment), to read its name).
    pub fn memory(&self) -> &M {
        &self.mem
    }
}

impl Ring<HeapMemory> {
    /// A ring on the heap, for use inside one process (tests, models, benchmarks).
    pub fn heap(capacity: usize) -> Result<Self> {
        let mem = HeapMemory::new(capacity)?;
        let meta = &mem.header().meta;
        meta.capacity.store(capacity as u64, Ordering::Relaxed);
        meta.creator
            .store(liveness::self_owner(), Ordering::Relaxed);
        meta.magic.store(crate::layout::MAGIC, Ordering::Relaxed);
        // SYNC: Release pairs with the Acquire load of `version` in `Segment::attach` (kept the same
        // way here so heap and shared rings are initialised identically).
        meta.version
            .store(crate::layout::VERSION, Ordering::Release);
        Ok(Ring::from_memory(mem))
    }
}

/// Publishes one side's heartbeat from any thread, independently of the `Producer`/`Consumer` that
/// holds the role (for example a process's watchdog thread while its main loop computes). It keeps
/// the memory mapped while it lives; beating after the role was released only writes a timestamp
/// nobody reads.
pub struct Heartbeat<M: Memory = crate::DefaultMemory> {
    mem: Arc<M>,
    role: Role,
}

impl<M: Memory> Heartbeat<M> {
    pub(crate) fn new(mem: Arc<M>, role: Role) -> Self {
        Heartbeat { mem, role }
    }

    /// Publishes the side's heartbeat (CLOCK_MONOTONIC), as the role holder's `heartbeat` does.
    pub fn beat(&self) {
        let hdr = self.mem.header();
        let side = match self.role {
            Role::Producer => &hdr.prod_side,
            Role::Consumer => &hdr.cons_side,
        };
        side.heartbeat.store(liveness::now_ns(), Ordering::Relaxed);
    }

    /// Which side it beats for.
    pub fn role(&self) -> Role {
        self.role
    }
}
