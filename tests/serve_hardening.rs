//! End to end, a server facing hostile or careless users and crashes: nothing left behind after a
//! SIGKILL, a worker without a gateway leaves on SIGTERM, bounded and well-coded errors, the API
//! key, TLS and mutual TLS, and logs fit for people and collectors.
//!
//! The servers run the `null` device over the tiny-llama config (no math: fast and deterministic),
//! or the demo model where text is needed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, collect, greedy_ids, ids_of, runtime, signal, tiny_llama};
use protos::v1::inference_client::InferenceClient;
use protos::v1::{
    ChatMessages, GenerateRequest, ModelInfoRequest, TokenizeRequest, generate_request,
    tokenize_request,
};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

fn null_args(model: &str) -> Vec<&str> {
    vec!["--model", model, "--device", "null"]
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(ringbuf::unique_name(&format!("rs-hard-{tag}")));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn shm_exists(name: &str) -> bool {
    Path::new("/dev/shm").join(name).exists()
}

#[test]
fn the_next_serve_reaps_a_killed_gateways_segments_and_socket_but_not_a_live_ones() {
    let model = tiny_llama().to_str().unwrap().to_owned();
    // A prefix and a socket folder of this test's own: servers of other tests running beside it
    // reap only their own prefix's leftovers and sockets in their own folder.
    let prefix = format!("rs-reap-{}", std::process::id());
    let runtime_dir = temp_dir("reap-sockets");
    let env = [("RINGSERVE_RUNTIME_DIR", runtime_dir.as_path())];
    let args = |extra: &[&'static str], prefix: &str| -> Vec<String> {
        let mut a: Vec<String> = null_args(&model).iter().map(|s| s.to_string()).collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend(["--shm-prefix".to_owned(), prefix.to_owned()]);
        a
    };
    let start = |a: Vec<String>, workers: usize| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Server::start_with_env(&a, workers, &env)
    };
    let mut killed = start(args(&["--workers", "2"], &prefix), 2);
    let live = start(args(&[], &prefix), 1);
    let killed_segments = killed.leftover_segments();
    let live_segments = live.leftover_segments();
    assert_eq!(killed_segments.len(), 4, "{killed_segments:?}");
    assert_eq!(live_segments.len(), 2, "{live_segments:?}");
    assert!(killed.rings.starts_with(&format!("{prefix}.")));

    signal(killed.child.id(), "KILL");
    killed.wait_exit(Duration::from_secs(10)).unwrap();
    // Its workers notice the dead gateway and leave; what the gateway created stays behind.
    let workers = killed.worker_pids.clone();
    assert!(wait_until(Duration::from_secs(20), || {
        workers.iter().all(|&p| !ringbuf::process_alive(p))
    }));
    assert_eq!(killed.leftover_segments().len(), 4);
    assert!(Path::new(&killed.join).exists(), "{}", killed.join);

    // Join sockets younger than 2 s are never reaped (their gateway may be starting).
    std::thread::sleep(Duration::from_millis(2500));
    // A server of another prefix leaves this prefix's segments alone (it does reap the socket:
    // sockets are told apart by their folder).
    let other = start(args(&[], &format!("{prefix}-other")), 1);
    assert_eq!(killed.leftover_segments().len(), 4);
    drop(other);
    let next = start(args(&[], &prefix), 1);
    assert!(
        killed.leftover_segments().is_empty(),
        "left: {:?}",
        killed.leftover_segments()
    );
    assert!(!Path::new(&killed.join).exists());
    assert!(live_segments.iter().all(|s| shm_exists(s)));
    assert!(Path::new(&live.join).exists());
    runtime().block_on(async {
        for server in [&live, &next] {
            let mut client = server.client().await;
            let out = collect(&mut client, greedy_ids(&[1, 2, 3], 4))
                .await
                .unwrap();
            assert_eq!(ids_of(&out).len(), 4);
        }
    });
    drop((live, next));
    let _ = std::fs::remove_dir_all(&runtime_dir);
}

