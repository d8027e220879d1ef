//! Structured output end to end on the demo model (random weights: only the grammar keeps the
//! output well-formed): JSON schemas with nested objects, enums, arrays and required fields over the
//! OpenAI API (plain and streamed, `n` completions) and gRPC, vLLM's `structured_outputs` regex and
//! choice, and the 400s for grammars that cannot run. Every output is validated against its schema.

mod common;

use common::{Server, collect, http_post, runtime, write_demo};
use protos::v1::{Choices, GenerateRequest, StructuredOutput, generate_request, structured_output};
use serde_json::{Value, json};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                       "minItems": 1, "maxItems": 4},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 6},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    "verified": {"type": "boolean"}
                },
                "required": ["city", "zip", "verified"],
                "additionalProperties": false
            }
        },
        "required": ["name", "role", "scores", "address"],
        "additionalProperties": false
    })
}

fn assert_valid(schema: &Value, text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let validator = jsonschema::validator_for(schema).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{text}: {errors:?}");
}

#[test]
fn schema_constrained_outputs_validate_over_http_and_grpc() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(&["--model", &model], 1);
    let addr = server.http_addr.clone();
    let schema = schema();

    // Chat, OpenAI's json_schema shape, four sampled completions.
    let chat = json!({
        "messages": [{"role": "user", "content": "Describe a user as JSON."}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "user", "schema": schema, "strict": true}},
        "n": 4, "seed": 11, "max_tokens": 400,
    });
    let r = http_post(&addr, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let mut texts = Vec::new();
    for c in choices {
        assert_eq!(c["finish_reason"], "stop", "ends with the grammar: {c}");
        let text = c["message"]["content"].as_str().unwrap();
        assert_valid(&schema, text);
        texts.push(text.to_owned());
    }
    texts.dedup();
    assert!(texts.len() > 1, "sampled completions differ: {texts:?}");

    // Streamed completions: the deltas join into a valid document.
    let streamed = json!({
        "prompt": "JSON:", "stream": true, "seed": 5, "max_tokens": 400,
        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": schema}},
    });
    let r = http_post(&addr, "/v1/completions", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut data = r.sse_data();
    assert_eq!(data.pop().as_deref(), Some("[DONE]"));
    let chunks: Vec<Value> = data
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_valid(&schema, &text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    // vLLM's structured_outputs: a regex and a choice.
    let rx = http_post(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Date:", "max_tokens": 50, "seed": 1,
                "structured_outputs": {"regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]"}}),
    )
    .json();
    let date = rx["choices"][0]["text"].as_str().unwrap();
    assert_eq!(date.len(), 10, "{date:?}");
    assert!(
        date.starts_with("20") && date.as_bytes()[4] == b'-',
        "{date:?}"
    );
    let pick = http_post(
        &addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Pick."}], "n": 3,
                "structured_outputs": {"choice": ["red pill", "blue pill"]}}),
    )
    .json();
    for c in pick["choices"].as_array().unwrap() {
        let s = c["message"]["content"].as_str().unwrap();
        assert!(s == "red pill" || s == "blue pill", "{s:?}");
    }

    // gRPC: the same schema through `structured_output`, and a choice.
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let req = |kind| GenerateRequest {
            prompt: Some(generate_request::Prompt::Text("Hello".into())),
            max_tokens: Some(400),
            structured_output: Some(StructuredOutput { kind: Some(kind) }),
            ..Default::default()
        };
        let msgs = collect(
            &mut client,
            req(structured_output::Kind::JsonSchema(schema.to_string())),
        )
        .await
        .unwrap();
        let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
        assert_valid(&schema, &text);
        let msgs = collect(
            &mut client,
            req(structured_output::Kind::Choice(Choices {
                choices: vec!["alpha".into(), "beta".into()],
            })),
        )
        .await
        .unwrap();
        let text: String = msgs.iter().map(|m| m.text.as_str()).collect();
        assert!(text == "alpha" || text == "beta", "{text:?}");
        // A grammar that cannot run is INVALID_ARGUMENT naming the field.
        let err = collect(
            &mut client,
            req(structured_output::Kind::Regex("(x".into())),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with("structured_output:"), "{err}");
        let err = collect(&mut client, req(structured_output::Kind::JsonObject(false)))
            .await
            .unwrap_err();
        assert!(
            err.message().starts_with("structured_output.json_object"),
            "{err}"
        );
    });

    // 400s: what is wrong is named.
    for (body, param, says) in [
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema",
                   "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}}}),
            "response_format",
            "",
        ),
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
            "missing",
        ),
        (
            json!({"prompt": "x", "response_format": {"type": "json_object"},
                   "structured_outputs": {"regex": "a"}}),
            "structured_outputs",
            "not both",
        ),
        (
            json!({"prompt": "x", "structured_outputs": {"grammar": "root ::= \"a\""}}),
            "structured_outputs",
            "structured_outputs.grammar is not supported",
        ),
        (
            json!({"prompt": "x", "structured_outputs": {"choice": []}}),
            "structured_outputs",
            "non-empty",
        ),
    ] {
        let r = http_post(&addr, "/v1/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{body}: {e}");
    }
}
