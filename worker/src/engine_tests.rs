//! Engine tests over the [`ToyBackend`], whose logits are a hash of the context it reads back through
//! the block tables: any block-table, prefix-cache or preemption bug changes the tokens.

use std::collections::HashMap;

use super::*;
use crate::backend::testing::{ToyBackend, toy_logits};
use crate::sampler::{Logprobs, SamplingParams, argmax};

const VOCAB: usize = 97;

fn engine_with(block_size: usize, num_blocks: usize, config: EngineConfig) -> Engine {
    let (backend, model) = ToyBackend::with_config(VOCAB, block_size, num_blocks);
    Engine::new(Box::new(backend), &model, config).expect("valid engine")
}

fn greedy(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut req = Request::new(SeqId(id), prompt, max_tokens);
    req.params = SamplingParams::greedy();
    req.ignore_eos = true;
    req
}

/// Greedy tokens computed straight from the toy model, without the engine.
fn reference(prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..max_tokens {
        ctx.push(argmax(&toy_logits(&ctx, VOCAB)));
    }
    ctx[prompt.len()..].to_vec()
}

/// Runs every request to completion, checking the KV invariants after each step.
fn run_all(engine: &mut Engine, reqs: Vec<Request>) -> HashMap<u64, Vec<u32>> {
    for req in reqs {
        engine.add_request(req).expect("valid request");
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        for ev in engine.step().expect("step") {
            out.entry(ev.id.0).or_default().push(ev.token);
        }
        check_invariants(engine);
        steps += 1;
        assert!(steps < 10_000, "no progress");
    }
    let pool = engine.scheduler().kv().pool();
    assert_eq!(
        pool.num_used(),
        0,
        "every block is free after all sequences finished"
    );
    assert_eq!(engine.scheduler().kv().num_seqs(), 0);
    out
}

fn check_invariants(engine: &Engine) {
    let pool = engine.scheduler().kv().pool();
    pool.check_invariants().expect("pool invariants");
    let s = engine.stats();
    assert_eq!(s.kv_blocks_used + pool.num_free(), s.kv_blocks_total);
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + salt * 7 + 3) % (VOCAB as u32 - 1))
        .collect()
}

fn cases() -> Vec<(Vec<u32>, usize)> {
    vec![
        (prompt(1, 1), 24),
        (prompt(13, 2), 24),
        (prompt(40, 3), 17),
        (prompt(5, 4), 30),
        (prompt(33, 5), 24),
    ]
}

fn reqs(cases: &[(Vec<u32>, usize)]) -> Vec<Request> {
    cases
        .iter()
        .enumerate()
        .map(|(i, (p, n))| greedy(i as u64, p.clone(), *n))
        .collect()
}

fn expected(cases: &[(Vec<u32>, usize)]) -> HashMap<u64, Vec<u32>> {
    cases
        .iter()
        .enumerate()
        .map(|(i, (p, n))| (i as u64, reference(p, *n)))
        .collect()
}

#[test]
fn each_alone_matches_the_reference() {
    let cases = cases();
    let want = expected(&cases);
    for (i, req) in reqs(&cases).into_iter().enumerate() {
        let mut engine = engine_with(16, 64, EngineConfig::default());
        let got = run_all(&mut engine, vec![req]);
        assert_eq!(got[&(i as u64)], want[&(i as u64)], "case {i}");
    }
}

#[test]
fn all_together_with_small_chunks_match() {
    let cases = cases();
    let want = expected(&cases);
    for (chunk, block) in [(8192, 16), (7, 16), (7, 4), (1, 3)] {
        let config = EngineConfig {
            max_num_batched_tokens: chunk,
            ..EngineConfig::default()
        };
        let mut engine = engine_with(block, 200, config);
        assert_eq!(
            run_all(&mut engine, reqs(&cases)),
            want,
            "chunk {chunk}, block {block}"
        );
    }
}

