//! End to end on the tiny-llama fixture: token-id prompts through gRPC give exactly the fixture's
//! greedy tokens (what `ringserve generate` gives), alone and as 64 concurrent streams; invalid
//! requests are refused naming the field; health and reflection work.

mod common;

use common::{Server, collect, greedy_ids, ids_of, runtime, tiny_llama, tiny_llama_cases};
use protos::v1::{
    ChatMessage, ChatMessages, FinishReason, GenerateRequest, ModelInfoRequest, SamplingParams,
    TokenIds, generate_request,
};
use tonic::Code;

fn tiny_server() -> Server {
    let model = tiny_llama();
    Server::start(&["--model", model.to_str().unwrap()], 1)
}

#[test]
fn greedy_tokens_match_the_fixture_alone_and_64_concurrent() {
    let server = tiny_server();
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let info = client
            .model_info(ModelInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.vocab_size, 512);
        assert!(!info.has_tokenizer);
        let cases = tiny_llama_cases();
        for (prompt, greedy) in &cases {
            let msgs = collect(&mut client, greedy_ids(prompt, 24)).await.unwrap();
            assert_eq!(&ids_of(&msgs), greedy, "prompt {prompt:?}");
            let last = msgs.last().unwrap();
            assert_eq!(last.finish_reason, FinishReason::Length as i32);
            let usage = last.usage.unwrap();
            assert_eq!(usage.prompt_tokens as usize, prompt.len());
            assert_eq!(usage.completion_tokens, 24);
        }
        // 64 concurrent streams, each identical to its solo run.
        let mut tasks = Vec::new();
        for i in 0..64 {
            let (prompt, greedy) = cases[i % cases.len()].clone();
            let url = server.url.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = protos::v1::inference_client::InferenceClient::connect(url)
                    .await
                    .unwrap();
                let msgs = collect(&mut c, greedy_ids(&prompt, 24)).await.unwrap();
                (ids_of(&msgs), greedy)
            }));
        }
        for t in tasks {
            let (got, want) = t.await.unwrap();
            assert_eq!(got, want);
        }
    });
}

fn ids_request(ids: &[u32]) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(generate_request::Prompt::TokenIds(TokenIds {
            ids: ids.to_vec(),
        })),
        max_tokens: Some(4),
        ..Default::default()
    }
}

#[test]
fn each_invalid_request_is_invalid_argument_naming_the_field() {
    let server = tiny_server();
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let sampling = |s: SamplingParams| GenerateRequest {
            sampling: Some(s),
            ..ids_request(&[1, 2])
        };
        let cases: Vec<(GenerateRequest, &str)> = vec![
            (ids_request(&[]), "prompt.token_ids"),
            (
                GenerateRequest {
                    prompt: Some(generate_request::Prompt::Text(String::new())),
                    ..Default::default()
                },
                "prompt.text",
            ),
            (
                GenerateRequest {
                    max_tokens: Some(510),
                    ..ids_request(&[1, 2, 3])
                },
                "max_tokens",
            ),
            (
                GenerateRequest {
                    max_tokens: Some(0),
                    ..ids_request(&[1])
                },
                "max_tokens",
            ),
            (
                sampling(SamplingParams {
                    temperature: Some(-1.0),
                    ..Default::default()
                }),
                "sampling.temperature",
            ),
            (
                sampling(SamplingParams {
                    top_p: Some(0.0),
                    ..Default::default()
                }),
                "sampling.top_p",
            ),
            (
                sampling(SamplingParams {
                    top_k: -2,
                    ..Default::default()
                }),
                "sampling.top_k",
            ),
            (
                sampling(SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                }),
                "sampling.min_p",
            ),
            (
                GenerateRequest {
                    prompt: Some(generate_request::Prompt::Chat(ChatMessages {
                        messages: vec![ChatMessage {
                            role: "robot".into(),
                            content: "hi".into(),
                        }],
                    })),
                    ..Default::default()
                },
                "prompt.chat.messages[0].role",
            ),
            (ids_request(&[1, 512]), "prompt.token_ids[1]"),
            // The fixture has no tokenizer: text prompts are refused, naming the field.
            (
                GenerateRequest {
                    prompt: Some(generate_request::Prompt::Text("hello".into())),
                    ..Default::default()
                },
                "prompt.text",
            ),
        ];
        for (req, field) in cases {
            let err = collect(&mut client, req).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
            assert!(
                err.message().starts_with(&format!("{field}:")),
                "{field}: message {:?}",
                err.message()
            );
        }
        // The server still serves after all that.
        let ok = collect(&mut client, greedy_ids(&[1, 2, 3], 3))
            .await
            .unwrap();
        assert_eq!(ids_of(&ok).len(), 3);
    });
}

#[test]
fn health_is_serving_and_reflection_lists_the_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = tiny_server();
    let rt = runtime();
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(server.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel.clone());
        for service in ["", "ringserve.v1.Inference"] {
            let status = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status;
            assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
        }
        let mut refl = ServerReflectionClient::new(channel);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut resp = refl
            .server_reflection_info(tokio_stream::iter(vec![req]))
            .await
            .unwrap()
            .into_inner();
        let msg = resp.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
            panic!("unexpected reflection answer {msg:?}");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        assert!(
            names.iter().any(|n| n == "ringserve.v1.Inference"),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n == "grpc.health.v1.Health"),
            "{names:?}"
        );
    });
}
