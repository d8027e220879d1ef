//! Helpers for the end-to-end serving tests: start `ringserve serve` on free ports, talk to it,
//! read its metrics, signal it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use protos::v1::inference_client::InferenceClient;
use protos::v1::{GenerateRequest, GenerateResponse, SamplingParams, TokenIds, generate_request};
use tonic::transport::Channel;

/// The tiny-llama fixture's folder.
pub fn tiny_llama() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

/// The fixture's cases: (prompt, greedy tokens).
pub fn tiny_llama_cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    let text = std::fs::read_to_string(tiny_llama().join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt"]), ids(&c["greedy"])))
        .collect()
}

/// Writes the demo model into `dir` with `ringserve demo-model`.
pub fn write_demo(dir: &std::path::Path) {
    let ok = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(["demo-model", "--out"])
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ringserve demo-model");
}

/// A running `ringserve serve`.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The OpenAI-compatible HTTP API's `127.0.0.1:PORT`.
    pub http_addr: String,
    pub metrics_addr: String,
    /// The prefix of every shared-memory segment this server made.
    pub rings: String,
    /// The join socket's path.
    pub join: String,
    lines: mpsc::Receiver<String>,
    /// Worker pids by slot, as announced.
    pub worker_pids: Vec<u32>,
    /// With tensor parallelism: every rank's pid by slot (rank 0 first), as announced.
    pub group_pids: Vec<Vec<u32>>,
}

impl Server {
    /// Starts `ringserve serve --addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 ARGS` and waits until
    /// `workers` workers are ready.
    pub fn start(args: &[&str], workers: usize) -> Server {
        Self::start_with_env(args, workers, &[])
    }

    /// [`Server::start`] with extra environment variables for the server process.
    pub fn start_with_env(
        args: &[&str],
        workers: usize,
        env: &[(&str, &std::path::Path)],
    ) -> Server {
        Self::start_logged(args, workers, env, None)
    }

    /// [`Server::start_with_env`], writing the server's stderr (its log) to `log` when given.
    pub fn start_logged(
        args: &[&str],
        workers: usize,
        env: &[(&str, &std::path::Path)],
        log: Option<&std::path::Path>,
    ) -> Server {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("creating the log file")),
            None => Stdio::inherit(),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_ringserve"))
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .arg("serve")
            .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawning ringserve serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            url: String::new(),
            http_addr: String::new(),
            metrics_addr: String::new(),
            rings: String::new(),
            join: String::new(),
            lines: rx,
            worker_pids: vec![0; workers],
            group_pids: vec![Vec::new(); workers],
        };
        let listening = server
            .wait_line(|l| l.starts_with("listening "), Duration::from_secs(120))
            .expect("serve printed its addresses");
        for field in listening.split_whitespace() {
            if let Some(a) = field.strip_prefix("grpc=") {
                server.url = format!("http://{a}");
            } else if let Some(a) = field.strip_prefix("http=") {
                server.http_addr = a.to_owned();
            } else if let Some(a) = field.strip_prefix("metrics=") {
                server.metrics_addr = a.to_owned();
            } else if let Some(r) = field.strip_prefix("rings=") {
                server.rings = r.to_owned();
            } else if let Some(j) = field.strip_prefix("join=") {
                server.join = j.to_owned();
            }
        }
        for _ in 0..workers {
            server.wait_worker_ready(Duration::from_secs(120));
        }
        server
    }

    /// Waits for a `worker N ready pid=P [ranks=P0,P1,..]` line; returns (N, P).
    pub fn wait_worker_ready(&mut self, timeout: Duration) -> (usize, u32) {
        let line = self
            .wait_line(
                |l| l.starts_with("worker ") && l.contains(" ready pid="),
                timeout,
            )
            .expect("a worker became ready");
        let parts: Vec<&str> = line.split_whitespace().collect();
        let slot: usize = parts[1].parse().unwrap();
        let pid: u32 = parts[3].strip_prefix("pid=").unwrap().parse().unwrap();
        if slot >= self.worker_pids.len() {
            self.worker_pids.resize(slot + 1, 0);
        }
        self.worker_pids[slot] = pid;
        if slot >= self.group_pids.len() {
            self.group_pids.resize(slot + 1, Vec::new());
        }
        self.group_pids[slot] = parts
            .iter()
            .find_map(|p| p.strip_prefix("ranks="))
            .map(|r| r.split(',').map(|p| p.parse().unwrap()).collect())
            .unwrap_or_default();
        (slot, pid)
    }

    /// The next stdout line matching `pred`, within `timeout`.
    pub fn wait_line(&mut self, pred: impl Fn(&str) -> bool, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if pred(&line) => return Some(line),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// A gRPC client.
    pub async fn client(&self) -> InferenceClient<Channel> {
        InferenceClient::connect(self.url.clone()).await.unwrap()
    }

    /// The body of `GET /metrics`.
    pub fn metrics(&self) -> String {
        let mut s = TcpStream::connect(&self.metrics_addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// The sum of every sample of metric `name` (all label sets); `None` if absent.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let body = self.metrics();
        let mut found = None;
        for line in body.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            if !(rest.starts_with(' ') || rest.starts_with('{')) {
                continue;
            }
            if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                *found.get_or_insert(0.0) += v;
            }
        }
        found
    }

    /// Polls until `pred(metric)` holds, within `timeout`.
    pub fn wait_metric(&self, name: &str, timeout: Duration, pred: impl Fn(f64) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.metric(name).is_some_and(&pred) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Sends SIGTERM to the server.
    pub fn sigterm(&self) {
        signal(self.child.id(), "TERM");
    }

    /// Waits for the server to exit; returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Shared-memory segments of this server still in /dev/shm.
    pub fn leftover_segments(&self) -> Vec<String> {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !self.rings.is_empty() && n.starts_with(&self.rings))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.sigterm();
            if self.wait_exit(Duration::from_secs(20)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// Sends `kill -SIG pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill -{sig} {pid}");
}

/// A greedy request for `prompt` that runs to `max_tokens` (EOS ignored).
pub fn greedy(prompt: generate_request::Prompt, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(prompt),
        sampling: Some(SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        }),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// A greedy token-id request.
pub fn greedy_ids(prompt: &[u32], max_tokens: u32) -> GenerateRequest {
    greedy(
        generate_request::Prompt::TokenIds(TokenIds {
            ids: prompt.to_vec(),
        }),
        max_tokens,
    )
}

/// Runs a request to its end; returns every message.
pub async fn collect(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
) -> Result<Vec<GenerateResponse>, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.message().await? {
        out.push(msg);
    }
    Ok(out)
}

