use axum::http::StatusCode;
use serde_json::json;

use super::request::*;

#[test]
fn prompts_come_in_four_shapes_and_bad_ones_name_the_element() {
    let p = |v: serde_json::Value| completion_prompts(&v);
    assert_eq!(p(json!("hi")).unwrap(), vec![Prompt::Text("hi".into())]);
    assert_eq!(
        p(json!(["a", "b"])).unwrap(),
        vec![Prompt::Text("a".into()), Prompt::Text("b".into())]
    );
    assert_eq!(p(json!([1, 2])).unwrap(), vec![Prompt::Ids(vec![1, 2])]);
    assert_eq!(
        p(json!([[1], [2, 3]])).unwrap(),
        vec![Prompt::Ids(vec![1]), Prompt::Ids(vec![2, 3])]
    );
    assert_eq!(p(json!([])).unwrap_err().param.as_deref(), Some("prompt"));
    assert_eq!(
        p(json!(["a", 3])).unwrap_err().param.as_deref(),
        Some("prompt[1]")
    );
    assert_eq!(
        p(json!([1, -2])).unwrap_err().param.as_deref(),
        Some("prompt[1]")
    );
    assert_eq!(
        p(json!([[1], [2, "x"]])).unwrap_err().param.as_deref(),
        Some("prompt[1][1]")
    );
    assert_eq!(
        p(json!({"a": 1})).unwrap_err().param.as_deref(),
        Some("prompt")
    );
}

#[test]
fn chat_content_is_text_or_text_parts() {
    let m = chat_messages(&[
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        json!({"role": "assistant", "content": null}),
    ])
    .unwrap();
    let contents: Vec<&str> = m.messages.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(contents, ["be brief", "ab", ""]);
    let err =
        chat_messages(&[json!({"role": "user", "content": [{"type": "image_url"}]})]).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages[0].content[0].type"));
    let err = chat_messages(&[json!({"content": "x"})]).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages[0].role"));
    let err = chat_messages(&[json!({"role": "user", "content": 5})]).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages[0].content"));
}

#[test]
fn body_errors_name_the_field() {
    let e = parse_generation::<CompletionRequest>(br#"{"prompt": "x", "temperature": "hot"}"#)
        .unwrap_err();
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    assert_eq!(e.param.as_deref(), Some("temperature"), "{e:?}");
    let e = parse_generation::<ChatRequest>(br#"{"messages": [], "n": -1}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("n"), "{e:?}");
    let e = parse_generation::<ChatRequest>(b"not json").unwrap_err();
    assert_eq!(e.status, StatusCode::BAD_REQUEST);
    let e = parse_generation::<CompletionRequest>(br#"{"max_tokens": 3}"#).unwrap_err();
    assert!(e.message.contains("prompt"), "{e:?}");
}

#[test]
fn requests_map_onto_the_pipeline_and_unsupported_fields_are_named() {
    let c: CompletionRequest = parse_generation(
        br#"{"prompt": "x", "n": 3, "stop": "END", "seed": -1, "top_k": -1, "stream": true,
             "stream_options": {"include_usage": true}, "logprobs": 0}"#,
    )
    .unwrap();
    let (req, shape) = generate_request(&c.common, Some(5), c.logprobs, "id".into()).unwrap();
    assert_eq!(req.n, 3);
    assert_eq!(req.stop, ["END"]);
    assert_eq!(req.sampling.unwrap().seed, Some(u64::MAX));
    assert_eq!(req.sampling.unwrap().top_k, 0);
    assert_eq!(req.max_tokens, Some(5));
    // logprobs 0 still needs the chosen token's logprob from the stream.
    assert_eq!(req.logprobs, 1);
    assert!(req.skip_special_tokens);
    assert_eq!(
        shape,
        Shape {
            stream: true,
            include_usage: true,
            continuous_usage: false,
            logprobs: Some(0),
            n: 3
        }
    );
    let param = |body: &[u8]| {
        let c: CompletionRequest = parse_generation(body).unwrap();
        generate_request(&c.common, None, None, String::new())
            .unwrap_err()
            .param
            .unwrap()
    };
    assert_eq!(param(br#"{"prompt": "x", "n": 0}"#), "n");
    assert_eq!(
        param(br#"{"prompt": "x", "logit_bias": {"1": 5}}"#),
        "logit_bias"
    );
    assert_eq!(
        param(br#"{"prompt": "x", "stream_options": {}}"#),
        "stream_options"
    );
    assert_eq!(
        param(br#"{"prompt": "x", "response_format": {"type": "xml"}}"#),
        "response_format.type"
    );
    assert_eq!(param(br#"{"prompt": "x", "top_k": 9999999999}"#), "top_k");
}

#[test]
fn pipeline_field_names_become_openai_names() {
    assert_eq!(
        openai_param("sampling.temperature", None, false),
        "temperature"
    );
    assert_eq!(openai_param("prompt.text", None, false), "prompt");
    assert_eq!(
        openai_param("prompt.token_ids[4]", Some(2), false),
        "prompt[2][4]"
    );
    assert_eq!(
        openai_param("prompt.chat.messages[1].role", None, true),
        "messages[1].role"
    );
    assert_eq!(openai_param("prompt.chat.messages", None, true), "messages");
    assert_eq!(openai_param("logprobs", None, true), "top_logprobs");
    assert_eq!(openai_param("stop[3]", None, false), "stop[3]");
}
