//! Flags of who may connect: the server's API key and TLS files, and a client's.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use gateway::auth::ApiKey;
use gateway::connect::ClientSecurity;
use gateway::server::{ServerSecurity, ServerTls};

/// `serve`: the API key every call but health must present, and TLS.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerSecurityFlags {
    /// Require `authorization: Bearer KEY` on every gRPC call but grpc.health.v1 (never logged).
    #[arg(
        long,
        env = "RINGSERVE_API_KEY",
        hide_env_values = true,
        conflicts_with = "api_key_file"
    )]
    pub api_key: Option<String>,
    /// Read the API key from this file (surrounding whitespace is trimmed).
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// Serve TLS with this PEM certificate (chain) (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this PEM authority.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl ServerSecurityFlags {
    /// The gateway's settings; the key file is read here.
    pub fn security(&self) -> anyhow::Result<ServerSecurity> {
        let key = match (&self.api_key, &self.api_key_file) {
            (Some(key), _) => Some(ApiKey::new(key).context("--api-key")?),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--api-key-file {}", path.display()))?;
                Some(
                    ApiKey::new(&text)
                        .with_context(|| format!("--api-key-file {}", path.display()))?,
                )
            }
            (None, None) => None,
        };
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.tls_client_ca.clone(),
            }),
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        Ok(ServerSecurity { api_key: key, tls })
    }
}

/// `client` and `bench serve`: the API key to present and the TLS trust.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientSecurityFlags {
    /// Send `authorization: Bearer KEY` on every call.
    #[arg(long, env = "RINGSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Trust this PEM authority for the server's certificate (with an https:// address; default:
    /// the system's roots).
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Present this PEM certificate to a server that requires client certificates (needs
    /// --tls-key).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ClientSecurityFlags {
    pub fn security(&self) -> ClientSecurity {
        ClientSecurity {
            api_key: self.api_key.clone(),
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
        }
    }
}
