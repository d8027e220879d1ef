//! Unit tests of the algorithm on a heap ring and of segments in `/dev/shm`.

use crate::*;
use std::time::Duration;

#[test]
fn push_pop_round_trip() {
    let ring = Ring::heap(64).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    assert!(c.try_pop().unwrap().is_none());
    assert!(p.try_push_kind(7, b"hello").unwrap());
    let g = c.try_pop().unwrap().expect("a record");
    assert_eq!((&*g, g.kind(), g.flags()), (&b"hello"[..], 7, 0));
    drop(g);
    assert!(c.try_pop().unwrap().is_none());
}

#[test]
fn full_ring_and_wrap_with_padding() {
    let ring = Ring::heap(64).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    // 24-byte payload = 32-byte records: two fill the ring exactly.
    assert!(p.try_push(&[1; 24]).unwrap());
    assert!(p.try_push(&[2; 24]).unwrap());
    assert!(!p.try_push(&[3; 1]).unwrap(), "ring is full");
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[1; 24]);
    // Tail is at 64 (offset 0), head at 32.
    assert!(p.try_push(&[4; 8]).unwrap()); // offset 0..16
    // A 24-byte payload needs 32 contiguous bytes: only 16 remain before the consumer's data.
    assert!(!p.try_push(&[5; 24]).unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[2; 24]);
    // Now offset 16..64 is free but the ring's head is at 64 (offset 0 holds record 4).
    assert!(p.try_push(&[5; 24]).unwrap()); // 16..48
    assert!(p.try_push(&[]).unwrap()); // 48..56
    // 8 bytes left before the wrap, 0 after: a 16-byte record does not fit.
    assert!(!p.try_push(&[6; 1]).unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[4; 8]);
    // Now: 8 bytes to the end (padding) + 16 at the start fit.
    assert!(p.try_push(&[6; 1]).unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[5; 24]);
    assert_eq!(c.try_pop().unwrap().unwrap().len(), 0);
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[6; 1]);
    assert!(c.try_pop().unwrap().is_none());
}

#[test]
fn too_large_is_an_error() {
    let ring = Ring::heap(64).unwrap();
    let mut p = ring.producer().unwrap();
    assert_eq!(p.max_payload(), 24);
    assert!(matches!(
        p.try_push(&[0; 25]),
        Err(Error::TooLarge { len: 25, max: 24 })
    ));
}

#[test]
fn uncommitted_grant_and_batch_publish_nothing() {
    let ring = Ring::heap(128).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    {
        let mut g = p.reserve(8).unwrap().unwrap();
        g.copy_from_slice(&[9; 8]);
    }
    {
        let mut b = p.batch();
        assert!(b.try_push(b"a").unwrap());
        assert!(b.try_push(b"b").unwrap());
        assert_eq!(b.len(), 2);
    }
    assert!(c.try_pop().unwrap().is_none());
    let mut b = p.batch();
    assert!(b.try_push(b"x").unwrap());
    {
        let mut g = b.reserve(2).unwrap().unwrap();
        g.copy_from_slice(b"yz");
        g.set_kind(3);
        g.set_flags(5);
        g.commit();
    }
    assert!(
        c.try_pop().unwrap().is_none(),
        "nothing before the batch commits"
    );
    assert_eq!(b.commit(), 2);
    let mut seen = Vec::new();
    let n = c
        .pop_batch(10, |r| seen.push((r.kind, r.flags, r.payload.to_vec())))
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(seen, vec![(0, 0, b"x".to_vec()), (3, 5, b"yz".to_vec())]);
}

#[test]
fn roles_are_exclusive_and_released_on_drop() {
    let ring = Ring::heap(64).unwrap();
    let p = ring.producer().unwrap();
    let me = std::process::id();
    assert!(
        matches!(ring.producer(), Err(Error::RoleTaken { role: Role::Producer, pid }) if pid == me)
    );
    drop(p);
    let _p = ring.producer().unwrap();
    let c = ring.consumer().unwrap();
    assert!(matches!(
        ring.consumer(),
        Err(Error::RoleTaken {
            role: Role::Consumer,
            ..
        })
    ));
    assert!(matches!(c.peer_state(), PeerState::Alive { pid } if pid == me));
}

