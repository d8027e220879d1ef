//! Property tests: random sequences of pushes, batches (committed or dropped), abandoned
//! reservations and partial reads against a `VecDeque` model of the ring, on small capacities so
//! full rings, exact fits and wraps happen constantly.

use crate::{Ring, layout::record_size};
use proptest::prelude::*;
use std::collections::VecDeque;

#[derive(Clone, Debug)]
enum Op {
    Push {
        len: usize,
        kind: u16,
    },
    Batch {
        lens: Vec<usize>,
        commit: bool,
    },
    /// A batch: `lead` records pushed one by one, then `count` records of `width` bytes and
    /// `kind` through `push_slice`.
    Slice {
        lead: Vec<usize>,
        width: usize,
        count: usize,
        kind: u16,
        commit: bool,
    },
    Abandon {
        len: usize,
    },
    Pop {
        max: usize,
    },
    /// `pop_runs(max)`: the same records as `Pop`, a run at a time.
    PopRuns {
        max: usize,
    },
    PopOne,
}

fn op(max_len: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..=max_len, any::<u16>()).prop_map(|(len, kind)| Op::Push { len, kind }),
        2 => (prop::collection::vec(0..=max_len, 0..6), prop::bool::weighted(0.8))
            .prop_map(|(lens, commit)| Op::Batch { lens, commit }),
        2 => (
            prop::collection::vec(prop_oneof![Just(0usize), Just(5), Just(8), 0..=max_len], 0..3),
            prop_oneof![Just(0usize), Just(5), Just(8), Just(16)],
            0usize..40,
            0u16..2,
            prop::bool::weighted(0.8),
        )
            .prop_map(|(lead, width, count, kind, commit)| Op::Slice {
                lead,
                width,
                count,
                kind,
                commit
            }),
        1 => (0..=max_len).prop_map(|len| Op::Abandon { len }),
        2 => (0usize..5).prop_map(|max| Op::Pop { max }),
        2 => (0usize..40).prop_map(|max| Op::PopRuns { max }),
        3 => Just(Op::PopOne),
    ]
}

/// The specification: positions, padding at the wrap, and the records in flight.
struct Model {
    cap: u64,
    tail: u64,
    head: u64,
    /// Kind, payload, and where the head moves once it is read (`None`: not yet, it is a run's
    /// record other than the last).
    records: VecDeque<(u16, Vec<u8>, Option<u64>)>,
}

/// A run being built in a batch: its records' length and kind, how many, and where it starts.
#[derive(Clone, Copy)]
struct ModelRun {
    len: usize,
    kind: u16,
    count: u64,
    start: u64,
}

/// Records a batch has written but not published, and the run its last record may extend.
#[derive(Default)]
struct Staged {
    at: Option<u64>,
    run: Option<ModelRun>,
    records: Vec<(u16, Vec<u8>, Option<u64>)>,
}

impl Model {
    /// Where a record of `len` bytes starting at `at` would end, if it fits.
    fn place(&self, at: u64, len: usize) -> Option<u64> {
        let total = record_size(len as u64);
        let to_end = self.cap - at % self.cap;
        let need = if total <= to_end {
            total
        } else {
            to_end + total
        };
        // The word after the record stays free for the terminator.
        (at + need + 8 - self.head <= self.cap).then_some(at + need)
    }

    /// Where the run would end if a record of `len` bytes joined it at `at` (its current end).
    fn extend(&self, run: ModelRun, at: u64, len: usize, kind: u16) -> Option<u64> {
        let stride = (len as u64).next_multiple_of(8);
        let fits_before_end = run.start % self.cap + (at - run.start) + stride <= self.cap;
        let run_total = at - run.start + stride;
        (run.len == len
            && run.kind == kind
            && run.count < u64::from(u16::MAX)
            && fits_before_end
            && run_total <= self.cap / 2
            && at + stride + 8 - self.head <= self.cap)
            .then_some(at + stride)
    }