/// All token ids of a stream.
pub fn ids_of(msgs: &[GenerateResponse]) -> Vec<u32> {
    msgs.iter().flat_map(|m| m.token_ids.clone()).collect()
}

/// A multi-threaded runtime for a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Polls the server's `grpc.health.v1` status for the whole server until it is `want` (every
/// 25 ms, for at most `timeout`); panics with the last status otherwise.
pub async fn wait_health(
    server: &Server,
    want: tonic_health::pb::health_check_response::ServingStatus,
    timeout: Duration,
) {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = Channel::from_shared(server.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let mut status = None;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let s = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        if s == want as i32 {
            return;
        }
        status = Some(s);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("health stayed {status:?}, never {want:?}");
}

/// An HTTP/1.1 response: status, headers (lower-case names) and body (de-chunked).
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{e}: not JSON: {:?}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent-event body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("an event that is not `data: `: {e:?}"))
                    .to_owned()
            })
            .collect()
    }
}

/// Sends one HTTP/1.1 request (`Connection: close`) and reads the whole response.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> HttpResponse {
    let mut s = TcpStream::connect(addr).expect("connecting to the HTTP API");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or(""));
    // A server that refuses a request early (413 for an oversized body) may answer and close before
    // the whole body is written: the write then fails with a broken pipe or a reset, and what it
    // answered is still there to read.
    if let Err(e) = s.write_all(req.as_bytes()) {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "writing the request: {e}"
        );
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            // The same early close can end the answer with a reset once it has been received.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !raw.is_empty() => break,
            Err(e) => panic!("reading the response: {e}"),
        }
    }
    parse_http(&raw)
}

/// POSTs a JSON body.
pub fn http_post(addr: &str, path: &str, body: &serde_json::Value) -> HttpResponse {
    http(addr, "POST", path, Some(&body.to_string()), &[])
}

fn parse_http(raw: &[u8]) -> HttpResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP header");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut out = Vec::new();
        loop {
            let end = rest
                .windows(2)
                .position(|w| w == b"\r\n")
                .expect("a chunk size");
            let size_text = String::from_utf8_lossy(&rest[..end]).into_owned();
            let size = usize::from_str_radix(size_text.trim(), 16).expect("a hex chunk size");
            rest = &rest[end + 2..];
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        out
    } else {
        rest.to_vec()
    };
    HttpResponse {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}
