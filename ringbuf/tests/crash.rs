//! Crash tests: a side is SIGKILLed at the worst moments (holding an uncommitted reservation,
//! mid-batch, holding a read grant, while streaming). The survivor sees every committed record and
//! never a partial one, then `PeerDead`; a new process takes the role over and the stream goes on.

mod common;

use common::*;
use ringbuf::{Error, PeerState};
use std::time::Duration;

const CAPACITY: usize = 1 << 20;

#[test]
#[ignore = "child process entry point: run by the other tests of this binary"]
fn child() {
    if env(CHILD_ENV) == "creator" {
        let _ring = ringbuf::create(&env("RING"), 4096).expect("create");
        say("created");
        std::thread::sleep(Duration::from_secs(3600));
    }
    let ring = ringbuf::attach(&env("RING")).expect("attach");
    let start = env_u64("START") as u32;
    let count = env_u64("COUNT") as u32;
    let mode = env("MODE");
    let pool = pool();
    let mut rng = Rng(u64::from(start) + 1);
    match env(CHILD_ENV).as_str() {
        "producer" => {
            let mut p = ring.producer().expect("claim producer (take over)");
            say("claimed");
            for seq in start..start + count {
                let len = rng.len(256);
                let mut g = p.reserve_wait(len, PATIENCE).unwrap().expect("room");
                fill(&pool, seq, &mut g);
                g.commit();
            }
            match mode.as_str() {
                "reserve" => {
                    // Die holding a written but uncommitted record.
                    let mut g = p.reserve(200).unwrap().expect("room");
                    fill(&pool, start + count, &mut g);
                    say("ready");
                    std::thread::sleep(Duration::from_secs(3600));
                }
                "batch" => {
                    // Die with ten records committed to a batch that is not published.
                    let mut batch = p.batch();
                    for seq in start + count..start + count + 10 {
                        let mut g = batch.reserve(100).unwrap().expect("room");
                        fill(&pool, seq, &mut g);
                        g.commit();
                    }
                    say("ready");
                    std::thread::sleep(Duration::from_secs(3600));
                }
                "stream" => {
                    // Stream batches until killed, at whatever point that happens.
                    say("ready");
                    let mut seq = start + count;
                    loop {
                        let mut batch = p.batch();
                        for _ in 0..1 + rng.next() % 16 {
                            let len = rng.len(512);
                            let Some(mut g) = batch.reserve(len).unwrap() else {
                                break;
                            };
                            fill(&pool, seq, &mut g);
                            g.commit();
                            seq += 1;
                        }
                        batch.commit();
                        let room = p.reserve_wait(512, PATIENCE).unwrap();
                        assert!(room.is_some(), "consumer stalled");
                    }
                }
                _ => say("done"),
            }
        }
        "consumer" => {
            let mut c = ring.consumer().expect("claim consumer (take over)");
            say("claimed");
            for seq in start..start + count {
                let g = c.pop_wait(PATIENCE).unwrap().expect("record");
                verify(seq, &g).unwrap();
            }
            if mode == "hold" {
                // Die while borrowing the next record: it was never released, so it is redelivered.
                let g = c.pop_wait(PATIENCE).unwrap().expect("record");
                verify(start + count, &g).unwrap();
                say("ready");
                std::thread::sleep(Duration::from_secs(3600));
            }
            say("done");
        }
        other => panic!("unknown child job {other}"),
    }
}

fn vars(name: &str, start: u32, count: u32, mode: &str) -> Vec<(&'static str, String)> {
    vec![
        ("RING", name.to_owned()),
        ("START", start.to_string()),
        ("COUNT", count.to_string()),
        ("MODE", mode.to_owned()),
    ]
}

/// Drains exactly the records `from..to`, then expects `PeerDead` from the dead producer.
fn drain_then_peer_dead(c: &mut ringbuf::Consumer, from: u32, to: u32) {
    for seq in from..to {
        let g = c
            .pop_wait(PATIENCE)
            .expect("committed record")
            .expect("record before timeout");
        verify(seq, &g).unwrap();
    }
    match c.pop_wait(PATIENCE) {
        Err(Error::PeerDead { .. }) => {}
        Ok(Some(g)) => panic!("record after the last committed one: {} bytes", g.len()),
        other => panic!(
            "expected PeerDead, got {other:?}",
            other = other.map(|g| g.map(|g| g.len()))
        ),
    }
    assert!(matches!(c.peer_state(), PeerState::Dead { .. }));
}

/// Kills a producer in `mode` after 300 committed records, then lets a new producer take over.
fn producer_killed(test: &str, mode: &str) {
    let name = name(test);
    let ring = ringbuf::create(&name, CAPACITY).unwrap();
    let mut c = ring.consumer().unwrap();
    let mut first = ChildProc::spawn("producer", &vars(&name, 0, 300, mode));
    assert_eq!(first.expect_line(), "claimed");
    assert_eq!(first.expect_line(), "ready");
    assert!(matches!(c.peer_state(), PeerState::Alive { .. }));
    first.kill();
    drain_then_peer_dead(&mut c, 0, 300);
    // A restarted producer claims the dead one's role; the stream continues where it stopped.
    let mut second = ChildProc::spawn("producer", &vars(&name, 300, 200, "done"));
    assert_eq!(second.expect_line(), "claimed");
    for seq in 300..500 {
        let g = c
            .pop_wait(PATIENCE)
            .unwrap()
            .expect("record from the new producer");
        verify(seq, &g).unwrap();
    }
    second.finish();
    // The new producer left cleanly: the peer is absent and a wait just times out.
    assert_eq!(c.peer_state(), PeerState::Absent);
    assert!(c.pop_wait(Duration::from_millis(20)).unwrap().is_none());
    drop((c, ring));
    assert_shm_clean(&format!("ringbuf-test-{test}.{}", std::process::id()));
}

