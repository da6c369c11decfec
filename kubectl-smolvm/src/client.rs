//! Reaching the cluster: the kube configuration chosen as kubectl chooses it (`--kubeconfig`,
//! `$KUBECONFIG`, `~/.kube/config`, then the in-cluster config), kubectl's identity flags, and
//! the few kinds of request the commands make, each bounded by `--request-timeout`.

use std::future::Future;
use std::time::Duration;

use futures::{AsyncBufRead, Stream};
use http::Request;
use http_body_util::BodyExt;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, ObjectList, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::core::{GroupVersionKind, Status};
use kube::{Client, Config};
use serde::de::DeserializeOwned;

use crate::cli::GlobalArgs;
use crate::error::{Error, clean};
use crate::paths::{self, KIND, PLURAL};

/// The most of an error answer's body that is read to find its `Status`.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A client for one namespace of one cluster, as the global flags chose them.
pub struct Cluster {
    client: Client,
    namespace: String,
    request_timeout: Option<Duration>,
}

impl Cluster {
    /// Loads the configuration the global flags point at and builds a client for it.
    pub async fn connect(global: &GlobalArgs) -> Result<Self, Error> {
        let mut config = load_config(global).await?;
        apply_identity(&mut config, global);
        if let Some(warning) = always_verify_the_server(&mut config) {
            eprintln!("warning: {warning}");
        }
        // One attempt, as kubectl makes: kube's clients retry a 429, 503 or 504 up to 15 times
        // with a growing backoff by default, which leaves a user waiting minutes for an answer
        // such as "the VM's node cannot be reached".
        config.default_retry = false;
        let namespace = global
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        paths::check_namespace(&namespace)?;
        let client = Client::try_from(config)?;
        let request_timeout = global.request_timeout.filter(|d| !d.is_zero());
        Ok(Cluster {
            client,
            namespace,
            request_timeout,
        })
    }

    /// The Kubernetes client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The namespace the commands work in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The SmolVM custom resources of the namespace.
    pub fn smolvms(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &smolvm_resource())
    }

    /// Reads a SmolVM.
    pub async fn get_smolvm(&self, name: &str) -> Result<DynamicObject, Error> {
        let api = self.smolvms();
        self.bounded(async { api.get(name).await.map_err(Error::from) }).await
    }

    /// Creates a SmolVM (named by the server when it sets `metadata.generateName` instead of a
    /// name); the answer is the SmolVM as admitted.
    pub async fn create_smolvm(&self, smolvm: &DynamicObject) -> Result<DynamicObject, Error> {
        let api = self.smolvms();
        let params = PostParams::default();
        self.bounded(async { api.create(&params, smolvm).await.map_err(Error::from) })
            .await
    }

    /// Lists the SmolVMs of the namespace that `label_selector` selects (`key=value`).
    pub async fn list_smolvms(&self, label_selector: &str) -> Result<ObjectList<DynamicObject>, Error> {
        let api = self.smolvms();
        let params = ListParams::default().labels(label_selector);
        self.bounded(async { api.list(&params).await.map_err(Error::from) })
            .await
    }

    /// Watches the SmolVMs `label_selector` selects from `resource_version` (a list's) for at
    /// most `timeout_secs`; `--request-timeout` bounds the wait for the stream to start.
    pub async fn watch_smolvms(
        &self,
        label_selector: &str,
        resource_version: &str,
        timeout_secs: u32,
    ) -> Result<impl Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + use<>, Error> {
        let api = self.smolvms();
        let params = WatchParams::default().labels(label_selector).timeout(timeout_secs);
        self.bounded(async { api.watch(&params, resource_version).await.map_err(Error::from) })
            .await
    }

    /// Merge-patches a SmolVM.
    pub async fn merge_patch_smolvm(&self, name: &str, patch: &serde_json::Value) -> Result<DynamicObject, Error> {
        let api = self.smolvms();
        let params = PatchParams::default();
        self.bounded(async {
            api.patch(name, &params, &Patch::Merge(patch))
                .await
                .map_err(Error::from)
        })
        .await
    }

    /// Sends a request and decodes its JSON answer.
    pub async fn request_json<T: DeserializeOwned>(&self, request: Request<Vec<u8>>) -> Result<T, Error> {
        let text = self
            .bounded(async { self.client.request_text(request).await.map_err(Error::from) })
            .await?;
        serde_json::from_str(&text)
            .map_err(|e| Error::UnexpectedResponse(format!("the answer is not the JSON expected: {e}")))
    }

    /// Sends a request and returns its body as a stream once the answer has started.
    pub async fn request_stream(&self, request: Request<Vec<u8>>) -> Result<impl AsyncBufRead + use<>, Error> {
        self.bounded(async { self.client.request_stream(request).await.map_err(Error::from) })
            .await
    }

    /// Sends a request and returns the whole answer (status, headers and a body still to be
    /// read) once it has started; an error status becomes [`Error::Api`], as kube makes it.
    pub async fn send(&self, request: Request<Vec<u8>>) -> Result<http::Response<kube::client::Body>, Error> {
        self.bounded(async {
            let response = self.client.send(request.map(kube::client::Body::from)).await?;
            let status = response.status();
            if !(status.is_client_error() || status.is_server_error()) {
                return Ok(response);
            }
            let body = http_body_util::Limited::new(response.into_body(), MAX_ERROR_BODY)
                .collect()
                .await
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
            Err(Error::Api(status_from_error_body(status.as_u16(), &body).boxed()))
        })
        .await
    }

    /// `work`, bounded by `--request-timeout` when one is set.
    pub async fn bounded<T>(&self, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        match self.request_timeout {
            Some(limit) => tokio::time::timeout(limit, work)
                .await
                .unwrap_or(Err(Error::Timeout(limit))),
            None => work.await,
        }
    }
}