#[test]
fn max_num_seqs_limits_the_batch_but_not_the_result() {
    let cases = cases();
    let config = EngineConfig {
        max_num_seqs: 2,
        ..EngineConfig::default()
    };
    let mut engine = engine_with(8, 100, config);
    for req in reqs(&cases) {
        engine.add_request(req).expect("valid");
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    while engine.has_unfinished() {
        let events = engine.step().expect("step");
        assert!(engine.stats().running <= 2 && engine.last_step().num_seqs <= 2);
        for ev in events {
            out.entry(ev.id.0).or_default().push(ev.token);
        }
    }
    assert_eq!(out, expected(&cases));
}

#[test]
fn prefix_cache_hits_keep_tokens_identical() {
    let shared = prompt(37, 9);
    let mut cases = Vec::new();
    for i in 0..4u32 {
        let mut p = shared.clone();
        p.extend(prompt(3 + i as usize * 5, 20 + i));
        cases.push((p, 12));
    }
    // Repeated prompts, and one that is exactly a prefix of another.
    cases.push((shared.clone(), 12));
    cases.push((shared.clone(), 12));
    cases.push((shared[..32].to_vec(), 12));
    let want = expected(&cases);
    // A small budget staggers admissions, so later requests of the first wave hit blocks the
    // earlier ones computed; the second wave hits blocks that are free but still cached.
    let config = EngineConfig {
        max_num_batched_tokens: 48,
        ..EngineConfig::default()
    };
    let mut engine = engine_with(4, 300, config);
    assert_eq!(run_all(&mut engine, reqs(&cases)), want);
    let first = engine.stats();
    assert!(
        first.prefix_hit_tokens > 0,
        "requests in one wave already share blocks: {first:?}"
    );
    let again: Vec<Request> = reqs(&cases)
        .into_iter()
        .map(|mut r| {
            r.id = SeqId(r.id.0 + 100);
            r
        })
        .collect();
    let got = run_all(&mut engine, again);
    for (i, toks) in want {
        assert_eq!(got[&(i + 100)], toks);
    }
    let second = engine.stats();
    assert!(
        second.prefix_hit_tokens - first.prefix_hit_tokens >= 7 * 32,
        "{second:?}"
    );
}

#[test]
fn preemption_by_recompute_keeps_tokens_identical() {
    let cases = cases();
    let want = expected(&cases);
    // 40 + 17 = 57 tokens need 15 blocks of 4: the pool fits one long sequence and little else.
    for prefix_caching in [true, false] {
        let config = EngineConfig {
            enable_prefix_caching: prefix_caching,
            ..EngineConfig::default()
        };
        let mut engine = engine_with(4, 17, config);
        assert_eq!(
            run_all(&mut engine, reqs(&cases)),
            want,
            "prefix caching {prefix_caching}"
        );
        assert!(
            engine.stats().preemptions > 0,
            "the pool was meant to be too small"
        );
    }
}

#[test]
fn seeded_sampling_does_not_depend_on_the_batch() {
    let sampled = |id: u64, seed: u64, p: Vec<u32>| {
        let mut req = Request::new(SeqId(id), p, 20);
        req.params = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: Some(seed),
            ..Default::default()
        };
        req.ignore_eos = true;
        req
    };
    let alone = run_all(
        &mut engine_with(16, 64, EngineConfig::default()),
        vec![sampled(0, 5, prompt(9, 1))],
    );
    let mut mix = vec![sampled(0, 5, prompt(9, 1))];
    mix.extend((1..6).map(|i| sampled(i, i * 3, prompt(4 + i as usize * 7, i as u32))));
    let config = EngineConfig {
        max_num_batched_tokens: 5,
        ..EngineConfig::default()
    };
    let together = run_all(&mut engine_with(4, 40, config), mix);
    assert_eq!(alone[&0], together[&0]);
    // Another seed gives another stream.
    let other = run_all(
        &mut engine_with(16, 64, EngineConfig::default()),
        vec![sampled(0, 6, prompt(9, 1))],
    );
    assert_ne!(alone[&0], other[&0]);
}

