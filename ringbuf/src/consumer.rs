//! The reading end: zero-copy borrows of committed records, batches, and waiting for data.

use crate::barrier;
use crate::error::{Error, Result, Role};
use crate::layout::{
    LIVE_BIT, MAX_POSITION, PAD_BIT, Parsed, RECORD_HEADER, RUN_BIT, decode_record, max_payload,
    parse_header, record_size,
};
use crate::liveness::{self, PeerState};
use crate::memory::Memory;
use crate::ring::{self, Claim, LINE, Mapped, SideStats, WaitConfig};
use crate::sync::Ordering;
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one reader of a ring. Not `Clone`: a second reader must claim the role (and gets
/// [`Error::RoleTaken`] while this one lives).
pub struct Consumer<M: Memory = crate::DefaultMemory> {
    mem: Mapped<M>,
    claim: Claim,
    cap: u64,
    mask: u64,
    max_payload: u64,
    /// Released head (the last value stored to `cons.pos`).
    head: u64,
    /// Records of the run at `head` already delivered (0 unless a run was read in part).
    run_index: u64,
    last_woken: u32,
    sleep_gen: u32,
    releases: u32,
    poisoned: Option<&'static str>,
    config: WaitConfig,
    stats: SideStats,
    /// This process is registered for the asymmetric barrier (see `barrier`).
    light: bool,
}

/// One record as seen by [`Consumer::pop_batch`].
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// The record's kind.
    pub kind: u16,
    /// The record's flags.
    pub flags: u16,
    /// The payload, borrowed from the ring.
    pub payload: &'a [u8],
}

/// Equal records lying back to back in the ring, as seen by [`Consumer::pop_runs`]: a run's
/// records (or part of them), or one record on its own. Each record is `record_len()` bytes at a
/// stride of `record_len()` rounded up to 8.
#[derive(Clone, Copy, Debug)]
pub struct Records<'a> {
    /// The records' kind.
    pub kind: u16,
    /// The records' flags (0 for a run's records).
    pub flags: u16,
    record_len: usize,
    stride: usize,
    count: usize,
    bytes: &'a [u8],
}

impl<'a> Records<'a> {
    /// How many records.
    #[inline]
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are none (never, as handed out by `pop_runs`).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Payload bytes of each record.
    #[inline]
    pub fn record_len(&self) -> usize {
        self.record_len
    }

    /// Record `i`'s payload.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        let start = i.checked_mul(self.stride)?;
        (i < self.count).then(|| &self.bytes[start..start + self.record_len])
    }

    /// Each record's payload, in order.
    #[inline]
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &'a [u8]> + 'a {
        let (bytes, len, stride) = (self.bytes, self.record_len, self.stride);
        (0..self.count).map(move |i| &bytes[i * stride..i * stride + len])
    }

    /// The records as `N`-byte arrays, when each is `N` bytes and `N` is a multiple of 8 (so
    /// they lie back to back with no padding); `None` otherwise.
    #[inline]
    pub fn as_arrays<const N: usize>(&self) -> Option<&'a [[u8; N]]> {
        if self.record_len != N || self.stride != N || N == 0 {
            return None;
        }
        let bytes: &'a [u8] = self.bytes;
        // SAFETY: with stride == len == N the slice holds exactly `count * N` bytes (the last
        // record adds `len`, the others `stride`); `[u8; N]` has alignment 1 and no invalid bit
        // patterns, and the borrow keeps the lifetime of the bytes.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<[u8; N]>(), self.count) })
    }
}

/// Where the next record lies (no borrow held).
#[derive(Clone, Copy)]
struct Next {
    pos: u64,
    len: u32,
    kind: u16,
    flags: u16,
    /// Records behind the header: 1, or a run's count (its records' flags are 0).
    count: u64,
}

impl Next {
    /// Bytes the record (or the whole run) occupies.
    #[inline]
    fn total(&self) -> u64 {
        if self.count == 1 {
            record_size(u64::from(self.len))
        } else {
            RECORD_HEADER as u64 + self.count * u64::from(self.len).next_multiple_of(8)
        }
    }
}

