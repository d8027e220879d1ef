//! Two real processes stream records through a shared-memory ring: random lengths 8 B – 4 KiB,
//! each carrying its sequence number and a checksum the consumer verifies. Once with both processes
//! free to use every CPU, once with both confined to CPU 0.

mod common;

use common::*;
use std::time::Duration;

/// 10 million records in release builds (as CI runs them); fewer in unoptimised builds.
const RECORDS: u64 = if cfg!(debug_assertions) {
    200_000
} else {
    10_000_000
};
const CAPACITY: usize = 256 * 1024;

#[test]
#[ignore = "child process entry point: run by the other tests of this binary"]
fn child() {
    match env(CHILD_ENV).as_str() {
        "stream-consumer" => stream_consumer(),
        other => panic!("unknown child job {other}"),
    }
}

fn stream_consumer() {
    let ring = ringbuf::attach(&env("RING")).expect("attach");
    let mut c = ring.consumer().expect("claim consumer");
    let total = env_u64("RECORDS");
    say(&format!("cpus {}", allowed_cpus()));
    let mut seq = 0u64;
    let mut bytes = 0u64;
    let mut turn = 0u64;
    while seq < total {
        turn += 1;
        if turn.is_multiple_of(3) {
            // Batches: hand up to 64 records over, release them with one store.
            let mut failure = None;
            let n = c
                .pop_batch_wait(64, PATIENCE, |rec| {
                    if failure.is_none() {
                        failure = verify(seq as u32, rec.payload).err();
                        bytes += rec.payload.len() as u64;
                        seq += 1;
                    }
                })
                .expect("pop_batch_wait");
            assert!(n > 0, "producer stalled at record {seq}");
            if let Some(f) = failure {
                panic!("{f}");
            }
        } else {
            let rec = c.pop_wait(PATIENCE).expect("pop_wait");
            let rec = rec.unwrap_or_else(|| panic!("producer stalled at {seq}"));
            verify(seq as u32, &rec).unwrap_or_else(|e| panic!("{e}"));
            bytes += rec.len() as u64;
            seq += 1;
        }
    }
    say(&format!("done {seq} {bytes}"));
}

fn produce(p: &mut ringbuf::Producer, total: u64) -> u64 {
    let pool = pool();
    let mut rng = Rng(0x1234_5678);
    let mut seq = 0u64;
    let mut bytes = 0u64;
    while seq < total {
        let burst = 1 + rng.next() % 32;
        if rng.next().is_multiple_of(2) {
            // One record at a time, waiting for room when full.
            let len = rng.len(4096);
            let mut grant = p
                .reserve_wait(len, PATIENCE)
                .expect("reserve_wait")
                .expect("consumer stalled");
            fill(&pool, seq as u32, &mut grant);
            grant.commit();
            seq += 1;
            bytes += len as u64;
        } else {
            // A batch published with one store; if the ring fills, publish what we have.
            let mut batch = p.batch();
            for _ in 0..burst.min(total - seq) {
                let len = rng.len(4096);
                match batch.reserve(len).expect("batch reserve") {
                    Some(mut grant) => {
                        fill(&pool, seq as u32, &mut grant);
                        grant.commit();
                        seq += 1;
                        bytes += len as u64;
                    }
                    None => break,
                }
            }
            batch.commit();
            if p.len_hint() * 2 > p.capacity() {
                // Let the consumer catch up without spinning: wait for room for a large record.
                let room = p.reserve_wait(4096, PATIENCE).expect("reserve_wait");
                assert!(room.is_some(), "consumer stalled");
            }
        }
    }
    bytes
}

fn stream(test: &str, pinned: bool) {
    if pinned {
        pin_to_cpu0();
    }
    let name = name(test);
    let ring = ringbuf::create(&name, CAPACITY).expect("create");
    let mut p = ring.producer().expect("claim producer");
    let mut child = ChildProc::spawn(
        "stream-consumer",
        &[("RING", name.clone()), ("RECORDS", RECORDS.to_string())],
    );
    let cpus: usize = child
        .expect_line()
        .strip_prefix("cpus ")
        .unwrap()
        .parse()
        .unwrap();
    if pinned {
        assert_eq!(cpus, 1, "the child inherits the pinning");
    }
    let bytes = produce(&mut p, RECORDS);
    let done = child.expect_line();
    assert_eq!(done, format!("done {RECORDS} {bytes}"));
    child.finish();
    drop((p, ring));
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    assert_shm_clean(&format!("ringbuf-test-{test}.{}", std::process::id()));
}

#[test]
fn ten_million_records_between_two_processes() {
    stream("stream", false);
}

#[test]
fn ten_million_records_both_processes_on_one_cpu() {
    stream("pinned", true);
}

#[test]
fn waits_sleep_instead_of_spinning() {
    // An idle consumer sleeps in the futex: over a long wait it uses (almost) no CPU time.
    let name = name("idle");
    let ring = ringbuf::create(&name, 4096).expect("create");
    let mut c = ring.consumer().expect("claim consumer");
    let _p = ring.producer().expect("claim producer");
    let cpu = || {
        let mut ru: libc::rusage = unsafe_zeroed();
        // SAFETY: `ru` is a valid, writable rusage; RUSAGE_THREAD is Linux's per-thread usage.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
        Duration::from_micros((ru.ru_utime.tv_sec * 1_000_000 + ru.ru_utime.tv_usec) as u64)
            + Duration::from_micros((ru.ru_stime.tv_sec * 1_000_000 + ru.ru_stime.tv_usec) as u64)
    };
    let before = cpu();
    assert!(c.pop_wait(Duration::from_millis(300)).unwrap().is_none());
    let used = cpu() - before;
    // Not a timing assertion on the ring's speed: a spinning wait would burn the whole 300 ms.
    assert!(
        used < Duration::from_millis(150),
        "idle wait burned {used:?} of CPU"
    );
}

fn unsafe_zeroed() -> libc::rusage {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