#[test]
fn device_sampling_matches_host_sampling() {
    let mk = || {
        (0..4u64)
            .map(|i| {
                let mut req = Request::new(SeqId(i), prompt(6 + i as usize, i as u32), 15);
                req.params = SamplingParams {
                    temperature: 0.7 * i as f32,
                    min_p: 0.05,
                    seed: Some(i),
                    ..Default::default()
                };
                req.ignore_eos = true;
                req
            })
            .collect::<Vec<_>>()
    };
    let host = run_all(&mut engine_with(8, 64, EngineConfig::default()), mk());
    let (mut backend, model) = ToyBackend::with_config(VOCAB, 8, 64);
    backend.device_sampling = true;
    let mut engine =
        Engine::new(Box::new(backend), &model, EngineConfig::default()).expect("engine");
    assert_eq!(run_all(&mut engine, mk()), host);
}

#[test]
fn a_resumed_request_continues_its_stream() {
    let mk = |prompt: Vec<u32>, max_tokens, prior| {
        let mut req = Request::new(SeqId(1), prompt, max_tokens);
        req.params = SamplingParams {
            temperature: 1.0,
            frequency_penalty: 0.5,
            seed: Some(11),
            ..Default::default()
        };
        req.ignore_eos = true;
        req.prior_output_len = prior;
        req
    };
    let p = prompt(10, 3);
    let full = run_all(
        &mut engine_with(4, 64, EngineConfig::default()),
        vec![mk(p.clone(), 16, 0)],
    )[&1]
        .clone();
    let mut resumed_prompt = p.clone();
    resumed_prompt.extend_from_slice(&full[..6]);
    let rest = run_all(
        &mut engine_with(4, 64, EngineConfig::default()),
        vec![mk(resumed_prompt, 10, 6)],
    )[&1]
        .clone();
    assert_eq!(rest, full[6..]);
}

#[test]
fn stops_on_eos_stop_tokens_max_tokens_and_model_len() {
    let p = prompt(5, 1);
    let free_run = reference(&p, 30);
    // A stop token: the first occurrence of free_run[7] ends the request, with that token last.
    let stop = free_run[7];
    let first = free_run.iter().position(|&t| t == stop).expect("present");
    let mut req = greedy(1, p.clone(), 30);
    req.stop_token_ids = vec![stop];
    let mut engine = engine_with(4, 64, EngineConfig::default());
    engine.add_request(req).expect("valid");
    let mut events = Vec::new();
    while engine.has_unfinished() {
        events.extend(engine.step().expect("step"));
    }
    assert_eq!(events.len(), first + 1);
    assert_eq!(
        events.last().map(|e| (e.token, e.finish)),
        Some((stop, Some(FinishReason::Stop)))
    );
    assert!(events[..first].iter().all(|e| e.finish.is_none()));

    // EOS (the toy's is VOCAB - 1) stops unless ignore_eos; make it the stop by treating free_run[3] as EOS.
    let (backend, mut model) = ToyBackend::with_config(VOCAB, 4, 64);
    model.eos_token_ids = vec![free_run[3]];
    let eos_at = free_run
        .iter()
        .position(|&t| t == free_run[3])
        .expect("present");
    let mut engine =
        Engine::new(Box::new(backend), &model, EngineConfig::default()).expect("engine");
    let mut req = greedy(2, p.clone(), 30);
    req.ignore_eos = false;
    engine.add_request(req).expect("valid");
    let mut n = 0;
    let mut last = None;
    while engine.has_unfinished() {
        for ev in engine.step().expect("step") {
            n += 1;
            last = ev.finish;
        }
    }
    assert_eq!((n, last), (eos_at + 1, Some(FinishReason::Stop)));

    // max_model_len: 5 prompt tokens + 3 = 8.
    let config = EngineConfig {
        max_model_len: Some(8),
        ..EngineConfig::default()
    };
    let got = run_all(
        &mut engine_with(4, 64, config),
        vec![greedy(3, p.clone(), 30)],
    );
    assert_eq!(got[&3], free_run[..3]);
}

