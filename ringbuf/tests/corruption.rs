//! Shared memory is untrusted input: random bytes written over the header, the positions, the wait
//! words and the records, round after round, must only ever produce typed errors — no panic, no
//! out-of-bounds access, no hang. Each test runs under a watchdog (a hang detector, not a timing
//! assertion).

mod common;

use common::*;
use ringbuf::{Error, Memory, Ring, Segment};
use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on a thread and fails the test if it has not finished after a very generous limit.
fn watchdog(what: &str, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(()) => worker.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            worker.join().unwrap(); // re-raises the worker's panic
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: a round hung"),
    }
}

/// Errors that corrupted shared memory may legitimately produce.
fn typed(e: &Error) -> bool {
    matches!(
        e,
        Error::Corrupt { .. }
            | Error::RoleTaken { .. }
            | Error::PeerDead { .. }
            | Error::VersionMismatch { .. }
            | Error::NotReady { .. }
    )
}

/// Where to scribble: (offset from the segment start, length).
fn region(rng: &mut Rng, ring: &Ring<Segment>) -> (usize, usize) {
    let head = ring.memory().header() as *const _ as usize;
    let data = ring.memory().data() as usize - head;
    match rng.next() % 7 {
        0 => (0, 40),     // meta: magic, version, poisoned, capacity, epoch, creator
        1 => (128, 16),   // producer position + cached head
        2 => (256, 16),   // consumer position + unused word
        3 => (384, 24),   // producer owner, heartbeat, wait words
        4 => (512, 24),   // consumer owner, heartbeat, wait words
        5 => (data, 512), // the first records
        _ => (data, ring.capacity()),
    }
}

fn scribble(rng: &mut Rng, ring: &Ring<Segment>) {
    let base = ring.memory().header() as *const _ as *mut u8;
    let (start, len) = region(rng, ring);
    let writes = 1 + rng.next() % 4;
    for _ in 0..writes {
        let at = start + (rng.next() as usize) % len;
        let value = match rng.next() % 4 {
            0 => 0,
            1 => 0xFF,
            2 => 0x80,
            _ => rng.next() as u8,
        };
        let n = 1 + (rng.next() as usize % 8).min(len - (at - start) - 1);
        for i in 0..n {
            // SAFETY: `at + i` lies inside the segment's mapping (header page + data area). This
            // test is single-threaded and no grant is alive, so nothing else accesses these bytes
            // while they are written.
            unsafe { base.add(at + i).write_volatile(value) };
        }
    }
}

fn check<T>(r: ringbuf::Result<T>, corrupt_seen: &mut bool) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(typed(&e), "unexpected error kind: {e:?}");
            if matches!(e, Error::Corrupt { .. }) {
                *corrupt_seen = true;
            }
            None
        }
    }
}