#[test]
fn producer_killed_holding_uncommitted_reservation() {
    producer_killed("crash-reserve", "reserve");
}

#[test]
fn producer_killed_mid_batch() {
    producer_killed("crash-batch", "batch");
}

#[test]
fn producer_killed_while_streaming() {
    let name = name("crash-stream");
    let ring = ringbuf::create(&name, 64 * 1024).unwrap();
    let mut c = ring.consumer().unwrap();
    let mut child = ChildProc::spawn("producer", &vars(&name, 0, 0, "stream"));
    assert_eq!(child.expect_line(), "claimed");
    assert_eq!(child.expect_line(), "ready");
    // Consume a while, then kill it wherever it happens to be.
    let mut seq = 0;
    while seq < 20_000 {
        let g = c.pop_wait(PATIENCE).unwrap().expect("record");
        verify(seq, &g).unwrap();
        seq += 1;
    }
    child.kill();
    // Every record published before the kill is whole and in order; then PeerDead.
    loop {
        match c.pop_wait(PATIENCE) {
            Ok(Some(g)) => {
                verify(seq, &g).unwrap();
                seq += 1;
            }
            Err(Error::PeerDead { .. }) => break,
            other => panic!(
                "expected records then PeerDead, got {:?}",
                other.map(|g| g.map(|g| g.len()))
            ),
        }
    }
    let mut next = ChildProc::spawn("producer", &vars(&name, seq, 100, "done"));
    assert_eq!(next.expect_line(), "claimed");
    for s in seq..seq + 100 {
        verify(s, &c.pop_wait(PATIENCE).unwrap().expect("record")).unwrap();
    }
    next.finish();
    drop((c, ring));
    assert_shm_clean(&format!("ringbuf-test-crash-stream.{}", std::process::id()));
}

#[test]
fn consumer_killed_holding_a_record_then_taken_over() {
    let name = name("crash-consumer");
    let ring = ringbuf::create(&name, 64 * 1024).unwrap();
    let mut p = ring.producer().unwrap();
    let pool = pool();
    let mut rng = Rng(7);
    let seq = std::cell::Cell::new(0u32);
    let mut push = |p: &mut ringbuf::Producer, timeout| {
        let len = rng.len(256);
        let granted = p.reserve_wait(len, timeout)?;
        let Some(mut g) = granted else {
            return Ok(false);
        };
        fill(&pool, seq.get(), &mut g);
        g.commit();
        seq.set(seq.get() + 1);
        Ok::<bool, Error>(true)
    };
    for _ in 0..100 {
        assert!(push(&mut p, PATIENCE).unwrap());
    }
    let mut first = ChildProc::spawn("consumer", &vars(&name, 0, 40, "hold"));
    assert_eq!(first.expect_line(), "claimed");
    assert_eq!(first.expect_line(), "ready");
    first.kill();
    // Fill the ring: with the consumer dead, a wait for room ends in PeerDead, not a hang.
    loop {
        match push(&mut p, PATIENCE) {
            Ok(true) => {}
            Err(Error::PeerDead { .. }) => break,
            other => panic!("expected PeerDead once full, got {other:?}"),
        }
    }
    assert!(matches!(p.peer_state(), PeerState::Dead { .. }));
    let pushed = seq.get();
    // A new consumer takes over: record 40 (borrowed, never released) is delivered again.
    let mut second = ChildProc::spawn("consumer", &vars(&name, 40, pushed - 40 + 200, "done"));
    assert_eq!(second.expect_line(), "claimed");
    for _ in 0..200 {
        assert!(push(&mut p, PATIENCE).unwrap());
    }
    second.finish();
    assert_eq!(p.peer_state(), PeerState::Absent);
    drop((p, ring));
    assert_shm_clean(&format!(
        "ringbuf-test-crash-consumer.{}",
        std::process::id()
    ));
}

#[test]
fn reap_removes_segments_of_dead_creators() {
    let prefix = format!("ringbuf-test-reap.{}", std::process::id());
    let name = ringbuf::unique_name(&prefix);
    // A child creates a segment and is killed before it can unlink it.
    let mut child = ChildProc::spawn("creator", &[("RING", name.clone())]);
    assert_eq!(child.expect_line(), "created");
    let path = format!("/dev/shm/{name}");
    assert!(std::path::Path::new(&path).exists());
    // While the creator lives, reap leaves the segment alone.
    assert!(ringbuf::reap(&prefix).unwrap().is_empty());
    child.kill();
    assert_eq!(ringbuf::reap(&prefix).unwrap(), vec![name]);
    assert!(!std::path::Path::new(&path).exists());
    assert_shm_clean(&prefix);
}
