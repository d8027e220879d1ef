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
