//! How clients (`ringserve client`, `bench serve`) reach a server: a plain or TLS channel, and the
//! API key on every call.
//!
//! `https://` addresses use TLS: the server's certificate is checked against `tls_ca` when given,
//! else against the system's roots; `tls_cert` + `tls_key` present a client certificate to a
//! server that asks for one (mutual TLS). `http://` addresses are plain and refuse TLS options.

use std::path::{Path, PathBuf};

use protos::v1::inference_client::InferenceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A client's credentials and trust.
#[derive(Debug, Clone, Default)]
pub struct ClientSecurity {
    /// Sent as `authorization: Bearer KEY` on every call.
    pub api_key: Option<String>,
    /// PEM certificate(s) of the authority that signed the server's certificate.
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate presented to the server (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
}

/// A connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("address {addr}: {source}")]
    Address {
        addr: String,
        source: tonic::transport::Error,
    },
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Options(String),
    #[error("TLS settings: {0}")]
    Tls(tonic::transport::Error),
    #[error("connecting to {addr}: {source}")]
    Connect {
        addr: String,
        source: tonic::transport::Error,
    },
}

/// Adds the API key, when there is one, to every call.
#[derive(Debug, Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

impl Bearer {
    /// The interceptor for `api_key`.
    pub fn new(api_key: Option<&str>) -> Result<Self, ConnectError> {
        api_key
            .map(|k| {
                format!("Bearer {}", k.trim())
                    .parse()
                    .map_err(|_| ConnectError::Options("--api-key: not printable ASCII".into()))
            })
            .transpose()
            .map(Self)
    }
}

/// An `Inference` client over a channel, with the API key on each call.
pub type Client = InferenceClient<InterceptedService<Channel, Bearer>>;

fn read(path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The endpoint for `addr` with `security`'s TLS settings.
pub fn endpoint(addr: &str, security: &ClientSecurity) -> Result<Endpoint, ConnectError> {
    let endpoint =
        Endpoint::from_shared(addr.to_owned()).map_err(|source| ConnectError::Address {
            addr: addr.to_owned(),
            source,
        })?;
    let tls = addr.starts_with("https://");
    let s = security;
    if !tls && (s.tls_ca.is_some() || s.tls_cert.is_some()) {
        return Err(ConnectError::Options(format!(
            "--tls-ca/--tls-cert need an https:// address, not {addr}"
        )));
    }
    if s.tls_cert.is_some() != s.tls_key.is_some() {
        return Err(ConnectError::Options(
            "--tls-cert and --tls-key go together".into(),
        ));
    }
    if !tls {
        return Ok(endpoint);
    }
    let mut config = ClientTlsConfig::new();
    config = match &s.tls_ca {
        Some(ca) => config.ca_certificate(Certificate::from_pem(read(ca)?)),
        None => config.with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (&s.tls_cert, &s.tls_key) {
        config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
    }
    endpoint.tls_config(config).map_err(ConnectError::Tls)
}

/// Connects one channel to `addr`.
pub async fn channel(addr: &str, security: &ClientSecurity) -> Result<Channel, ConnectError> {
    endpoint(addr, security)?
        .connect()
        .await
        .map_err(|source| ConnectError::Connect {
            addr: addr.to_owned(),
            source,
        })
}

/// An `Inference` client on `channel` that presents `security`'s API key.
pub fn client(channel: Channel, security: &ClientSecurity) -> Result<Client, ConnectError> {
    let bearer = Bearer::new(security.api_key.as_deref())?;
    Ok(InferenceClient::with_interceptor(channel, bearer))
}

/// `host:port` becomes `http://host:port`; an address with a scheme stays as it is.
pub fn with_scheme(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}
