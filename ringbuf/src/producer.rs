//! The writing end: zero-copy reservations, batches, publishing and waiting for space.

use crate::barrier;
use crate::error::{Error, Result, Role};
use crate::layout::{
    MAX_POSITION, MAX_RUN, PAD_BIT, Parsed, RECORD_HEADER, RUN_BIT, encode_record, max_payload,
    parse_header, record_size,
};
use crate::liveness::{self, PeerState};
use crate::memory::Memory;
use crate::ring::{self, Claim, LINE, Mapped, SideStats, WaitConfig, prefetch_write};
use crate::sync::Ordering;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The unpublished record at the end of a batch that equal records extend (see `RUN_BIT`).
#[derive(Clone, Copy, Debug)]
struct Run {
    /// Position of its header.
    pos: u64,
    /// Payload bytes of each record.
    len: u32,
    kind: u16,
    /// Records in it so far (1: still a plain record).
    count: u64,
}

/// Largest single copy of `push_slice` (see `extend_run_many`).
const COPY_PIECE: usize = 4096;

/// Most spin hints a producer waits before reloading the head of a ring that stayed full.
const FULL_BACKOFF_MAX: u32 = 64;

/// The one writer of a ring. Not `Clone`: a second writer must claim the role (and gets
/// [`Error::RoleTaken`] while this one lives).
pub struct Producer<M: Memory = crate::DefaultMemory> {
    mem: Mapped<M>,
    claim: Claim,
    cap: u64,
    mask: u64,
    max_payload: u64,
    /// Published tail (the last value stored to `prod.pos`), where the terminator lies.
    tail: u64,
    /// The header of the record (or padding) at `tail`, stored last, with `Release`, by `publish`.
    first_header: u64,
    /// End of records committed but not yet published (inside a [`Batch`]); `== tail` otherwise.
    pending: u64,
    /// Number of records between `tail` and `pending`.
    pending_records: usize,
    /// Our copy of the consumer's head; refreshed only when the ring looks full.
    cached_head: u64,
    /// The consumer's `sleeping` generation we last woke (one wake per sleep).
    last_woken: u32,
    /// Our own `sleeping` generation (even: awake).
    sleep_gen: u32,
    publishes: u32,
    poisoned: Option<&'static str>,
    config: WaitConfig,
    stats: SideStats,
    /// Reloads in a row that found the ring full (the backoff before the next one doubles).
    full_streak: u32,
    /// The last record of the current batch, which an equal record may join as a run.
    run: Option<Run>,
    /// This process is registered for the asymmetric barrier (see `barrier`).
    light: bool,
}

impl<M: Memory> Producer<M> {
    pub(crate) fn claim(mem: Arc<M>) -> Result<Self> {
        let hdr = mem.header();
        let claim = Claim::take(&hdr.prod_side.owner, Role::Producer)?;
        let cap = mem.capacity();
        // SYNC: Acquire pairs with the Release stores of `prod.pos` by a previous producer (publish):
        // records it published are complete before we continue after them.
        let tail = hdr.prod.pos.load(Ordering::Acquire);
        // SYNC: Acquire pairs with the consumer's Release store of `cons.pos` (Consumer::release).
        let head = hdr.cons.pos.load(Ordering::Acquire);
        let mut p = Producer {
            claim,
            cap,
            mask: cap - 1,
            max_payload: max_payload(cap),
            tail,
            first_header: 0,
            pending: tail,
            pending_records: 0,
            cached_head: head,
            last_woken: hdr.cons_side.sleeping.load(Ordering::Relaxed),
            sleep_gen: 0,
            publishes: 0,
            poisoned: None,
            config: WaitConfig::default(),
            stats: SideStats::default(),
            full_streak: 0,
            run: None,
            light: barrier::registered(),
            mem: Mapped::new(mem),
        };
        if tail > MAX_POSITION
            || head > MAX_POSITION
            || !tail.is_multiple_of(8)
            || !head.is_multiple_of(8)
            || tail.abs_diff(head) > cap
        {
            return Err(p.corrupt("positions at producer attach"));
        }
        // A predecessor that died between storing a publish's first header and its tail left
        // records the consumer can see (and may have read) beyond the tail: continue after them.
        let end = p.walk_published(tail, head)?;
        p.tail = end;
        p.pending = end;
        // Clear a dead predecessor's sleeping flag: round our generation up to even.
        let gen_now = p.mem.header().prod_side.sleeping.load(Ordering::Relaxed);
        p.sleep_gen = gen_now.wrapping_add(gen_now & 1);
        p.mem
            .header()
            .prod_side
            .sleeping
            .store(p.sleep_gen, Ordering::Relaxed);
        let flags = if p.light { barrier::FLAG_MEMBARRIER } else { 0 };
        p.mem
            .header()
            .prod_side
            .flags
            .store(flags, Ordering::Relaxed);
        p.heartbeat();
        Ok(p)
    }

