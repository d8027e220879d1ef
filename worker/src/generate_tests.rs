//! Tests of the JSONL generation contract over the toy backend and a word-level tokenizer.

use std::str::FromStr;

use super::*;
use crate::backend::testing::{ToyBackend, toy_logits};
use crate::engine::EngineConfig;
use crate::sampler::argmax;

const VOCAB: usize = 97;

/// Word `i` is `a` + three digits, so no word is a prefix of another; the last one is EOS (special).
fn word(i: u32) -> String {
    format!("a{i:03}")
}

fn tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..VOCAB as u32).map(|i| (word(i), i.into())).collect();
    let eos = VOCAB as u32 - 1;
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": eos, "content": word(eos), "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": word(0)}
    });
    Tokenizer::from_str(&json.to_string()).expect("valid tokenizer")
}

fn engine() -> Engine {
    let (backend, model) = ToyBackend::with_config(VOCAB, 4, 256);
    Engine::new(
        Box::new(backend),
        &model,
        EngineConfig {
            seed: Some(1),
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

fn reference(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..n {
        ctx.push(argmax(&toy_logits(&ctx, VOCAB)));
    }
    ctx.split_off(prompt.len())
}

fn generate(
    input: &str,
    tok: Option<&Tokenizer>,
    on_error: OnError,
) -> Result<(Vec<OutputLine>, Prepared), GenerateError> {
    let mut engine = engine();
    let prepared = prepare(&mut engine, tok, input.as_bytes(), on_error)?;
    let mut out = Vec::new();
    let summary = run(&mut engine, tok, &prepared, &mut out, false)?;
    let lines: Vec<OutputLine> = String::from_utf8(out)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("valid output line"))
        .collect();
    assert_eq!(summary.requests, lines.len());
    assert_eq!(
        summary.generated_tokens,
        lines.iter().map(|l| l.token_ids.len()).sum::<usize>()
    );
    Ok((lines, prepared))
}

#[test]
fn greedy_lines_come_back_in_input_order() {
    let prompts: Vec<Vec<u32>> = vec![vec![5; 30], vec![1], vec![7, 8, 9], vec![2; 11]];
    let input: String = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!("{{\"prompt_token_ids\": {p:?}, \"max_tokens\": {}, \"temperature\": 0, \"ignore_eos\": true}}\n", 3 + i * 4)
        })
        .collect();
    let (lines, _) = generate(&input, None, OnError::Fail).expect("run");
    for (i, (line, p)) in lines.iter().zip(&prompts).enumerate() {
        assert_eq!(line.token_ids, reference(p, 3 + i * 4), "line {i}");
        assert_eq!(line.finish_reason, "length");
        assert_eq!(line.text, None, "no tokenizer, no text");
        assert_eq!(line.logprobs, None);
    }
}

#[test]
fn text_prompts_are_tokenized_and_outputs_decoded() {
    let tok = tokenizer();
    let input = "{\"prompt\": \"a001 a002 a003\", \"max_tokens\": 6, \"temperature\": 0.0, \"ignore_eos\": true}\n\
                 {\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 6, \"temperature\": 0.0, \"ignore_eos\": true}\n";
    let (lines, _) = generate(input, Some(&tok), OnError::Fail).expect("run");
    let want = reference(&[1, 2, 3], 6);
    assert_eq!(lines[0].token_ids, want);
    assert_eq!(lines[1].token_ids, want);
    let words: Vec<String> = want
        .iter()
        .filter(|&&t| t != VOCAB as u32 - 1)
        .map(|&t| word(t))
        .collect();
    assert_eq!(lines[0].text.as_deref(), Some(words.join(" ").as_str()));
}

#[test]
fn stop_strings_cut_the_text() {
    let tok = tokenizer();
    let free = reference(&[4, 4], 20);
    let stop = word(free[5]);
    let input = format!(
        "{{\"prompt_token_ids\": [4, 4], \"max_tokens\": 20, \"temperature\": 0, \"ignore_eos\": true, \"stop\": [\"{stop}\", \"zzz\"]}}\n"
    );
    let (lines, _) = generate(&input, Some(&tok), OnError::Fail).expect("run");
    let first = free.iter().position(|&t| t == free[5]).expect("present");
    assert_eq!(lines[0].token_ids, free[..=first]);
    assert_eq!(lines[0].finish_reason, "stop");
    // The special EOS token is left out of the text.
    let eos = VOCAB as u32 - 1;
    let full = free[..=first]
        .iter()
        .filter(|&&t| t != eos)
        .map(|&t| word(t))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        lines[0].text.as_deref(),
        Some(&full[..full.find(&stop).expect("present")])
    );
}

