//! `bench serve --openai-addr`: the load generator's requests sent through the OpenAI-compatible
//! HTTP API (`POST /v1/completions`, streamed) instead of gRPC, so the two front doors can be
//! measured by one client in one run. Tokens per chunk come from vLLM's
//! `stream_options.continuous_usage_stats` (each chunk carries its completion's token count).

use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use protos::v1::{GenerateRequest, generate_request};
use serde_json::{Value, json};

use crate::bench::Sample;

/// One keep-alive HTTP/1.1 connection to the API.
pub(crate) struct HttpConn {
    addr: String,
    key: Option<String>,
    send: Option<SendRequest<Full<Bytes>>>,
}

impl HttpConn {
    /// A connection to `addr` (`host:port`), made on first use.
    pub(crate) fn new(addr: &str, key: Option<&str>) -> Self {
        Self {
            addr: addr.trim_start_matches("http://").to_owned(),
            key: key.map(str::to_owned),
            send: None,
        }
    }

    async fn sender(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if self.send.as_ref().is_none_or(|s| s.is_closed()) {
            let tcp = tokio::net::TcpStream::connect(&self.addr)
                .await
                .map_err(|e| format!("connecting to {}: {e}", self.addr))?;
            let _ = tcp.set_nodelay(true);
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            self.send = Some(send);
        }
        self.send.as_mut().ok_or_else(|| "no connection".to_owned())
    }

    /// Streams one request's completion, timing each chunk.
    pub(crate) async fn one(&mut self, req: &GenerateRequest) -> Sample {
        let ids = match &req.prompt {
            Some(generate_request::Prompt::TokenIds(t)) => t.ids.clone(),
            _ => Vec::new(),
        };
        let mut s = Sample {
            input: ids.len() as u64,
            ..Sample::default()
        };
        let body = json!({
            "prompt": ids, "max_tokens": req.max_tokens, "temperature": 0, "ignore_eos": true,
            "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        })
        .to_string();
        let start = Instant::now();
        let result = self.stream(body, start, &mut s).await;
        s.e2e = start.elapsed().as_secs_f64();
        if let Err(e) = result {
            s.error = Some(e);
        }
        s
    }

    async fn stream(&mut self, body: String, start: Instant, s: &mut Sample) -> Result<(), String> {
        let mut builder = hyper::Request::post("/v1/completions")
            .header(hyper::header::HOST, self.addr.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.key {
            builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = self
            .sender()
            .await?
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.into_body().collect().await.map(|b| b.to_bytes());
            let text = text.map_or_else(|e| e.to_string(), |b| String::from_utf8_lossy(&b).into());
            return Err(format!("HTTP {status}: {text}"));
        }
        let mut body = response.into_body();
        let mut pending: Vec<u8> = Vec::new();
        let mut last = start;
        let mut done = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if done {
                // Read the body to its end so the connection can carry the next request.
                continue;
            }
            pending.extend_from_slice(&data);
            while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = pending.drain(..end + 2).collect();
                let Some(payload) = event.strip_prefix(b"data: ") else {
                    continue;
                };
                let payload = payload.trim_ascii_end();
                if payload == b"[DONE]" {
                    done = true;
                    break;
                }
                let v: Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
                if let Some(e) = v.get("error") {
                    return Err(e.to_string());
                }
                if v["choices"].as_array().is_some_and(Vec::is_empty) {
                    continue; // The final usage chunk.
                }
                let total = v["usage"]["completion_tokens"].as_u64().unwrap_or(s.output);
                let n = total.saturating_sub(s.output);
                if n > 0 {
                    s.record(n, start, &mut last);
                }
            }
        }
        if done {
            Ok(())
        } else {
            Err("the stream ended without [DONE]".into())
        }
    }
}