    /// Largest payload one record may carry (half the capacity minus the record header).
    pub fn max_payload(&self) -> usize {
        self.max_payload as usize
    }

    /// Data-area capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Sets how long waits spin before sleeping, and the peer's heartbeat limit.
    pub fn set_wait_config(&mut self, config: WaitConfig) {
        self.config = config;
    }

    /// Reserves room for one record of `len` payload bytes. `Ok(None)`: the ring is full for now.
    /// The grant publishes on [`WriteGrant::commit`]; dropped uncommitted, it publishes nothing.
    #[inline]
    pub fn reserve(&mut self, len: usize) -> Result<Option<WriteGrant<'_, M>>> {
        self.reserve_inner(len, true)
    }

    /// Copies `payload` into a record of kind 0 and publishes it. `Ok(false)`: the ring is full.
    #[inline]
    pub fn try_push(&mut self, payload: &[u8]) -> Result<bool> {
        self.try_push_kind(0, payload)
    }

    /// Like [`try_push`](Self::try_push) with a record kind.
    #[inline]
    pub fn try_push_kind(&mut self, kind: u16, payload: &[u8]) -> Result<bool> {
        if !self.write_record(kind, payload, false)? {
            return Ok(false);
        }
        self.publish();
        Ok(true)
    }

    /// Copies as many of `items` as fit into records of `kind` and publishes them together
    /// ([`Batch::push_slice`] committed at once). Returns how many (0: the ring is full).
    #[inline]
    pub fn push_slice<const N: usize>(&mut self, kind: u16, items: &[[u8; N]]) -> Result<usize> {
        let mut batch = self.batch();
        let n = batch.push_slice(kind, items)?;
        batch.commit();
        Ok(n)
    }

    /// Starts a batch: records committed through it are published together by [`Batch::commit`]
    /// with one Release store and at most one wake-up.
    pub fn batch(&mut self) -> Batch<'_, M> {
        Batch { producer: self }
    }

    /// Waits up to `timeout` for room for a `len`-byte record. `Ok(None)` on timeout;
    /// `Err(PeerDead)` if the consumer died (a dead consumer frees no room).
    pub fn reserve_wait(
        &mut self,
        len: usize,
        timeout: Duration,
    ) -> Result<Option<WriteGrant<'_, M>>> {
        let total = self.record_total(len)?;
        if self.wait_room(total, timeout)? {
            self.reserve_inner(len, true)
        } else {
            Ok(None)
        }
    }

    /// Copies `payload` into a record, waiting up to `timeout` for room. `Ok(false)` on timeout.
    pub fn push_wait(&mut self, payload: &[u8], timeout: Duration) -> Result<bool> {
        Ok(match self.reserve_wait(payload.len(), timeout)? {
            Some(mut grant) => {
                grant.copy_from_slice(payload);
                grant.commit();
                true
            }
            None => false,
        })
    }

    /// Publishes this side's heartbeat (CLOCK_MONOTONIC). Waits and every 1024th publish do it too;
    /// an otherwise idle producer should call it more often than the consumer's heartbeat limit.
    pub fn heartbeat(&self) {
        self.mem
            .header()
            .prod_side
            .heartbeat
            .store(liveness::now_ns(), Ordering::Relaxed);
    }

    /// A handle that publishes this side's heartbeat from another thread.
    pub fn heartbeat_handle(&self) -> crate::ring::Heartbeat<M> {
        crate::ring::Heartbeat::new(Arc::clone(self.mem.arc()), crate::error::Role::Producer)
    }

    /// The consumer's liveness.
    pub fn peer_state(&self) -> PeerState {
        let side = &self.mem.header().cons_side;
        liveness::peer_state(
            side.owner.load(Ordering::Relaxed),
            side.heartbeat.load(Ordering::Relaxed),
            self.config.heartbeat_limit,
        )
    }

    /// This side's slow-path counters (reloads of the consumer's head, full-ring stalls, sleeps,
    /// wakes) since it claimed the role.
    pub fn stats(&self) -> SideStats {
        self.stats
    }

    /// Bytes published and not yet released by the consumer (as last seen).
    pub fn len_hint(&self) -> usize {
        (self.tail - self.cached_head) as usize
    }

    #[inline]
    fn record_total(&self, len: usize) -> Result<u64> {
        if len as u64 > self.max_payload {
            return Err(Error::TooLarge {
                len,
                max: self.max_payload as usize,
            });
        }
        Ok(record_size(len as u64))
    }

    fn corrupt(&mut self, what: &'static str) -> Error {
        ring::poison(self.mem.header(), &mut self.poisoned, what)
    }

    /// The end of the published records: from `from` (the published tail, a record boundary),
    /// over every header a predecessor released after it, to the terminator. It must reach the
    /// consumer's `head` and leave room for the terminator.
    fn walk_published(&mut self, from: u64, head: u64) -> Result<u64> {
        let mut pos = from;
        loop {
            if pos + RECORD_HEADER as u64 - head.min(pos) > self.cap {
                return Err(self.corrupt("records at producer attach"));
            }
            // SYNC: Acquire pairs with the Release store of a publish's first header by the previous
            // producer (`publish`): the records it covers, and the headers after it, are written.
            let word = self.mem.word(pos).load(Ordering::Acquire);
            if word == 0 {
                break;
            }
            match parse_header(word, pos & self.mask, self.cap, self.max_payload) {
                Ok(Parsed::Pad { skip }) => pos += skip,
                Ok(Parsed::Records { total, .. }) => pos += total,
                Err(what) => return Err(self.corrupt(what)),
            }
        }
        if pos < head {
            return Err(self.corrupt("consumer position"));
        }
        Ok(pos)
    }

    /// Writes the header word of the unpublished record (or padding) at `pos`: directly, or, for
    /// the one at the published tail, into `first_header`, which `publish` stores last.
    #[inline(always)]
    fn put_header(&mut self, pos: u64, word: u64) {
        if pos == self.tail {
            self.first_header = word;
        } else {
            self.mem.word(pos).store(word, Ordering::Relaxed);
        }
    }

    /// Fails if the ring is poisoned, checked once per batch (at its first record; every single
    /// push is a batch of one): records added to a batch after the peer poisoned the ring are
    /// published into a ring nobody reads, which is harmless, and the next batch fails.
    #[inline(always)]
    fn check_poison_once(&mut self) -> Result<()> {
        if self.pending == self.tail {
            ring::check_poison(self.mem.header(), &mut self.poisoned)?;
        }
        Ok(())
    }

    /// Writes one record of `kind` holding a copy of `payload` after `pending`, unpublished; in a
    /// batch (`join`), as one more record of the run the batch's last record started when it
    /// has the same length and kind. `Ok(false)`: the ring is full.
    #[inline(always)]
    fn write_record(&mut self, kind: u16, payload: &[u8], join: bool) -> Result<bool> {
        self.check_poison_once()?;
        if join
            && let Some(run) = self.run
            && run.len as usize == payload.len()
            && run.kind == kind
            && self.extend_run(run, payload)?
        {
            return Ok(true);
        }
        let total = self.record_total(payload.len())?;
        let Some(pos) = self.place(total)? else {
            return Ok(false);
        };
        let off = (pos & self.mask) as usize;
        // SAFETY: `place` checked that the `total` bytes at `off` (8-aligned) lie in the data area
        // beyond the published tail, where the consumer does not read; the payload fits in `total`
        // after the header (copied whole or as two pieces of it). `payload` cannot alias them: no borrow covers bytes beyond the tail
        // except a `WriteGrant`, which holds `&mut self`.
        unsafe {
            let dst = self.mem.data().add(off + RECORD_HEADER);
            // The bytes in the header's cache line last: a caught-up consumer polls that line, and
            // stores to it that follow each other (then the header) hand it over once.
            let in_line = (LINE - (off + RECORD_HEADER) % LINE) % LINE;
            if payload.len().is_multiple_of(8) && payload.len() <= DESCENDING_MAX {
                copy_descending(payload, dst);
            } else if payload.len() > in_line && in_line > 0 {
                copy_payload(&payload[in_line..], dst.add(in_line));
                copy_payload(&payload[..in_line], dst);
            } else {
                copy_payload(payload, dst);
            }
        }
        self.put_header(pos, encode_record(payload.len() as u32, kind, 0));
        self.pending = pos + total;
        self.pending_records += 1;
        self.run = join.then_some(Run {
            pos,
            len: payload.len() as u32,
            kind,
            count: 1,
        });
        Ok(true)
    }

    /// Appends `payload` to `run` (the batch's last record) without a header of its own, if it
    /// fits before the end of the data area and the run stays within a record's size limit.
    #[inline(always)]
    fn extend_run(&mut self, run: Run, payload: &[u8]) -> Result<bool> {
        let stride = (payload.len() as u64).next_multiple_of(8);
        let run_off = run.pos & self.mask;
        let run_total = self.pending - run.pos;
        // `run_off + run_total` may be exactly the end of the data area, where `pending`'s offset
        // wraps to 0: the run must not.
        let off = run_off + run_total;
        if run.count >= MAX_RUN
            || off + stride > self.cap
            || run_total + stride > self.max_payload + RECORD_HEADER as u64
            || !self.has_room(stride)?
        {
            return Ok(false);
        }
        self.mem.track_write(off, stride);
        self.mem
            .track_write(run.pos & self.mask, RECORD_HEADER as u64);
        let count = run.count + 1;
        // SAFETY: `has_room` and the checks above put the `stride` bytes at `off` (8-aligned)
        // inside the data area beyond the published tail; `payload` cannot alias them (as in
        // `write_record`).
        unsafe { copy_payload(payload, self.mem.data().add(off as usize)) };
        self.put_header(
            run.pos,
            encode_record(run.len | RUN_BIT, run.kind, count as u16),
        );
        self.pending += stride;
        self.pending_records += 1;
        self.run = Some(Run { count, ..run });
        Ok(true)
    }

    /// Copies `items` into the batch as records of `kind`, as many as fit, continuing the batch's
    /// run (or starting one): the equal records share one header and, when `N` is a multiple of 8,
    /// arrive in one copy. Returns how many were written (a prefix of `items`; 0: full).
    #[inline]
    fn write_slice<const N: usize>(&mut self, kind: u16, items: &[[u8; N]]) -> Result<usize> {
        let mut done = 0;
        while done < items.len() {
            if let Some(run) = self.run
                && run.len as usize == N
                && run.kind == kind
            {
                let k = self.extend_run_many(run, &items[done..])?;
                if k > 0 {
                    done += k;
                    continue;
                }
            }
            // No run to extend, or it cannot grow (wrap, size limits, full): a new record, which
            // also writes the padding before a wrap.
            if !self.write_record(kind, &items[done], true)? {
                break;
            }
            done += 1;
        }
        Ok(done)
    }

    /// Appends as many of `items` as fit to `run` (the batch's last record, of `N` bytes), in one
    /// copy when their stride is `N`, and rewrites its header once. Returns how many.
    #[inline]
    fn extend_run_many<const N: usize>(&mut self, run: Run, items: &[[u8; N]]) -> Result<usize> {
        let stride = (N as u64).next_multiple_of(8);
        // Empty records take no bytes: only the count limits them.
        let per = stride.max(1);
        let run_off = run.pos & self.mask;
        let run_total = self.pending - run.pos;
        // As in `extend_run`: the run ends before the end of the data area, and stays a record.
        let off = run_off + run_total;
        let limit = (items.len() as u64)
            .min(MAX_RUN - run.count)
            .min((self.cap - off) / per)
            .min((self.max_payload + RECORD_HEADER as u64).saturating_sub(run_total) / per);
        if limit == 0 || !self.has_room(stride)? {
            return Ok(0);
        }
        // Room after the terminator's word.
        let free = self.cap - RECORD_HEADER as u64 - (self.pending - self.cached_head);
        let k = limit.min(free / per);
        let bytes = k * stride;
        self.mem.track_write(off, bytes);
        self.mem
            .track_write(run.pos & self.mask, RECORD_HEADER as u64);
        let count = run.count + k;
        // SAFETY: `has_room` and the limits above put the `k * stride` bytes at `off` (8-aligned)
        // inside the data area, beyond the published tail and within the room the consumer
        // released. `items` cannot alias them (as in `write_record`). With `stride == N` the `k` items are
        // `k * N` contiguous bytes; otherwise each is copied to its own stride.
        unsafe {
            let dst = self.mem.data().add(off as usize);
            if stride == N as u64 {
                // In pieces: above a cache-size-dependent length glibc's memcpy may switch to
                // non-temporal stores, which would push the records out of the caches the
                // consumer is about to read them from.
                let src = items.as_ptr().cast::<u8>();
                let mut at = 0;
                while at < bytes as usize {
                    let n = (bytes as usize - at).min(COPY_PIECE);
                    std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), n);
                    at += n;
                }
            } else {
                for (i, item) in items[..k as usize].iter().enumerate() {
                    copy_payload(item, dst.add(i * stride as usize));
                }
            }
        }
        self.put_header(
            run.pos,
            encode_record(run.len | RUN_BIT, run.kind, count as u16),
        );
        self.pending += bytes;
        self.pending_records += k as usize;
        self.run = Some(Run { count, ..run });
        Ok(k as usize)
    }

    #[inline]
    fn reserve_inner(&mut self, len: usize, publish: bool) -> Result<Option<WriteGrant<'_, M>>> {
        self.check_poison_once()?;
        // A reserved record's kind and flags are set later: it never joins a run, and ends one.
        self.run = None;
        let total = self.record_total(len)?;
        let Some(pos) = self.place(total)? else {
            return Ok(None);
        };
        Ok(Some(WriteGrant {
            producer: self,
            pos,
            len: len as u32,
            kind: 0,
            flags: 0,
            publish,
        }))
    }

    /// Finds room for a record of `total` bytes at `pending`, writing a padding record first if it
    /// would cross the wrap. Returns the record's position.
    #[inline]
    fn place(&mut self, total: u64) -> Result<Option<u64>> {
        let off = self.pending & self.mask;
        let to_end = self.cap - off;
        let need = if total <= to_end {
            total
        } else {
            to_end + total
        };
        if !self.has_room(need)? {
            return Ok(None);
        }
        self.mem.track_write(off, total.min(to_end));
        if total <= to_end {
            return Ok(Some(self.pending));
        }
        self.mem.track_write(0, total);
        // to_end >= 8 since offsets and capacity are multiples of 8, and to_end < total <= cap/2.
        let word = encode_record(PAD_BIT | (to_end - RECORD_HEADER as u64) as u32, 0, 0);
        self.put_header(self.pending, word);
        Ok(Some(self.pending + to_end))
    }

    /// Whether `need` more bytes, and the terminator's word after them, fit.
    #[inline]
    fn has_room(&mut self, need: u64) -> Result<bool> {
        let end = self.pending + need + RECORD_HEADER as u64;
        if end - self.cached_head <= self.cap {
            return Ok(true);
        }
        self.refresh_head(end)
    }

    /// Reloads the consumer's head (the ring looked full); whether `end` now fits.
    ///
    /// While the ring stays full, each reload first pauses for a doubling number of spin hints
    /// (up to [`FULL_BACKOFF_MAX`]): a producer polling the consumer's head line as fast as it can
    /// takes that line away from the consumer on every poll, so each of the consumer's releases
    /// waits for the line to come back, and the full ring drains slower the faster it is polled.
    #[inline(never)]
    fn refresh_head(&mut self, end: u64) -> Result<bool> {
        for _ in 0..(1u32 << self.full_streak) >> 1 {
            crate::sync::spin_hint();
        }
        ring::check_poison(self.mem.header(), &mut self.poisoned)?;
        // SYNC: Acquire pairs with the consumer's Release store of `cons.pos` (Consumer::release):
        // the consumer has finished reading every byte below `head`, so we may overwrite it.
        let head = self.mem.header().cons.pos.load(Ordering::Acquire);
        if head < self.cached_head || head > self.tail || !head.is_multiple_of(8) {
            return Err(self.corrupt("consumer position"));
        }
        self.cached_head = head;
        self.mem
            .header()
            .prod
            .cached_peer
            .store(head, Ordering::Relaxed);
        let fits = end - head <= self.cap;
        self.full_streak = if fits {
            0
        } else {
            (self.full_streak + 1).min(FULL_BACKOFF_MAX.trailing_zeros() + 1)
        };
        self.stats.refreshes += 1;
        self.stats.stalls += u64::from(!fits);
        Ok(fits)
    }

    /// Stores `pending` as the new tail and wakes the consumer if it sleeps.
    #[inline]
    fn publish(&mut self) {
        if self.pending == self.tail {
            return;
        }
        // The terminator first (`has_room` kept its word free), then the first header.
        self.mem
            .track_write(self.pending & self.mask, RECORD_HEADER as u64);
        self.mem.word(self.pending).store(0, Ordering::Relaxed);
        // SYNC: Release pairs with the consumer's Acquire load of this header (Consumer::next_checked):
        // every record byte, header and the terminator written before it are visible to the
        // consumer once it sees this word.
        self.mem
            .word(self.tail)
            .store(self.first_header, Ordering::Release);
        let hdr = self.mem.header();
        // SYNC: Release pairs with the Acquire loads of `prod.pos` by a consumer or producer taking a
        // role over (`claim`), which walk on from it over the released headers.
        hdr.prod.pos.store(self.pending, Ordering::Release);
        let crossed = self.tail / LINE as u64 != self.pending / LINE as u64;
        self.tail = self.pending;
        if crossed {
            self.prefetch_ahead();
        }
        self.pending_records = 0;
        self.run = None;
        // SYNC: StoreLoad barrier pairs with the consumer's `barrier::waiter` in `Consumer::wait_data`
        // (eventcount): either its re-check sees our first header, or we see its `sleeping` flag.
        barrier::publisher(
            self.light
                && hdr.cons_side.flags.load(Ordering::Relaxed) & barrier::FLAG_MEMBARRIER != 0,
        );
        let sleeping = hdr.cons_side.sleeping.load(Ordering::Relaxed);
        if sleeping & 1 == 1 && sleeping != self.last_woken {
            self.last_woken = sleeping;
            self.stats.wakes += 1;
            // SYNC: Release pairs with the consumer's Acquire load of the doorbell before it flags
            // itself asleep: if it read this bump, it cannot have been the flag we just saw.
            hdr.prod_side.doorbell.fetch_add(1, Ordering::Release);
            self.mem.wake(&hdr.prod_side.doorbell);
        }
        self.publishes = self.publishes.wrapping_add(1);
        if self.publishes.is_multiple_of(1024) {
            self.heartbeat();
        }
    }

    /// Asks for the line [`PREFETCH_LINES`] ahead of the tail for writing (once a line: the tail
    /// just entered a new one), if it lies in room the consumer has released. A line the consumer
    /// read a lap ago costs a store that reaches it a round trip to the consumer's core; asked for
    /// early, that round trip overlaps the records written meanwhile instead of stalling them
    /// once the store buffer fills.
    #[inline]
    fn prefetch_ahead(&self) {
        let ahead = (self.tail & !(LINE as u64 - 1)) + PREFETCH_LINES * LINE as u64;
        if ahead + LINE as u64 - self.cached_head <= self.cap {
            prefetch_write(self.mem.data().wrapping_add((ahead & self.mask) as usize));
        }
    }

    /// Spins, then sleeps on the consumer's doorbell until `total` bytes fit, the deadline passes
    /// (`Ok(false)`), or the consumer dies.
    fn wait_room(&mut self, total: u64, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let hdr_owner = |m: &M| m.header().cons_side.owner.load(Ordering::Relaxed);
        loop {
            let off = self.pending & self.mask;
            let need = if total <= self.cap - off {
                total
            } else {
                self.cap - off + total
            };
            let limit = self.config.spin;
            if ring::spin(limit, || self.has_room(need))? {
                return Ok(true);
            }
            let hdr = self.mem.header();
            // SYNC: Acquire pairs with the consumer's Release bump of its doorbell (Consumer::release).
            let bell = hdr.cons_side.doorbell.load(Ordering::Acquire);
            self.sleep_gen = self.sleep_gen.wrapping_add(1);
            hdr.prod_side
                .sleeping
                .store(self.sleep_gen, Ordering::Relaxed);
            // SYNC: pairs with the consumer's `barrier::publisher` in `Consumer::release` (eventcount).
            barrier::waiter(self.light);
            let room = self.has_room(need);
            let now = Instant::now();
            let outcome = match room {
                Ok(true) => Some(Ok(true)),
                Err(e) => Some(Err(e)),
                Ok(false) => match liveness::holder(hdr_owner(&self.mem)) {
                    liveness::Holder::Dead(pid) => Some(Err(Error::PeerDead { pid })),
                    _ if now >= deadline => Some(Ok(false)),
                    _ => {
                        self.heartbeat();
                        let nap = (deadline - now).min(self.config.liveness_poll);
                        self.stats.sleeps += 1;
                        self.mem
                            .wait(&self.mem.header().cons_side.doorbell, bell, nap);
                        None
                    }
                },
            };
            self.sleep_gen = self.sleep_gen.wrapping_add(1);
            self.mem
                .header()
                .prod_side
                .sleeping
                .store(self.sleep_gen, Ordering::Relaxed);
            if let Some(result) = outcome {
                return result;
            }
        }
    }
}

