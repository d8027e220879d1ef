//! A minimal Rust client on the generated tonic stubs: stream one completion from a running
//! `ringserve serve`.
//!
//! ```text
//! cargo run --release -- serve &            # the demo model on 127.0.0.1:50051
//! cargo run --release --example client -- "Once upon a time"
//! ```

use protos::v1::inference_client::InferenceClient;
use protos::v1::{GenerateRequest, SamplingParams, generate_request};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "Once upon a time".to_owned());
    let addr = std::env::var("RINGSERVE_ADDR").unwrap_or_else(|_| "http://127.0.0.1:50051".into());
    let mut client = InferenceClient::connect(addr).await?;
    let request = GenerateRequest {
        prompt: Some(generate_request::Prompt::Text(prompt)),
        sampling: Some(SamplingParams {
            temperature: Some(0.8),
            top_p: Some(0.95),
            ..Default::default()
        }),
        max_tokens: Some(64),
        ..Default::default()
    };
    let mut stream = client.generate(request).await?.into_inner();
    while let Some(message) = stream.message().await? {
        print!("{}", message.text);
        if let Some(usage) = message.usage {
            println!(
                "\n[{} prompt tokens, {} generated]",
                usage.prompt_tokens, usage.completion_tokens
            );
        }
    }
    Ok(())
}
