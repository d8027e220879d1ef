use super::*;

fn name(tag: &str) -> String {
    ringbuf::unique_name(&format!("rs-tpcomm-{tag}"))
}

fn opts(slot_floats: usize) -> CommOptions {
    CommOptions {
        slot_floats,
        timeout: Duration::from_secs(20),
        ..CommOptions::default()
    }
}

/// Runs `f(comm)` on `world` threads, one rank each, and returns their results in rank order.
fn group<T: Send + 'static>(
    world: usize,
    slot_floats: usize,
    f: impl Fn(&mut ShmComm) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let name = name("g");
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let name = name.clone();
            std::thread::spawn(move || {
                let mut comm = if rank == 0 {
                    ShmComm::create(&name, world, opts(slot_floats)).expect("create")
                } else {
                    ShmComm::attach(&name, rank, opts(slot_floats)).expect("attach")
                };
                f(&mut comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

#[test]
fn all_reduce_sums_exactly_over_many_rounds() {
    // Small integers are exact in f32, so the sums must be exact; 7-float slots force chunking.
    let results = group(4, 7, |c| {
        let r = c.rank() as f32;
        let mut last = Vec::new();
        for round in 0..300u32 {
            let len = 1 + (round as usize * 13) % 40;
            let mut data: Vec<f32> = (0..len)
                .map(|i| r * 1000.0 + i as f32 + round as f32)
                .collect();
            c.all_reduce_sum(&mut data).expect("all_reduce");
            for (i, v) in data.iter().enumerate() {
                let want = 6000.0 + 4.0 * (i as f32 + round as f32);
                assert_eq!(*v, want, "round {round} element {i}");
            }
            last = data;
        }
        last
    });
    assert!(results.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn all_reduce_is_bit_identical_across_ranks() {
    let results = group(3, 64, |c| {
        let r = c.rank() as f32;
        let mut data: Vec<f32> = (0..100)
            .map(|i| (i as f32 * 0.1 + r).sin() * 1e-3)
            .collect();
        c.all_reduce_sum(&mut data).expect("all_reduce");
        data.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    });
    assert_eq!(results[0], results[1]);
    assert_eq!(results[1], results[2]);
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    let results = group(4, 5, |c| {
        let r = c.rank();
        let mut outs = Vec::new();
        for len in [0usize, 1, 5, 6, 23] {
            let input: Vec<f32> = (0..len).map(|i| (r * 100 + i) as f32).collect();
            let mut out = vec![-1.0; len * 4];
            c.all_gather(&input, &mut out).expect("all_gather");
            outs.push(out);
        }
        outs
    });
    for outs in &results {
        for (out, len) in outs.iter().zip([0usize, 1, 5, 6, 23]) {
            let want: Vec<f32> = (0..4)
                .flat_map(|r| (0..len).map(move |i| (r * 100 + i) as f32))
                .collect();
            assert_eq!(out, &want);
        }
    }
}

#[test]
fn all_gather_checks_output_length() {
    let errs = group(2, 8, |c| {
        let mut out = vec![0.0; 3];
        matches!(
            c.all_gather(&[1.0, 2.0], &mut out),
            Err(CommError::Invalid(_))
        )
    });
    assert!(errs.iter().all(|&e| e));
}

#[test]
fn length_mismatch_is_an_error() {
    let results = group(2, 8, |c| {
        let mut data = vec![1.0; 2 + c.rank()];
        c.all_reduce_sum(&mut data).err()
    });
    assert!(
        results
            .iter()
            .all(|e| matches!(e, Some(CommError::LengthMismatch { .. }))),
        "{results:?}"
    );
}

#[test]
fn single_rank_group_is_the_identity() {
    let mut c = ShmComm::create(&name("solo"), 1, opts(4)).expect("create");
    let mut data = vec![1.5, -2.0, 3.25, 4.0, 5.0, 6.0];
    c.all_reduce_sum(&mut data).expect("all_reduce");
    assert_eq!(data, [1.5, -2.0, 3.25, 4.0, 5.0, 6.0]);
}

#[test]
fn peer_that_left_is_an_error() {
    let name = name("left");
    let n2 = name.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let leaver = std::thread::spawn(move || {
        let c = ShmComm::attach(&n2, 1, opts(8)).expect("attach");
        rx.recv().expect("go");
        drop(c);
    });
    let mut c = ShmComm::create(&name, 2, opts(8)).expect("create");
    tx.send(()).expect("send");
    leaver.join().expect("thread");
    let err = c.all_reduce_sum(&mut [1.0]).expect_err("peer left");
    assert!(matches!(err, CommError::PeerLeft { rank: 1 }), "{err}");
}

#[test]
fn dead_peer_is_an_error() {
    let name = name("dead");
    let n2 = name.clone();
    let peer = std::thread::spawn(move || ShmComm::attach(&n2, 1, opts(8)).expect("attach"));
    let mut c = ShmComm::create(&name, 2, opts(8)).expect("create");
    let peer = peer.join().expect("thread");
    // Make rank 1 look like a process that died: a reaped child's pid.
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead = child.id();
    child.wait().expect("wait");
    peer.ctl(1).pid.store(dead, Ordering::Release);
    let err = c.all_reduce_sum(&mut [1.0]).expect_err("dead peer");
    assert!(
        matches!(err, CommError::PeerDead { rank: 1, pid } if pid == dead),
        "{err}"
    );
    std::mem::forget(peer); // its Drop would find a foreign pid in its slot anyway
}

#[test]
fn bad_arguments_are_typed_errors() {
    assert!(matches!(
        ShmComm::create(&name("w0"), 0, opts(8)),
        Err(CommError::Invalid(_))
    ));
    assert!(matches!(
        ShmComm::create("bad/name", 2, opts(8)),
        Err(CommError::Segment(ringbuf::Error::InvalidName(_)))
    ));
    let n = name("rank");
    let creator = {
        let n = n.clone();
        std::thread::spawn(move || {
            ShmComm::create(
                &n,
                2,
                CommOptions {
                    timeout: Duration::from_millis(300),
                    ..opts(8)
                },
            )
        })
    };
    // Rank 5 of a group of 2: a typed error once the segment exists.
    let err = ShmComm::attach(&n, 5, opts(8)).expect_err("rank out of range");
    assert!(matches!(err, CommError::Invalid(_)), "{err}");
    // Nobody joins as rank 1: the creator times out rather than hanging.
    assert!(matches!(
        creator.join().expect("thread"),
        Err(CommError::Timeout { .. })
    ));
}

#[test]
fn corrupt_header_is_rejected() {
    let n = name("corrupt");
    let solo = ShmComm::create(&n, 1, opts(8)).expect("create");
    solo.header().world.store(999, Ordering::Relaxed);
    let err = ShmComm::attach(&n, 0, opts(8)).expect_err("corrupt");
    assert!(matches!(err, CommError::Corrupt { .. }), "{err}");
    solo.header().world.store(1, Ordering::Relaxed);
    solo.header().slot_floats.store(1 << 30, Ordering::Relaxed);
    let err = ShmComm::attach(&n, 0, opts(8)).expect_err("too small");
    assert!(matches!(err, CommError::Corrupt { .. }), "{err}");
}

#[test]
fn segment_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let n = name("mode");
    let solo = ShmComm::create(&n, 1, opts(8)).expect("create");
    let path = format!("/dev/shm/{n}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let err = ShmComm::attach(&n, 0, opts(8)).expect_err("not private");
    assert!(
        matches!(
            err,
            CommError::Segment(ringbuf::Error::InsecureMode { mode: 0o644, .. })
        ),
        "{err}"
    );
    drop(solo);
    assert!(!std::path::Path::new(&path).exists(), "creator unlinks");
}