impl<M: Memory> Drop for Producer<M> {
    fn drop(&mut self) {
        self.claim.release(&self.mem.header().prod_side.owner);
    }
}

/// Room for one record in the ring, borrowed as `&mut [u8]` (the payload). Publishes on
/// [`commit`](Self::commit) (or, inside a [`Batch`], on the batch's commit); dropped uncommitted it
/// publishes nothing.
pub struct WriteGrant<'a, M: Memory = crate::DefaultMemory> {
    producer: &'a mut Producer<M>,
    pos: u64,
    len: u32,
    kind: u16,
    flags: u16,
    publish: bool,
}

impl<M: Memory> WriteGrant<'_, M> {
    /// Sets the record's kind (default 0).
    #[inline]
    pub fn set_kind(&mut self, kind: u16) {
        self.kind = kind;
    }

    /// Sets the record's flags (default 0).
    #[inline]
    pub fn set_flags(&mut self, flags: u16) {
        self.flags = flags;
    }

    /// Commits the record: publishes it now, or with its batch.
    #[inline]
    pub fn commit(self) {
        let p = self.producer;
        p.put_header(self.pos, encode_record(self.len, self.kind, self.flags));
        p.pending = self.pos + record_size(u64::from(self.len));
        p.pending_records += 1;
        if self.publish {
            p.publish();
        }
    }
}

