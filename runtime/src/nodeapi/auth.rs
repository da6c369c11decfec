//! Bearer-token check for the node API: constant-time comparison against a token file that is
//! re-read when it changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// The expected bearer token.
#[derive(Debug)]
pub struct TokenAuth {
    token: RwLock<Vec<u8>>,
}

/// Reads a token file: the contents without surrounding whitespace; empty is an error.
pub fn read_token_file(path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io("reading the token file", path, e))?;
    parse_token(&bytes).ok_or_else(|| Error::Config(format!("token file {} is empty", path.display())))
}

/// The token in a file's bytes (surrounding ASCII whitespace removed), or `None` when empty.
pub fn parse_token(bytes: &[u8]) -> Option<Vec<u8>> {
    let trimmed = bytes.trim_ascii();
    (!trimmed.is_empty()).then(|| trimmed.to_vec())
}

/// Constant-time equality of two byte strings (the length is not secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

impl TokenAuth {
    /// A fixed token (tests, benchmarks).
    pub fn fixed(token: impl Into<Vec<u8>>) -> Result<Arc<Self>> {
        let token = parse_token(&token.into()).ok_or_else(|| Error::Config("the bearer token is empty".into()))?;
        Ok(Arc::new(Self {
            token: RwLock::new(token),
        }))
    }

    /// The token in `path`, re-read every `interval` when the file changes.
    pub fn from_file(path: PathBuf, interval: Duration) -> Result<(Arc<Self>, tokio::task::JoinHandle<()>)> {
        let auth = Arc::new(Self {
            token: RwLock::new(read_token_file(&path)?),
        });
        let weak = Arc::downgrade(&auth);
        let shown = path.display().to_string();
        let task = smolvm_kit::watch::spawn(vec![path], interval, move |mut contents| {
            let Some(auth) = weak.upgrade() else { return };
            match contents.pop().as_deref().and_then(parse_token) {
                Some(token) => {
                    auth.set(token);
                    tracing::info!(path = %shown, "bearer token reloaded");
                }
                None => tracing::warn!(path = %shown, "token file is empty; keeping the previous token"),
            }
        });
        Ok((auth, task))
    }

    fn set(&self, token: Vec<u8>) {
        if let Ok(mut current) = self.token.write() {
            *current = token;
        }
    }

    /// Checks an `Authorization` header value (`Bearer <token>`).
    pub fn check_header(&self, header: Option<&[u8]>) -> bool {
        let Some(presented) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        match self.token.read() {
            Ok(expected) => constant_time_eq(presented.trim_ascii(), &expected),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checks() {
        let auth = TokenAuth::fixed("s3cret\n").expect("token");
        let cases: [(Option<&[u8]>, bool); 7] = [
            (Some(b"Bearer s3cret"), true),
            (Some(b"Bearer s3cret "), true),
            (Some(b"Bearer s3cre"), false),
            (Some(b"Bearer s3cretx"), false),
            (Some(b"bearer s3cret"), false),
            (Some(b"s3cret"), false),
            (None, false),
        ];
        for (header, ok) in cases {
            assert_eq!(auth.check_header(header), ok, "{header:?}");
        }
        assert!(TokenAuth::fixed("  \n").is_err());
    }
}