#[test]
fn stop_token_ids_and_logprobs() {
    let free = reference(&[9], 10);
    let input = format!(
        "{{\"prompt_token_ids\": [9], \"max_tokens\": 10, \"temperature\": 0, \"ignore_eos\": true, \"stop_token_ids\": [{}], \"logprobs\": 3}}\n",
        free[2]
    );
    let (lines, _) = generate(&input, None, OnError::Fail).expect("run");
    let n = free.iter().position(|&t| t == free[2]).expect("present") + 1;
    assert_eq!(lines[0].token_ids, free[..n]);
    assert_eq!(lines[0].finish_reason, "stop");
    let lps = lines[0].logprobs.as_ref().expect("asked");
    assert_eq!(lps.len(), n);
    for (lp, &t) in lps.iter().zip(&lines[0].token_ids) {
        assert_eq!(lp.len(), 3);
        assert_eq!(lp[0].token_id, t, "greedy picks the top raw logprob");
        assert!(lp.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
}

#[test]
fn bad_lines_are_reported_with_their_numbers() {
    let input = "{\"prompt_token_ids\": [1], \"max_tokens\": 2}\n\
                 \n\
                 {\"prompt_token_ids\": [1], \"temprature\": 0}\n\
                 not json\n\
                 {\"prompt\": \"a001\"}\n\
                 {\"prompt_token_ids\": [1], \"prompt\": \"a001\"}\n\
                 {\"max_tokens\": 3}\n\
                 {\"prompt_token_ids\": [1000]}\n\
                 {\"prompt_token_ids\": [1], \"top_p\": 7}\n\
                 {\"prompt_token_ids\": [1], \"max_tokens\": -3}\n\
                 [1, 2]\n\
                 {\"prompt_token_ids\": [2], \"max_tokens\": 3}\n";
    let (lines, prepared) = generate(input, None, OnError::Skip).expect("run");
    assert_eq!(lines.len(), 2, "the good lines are not lost");
    assert_eq!((lines[0].token_ids.len(), lines[1].token_ids.len()), (2, 3));
    let bad: Vec<usize> = prepared.skipped.iter().map(|e| e.line).collect();
    assert_eq!(bad, vec![3, 4, 5, 6, 7, 8, 9, 10, 11]);
    assert!(
        prepared.skipped[0]
            .message
            .contains("unknown field `temprature`"),
        "{:?}",
        prepared.skipped[0]
    );
    assert!(prepared.skipped[2].message.contains("tokenizer.json"));
    assert!(prepared.skipped[5].message.contains("vocabulary"));
    assert!(prepared.skipped[6].message.contains("top_p"));
    assert!(
        prepared.skipped[1].message.starts_with("invalid JSON"),
        "{:?}",
        prepared.skipped[1]
    );
    assert!(
        prepared.skipped[7]
            .message
            .starts_with("field `max_tokens`"),
        "{:?}",
        prepared.skipped[7]
    );
    assert!(prepared.skipped[8].message.contains("JSON object"));
    match generate(input, None, OnError::Fail) {
        Err(GenerateError::BadLine(e)) => assert_eq!(e.line, 3),
        other => panic!("expected a bad line, got {other:?}"),
    }
}

#[test]
fn default_temperature_is_one_and_seeds_reproduce() {
    let input = "{\"prompt_token_ids\": [3, 1], \"max_tokens\": 12, \"seed\": 9, \"ignore_eos\": true}\n\
                 {\"prompt_token_ids\": [8, 8, 8], \"max_tokens\": 5, \"ignore_eos\": true}\n\
                 {\"prompt_token_ids\": [3, 1], \"max_tokens\": 12, \"seed\": 9, \"ignore_eos\": true}\n";
    let (lines, _) = generate(input, None, OnError::Fail).expect("run");
    assert_eq!(lines[0].token_ids, lines[2].token_ids);
    assert_ne!(
        lines[0].token_ids,
        reference(&[3, 1], 12),
        "temperature 1 samples (almost surely not greedy)"
    );
}

#[test]
fn structured_outputs_lines_need_a_grammar_engine_and_a_valid_spec() {
    // This engine has no tokenizer behind it: a grammar line is refused by name, the rest runs.
    let input = "{\"prompt_token_ids\": [1], \"max_tokens\": 2, \"structured_outputs\": {\"regex\": \"a+\"}}\n\
                 {\"prompt_token_ids\": [1], \"structured_outputs\": {\"regex\": \"a\", \"choice\": [\"b\"]}}\n\
                 {\"prompt_token_ids\": [2], \"max_tokens\": 3}\n";
    let (lines, prepared) = generate(input, None, OnError::Skip).expect("run");
    assert_eq!(lines.len(), 1);
    let bad: Vec<usize> = prepared.skipped.iter().map(|e| e.line).collect();
    assert_eq!(bad, vec![1, 2]);
    assert!(
        prepared.skipped[0].message.contains("tokenizer.json"),
        "{:?}",
        prepared.skipped[0]
    );
    assert!(
        prepared.skipped[1].message.contains("exactly one"),
        "{:?}",
        prepared.skipped[1]
    );
}