impl<M: Memory> Consumer<M> {
    pub(crate) fn claim(mem: Arc<M>) -> Result<Self> {
        let hdr = mem.header();
        let claim = Claim::take(&hdr.cons_side.owner, Role::Consumer)?;
        let cap = mem.capacity();
        // SYNC: Acquire pairs with the Release store of `cons.pos` by a previous consumer (release).
        let head = hdr.cons.pos.load(Ordering::Acquire);
        // SYNC: Acquire pairs with the producer's Release store of `prod.pos` (Producer::publish).
        let tail = hdr.prod.pos.load(Ordering::Acquire);
        let mut c = Consumer {
            claim,
            cap,
            mask: cap - 1,
            max_payload: max_payload(cap),
            head,
            run_index: 0,
            last_woken: hdr.prod_side.sleeping.load(Ordering::Relaxed),
            sleep_gen: 0,
            releases: 0,
            poisoned: None,
            config: WaitConfig::default(),
            stats: SideStats::default(),
            light: barrier::registered(),
            mem: Mapped::new(mem),
        };
        // The tail may lag the records the consumer sees (it is stored after their header).
        if tail > MAX_POSITION
            || head > MAX_POSITION
            || !head.is_multiple_of(8)
            || !tail.is_multiple_of(8)
            || tail.abs_diff(head) > cap
        {
            return Err(c.corrupt("positions at consumer attach"));
        }
        let gen_now = c.mem.header().cons_side.sleeping.load(Ordering::Relaxed);
        c.sleep_gen = gen_now.wrapping_add(gen_now & 1);
        c.mem
            .header()
            .cons_side
            .sleeping
            .store(c.sleep_gen, Ordering::Relaxed);
        let flags = if c.light { barrier::FLAG_MEMBARRIER } else { 0 };
        c.mem
            .header()
            .cons_side
            .flags
            .store(flags, Ordering::Relaxed);
        c.heartbeat();
        Ok(c)
    }

    /// Data-area capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Sets how long waits spin before sleeping, and the peer's heartbeat limit.
    pub fn set_wait_config(&mut self, config: WaitConfig) {
        self.config = config;
    }