    /// What a batch does with one more record: joins the staged run, starts a record, or
    /// refuses it (`false`: the ring is full for it).
    fn stage(&self, staged: &mut Staged, kind: u16, data: Vec<u8>) -> bool {
        let at = staged.at.unwrap_or(self.tail);
        let len = data.len();
        if let Some(end) = staged.run.and_then(|r| self.extend(r, at, len, kind)) {
            if let Some(last) = staged.records.last_mut() {
                last.2 = None;
            }
            staged.records.push((kind, data, Some(end)));
            staged.at = Some(end);
            staged.run = staged.run.map(|r| ModelRun {
                count: r.count + 1,
                ..r
            });
            return true;
        }
        let Some(end) = self.place(at, len) else {
            return false;
        };
        staged.run = Some(ModelRun {
            len,
            kind,
            count: 1,
            start: end - record_size(len as u64),
        });
        staged.at = Some(end);
        staged.records.push((kind, data, Some(end)));
        true
    }

    /// Checks `n` records popped with a limit of `max` (`got`, in order) against the model's
    /// oldest ones, and releases them.
    fn popped(
        &mut self,
        n: usize,
        max: usize,
        got: Vec<(u16, Vec<u8>)>,
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(n, got.len());
        prop_assert_eq!(n, max.min(self.records.len()));
        for (kind, data) in got {
            let (mk, md, end) = self.records.pop_front().unwrap();
            prop_assert_eq!((kind, data), (mk, md));
            self.head = end.unwrap_or(self.head);
        }
        Ok(())
    }

    /// Publishes what a batch staged.
    fn commit(&mut self, staged: Staged) {
        self.tail = staged.at.unwrap_or(self.tail);
        self.records.extend(staged.records);
    }
}

/// `push_slice` of `count` records of `N` bytes into `batch`, checked against the model one
/// record at a time: it writes exactly the prefix the model accepts.
fn push_slice<const N: usize>(
    batch: &mut crate::Batch<'_, crate::HeapMemory>,
    m: &Model,
    staged: &mut Staged,
    seed: &mut u64,
    kind: u16,
    count: usize,
) -> Result<(), TestCaseError> {
    let items: Vec<[u8; N]> = (0..count)
        .map(|_| {
            *seed += 1;
            fill(*seed, N).try_into().unwrap()
        })
        .collect();
    let wrote = batch.push_slice(kind, &items).unwrap();
    let accepted = items
        .iter()
        .take_while(|item| m.stage(staged, kind, item.to_vec()))
        .count();
    prop_assert_eq!(wrote, accepted, "push_slice of {} x {} B", count, N);
    Ok(())
}

fn fill(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) >> 1) as u8)
        .collect()
}

