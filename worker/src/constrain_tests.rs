//! Structured output through the engine over the [`ToyBackend`] (random-looking logits, so only
//! the masks keep the output inside the grammar), with the byte tokenizer: token id `b` is byte `b`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use grammar::testing::byte_tokenizer;
use grammar::{BackgroundCompiler, Compiler, GrammarSpec};

use crate::backend::testing::ToyBackend;
use crate::engine::{Engine, EngineConfig};
use crate::kv::SeqId;
use crate::request::{FinishReason, Request, RequestError};
use crate::sampler::SamplingParams;

/// Vocabulary of the toy model: the 256 bytes, the tokenizer's `<|eos|>` (256), and ids 257..259
/// the tokenizer lacks; the model's EOS is 259.
const VOCAB: usize = 260;

const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
    "address": {
      "type": "object",
      "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}, "main": {"type": "boolean"}},
      "required": ["zip", "main"],
      "additionalProperties": false
    }
  },
  "required": ["name", "color", "address"],
  "additionalProperties": false
}"#;

fn engine(num_blocks: usize, grammars: bool) -> Engine {
    engine_sampling_on(num_blocks, grammars, false).0
}

/// An engine whose backend samples on its "device" when `device` (masks applied there), with the
/// count of its masked steps.
fn engine_sampling_on(
    num_blocks: usize,
    grammars: bool,
    device: bool,
) -> (Engine, Arc<AtomicUsize>) {
    let (mut backend, model) = ToyBackend::with_config(VOCAB, 4, num_blocks);
    backend.device_sampling = device;
    let masked_steps = backend.masked_steps.clone();
    let mut engine =
        Engine::new(Box::new(backend), &model, EngineConfig::default()).expect("engine");
    if grammars {
        let compiler =
            Compiler::new(&byte_tokenizer(), VOCAB, &model.eos_token_ids).expect("compiler");
        engine.set_grammar_compiler(BackgroundCompiler::ready(compiler));
    }
    (engine, masked_steps)
}

fn request(id: u64, grammar: Option<GrammarSpec>, seed: u64) -> Request {
    let mut req = Request::new(
        SeqId(id),
        b"Answer: ".iter().map(|&b| u32::from(b)).collect(),
        400,
    );
    req.params = SamplingParams {
        seed: Some(seed),
        ..SamplingParams::default()
    };
    req.grammar = grammar;
    req
}

/// Runs to completion; returns each request's tokens and finish reason.
fn run(engine: &mut Engine, reqs: Vec<Request>) -> HashMap<u64, (Vec<u32>, FinishReason)> {
    for r in reqs {
        engine.add_request(r).expect("valid request");
    }
    let mut tokens: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut out = HashMap::new();
    let mut steps = 0;
    while engine.has_unfinished() {
        for ev in engine.step().expect("step") {
            tokens.entry(ev.id.0).or_default().push(ev.token);
            if let Some(f) = ev.finish {
                out.insert(ev.id.0, (tokens.remove(&ev.id.0).unwrap_or_default(), f));
            }
        }
        steps += 1;
        assert!(steps < 5_000, "no progress");
    }
    assert_eq!(engine.scheduler().kv().pool().num_used(), 0);
    out
}

fn text(tokens: &[u32]) -> String {
    let bytes: Vec<u8> = tokens
        .iter()
        .filter(|&&t| t < 256)
        .map(|&t| t as u8)
        .collect();
    String::from_utf8(bytes).expect("the grammar keeps output UTF-8")
}

/// Checks `value` against [`SCHEMA`] by hand.
fn check_schema(value: &serde_json::Value) {
    let obj = value.as_object().expect("an object");
    for key in obj.keys() {
        assert!(
            ["name", "age", "color", "tags", "address"].contains(&key.as_str()),
            "{key}"
        );
    }
    assert!(obj["name"].as_str().expect("name").chars().count() <= 6);
    if let Some(age) = obj.get("age") {
        assert!((0..=120).contains(&age.as_i64().expect("integer age")));
    }
    assert!(["red", "green", "blue"].contains(&obj["color"].as_str().expect("color")));
    if let Some(tags) = obj.get("tags") {
        let tags = tags.as_array().expect("tags array");
        assert!(tags.len() <= 3);
        assert!(
            tags.iter()
                .all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 3))
        );
    }
    let address = obj["address"].as_object().expect("address object");
    assert_eq!(address.len(), 2);
    let zip = address["zip"].as_str().expect("zip");
    assert!(
        zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
        "{zip}"
    );
    assert!(address["main"].is_boolean());
}

