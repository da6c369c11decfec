//! The access API: `subresources.vm.smolvm.dev/v1alpha1`, an aggregated API through which users
//! read a SmolVM's log, run commands in it and copy files, with the API server's
//! authentication, RBAC and audit in front (SPEC 6.1), as KubeVirt's `virtctl console` works.
//!
//! The controller serves it because it already holds what reaching a node's agent takes (a
//! client certificate from the runtime CA and the node API token); every replica serves it,
//! the standby too, so a leader hand-off never interrupts it. Per call:
//!
//! 1. [`server`], [`frontproxy`]: the TLS handshake requires the API server's front-proxy client
//!    certificate (the requestheader CA, an allowed name); the user comes from its headers.
//! 2. [`limits`]: a slot of this replica's calls or sessions, or 429 at once.
//! 3. [`request`]: a SubjectAccessReview on `smolvms/<subresource>` in this group, for that user.
//! 4. The SmolVM's binding names the node and the machine; the node's SmolVMNode names the agent's
//!    address.
//! 5. [`handlers`]: only now is a body read: the call goes to the agent over mTLS, a file's
//!    content streamed through as it comes, and the answer streams back.
//!
//! Refusals are Kubernetes `Status` objects, so `kubectl` prints them as it prints its own.

pub mod credentials;
pub mod discovery;
mod error;
pub mod frontproxy;
pub mod handlers;
pub mod limits;
pub mod request;
pub mod server;

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::{
    Json, Router,
    routing::{get, post},
};
use axum_server::tls_rustls::RustlsConfig;
use kube::{Api, Client};
use smolvm_certs::ReloadableResolver;
use smolvm_kit::selfsigned::{self, SelfSignedConfig};

pub use error::{AccessError, status_object};

use crate::{
    metrics::Metrics,
    nodeclient::{ClientSettings, Endpoints, NodeClient},
};

/// The API group.
pub const GROUP: &str = "subresources.vm.smolvm.dev";
/// The version.
pub const VERSION: &str = "v1alpha1";
/// `group/version`.
pub const GROUP_VERSION: &str = "subresources.vm.smolvm.dev/v1alpha1";
/// The APIService that routes the group here.
pub const API_SERVICE: &str = "v1alpha1.subresources.vm.smolvm.dev";
/// Largest exec request (its stdin included), as the node API takes.
pub const MAX_EXEC_BODY: usize = 64 * 1024;

/// What the handlers share.
pub struct AccessState {
    /// The controller's Kubernetes client (SubjectAccessReviews, SmolVMs, SmolVMNodes).
    pub kube: Client,
    /// The node API client.
    pub nodes: NodeClient,
    /// The API server's front-proxy settings in force.
    pub requestheader: server::RequestHeaderSlot,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// How long an agent may take to answer (headers; a stream then runs as long as it runs).
    pub call_timeout: Duration,
    /// How long a file write may take.
    pub file_timeout: Duration,
    /// What this replica holds at most.
    pub gates: limits::Gates,
}

impl AccessState {
    /// The state of a replica with the standard timeouts of agent calls (30 s to answer, 5
    /// minutes for a file write) and `limits`.
    pub fn new(
        kube: Client,
        nodes: NodeClient,
        requestheader: server::RequestHeaderSlot,
        metrics: Arc<Metrics>,
        limits: limits::Limits,
    ) -> Self {
        AccessState {
            kube,
            nodes,
            requestheader,
            metrics,
            call_timeout: Duration::from_secs(30),
            file_timeout: Duration::from_secs(300),
            gates: limits::Gates::new(limits),
        }
    }

