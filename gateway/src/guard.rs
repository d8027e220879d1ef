//! The layer every gRPC call passes on its way in and out: the API key check, and the status
//! codes of errors tonic raises itself before a handler runs.
//!
//! - With an [`ApiKey`], every call but `grpc.health.v1` (probed by load balancers without
//!   credentials) must carry `authorization: Bearer KEY`; otherwise it is answered
//!   `UNAUTHENTICATED` without reaching a service.
//! - tonic answers a request message over the size limit with `OUT_OF_RANGE` and one that is not
//!   valid protobuf (e.g. a string field that is not UTF-8) with `INTERNAL`. Both are the client's
//!   doing: gRPC's convention is `RESOURCE_EXHAUSTED` for the first and this server answers
//!   `INVALID_ARGUMENT` for the second (and for a call without a message). No handler returns
//!   `OUT_OF_RANGE`, and `INTERNAL` is rewritten only for tonic's own messages about a malformed
//!   request, so real server faults stay `INTERNAL`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::{Code, Status};

use crate::auth::ApiKey;
use crate::metrics as m;

/// Calls under this path need no API key.
const OPEN_PATH: &str = "/grpc.health.v1.Health/";

/// How prost's decode errors begin (tonic passes them on as `INTERNAL`).
const DECODE_ERROR: &str = "failed to decode Protobuf message";

/// The `INTERNAL` messages tonic gives a malformed request: a protobuf decode error, a call
/// without its message, a frame with a bad compression flag.
const MALFORMED_REQUEST: [&str; 3] = [
    DECODE_ERROR,
    "Missing request message",
    "protocol error: received message with invalid compression flag",
];

/// Builds [`Guard`]s around a server's services.
#[derive(Debug, Clone, Default)]
pub struct GuardLayer {
    key: Option<Arc<ApiKey>>,
}

impl GuardLayer {
    /// A layer that requires `key` when there is one.
    pub fn new(key: Option<ApiKey>) -> Self {
        Self {
            key: key.map(Arc::new),
        }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            key: self.key.clone(),
        }
    }
}

/// The service [`GuardLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct Guard<S> {
    inner: S,
    key: Option<Arc<ApiKey>>,
}

/// The status a client should see for one tonic raised while decoding its request, if it differs.
pub fn client_status(status: &Status) -> Option<Status> {
    match status.code() {
        Code::OutOfRange => Some(Status::resource_exhausted(status.message().to_owned())),
        Code::Internal
            if MALFORMED_REQUEST
                .iter()
                .any(|m| status.message().starts_with(m)) =>
        {
            Some(Status::invalid_argument(status.message().to_owned()))
        }
        _ => None,
    }
}

/// Rewrites a trailers-only error response (one that failed before any message was sent).
fn normalize<B: Default>(response: http::Response<B>) -> http::Response<B> {
    match Status::from_header_map(response.headers()).and_then(|s| client_status(&s)) {
        Some(status) => status.into_http(),
        None => response,
    }
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Guard<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if let Some(key) = &self.key
            && !request.uri().path().starts_with(OPEN_PATH)
            && let Err(e) = key.verify(request.headers())
        {
            metrics::counter!(m::AUTH_FAILURES).increment(1);
            tracing::debug!(path = request.uri().path(), reason = %e, "call refused");
            let response = Status::unauthenticated(e.to_string()).into_http();
            return Box::pin(std::future::ready(Ok(response)));
        }
        let call = self.inner.call(request);
        Box::pin(async move { call.await.map(normalize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonic_decode_statuses_change() {
        let big = Status::out_of_range("Error, decoded message length too large");
        assert_eq!(client_status(&big).unwrap().code(), Code::ResourceExhausted);
        let utf8 = Status::internal(format!("{DECODE_ERROR}: invalid string value"));
        let mapped = client_status(&utf8).unwrap();
        assert_eq!(mapped.code(), Code::InvalidArgument);
        assert_eq!(mapped.message(), utf8.message());
        let empty = client_status(&Status::internal("Missing request message.")).unwrap();
        assert_eq!(empty.code(), Code::InvalidArgument);
        assert!(client_status(&Status::internal("the worker failed")).is_none());
        assert!(client_status(&Status::invalid_argument("x")).is_none());
        assert!(client_status(&Status::unavailable("x")).is_none());
    }
}