/// The SmolVM custom resource, as kube's dynamic API names it (`vm.smolvm.dev/v1alpha1`, kind
/// `SmolVM`, plural `smolvms`).
pub fn smolvm_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk(paths::GROUP, paths::VERSION, KIND);
    ApiResource::from_gvk_with_plural(&gvk, PLURAL)
}

/// A request to send with [`Cluster`]: `url` is a path and query on the API server.
pub fn build_request(
    method: http::Method,
    url: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> Result<Request<Vec<u8>>, Error> {
    let mut builder = Request::builder().method(method).uri(url);
    if let Some(content_type) = content_type {
        builder = builder.header(http::header::CONTENT_TYPE, content_type);
    }
    builder
        .body(body)
        .map_err(|e| Error::InvalidArgument(format!("cannot make a request for {url:?}: {e}")))
}

/// The `Status` an error answer carries, or one made from its code and text when it carries none.
fn status_from_error_body(code: u16, body: &[u8]) -> Status {
    match serde_json::from_slice::<Status>(body) {
        Ok(mut status) => {
            if status.code == 0 {
                status.code = code;
            }
            status
        }
        Err(_) => Status::failure(&clean(&String::from_utf8_lossy(body)), "").with_code(code),
    }
}

/// The kube configuration the flags ask for, found the way kubectl finds it.
async fn load_config(global: &GlobalArgs) -> Result<Config, Error> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        cluster: global.cluster.clone(),
        user: global.user.clone(),
    };
    let kubeconfig = match &global.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).map_err(kubeconfig_error)?,
        None => match Kubeconfig::read() {
            Ok(kubeconfig) => kubeconfig,
            Err(err)
                if is_absent(&err) && global.context.is_none() && global.cluster.is_none() && global.user.is_none() =>
            {
                return Config::incluster()
                    .map_err(|in_cluster| Error::NoConfiguration(clean(&in_cluster.to_string())));
            }
            Err(err) => return Err(kubeconfig_error(err)),
        },
    };
    Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(kubeconfig_error)
}

