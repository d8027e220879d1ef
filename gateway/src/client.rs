//! `ringserve client`: stream one completion to the terminal.

use std::io::Write;
use std::time::Instant;

use protos::v1::{
    ChatMessage, ChatMessages, FinishReason, GenerateRequest, SamplingParams, TokenIds,
    generate_request,
};

/// What to ask for.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Server address, e.g. `http://127.0.0.1:50051`.
    pub addr: String,
    /// The prompt (text; a user message with `chat`; comma-separated ids with `token_ids`).
    pub prompt: String,
    /// Send the prompt as a chat user message.
    pub chat: bool,
    /// A system message (with `chat`).
    pub system: Option<String>,
    /// The prompt is comma- or space-separated token ids.
    pub token_ids: bool,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: i32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Print the token ids instead of the text.
    pub print_ids: bool,
    /// API key and TLS settings.
    pub security: crate::connect::ClientSecurity,
}

/// The client failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Connect(#[from] crate::connect::ConnectError),
    #[error("server: {} ({:?})", .0.message(), .0.code())]
    Status(tonic::Status),
    #[error("prompt: {0}")]
    Prompt(String),
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

/// What came back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub token_ids: Vec<u32>,
    pub text: String,
    pub finish_reason: Option<FinishReason>,
    pub prompt_tokens: u32,
}

/// Parses `1,2,3` or `1 2 3`.
pub fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    s.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().map_err(|_| format!("not a token id: {p:?}")))
        .collect()
}

/// The request `opts` describes.
pub fn build_request(opts: &ClientOptions) -> Result<GenerateRequest, ClientError> {
    let prompt = if opts.token_ids {
        generate_request::Prompt::TokenIds(TokenIds {
            ids: parse_ids(&opts.prompt).map_err(ClientError::Prompt)?,
        })
    } else if opts.chat {
        let mut messages = Vec::new();
        if let Some(s) = &opts.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
            });
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: opts.prompt.clone(),
        });
        generate_request::Prompt::Chat(ChatMessages { messages })
    } else {
        generate_request::Prompt::Text(opts.prompt.clone())
    };
    Ok(GenerateRequest {
        prompt: Some(prompt),
        sampling: Some(SamplingParams {
            temperature: opts.temperature,
            top_p: opts.top_p,
            top_k: opts.top_k,
            seed: opts.seed,
            ..Default::default()
        }),
        max_tokens: opts.max_tokens,
        stop: opts.stop.clone(),
        // Text for people: no `<|im_end|>` and the like (OpenAI's and vLLM's default too).
        skip_special_tokens: true,
        ..Default::default()
    })
}

/// Streams the completion into `out` as it arrives; returns it whole.
pub async fn run(opts: &ClientOptions, out: &mut impl Write) -> Result<Completion, ClientError> {
    let channel = crate::connect::channel(&opts.addr, &opts.security).await?;
    let mut client = crate::connect::client(channel, &opts.security)?;
    let request = build_request(opts)?;
    let start = Instant::now();
    let mut stream = client.generate(request).await?.into_inner();
    let mut done = Completion::default();
    let mut first = None;
    while let Some(msg) = stream.message().await? {
        first.get_or_insert_with(Instant::now);
        if opts.print_ids {
            for id in &msg.token_ids {
                write!(out, "{id} ")?;
            }
        } else {
            out.write_all(msg.text.as_bytes())?;
        }
        out.flush()?;
        done.token_ids.extend(&msg.token_ids);
        done.text.push_str(&msg.text);
        if let Some(u) = msg.usage {
            done.prompt_tokens = u.prompt_tokens;
            done.finish_reason = FinishReason::try_from(msg.finish_reason).ok();
        }
    }
    writeln!(out)?;
    let total = start.elapsed();
    let ttft = first.map(|f| f.duration_since(start));
    tracing::info!(
        prompt_tokens = done.prompt_tokens,
        completion_tokens = done.token_ids.len(),
        finish = ?done.finish_reason,
        ttft_ms = ttft.map(|d| d.as_secs_f64() * 1e3),
        total_ms = total.as_secs_f64() * 1e3,
        "done"
    );
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ids_and_builds_requests() {
        assert_eq!(parse_ids("1, 2 3,4").unwrap(), vec![1, 2, 3, 4]);
        assert!(parse_ids("1,x").is_err());
        let opts = ClientOptions {
            prompt: "hi".into(),
            chat: true,
            system: Some("be nice".into()),
            ..Default::default()
        };
        let req = build_request(&opts).unwrap();
        let Some(generate_request::Prompt::Chat(c)) = req.prompt else {
            panic!("chat prompt expected");
        };
        assert_eq!(c.messages.len(), 2);
        assert_eq!(c.messages[0].role, "system");
    }
}
