//! Loom models of the ring's protocol: publish/consume, the wrap with padding, batch commit, and the
//! eventcount handshake of the waits. Data-area accesses are tracked per 8 bytes (see
//! `HeapMemory` under loom), so a read not ordered after its write fails the model.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p ringbuf --release --lib loom_`.

use crate::{Ring, WaitConfig};
use loom::thread;
use std::time::Duration;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

fn payload(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag.wrapping_add(i as u8)).collect()
}

#[test]
fn loom_push_pop() {
    model(|| {
        let ring = Ring::heap(64).unwrap();
        let mut p = ring.producer().unwrap();
        let mut c = ring.consumer().unwrap();
        let t = thread::spawn(move || {
            assert!(p.try_push(&payload(1, 8)).unwrap());
            assert!(p.try_push(&payload(2, 3)).unwrap());
        });
        let mut seen = Vec::new();
        for _ in 0..2 {
            if let Some(g) = c.try_pop().unwrap() {
                seen.push(g.to_vec());
            }
        }
        t.join().unwrap();
        while let Some(g) = c.try_pop().unwrap() {
            seen.push(g.to_vec());
        }
        assert_eq!(seen, vec![payload(1, 8), payload(2, 3)]);
    });
}

#[test]
fn loom_wrap_with_padding() {
    model(|| {
        let ring = Ring::heap(64).unwrap();
        let mut p = ring.producer().unwrap();
        let mut c = ring.consumer().unwrap();
        // Move both positions to 56: 8 bytes before the wrap.
        assert!(p.try_push(&[0; 24]).unwrap());
        assert!(p.try_push(&[0; 16]).unwrap());
        assert_eq!(c.pop_batch(2, |_| ()).unwrap(), 2);
        let t = thread::spawn(move || {
            // 16-byte record: a padding record fills 56..64, the record goes to offset 0.
            assert!(p.try_push(&payload(3, 8)).unwrap());
            assert!(p.try_push(&payload(4, 24)).unwrap());
        });
        let mut seen = Vec::new();
        for _ in 0..2 {
            if let Some(g) = c.try_pop().unwrap() {
                seen.push(g.to_vec());
            }
        }
        t.join().unwrap();
        while let Some(g) = c.try_pop().unwrap() {
            seen.push(g.to_vec());
        }
        assert_eq!(seen, vec![payload(3, 8), payload(4, 24)]);
    });
}

#[test]
fn loom_batch_commit_is_all_or_nothing() {
    model(|| {
        let ring = Ring::heap(64).unwrap();
        let mut p = ring.producer().unwrap();
        let mut c = ring.consumer().unwrap();
        let t = thread::spawn(move || {
            let mut batch = p.batch();
            for tag in 0..3 {
                assert!(batch.try_push(&payload(tag, 5)).unwrap());
            }
            assert_eq!(batch.commit(), 3);
        });
        let mut seen = Vec::new();
        let n = c.pop_batch(8, |r| seen.push(r.payload.to_vec())).unwrap();
        assert!(n == 0 || n == 3, "a batch is published whole, saw {n}");
        t.join().unwrap();
        c.pop_batch(8, |r| seen.push(r.payload.to_vec())).unwrap();
        assert_eq!(seen, (0..3).map(|tag| payload(tag, 5)).collect::<Vec<_>>());
    });
}

fn no_spin() -> WaitConfig {
    WaitConfig {
        spin: Duration::ZERO,
        ..WaitConfig::default()
    }
}

#[test]
fn loom_waiter_flag_wakes_consumer() {
    model(|| {
        let ring = Ring::heap(32).unwrap();
        let mut p = ring.producer().unwrap();
        let mut c = ring.consumer().unwrap();
        c.set_wait_config(no_spin());
        let t = thread::spawn(move || {
            assert!(p.try_push(&payload(5, 4)).unwrap());
        });
        // The loom futex has no timeout: a lost wake-up is a deadlock, which fails the model.
        let g = c
            .pop_wait(Duration::from_secs(3600))
            .unwrap()
            .expect("woken with data");
        assert_eq!(&*g, &payload(5, 4)[..]);
        drop(g);
        t.join().unwrap();
    });
}

#[test]
fn loom_waiter_flag_wakes_producer() {
    model(|| {
        let ring = Ring::heap(32).unwrap();
        let mut p = ring.producer().unwrap();
        let mut c = ring.consumer().unwrap();
        p.set_wait_config(no_spin());
        assert!(p.try_push(&payload(6, 8)).unwrap());
        // Full: a second 16-byte record and the terminator after it would take 40 bytes.
        assert!(!p.try_push(&payload(7, 8)).unwrap());
        let t = thread::spawn(move || {
            assert!(
                p.push_wait(&payload(7, 8), Duration::from_secs(3600))
                    .unwrap()
            );
        });
        assert_eq!(
            &*c.try_pop().unwrap().expect("full ring"),
            &payload(6, 8)[..]
        );
        t.join().unwrap();
        // It wrapped: the record at 16..32, its terminator at offset 0.
        assert_eq!(&*c.try_pop().unwrap().unwrap(), &payload(7, 8)[..]);
        assert!(c.try_pop().unwrap().is_none());
    });
}