fn run(cap: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let ring = Ring::heap(cap).unwrap();
    let mut p = ring.producer().unwrap();
    let mut c = ring.consumer().unwrap();
    let mut m = Model {
        cap: cap as u64,
        tail: 0,
        head: 0,
        records: VecDeque::new(),
    };
    let mut seed = 0u64;
    for op in ops {
        match op {
            Op::Push { len, kind } => {
                seed += 1;
                let data = fill(seed, len);
                let pushed = p.try_push_kind(kind, &data).unwrap();
                let expect = m.place(m.tail, len);
                prop_assert_eq!(
                    pushed,
                    expect.is_some(),
                    "push of {} at tail {}",
                    len,
                    m.tail
                );
                if let Some(end) = expect {
                    m.tail = end;
                    m.records.push_back((kind, data, Some(end)));
                }
            }
            Op::Batch { lens, commit } => {
                let mut batch = p.batch();
                let mut staged = Staged::default();
                for len in lens {
                    seed += 1;
                    let data = fill(seed, len);
                    let pushed = batch.try_push(&data).unwrap();
                    prop_assert_eq!(
                        pushed,
                        m.stage(&mut staged, 0, data),
                        "batch push of {}",
                        len
                    );
                }
                prop_assert_eq!(batch.len(), staged.records.len());
                if commit {
                    prop_assert_eq!(batch.commit(), staged.records.len());
                    m.commit(staged);
                }
            }
            Op::Slice {
                lead,
                width,
                count,
                kind,
                commit,
            } => {
                let mut batch = p.batch();
                let mut staged = Staged::default();
                for len in lead {
                    seed += 1;
                    let data = fill(seed, len);
                    let pushed = batch.try_push(&data).unwrap();
                    prop_assert_eq!(pushed, m.stage(&mut staged, 0, data));
                }
                let (b, s) = (&mut batch, &mut staged);
                match width {
                    0 => push_slice::<0>(b, &m, s, &mut seed, kind, count)?,
                    5 => push_slice::<5>(b, &m, s, &mut seed, kind, count)?,
                    8 => push_slice::<8>(b, &m, s, &mut seed, kind, count)?,
                    _ => push_slice::<16>(b, &m, s, &mut seed, kind, count)?,
                }
                prop_assert_eq!(batch.len(), staged.records.len());
                if commit {
                    prop_assert_eq!(batch.commit(), staged.records.len());
                    m.commit(staged);
                }
            }
            Op::Abandon { len } => {
                let grant = p.reserve(len).unwrap();
                prop_assert_eq!(grant.is_some(), m.place(m.tail, len).is_some());
            }
            Op::Pop { max } => {
                let mut got = Vec::new();
                let n = c
                    .pop_batch(max, |r| got.push((r.kind, r.payload.to_vec())))
                    .unwrap();
                m.popped(n, max, got)?;
            }
            Op::PopRuns { max } => {
                let mut got = Vec::new();
                let n = c
                    .pop_runs(max, |recs| {
                        assert!(!recs.is_empty());
                        let all: Vec<&[u8]> = recs.iter().collect();
                        assert_eq!(all.len(), recs.len());
                        assert_eq!(recs.get(recs.len()), None);
                        for (i, r) in all.iter().enumerate() {
                            assert_eq!(recs.get(i), Some(*r));
                            assert_eq!(r.len(), recs.record_len());
                        }
                        if let Some(arrays) = recs.as_arrays::<8>() {
                            assert!(arrays.iter().map(|a| &a[..]).eq(all.iter().copied()));
                        }
                        if let Some(arrays) = recs.as_arrays::<16>() {
                            assert!(arrays.iter().map(|a| &a[..]).eq(all.iter().copied()));
                        }
                        got.extend(all.into_iter().map(|r| (recs.kind, r.to_vec())));
                    })
                    .unwrap();
                m.popped(n, max, got)?;
            }
            Op::PopOne => match c.try_pop().unwrap() {
                Some(g) => {
                    let (mk, md, end) = m.records.pop_front().expect("model has a record");
                    prop_assert_eq!((g.kind(), &*g), (mk, &md[..]));
                    m.head = end.unwrap_or(m.head);
                }
                None => prop_assert!(m.records.is_empty()),
            },
        }
    }
    // Drain: everything the model holds comes out, in order.
    while let Some(g) = c.try_pop().unwrap() {
        let (mk, md, _) = m.records.pop_front().expect("model has a record");
        prop_assert_eq!((g.kind(), &*g), (mk, &md[..]));
    }
    prop_assert!(m.records.is_empty());
    Ok(())
}