#[test]
fn cancel_frees_blocks_at_once() {
    let mut engine = engine_with(4, 64, EngineConfig::default());
    engine
        .add_request(greedy(1, prompt(30, 1), 50))
        .expect("valid");
    engine
        .add_request(greedy(2, prompt(30, 2), 50))
        .expect("valid");
    engine
        .add_request(greedy(3, prompt(30, 3), 50))
        .expect("valid");
    engine.step().expect("step");
    engine.step().expect("step");
    let used = engine.stats().kv_blocks_used;
    assert!(used >= 2 * 8);
    assert!(engine.cancel(SeqId(2)).expect("cancel"));
    assert!(!engine.cancel(SeqId(2)).expect("cancel"));
    assert!(engine.stats().kv_blocks_used < used);
    check_invariants(&engine);
    assert!(engine.cancel(SeqId(1)).expect("cancel"));
    assert!(engine.cancel(SeqId(3)).expect("cancel"));
    assert_eq!(engine.stats().kv_blocks_used, 0);
    assert!(!engine.has_unfinished());
    check_invariants(&engine);
}

#[test]
fn logprobs_are_of_the_raw_distribution() {
    let mut engine = engine_with(4, 64, EngineConfig::default());
    let p = prompt(6, 2);
    let mut req = greedy(1, p.clone(), 2);
    req.logprobs = Some(3);
    req.params.repetition_penalty = 1.3;
    engine.add_request(req).expect("valid");
    let ev = engine.step().expect("step").pop().expect("one event");
    let lp = ev.logprobs.expect("asked");
    let raw = toy_logits(&p, VOCAB);
    let z = raw.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln() as f32;
    assert_eq!(lp.top[0].token, argmax(&raw));
    assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    assert!((lp.top[0].logprob - (raw[lp.top[0].token as usize] - z)).abs() < 1e-5);
    assert!((lp.sampled.logprob - (raw[ev.token as usize] - z)).abs() < 1e-5);
}

#[test]
fn bad_requests_are_refused() {
    let mut engine = engine_with(4, 9, EngineConfig::default());
    assert_eq!(engine.max_model_len(), 32, "capped by the KV pool");
    engine.add_request(greedy(1, vec![1], 2)).expect("valid");
    assert_eq!(
        engine.add_request(greedy(1, vec![1], 2)),
        Err(RequestError::DuplicateId(1))
    );
    assert_eq!(
        engine.add_request(greedy(2, vec![], 2)),
        Err(RequestError::EmptyPrompt)
    );
    assert_eq!(
        engine.add_request(greedy(2, vec![1], 0)),
        Err(RequestError::ZeroMaxTokens)
    );
    assert!(matches!(
        engine.add_request(greedy(2, vec![1; 32], 2)),
        Err(RequestError::PromptTooLong { .. })
    ));
    assert!(matches!(
        engine.add_request(greedy(2, vec![1, VOCAB as u32], 2)),
        Err(RequestError::TokenOutOfVocab { position: 1, .. })
    ));
    let mut req = greedy(2, vec![1], 2);
    req.params.top_p = 2.0;
    assert!(
        matches!(engine.add_request(req), Err(RequestError::InvalidParams(m)) if m.contains("top_p"))
    );
    let (backend, model) = ToyBackend::with_config(VOCAB, 4, 9);
    let config = EngineConfig {
        max_model_len: Some(33),
        ..EngineConfig::default()
    };
    assert!(matches!(
        Engine::new(Box::new(backend), &model, config),
        Err(EngineError::Config(_))
    ));
}

