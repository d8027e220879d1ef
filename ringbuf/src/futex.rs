//! Cross-process futex wait and wake on a 32-bit word in shared memory.
//!
//! No `FUTEX_PRIVATE_FLAG`: the kernel keys the wait queue on the physical page, so a waiter in one
//! process is woken by a waker in another that mapped the same segment.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, for at most `timeout`; returns on wake, timeout, signal, or at
/// once if the word already differs.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a live, 4-byte-aligned u32 (an `AtomicU32`) that outlives the call; FUTEX_WAIT
    // only reads it, atomically, in the kernel. `ts` is a valid timespec for the duration of the call;
    // the remaining arguments are unused by FUTEX_WAIT. Any error (EAGAIN, EINTR, ETIMEDOUT) just
    // returns to the caller's loop, which re-checks its condition.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes the (at most one) process sleeping on `word`.
pub fn wake(word: &AtomicU32) {
    wake_n(word, 1);
}

/// Wakes every process sleeping on `word`.
pub fn wake_all(word: &AtomicU32) {
    wake_n(word, i32::MAX);
}

fn wake_n(word: &AtomicU32, n: i32) {
    // SAFETY: `word` is a live, aligned u32; FUTEX_WAKE does not access memory through it, it only
    // uses its address as the wait-queue key. The remaining arguments are unused by FUTEX_WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
