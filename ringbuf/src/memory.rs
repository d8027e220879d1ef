//! Where a ring's bytes live. The algorithm (`producer`, `consumer`) is generic over [`Memory`]:
//! [`HeapMemory`] for unit tests and loom models, [`Segment`](crate::Segment) (POSIX shared memory)
//! in production.

use crate::error::{Error, Result};
use crate::layout::{Header, MAX_CAPACITY, MIN_HEAP_CAPACITY};
use crate::sync::AtomicU32;
use std::time::Duration;

/// A region holding a ring header and a data area of `capacity()` bytes.
///
/// # Safety
/// Implementors guarantee, for as long as the value lives: `header()` refers to a properly aligned,
/// initialised [`Header`]; `data()` is 8-byte aligned and valid for reads and writes of `capacity()`
/// bytes, which no Rust reference other than the ring's grants covers; `capacity()` is a power of two
/// in `MIN_HEAP_CAPACITY..=MAX_CAPACITY` and never changes.
pub unsafe trait Memory: Send + Sync + 'static {
    /// The shared header.
    fn header(&self) -> &Header;
    /// Start of the data area.
    fn data(&self) -> *mut u8;
    /// Data-area size in bytes (validated once, never re-read from shared memory).
    fn capacity(&self) -> u64;
    /// Sleeps while `word == expected`, at most `timeout` (a cross-process futex by default).
    fn wait(&self, word: &AtomicU32, expected: u32, timeout: Duration) {
        #[cfg(not(loom))]
        crate::futex::wait(word, expected, timeout);
        #[cfg(loom)]
        let _ = (word, expected, timeout);
    }
    /// Wakes the peer sleeping on `word`.
    fn wake(&self, word: &AtomicU32) {
        #[cfg(not(loom))]
        crate::futex::wake(word);
        #[cfg(loom)]
        let _ = word;
    }
    /// Loom only: the loom atomic standing for the data-area word at `off` (8-aligned, below the
    /// capacity), through which record headers are read and written.
    #[cfg(loom)]
    fn header_word(&self, off: u64) -> &crate::sync::AtomicU64;
    /// Loom only: records a write of data bytes `off..off+len` (no-op otherwise).
    #[inline]
    fn track_write(&self, _off: u64, _len: u64) {}
    /// Loom only: records a read of data bytes `off..off+len` (no-op otherwise).
    #[inline]
    fn track_read(&self, _off: u64, _len: u64) {}
}

pub(crate) fn check_heap_capacity(capacity: usize) -> Result<()> {
    if !capacity.is_power_of_two() || !(MIN_HEAP_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(Error::InvalidCapacity {
            capacity,
            min: MIN_HEAP_CAPACITY,
            max: MAX_CAPACITY,
        });
    }
    Ok(())
}

pub use heap::HeapMemory;

#[cfg(not(loom))]
mod heap {
    use super::*;
    use crate::layout::DATA_OFFSET;
    use std::alloc::{Layout, alloc_zeroed, dealloc};

    /// A ring region on the heap (same layout as a segment: header page, then data).
    pub struct HeapMemory {
        base: *mut u8,
        layout: Layout,
        capacity: u64,
    }

    // SAFETY: the region is only accessed through atomics and the ring's grants, which follow the
    // SPSC protocol; the raw pointer is owned by this value and valid from any thread.
    unsafe impl Send for HeapMemory {}
    // SAFETY: as above; shared access goes through atomics only.
    unsafe impl Sync for HeapMemory {}

    impl HeapMemory {
        /// Allocates a zeroed region with a data area of `capacity` bytes.
        pub fn new(capacity: usize) -> Result<Self> {
            check_heap_capacity(capacity)?;
            let layout =
                Layout::from_size_align(DATA_OFFSET + capacity, DATA_OFFSET).map_err(|_| {
                    Error::InvalidCapacity {
                        capacity,
                        min: MIN_HEAP_CAPACITY,
                        max: MAX_CAPACITY,
                    }
                })?;
            // SAFETY: the layout has a non-zero size.
            let base = unsafe { alloc_zeroed(layout) };
            if base.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Ok(HeapMemory {
                base,
                layout,
                capacity: capacity as u64,
            })
        }
    }

