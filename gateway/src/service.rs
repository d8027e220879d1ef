//! The `ringserve.v1.Inference` tonic service: a thin adapter over the shared pipeline
//! ([`crate::pipeline`]), which validates, tokenizes, admits, routes and streams.

use std::sync::Arc;
use std::time::{Duration, Instant};

use protos::v1::inference_server::Inference;
use protos::v1::{
    GenerateRequest, ModelInfoRequest, ModelInfoResponse, TokenizeRequest, TokenizeResponse,
};
use tonic::{Request, Response, Status};

use crate::pipeline::{ResponseStream, Shared};
use crate::validate;

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct InferenceService {
    shared: Arc<Shared>,
}

impl InferenceService {
    /// A service over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

/// The deadline a client set with `grpc-timeout`, if any.
fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + d)
}

#[tonic::async_trait]
impl Inference for InferenceService {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        request: Request<GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let deadline = deadline_of(&request);
        let stream = self.shared.generate(request.into_inner(), deadline).await?;
        Ok(Response::new(stream))
    }

    async fn tokenize(
        &self,
        request: Request<TokenizeRequest>,
    ) -> Result<Response<TokenizeResponse>, Status> {
        let prompt = validate::check_tokenize(request.into_inner())?;
        let ids = self.shared.tokenize(prompt, "input").await?;
        let tokens = self
            .shared
            .text
            .as_ref()
            .map(|t| t.token_strings(&ids))
            .unwrap_or_default();
        Ok(Response::new(TokenizeResponse {
            token_ids: ids,
            tokens,
        }))
    }

    async fn model_info(
        &self,
        _request: Request<ModelInfoRequest>,
    ) -> Result<Response<ModelInfoResponse>, Status> {
        let s = &self.shared;
        let limits = s.limits()?;
        Ok(Response::new(ModelInfoResponse {
            model_name: s.model_name.clone(),
            max_model_len: limits.max_model_len,
            vocab_size: limits.vocab_size,
            eos_token_ids: s.eos_token_ids.clone(),
            has_tokenizer: s.text.is_some(),
            has_chat_template: s.text.as_ref().is_some_and(|t| t.chat.is_some()),
        }))
    }
}
