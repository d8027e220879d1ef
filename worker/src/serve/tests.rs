//! The serving loop against real shared-memory rings, driven from the test as the gateway would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use protos::records::{Cancel, ErrorCode, Finish, Hello, RecordKind, SamplingWire, Submit, Tokens};

use super::*;
use crate::backend::testing::ToyBackend;
use crate::engine::{Engine, EngineConfig};

struct Harness {
    tx: Producer,
    rx: Consumer,
    stop: Arc<AtomicBool>,
    drain: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<Result<ServeExit, ServeError>>>,
    _rings: (Ring, Ring),
}

impl Harness {
    fn start() -> Self {
        let prefix = ringbuf::unique_name("rs-serve-test");
        let names = RingNames::new(&prefix);
        let req = ringbuf::create(&names.request, 64 * 1024).unwrap();
        let resp = ringbuf::create(&names.response, 64 * 1024).unwrap();
        let tx = req.producer().unwrap();
        let rx = resp.consumer().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let life = lifecycle::Lifecycle::default();
        let drain = life.drain.clone();
        let config = ServeConfig {
            rings: prefix,
            ring_capacity: 64 * 1024,
            vocab_size: 64,
            stop: stop.clone(),
            lifecycle: life,
        };
        let worker = std::thread::spawn(move || {
            let (backend, model) = ToyBackend::with_config(64, 16, 64);
            let engine = Engine::new(
                Box::new(backend),
                &model,
                EngineConfig {
                    seed: Some(1),
                    ..EngineConfig::default()
                },
            )
            .unwrap();
            serve(engine, &config)
        });
        let mut h = Self {
            tx,
            rx,
            stop,
            drain,
            worker: Some(worker),
            _rings: (req, resp),
        };
        let hello = h.next_record(RecordKind::Hello);
        let info = Hello::decode(&hello).unwrap();
        assert_eq!(info.vocab_size, 64);
        assert_eq!(info.block_size, 16);
        h
    }

    fn next_record(&mut self, kind: RecordKind) -> Vec<u8> {
        let rec = self
            .rx
            .pop_wait(Duration::from_secs(10))
            .unwrap()
            .expect("a record within 10 s");
        assert_eq!(rec.kind(), kind as u16);
        rec.to_vec()
    }

    fn send(&mut self, bytes: &[u8], kind: RecordKind) {
        let mut g = self.tx.reserve(bytes.len()).unwrap().unwrap();
        g.copy_from_slice(bytes);
        g.set_kind(kind as u16);
        g.commit();
    }

    fn submit(&mut self, id: u64, prompt: Vec<u32>, max_tokens: u32) {
        let s = Submit {
            request_id: id,
            sampling: SamplingWire {
                temperature: 0.0,
                ..SamplingWire::default()
            },
            max_tokens,
            min_tokens: 0,
            logprobs: 0,
            ignore_eos: true,
            stop_token_ids: vec![],
            prompt,
            prior_output_len: 0,
            grammar: None,
        };
        let mut buf = vec![0u8; s.encoded_len()];
        s.encode(&mut buf).unwrap();
        self.send(&buf, RecordKind::Submit);
    }

    /// Collects entries until `id` finishes; returns its tokens, its finish and the last gauges.
    fn collect(&mut self, id: u64) -> (Vec<u32>, Finish, protos::records::EngineGauges) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut tokens = Vec::new();
        while Instant::now() < deadline {
            let rec = self.next_record(RecordKind::Tokens);
            let mut done = None;
            let g = Tokens::decode(&rec, |e| {
                if e.request_id == id {
                    tokens.extend(e.tokens.iter());
                    if e.finish != Finish::None {
                        done = Some(e.finish);
                    }
                }
            })
            .unwrap();
            if let Some(f) = done {
                return (tokens, f, g);
            }
        }
        panic!("request {id} did not finish");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let exit = w.join().unwrap().unwrap();
            assert_eq!(exit, ServeExit::Stopped);
        }
    }
}

