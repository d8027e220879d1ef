//! The OpenAI-compatible HTTP API end to end, on the demo model: the same completions as gRPC
//! (one pipeline), OpenAI's response and SSE shapes, `n`, seeds, stop strings, logprobs, and errors
//! with OpenAI's body and status (400, 401, 404, 429), and a client that goes away freeing its
//! request at once.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, collect, http, http_post, ids_of, runtime, write_demo};
use protos::v1::{GenerateRequest, SamplingParams, generate_request};
use serde_json::{Value, json};

const PROMPT: &str = "Once upon a time";

/// The text of a non-streamed response's choices, by index.
fn texts(v: &Value, field: &str) -> Vec<String> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i, "{v}");
            let text = match field {
                "message" => &c["message"]["content"],
                _ => &c["text"],
            };
            text.as_str().unwrap().to_owned()
        })
        .collect()
}

/// The chunks of an SSE response (all but the final `[DONE]`, which must be there).
fn chunks(r: &common::HttpResponse) -> Vec<Value> {
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream")),
        "{:?}",
        r.headers
    );
    let mut data = r.sse_data();
    assert_eq!(data.pop().as_deref(), Some("[DONE]"), "{}", r.body);
    data.iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn completions_and_chat_are_the_grpc_pipeline_in_openai_shapes() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(&["--model", &model], 1);
    let addr = server.http_addr.clone();

    // gRPC's greedy completion is the HTTP API's (special tokens kept, as gRPC sends them).
    let rt = runtime();
    let grpc = rt.block_on(async {
        let mut client = server.client().await;
        let req = GenerateRequest {
            prompt: Some(generate_request::Prompt::Text(PROMPT.into())),
            sampling: Some(SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            max_tokens: Some(12),
            ignore_eos: true,
            ..Default::default()
        };
        collect(&mut client, req).await.unwrap()
    });
    let grpc_text: String = grpc.iter().map(|m| m.text.as_str()).collect();
    // gRPC's `n`: every message names its completion; each completion ends with its own usage.
    let two = rt.block_on(async {
        let mut client = server.client().await;
        let req = GenerateRequest {
            prompt: Some(generate_request::Prompt::Text(PROMPT.into())),
            max_tokens: Some(5),
            ignore_eos: true,
            n: 2,
            ..Default::default()
        };
        collect(&mut client, req).await.unwrap()
    });
    for index in 0..2 {
        let mine: Vec<_> = two.iter().filter(|m| m.index == index).collect();
        let tokens: usize = mine.iter().map(|m| m.token_ids.len()).sum();
        assert_eq!(tokens, 5, "completion {index}");
        assert!(mine.last().unwrap().usage.is_some());
        assert_eq!(mine.iter().filter(|m| m.usage.is_some()).count(), 1);
    }
    assert!(two.iter().all(|m| m.index < 2));
    let greedy = json!({
        "model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0,
        "ignore_eos": true, "skip_special_tokens": false,
    });
    let r = http_post(&addr, "/v1/completions", &greedy);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], model.as_str());
    assert_eq!(texts(&v, "text"), [grpc_text.as_str()]);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let prompt_ids = http_post(&addr, "/tokenize", &json!({"prompt": PROMPT})).json();
    let prompt_len = prompt_ids["count"].as_u64().unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], prompt_len + 12);

    // Token-id prompts and /detokenize.
    let ids = prompt_ids["tokens"].clone();
    let by_ids = http_post(
        &addr,
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": true,
                "skip_special_tokens": false}),
    )
    .json();
    assert_eq!(texts(&by_ids, "text"), [grpc_text.as_str()]);
    let generated: Vec<u32> = ids_of(&grpc);
    let back = http_post(&addr, "/detokenize", &json!({"tokens": generated})).json();
    assert_eq!(back["prompt"], grpc_text.as_str());

    // Streamed: the same text in chunks, the finish reason last, then the usage chunk, then [DONE].
    let mut stream_req = greedy.clone();
    stream_req["stream"] = json!(true);
    stream_req["stream_options"] = json!({"include_usage": true});
    let chunks_ = chunks(&http_post(&addr, "/v1/completions", &stream_req));
    let (usage, body) = chunks_.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    let streamed: String = body
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, grpc_text);
    assert_eq!(
        body.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(
        body[..body.len() - 1]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );

    // n samples per prompt, several prompts: OpenAI numbers the choices prompt * n + i, and
    // sample i with seed s is what n = 1 with seed s + i gives.
    let sampled = |prompt: Value, n: u32, seed: u64| {
        let r = http_post(
            &addr,
            "/v1/completions",
            &json!({"prompt": prompt, "n": n, "seed": seed, "max_tokens": 8, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let three = sampled(json!(PROMPT), 3, 7);
    let three_texts = texts(&three, "text");
    assert_eq!(three["usage"]["completion_tokens"], 24);
    assert_eq!(three["usage"]["prompt_tokens"], prompt_len);
    for (i, text) in three_texts.iter().enumerate() {
        let one = sampled(json!(PROMPT), 1, 7 + i as u64);
        assert_eq!(&texts(&one, "text")[0], text, "sample {i}");
    }
    assert_eq!(texts(&sampled(json!(PROMPT), 3, 7), "text"), three_texts);
    let batch = sampled(json!([PROMPT, "Hello"]), 2, 3);
    assert_eq!(texts(&batch, "text").len(), 4);
    assert_eq!(
        texts(&batch, "text")[..2],
        texts(&sampled(json!(PROMPT), 2, 3), "text")[..]
    );

    // A stop string from the middle of the greedy text cuts it there and finishes with "stop".
    let chars: Vec<char> = grpc_text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = grpc_text.find(&stop).unwrap();
    let mut stopped = greedy.clone();
    stopped["stop"] = json!([stop]);
    let v = http_post(&addr, "/v1/completions", &stopped).json();
    assert_eq!(texts(&v, "text"), [grpc_text[..cut].to_owned()]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // min_tokens: the greedy run's first token as a stop id ends the completion at once, but not
    // before min_tokens tokens.
    let first = ids_of(&grpc)[0];
    let mut early = greedy.clone();
    early["stop_token_ids"] = json!([first]);
    let v = http_post(&addr, "/v1/completions", &early).json();
    assert_eq!(v["usage"]["completion_tokens"], 1, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    early["min_tokens"] = json!(4);
    let v = http_post(&addr, "/v1/completions", &early).json();
    assert!(
        v["usage"]["completion_tokens"].as_u64().unwrap() >= 4,
        "{v}"
    );
    early["min_tokens"] = json!(13);
    let r = http_post(&addr, "/v1/completions", &early);
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "min_tokens");

    // Logprobs in the completions shape: one entry per token, at most k alternatives.
    let mut lp = greedy.clone();
    lp["logprobs"] = json!(2);
    let v = http_post(&addr, "/v1/completions", &lp).json();
    let l = &v["choices"][0]["logprobs"];
    assert_eq!(l["tokens"].as_array().unwrap().len(), 12, "{l}");
    assert_eq!(l["text_offset"].as_array().unwrap().len(), 12);
    for (p, top) in l["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(l["top_logprobs"].as_array().unwrap())
    {
        assert!(p.as_f64().unwrap() <= 0.0);
        let n = top.as_object().unwrap().len();
        assert!((1..=2).contains(&n), "{top}");
    }

    // Chat: the template, the role first when streamed, logprobs in chat's shape.
    let chat = json!({
        "model": model, "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 6, "temperature": 0, "ignore_eos": true,
        "logprobs": true, "top_logprobs": 3,
    });
    let v = http_post(&addr, "/v1/chat/completions", &chat).json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    let whole = texts(&v, "message")[0].clone();
    let mut streamed_chat = chat.clone();
    streamed_chat["stream"] = json!(true);
    let c = chunks(&http_post(&addr, "/v1/chat/completions", &streamed_chat));
    assert_eq!(c[0]["object"], "chat.completion.chunk");
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = c
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, whole);
    assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "length");

    // echo puts the prompt before the completion, streamed or not; max_completion_tokens bounds
    // a chat completion as max_tokens does.
    let mut echo = greedy.clone();
    echo["echo"] = json!(true);
    let v = http_post(&addr, "/v1/completions", &echo).json();
    assert_eq!(texts(&v, "text"), [format!("{PROMPT}{grpc_text}")]);
    echo["stream"] = json!(true);
    let c = chunks(&http_post(&addr, "/v1/completions", &echo));
    assert_eq!(c[0]["choices"][0]["text"], PROMPT);
    let mut short = chat.clone();
    short["max_completion_tokens"] = json!(2);
    let v = http_post(&addr, "/v1/chat/completions", &short).json();
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");

    // The other routes.
    let models = http(&addr, "GET", "/v1/models", None, &[]).json();
    assert_eq!(models["data"][0]["id"], model.as_str());
    assert_eq!(http(&addr, "GET", "/health", None, &[]).status, 200);
    assert!(http(&addr, "GET", "/version", None, &[]).json()["version"].is_string());
}

/// Opens a streamed request and returns its connection once the first chunk arrived.
fn open_stream(addr: &str, key: &str) -> TcpStream {
    let body = json!({"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": true, "stream": true})
        .to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

#[test]
fn errors_are_openai_json_with_the_right_status_and_a_gone_client_frees_its_request() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(
        &[
            "--model",
            &model,
            "--api-key",
            "sekret",
            "--max-in-flight",
            "1",
            "--served-model-name",
            "tiny",
        ],
        1,
    );
    let addr = server.http_addr.clone();
    let auth = [("authorization", "Bearer sekret")];
    let post = |path: &str, body: Value| http(&addr, "POST", path, Some(&body.to_string()), &auth);
    let error = |r: &common::HttpResponse, status: u16| -> Value {
        assert_eq!(r.status, status, "{}", r.body);
        let v = r.json();
        assert!(v["error"]["message"].is_string(), "{v}");
        assert!(v["error"]["type"].is_string(), "{v}");
        v["error"].clone()
    };

    // 401 without the key or with a wrong one; /health needs none.
    let ok_body = json!({"prompt": "hi", "max_tokens": 2});
    let r = http(
        &addr,
        "POST",
        "/v1/completions",
        Some(&ok_body.to_string()),
        &[],
    );
    assert_eq!(error(&r, 401)["type"], "authentication_error");
    let wrong = [("authorization", "Bearer nope")];
    let r = http(
        &addr,
        "POST",
        "/v1/completions",
        Some(&ok_body.to_string()),
        &wrong,
    );
    error(&r, 401);
    assert_eq!(http(&addr, "GET", "/health", None, &[]).status, 200);
    assert_eq!(post("/v1/completions", ok_body.clone()).status, 200);

    // 404 for a model that is not served, and for a path that does not exist.
    let e = error(
        &post("/v1/completions", json!({"model": "gpt-4", "prompt": "hi"})),
        404,
    );
    assert_eq!(e["code"], "model_not_found");
    assert_eq!(
        post(
            "/v1/completions",
            json!({"model": "tiny", "prompt": "hi", "max_tokens": 1})
        )
        .status,
        200
    );
    error(&http(&addr, "GET", "/v1/nothing", None, &auth), 404);

    // 400 naming the field, by the same validation as gRPC.
    for (body, param) in [
        (json!({"prompt": "hi", "temperature": -1}), "temperature"),
        (json!({"prompt": "hi", "top_p": 2}), "top_p"),
        (json!({"prompt": "hi", "n": 65}), "n"),
        (json!({"prompt": "hi", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": "hi", "stop": ["", "x"]}), "stop[0]"),
        (json!({"prompt": [1, 99999999]}), "prompt[1]"),
        (json!({"prompt": "hi", "logprobs": 21}), "logprobs"),
        (json!({"prompt": "hi", "temperature": "hot"}), "temperature"),
        (
            json!({"prompt": "hi", "response_format": {"type": "xml"}}),
            "response_format.type",
        ),
        (
            json!({"prompt": "hi", "response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "schema": {"type": "frobnicate"}}}}),
            "response_format",
        ),
        (
            json!({"prompt": "hi", "structured_outputs": {"regex": "(open"}}),
            "structured_outputs",
        ),
    ] {
        let e = error(&post("/v1/completions", body.clone()), 400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    for (body, param) in [
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
    ] {
        let e = error(&post("/v1/chat/completions", body.clone()), 400);
        assert_eq!(e["param"], param, "{body}: {e}");
    }
    error(
        &http(&addr, "POST", "/v1/completions", Some("{not json"), &auth),
        400,
    );
    let e = error(
        &post(
            "/tokenize",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
        ),
        400,
    );
    assert_eq!(e["param"], "messages[0].role", "{e}");
    let e = error(&post("/tokenize", json!({"prompt": ""})), 400);
    assert_eq!(e["param"], "prompt", "{e}");

    // 429 at the admission limit (one request in flight), and a client that goes away frees its
    // request at once: the next request is admitted.
    let held = open_stream(&addr, "sekret");
    let e = error(&post("/v1/completions", ok_body.clone()), 429);
    assert_eq!(e["code"], "rate_limit_exceeded");
    drop(held);
    let start = Instant::now();
    loop {
        let r = post("/v1/completions", ok_body.clone());
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the gone client's request still holds its admission"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.wait_metric(
        "ringserve_num_requests_running",
        Duration::from_secs(30),
        |v| v == 0.0
    ));
}

#[test]
fn a_model_without_a_tokenizer_streams_its_tokens_as_they_come() {
    // tiny-llama has no tokenizer: token-id prompts only, and every chunk's text is empty.
    let model = common::tiny_llama();
    let model = model.to_str().unwrap();
    let server = Server::start(&["--model", model, "--device", "null"], 1);
    let body = json!({
        "prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
    });
    let c = chunks(&http_post(&server.http_addr, "/v1/completions", &body));
    let (usage, body) = c.split_last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 400);
    // Each chunk counts the tokens so far; they rise to the total, over more than one chunk.
    let counts: Vec<u64> = body
        .iter()
        .map(|c| c["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert!(counts.len() > 1, "one chunk for {counts:?}");
    assert!(counts.windows(2).all(|w| w[0] < w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&400));
    let text = http_post(
        &server.http_addr,
        "/v1/completions",
        &json!({"prompt": "hi"}),
    );
    assert_eq!(text.status, 400, "{}", text.body);
    assert_eq!(text.json()["error"]["param"], "prompt");
}

#[test]
fn oversized_bodies_are_413_and_a_draining_server_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let mut server = Server::start(&["--model", &model, "--drain-timeout", "30"], 1);
    let addr = server.http_addr.clone();
    // Over the 4 MiB body limit: 413 in OpenAI's error shape.
    let huge = json!({"prompt": "x".repeat(5 << 20)}).to_string();
    let r = http(&addr, "POST", "/v1/completions", Some(&huge), &[]);
    assert_eq!(r.status, 413, "{}", r.body);
    assert!(r.json()["error"]["message"].is_string());

    // While a stream runs, SIGTERM starts the drain: /health and new requests answer 503, the
    // running stream goes on; once it is gone the server exits.
    let held = open_stream(&addr, "none");
    server.sigterm();
    let start = Instant::now();
    loop {
        let r = http_post(
            &addr,
            "/v1/completions",
            &json!({"prompt": "hi", "max_tokens": 1}),
        );
        if r.status == 503 {
            assert!(
                r.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("shutting down")
            );
            break;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no 503 while draining"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http(&addr, "GET", "/health", None, &[]).status, 503);
    drop(held);
    let status = server
        .wait_exit(Duration::from_secs(30))
        .expect("the server exits");
    assert!(status.success(), "{status:?}");
}

#[test]
fn bench_serve_counts_the_same_tokens_through_grpc_http1_and_http2() {
    // The load generator through each front door of one server: every request completes and
    // every generated token is counted, whichever door and HTTP version carried it.
    let model = common::tiny_llama();
    let server = Server::start(&["--model", model.to_str().unwrap(), "--device", "null"], 1);
    let run = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringserve"))
            .args(["bench", "serve", "--addr", &server.url, "--quiet", "--json"])
            .args([
                "--concurrency",
                "6",
                "--num-requests",
                "12",
                "--input-len",
                "8",
            ])
            .args(["--output-len", "50", "--connections", "2"])
            .args(extra)
            .output()
            .expect("running bench serve");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
        (
            report["completed"].as_u64(),
            report["errors"].as_u64(),
            report["output_tokens"].as_u64(),
        )
    };
    let http = server.http_addr.clone();
    let want = (Some(12), Some(0), Some(12 * 50));
    assert_eq!(run(&[]), want, "gRPC");
    assert_eq!(run(&["--openai-addr", &http]), want, "HTTP/1.1");
    assert_eq!(
        run(&["--openai-addr", &http, "--openai-http2"]),
        want,
        "HTTP/2"
    );
}