#[test]
fn a_bad_shm_prefix_is_refused_by_name() {
    let model = tiny_llama();
    for bad in ["", "a.b", "a/b", &"x".repeat(65)] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
            .arg("serve")
            .arg("--model")
            .arg(&model)
            .args(["--device", "null", "--shm-prefix", bad])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--shm-prefix"), "{bad:?}: {err}");
    }
}

/// A child process killed when the test ends, whatever happened.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_worker_whose_gateway_is_gone_leaves_on_sigterm_and_unlinks_its_rings() {
    let model = tiny_llama();
    let rings = ringbuf::unique_name("rs-hard-orphan");
    let worker = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(["worker", "--model"])
        .arg(&model)
        .args(["--device", "null", "--rings", &rings])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut worker = KillOnDrop(worker);
    let (req, resp) = (format!("{rings}-req"), format!("{rings}-resp"));
    assert!(
        wait_until(Duration::from_secs(60), || shm_exists(&req)
            && shm_exists(&resp)),
        "the worker created its rings"
    );
    // Let it reach its serving loop (it writes its Hello into the response ring).
    std::thread::sleep(Duration::from_millis(500));
    signal(worker.0.id(), "TERM");
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            status = worker.0.try_wait().unwrap();
            status.is_some()
        }),
        "the worker ignored SIGTERM"
    );
    assert!(status.unwrap().success(), "{status:?}");
    assert!(!shm_exists(&req) && !shm_exists(&resp));
}

/// Calls with a protobuf message the generated client cannot build: `request_id` as raw bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    request_id: Vec<u8>,
    #[prost(string, tag = "2")]
    text: String,
}

async fn raw_generate(url: &str, raw: RawRequest) -> tonic::Status {
    let channel = Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<RawRequest, protos::v1::GenerateResponse>::default();
    let path = http::uri::PathAndQuery::from_static("/ringserve.v1.Inference/Generate");
    match grpc
        .server_streaming(tonic::Request::new(raw), path, codec)
        .await
    {
        Ok(mut stream) => loop {
            match stream.get_mut().message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the request succeeded"),
                Err(status) => break status,
            }
        },
        Err(status) => status,
    }
}

fn chat(messages: Vec<protos::v1::ChatMessage>) -> ChatMessages {
    ChatMessages { messages }
}

#[test]
fn client_errors_are_client_statuses_and_inputs_are_bounded() {
    let server = Server::start(&[], 1);
    runtime().block_on(async {
        let mut client = server.client().await;
        // Over the 4 MiB message limit: RESOURCE_EXHAUSTED, not OUT_OF_RANGE.
        let huge = GenerateRequest {
            prompt: Some(generate_request::Prompt::Text("a".repeat(5 << 20))),
            ..Default::default()
        };
        let e = collect(&mut client, huge).await.unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        // A string field that is not UTF-8: INVALID_ARGUMENT, not INTERNAL.
        let bad = RawRequest {
            request_id: vec![0xff, 0xfe, b'x'],
            text: "hello".into(),
        };
        let e = raw_generate(&server.url, bad).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        // A 3 MB request id would be echoed in every message.
        let mut long_id = greedy_ids(&[1, 2, 3], 300);
        long_id.request_id = "x".repeat(3 << 20);
        let e = collect(&mut client, long_id).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("request_id:") && e.message().contains("128"));
        // Thousands of stop strings.
        let mut stops = greedy_ids(&[1, 2, 3], 10);
        stops.stop = vec!["y".repeat(400); 9000];
        let e = collect(&mut client, stops).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("stop:"), "{}", e.message());
        // Tokenize and Generate agree on an empty chat and name the valid roles alike.
        let e = client
            .tokenize(TokenizeRequest {
                input: Some(tokenize_request::Input::Chat(chat(vec![]))),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("input.chat.messages: empty"));
        let wizard = vec![protos::v1::ChatMessage {
            role: "wizard".into(),
            content: "hi".into(),
        }];
        let e = client
            .tokenize(TokenizeRequest {
                input: Some(tokenize_request::Input::Chat(chat(wizard.clone()))),
            })
            .await
            .unwrap_err();
        assert!(e.message().contains("expected one of"), "{}", e.message());
        let g = GenerateRequest {
            prompt: Some(generate_request::Prompt::Chat(chat(wizard))),
            ..Default::default()
        };
        let e2 = collect(&mut client, g).await.unwrap_err();
        assert_eq!(
            e.message().trim_start_matches("input."),
            e2.message().trim_start_matches("prompt.")
        );
        // The server still serves.
        let ok = collect(&mut client, greedy_ids(&[1, 2, 3], 3))
            .await
            .unwrap();
        assert_eq!(ids_of(&ok).len(), 3);
    });
}