#[test]
fn schema_outputs_parse_and_validate_beside_free_requests() {
    let schema = || Some(GrammarSpec::JsonSchema(SCHEMA.into()));
    let mut reqs: Vec<Request> = (0..6).map(|i| request(i, schema(), 100 + i)).collect();
    reqs.push(request(50, None, 7));
    reqs.push(request(
        51,
        Some(GrammarSpec::Choice(vec!["yes".into(), "no".into()])),
        8,
    ));
    reqs.push(request(
        52,
        Some(GrammarSpec::Regex("[a-f]{2}-[0-9]{1,3}".into())),
        9,
    ));
    let out = run(&mut engine(512, true), reqs);
    for i in 0..6 {
        let (tokens, finish) = &out[&i];
        assert_eq!(
            *finish,
            FinishReason::Stop,
            "request {i} ends with its grammar"
        );
        let value: serde_json::Value = serde_json::from_str(&text(tokens))
            .unwrap_or_else(|e| panic!("request {i}: {e}: {:?}", text(tokens)));
        check_schema(&value);
    }
    assert!(["yes", "no"].contains(&text(&out[&51].0).as_str()));
    let rx = text(&out[&52].0);
    let (letters, digits) = rx.split_once('-').expect("a dash");
    assert!(
        letters.len() == 2 && letters.bytes().all(|b| (b'a'..=b'f').contains(&b)),
        "{rx}"
    );
    assert!((1..=3).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()));
    // The free request draws exactly what it draws alone: masks stay with their own rows.
    let alone = run(&mut engine(512, true), vec![request(50, None, 7)]);
    assert_eq!(out[&50], alone[&50]);
}

#[test]
fn device_sampling_applies_the_masks_and_draws_what_the_host_draws() {
    let spec = || Some(GrammarSpec::JsonSchema(SCHEMA.into()));
    let reqs = || {
        let mut reqs: Vec<Request> = (0..4).map(|i| request(i, spec(), 500 + i)).collect();
        reqs.push(request(9, None, 3));
        let mut greedy = request(10, spec(), 0);
        greedy.params = SamplingParams::greedy();
        reqs.push(greedy);
        reqs
    };
    let host = run(&mut engine(512, true), reqs());
    let (mut on_device, masked_steps) = engine_sampling_on(512, true, true);
    let device = run(&mut on_device, reqs());
    assert!(
        masked_steps.load(Ordering::Relaxed) > 0,
        "the device path ran"
    );
    assert_eq!(host, device);
    for i in [0, 1, 2, 3, 10] {
        check_schema(&serde_json::from_str(&text(&device[&i].0)).expect("JSON"));
    }
}

#[test]
fn preempted_and_resumed_requests_stay_in_the_grammar() {
    let spec = GrammarSpec::JsonSchema(SCHEMA.into());
    // 40 blocks of 4 tokens for 8 requests: preemption by recompute happens.
    let reqs = (0..8)
        .map(|i| request(i, Some(spec.clone()), 300 + i))
        .collect();
    let mut small = engine(40, true);
    let out = run(&mut small, reqs);
    assert!(
        small.stats().preemptions > 0,
        "the pool is small enough to preempt"
    );
    for (tokens, _) in out.values() {
        check_schema(&serde_json::from_str(&text(tokens)).expect("JSON"));
    }
    // A resumed request (failover) carries its earlier output at the end of its prompt; the
    // grammar picks up after it and the whole output still validates.
    let whole = run(
        &mut engine(512, true),
        vec![request(1, Some(spec.clone()), 77)],
    );
    let whole = &whole[&1].0;
    let cut = whole.len() / 2;
    let mut resumed = request(1, Some(spec.clone()), 77);
    resumed.prompt.extend_from_slice(&whole[..cut]);
    resumed.prior_output_len = cut;
    let rest = run(&mut engine(512, true), vec![resumed]);
    let mut joined = whole[..cut].to_vec();
    joined.extend_from_slice(&rest[&1].0);
    assert_eq!(&joined, whole, "seeded sampling continues exactly");
}

#[test]
fn refused_grammars() {
    let mut no_tokenizer = engine(64, false);
    assert_eq!(
        no_tokenizer.add_request(request(1, Some(GrammarSpec::JsonObject), 1)),
        Err(RequestError::NoGrammarSupport)
    );
    let mut e = engine(64, true);
    let bad = request(2, Some(GrammarSpec::JsonSchema(r#"{"type": 5}"#.into())), 1);
    assert!(matches!(e.add_request(bad), Err(RequestError::Grammar(_))));
    // Earlier output the grammar does not allow is refused, not run.
    let mut resumed = request(3, Some(GrammarSpec::Regex("[0-9]+".into())), 1);
    resumed.prompt.push(u32::from(b'x'));
    resumed.prior_output_len = 1;
    assert!(matches!(
        e.add_request(resumed),
        Err(RequestError::Grammar(_))
    ));
    assert!(!e.has_unfinished());
}

#[test]
fn cancelling_a_constrained_request_frees_it() {
    let mut e = engine(64, true);
    e.add_request(request(1, Some(GrammarSpec::JsonSchema(SCHEMA.into())), 1))
        .expect("valid");
    e.step().expect("step");
    assert!(e.cancel(SeqId(1)).expect("cancel"));
    assert!(!e.has_unfinished());
    // The id can be used again at once, with a fresh grammar.
    let out = run(
        &mut e,
        vec![request(1, Some(GrammarSpec::Choice(vec!["ok".into()])), 2)],
    );
    assert_eq!(text(&out[&1].0), "ok");
}
