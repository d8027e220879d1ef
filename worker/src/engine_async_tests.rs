//! Async scheduling over the [`ToyBackend`] (which checks every slot it reads through the block
//! tables): the engine that launches each decode step before the one on the device is applied
//! gives every request the tokens and endings of the synchronous engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::backend::testing::ToyBackend;
use crate::sampler::SamplingParams;

const VOCAB: usize = 97;

/// An engine over a toy backend that samples on the "device"; with `launches`, it also takes
/// launched steps. Returns the count of fed (planned-ahead) steps.
fn engine(launches: bool, eos: u32, config: EngineConfig) -> (Engine, Arc<AtomicUsize>) {
    let (mut backend, mut model) = ToyBackend::with_config(VOCAB, 4, 96);
    backend.device_sampling = true;
    backend.launches = launches;
    model.eos_token_ids = vec![eos];
    let fed = backend.fed_steps.clone();
    let engine = Engine::new(Box::new(backend), &model, config).expect("engine");
    (engine, fed)
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 29 + salt * 11 + 5) % (VOCAB as u32 - 1))
        .collect()
}

/// Requests of every kind the async path meets: greedy and seeded sampling, some that may end
/// on the model's EOS, one on the stop token `stop`, long and short outputs, a shared prefix.
fn requests_stopping_at(stop: u32) -> Vec<Request> {
    let shared = prompt(9, 7);
    (0..8u64)
        .map(|i| {
            let mut p = if i % 3 == 0 {
                shared.clone()
            } else {
                prompt(3 + 5 * i as usize, i as u32)
            };
            p.push(i as u32);
            let mut req = Request::new(SeqId(i), p, 6 + 7 * (i as usize % 4));
            req.params = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    temperature: 0.9,
                    top_k: 30,
                    seed: Some(100 + i),
                    ..Default::default()
                }
            };
            req.ignore_eos = i % 4 != 1;
            if i == 6 {
                req.stop_token_ids = vec![stop];
            }
            req
        })
        .collect()
}

fn requests() -> Vec<Request> {
    requests_stopping_at(VOCAB as u32 - 1)
}

/// Every request's tokens and ending; requests in `late` arrive after step 3.
fn run(
    engine: &mut Engine,
    reqs: Vec<Request>,
    late: &[u64],
) -> HashMap<u64, (Vec<u32>, Option<FinishReason>)> {
    let (now, later): (Vec<_>, Vec<_>) = reqs.into_iter().partition(|r| !late.contains(&r.id.0));
    for r in now {
        engine.add_request(r).expect("valid");
    }
    let mut later = Some(later);
    let mut out: HashMap<u64, (Vec<u32>, Option<FinishReason>)> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() || later.is_some() {
        for ev in engine.step().expect("step") {
            let e = out.entry(ev.id.0).or_default();
            assert!(e.1.is_none(), "an event after request {}'s last", ev.id.0);
            e.0.push(ev.token);
            e.1 = ev.finish;
        }
        let pool = engine.scheduler().kv().pool();
        pool.check_invariants().expect("pool invariants");
        steps += 1;
        if steps == 3 {
            for r in later.take().expect("once") {
                engine.add_request(r).expect("valid");
            }
        }
        assert!(steps < 5_000, "no progress");
    }
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    out
}