/// Whether loading failed only because there is no kubeconfig file at all (no `$KUBECONFIG`,
/// no `~/.kube/config`), the case in which the in-cluster config is used (unless a context,
/// cluster or user of a kubeconfig was asked for).
fn is_absent(err: &KubeconfigError) -> bool {
    match err {
        KubeconfigError::FindPath => true,
        KubeconfigError::ReadConfig(io, _) => io.kind() == std::io::ErrorKind::NotFound && !kubeconfig_env_set(),
        _ => false,
    }
}

/// Whether `$KUBECONFIG` names at least one file (kube ignores it when it names none).
fn kubeconfig_env_set() -> bool {
    std::env::var_os("KUBECONFIG").is_some_and(|value| std::env::split_paths(&value).any(|p| !p.as_os_str().is_empty()))
}

fn kubeconfig_error(err: KubeconfigError) -> Error {
    Error::Kubeconfig(clean(&err.to_string()))
}

/// Turns verification of the API server's certificate back on where a kubeconfig's
/// `insecure-skip-tls-verify` turned it off: kubectl-smolvm never connects without it. Returns
/// the warning to print when the kubeconfig asked otherwise.
fn always_verify_the_server(config: &mut Config) -> Option<&'static str> {
    let asked_to_skip = std::mem::replace(&mut config.accept_invalid_certs, false);
    asked_to_skip.then_some(
        "ignoring insecure-skip-tls-verify in the kubeconfig: kubectl-smolvm always verifies the API server's certificate",
    )
}

/// Applies `--as`, `--as-group` and `--as-uid` over whatever the kubeconfig says.
fn apply_identity(config: &mut Config, global: &GlobalArgs) {
    if let Some(user) = &global.as_user {
        config.auth_info.impersonate = Some(user.clone());
    }
    if !global.as_group.is_empty() {
        config.auth_info.impersonate_groups = Some(global.as_group.clone());
    }
    if let Some(uid) = &global.as_uid {
        config.auth_info.impersonate_uid = Some(uid.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_become_statuses() {
        let json = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"SmolVM default/web is not running (phase Failed): x","reason":"Conflict","code":409}"#;
        let status = status_from_error_body(409, json);
        assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));

        let status = status_from_error_body(503, b"upstream\nconnect error");
        assert_eq!(
            (status.code, status.reason.as_str(), status.message.as_str()),
            (503, "", "upstream connect error")
        );
        let rendered = Error::Api(status.boxed()).render();
        assert_eq!(
            rendered,
            "Error from server (ServiceUnavailable): upstream connect error"
        );

        let status = status_from_error_body(404, b"{}");
        assert_eq!(status.code, 404);
        assert_eq!(
            Error::Api(status.boxed()).render(),
            "Error from server (NotFound): the server answered HTTP 404 with no message"
        );
    }

    #[test]
    fn the_server_certificate_is_always_verified() {
        let mut config = Config::new(http::Uri::from_static("https://example.invalid"));
        assert_eq!(always_verify_the_server(&mut config), None);
        config.accept_invalid_certs = true;
        assert!(always_verify_the_server(&mut config).is_some(), "the user hears it");
        assert!(!config.accept_invalid_certs, "verification is back on");
    }

    #[test]
    fn identity_flags_override_the_kubeconfig() {
        let mut config = Config::new(http::Uri::from_static("https://example.invalid"));
        config.auth_info.impersonate = Some("from-kubeconfig".into());
        let global = GlobalArgs {
            as_user: Some("system:serviceaccount:shop:deployer".into()),
            as_group: vec!["admins".into(), "devs".into()],
            ..Default::default()
        };
        apply_identity(&mut config, &global);
        assert_eq!(
            config.auth_info.impersonate.as_deref(),
            Some("system:serviceaccount:shop:deployer")
        );
        assert_eq!(
            config.auth_info.impersonate_groups,
            Some(vec!["admins".to_string(), "devs".to_string()])
        );
        assert_eq!(config.auth_info.impersonate_uid, None);
    }
}
