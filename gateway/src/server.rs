//! The gateway process: binds the gRPC and metrics listeners, starts the supervisors, serves, and
//! shuts down gracefully on SIGTERM/SIGINT.
//!
//! Shutdown: health turns NOT_SERVING and new requests are refused with UNAVAILABLE; requests in
//! flight get up to the drain timeout to finish; then the workers are stopped, every ring segment
//! is unlinked, and the server returns.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::admission::{Admission, AdmissionLimits};
use crate::auth::ApiKey;
use crate::guard::GuardLayer;
use crate::health::Health;
use crate::join::{JoinContext, JoinListener};
use crate::openai::{ApiState, HttpServeError, HttpTls};
use crate::pipeline::Shared;
use crate::router::{AffinityConfig, Router};
use crate::service::InferenceService;
use crate::supervisor::{WorkerCommand, supervise};
use crate::tokenizer::TextModel;

/// Everything `ringserve serve` configures.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model folder (tokenizer, chat template, EOS ids are read from it).
    pub model_dir: PathBuf,
    /// The model's name in `ModelInfo`.
    pub model_name: String,
    /// gRPC address (port 0 picks a free port; the bound address is printed).
    pub addr: SocketAddr,
    /// Prometheus `/metrics` address, if any.
    pub metrics_addr: Option<SocketAddr>,
    /// The OpenAI-compatible HTTP API's address, if any (port 0 picks a free port).
    pub http_addr: Option<SocketAddr>,
    /// Worker processes (with tensor parallelism, `workers / worker.tensor_parallel_size` groups).
    pub workers: usize,
    /// How to start one (`ring_prefix` is filled in by [`run`]).
    pub worker: WorkerCommand,
    pub admission: AdmissionLimits,
    /// How long in-flight requests may take to finish once shutdown begins.
    pub drain_timeout: Duration,
    /// How long a request whose worker died waits for a live worker before `UNAVAILABLE`.
    pub failover_timeout: Duration,
    /// The name workers join by (`ringserve worker --join NAME`); default `ringserve-PORT` with
    /// the bound gRPC port.
    pub name: Option<String>,
    /// What this server's ring segment names start with (`ringbuf::unique_name(shm_prefix)`); at
    /// start only dead gateways' segments with this prefix are reaped.
    pub shm_prefix: String,
    /// How prefix affinity trades cache hits against load balance.
    pub affinity: AffinityConfig,
    /// The API key and TLS settings of the gRPC server.
    pub security: ServerSecurity,
}

/// Who may connect to the gRPC server and the HTTP API.
#[derive(Debug, Clone, Default)]
pub struct ServerSecurity {
    /// Required as `authorization: Bearer KEY` on every call but `grpc.health.v1` (and, over
    /// HTTP, `/health` and `/version`).
    pub api_key: Option<ApiKey>,
    /// Serve TLS (gRPC and HTTP) instead of plain text.
    pub tls: Option<ServerTls>,
}

/// PEM files of the server's TLS identity and, for mutual TLS, of the authority that signs the
/// clients' certificates.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With this, a client must present a certificate signed by it.
    pub client_ca: Option<PathBuf>,
}

