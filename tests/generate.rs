//! `ringserve generate` end to end: HF parity on the tiny-llama fixture through the CLI, the JSONL
//! contract (text, logprobs, stop strings, finish reasons), and bad-line handling.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("valid json")
}

/// Runs `ringserve generate` on `lines`; returns the process output and the parsed output lines.
fn generate(model: &Path, lines: &[String], extra: &[&str]) -> (Output, Vec<Value>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").expect("write input");
    let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .arg("generate")
        .arg("--model")
        .arg(model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(["--block-size", "4", "--num-kv-blocks", "200"])
        .args(extra)
        .output()
        .expect("run ringserve");
    let results = std::fs::read_to_string(&output)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("output line is JSON"))
        .collect();
    (out, results)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[test]
fn greedy_tokens_and_logprobs_match_hf() {
    let exp = expected();
    let cases = exp["cases"].as_array().expect("cases");
    let lines: Vec<String> = cases
        .iter()
        .map(|c| {
            json!({"prompt_token_ids": c["prompt"], "max_tokens": 24, "temperature": 0, "ignore_eos": true, "logprobs": 5})
                .to_string()
        })
        .collect();
    // Chunked prefill (7 tokens per step) must not change anything either.
    for extra in [&[][..], &["--max-num-batched-tokens", "7"][..]] {
        let (out, results) = generate(&fixture(), &lines, extra);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(results.len(), cases.len());
        for (i, (r, c)) in results.iter().zip(cases).enumerate() {
            assert_eq!(
                ids(&r["token_ids"]),
                ids(&c["greedy"]),
                "case {i} {extra:?}"
            );
            assert_eq!(r["finish_reason"], "length");
            assert!(r.get("text").is_none(), "the fixture has no tokenizer");
            // The first position's logprobs are log_softmax(last_logits), highest first.
            let logits: Vec<f64> = c["last_logits"]
                .as_array()
                .expect("logits")
                .iter()
                .map(|x| x.as_f64().expect("f"))
                .collect();
            let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
            let first = r["logprobs"][0].as_array().expect("logprobs");
            assert_eq!(first.len(), 5);
            let mut prev = f64::INFINITY;
            for e in first {
                let (t, lp) = (
                    e["token_id"].as_u64().expect("id") as usize,
                    e["logprob"].as_f64().expect("lp"),
                );
                assert!(
                    (lp - (logits[t] - log_z)).abs() < 1e-4,
                    "case {i}: token {t}"
                );
                assert!(lp <= prev);
                prev = lp;
            }
        }
        let err = stderr(&out);
        assert!(
            err.contains("4 requests")
                && err.contains("96 generated tokens")
                && err.contains("tokens/s"),
            "{err}"
        );
    }
}

#[test]
fn bad_lines_are_skipped_or_fail_the_run() {
    let lines = vec![
        json!({"prompt_token_ids": [5, 6], "max_tokens": 3}).to_string(),
        json!({"prompt_token_ids": [5, 6], "max_tokens": 3, "best_of": 2}).to_string(),
        json!({"prompt": "hello"}).to_string(),
        json!({"prompt_token_ids": [7], "max_tokens": 2, "seed": 1}).to_string(),
    ];
    let (out, results) = generate(&fixture(), &lines, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("line 2") && err.contains("unknown field `best_of`"),
        "{err}"
    );
    assert!(
        err.contains("line 3") && err.contains("tokenizer.json"),
        "{err}"
    );
    assert_eq!(results.len(), 2, "the good lines are all there");
    assert_eq!(ids(&results[0]["token_ids"]).len(), 3);
    assert_eq!(ids(&results[1]["token_ids"]).len(), 2);

    let (out, results) = generate(&fixture(), &lines, &["--on-error", "fail"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
    assert!(results.is_empty());
}

/// A copy of the fixture with a word-level tokenizer: token `i` is the word `w` + three digits.
fn fixture_with_tokenizer(dir: &Path) {
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture().join(f), dir.join(f)).expect("copy fixture");
    }
    let vocab: serde_json::Map<String, Value> = (0..512u32)
        .map(|i| (format!("w{i:03}"), i.into()))
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w000"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("write tokenizer");
}

#[test]
fn text_prompts_text_outputs_and_stop_strings() {
    let model = tempfile::tempdir().expect("temp dir");
    fixture_with_tokenizer(model.path());
    let exp = expected();
    let case = &exp["cases"][1];
    let prompt: Vec<String> = ids(&case["prompt"])
        .iter()
        .map(|t| format!("w{t:03}"))
        .collect();
    let greedy: Vec<String> = ids(&case["greedy"])
        .iter()
        .map(|t| format!("w{t:03}"))
        .collect();
    let stop = greedy[6].clone();
    let cut = greedy.iter().position(|w| *w == stop).expect("present");
    let lines = vec![
        json!({"prompt": prompt.join(" "), "max_tokens": 24, "temperature": 0, "ignore_eos": true}).to_string(),
        json!({"prompt": prompt.join(" "), "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stop": [stop]})
            .to_string(),
    ];
    let (out, results) = generate(model.path(), &lines, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(ids(&results[0]["token_ids"]), ids(&case["greedy"]));
    assert_eq!(results[0]["text"], greedy.join(" "));
    assert_eq!(results[1]["finish_reason"], "stop");
    assert_eq!(ids(&results[1]["token_ids"]).len(), cut + 1);
    let want_text = greedy[..cut]
        .iter()
        .map(|w| format!("{w} "))
        .collect::<String>();
    assert_eq!(results[1]["text"], want_text);
}

#[test]
fn demo_model_seeded_text_and_stop_strings() {
    let model = tempfile::tempdir().expect("temp dir");
    let status = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(["demo-model", "--out"])
        .arg(model.path())
        .output()
        .expect("run demo-model");
    assert!(status.status.success(), "{}", stderr(&status));
    let seeded = json!({"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.9, "top_p": 0.95, "seed": 42, "ignore_eos": true});
    // The seeded request alone, then in the middle of a mixed batch: same tokens.
    let (out, alone) = generate(model.path(), &[seeded.to_string()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mixed = vec![
        json!({"prompt": "Hello there", "max_tokens": 30, "seed": 1}).to_string(),
        seeded.to_string(),
        json!({"prompt_token_ids": [5, 6, 7, 8, 9, 10, 11], "max_tokens": 9, "temperature": 0})
            .to_string(),
    ];
    let (out, batch) = generate(model.path(), &mixed, &["--max-num-batched-tokens", "5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(batch.len(), 3);
    assert_eq!(alone[0]["token_ids"], batch[1]["token_ids"]);
    assert_eq!(alone[0]["text"], batch[1]["text"]);
    // A stop string taken from the middle of that text cuts it at its first occurrence.
    let text = alone[0]["text"].as_str().expect("text").to_owned();
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let mut with_stop = seeded.clone();
    with_stop["stop"] = json!([stop]);
    let (out, cut) = generate(model.path(), &[with_stop.to_string()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(cut[0]["finish_reason"], "stop");
    let got = cut[0]["text"].as_str().expect("text");
    assert!(
        text.starts_with(got) && !got.contains(stop.as_str()),
        "{got:?} vs {text:?} / {stop:?}"
    );
    let n = ids(&cut[0]["token_ids"]).len();
    assert!(n <= 24 && ids(&alone[0]["token_ids"])[..n] == ids(&cut[0]["token_ids"])[..]);
}
