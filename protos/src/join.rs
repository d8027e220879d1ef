//! The join rendezvous: how a worker started on its own (`ringserve worker --join NAME`) registers
//! with a running gateway (`ringserve serve --name NAME`).
//!
//! The gateway listens on a Unix socket `RUNTIME_DIR/NAME.sock` (directory mode 0700, socket mode
//! 0600, both owned by the gateway's user; a peer of another uid is refused by its credentials).
//! The worker, its model loaded, connects and sends one line; the gateway creates the worker's two
//! rings, answers with one line naming them, and closes the connection. The worker then attaches
//! the rings and writes its Hello there, as a supervised worker does.
//!
//! ```text
//! worker  → gateway   ringserve-join 1 wire=3 pid=4242
//! gateway → worker    ok slot=2 rings=ringserve-123-abc-j2
//!                     error <reason>
//! ```
//!
//! Lines are ASCII, at most [`MAX_LINE`] bytes; anything else is an error, never a panic.

use std::path::PathBuf;

use thiserror::Error;

use crate::records::WIRE_VERSION;

/// Version of this rendezvous protocol.
pub const JOIN_VERSION: u32 = 1;

/// Longest line either side sends or accepts, newline included.
pub const MAX_LINE: usize = 512;

/// A join line could not be parsed, or a name is not usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JoinError {
    #[error("malformed join line: {0}")]
    Malformed(String),
    #[error("join protocol version {got}, this build speaks {JOIN_VERSION}")]
    Version { got: u32 },
    #[error("the worker speaks ring record version {got}, the gateway {WIRE_VERSION}")]
    WireVersion { got: u16 },
    #[error(
        "gateway name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ - (not starting with '.')"
    )]
    BadName(String),
}

/// The line a worker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRequest {
    /// The worker's process id (checked against the socket's peer credentials and its Hello).
    pub pid: u32,
    /// The ring record version the worker speaks.
    pub wire: u16,
}

impl JoinRequest {
    /// A request from this build for process `pid`.
    pub fn new(pid: u32) -> Self {
        Self {
            pid,
            wire: WIRE_VERSION,
        }
    }

    /// The line, newline included.
    pub fn to_line(&self) -> String {
        format!(
            "ringserve-join {JOIN_VERSION} wire={} pid={}\n",
            self.wire, self.pid
        )
    }

    /// Parses and checks a request line (trailing newline optional).
    pub fn parse(line: &str) -> Result<Self, JoinError> {
        let bad = || JoinError::Malformed(truncate(line));
        let mut parts = line.trim_end_matches(['\n', '\r']).split(' ');
        if parts.next() != Some("ringserve-join") {
            return Err(bad());
        }
        let version: u32 = parts.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        if version != JOIN_VERSION {
            return Err(JoinError::Version { got: version });
        }
        let wire: u16 = field(parts.next(), "wire").ok_or_else(bad)?;
        let pid: u32 = field(parts.next(), "pid").ok_or_else(bad)?;
        if parts.next().is_some() || pid == 0 {
            return Err(bad());
        }
        if wire != WIRE_VERSION {
            return Err(JoinError::WireVersion { got: wire });
        }
        Ok(Self { pid, wire })
    }
}

/// The gateway's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinReply {
    /// Registered: the worker's slot and its rings' name prefix.
    Ok { slot: usize, rings: String },
    /// Refused, with the reason.
    Refused(String),
}

impl JoinReply {
    /// The line, newline included (a reason's control characters become spaces).
    pub fn to_line(&self) -> String {
        match self {
            Self::Ok { slot, rings } => format!("ok slot={slot} rings={rings}\n"),
            Self::Refused(why) => {
                let why: String = why
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .take(MAX_LINE - 8)
                    .collect();
                format!("error {why}\n")
            }
        }
    }

    /// Parses a reply line (trailing newline optional).
    pub fn parse(line: &str) -> Result<Self, JoinError> {
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(why) = line.strip_prefix("error ") {
            return Ok(Self::Refused(why.to_owned()));
        }
        let bad = || JoinError::Malformed(truncate(line));
        let mut parts = line.split(' ');
        if parts.next() != Some("ok") {
            return Err(bad());
        }
        let slot: usize = field(parts.next(), "slot").ok_or_else(bad)?;
        let rings = parts
            .next()
            .and_then(|p| p.strip_prefix("rings="))
            .filter(|r| valid_ring_prefix(r))
            .ok_or_else(bad)?
            .to_owned();
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self::Ok { slot, rings })
    }
}

fn field<T: std::str::FromStr>(part: Option<&str>, key: &str) -> Option<T> {
    part?.strip_prefix(key)?.strip_prefix('=')?.parse().ok()
}

fn truncate(line: &str) -> String {
    line.chars().take(80).collect()
}

fn valid_ring_prefix(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Checks a gateway name (it becomes a file name).
pub fn check_name(name: &str) -> Result<(), JoinError> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(JoinError::BadName(truncate(name)))
    }
}

/// The folder of the rendezvous sockets for user `uid`: `$RINGSERVE_RUNTIME_DIR` if set, else
/// `$XDG_RUNTIME_DIR/ringserve`, else `/tmp/ringserve-UID`.
pub fn runtime_dir(uid: u32) -> PathBuf {
    if let Some(dir) = std::env::var_os("RINGSERVE_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("ringserve");
    }
    PathBuf::from(format!("/tmp/ringserve-{uid}"))
}

/// The socket of gateway `name` for user `uid`.
pub fn socket_path(name: &str, uid: u32) -> Result<PathBuf, JoinError> {
    check_name(name)?;
    Ok(runtime_dir(uid).join(format!("{name}.sock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_and_rejects_garbage() {
        let r = JoinRequest::new(42);
        assert_eq!(JoinRequest::parse(&r.to_line()).unwrap(), r);
        for bad in [
            "",
            "hello",
            "ringserve-join",
            "ringserve-join x wire=3 pid=1",
            "ringserve-join 1 wire=3",
            "ringserve-join 1 wire=3 pid=0",
            "ringserve-join 1 wire=3 pid=-1",
            "ringserve-join 1 wire=3 pid=1 extra",
            "ringserve-join 1 pid=1 wire=3",
            "ringserve-join 1 wire=99999999 pid=1",
        ] {
            assert!(
                matches!(JoinRequest::parse(bad), Err(JoinError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert_eq!(
            JoinRequest::parse("ringserve-join 7 wire=3 pid=1"),
            Err(JoinError::Version { got: 7 })
        );
        assert_eq!(
            JoinRequest::parse("ringserve-join 1 wire=2 pid=1"),
            Err(JoinError::WireVersion { got: 2 })
        );
    }

    #[test]
    fn reply_round_trips() {
        let ok = JoinReply::Ok {
            slot: 3,
            rings: "ringserve-1-a_b.c-j3".into(),
        };
        assert_eq!(JoinReply::parse(&ok.to_line()).unwrap(), ok);
        let no = JoinReply::Refused("too\nmany".into());
        assert_eq!(
            JoinReply::parse(&no.to_line()).unwrap(),
            JoinReply::Refused("too many".into())
        );
        assert!(JoinReply::parse("ok slot=1 rings=../etc").is_err());
        assert!(JoinReply::parse("ok slot=1").is_err());
        assert!(JoinReply::parse("sure").is_err());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("ringserve-50051").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        let p = socket_path("gw", 1000).unwrap();
        assert!(p.ends_with("gw.sock"));
    }
}