impl ServerTls {
    /// Reads the files into tonic's (rustls') configuration.
    fn load(&self) -> Result<ServerTlsConfig, ServerError> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| ServerError::TlsFile {
                path: path.clone(),
                source,
            })
        };
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(read(&self.cert)?, read(&self.key)?));
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(config)
    }

    /// The same files as the HTTP API's rustls acceptor.
    fn load_http(&self) -> Result<HttpTls, ServerError> {
        Ok(HttpTls::load(
            &self.cert,
            &self.key,
            self.client_ca.as_deref(),
        )?)
    }
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    #[error("metrics: {0}")]
    Metrics(String),
    #[error("reflection: {0}")]
    Reflection(String),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("TLS: reading {path}: {source}")]
    TlsFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[source] tonic::transport::Error),
    #[error("join socket: {0}")]
    Join(#[from] crate::join::JoinServerError),
    #[error("HTTP API: {0}")]
    Http(#[from] HttpServeError),
    #[error("{0}")]
    Other(String),
}

/// End-of-sequence ids from `config.json` and `generation_config.json` (a number or a list), or
/// from a `.gguf` file's metadata.
pub fn model_eos_ids(dir: &std::path::Path) -> Vec<u32> {
    let mut configs = Vec::new();
    if gguf::is_gguf_path(dir) {
        configs.extend(gguf::GgufFile::open(dir).and_then(|f| f.hf_config()).ok());
    } else {
        for file in ["config.json", "generation_config.json"] {
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            configs.extend(serde_json::from_str::<serde_json::Value>(&text).ok());
        }
    }
    let mut ids = Vec::new();
    for v in configs {
        let found: Vec<u32> = match v.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => {
                n.as_u64().map(|n| n as u32).into_iter().collect()
            }
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_u64().map(|n| n as u32))
                .collect(),
            _ => Vec::new(),
        };
        for id in found {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// Router slots for `workers` processes in groups of `tensor_parallel_size` (one slot per group).
fn worker_slots(workers: usize, tensor_parallel_size: usize) -> Result<usize, ServerError> {
    if tensor_parallel_size == 0 || !workers.is_multiple_of(tensor_parallel_size) {
        return Err(ServerError::Other(format!(
            "{workers} workers cannot form groups of tensor-parallel size {tensor_parallel_size}"
        )));
    }
    Ok(workers / tensor_parallel_size)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Removes what gateways of this user that died without cleaning up (SIGKILL, OOM) left behind:
/// ring segments named `shm_prefix.*` whose creator is dead and join sockets nobody listens on.
/// A live gateway's segments and socket are never touched. Logs what it removed.
pub fn reap_leftovers(shm_prefix: &str) {
    match ringbuf::reap(&format!("{shm_prefix}.")) {
        Ok(names) if !names.is_empty() => {
            tracing::warn!(count = names.len(), segments = ?names, "removed shared-memory segments of dead gateways");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "looking for segments of dead gateways"),
    }
    let dir = crate::join::current_uid().map(protos::join::runtime_dir);
    match dir.and_then(|dir| crate::join::reap_stale_sockets(&dir)) {
        Ok(paths) if !paths.is_empty() => {
            tracing::warn!(count = paths.len(), sockets = ?paths, "removed join sockets of dead gateways");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "looking for join sockets of dead gateways"),
    }
}

/// Runs the gateway until SIGTERM/SIGINT, then drains and cleans up.
pub async fn run(mut config: ServerConfig) -> Result<(), ServerError> {
    reap_leftovers(&config.shm_prefix);
    let slots = worker_slots(config.workers, config.worker.tensor_parallel_size)?;
    // Checked before anything starts, so bad certificates are one clear error.
    let mut grpc = tonic::transport::Server::builder();
    let mut http_tls = None;
    if let Some(tls) = &config.security.tls {
        grpc = grpc.tls_config(tls.load()?).map_err(ServerError::Tls)?;
        http_tls = Some(tls.load_http()?);
    }
    let dir = config.model_dir.clone();
    let text = tokio::task::spawn_blocking(move || TextModel::load(&dir))
        .await
        .map_err(|e| ServerError::Other(e.to_string()))??
        .map(Arc::new);
    let eos = model_eos_ids(&config.model_dir);

    let metrics_bound = match config.metrics_addr {
        Some(addr) => {
            let handle = crate::metrics::install().map_err(ServerError::Metrics)?;
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })?;
            let bound = listener.local_addr().ok();
            tokio::spawn(crate::metrics::serve_metrics(listener, handle));
            bound
        }
        None => None,
    };
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| ServerError::Bind {
            addr: config.addr,
            source,
        })?;
    let grpc_bound = listener
        .local_addr()
        .map_err(|e| ServerError::Other(e.to_string()))?;
    let http_listener = match config.http_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Bind { addr, source })?,
        ),
        None => None,
    };
    let http_bound = http_listener.as_ref().and_then(|l| l.local_addr().ok());

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter).await;
    let shared = Arc::new(Shared::new(
        config.model_name.clone(),
        eos,
        text,
        Router::with_affinity(slots, config.affinity),
        Admission::new(config.admission),
        config.failover_timeout,
    ));
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(protos::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(protos::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| ServerError::Reflection(e.to_string()))?;

    let name = config
        .name
        .clone()
        .unwrap_or_else(|| format!("ringserve-{}", grpc_bound.port()));
    let join_listener = JoinListener::bind(&name)?;
    let join_path = join_listener.path().display().to_string();

    config.worker.ring_prefix = ringbuf::unique_name(&config.shm_prefix);
    let prefix = config.worker.ring_prefix.clone();
    let (stop_tx, stop_rx) = watch::channel(false);
    let join_ctx = Arc::new(JoinContext::new(
        shared.clone(),
        health.clone(),
        prefix.clone(),
        config.worker.ring_capacity,
        config.worker.heartbeat_timeout,
        slots,
    ));
    let joins = tokio::spawn(crate::join::serve(join_listener, join_ctx, stop_rx.clone()));
    let supervisors: Vec<_> = (0..slots)
        .map(|slot| {
            tokio::spawn(supervise(
                slot,
                config.worker.clone(),
                shared.clone(),
                health.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();

    let refresher = tokio::spawn(health.clone().refresh(shared.clone(), stop_rx.clone()));
    let http = http_listener.map(|listener| {
        let api = Arc::new(ApiState {
            shared: shared.clone(),
            api_key: config.security.api_key.clone(),
        });
        tokio::spawn(crate::openai::serve(
            listener,
            crate::openai::router(api),
            http_tls,
            stop_rx.clone(),
        ))
    });

    // Tests and tools read this line.
    let off = |a: Option<SocketAddr>| a.map_or_else(|| "off".to_owned(), |a| a.to_string());
    println!(
        "listening grpc={grpc_bound} http={} metrics={} rings={prefix} name={name} join={join_path}",
        off(http_bound),
        off(metrics_bound),
    );
    let security = &config.security;
    tracing::info!(
        %grpc_bound,
        ?http_bound,
        ?metrics_bound,
        workers = config.workers,
        %name,
        tls = security.tls.is_some(),
        mutual_tls = security.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        api_key = security.api_key.is_some(),
        "gateway listening"
    );

    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = {
        let shared = shared.clone();
        let health = health.clone();
        let timeout = config.drain_timeout;
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutdown requested: draining");
            // Relaxed: a plain flag; see `Shared::draining`.
            shared.draining.store(true, Ordering::Relaxed);
            health.update(&shared).await;
            let start = Instant::now();
            while shared.admission.in_flight() > 0 && start.elapsed() < timeout {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let left = shared.admission.in_flight();
            if left > 0 {
                tracing::warn!(left, "drain timeout: stopping with requests in flight");
            }
            let _ = stop_tx.send(true);
            for s in supervisors {
                let _ = s.await;
            }
            let _ = joins.await;
            let _ = refresher.await;
            // Give the streams a moment to send their last message before the server stops.
            let start = Instant::now();
            while shared.admission.in_flight() > 0 && start.elapsed() < Duration::from_secs(2) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = server_stop_tx.send(());
        })
    };

    let result = grpc
        .layer(GuardLayer::new(config.security.api_key.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(protos::v1::inference_server::InferenceServer::new(
            InferenceService::new(shared.clone()),
        ))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
            let _ = server_stop_rx.await;
        })
        .await;
    drain.abort();
    if let Some(http) = http {
        http.abort();
    }
    // Every ring was unlinked by its supervisor; remove anything a crash left behind.
    match ringbuf::reap(&prefix) {
        Ok(left) if !left.is_empty() => tracing::warn!(?left, "removed leftover segments"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "reaping segments"),
    }
    tracing::info!("gateway stopped");
    result.map_err(ServerError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_router_slot_per_group() {
        assert_eq!(worker_slots(3, 1).unwrap(), 3);
        assert_eq!(worker_slots(4, 2).unwrap(), 2);
        assert_eq!(worker_slots(4, 4).unwrap(), 1);
        assert!(worker_slots(3, 2).is_err());
        assert!(worker_slots(2, 0).is_err());
    }
}
