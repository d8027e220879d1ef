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
    // A 24-byte payload takes 32 bytes, a 16-byte one 24, an 8-byte one 16; a publish also keeps
    // the word after its last record for the terminator, so 64 bytes hold 56 of records.
    assert!(p.try_push(&[1; 24]).unwrap()); // 0..32
    assert!(p.try_push(&[2; 16]).unwrap()); // 32..56, the terminator at 56
    assert!(!p.try_push(&[]).unwrap(), "ring is full");
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[1; 24]);
    // Head at 32: padding fills 56..64 and the record goes to offset 0 (position 64..80).
    assert!(p.try_push(&[4; 8]).unwrap());
    // The next would end at 96 with its terminator at 96..104, past the head's lap (32 + 64).
    assert!(!p.try_push(&[5; 1]).unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[2; 16]);
    // Head at 56: two more 16-byte records, the second with its terminator exactly filling the lap.
    assert!(p.try_push(&[5; 8]).unwrap()); // 80..96
    assert!(p.try_push(&[6; 8]).unwrap()); // 96..112, the terminator at 112..120 = 56 + 64
    assert!(!p.try_push(&[]).unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[4; 8]); // after the padding
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[5; 8]);
    assert_eq!(&*c.try_pop().unwrap().unwrap(), &[6; 8]);
    assert!(c.try_pop().unwrap().is_none());
    // An empty record of kind 0 and flags 0 is not mistaken for the terminator.
    assert!(p.try_push(&[]).unwrap());
    assert_eq!(c.try_pop().unwrap().unwrap().len(), 0);
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

/// A producer that died after storing a publish's first header but before its tail: the
/// records are visible (and maybe read) beyond the published tail. Its successor walks over
/// them to the terminator, so nothing is lost, delivered twice or overwritten while unread.
#[test]
fn a_successor_continues_after_records_published_beyond_the_tail() {
    use std::sync::atomic::Ordering::SeqCst;
    let ring = Ring::heap(256).unwrap();
    let prod_pos = |v: u64| ring.memory().header().prod.pos.store(v, SeqCst);
    let mut c = ring.consumer().unwrap();
    let mut p = ring.producer().unwrap();
    assert!(p.try_push(b"one").unwrap());
    let mut b = p.batch();
    for tag in [b"two", b"six"] {
        assert!(b.try_push(tag).unwrap());
    }
    assert!(b.try_push(&[7; 20]).unwrap());
    b.commit();
    // Roll the published tail back to the end of "one", as if the batch's tail store was lost.
    prod_pos(16);
    drop(p);
    let mut p = ring.producer().unwrap();
    assert!(p.try_push(b"ten").unwrap());
    let mut seen = Vec::new();
    while let Some(g) = c.try_pop().unwrap() {
        seen.push(g.to_vec());
    }
    assert_eq!(
        seen,
        [&b"one"[..], b"two", b"six", &[7; 20], b"ten"].map(<[u8]>::to_vec)
    );
    // The consumer read past the stale tail before the successor came: it continues after the
    // consumer's head, past a padding record at the wrap.
    for i in 0..5u8 {
        assert!(p.try_push(&[i; 24]).unwrap(), "record {i}"); // 88..248
    }
    while c.try_pop().unwrap().is_some() {}
    assert!(p.try_push(&[5; 24]).unwrap()); // padding 248..256, then 256..288
    assert!(p.try_push(&[6; 24]).unwrap()); // 288..320
    while c.try_pop().unwrap().is_some() {}
    let end = ring.memory().header().prod.pos.load(SeqCst);
    assert_eq!(end, 320);
    prod_pos(248);
    drop(p);
    let mut p = ring.producer().unwrap();
    assert!(p.try_push(b"after").unwrap());
    assert_eq!(&*c.try_pop().unwrap().unwrap(), b"after");
    assert!(c.try_pop().unwrap().is_none());
    // A tail inside a record leads the walk into payload bytes: reported, not followed.
    drop(p);
    prod_pos(ring.memory().header().prod.pos.load(SeqCst) - 8);
    assert!(matches!(ring.producer(), Err(Error::Corrupt { .. })));
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
    assert!(p.try_push(&[2; 16]).unwrap());
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

#[test]
fn prefetching_the_next_line_changes_no_record() {
    // Every head position of a small ring, across wraps and padding, with an empty poll (and its
    // prefetch of the following line, wrapped into the data area) before each record.
    let ring = Ring::heap(256).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    c.set_wait_config(WaitConfig {
        prefetch_next_line: true,
        ..WaitConfig::default()
    });
    for i in 0..2_000u32 {
        assert!(c.try_pop().unwrap().is_none());
        let len = (i as usize * 7) % 60 + 1;
        let payload: Vec<u8> = (0..len).map(|b| (b as u32 + i) as u8).collect();
        assert!(p.try_push_kind(3, &payload).unwrap());
        let g = c.try_pop().unwrap().expect("a record");
        assert_eq!((g.kind(), &g[..]), (3, &payload[..]), "record {i}");
    }
    assert!(c.stats().stalls >= 2_000);
}
