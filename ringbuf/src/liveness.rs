//! Who holds a role and whether that process still lives.
//!
//! A role's holder is recorded as an *owner word*: the pid in the low 32 bits and the low 32 bits of
//! the process's start time (clock ticks since boot, from `/proc/<pid>/stat`) in the high 32 bits.
//! The start time tells a dead holder from an unrelated process that later got the same pid.

use std::time::Duration;

/// What a side knows about its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// No process holds the peer role (never attached, or detached cleanly).
    Absent,
    /// The peer's process lives and its heartbeat is recent.
    Alive {
        /// The peer's pid.
        pid: u32,
    },
    /// The peer's process lives but its heartbeat is older than the configured limit.
    Unresponsive {
        /// The peer's pid.
        pid: u32,
        /// Age of its last heartbeat.
        silent_for: Duration,
    },
    /// The peer's process is gone (or a zombie); its role can be taken over.
    Dead {
        /// The dead peer's pid.
        pid: u32,
    },
}

/// Whether the process behind an owner word lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Owner word 0.
    None,
    /// The process lives.
    Alive(u32),
    /// The process is gone, a zombie, or its pid now names another process.
    Dead(u32),
}

/// The pid field of an owner word.
pub(crate) fn owner_pid(word: u64) -> u32 {
    word as u32
}

/// This process's owner word.
pub(crate) fn self_owner() -> u64 {
    let pid = std::process::id();
    let start = proc_stat(pid).map_or(0, |s| s.start);
    u64::from(pid) | (u64::from(start as u32) << 32)
}

/// Whether the holder recorded in `word` still lives.
pub(crate) fn holder(word: u64) -> Holder {
    let pid = owner_pid(word);
    if pid == 0 {
        return Holder::None;
    }
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return Holder::Dead(pid);
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { libc::kill(pid_t, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return Holder::Dead(pid);
    }
    match proc_stat(pid) {
        // Gone between the two checks, a zombie, or the pid was reused by another process.
        None => Holder::Dead(pid),
        Some(s) if s.zombie => Holder::Dead(pid),
        Some(s) if (word >> 32) != 0 && (word >> 32) as u32 != s.start as u32 => Holder::Dead(pid),
        Some(_) => Holder::Alive(pid),
    }
}

/// Whether `pid` names a live process (a zombie, killed but not yet reaped, counts as dead).
pub fn process_alive(pid: u32) -> bool {
    matches!(holder(u64::from(pid)), Holder::Alive(_))
}

/// The fields of `/proc/<pid>/stat` liveness needs.
struct ProcStat {
    start: u64,
    zombie: bool,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?; // field 3
    let start = fields.nth(18)?.parse().ok()?; // field 22
    Some(ProcStat {
        start,
        zombie: state == "Z" || state == "X",
    })
}

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Classifies a peer from its owner word and heartbeat.
pub(crate) fn peer_state(owner: u64, heartbeat: u64, limit: Duration) -> PeerState {
    match holder(owner) {
        Holder::None => PeerState::Absent,
        Holder::Dead(pid) => PeerState::Dead { pid },
        Holder::Alive(pid) => {
            let silent_for = Duration::from_nanos(now_ns().saturating_sub(heartbeat));
            if silent_for > limit {
                PeerState::Unresponsive { pid, silent_for }
            } else {
                PeerState::Alive { pid }
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn self_is_alive_and_bogus_pids_are_dead() {
        let me = self_owner();
        assert_eq!(holder(me), Holder::Alive(std::process::id()));
        assert_eq!(holder(0), Holder::None);
        // A start time that does not match ours: the pid was "reused".
        let other_start = me ^ (0x5555_u64 << 32);
        assert_eq!(holder(other_start), Holder::Dead(std::process::id()));
        assert!(matches!(holder(u64::from(u32::MAX)), Holder::Dead(_)));
    }

    #[test]
    fn reaped_child_is_dead() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        child.wait().expect("wait");
        assert!(matches!(
            holder(u64::from(pid)),
            Holder::Dead(_) | Holder::Alive(_)
        ));
        // (The pid may have been reused already; the start-time check covers that case above.)
    }
}
