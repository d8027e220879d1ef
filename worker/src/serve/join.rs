//! The worker's side of the join rendezvous (see [`protos::join`]): register with a running
//! gateway by name and learn the rings it created for this worker.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use protos::join::{self, JoinError, JoinReply, JoinRequest, MAX_LINE};
use thiserror::Error;

/// How long the gateway may take to answer.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Registering with a gateway failed.
#[derive(Debug, Error)]
pub enum JoinClientError {
    #[error(transparent)]
    Protocol(#[from] JoinError),
    #[error("no gateway named {name:?} is running here ({path}): {source}")]
    NotRunning {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a socket owned by this user (uid {uid}); refusing to join")]
    NotOurs { path: PathBuf, uid: u32 },
    #[error("talking to the gateway: {0}")]
    Io(#[from] std::io::Error),
    #[error("the gateway refused the join: {0}")]
    Refused(String),
}

/// This process's effective user id.
pub fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Registers this process with gateway `name`; returns its slot and its rings' name prefix.
pub fn register(name: &str) -> Result<(usize, String), JoinClientError> {
    let uid = current_uid();
    let path = join::socket_path(name, uid)?;
    let meta = std::fs::symlink_metadata(&path).map_err(|source| JoinClientError::NotRunning {
        name: name.to_owned(),
        path: path.clone(),
        source,
    })?;
    if !meta.file_type().is_socket() || meta.uid() != uid {
        return Err(JoinClientError::NotOurs { path, uid });
    }
    let mut stream = UnixStream::connect(&path).map_err(|source| JoinClientError::NotRunning {
        name: name.to_owned(),
        path: path.clone(),
        source,
    })?;
    stream.set_read_timeout(Some(JOIN_TIMEOUT))?;
    stream.set_write_timeout(Some(JOIN_TIMEOUT))?;
    stream.write_all(JoinRequest::new(std::process::id()).to_line().as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream.take(MAX_LINE as u64)).read_line(&mut line)?;
    match JoinReply::parse(&line)? {
        JoinReply::Ok { slot, rings } => Ok((slot, rings)),
        JoinReply::Refused(why) => Err(JoinClientError::Refused(why)),
    }
}