#[test]
fn serves_requests_and_reports_gauges() {
    let mut h = Harness::start();
    h.submit(1, vec![1, 2, 3], 5);
    let (tokens, finish, _) = h.collect(1);
    assert_eq!(tokens.len(), 5);
    assert_eq!(finish, Finish::Length);
    // The same prompt again gives the same greedy tokens.
    h.submit(2, vec![1, 2, 3], 5);
    assert_eq!(h.collect(2).0, tokens);
}

#[test]
fn cancel_frees_blocks_and_is_acknowledged() {
    let mut h = Harness::start();
    h.submit(7, vec![1; 40], 900);
    // Wait until it produced something, then cancel.
    let rec = h.next_record(RecordKind::Tokens);
    Tokens::decode(&rec, |_| {}).unwrap();
    let mut buf = [0u8; Cancel::LEN];
    Cancel::new(7).encode(&mut buf).unwrap();
    h.send(&buf, RecordKind::Cancel);
    let (_, finish, gauges) = h.collect(7);
    assert_eq!(finish, Finish::Cancelled);
    assert_eq!(gauges.running, 0);
    assert_eq!(gauges.kv_blocks_used, 0);
}

#[test]
fn a_corrupt_submit_fails_that_request_only() {
    let mut h = Harness::start();
    let s = Submit {
        request_id: 9,
        sampling: SamplingWire::default(),
        max_tokens: 3,
        min_tokens: 0,
        logprobs: 0,
        ignore_eos: true,
        stop_token_ids: vec![],
        prompt: vec![1, 2],
        prior_output_len: 0,
        grammar: None,
    };
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    // Claim more prompt tokens than the record holds.
    buf[64..68].copy_from_slice(&50u32.to_ne_bytes());
    h.send(&buf, RecordKind::Submit);
    let rec = h.next_record(RecordKind::Tokens);
    let mut seen = Vec::new();
    Tokens::decode(&rec, |e| seen.push((e.request_id, e.finish, e.error))).unwrap();
    assert_eq!(seen, vec![(9, Finish::Error, ErrorCode::CorruptRecord)]);
    // The worker goes on serving.
    h.submit(10, vec![3, 4], 2);
    assert_eq!(h.collect(10).1, Finish::Length);
}

#[test]
fn a_draining_worker_finishes_its_requests_and_leaves_once_released() {
    use protos::records::{Draining, Release};
    let mut h = Harness::start();
    h.submit(1, vec![1, 2, 3], 40);
    h.drain.store(true, Ordering::Relaxed);
    // Until the Draining record: tokens of request 1 may come first.
    let mut tokens = Vec::new();
    let mut finished = false;
    loop {
        let rec =
            h.rx.pop_wait(Duration::from_secs(10))
                .unwrap()
                .expect("a record within 10 s");
        let (kind, bytes) = (rec.kind(), rec.to_vec());
        if kind == RecordKind::Draining as u16 {
            Draining::decode(&bytes).unwrap();
            break;
        }
        assert_eq!(kind, RecordKind::Tokens as u16);
        Tokens::decode(&bytes, |e| {
            tokens.extend(e.tokens.iter());
            finished |= e.finish == Finish::Length;
        })
        .unwrap();
    }
    // A request already on its way when the gateway learned of the drain is still served.
    h.submit(2, vec![4, 5], 3);
    let mut second = Vec::new();
    let mut second_done = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(finished && second_done) {
        assert!(Instant::now() < deadline, "requests did not finish");
        let rec = h.next_record(RecordKind::Tokens);
        Tokens::decode(&rec, |e| match e.request_id {
            1 => {
                tokens.extend(e.tokens.iter());
                finished |= e.finish == Finish::Length;
            }
            2 => {
                second.extend(e.tokens.iter());
                second_done |= e.finish == Finish::Length;
            }
            other => panic!("unexpected request {other}"),
        })
        .unwrap();
    }
    assert_eq!(tokens.len(), 40);
    assert_eq!(second.len(), 3);
    // Not released yet: the worker stays.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!h.worker.as_ref().unwrap().is_finished());
    let mut buf = [0u8; Release::LEN];
    Release::new().encode(&mut buf).unwrap();
    h.send(&buf, RecordKind::Release);
    let exit = h.worker.take().unwrap().join().unwrap().unwrap();
    assert_eq!(exit, ServeExit::Drained);
}