#[test]
fn async_scheduling_gives_the_synchronous_tokens_and_endings() {
    let config = EngineConfig {
        max_num_batched_tokens: 24,
        async_scheduling: true,
        ..EngineConfig::default()
    };
    // Endings mid-stream: request 1's fourth token as the model's EOS (requests 1 and 5 heed
    // it), request 6's fifth token as its stop token.
    let free = run(
        &mut engine(false, VOCAB as u32 - 1, config.clone()).0,
        requests(),
        &[],
    );
    let (eos, stop) = (free[&1].0[3], free[&6].0[4]);
    let sync = run(
        &mut engine(false, eos, config.clone()).0,
        requests_stopping_at(stop),
        &[],
    );
    assert_eq!(
        sync[&1],
        (free[&1].0[..4].to_vec(), Some(FinishReason::Stop))
    );
    assert_eq!(sync[&6].1, Some(FinishReason::Stop));
    assert!(sync[&6].0.len() <= 5);
    let (mut e, fed) = engine(true, eos, config.clone());
    assert_eq!(run(&mut e, requests_stopping_at(stop), &[]), sync);
    assert!(fed.load(Ordering::Relaxed) > 10, "steps were planned ahead");
    assert_eq!(e.stats().planned_ahead, fed.load(Ordering::Relaxed) as u64);
    // Arrivals while a planned-ahead step is on the device.
    let late = [2, 5, 7];
    let sync = run(
        &mut engine(false, eos, config.clone()).0,
        requests_stopping_at(stop),
        &late,
    );
    let (mut e, fed) = engine(true, eos, config);
    assert_eq!(run(&mut e, requests_stopping_at(stop), &late), sync);
    assert!(fed.load(Ordering::Relaxed) > 10);
}

#[test]
fn async_scheduling_respects_max_model_len_and_full_batches() {
    let config = EngineConfig {
        max_model_len: Some(48),
        max_num_seqs: 3,
        async_scheduling: true,
        ..EngineConfig::default()
    };
    let sync = run(&mut engine(false, 12, config.clone()).0, requests(), &[]);
    let (mut e, fed) = engine(true, 12, config);
    assert_eq!(run(&mut e, requests(), &[]), sync);
    assert!(fed.load(Ordering::Relaxed) > 0);
    assert!(sync.values().all(|(t, _)| !t.is_empty()));
}

#[test]
fn a_request_cancelled_while_its_next_step_runs_gets_no_more_tokens() {
    let config = EngineConfig {
        async_scheduling: true,
        ..EngineConfig::default()
    };
    let (mut e, fed) = engine(true, VOCAB as u32 - 1, config);
    for id in 0..3 {
        let mut r = Request::new(SeqId(id), prompt(6, id as u32), 40);
        r.params = SamplingParams::greedy();
        r.ignore_eos = true;
        e.add_request(r).expect("valid");
    }
    let mut got: HashMap<u64, usize> = HashMap::new();
    for _ in 0..5 {
        for ev in e.step().expect("step") {
            *got.entry(ev.id.0).or_default() += 1;
        }
    }
    assert!(fed.load(Ordering::Relaxed) > 0, "a step is on the device");
    assert!(e.cancel(SeqId(1)).expect("cancel"));
    let at_cancel = got[&1];
    while e.has_unfinished() {
        for ev in e.step().expect("step") {
            *got.entry(ev.id.0).or_default() += 1;
        }
    }
    assert_eq!(got[&1], at_cancel, "no token after the cancel");
    assert_eq!((got[&0], got[&2]), (40, 40));
    assert_eq!(e.scheduler().kv().pool().num_used(), 0);
}

#[test]
fn steps_needing_the_host_sampler_run_synchronously() {
    let config = EngineConfig {
        async_scheduling: true,
        ..EngineConfig::default()
    };
    let mk = || {
        let mut reqs = requests();
        reqs[1].logprobs = Some(2);
        reqs[4].params.frequency_penalty = 0.4;
        reqs
    };
    let sync = run(&mut engine(false, 12, config.clone()).0, mk(), &[]);
    let (mut e, _) = engine(true, 12, config);
    assert_eq!(run(&mut e, mk(), &[]), sync);
}

#[test]
fn async_scheduling_off_launches_nothing() {
    let (mut e, fed) = engine(true, 12, EngineConfig::default());
    let sync = run(
        &mut engine(false, 12, EngineConfig::default()).0,
        requests(),
        &[],
    );
    assert_eq!(run(&mut e, requests(), &[]), sync);
    assert_eq!(fed.load(Ordering::Relaxed), 0);
}

