//! The HTTP listener: HTTP/1.1 and HTTP/2 (hyper's auto builder) over plain TCP or TLS (rustls,
//! the same PEM files and client authority as the gRPC server), until the stop signal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

/// The HTTPS settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum HttpServeError {
    #[error("TLS: reading {path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("TLS client authority: {0}")]
    ClientCa(String),
}

/// A TLS acceptor for the HTTP API.
#[derive(Clone)]
pub struct HttpTls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for HttpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpTls")
    }
}

fn pem_error(path: &Path, e: impl std::fmt::Display) -> HttpServeError {
    HttpServeError::Pem {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, HttpServeError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "no certificate in the file"));
    }
    Ok(certs)
}

impl HttpTls {
    /// The server's certificate chain and key; with `client_ca`, clients must present a
    /// certificate it signed (mutual TLS). Offers HTTP/2 and HTTP/1.1 by ALPN.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, HttpServeError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain = certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error(key, e))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c)?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| HttpServeError::ClientCa(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Serves `app` on `listener` until `stop` turns true; connections already open finish their
/// requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<HttpTls>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "HTTP accept");
                    continue;
                }
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let result = match tls {
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                        .await
                }
                Some(tls) => match tls.acceptor.accept(tcp).await {
                    Ok(stream) => {
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .await
                    }
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake");
                        return;
                    }
                },
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "HTTP connection");
            }
        });
    }
}