    impl Drop for HeapMemory {
        fn drop(&mut self) {
            // SAFETY: `base` came from `alloc_zeroed(self.layout)` and is freed once, here.
            unsafe { dealloc(self.base, self.layout) };
        }
    }

    // SAFETY: `base` is 4096-aligned and zeroed; all-zero bytes are a valid `Header` (atomics and
    // padding only); the data area follows at DATA_OFFSET with `capacity` bytes; capacity was checked.
    unsafe impl Memory for HeapMemory {
        #[inline]
        fn header(&self) -> &Header {
            // SAFETY: see the impl's SAFETY comment; the allocation outlives `&self`.
            unsafe { &*self.base.cast::<Header>() }
        }
        #[inline]
        fn data(&self) -> *mut u8 {
            // SAFETY: DATA_OFFSET is within the allocation of DATA_OFFSET + capacity bytes.
            unsafe { self.base.add(DATA_OFFSET) }
        }
        #[inline]
        fn capacity(&self) -> u64 {
            self.capacity
        }
    }
}

#[cfg(loom)]
mod heap {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::{Condvar, Mutex};

    /// A ring region for loom models: loom atomics in the header, a loom cell per 8 data bytes so the
    /// model checks that every data access is ordered by the ring's protocol, and a mutex/condvar
    /// standing in for the futex (a lost wake-up shows as a deadlock).
    pub struct HeapMemory {
        header: Header,
        data: *mut u8,
        capacity: u64,
        cells: Vec<UnsafeCell<()>>,
        words: Vec<crate::sync::AtomicU64>,
        lock: Mutex<()>,
        cond: Condvar,
    }

    // SAFETY: as for the non-loom heap region.
    unsafe impl Send for HeapMemory {}
    // SAFETY: as for the non-loom heap region.
    unsafe impl Sync for HeapMemory {}

    impl HeapMemory {
        /// Allocates a zeroed region with a data area of `capacity` bytes.
        pub fn new(capacity: usize) -> Result<Self> {
            check_heap_capacity(capacity)?;
            let data = Box::into_raw(vec![0u64; capacity / 8].into_boxed_slice()).cast::<u8>();
            Ok(HeapMemory {
                header: Header::new(),
                data,
                capacity: capacity as u64,
                cells: (0..capacity / 8).map(|_| UnsafeCell::new(())).collect(),
                words: (0..capacity / 8)
                    .map(|_| crate::sync::AtomicU64::new(0))
                    .collect(),
                lock: Mutex::new(()),
                cond: Condvar::new(),
            })
        }
    }

    impl Drop for HeapMemory {
        fn drop(&mut self) {
            let words = self.capacity as usize / 8;
            // SAFETY: `data` came from a boxed slice of `words` u64s and is freed once, here.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.data.cast::<u64>(),
                    words,
                ))
            });
        }
    }

    // SAFETY: `data` is a u64-aligned allocation of `capacity` bytes owned by this value.
    unsafe impl Memory for HeapMemory {
        #[inline]
        fn header(&self) -> &Header {
            &self.header
        }
        #[inline]
        fn data(&self) -> *mut u8 {
            self.data
        }
        #[inline]
        fn capacity(&self) -> u64 {
            self.capacity
        }
        fn header_word(&self, off: u64) -> &crate::sync::AtomicU64 {
            &self.words[(off / 8) as usize]
        }
        fn wait(&self, word: &AtomicU32, expected: u32, _timeout: Duration) {
            let guard = self.lock.lock().expect("loom mutex");
            if word.load(crate::sync::Ordering::SeqCst) == expected {
                drop(self.cond.wait(guard).expect("loom condvar"));
            }
        }
        fn wake(&self, _word: &AtomicU32) {
            let _guard = self.lock.lock().expect("loom mutex");
            self.cond.notify_all();
        }
        fn track_write(&self, off: u64, len: u64) {
            for cell in &self.cells[(off / 8) as usize..((off + len) / 8) as usize] {
                cell.with_mut(|_| ());
            }
        }
        fn track_read(&self, off: u64, len: u64) {
            for cell in &self.cells[(off / 8) as usize..((off + len) / 8) as usize] {
                cell.with(|_| ());
            }
        }
    }
}