#[test]
fn parallel_host_sampling_matches_one_at_a_time() {
    // A large vocabulary sends the batch's rows to the thread pool; each request alone does not.
    let vocab = 20_000;
    let mk = |id: u64| {
        let mut req = Request::new(SeqId(id), vec![id as u32 + 1; 3], 6);
        req.params = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            presence_penalty: 0.5,
            seed: Some(id),
            ..Default::default()
        };
        req.ignore_eos = true;
        req.logprobs = Some(2);
        req
    };
    let run = |reqs: Vec<Request>| {
        let (backend, model) = ToyBackend::with_config(vocab, 4, 64);
        let mut engine =
            Engine::new(Box::new(backend), &model, EngineConfig::default()).expect("engine");
        for r in reqs {
            engine.add_request(r).expect("valid");
        }
        let mut out: HashMap<u64, Vec<(u32, Option<Logprobs>)>> = HashMap::new();
        while engine.has_unfinished() {
            for ev in engine.step().expect("step") {
                out.entry(ev.id.0)
                    .or_default()
                    .push((ev.token, ev.logprobs));
            }
        }
        out
    };
    let together = run((0..8).map(mk).collect());
    for id in 0..8 {
        assert_eq!(run(vec![mk(id)])[&id], together[&id], "request {id}");
    }
}

/// A backend that answers with the wrong shapes.
struct Liar {
    inner: ToyBackend,
    sampled: Option<Vec<u32>>,
}

impl Backend for Liar {
    fn name(&self) -> &'static str {
        "liar"
    }
    fn num_kv_blocks(&self) -> usize {
        self.inner.num_kv_blocks()
    }
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn forward(
        &mut self,
        batch: &ForwardBatch<'_>,
    ) -> Result<crate::backend::Logits, BackendError> {
        let mut logits = self.inner.forward(batch)?;
        logits.data.pop();
        Ok(logits)
    }
    fn forward_sampled(
        &mut self,
        _: &ForwardBatch<'_>,
        _: &[DeviceSampling],
    ) -> Result<Option<Vec<u32>>, BackendError> {
        Ok(self.sampled.clone())
    }
}

#[test]
fn malformed_backend_output_is_an_engine_error() {
    let (_, model) = ToyBackend::with_config(VOCAB, 4, 16);
    for sampled in [None, Some(vec![]), Some(vec![VOCAB as u32])] {
        let liar = Liar {
            inner: ToyBackend::new(VOCAB, 4, 16),
            sampled,
        };
        let mut engine =
            Engine::new(Box::new(liar), &model, EngineConfig::default()).expect("engine");
        engine.add_request(greedy(1, vec![1, 2], 3)).expect("valid");
        assert!(matches!(engine.step(), Err(EngineError::BadOutput { .. })));
    }
}

#[test]
fn min_tokens_keeps_eos_and_stop_ids_out_of_the_first_tokens() {
    let p = prompt(5, 1);
    let free_run = reference(&p, 30);
    // The greedy run's first token as a stop id ends a plain request at once...
    let stop = free_run[0];
    let run = |min_tokens: usize| {
        let mut req = greedy(1, p.clone(), 30);
        req.stop_token_ids = vec![stop];
        req.min_tokens = min_tokens;
        let mut engine = engine_with(4, 64, EngineConfig::default());
        engine.add_request(req).expect("valid");
        let mut events = Vec::new();
        while engine.has_unfinished() {
            events.extend(engine.step().expect("step"));
        }
        events
    };
    assert_eq!(run(0).len(), 1);
    // ...but not before min_tokens tokens: none of the first 5 is the stop id, and the request
    // goes on to its budget or to a later stop.
    let events = run(5);
    assert!(events.len() > 5, "{} events", events.len());
    assert!(
        events[..5]
            .iter()
            .all(|e| e.token != stop && e.finish.is_none())
    );
    // min_tokens beyond max_tokens is refused.
    let mut bad = greedy(2, p.clone(), 4);
    bad.min_tokens = 5;
    let mut engine = engine_with(4, 64, EngineConfig::default());
    assert!(matches!(
        engine.add_request(bad),
        Err(RequestError::MinTokensOverMax {
            min_tokens: 5,
            allowed: 4
        })
    ));
}
