//! Reads the Secrets and ConfigMaps a SmolVM's workload refers to, in the SmolVM's namespace.
//! The thin I/O beside [`super::workload`], which decides what the contents mean.
//!
//! Nothing here logs or formats an object's contents: a Secret is read into bytes and handed on.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{Api, Client};

use super::workload::{Fetched, Source};

/// A read the API server refused for a reason other than 403 or 404.
pub type FetchError = kube::Error;

/// Reads every object in `refs` from `namespace`.
pub async fn env_sources(
    client: &Client,
    namespace: &str,
    refs: &BTreeSet<(Source, String)>,
) -> Result<BTreeMap<(Source, String), Fetched>, FetchError> {
    let mut out = BTreeMap::new();
    for (source, name) in refs {
        let fetched = match source {
            Source::Secret => secret(client, namespace, name).await?,
            Source::ConfigMap => config_map(client, namespace, name).await?,
        };
        out.insert((*source, name.clone()), fetched);
    }
    Ok(out)
}

/// A Secret's data, by key.
pub async fn secret(client: &Client, namespace: &str, name: &str) -> Result<Fetched, FetchError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let found = classify(api.get_opt(name).await)?;
    Ok(match found {
        Some(Some(s)) => Fetched::Data(s.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect()),
        Some(None) => Fetched::Missing,
        None => Fetched::Forbidden,
    })
}

/// A ConfigMap's `data` and `binaryData`, by key.
pub async fn config_map(client: &Client, namespace: &str, name: &str) -> Result<Fetched, FetchError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let found = classify(api.get_opt(name).await)?;
    Ok(match found {
        Some(Some(c)) => {
            let mut data: BTreeMap<String, Vec<u8>> = c
                .binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            data.extend(c.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())));
            Fetched::Data(data)
        }
        Some(None) => Fetched::Missing,
        None => Fetched::Forbidden,
    })
}

/// What reading the pull secrets gave: their docker configurations (`.dockerconfigjson`, else
/// `.dockercfg`) and the names of those that gave none.
pub struct PullSecrets {
    /// (name, docker configuration bytes), in `imagePullSecrets` order.
    pub configs: Vec<(String, Vec<u8>)>,
    /// Secrets that do not exist or hold no docker configuration.
    pub skipped: Vec<String>,
    /// Secrets the controller may not read.
    pub forbidden: Vec<String>,
}

/// Reads the named pull secrets from `namespace`.
pub async fn pull_secrets(client: &Client, namespace: &str, names: &[String]) -> Result<PullSecrets, FetchError> {
    let mut out = PullSecrets {
        configs: Vec::new(),
        skipped: Vec::new(),
        forbidden: Vec::new(),
    };
    for name in names {
        match secret(client, namespace, name).await? {
            Fetched::Data(mut data) => match data.remove(".dockerconfigjson").or_else(|| data.remove(".dockercfg")) {
                Some(bytes) => out.configs.push((name.clone(), bytes)),
                None => out.skipped.push(name.clone()),
            },
            Fetched::Missing => out.skipped.push(name.clone()),
            Fetched::Forbidden => out.forbidden.push(name.clone()),
        }
    }
    Ok(out)
}

/// `Some(Some(obj))` found, `Some(None)` not found, `None` forbidden (403).
fn classify<K>(result: Result<Option<K>, kube::Error>) -> Result<Option<Option<K>>, FetchError> {
    match result {
        Ok(found) => Ok(Some(found)),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
        Err(e) => Err(e),
    }
}
