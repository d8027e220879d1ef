//! The StoreLoad barrier of the eventcount, made asymmetric with `membarrier(2)`.
//!
//! A waiter must not miss a publish: it stores "I sleep", then loads the peer's position; the
//! publisher stores its position, then loads "sleeps". Each side needs a full barrier between its
//! store and its load, and on the publisher's side that barrier would be paid on every publish
//! (an `mfence` costs ~15 ns on these machines, as much as the rest of a push).
//!
//! Instead, processes register for `MEMBARRIER_CMD_GLOBAL_EXPEDITED`; the publisher then needs only
//! a compiler barrier, and the waiter — on its slow path, just before sleeping — issues
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which makes every CPU running a registered process
//! execute a full barrier before the call returns (~1 µs). Either the publisher's position store was
//! drained by that barrier (so the waiter's re-check sees it), or the publisher's load comes after
//! it and sees the waiter's flag, stored before the call. A side advertises in its `flags` word that
//! it waits this way; the publisher uses the light barrier only if it is registered itself and the
//! waiter advertises it, and falls back to `fence(SeqCst)` otherwise (and always under loom).

use crate::sync::{Ordering, fence};

/// Bit of `Side::flags`: this side issues a global membarrier before sleeping.
pub(crate) const FLAG_MEMBARRIER: u32 = 1;

#[cfg(not(loom))]
mod imp {
    use std::sync::OnceLock;

    const CMD_QUERY: libc::c_int = 0;
    const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
    const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

    fn membarrier(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes two integers and no pointers; unknown commands fail with EINVAL.
        unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
    }

    /// Registers this process once; whether it may use the light barrier.
    pub(crate) fn registered() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| {
            let supported = membarrier(CMD_QUERY);
            let needed = (CMD_GLOBAL_EXPEDITED | CMD_REGISTER_GLOBAL_EXPEDITED) as libc::c_long;
            supported >= 0
                && supported & needed == needed
                && membarrier(CMD_REGISTER_GLOBAL_EXPEDITED) == 0
        })
    }

    /// Full barrier on every CPU running a registered process; false if the call failed.
    pub(crate) fn heavy() -> bool {
        membarrier(CMD_GLOBAL_EXPEDITED) == 0
    }
}

#[cfg(loom)]
mod imp {
    pub(crate) fn registered() -> bool {
        false
    }
    pub(crate) fn heavy() -> bool {
        false
    }
}

/// Whether this process can take part in the asymmetric protocol (registering it on first use).
pub(crate) fn registered() -> bool {
    imp::registered()
}

/// The publisher's barrier between storing its position and loading the peer's `sleeping`.
/// `light`: this process is registered and the peer advertised [`FLAG_MEMBARRIER`].
#[inline]
pub(crate) fn publisher(light: bool) {
    if light {
        // SYNC: pairs with the waiter's membarrier in `waiter` (asymmetric fence; see module docs).
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        // SYNC: pairs with the waiter's `fence(SeqCst)` (or membarrier) in `waiter`.
        fence(Ordering::SeqCst);
    }
}

/// The waiter's barrier between storing its odd `sleeping` and re-checking the peer's position.
/// `membarrier`: this side advertised [`FLAG_MEMBARRIER`].
pub(crate) fn waiter(membarrier: bool) {
    // SYNC: a full fence on our side in every case; pairs with the publisher's barrier in `publisher`.
    fence(Ordering::SeqCst);
    if membarrier && !imp::heavy() {
        // Cannot happen once registration succeeded; a publisher that relied on it may miss this
        // sleep, which then ends at the next liveness poll instead of at once.
    }
}
