//! Parity with HuggingFace through the whole [`Engine`] on `tests/fixtures/tiny-llama`, and batch
//! invariance: each case alone, all together, in prefill chunks of 7 tokens, with prefix-cache hits
//! (shared prefixes, repeated prompts), and under preemption — identical greedy tokens every time.

use std::collections::HashMap;
use std::path::PathBuf;

use worker::backend::cpu::{CpuBackend, CpuOptions};
use worker::checkpoint::Checkpoint;
use worker::config::ModelConfig;
use worker::engine::{Engine, EngineConfig};
use worker::kv::SeqId;
use worker::request::{FinishReason, Request};
use worker::sampler::SamplingParams;

struct Case {
    prompt: Vec<u32>,
    last_logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-llama")
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixture_dir().join("expected.json")).expect("expected.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let nums = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect()
    };
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            prompt: nums(&c["prompt"]).into_iter().map(|x| x as u32).collect(),
            last_logits: nums(&c["last_logits"])
                .into_iter()
                .map(|x| x as f32)
                .collect(),
            greedy: nums(&c["greedy"]).into_iter().map(|x| x as u32).collect(),
        })
        .collect()
}

fn engine(block_size: usize, num_kv_blocks: usize, config: EngineConfig) -> (Engine, ModelConfig) {
    let (model, ckpt) = Checkpoint::load(&fixture_dir()).expect("fixture loads");
    let backend = CpuBackend::new(
        &model,
        &ckpt,
        CpuOptions {
            block_size,
            num_kv_blocks,
            quantization: None,
            kv_cache_dtype: worker::quant::kv::KvCacheDtype::Auto,
        },
    )
    .expect("backend");
    let engine = Engine::new(Box::new(backend), &model, config).expect("engine");
    (engine, model)
}

fn greedy_req(id: u64, prompt: &[u32], logprobs: Option<usize>) -> Request {
    let mut req = Request::new(SeqId(id), prompt.to_vec(), 24);
    req.params = SamplingParams::greedy();
    req.ignore_eos = true;
    req.logprobs = logprobs;
    req
}

/// Runs to completion; returns each request's tokens, checking that all blocks end up free.
fn run(engine: &mut Engine, reqs: Vec<Request>) -> HashMap<u64, Vec<u32>> {
    for r in reqs {
        engine.add_request(r).expect("valid request");
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    while engine.has_unfinished() {
        for ev in engine.step().expect("step") {
            out.entry(ev.id.0).or_default().push(ev.token);
            if ev.finish.is_some() {
                assert_eq!(ev.finish, Some(FinishReason::Length));
            }
        }
        let s = engine.stats();
        assert!(s.kv_blocks_used <= s.kv_blocks_total);
    }
    assert_eq!(
        engine.stats().kv_blocks_used,
        0,
        "all blocks free at the end"
    );
    out
}

#[test]
fn last_logits_and_greedy_tokens_match_hf() {
    let cases = cases();
    let vocab = cases[0].last_logits.len();
    let (mut engine, _) = engine(16, 64, EngineConfig::default());
    for (i, case) in cases.iter().enumerate() {
        engine
            .add_request(greedy_req(i as u64, &case.prompt, Some(vocab)))
            .expect("valid");
        let mut tokens = Vec::new();
        let mut first = None;
        while engine.has_unfinished() {
            for ev in engine.step().expect("step") {
                tokens.push(ev.token);
                first = first.or(ev.logprobs);
            }
        }
        // Logprobs are log_softmax(logits): compare after removing each side's mean.
        let lp = first.expect("logprobs of the first token");
        let mut got = vec![0f32; vocab];
        for t in &lp.top {
            got[t.token as usize] = t.logprob;
        }
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        let (gm, wm) = (mean(&got), mean(&case.last_logits));
        let max_diff = got
            .iter()
            .zip(&case.last_logits)
            .map(|(g, w)| ((g - gm) - (w - wm)).abs())
            .fold(0f32, f32::max);
        assert!(
            max_diff < 1e-4,
            "case {i}: last logits differ by {max_diff}"
        );
        assert_eq!(tokens, case.greedy, "case {i}: greedy tokens");
    }
}

fn expected() -> HashMap<u64, Vec<u32>> {
    cases()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (i as u64, c.greedy))
        .collect()
}

fn all_reqs() -> Vec<Request> {
    cases()
        .iter()
        .enumerate()
        .map(|(i, c)| greedy_req(i as u64, &c.prompt, None))
        .collect()
}

#[test]
fn each_alone_all_together_and_chunked() {
    let want = expected();
    for (i, req) in all_reqs().into_iter().enumerate() {
        let (mut e, _) = engine(16, 64, EngineConfig::default());
        assert_eq!(
            run(&mut e, vec![req])[&(i as u64)],
            want[&(i as u64)],
            "case {i} alone"
        );
    }
    let (mut e, _) = engine(16, 64, EngineConfig::default());
    assert_eq!(run(&mut e, all_reqs()), want, "all together");
    let chunked = EngineConfig {
        max_num_batched_tokens: 7,
        ..EngineConfig::default()
    };
    let (mut e, _) = engine(4, 128, chunked);
    assert_eq!(run(&mut e, all_reqs()), want, "prefill chunks of 7");
}

#[test]
fn prefix_cache_hits_give_identical_tokens() {
    let cases = cases();
    let want = expected();
    // Repeated prompts: a second and a third wave hit the cached blocks of the first.
    let config = EngineConfig {
        max_num_batched_tokens: 16,
        ..EngineConfig::default()
    };
    let (mut e, _) = engine(4, 256, config);
    for wave in 0..3u64 {
        let reqs = cases
            .iter()
            .enumerate()
            .map(|(i, c)| greedy_req(wave * 10 + i as u64, &c.prompt, None))
            .collect();
        let got = run(&mut e, reqs);
        for (i, toks) in &want {
            assert_eq!(&got[&(wave * 10 + i)], toks, "wave {wave}, case {i}");
        }
    }
    assert!(e.stats().prefix_hit_tokens > 0, "{:?}", e.stats());
    // Shared prefixes: each case's prompt extended by its own greedy tokens shares the cached
    // prompt blocks and must continue with the rest of the reference tokens.
    let before = e.stats().prefix_hit_tokens;
    let reqs = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut p = c.prompt.clone();
            p.extend_from_slice(&c.greedy[..8]);
            let mut r = greedy_req(100 + i as u64, &p, None);
            r.max_tokens = 16;
            r
        })
        .collect();
    let got = run(&mut e, reqs);
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(got[&(100 + i as u64)], c.greedy[8..], "case {i} continued");
    }
    assert!(e.stats().prefix_hit_tokens > before);
}

#[test]
fn preemption_by_recompute_gives_identical_tokens() {
    let want = expected();
    let longest = cases()
        .iter()
        .map(|c| c.prompt.len() + 24)
        .max()
        .expect("cases");
    // Room for one longest sequence plus a little: the others get preempted and recomputed.
    let blocks = longest.div_ceil(4) + 3;
    for prefix_caching in [true, false] {
        let config = EngineConfig {
            enable_prefix_caching: prefix_caching,
            ..EngineConfig::default()
        };
        let (mut e, _) = engine(4, blocks, config);
        assert_eq!(
            run(&mut e, all_reqs()),
            want,
            "prefix caching {prefix_caching}"
        );
        assert!(
            e.stats().preemptions > 0,
            "the pool was meant to force preemption"
        );
    }
}
