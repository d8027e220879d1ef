//! End to end on the demo model: the README's first command (`serve` with no `--model`), text and
//! chat prompts, and exact UTF-8 through tokenization and streamed detokenization (emoji, CJK).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, collect, greedy, ids_of, runtime, write_demo};
use protos::v1::{
    ChatMessage, ChatMessages, FinishReason, GenerateRequest, TokenIds, TokenizeRequest,
    generate_request, tokenize_request,
};

/// `ringserve generate` on one text prompt (greedy): its token ids and text.
fn offline(model: &Path, prompt: &str, max_tokens: u32) -> (Vec<u32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let output = dir.path().join("out.jsonl");
    let line = serde_json::json!({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": true
    });
    std::fs::write(&input, format!("{line}\n")).unwrap();
    let ok = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .arg("generate")
        .arg("--model")
        .arg(model)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .arg("--quiet")
        .status()
        .unwrap()
        .success();
    assert!(ok, "ringserve generate");
    let text = std::fs::read_to_string(&output).unwrap();
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let ids = v["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    (ids, v["text"].as_str().unwrap().to_owned())
}

#[test]
fn serve_without_a_model_serves_the_demo_model() {
    let cache = tempfile::tempdir().unwrap();
    // The demo model is cached under the user's cache directory; keep this test's copy private.
    let server = Server::start_with_env(&[], 1, &[("XDG_CACHE_HOME", cache.path())]);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let info = client
            .model_info(protos::v1::ModelInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.model_name, "demo");
        assert!(info.has_tokenizer && info.has_chat_template);
        let msgs = collect(
            &mut client,
            greedy(generate_request::Prompt::Text("Hello".into()), 8),
        )
        .await
        .unwrap();
        assert_eq!(ids_of(&msgs).len(), 8);
    });
    assert!(cache.path().join("ringserve").exists());
    // The README's `client "Once upon a time"` ends: 256 tokens at most unless asked for more.
    let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args([
            "client",
            "--addr",
            &server.url,
            "--print-ids",
            "Once upon a time",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let n = printed
        .split([' ', ',', '\n'])
        .filter(|t| !t.is_empty())
        .count();
    assert!((1..=256).contains(&n), "{n} tokens: {printed}");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains(&format!("completion_tokens={n}")), "{log}");
}

#[test]
fn text_and_chat_prompts_match_offline_generation_and_the_template() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(&["--model", &model], 1);
    let prompt = "The quick brown fox";
    let (want_ids, want_text) = offline(dir.path(), prompt, 16);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let msgs = collect(
            &mut client,
            greedy(generate_request::Prompt::Text(prompt.into()), 16),
        )
        .await
        .unwrap();
        assert_eq!(ids_of(&msgs), want_ids);
        let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(text, want_text);

        // A chat prompt is the template's rendering, tokenized: the same as sending its ids.
        let chat = ChatMessages {
            messages: vec![
                ChatMessage {
                    role: "system".into(),
                    content: "You are terse.".into(),
                },
                ChatMessage {
                    role: "user".into(),
                    content: "Name a colour.".into(),
                },
            ],
        };
        let ids = client
            .tokenize(TokenizeRequest {
                input: Some(tokenize_request::Input::Chat(chat.clone())),
            })
            .await
            .unwrap()
            .into_inner()
            .token_ids;
        assert!(ids.len() > 6);
        let by_chat = collect(
            &mut client,
            greedy(generate_request::Prompt::Chat(chat), 12),
        )
        .await
        .unwrap();
        let by_ids = collect(
            &mut client,
            greedy(
                generate_request::Prompt::TokenIds(TokenIds { ids: ids.clone() }),
                12,
            ),
        )
        .await
        .unwrap();
        assert_eq!(ids_of(&by_chat), ids_of(&by_ids));
        let last = by_chat.last().unwrap();
        assert_eq!(last.usage.unwrap().prompt_tokens as usize, ids.len());
        assert_eq!(last.finish_reason, FinishReason::Length as i32);
    });
}

/// Streamed text deltas, concatenated, must be exactly the decoding of all generated ids, and a
/// delta never holds half a character.
fn check_stream_text(tokenizer: &tokenizers::Tokenizer, msgs: &[protos::v1::GenerateResponse]) {
    let ids = ids_of(msgs);
    let whole = tokenizer.decode(&ids, false).unwrap();
    let streamed: String = msgs.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(streamed, whole);
}

#[test]
fn emoji_and_cjk_round_trip_exactly() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let tokenizer = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let model = dir.path().to_str().unwrap().to_owned();
    // The null device emits arbitrary token ids: byte tokens that split characters every which way.
    let null = Server::start(&["--model", &model, "--device", "null"], 1);
    let cpu = Server::start(&["--model", &model], 1);
    let rt = runtime();
    rt.block_on(async {
        let text = "naïve café 👋🏽 世界 — 日本語のテキスト 🎉 한국어 ∑";
        let mut client = cpu.client().await;
        let ids = client
            .tokenize(TokenizeRequest {
                input: Some(tokenize_request::Input::Text(text.into())),
            })
            .await
            .unwrap()
            .into_inner()
            .token_ids;
        let special = ["<|begin_of_text|>"];
        let decoded = tokenizer.decode(&ids, true).unwrap();
        assert_eq!(decoded.trim_start_matches(special[0]), text);
        for server in [&cpu, &null] {
            let mut client = server.client().await;
            let msgs = collect(
                &mut client,
                greedy(generate_request::Prompt::Text(text.into()), 64),
            )
            .await
            .unwrap();
            check_stream_text(&tokenizer, &msgs);
            // Echo the prompt's own tokens back as a prompt: the text survives the round trip.
            let msgs = collect(
                &mut client,
                greedy(
                    generate_request::Prompt::TokenIds(TokenIds { ids: ids.clone() }),
                    32,
                ),
            )
            .await
            .unwrap();
            check_stream_text(&tokenizer, &msgs);
        }
    });
}

#[test]
fn a_stop_string_truncates_the_output_and_finishes_with_stop() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(&["--model", &model], 1);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let prompt = generate_request::Prompt::Text("Tell me a story".into());
        let full = collect(&mut client, greedy(prompt.clone(), 48))
            .await
            .unwrap();
        let text: String = full.iter().map(|m| m.text.as_str()).collect();
        // A stop string from the middle of the greedy output.
        let chars: Vec<char> = text.chars().collect();
        assert!(chars.len() > 12, "{text:?}");
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
        let cut = text.find(&stop).unwrap();
        let req = GenerateRequest {
            stop: vec![stop.clone()],
            ..greedy(prompt, 48)
        };
        let stopped = collect(&mut client, req).await.unwrap();
        let got: String = stopped.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(got, text[..cut], "stop {stop:?}");
        let last = stopped.last().unwrap();
        assert_eq!(last.finish_reason, FinishReason::Stop as i32);
        assert!(ids_of(&stopped).len() < 48);
    });
    // The worker was told to stop: nothing keeps running.
    assert!(server.wait_metric(
        "ringserve_num_requests_running",
        std::time::Duration::from_secs(30),
        |v| v == 0.0
    ));
}