/// A hostile producer: the data area holds `data`, and the consumer starts at position `start`
/// (any value, as are the published tail it is checked against, `tail`). The consumer, popping
/// in batches (`way` 0), a run at a time (1) or one record at a time (2), yields only payloads
/// that lie inside the data area, or a `Corrupt` error (at its claim, or after which it refuses
/// to go on); it never panics or loops.
fn hostile(cap: usize, data: &[u8], start: u64, tail: u64, way: u8) -> Result<(), TestCaseError> {
    use crate::Memory;
    use crate::sync::Ordering::Release;
    let ring = Ring::heap(cap).unwrap();
    let mem = ring.memory();
    let n = data.len().min(cap);
    // SAFETY: `mem.data()` points at `cap` writable bytes owned by the ring, `n <= cap`, and no
    // grant or other thread touches the data area while this copy runs.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mem.data(), n) };
    mem.header().cons.pos.store(start, Release);
    mem.header().prod.pos.store(tail, Release);
    let mut c = match ring.consumer() {
        Ok(c) => c,
        Err(crate::Error::Corrupt { .. }) => return Ok(()),
        Err(e) => return Err(TestCaseError::fail(format!("untyped failure: {e:?}"))),
    };
    let area = mem.data() as usize..mem.data() as usize + cap;
    // Every byte of `p` in the area; an empty payload may sit at its end (a zero-length record
    // in the area's last 8 bytes: its payload starts one past the end and holds no byte).
    let inside = |p: &[u8]| {
        let start = p.as_ptr() as usize;
        start >= area.start && start + p.len() <= area.end
    };
    let mut outside = 0;
    for _ in 0..(cap / 8 + 2) {
        let step = if way == 0 {
            c.pop_batch(4, |r| outside += usize::from(!inside(r.payload)))
                .map(|n| n > 0)
        } else if way == 1 {
            c.pop_runs(4, |run| {
                for r in run.iter() {
                    outside += usize::from(!inside(r));
                }
            })
            .map(|n| n > 0)
        } else {
            c.try_pop()
                .map(|g| g.map(|g| outside += usize::from(!inside(&g))).is_some())
        };
        match step {
            Ok(true) => {}
            Ok(false) => break,
            Err(crate::Error::Corrupt { .. }) => {
                let poisoned = matches!(c.try_pop(), Err(crate::Error::Corrupt { .. }));
                prop_assert!(poisoned, "a corrupt ring went on");
                break;
            }
            Err(e) => prop_assert!(false, "untyped failure: {e:?}"),
        }
    }
    prop_assert_eq!(outside, 0, "payloads outside the data area");
    Ok(())
}

fn hostile_position() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (0u64..75).prop_map(|p| p * 8),
        1 => any::<u64>(),
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 7),
    ]
}

/// A length word that passes for a record header: the live bit, maybe padding or a run.
fn header_len() -> impl Strategy<Value = u32> {
    use crate::layout::{LIVE_BIT, PAD_BIT, RUN_BIT};
    prop_oneof![
        any::<u32>(),
        (0u32..300).prop_map(|l| l | LIVE_BIT),
        (0u32..300).prop_map(|l| l | LIVE_BIT | RUN_BIT),
        (0u32..300).prop_map(|l| l | LIVE_BIT | PAD_BIT),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn a_hostile_producer_gets_records_or_corrupt_never_a_panic(
        data in prop::collection::vec(any::<u8>(), 0..=256),
        words in prop::collection::vec(
            (prop_oneof![3 => 0usize..3, 1 => 0usize..32], header_len(), 0u16..4),
            0..8,
        ),
        start in hostile_position(),
        tail in hostile_position(),
        way in 0u8..3,
    ) {
        // Arbitrary bytes, with plausible-looking record headers (a length word and a small run
        // count) placed in them, mostly at and just after where the consumer starts.
        let mut data = data;
        data.resize(256, 0);
        for (ahead, len, count) in words {
            let slot = ((start / 8) as usize + ahead) % 32;
            data[slot * 8..slot * 8 + 4].copy_from_slice(&len.to_ne_bytes());
            data[slot * 8 + 6..slot * 8 + 8].copy_from_slice(&count.to_ne_bytes());
        }
        hostile(256, &data, start, tail, way)?;
    }

    #[test]
    fn matches_model_tiny_ring(ops in prop::collection::vec(op(24), 1..200)) {
        run(64, ops)?;
    }

    #[test]
    fn matches_model_small_ring(ops in prop::collection::vec(op(120), 1..200)) {
        run(256, ops)?;
    }

    #[test]
    fn matches_model_page_ring(ops in prop::collection::vec(op(2040), 1..120)) {
        run(4096, ops)?;
    }
}