#[test]
fn dead_holder_is_taken_over() {
    let ring = Ring::heap(64).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    ring.memory()
        .header()
        .prod_side
        .owner
        .store(u64::from(pid), std::sync::atomic::Ordering::SeqCst);
    let c = ring.consumer().unwrap();
    assert!(matches!(
        c.peer_state(),
        PeerState::Dead { .. } | PeerState::Alive { .. }
    ));
    // Unless the pid was reused by now, the dead holder's role can be taken.
    if matches!(c.peer_state(), PeerState::Dead { .. }) {
        ring.producer().unwrap();
    }
}

#[test]
fn waits_time_out_and_wake() {
    let ring = Ring::heap(4096).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    assert!(c.pop_wait(Duration::from_millis(5)).unwrap().is_none());
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        for i in 0u32..1000 {
            assert!(
                p.push_wait(&i.to_le_bytes(), Duration::from_secs(10))
                    .unwrap()
            );
        }
        p
    });
    for i in 0u32..1000 {
        let g = c
            .pop_wait(Duration::from_secs(10))
            .unwrap()
            .expect("record before timeout");
        assert_eq!(&*g, &i.to_le_bytes());
    }
    let p = t.join().unwrap();
    drop(p);
    // The producer dropped cleanly: the peer is absent, a wait simply times out.
    assert_eq!(c.peer_state(), PeerState::Absent);
    assert!(c.pop_wait(Duration::from_millis(5)).unwrap().is_none());
}

#[test]
fn shm_create_attach_and_unlink() {
    let name = unique_name("ringbuf-unit");
    let ring = create(&name, 4096).unwrap();
    let path = format!("/dev/shm/{name}");
    let meta = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o077, 0);
    assert!(matches!(
        create(&name, 4096),
        Err(Error::AlreadyExists { .. })
    ));
    let other = attach(&name).unwrap();
    assert_eq!(other.capacity(), 4096);
    assert_eq!(other.memory().epoch(), ring.memory().epoch());
    let mut p = ring.producer().unwrap();
    let mut c = other.consumer().unwrap();
    assert!(p.try_push(b"across mappings").unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), b"across mappings");
    drop((p, c, other));
    drop(ring);
    assert!(
        !std::path::Path::new(&path).exists(),
        "creator unlinks on drop"
    );
    assert!(matches!(attach(&name), Err(Error::NotFound { .. })));
}

#[test]
fn attach_refuses_open_permissions_and_bad_names() {
    let name = unique_name("ringbuf-unit");
    let ring = create(&name, 4096).unwrap();
    let path = format!("/dev/shm/{name}");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(matches!(
        attach(&name),
        Err(Error::InsecureMode { mode: 0o644, .. })
    ));
    drop(ring);
    assert!(matches!(attach("bad/name"), Err(Error::InvalidName(_))));
    assert!(matches!(
        create("x", 1000),
        Err(Error::InvalidCapacity { .. })
    ));
}

#[test]
fn attach_refuses_foreign_owner() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // only root can give a segment away; the check itself is covered by the mode test
    }
    let name = unique_name("ringbuf-unit");
    let ring = create(&name, 4096).unwrap();
    let path = std::ffi::CString::new(format!("/dev/shm/{name}")).unwrap();
    // SAFETY: `path` is a valid NUL-terminated path; chown changes only that file's owner.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), 65534, 65534) }, 0);
    assert!(matches!(
        attach(&name),
        Err(Error::ForeignOwner { uid: 65534, .. })
    ));
    drop(ring);
}

