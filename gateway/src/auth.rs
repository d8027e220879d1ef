//! Who may call: the server's API key and the check of a request's `authorization` header.
//!
//! One check for every front door: the gRPC layer ([`crate::guard`]) calls [`ApiKey::verify`] on
//! each call's headers, and any other API served beside it calls the same function. The key is
//! compared in constant time (both sides hashed to 32 bytes first, so not even its length leaks)
//! and never printed: its `Debug` is redacted.

use http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Bytes of an API key at most.
pub const MAX_API_KEY_LEN: usize = 4096;

/// The key is unusable, or a request does not carry it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the API key is empty")]
    EmptyKey,
    #[error(
        "the API key must be at most {MAX_API_KEY_LEN} bytes of printable ASCII without spaces \
         (it travels in an HTTP header)"
    )]
    BadKey,
    #[error("missing `authorization: Bearer <key>` (this server requires an API key)")]
    Missing,
    #[error("the authorization header is not `Bearer <key>`")]
    NotBearer,
    #[error("invalid API key")]
    Wrong,
}

/// The key every guarded call must present as `authorization: Bearer KEY`.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl ApiKey {
    /// A key from its text (surrounding whitespace, e.g. a key file's newline, is trimmed).
    pub fn new(key: &str) -> Result<Self, AuthError> {
        let key = key.trim();
        if key.is_empty() {
            return Err(AuthError::EmptyKey);
        }
        if key.len() > MAX_API_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AuthError::BadKey);
        }
        Ok(Self {
            digest: digest(key.as_bytes()),
        })
    }

    /// Whether `headers` carry `authorization: Bearer KEY` with this key.
    pub fn verify(&self, headers: &HeaderMap) -> Result<(), AuthError> {
        let value = headers
            .get(http::header::AUTHORIZATION)
            .ok_or(AuthError::Missing)?;
        let bytes = value.as_bytes();
        let scheme = bytes.get(..7).ok_or(AuthError::NotBearer)?;
        if !scheme.eq_ignore_ascii_case(b"bearer ") {
            return Err(AuthError::NotBearer);
        }
        let presented = digest(bytes[7..].trim_ascii());
        if bool::from(presented.ct_eq(&self.digest)) {
            Ok(())
        } else {
            Err(AuthError::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_the_right_bearer_key_passes() {
        let key = ApiKey::new("s3cret-key\n").unwrap();
        assert_eq!(key.verify(&headers(Some("Bearer s3cret-key"))), Ok(()));
        assert_eq!(key.verify(&headers(Some("bearer s3cret-key"))), Ok(()));
        assert_eq!(
            key.verify(&headers(Some("Bearer s3cret-kez"))),
            Err(AuthError::Wrong)
        );
        assert_eq!(
            key.verify(&headers(Some("Bearer s3cret-key-and-more"))),
            Err(AuthError::Wrong)
        );
        assert_eq!(key.verify(&headers(Some("Bearer "))), Err(AuthError::Wrong));
        assert_eq!(
            key.verify(&headers(Some("Basic czNjcmV0"))),
            Err(AuthError::NotBearer)
        );
        assert_eq!(
            key.verify(&headers(Some("Bear"))),
            Err(AuthError::NotBearer)
        );
        assert_eq!(key.verify(&headers(None)), Err(AuthError::Missing));
    }

    #[test]
    fn unusable_keys_are_refused_and_keys_never_print() {
        assert_eq!(ApiKey::new("  \n").unwrap_err(), AuthError::EmptyKey);
        assert_eq!(ApiKey::new("two words").unwrap_err(), AuthError::BadKey);
        assert_eq!(ApiKey::new("caf\u{e9}").unwrap_err(), AuthError::BadKey);
        let long = "k".repeat(MAX_API_KEY_LEN + 1);
        assert_eq!(ApiKey::new(&long).unwrap_err(), AuthError::BadKey);
        let key = ApiKey::new("hunter2").unwrap();
        assert!(!format!("{key:?}").contains("hunter2"));
    }
}