impl<M: Memory> Deref for WriteGrant<'_, M> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        let p = &*self.producer;
        // SAFETY: `place` reserved `len` payload bytes after the header at `pos`, inside the data area
        // and beyond the published tail: no one else reads or writes them while this grant lives.
        unsafe {
            std::slice::from_raw_parts(
                p.mem
                    .data()
                    .add((self.pos & p.mask) as usize + RECORD_HEADER),
                self.len as usize,
            )
        }
    }
}

impl<M: Memory> DerefMut for WriteGrant<'_, M> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        let p = &*self.producer;
        // SAFETY: as in `deref`; `&mut self` makes this the only borrow of those bytes.
        unsafe {
            std::slice::from_raw_parts_mut(
                p.mem
                    .data()
                    .add((self.pos & p.mask) as usize + RECORD_HEADER),
                self.len as usize,
            )
        }
    }
}

/// Several records published together by one Release store and at most one wake-up. Dropped
/// without [`commit`](Self::commit), it publishes nothing.
pub struct Batch<'a, M: Memory = crate::DefaultMemory> {
    producer: &'a mut Producer<M>,
}

impl<M: Memory> Batch<'_, M> {
    /// Reserves the next record of the batch; its [`WriteGrant::commit`] adds it to the batch.
    #[inline]
    pub fn reserve(&mut self, len: usize) -> Result<Option<WriteGrant<'_, M>>> {
        self.producer.reserve_inner(len, false)
    }

    /// Copies `payload` into the batch as a record of kind 0. `Ok(false)`: the ring is full.
    /// A record with the length and kind of the batch's previous one joins it in a run (one
    /// header for many records; the consumer still sees each record on its own).
    #[inline]
    pub fn try_push(&mut self, payload: &[u8]) -> Result<bool> {
        self.producer.write_record(0, payload, true)
    }

    /// Like [`try_push`](Self::try_push) with a record kind.
    #[inline]
    pub fn try_push_kind(&mut self, kind: u16, payload: &[u8]) -> Result<bool> {
        self.producer.write_record(kind, payload, true)
    }

    /// Copies equal records into the batch, as many as fit, as [`try_push_kind`](Self::try_push_kind)
    /// would one by one, but in bulk: they form runs (one header for up to 65,535 records) and,
    /// when `N` is a multiple of 8, arrive in one copy. Returns how many were added (a prefix of
    /// `items`; 0: the ring is full). The consumer still sees each record on its own.
    #[inline]
    pub fn push_slice<const N: usize>(&mut self, kind: u16, items: &[[u8; N]]) -> Result<usize> {
        self.producer.write_slice(kind, items)
    }

    /// Records committed to this batch so far.
    #[inline]
    pub fn len(&self) -> usize {
        self.producer.pending_records
    }

    /// Whether no record was committed to this batch yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publishes every record of the batch; returns how many.
    #[inline]
    pub fn commit(self) -> usize {
        let n = self.producer.pending_records;
        self.producer.publish();
        n
    }
}

