//! The node API credentials of the access API, on every replica.
//!
//! The leader owns the runtime CA (it creates it, rotates it, signs the agents' certificates);
//! the access API, served by every replica so that a leader hand-off never takes it away, only
//! reads it: it waits for the CA Secret and the token Secret to exist, issues itself a client
//! certificate from the CA's key (as the leader does), and follows both Secrets as they change.

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::{
    nodeclient::BearerToken,
    pki::{
        SignerError, runtime_auth,
        runtime_ca::{CA_SECRET, CaSet, RuntimeTrust},
    },
};

/// How often the Secrets are looked at while waiting for them, and then for changes.
const FOLLOW: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(3);

/// Waits until the runtime CA exists, then trusts it and follows its rotations.
pub async fn runtime_trust(secrets: Api<Secret>) -> Arc<RuntimeTrust> {
    let trust = loop {
        match secrets
            .get_opt(CA_SECRET)
            .await
            .map_err(SignerError::from)
            .and_then(|s| match s {
                Some(secret) => CaSet::from_secret(&secret).and_then(RuntimeTrust::new).map(Some),
                None => Ok(None),
            }) {
            Ok(Some(trust)) => break trust,
            Ok(None) => tracing::info!(
                secret = CA_SECRET,
                "access API: waiting for the leader to create the runtime CA"
            ),
            Err(error) => tracing::warn!(secret = CA_SECRET, %error, "access API: runtime CA not usable yet"),
        }
        tokio::time::sleep(WAIT).await;
    };
    tokio::spawn(trust.clone().keep_client_cert_fresh());
    let follower = trust.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(FOLLOW).await;
            let next = match secrets.get_opt(CA_SECRET).await {
                Ok(Some(secret)) => CaSet::from_secret(&secret),
                Ok(None) => continue,
                Err(e) => Err(e.into()),
            };
            match next {
                Ok(next) if !next.same_as(&follower.cas()) => match follower.install(next) {
                    Ok(()) => tracing::info!("access API: runtime CA change followed"),
                    Err(error) => tracing::warn!(%error, "access API: keeping the runtime CA in force"),
                },
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "access API: reading the runtime CA"),
            }
        }
    });
    trust
}

/// The node API token: from `file`, or once the Secret exists, followed as it changes.
pub async fn token(client: &Client, namespace: &str, secret: &str, file: Option<PathBuf>) -> Arc<BearerToken> {
    if let Some(path) = file {
        loop {
            match std::fs::read_to_string(&path) {
                Ok(text) if !text.trim().is_empty() => return BearerToken::new(text.trim()),
                Ok(_) => tracing::warn!(path = %path.display(), "access API: the node API token file is empty"),
                Err(error) => tracing::warn!(path = %path.display(), %error, "access API: reading the node API token"),
            }
            tokio::time::sleep(WAIT).await;
        }
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let token = loop {
        match secrets.get_opt(secret).await {
            Ok(Some(s)) => match runtime_auth::token_of(&s, secret) {
                Ok(token) => break BearerToken::new(token),
                Err(error) => tracing::warn!(%secret, %error, "access API: node API token not usable yet"),
            },
            Ok(None) => tracing::info!(%secret, "access API: waiting for the node API token Secret"),
            Err(error) => tracing::warn!(%secret, %error, "access API: reading the node API token"),
        }
        tokio::time::sleep(WAIT).await;
    };
    tokio::spawn(runtime_auth::refresh(secrets, secret.to_string(), token.clone()));
    token
}
