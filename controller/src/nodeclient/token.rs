//! The node API bearer token ([`BearerToken`]), and the one it replaced while runtimes may
//! still expect that one.

use std::{
    sync::{Arc, RwLock},
    time::Duration,
};

/// How long a replaced bearer token is still offered to runtimes that have not yet seen the new
/// one (the kubelet refreshes a mounted Secret within about a minute).
pub const PREVIOUS_TOKEN_GRACE: Duration = Duration::from_secs(600);

/// The node API bearer token, and the one it replaced while runtimes may still expect that one.
#[derive(Debug)]
pub struct BearerToken {
    inner: RwLock<(String, Option<(String, std::time::Instant)>)>,
}

impl BearerToken {
    /// A token with no predecessor.
    pub fn new(token: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            inner: RwLock::new((token.into(), None)),
        })
    }

    /// The token to send.
    pub fn current(&self) -> String {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).0.clone()
    }

    /// Replaces the token; the old one stays acceptable to retry with for
    /// [`PREVIOUS_TOKEN_GRACE`]. Returns whether it changed.
    pub fn replace(&self, token: String) -> bool {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.0 == token {
            return false;
        }
        let old = std::mem::replace(&mut inner.0, token);
        inner.1 = Some((old, std::time::Instant::now() + PREVIOUS_TOKEN_GRACE));
        true
    }

    /// The replaced token, while its grace lasts.
    pub fn previous(&self) -> Option<String> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .1
            .as_ref()
            .filter(|(_, until)| std::time::Instant::now() < *until)
            .map(|(t, _)| t.clone())
    }
}