impl<M: Memory> Drop for Batch<'_, M> {
    fn drop(&mut self) {
        // Uncommitted records are discarded (after `commit`, pending == tail already).
        let p = &mut *self.producer;
        p.pending = p.tail;
        p.pending_records = 0;
        p.run = None;
    }
}

impl<M: Memory> std::fmt::Debug for Producer<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hdr = self.mem.header();
        f.debug_struct("Producer")
            .field("tail", &self.tail)
            .field("pending", &self.pending)
            .field("cached_head", &self.cached_head)
            .field("shared_head", &hdr.cons.pos.load(Ordering::Relaxed))
            .field("sleep_gen", &self.sleep_gen)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

/// How far ahead of the tail (cache lines) the producer asks for lines to write.
const PREFETCH_LINES: u64 = 32;

/// Longest payload [`copy_descending`] copies (two cache lines).
const DESCENDING_MAX: usize = 2 * LINE;

/// Copies `src` (a multiple of 8 bytes) to `dst` in 8-byte words from the last to the first: the
/// bytes beside the record's header, in the line a caught-up consumer polls, are stored last,
/// with no call to `memcpy` and no split at the line.
///
/// # Safety
/// As [`copy_payload`].
#[inline(always)]
unsafe fn copy_descending(src: &[u8], dst: *mut u8) {
    let s = src.as_ptr();
    // SAFETY: word i covers bytes 8i .. 8i + 8 <= src.len() of `src` and of `dst`, which is valid
    // for src.len() bytes by the caller's guarantee; unaligned accesses are allowed.
    unsafe {
        for i in (0..src.len() / 8).rev() {
            let w = s.add(8 * i).cast::<u64>().read_unaligned();
            dst.add(8 * i).cast::<u64>().write_unaligned(w);
        }
    }
}

/// Copies `src` to `dst`, inlining the short copies that tokens and control records need (a call to
/// `memcpy` costs as much as the rest of a push at 8 bytes).
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and must not overlap `src`.
#[inline(always)]
unsafe fn copy_payload(src: &[u8], dst: *mut u8) {
    let (n, s) = (src.len(), src.as_ptr());
    // SAFETY: every read lies in `src` (offsets below `n`) and every write in `dst..dst + n`
    // (the caller's guarantee); the pairs overlap each other only where they write the same bytes.
    unsafe {
        if (8..=16).contains(&n) {
            let (head, tail) = (s.cast::<u64>().read_unaligned(), s.add(n - 8).cast::<u64>());
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8)
                .cast::<u64>()
                .write_unaligned(tail.read_unaligned());
        } else if (4..8).contains(&n) {
            let (head, tail) = (s.cast::<u32>().read_unaligned(), s.add(n - 4).cast::<u32>());
            dst.cast::<u32>().write_unaligned(head);
            dst.add(n - 4)
                .cast::<u32>()
                .write_unaligned(tail.read_unaligned());
        } else {
            std::ptr::copy_nonoverlapping(s, dst, n);
        }
    }
}