    /// Borrows the next committed record, if any; it is released when the grant drops.
    #[inline]
    pub fn try_pop(&mut self) -> Result<Option<ReadGrant<'_, M>>> {
        match self.next_record(self.head)? {
            Some(next) => self.grant(next).map(Some),
            None => Ok(None),
        }
    }

    /// Hands up to `max` committed records to `f`, then releases them all with one store.
    /// Returns how many records `f` saw.
    #[inline]
    pub fn pop_batch(&mut self, max: usize, mut f: impl FnMut(Record<'_>)) -> Result<usize> {
        self.pop_runs(max, |run| {
            for payload in run.iter() {
                f(Record {
                    kind: run.kind,
                    flags: run.flags,
                    payload,
                });
            }
        })
    }

    /// Hands up to `max` committed records to `f` a run at a time — equal records a batch wrote
    /// back to back (see [`Batch::push_slice`](crate::Batch::push_slice)) as one borrowed slice,
    /// a record on its own as a slice of one — then releases them all with one store. Returns how
    /// many records `f` saw. The same records, in the same order, as [`pop_batch`](Self::pop_batch).
    #[inline]
    pub fn pop_runs(&mut self, max: usize, mut f: impl FnMut(Records<'_>)) -> Result<usize> {
        ring::check_poison(self.mem.header(), &mut self.poisoned)?;
        let mut pos = self.head;
        let mut first = self.run_index;
        let mut n = 0;
        let mut outcome = Ok(());
        while n < max {
            match self.next_checked(pos) {
                Ok(Some(next)) => {
                    if first >= next.count {
                        outcome = Err(self.corrupt("run length"));
                        break;
                    }
                    let take = (next.count - first).min((max - n) as u64);
                    f(self.records(next, first, take));
                    n += take as usize;
                    if first + take < next.count {
                        // Stopped inside a run: release what precedes it, remember how far.
                        first += take;
                        break;
                    }
                    pos = next.pos + next.total();
                    first = 0;
                }
                Ok(None) => break,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if pos != self.head {
            self.release(pos);
        }
        self.run_index = first;
        outcome.map(|()| n)
    }

    /// Waits up to `timeout` for a record: spins briefly, then sleeps on a cross-process futex.
    /// `Ok(None)` on timeout; `Err(PeerDead)` once the ring is empty and the producer has died.
    pub fn pop_wait(&mut self, timeout: Duration) -> Result<Option<ReadGrant<'_, M>>> {
        if self.wait_data(timeout)? {
            self.try_pop()
        } else {
            Ok(None)
        }
    }

    /// Waits like [`pop_wait`](Self::pop_wait), then hands up to `max` records to `f` as
    /// [`pop_batch`](Self::pop_batch) does. `Ok(0)` on timeout.
    pub fn pop_batch_wait(
        &mut self,
        max: usize,
        timeout: Duration,
        f: impl FnMut(Record<'_>),
    ) -> Result<usize> {
        if self.wait_data(timeout)? {
            self.pop_batch(max, f)
        } else {
            Ok(0)
        }
    }

    /// Waits like [`pop_wait`](Self::pop_wait), then hands up to `max` records to `f` a run at a
    /// time as [`pop_runs`](Self::pop_runs) does. `Ok(0)` on timeout.
    pub fn pop_runs_wait(
        &mut self,
        max: usize,
        timeout: Duration,
        f: impl FnMut(Records<'_>),
    ) -> Result<usize> {
        if self.wait_data(timeout)? {
            self.pop_runs(max, f)
        } else {
            Ok(0)
        }
    }

    /// Publishes this side's heartbeat (CLOCK_MONOTONIC). Waits and every 1024th release do it too.
    pub fn heartbeat(&self) {
        self.mem
            .header()
            .cons_side
            .heartbeat
            .store(liveness::now_ns(), Ordering::Relaxed);
    }

    /// A handle that publishes this side's heartbeat from another thread.
    pub fn heartbeat_handle(&self) -> crate::ring::Heartbeat<M> {
        crate::ring::Heartbeat::new(Arc::clone(self.mem.arc()), Role::Consumer)
    }

    /// The producer's liveness.
    pub fn peer_state(&self) -> PeerState {
        let side = &self.mem.header().prod_side;
        liveness::peer_state(
            side.owner.load(Ordering::Relaxed),
            side.heartbeat.load(Ordering::Relaxed),
            self.config.heartbeat_limit,
        )
    }

    /// This side's slow-path counters (polls that found the ring empty, counted as reloads and
    /// stalls; sleeps; wakes) since it claimed the role.
    pub fn stats(&self) -> SideStats {
        self.stats
    }

    fn corrupt(&mut self, what: &'static str) -> Error {
        ring::poison(self.mem.header(), &mut self.poisoned, what)
    }

    #[inline]
    fn grant(&mut self, next: Next) -> Result<ReadGrant<'_, M>> {
        let index = self.run_index;
        if index >= next.count {
            return Err(self.corrupt("run length"));
        }
        let payload = self.payload(next, index);
        let (ptr, len) = (payload.as_ptr(), payload.len());
        Ok(ReadGrant {
            next: (index + 1 == next.count).then(|| next.pos + next.total()),
            kind: next.kind,
            flags: next.flags,
            ptr,
            len,
            consumer: self,
        })
    }

    /// The payload of record `index` of `next` (0 for a plain record).
    #[inline]
    fn payload(&self, next: Next, index: u64) -> &[u8] {
        let stride = u64::from(next.len).next_multiple_of(8);
        let off = (next.pos & self.mask) + RECORD_HEADER as u64 + index * stride;
        self.mem.track_read(off, stride);
        // SAFETY: `next_record` checked that the record (or the whole run, `count` records of
        // `stride` bytes after the header, `index < count`) lies inside the data area, and loaded
        // its header with Acquire after the producer stored it with Release, so its bytes are
        // initialised, complete, and not written by a well-behaved producer until we release them.
        unsafe { std::slice::from_raw_parts(self.mem.data().add(off as usize), next.len as usize) }
    }

    /// Records `first..first + count` of `next` as one slice.
    #[inline]
    fn records(&self, next: Next, first: u64, count: u64) -> Records<'_> {
        let len = u64::from(next.len);
        let stride = len.next_multiple_of(8);
        let off = (next.pos & self.mask) + RECORD_HEADER as u64 + first * stride;
        // From the first record's start to the last one's end (no padding after it).
        let bytes = (count - 1) * stride + len;
        self.mem.track_read(off, count * stride);
        Records {
            kind: next.kind,
            flags: next.flags,
            record_len: len as usize,
            stride: stride as usize,
            count: count as usize,
            // SAFETY: as in `payload`: `next_checked` checked that the run's `next.count` records
            // of `stride` bytes after its header lie inside the data area and are published, and `first + count <= next.count`, so these bytes are complete and stay
            // unwritten until we release them.
            bytes: unsafe {
                std::slice::from_raw_parts(self.mem.data().add(off as usize), bytes as usize)
            },
        }
    }

    /// Whether a record (or padding) is published at `pos`: its header word is not the terminator.
    #[inline]
    fn available(&mut self, pos: u64) -> bool {
        // SYNC: Acquire pairs with the producer's Release store of a publish's first header
        // (Producer::publish).
        let word = self.mem.word(pos).load(Ordering::Acquire);
        if word == 0 {
            self.empty_poll(pos);
        }
        word != 0
    }

    /// Counts a poll that found the ring empty (each reloads the line the producer writes next),
    /// and with [`WaitConfig::prefetch_next_line`] asks for the line after that one. A hint only:
    /// nothing is read from it before the header says it is written.
    #[cold]
    fn empty_poll(&mut self, pos: u64) {
        self.stats.refreshes += 1;
        self.stats.stalls += 1;
        if self.config.prefetch_next_line {
            let next_line = ((pos | (LINE as u64 - 1)) + 1) & self.mask;
            ring::prefetch_read(self.mem.data().wrapping_add(next_line as usize));
        }
    }

    /// Validates the record at `pos` (skipping a padding record), without releasing anything.
    #[inline]
    fn next_record(&mut self, pos: u64) -> Result<Option<Next>> {
        ring::check_poison(self.mem.header(), &mut self.poisoned)?;
        self.next_checked(pos)
    }

    /// [`next_record`](Self::next_record) once the poison flag was checked: the common case (a
    /// data record, in bounds) inline, padding, runs and errors out of line. `Ok(None)`: the
    /// terminator (nothing published at `pos` yet).
    #[inline(always)]
    fn next_checked(&mut self, pos: u64) -> Result<Option<Next>> {
        let off = pos & self.mask;
        // SYNC: Acquire pairs with the producer's Release store of a publish's first header
        // (Producer::publish): that publish's records, headers and terminator are written. The
        // headers after the first were stored before it, so this load sees them too.
        let word = self.mem.word(pos).load(Ordering::Acquire);
        if word == 0 {
            self.empty_poll(pos);
            return Ok(None);
        }
        let (len, kind, flags) = decode_record(word);
        let total = record_size(u64::from(len & !(PAD_BIT | RUN_BIT | LIVE_BIT)));
        if len & (PAD_BIT | RUN_BIT | LIVE_BIT) != LIVE_BIT
            || u64::from(len & !LIVE_BIT) > self.max_payload
            || off + total > self.cap
            || pos + total + RECORD_HEADER as u64 - self.head > self.cap
        {
            return self.next_slow(pos, word);
        }
        Ok(Some(Next {
            pos,
            len: len & !LIVE_BIT,
            kind,
            flags,
            count: 1,
        }))
    }

    /// The record at `pos`, whose header is `word`, when it is padding (skipped), a run, or fails
    /// a check (an error).
    #[inline(never)]
    fn next_slow(&mut self, mut pos: u64, mut word: u64) -> Result<Option<Next>> {
        let mut parsed = self.parse(pos, word)?;
        if let Parsed::Pad { skip } = parsed {
            pos += skip;
            // SYNC: as in `next_checked` (the padding and the record after it are one publish).
            word = self.mem.word(pos).load(Ordering::Acquire);
            if word == 0 {
                self.empty_poll(pos);
                return Ok(None);
            }
            parsed = self.parse(pos, word)?;
        }
        let Parsed::Records {
            len,
            kind,
            flags,
            count,
            total,
        } = parsed
        else {
            return Err(self.corrupt("padding record"));
        };
        // Within one lap of what we released, with the terminator's word after it.
        if pos + total + RECORD_HEADER as u64 - self.head > self.cap {
            return Err(self.corrupt("record length"));
        }
        Ok(Some(Next {
            pos,
            len,
            kind,
            flags,
            count,
        }))
    }

    /// `parse_header` of the word at `pos`, a failure poisoning the ring.
    fn parse(&mut self, pos: u64, word: u64) -> Result<Parsed> {
        parse_header(word, pos & self.mask, self.cap, self.max_payload)
            .map_err(|what| self.corrupt(what))
    }

    /// Stores `pos` as the new head and wakes the producer if it sleeps for room.
    #[inline]
    fn release(&mut self, pos: u64) {
        let hdr = self.mem.header();
        // SYNC: Release pairs with the producer's Acquire load of `cons.pos` (Producer::has_room):
        // our reads of the released records happen before the producer overwrites them.
        hdr.cons.pos.store(pos, Ordering::Release);
        self.head = pos;
        // SYNC: StoreLoad barrier pairs with the producer's `barrier::waiter` in `Producer::wait_room`
        // (eventcount).
        barrier::publisher(
            self.light
                && hdr.prod_side.flags.load(Ordering::Relaxed) & barrier::FLAG_MEMBARRIER != 0,
        );
        let sleeping = hdr.prod_side.sleeping.load(Ordering::Relaxed);
        if sleeping & 1 == 1 && sleeping != self.last_woken {
            self.last_woken = sleeping;
            self.stats.wakes += 1;
            // SYNC: Release pairs with the producer's Acquire load of our doorbell in `Producer::wait_room`.
            hdr.cons_side.doorbell.fetch_add(1, Ordering::Release);
            self.mem.wake(&hdr.cons_side.doorbell);
        }
        self.releases = self.releases.wrapping_add(1);
        if self.releases.is_multiple_of(1024) {
            self.heartbeat();
        }
    }

    /// Spins, then sleeps on the producer's doorbell until data is published, the deadline passes
    /// (`Ok(false)`), or the producer dies with the ring empty.
    fn wait_data(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            ring::check_poison(self.mem.header(), &mut self.poisoned)?;
            let (limit, head) = (self.config.spin, self.head);
            if ring::spin(limit, || Ok(self.available(head)))? {
                return Ok(true);
            }
            let hdr = self.mem.header();
            // SYNC: Acquire pairs with the producer's Release bump of its doorbell (`Producer::publish`).
            let bell = hdr.prod_side.doorbell.load(Ordering::Acquire);
            self.sleep_gen = self.sleep_gen.wrapping_add(1);
            hdr.cons_side
                .sleeping
                .store(self.sleep_gen, Ordering::Relaxed);
            // SYNC: pairs with the producer's `barrier::publisher` in `Producer::publish` (eventcount):
            // either we see its first header below, or it sees our odd `sleeping` and rings the
            // doorbell.
            barrier::waiter(self.light);
            let ready: Result<bool> = Ok(self.available(self.head));
            let now = Instant::now();
            let owner = self.mem.header().prod_side.owner.load(Ordering::Relaxed);
            let outcome = match ready {
                Ok(true) => Some(Ok(true)),
                Err(e) => Some(Err(e)),
                Ok(false) => match liveness::holder(owner) {
                    liveness::Holder::Dead(pid) => Some(Err(Error::PeerDead { pid })),
                    _ if now >= deadline => Some(Ok(false)),
                    _ => {
                        self.heartbeat();
                        let nap = (deadline - now).min(self.config.liveness_poll);
                        self.stats.sleeps += 1;
                        self.mem
                            .wait(&self.mem.header().prod_side.doorbell, bell, nap);
                        None
                    }
                },
            };
            self.sleep_gen = self.sleep_gen.wrapping_add(1);
            self.mem
                .header()
                .cons_side
                .sleeping
                .store(self.sleep_gen, Ordering::Relaxed);
            if let Some(result) = outcome {
                return result;
            }
        }
    }
}

impl<M: Memory> Drop for Consumer<M> {
    #[inline]
    fn drop(&mut self) {
        self.claim.release(&self.mem.header().cons_side.owner);
    }
}

/// One committed record borrowed from the ring (derefs to its payload). Released on drop.
pub struct ReadGrant<'a, M: Memory = crate::DefaultMemory> {
    consumer: &'a mut Consumer<M>,
    ptr: *const u8,
    len: usize,
    kind: u16,
    flags: u16,
    /// Where the head moves on release; `None` inside a run (the run's next record follows).
    next: Option<u64>,
}

impl<M: Memory> ReadGrant<'_, M> {
    /// The record's kind.
    #[inline]
    pub fn kind(&self) -> u16 {
        self.kind
    }

    /// The record's flags.
    #[inline]
    pub fn flags(&self) -> u16 {
        self.flags
    }
}

impl<M: Memory> Deref for ReadGrant<'_, M> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr`/`len` came from `Consumer::payload`, which validated them; the grant holds
        // `&mut Consumer`, so the record is not released (and not overwritten) while it lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<M: Memory> Drop for ReadGrant<'_, M> {
    #[inline]
    fn drop(&mut self) {
        match self.next {
            Some(next) => {
                self.consumer.run_index = 0;
                self.consumer.release(next);
            }
            None => self.consumer.run_index += 1,
        }
    }
}

impl<M: Memory> std::fmt::Debug for Consumer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hdr = self.mem.header();
        f.debug_struct("Consumer")
            .field("head", &self.head)
            .field("shared_tail", &hdr.prod.pos.load(Ordering::Relaxed))
            .field("sleep_gen", &self.sleep_gen)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}
