//! OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`, with the HTTP status
//! that goes with it, and the mapping from the pipeline's errors and gRPC statuses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::pipeline::StartError;

/// An error answered as OpenAI does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// OpenAI's machine-readable code (`invalid_api_key`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

/// What goes on the wire.
#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming `param`.
    pub fn invalid(param: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let param = param.into();
        Self {
            message: format!("{param}: {message}"),
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, "")
        }
    }

    /// 400 about the body as a whole (not JSON, not an object).
    pub fn bad_body(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, message)
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(model: &str, served: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("the model `{model}` does not exist (this server serves `{served}`)"),
            )
        }
    }

    /// 404 for a path this server does not serve.
    pub fn no_route(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("no such endpoint: {path}"))
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// The `type` OpenAI gives errors of this status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        let body = Body {
            error: Detail {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| r#"{"error":{}}"#.into())
    }

    /// A pipeline error; a field it names is renamed by `param` (gRPC names to OpenAI's).
    pub fn from_start(e: StartError, param: impl Fn(&str) -> String) -> Self {
        match e {
            StartError::Invalid(e) => Self::invalid(param(&e.field), e.message),
            StartError::Overloaded(e) => Self {
                code: Some("rate_limit_exceeded"),
                ..Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
            },
            StartError::Draining | StartError::Unavailable(_) => Self::unavailable(e.to_string()),
            StartError::Internal(e) => Self::new(StatusCode::INTERNAL_SERVER_ERROR, e),
        }
    }

    /// An error a running stream ended with.
    pub fn from_status(s: &tonic::Status) -> Self {
        use tonic::Code;
        let status = match s.code() {
            Code::InvalidArgument => StatusCode::BAD_REQUEST,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, s.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Refused;
    use crate::validate::InvalidArgument;

    #[test]
    fn errors_carry_openai_fields_and_statuses() {
        let e = ApiError::from_start(
            StartError::Invalid(InvalidArgument::new(
                "sampling.top_p",
                "1.5 is not in (0, 1]",
            )),
            |f| f.trim_start_matches("sampling.").to_owned(),
        );
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(v["error"]["param"], "top_p");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "top_p: 1.5 is not in (0, 1]");
        let busy = ApiError::from_start(
            StartError::Overloaded(Refused::InFlight { limit: 2 }),
            str::to_owned,
        );
        assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
        let v: serde_json::Value = serde_json::from_str(&busy.body()).unwrap();
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert_eq!(
            ApiError::from_start(StartError::Draining, str::to_owned).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        let v: serde_json::Value =
            serde_json::from_str(&ApiError::unknown_model("gpt-4", "demo").body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(
            ApiError::from_status(&tonic::Status::unavailable("worker died")).status,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