/// Random workloads — arrivals at random steps, a small KV pool that preempts, random budgets
/// and batch limits, greedy and seeded rows, stop tokens, cancels at random steps — through the
/// async engine: every request's stream is its stream alone in the synchronous engine (a
/// cancelled one's, a prefix of it), and every block is free at the end.
#[test]
fn random_workloads_through_the_async_engine_keep_every_stream() {
    use rand::{Rng, SeedableRng};
    let (mut planned, mut preempted, mut gapped) = (0, 0, 0);
    for seed in 0..24u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n = rng.random_range(3..12u64);
        let reqs: Vec<Request> = (0..n)
            .map(|i| {
                let len = rng.random_range(1..30);
                let mut r = Request::new(
                    SeqId(i),
                    (0..len).map(|_| rng.random_range(0..8)).collect(),
                    rng.random_range(1..28),
                );
                r.params = if rng.random_bool(0.5) {
                    SamplingParams::greedy()
                } else {
                    SamplingParams {
                        temperature: 1.0,
                        top_k: 20,
                        seed: Some(seed * 100 + i),
                        ..Default::default()
                    }
                };
                r.ignore_eos = rng.random_bool(0.7);
                if rng.random_bool(0.3) {
                    r.stop_token_ids = vec![rng.random_range(0..VOCAB as u32)];
                }
                r
            })
            .collect();
        let arrive: Vec<usize> = (0..n).map(|_| rng.random_range(0..12)).collect();
        let cancel: Vec<Option<usize>> = (0..n)
            .map(|_| rng.random_bool(0.2).then(|| rng.random_range(1..30)))
            .collect();
        let config = EngineConfig {
            max_num_batched_tokens: rng.random_range(8..64),
            max_num_seqs: rng.random_range(1..8),
            async_scheduling: true,
            ..EngineConfig::default()
        };
        // Each request alone, synchronously: its reference stream.
        let alone: Vec<(Vec<u32>, Option<FinishReason>)> = reqs
            .iter()
            .map(|r| {
                let (mut e, _) = engine(false, 12, EngineConfig::default());
                run(&mut e, vec![r.clone()], &[])
                    .remove(&r.id.0)
                    .unwrap_or_default()
            })
            .collect();
        let (backend, mut model) = ToyBackend::with_config(VOCAB, 4, 40);
        let mut backend = backend;
        backend.device_sampling = true;
        backend.launches = true;
        let gaps = backend.fed_with_gaps.clone();
        model.eos_token_ids = vec![12];
        let mut e = Engine::new(Box::new(backend), &model, config).expect("engine");
        let mut got: HashMap<u64, (Vec<u32>, Option<FinishReason>)> = HashMap::new();
        let mut step = 0;
        while step < 12 || e.has_unfinished() {
            for (i, r) in reqs.iter().enumerate() {
                if arrive[i] == step {
                    e.add_request(r.clone()).expect("valid");
                }
                if cancel[i] == Some(step) {
                    e.cancel(r.id).expect("cancel");
                }
            }
            for ev in e.step().expect("step") {
                let g = got.entry(ev.id.0).or_default();
                assert!(
                    g.1.is_none(),
                    "seed {seed}: an event after request {}'s last",
                    ev.id.0
                );
                g.0.push(ev.token);
                g.1 = ev.finish;
            }
            e.scheduler()
                .kv()
                .pool()
                .check_invariants()
                .expect("pool invariants");
            step += 1;
            assert!(step < 5_000, "seed {seed}: no progress");
        }
        assert_eq!(e.scheduler().kv().pool().num_used(), 0, "seed {seed}");
        planned += e.stats().planned_ahead;
        preempted += e.stats().preemptions;
        gapped += gaps.load(Ordering::Relaxed);
        for (i, r) in reqs.iter().enumerate() {
            let g = got.remove(&r.id.0).unwrap_or_default();
            let (want, finish) = &alone[i];
            if cancel[i].is_some() && g.1.is_none() {
                assert!(
                    want.starts_with(&g.0),
                    "seed {seed}, request {i}: not a prefix"
                );
            } else {
                assert_eq!((&g.0, &g.1), (want, finish), "seed {seed}, request {i}");
            }
        }
    }
    assert!(planned > 50, "steps were planned ahead ({planned})");
    assert!(
        gapped > 5,
        "fed steps skipped draws of sequences ended by length ({gapped})"
    );
    assert!(preempted > 0, "the small pool preempted");
}