    fn requestheader(&self) -> Arc<frontproxy::RequestHeaderConfig> {
        self.requestheader.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The routes: discovery, and the three subresources, behind [`limits::guard`]. No route reads
/// a body before its handler has authorized the call.
pub fn router(state: Arc<AccessState>) -> Router {
    let base = "/apis/subresources.vm.smolvm.dev/v1alpha1/namespaces/{namespace}/smolvms/{name}";
    Router::new()
        .route("/apis", get(|| async { Json(discovery::group_list()) }))
        .route(
            "/apis/subresources.vm.smolvm.dev",
            get(|| async { Json(discovery::api_group()) }),
        )
        .route(
            "/apis/subresources.vm.smolvm.dev/v1alpha1",
            get(|| async { Json(discovery::resource_list()) }),
        )
        .route("/openapi/v2", get(|| async { Json(discovery::openapi_v2()) }))
        .route("/openapi/v3", get(|| async { Json(discovery::openapi_v3()) }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .route("/livez", get(|| async { "ok" }))
        .route(&format!("{base}/log"), get(handlers::log).post(handlers::log))
        .route(&format!("{base}/exec"), post(handlers::exec).get(handlers::exec_stream))
        .route(
            &format!("{base}/files"),
            get(handlers::files).post(handlers::files).put(handlers::files),
        )
        .fallback(|| async { AccessError::NotFound("no such path in subresources.vm.smolvm.dev/v1alpha1".into()) })
        .layer(axum::middleware::from_fn_with_state(state.clone(), limits::guard))
        .with_state(state)
}

/// Serves `state`'s access API on `listener` with `tls` (see [`server::tls_config`]) until
/// `shutdown` resolves: the front proxy authenticated at the handshake, within the listener's
/// bounds ([`limits::Limits::accept`]: connections and handshakes in all and per source, each
/// connection closed for it counted in `smolvm_controller_access_connections_closed_total`),
/// headers within the header timeout, at most as many HTTP/2 streams per connection as the
/// replica has slots, HTTP/2 windows and idle timeout from the limits; on shutdown the
/// connections are told to close and given 5 s.
pub async fn serve(
    listener: std::net::TcpListener,
    state: Arc<AccessState>,
    tls: RustlsConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let limits = state.gates.limits().clone();
    let metrics = state.metrics.clone();
    let acceptor = smolvm_kit::accept::Bounded::new(
        server::PeerAcceptor::new(tls, limits.accept.handshake_timeout),
        limits.accept,
    )
    .on_closed(Arc::new(move |why| metrics.access_connection_closed(why.as_str())));
    let settings = smolvm_kit::serve::Settings {
        header_timeout: limits.header_timeout,
        max_streams: u32::try_from(limits.max_calls + limits.max_streams).unwrap_or(u32::MAX),
        window: limits.http2_window,
        idle_timeout: limits.http2_idle_timeout,
        keep_alive_interval: Duration::from_secs(30),
        keep_alive_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
    };
    smolvm_kit::serve::serve(listener, acceptor, router(state), settings, shutdown, "access API").await;
    Ok(())
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum ServingTls {
    /// Generated into a Secret shared by the replicas, the CA injected into the APIService.
    SelfSigned(SelfSignedConfig),
    /// Files (a cert-manager Certificate's Secret), reloaded when they change.
    Files {
        /// Certificate chain (PEM).
        cert: PathBuf,
        /// Key (PEM).
        key: PathBuf,
    },
}

/// How the access API is served.
#[derive(Debug, Clone)]
pub struct AccessConfig {
    /// Listen address.
    pub address: SocketAddr,
    /// Namespace of the controller's Secrets.
    pub namespace: String,
    /// The serving certificate.
    pub tls: ServingTls,
    /// How often the self-signed Secret, the certificate files and the front-proxy settings
    /// are looked at again.
    pub check_interval: Duration,
    /// The node API token Secret.
    pub runtime_auth_secret: String,
    /// The node API token from a file instead.
    pub token_file: Option<PathBuf>,
    /// The listener's bounds (the flags shared with the other binaries).
    pub listener: smolvm_kit::limits::ListenerBounds,
}

/// Retries `step` every 5 s until it succeeds, logging why it did not.
async fn until_ok<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut step: impl FnMut() -> F,
) -> T {
    loop {
        match step().await {
            Ok(value) => return value,
            Err(error) => tracing::warn!(%error, "access API: {what}; retrying in 5 s"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn serving_certificate(client: &Client, cfg: &AccessConfig) -> anyhow::Result<Arc<ReloadableResolver>> {
    match &cfg.tls {
        ServingTls::SelfSigned(self_signed) => {
            let first = until_ok("self-signed serving certificate", || {
                selfsigned::bootstrap(client, self_signed)
            })
            .await;
            let material = &first.material;
            let resolver = Arc::new(ReloadableResolver::from_pem(&material.cert_pem, &material.key_pem)?);
            tokio::spawn(selfsigned::rotate_forever(
                client.clone(),
                self_signed.clone(),
                resolver.clone(),
                |swapped| {
                    if let Err(reason) = swapped {
                        tracing::error!(reason, "access API: rotated serving certificate rejected");
                    }
                },
                first,
                cfg.check_interval.max(Duration::from_secs(10)),
            ));
            Ok(resolver)
        }
        ServingTls::Files { cert, key } => {
            let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
            let resolver = Arc::new(ReloadableResolver::from_pem(&read(cert)?, &read(key)?)?);
            let swap = resolver.clone();
            smolvm_kit::watch::spawn(vec![cert.clone(), key.clone()], cfg.check_interval, move |contents| {
                let text = |i: usize| {
                    contents
                        .get(i)
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default()
                };
                match swap.swap_pem(&text(0), &text(1)) {
                    Ok(()) => tracing::info!("access API: serving certificate reloaded from files"),
                    Err(error) => {
                        tracing::warn!(%error, "access API: certificate files do not load; keeping the current one")
                    }
                }
            });
            Ok(resolver)
        }
    }
}

/// Serves the access API until `shutdown` resolves: the serving certificate, the API server's
/// front-proxy settings and the node API credentials first (each waited for and retried, as
/// the leader may still be creating the runtime CA), then HTTPS on `listener`.
pub async fn run(
    client: Client,
    cfg: AccessConfig,
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let resolver = serving_certificate(&client, &cfg).await?;
    let requestheader = until_ok("reading the API server's front-proxy settings", || {
        server::read_requestheader(&client)
    })
    .await;
    let secrets = Api::namespaced(client.clone(), &cfg.namespace);
    let trust = credentials::runtime_trust(secrets).await;
    let token = credentials::token(
        &client,
        &cfg.namespace,
        &cfg.runtime_auth_secret,
        cfg.token_file.clone(),
    )
    .await;
    let nodes = NodeClient::new(
        ClientSettings::standard(trust.client_tls(), token),
        Endpoints::default(),
    );
    let rustls = RustlsConfig::from_config(server::tls_config(&resolver, &requestheader)?);
    let slot: server::RequestHeaderSlot = Arc::new(std::sync::RwLock::new(Arc::new(requestheader)));
    tokio::spawn(server::follow_requestheader(
        client.clone(),
        slot.clone(),
        rustls.clone(),
        resolver,
        cfg.check_interval.max(Duration::from_secs(10)),
    ));
    let state = Arc::new(AccessState::new(
        client,
        nodes,
        slot,
        metrics,
        limits::Limits::with_listener(cfg.listener),
    ));
    tracing::info!(address = %cfg.address, "access API (subresources.vm.smolvm.dev) serving");
    serve(listener, state, rustls, shutdown).await
}