/// One round; returns whether the ring reported corruption.
fn round(rng: &mut Rng, name: &str) -> bool {
    let ring = ringbuf::create(name, 4096).unwrap();
    let other = ringbuf::attach(name).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = other.consumer().unwrap();
    let pool = pool();
    // A ring in some state: records pushed, some consumed, positions somewhere past a wrap.
    for seq in 0..(rng.next() % 40) as u32 {
        let mut buf = vec![0; rng.len(256)];
        fill(&pool, seq, &mut buf);
        if !p.try_push(&buf).unwrap() {
            break;
        }
        if rng.next().is_multiple_of(2) {
            drop(c.try_pop().unwrap());
        }
    }
    scribble(rng, &ring);
    let mut corrupt = false;
    let mut sink = 0u64;
    for _ in 0..16 {
        if corrupt {
            // Poisoned: both ends refuse to go on.
            assert!(matches!(p.try_push(b"x"), Err(Error::Corrupt { .. })));
            assert!(matches!(c.try_pop(), Err(Error::Corrupt { .. })));
            break;
        }
        match rng.next() % 9 {
            0 => drop(check(p.try_push(&pool[..rng.len(2000)]), &mut corrupt)),
            1 => {
                let mut batch = p.batch();
                for _ in 0..1 + rng.next() % 8 {
                    if check(batch.try_push(&pool[..rng.len(300)]), &mut corrupt) != Some(true) {
                        break;
                    }
                }
                batch.commit();
            }
            2 => {
                if let Some(Some(g)) = check(c.try_pop(), &mut corrupt) {
                    sink += g.iter().map(|&b| u64::from(b)).sum::<u64>();
                }
            }
            3 => {
                let n = c.pop_batch(8, |r| {
                    sink += r.payload.iter().map(|&b| u64::from(b)).sum::<u64>()
                });
                check(n, &mut corrupt);
            }
            4 => {
                if let Some(Some(g)) = check(c.pop_wait(Duration::from_millis(1)), &mut corrupt) {
                    sink += g.len() as u64;
                }
            }
            5 => drop(check(
                p.push_wait(&pool[..rng.len(1000)], Duration::from_millis(1)),
                &mut corrupt,
            )),
            6 => {
                let _ = (p.peer_state(), c.peer_state());
                p.heartbeat();
                c.heartbeat();
            }
            7 => {
                // A fresh attach validates the (possibly scribbled) header.
                if let Some(r) = check(ringbuf::attach(name), &mut false) {
                    check(r.producer().map(drop), &mut false);
                    check(r.consumer().map(drop), &mut false);
                }
            }
            _ => scribble(rng, &ring),
        }
    }
    std::hint::black_box(sink);
    drop((p, c, other, ring));
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    corrupt
}

#[test]
fn random_bytes_over_a_live_segment_give_only_typed_errors() {
    watchdog("corruption", || {
        let mut rng = Rng(0xC0FF_EE00_D15E_A5E5);
        let detected = (0..1500)
            .filter(|_| round(&mut rng, &name("corrupt")))
            .count();
        eprintln!("corruption detected in {detected} of 1500 rounds");
        // Many scribbles are harmless (payload bytes, heartbeats); many are not, and are caught.
        assert!(detected > 150, "only {detected} rounds detected corruption");
        assert_shm_clean(&format!("ringbuf-test-corrupt.{}", std::process::id()));
    });
}

#[test]
fn attach_rejects_bad_headers_with_typed_errors() {
    watchdog("attach", || {
        let name = name("header");
        let ring = ringbuf::create(&name, 8192).unwrap();
        let meta = &ring.memory().header().meta;
        use std::sync::atomic::Ordering::SeqCst;
        meta.version.store(0, SeqCst);
        assert!(matches!(
            ringbuf::attach(&name),
            Err(Error::NotReady { .. })
        ));
        meta.version.store(99, SeqCst);
        assert!(matches!(
            ringbuf::attach(&name),
            Err(Error::VersionMismatch { found: 99, .. })
        ));
        meta.version.store(ringbuf::layout::VERSION, SeqCst);
        meta.magic.store(1, SeqCst);
        assert!(matches!(
            ringbuf::attach(&name),
            Err(Error::Corrupt { what: "magic" })
        ));
        meta.magic.store(ringbuf::layout::MAGIC, SeqCst);
        for bad in [0, 4096, 16384, 12288, u64::MAX] {
            meta.capacity.store(bad, SeqCst);
            assert!(matches!(
                ringbuf::attach(&name),
                Err(Error::Corrupt { what: "capacity" })
            ));
        }
        meta.capacity.store(8192, SeqCst);
        ringbuf::attach(&name).unwrap();
        // Positions beyond reason: the claim reports them.
        ring.memory().header().prod.pos.store(1 << 40, SeqCst);
        assert!(matches!(ring.consumer(), Err(Error::Corrupt { .. })));
        drop(ring);
        assert!(matches!(
            ringbuf::attach(&name),
            Err(Error::NotFound { .. })
        ));
    });
}
