//! The one place the ring takes its atomics from: `std`'s normally, loom's under `cfg(loom)`, so the
//! same algorithm runs in production and in the loom models.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// One iteration of a bounded busy-wait (under loom: a yield, so the model can schedule the peer).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Reads the 8-byte record header word at `ptr` in the ring's data area.
///
/// Record headers are read and written as relaxed atomics, so even a hostile peer that scribbles on
/// them concurrently causes no data race; ordering comes from the position words.
///
/// # Safety
/// `ptr` must be 8-byte aligned and valid for reads of 8 bytes for the duration of the call.
#[inline]
pub(crate) unsafe fn load_word(ptr: *const u8) -> u64 {
    #[cfg(not(loom))]
    {
        // SAFETY: the caller guarantees alignment and validity; every access to a record header word
        // is atomic (`store_word`/`load_word`), so no non-atomic access races with this one.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(ptr.cast::<u64>().cast_mut()) }
            .load(Ordering::Relaxed)
    }
    #[cfg(loom)]
    {
        // SAFETY: the caller guarantees alignment and validity; under loom threads run one at a time,
        // and the model tracks the data area's accesses through `Memory::track_*`.
        unsafe { ptr.cast::<u64>().read() }
    }
}

/// Writes the 8-byte record header word at `ptr` (see [`load_word`]).
///
/// # Safety
/// `ptr` must be 8-byte aligned and valid for writes of 8 bytes for the duration of the call.
#[inline]
pub(crate) unsafe fn store_word(ptr: *mut u8, value: u64) {
    #[cfg(not(loom))]
    {
        // SAFETY: as in `load_word`.
        unsafe { std::sync::atomic::AtomicU64::from_ptr(ptr.cast::<u64>()) }
            .store(value, Ordering::Relaxed)
    }
    #[cfg(loom)]
    {
        // SAFETY: as in `load_word`.
        unsafe { ptr.cast::<u64>().write(value) }
    }
}