async fn connect_with_key(url: &str, key: Option<&str>) -> gateway::connect::Client {
    let security = gateway::connect::ClientSecurity {
        api_key: key.map(str::to_owned),
        ..Default::default()
    };
    let channel = gateway::connect::channel(url, &security).await.unwrap();
    gateway::connect::client(channel, &security).unwrap()
}

#[test]
fn the_api_key_guards_every_call_but_health_and_is_never_logged() {
    let dir = temp_dir("key");
    let key_file = dir.join("key");
    let key = "k3y-0f-the-t3st";
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let log = dir.join("serve.log");
    let model = tiny_llama().to_str().unwrap().to_owned();
    let args = [
        null_args(&model),
        vec!["--api-key-file", key_file.to_str().unwrap()],
    ]
    .concat();
    let server = Server::start_logged(&args, 1, &[("RUST_LOG", Path::new("debug"))], Some(&log));
    runtime().block_on(async {
        for presented in [None, Some("wrong"), Some("k3y-0f-the-t3s")] {
            let mut client = connect_with_key(&server.url, presented).await;
            let e = collect_generic(&mut client).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{presented:?}: {e:?}");
            let e = client.model_info(ModelInfoRequest {}).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
            let e = client
                .tokenize(TokenizeRequest {
                    input: Some(tokenize_request::Input::Text("hi".into())),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated);
        }
        // Reflection is guarded too; health is not.
        let channel = Channel::from_shared(server.url.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut reflection =
            tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(
                channel,
            );
        let e = reflection
            .server_reflection_info(tokio_stream::iter(vec![]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        common::wait_health(
            &server,
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            Duration::from_secs(10),
        )
        .await;
        let mut client = connect_with_key(&server.url, Some(key)).await;
        let out = collect_generic(&mut client).await.unwrap();
        assert_eq!(ids_of(&out).len(), 3);
    });
    // The CLI client takes the key from its flag.
    let addr = server.url.clone();
    let cli = |key: &str| {
        Command::new(env!("CARGO_BIN_EXE_ringserve"))
            .args(["client", "--addr", &addr, "--token-ids", "--print-ids"])
            .args(["--max-tokens", "2", "--api-key", key, "1 2 3"])
            .env_remove("RINGSERVE_API_KEY")
            .output()
            .unwrap()
    };
    assert!(cli(key).status.success());
    let refused = cli("nope");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("API key"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("call refused"), "debug logs were written");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log that is not a terminal"
    );
    assert!(!text.contains(key), "the key was logged");
    assert!(
        !text.contains("k3y-0f-the-t3s"),
        "a presented key was logged"
    );
    drop(server);
    std::fs::remove_dir_all(&dir).unwrap();
}

async fn collect_generic(
    client: &mut gateway::connect::Client,
) -> Result<Vec<protos::v1::GenerateResponse>, tonic::Status> {
    let mut stream = client
        .generate(greedy_ids(&[1, 2, 3], 3))
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(msg) = stream.message().await? {
        out.push(msg);
    }
    Ok(out)
}

/// A certificate authority and what it signs, as PEM files in `dir`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Writes `NAME-ca.pem`, and `server.pem`/`server.key` for 127.0.0.1 and localhost, and
    /// `NAME-client.pem`/`NAME-client.key`, each signed by `NAME`'s authority.
    fn authority(&self, name: &str, server: bool) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        std::fs::write(self.dir.join(format!("{name}-ca.pem")), ca_cert.pem()).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let sign = |file: &str, sans: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(sans)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            std::fs::write(self.dir.join(format!("{file}.pem")), cert.pem()).unwrap();
            std::fs::write(self.dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        };
        if server {
            sign("server", vec!["127.0.0.1".into(), "localhost".into()]);
        }
        sign(&format!("{name}-client"), vec!["client".into()]);
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_str().unwrap().to_owned()
    }

    fn read(&self, file: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(file)).unwrap()
    }

    /// Connects to `url` trusting `ca` and presenting `client`'s certificate, if any.
    async fn connect(&self, url: &str, ca: &str, client: Option<&str>) -> Result<Channel, String> {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(self.read(ca)));
        if let Some(c) = client {
            let id = Identity::from_pem(
                self.read(&format!("{c}.pem")),
                self.read(&format!("{c}.key")),
            );
            tls = tls.identity(id);
        }
        let endpoint = Endpoint::from_shared(url.to_owned())
            .unwrap()
            .tls_config(tls)
            .map_err(|e| e.to_string())?;
        endpoint.connect().await.map_err(|e| format!("{e:?}"))
    }
}