#[test]
fn silent_peer_is_unresponsive() {
    let ring = Ring::heap(64).unwrap();
    let p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    c.set_wait_config(WaitConfig {
        heartbeat_limit: Duration::from_millis(20),
        ..WaitConfig::default()
    });
    assert!(matches!(c.peer_state(), PeerState::Alive { .. }));
    std::thread::sleep(Duration::from_millis(40));
    assert!(matches!(c.peer_state(), PeerState::Unresponsive { .. }));
    p.heartbeat();
    assert!(matches!(c.peer_state(), PeerState::Alive { .. }));
}

#[test]
fn a_heartbeat_handle_beats_from_another_thread() {
    let ring = Ring::heap(64).unwrap();
    let p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    c.set_wait_config(WaitConfig {
        heartbeat_limit: Duration::from_millis(20),
        ..WaitConfig::default()
    });
    let beat = p.heartbeat_handle();
    assert_eq!(beat.role(), Role::Producer);
    std::thread::sleep(Duration::from_millis(40));
    assert!(matches!(c.peer_state(), PeerState::Unresponsive { .. }));
    std::thread::spawn(move || beat.beat()).join().unwrap();
    assert!(matches!(c.peer_state(), PeerState::Alive { .. }));
    // The consumer's handle beats the consumer side (what the producer watches).
    let mut p = p;
    p.set_wait_config(WaitConfig {
        heartbeat_limit: Duration::from_millis(20),
        ..WaitConfig::default()
    });
    std::thread::sleep(Duration::from_millis(40));
    assert!(matches!(p.peer_state(), PeerState::Unresponsive { .. }));
    c.heartbeat_handle().beat();
    assert!(matches!(p.peer_state(), PeerState::Alive { .. }));
}

#[test]
fn stats_count_stalls_sleeps_and_wakes() {
    let ring = Ring::heap(64).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    assert_eq!(p.stats(), SideStats::default());
    // Empty: the consumer's reload finds nothing.
    assert!(c.try_pop().unwrap().is_none());
    assert_eq!((c.stats().refreshes, c.stats().stalls), (1, 1));
    assert!(p.try_push(&[1; 24]).unwrap());
    assert!(p.try_push(&[2; 24]).unwrap());
    // Full: the producer reloads the head and finds no room, twice in a row (the second after
    // its back-off).
    assert!(!p.try_push(&[3; 8]).unwrap());
    assert!(!p.try_push(&[3; 8]).unwrap());
    assert_eq!((p.stats().refreshes, p.stats().stalls), (2, 2));
    drop(c.try_pop().unwrap());
    assert!(p.try_push(&[3; 8]).unwrap());
    assert_eq!((p.stats().refreshes, p.stats().stalls), (3, 2));
    let before = c.stats();
    assert_eq!(before.since(&before), SideStats::default());
    assert_eq!(SideStats::from_bytes(&before.to_bytes()), Some(before));
    assert_eq!(SideStats::from_bytes(&[0; 31]), None);

    // A consumer that sleeps is woken once by the publish that ends its sleep.
    while c.try_pop().unwrap().is_some() {}
    let cfg = WaitConfig {
        spin: Duration::ZERO,
        ..WaitConfig::default()
    };
    c.set_wait_config(cfg);
    let waiter = std::thread::spawn(move || {
        let got = c
            .pop_wait(Duration::from_secs(10))
            .unwrap()
            .map(|g| g.to_vec());
        (got, c.stats())
    });
    // Publish only once the consumer is asleep (its sleep count is private: poll the shared flag).
    while ring
        .memory()
        .header()
        .cons_side
        .sleeping
        .load(std::sync::atomic::Ordering::Relaxed)
        .is_multiple_of(2)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(p.try_push(b"wake").unwrap());
    let (got, stats) = waiter.join().unwrap();
    assert_eq!(got.as_deref(), Some(&b"wake"[..]));
    assert!(stats.sleeps >= 1, "{stats:?}");
    assert_eq!(p.stats().wakes, 1);
}
