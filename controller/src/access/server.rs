//! Serving the access API over TLS: the serving certificate (self-signed with the APIService's
//! caBundle injected, or files from cert-manager), client certificates verified against the API
//! server's requestheader CA, and each connection's verified peer put on its requests.

use std::{
    collections::BTreeMap,
    io,
    sync::{Arc, RwLock},
    time::Duration,
};

use axum::Extension;
use axum_server::{accept::Accept, tls_rustls::RustlsAcceptor, tls_rustls::RustlsConfig};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use smolvm_certs::{ReloadableResolver, cert_info_from_der, optional_client_cert_server_config};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tower::Layer;

use super::frontproxy::{CONFIGMAP_NAME, CONFIGMAP_NAMESPACE, Peer, RequestHeaderConfig};

/// The TLS acceptor of the access API: rustls, then the connection's verified client
/// certificate (its common name) as a [`Peer`] extension on every request it carries.
#[derive(Clone)]
pub struct PeerAcceptor {
    inner: RustlsAcceptor,
}

impl PeerAcceptor {
    /// Accepts with `config` (swappable through [`RustlsConfig::reload_from_config`]).
    pub fn new(config: RustlsConfig) -> Self {
        Self {
            inner: RustlsAcceptor::new(config),
        }
    }
}

impl<I, S> Accept<I, S> for PeerAcceptor
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Send + 'static,
{
    type Stream = TlsStream<I>;
    type Service = <Extension<Peer> as Layer<S>>::Service;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (stream, service) = inner.accept(stream, service).await?;
            // rustls has verified the chain against the requestheader CA when a certificate
            // was presented; only then is there a peer.
            let peer = match stream.get_ref().1.peer_certificates().and_then(|c| c.first()) {
                Some(leaf) => Peer {
                    common_name: cert_info_from_der(leaf).ok().and_then(|i| i.subject_cn),
                    presented: true,
                },
                None => Peer::default(),
            };
            Ok((stream, Extension(peer).layer(service)))
        })
    }
}

/// The front-proxy settings in force, shared by the TLS config and the handlers.
pub type RequestHeaderSlot = Arc<RwLock<Arc<RequestHeaderConfig>>>;

/// Reads the API server's front-proxy settings once.
pub async fn read_requestheader(client: &Client) -> Result<RequestHeaderConfig, super::AccessError> {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), CONFIGMAP_NAMESPACE);
    let data: BTreeMap<String, String> = configmaps
        .get_opt(CONFIGMAP_NAME)
        .await?
        .and_then(|c| c.data)
        .unwrap_or_default();
    RequestHeaderConfig::from_configmap(&data)
}

/// The rustls config for `requestheader`'s CA and the serving certificate.
pub fn tls_config(
    resolver: &Arc<ReloadableResolver>,
    requestheader: &RequestHeaderConfig,
) -> Result<Arc<rustls::ServerConfig>, smolvm_certs::Error> {
    optional_client_cert_server_config(resolver.clone(), &requestheader.client_ca_pem).map(Arc::new)
}

/// Re-reads the front-proxy settings every `interval` and puts a change in force: new
/// handshakes verify against a new CA, new requests read new header names. A broken or missing
/// ConfigMap keeps what is in force.
pub async fn follow_requestheader(
    client: Client,
    slot: RequestHeaderSlot,
    rustls: RustlsConfig,
    resolver: Arc<ReloadableResolver>,
    interval: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        let next = match read_requestheader(&client).await {
            Ok(next) => next,
            Err(error) => {
                tracing::warn!(%error, "access API: keeping the front-proxy settings in force");
                continue;
            }
        };
        let current = slot.read().unwrap_or_else(|p| p.into_inner()).clone();
        if next == *current {
            continue;
        }
        if next.client_ca_pem != current.client_ca_pem {
            match tls_config(&resolver, &next) {
                Ok(config) => rustls.reload_from_config(config),
                Err(error) => {
                    tracing::warn!(%error, "access API: the new requestheader CA does not load; keeping the one in force");
                    continue;
                }
            }
        }
        *slot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        tracing::info!("access API: front-proxy settings changed and in force");
    }
}
