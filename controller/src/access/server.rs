//! Serving the access API over TLS: the serving certificate (self-signed with the APIService's
//! caBundle injected, or files from cert-manager), and the front proxy authenticated at the
//! handshake: a client certificate is required, it must chain to the API server's requestheader
//! CA and carry a name the API server allows. Anyone else is refused before a byte of HTTP is
//! read. Each connection's verified peer is put on its requests.

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
use rustls::{
    DigitallySignedStruct, DistinguishedName, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    pki_types::{CertificateDer, UnixTime},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use smolvm_certs::{ReloadableResolver, cert_info_from_der};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tower::Layer;

use super::frontproxy::{CONFIGMAP_NAME, CONFIGMAP_NAMESPACE, Peer, RequestHeaderConfig};

/// The TLS acceptor of the access API: rustls, then the connection's verified client
/// certificate (its common name) as a [`Peer`] extension on every request it carries.
///
/// A handshake must finish within `handshake_timeout`. [`super::serve`] wraps it in
/// [`smolvm_kit::accept::Bounded`], which also caps the handshakes in progress (a connection
/// beyond is closed at once), so that callers who never finish a handshake (anyone may open a
/// TCP connection) cannot pile up sockets and tasks in the controller.
#[derive(Clone)]
pub struct PeerAcceptor {
    inner: RustlsAcceptor,
}

impl PeerAcceptor {
    /// Accepts with `config` (swappable through [`RustlsConfig::reload_from_config`]).
    pub fn new(config: RustlsConfig, handshake_timeout: Duration) -> Self {
        Self {
            inner: RustlsAcceptor::new(config).handshake_timeout(handshake_timeout),
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
            // rustls has verified the chain against the requestheader CA and the allowed
            // names (the certificate is mandatory): the peer is the front proxy.
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

/// The rustls config for the serving certificate and `requestheader`'s front proxy: a client
/// certificate is mandatory, verified against the requestheader CA (WebPKI: chain, validity,
/// client usage) and then held to the allowed names. Without one, or with another name, the
/// handshake fails (alert `certificate_required` or `access_denied`): no request of that
/// connection is ever read.
pub fn tls_config(
    resolver: &Arc<ReloadableResolver>,
    requestheader: &RequestHeaderConfig,
) -> Result<Arc<rustls::ServerConfig>, smolvm_certs::Error> {
    let provider = smolvm_certs::crypto_provider();
    let roots = Arc::new(smolvm_certs::root_store(&requestheader.client_ca_pem)?);
    let chain = WebPkiClientVerifier::builder_with_provider(roots, provider.clone()).build()?;
    let verifier = Arc::new(FrontProxyVerifier {
        chain,
        requestheader: requestheader.clone(),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver.clone());
    config.alpn_protocols = smolvm_certs::SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// The requestheader CA's verifier (every check it makes, unchanged), and then the API server's
/// allowed names: a certificate of that CA issued to anyone else is refused too.
#[derive(Debug)]
struct FrontProxyVerifier {
    chain: Arc<dyn ClientCertVerifier>,
    requestheader: RequestHeaderConfig,
}

impl ClientCertVerifier for FrontProxyVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        let name = cert_info_from_der(end_entity).ok().and_then(|i| i.subject_cn);
        if self.requestheader.allows_name(name.as_deref()) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// Re-reads the front-proxy settings every `interval` and puts a change in force: new
/// handshakes verify against a new CA and allowed names, new requests read new header names. A broken or missing
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
        if next.client_ca_pem != current.client_ca_pem || next.allowed_names != current.allowed_names {
            match tls_config(&resolver, &next) {
                Ok(config) => rustls.reload_from_config(config),
                Err(error) => {
                    tracing::warn!(%error, "access API: the new requestheader settings do not load; keeping the ones in force");
                    continue;
                }
            }
        }
        *slot.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        tracing::info!("access API: front-proxy settings changed and in force");
    }
}