/// The status of `GET /v1/models` over HTTPS to the HTTP API at `addr`, trusting `ca` and
/// presenting `client`'s certificate, if any; `Err` when the handshake or the exchange fails.
async fn https_status(
    pki: &Pki,
    addr: &str,
    ca: &str,
    client: Option<&str>,
) -> Result<u16, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    let certs = |file: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(pki.path(file))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(ca) {
        roots.add(c).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some(c) => {
            let key = PrivateKeyDer::from_pem_file(pki.path(&format!("{c}.key"))).unwrap();
            builder
                .with_client_auth_cert(certs(&format!("{c}.pem")), key)
                .unwrap()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(b"GET /v1/models HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status in {text:?}"))
}

/// Whether a greedy request over `channel` completes.
async fn serves(channel: Result<Channel, String>) -> Result<(), String> {
    let mut client = InferenceClient::new(channel?);
    collect(&mut client, greedy_ids(&[1, 2, 3], 3))
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

#[test]
fn tls_and_mutual_tls_admit_only_trusted_peers() {
    let pki = Pki {
        dir: temp_dir("tls"),
    };
    pki.authority("good", true);
    pki.authority("rogue", false);
    let model = tiny_llama().to_str().unwrap().to_owned();
    let (cert, key, ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("good-ca.pem"),
    );

    let tls_args = [
        null_args(&model),
        vec!["--tls-cert", &cert, "--tls-key", &key],
    ]
    .concat();
    let tls = Server::start(&tls_args, 1);
    let https = tls.url.replace("http://", "https://");
    runtime().block_on(async {
        serves(pki.connect(&https, "good-ca.pem", None).await)
            .await
            .unwrap();
        let wrong_ca = serves(pki.connect(&https, "rogue-ca.pem", None).await).await;
        assert!(
            wrong_ca.is_err(),
            "a server cert from an untrusted CA was accepted"
        );
        let plain = serves(
            Channel::from_shared(tls.url.clone())
                .unwrap()
                .connect()
                .await
                .map_err(|e| e.to_string()),
        )
        .await;
        assert!(plain.is_err(), "plain HTTP/2 reached a TLS server");
        // The HTTP API serves TLS with the same files.
        let http = tls.http_addr.clone();
        assert_eq!(
            https_status(&pki, &http, "good-ca.pem", None).await,
            Ok(200)
        );
        assert!(
            https_status(&pki, &http, "rogue-ca.pem", None)
                .await
                .is_err()
        );
        let plain = {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(&http).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n");
            let mut raw = Vec::new();
            let _ = s.read_to_end(&mut raw);
            raw
        };
        assert!(
            !plain.starts_with(b"HTTP/1.1 200"),
            "plain HTTP reached a TLS server"
        );
    });
    drop(tls);

    let mtls_args = [tls_args.clone(), vec!["--tls-client-ca", &ca]].concat();
    let mtls = Server::start(&mtls_args, 1);
    let https = mtls.url.replace("http://", "https://");
    runtime().block_on(async {
        serves(
            pki.connect(&https, "good-ca.pem", Some("good-client"))
                .await,
        )
        .await
        .unwrap();
        let none = serves(pki.connect(&https, "good-ca.pem", None).await).await;
        assert!(none.is_err(), "a client without a certificate was admitted");
        let rogue = serves(
            pki.connect(&https, "good-ca.pem", Some("rogue-client"))
                .await,
        )
        .await;
        assert!(
            rogue.is_err(),
            "a client certificate from another CA was admitted"
        );
        let http = mtls.http_addr.clone();
        assert_eq!(
            https_status(&pki, &http, "good-ca.pem", Some("good-client")).await,
            Ok(200)
        );
        let none = https_status(&pki, &http, "good-ca.pem", None).await;
        assert!(
            none.is_err(),
            "an HTTPS client without a certificate was admitted: {none:?}"
        );
        let rogue = https_status(&pki, &http, "good-ca.pem", Some("rogue-client")).await;
        assert!(
            rogue.is_err(),
            "an HTTPS client of another CA was admitted: {rogue:?}"
        );
    });
    // The CLI client: --tls-ca, an https address and its own certificate.
    let run = |with_cert: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringserve"));
        cmd.args(["client", "--addr", &https, "--tls-ca", &ca])
            .args(["--token-ids", "--print-ids", "--max-tokens", "2", "1 2 3"]);
        if with_cert {
            cmd.args(["--tls-cert", &pki.path("good-client.pem")])
                .args(["--tls-key", &pki.path("good-client.key")]);
        }
        cmd.output().unwrap()
    };
    let ok = run(true);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(!run(false).status.success());
    drop(mtls);

    // A key that does not exist is one clear error before anything starts.
    let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .arg("serve")
        .args(null_args(&model))
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"])
        .args(["--tls-cert", &cert, "--tls-key", "/nonexistent/server.key"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/server.key"), "{err}");
    std::fs::remove_dir_all(&pki.dir).unwrap();
}

#[test]
fn errors_are_one_line_without_backtraces_and_json_logs_parse() {
    // A user's mistake: one line plus its causes, no backtrace, no colour codes.
    let out = Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args([
            "generate",
            "--model",
            "/nonexistent/model",
            "--input",
            "/dev/null",
        ])
        .args(["--output", "/dev/null"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: "), "{err}");
    assert!(!err.to_lowercase().contains("backtrace"), "{err}");
    assert!(err.lines().count() <= 4, "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes on a pipe: {err}");

    let dir = temp_dir("json");
    let log = dir.join("serve.log");
    let model = tiny_llama().to_str().unwrap().to_owned();
    let args = [null_args(&model), vec!["--log-format", "json"]].concat();
    let server = Server::start_logged(
        &args,
        1,
        &[("RUST_LOG", Path::new("gateway=debug,info"))],
        Some(&log),
    );
    runtime().block_on(async {
        let mut client = server.client().await;
        let mut req = greedy_ids(&[1, 2, 3], 3);
        req.request_id = "json-log-probe".into();
        collect(&mut client, req).await.unwrap();
    });
    assert!(server.wait_metric(
        "ringserve_requests_total{outcome=\"finished_length\"}",
        Duration::from_secs(10),
        |v| v == 1.0
    ));
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut probe = false;
    let mut lines = 0;
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        for key in ["timestamp", "level", "target"] {
            assert!(v.get(key).is_some(), "{key} missing: {line}");
        }
        probe |= v["request_id"] == "json-log-probe";
        lines += 1;
    }
    assert!(lines > 3, "{text}");
    assert!(probe, "no line carries the request id: {text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
