//! `bench serve --openai-addr`: the load generator's requests sent through the OpenAI-compatible
//! HTTP API (`POST /v1/completions`, streamed) instead of gRPC, so the two front doors can be
//! measured by one client in one run. Tokens per chunk come from vLLM's
//! `stream_options.continuous_usage_stats` (each chunk carries its completion's token count).
//! Over HTTP/1.1 each client keeps its own keep-alive connection, as the `openai` SDKs do; with
//! `--openai-http2` the clients share `--connections` HTTP/2 connections (cleartext, prior
//! knowledge), as the gRPC clients share theirs.

use std::time::Instant;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use protos::v1::{GenerateRequest, generate_request};
use serde_json::{Value, json};

use crate::bench::Sample;

type Body = Full<Bytes>;

/// Where the clients send their requests, and the shared HTTP/2 connections.
pub(crate) struct HttpTarget {
    addr: String,
    key: Option<String>,
    /// With HTTP/2: the connections the clients share, round robin.
    h2: Vec<http2::SendRequest<Body>>,
}

impl HttpTarget {
    /// The API at `addr` (`host:port`); with `http2`, `connections` HTTP/2 connections made now.
    pub(crate) async fn connect(
        addr: &str,
        key: Option<&str>,
        http2: bool,
        connections: usize,
    ) -> Result<Self, String> {
        let addr = addr.trim_start_matches("http://").to_owned();
        let mut h2 = Vec::new();
        if http2 {
            for _ in 0..connections.max(1) {
                let tcp = tcp(&addr).await?;
                let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                    .await
                    .map_err(|e| format!("HTTP/2 handshake with {addr}: {e}"))?;
                tokio::spawn(conn);
                h2.push(send);
            }
        }
        Ok(Self {
            addr,
            key: key.map(str::to_owned),
            h2,
        })
    }

    /// Client `i`'s connection: its own HTTP/1.1 one (made on first use), or a shared HTTP/2 one.
    pub(crate) fn conn(&self, i: usize) -> HttpConn {
        HttpConn {
            addr: self.addr.clone(),
            key: self.key.clone(),
            send: match self.h2.len() {
                0 => Sender::H1(None),
                n => Sender::H2(self.h2[i % n].clone()),
            },
        }
    }
}

async fn tcp(addr: &str) -> Result<tokio::net::TcpStream, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

enum Sender {
    H1(Option<http1::SendRequest<Body>>),
    H2(http2::SendRequest<Body>),
}

/// One client's connection to the API.
pub(crate) struct HttpConn {
    addr: String,
    key: Option<String>,
    send: Sender,
}

impl HttpConn {
    async fn send(
        &mut self,
        req: hyper::Request<Body>,
    ) -> Result<hyper::Response<Incoming>, String> {
        match &mut self.send {
            Sender::H1(send) => {
                if send.as_ref().is_none_or(|s| s.is_closed()) {
                    let (s, conn) = http1::handshake(TokioIo::new(tcp(&self.addr).await?))
                        .await
                        .map_err(|e| e.to_string())?;
                    tokio::spawn(conn);
                    *send = Some(s);
                }
                let send = send.as_mut().ok_or("no connection")?;
                send.send_request(req).await.map_err(|e| e.to_string())
            }
            Sender::H2(send) => {
                send.ready().await.map_err(|e| e.to_string())?;
                send.send_request(req).await.map_err(|e| e.to_string())
            }
        }
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
        // HTTP/2 takes the scheme and authority from the URI (its pseudo-headers).
        let uri = match self.send {
            Sender::H1(_) => "/v1/completions".to_owned(),
            Sender::H2(_) => format!("http://{}/v1/completions", self.addr),
        };
        let mut builder = hyper::Request::post(uri)
            .header(hyper::header::HOST, self.addr.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(k) = &self.key {
            builder = builder.header(hyper::header::AUTHORIZATION, format!("Bearer {k}"));
        }
        let request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = self.send(request).await?;
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
