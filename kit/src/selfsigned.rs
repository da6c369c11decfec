//! Self-signed serving TLS for a component that the API server calls (the webhook's admission
//! endpoints, the controller's aggregated access API): a CA and a serving certificate for the
//! Service's DNS names, kept in ONE Secret shared by every replica, the CA injected as
//! `caBundle` into the configurations that point at the Service ([`CaBundleTarget`]), and the
//! serving certificate renewed (same CA) before expiry and hot-swapped.
//!
//! Concurrency between replicas is settled by the API server: the Secret is created only if
//! absent (a `409 AlreadyExists` means another replica won: load the winner), and a renewal is
//! a `replace` carrying the `resourceVersion` read (a `409 Conflict` means someone else renewed:
//! load theirs). The CA is never replaced by this code; its lifetime defaults to ten years
//! (delete the Secret's data, or the Secret, to start over with a new CA).
//!
//! The install may pre-create the Secret empty (`deploy/default` does), so the ServiceAccount
//! needs only `get` and `update` on that one name, never an unrestricted secret `create`: an
//! existing Secret without data is filled the way a renewal is written (a `replace` carrying the
//! `resourceVersion` read, keeping its type, labels and annotations), so racing replicas converge
//! on one CA here too.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use json_patch::{AddOperation, Patch, PatchOperation, TestOperation, jsonptr::PointerBuf};
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, Client,
    api::{Patch as KubePatch, PatchParams, PostParams},
};
use rustls::{
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{ServerName, UnixTime},
};
use serde_json::Value;
use smolvm_certs::{CertificateAuthority, RENEWAL_FRACTION, ReloadableResolver, needs_renewal, parse_cert_pem};

use crate::error::{Error, Result};

/// Secret key of the CA certificate.
pub const KEY_CA_CERT: &str = "ca.crt";
/// Secret key of the CA private key.
pub const KEY_CA_KEY: &str = "ca.key";
/// Secret key of the serving certificate.
pub const KEY_TLS_CERT: &str = "tls.crt";
/// Secret key of the serving key.
pub const KEY_TLS_KEY: &str = "tls.key";

/// A configuration whose `caBundle` must hold the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaBundleTarget {
    /// Every webhook of this MutatingWebhookConfiguration.
    MutatingWebhooks(String),
    /// Every webhook of this ValidatingWebhookConfiguration.
    ValidatingWebhooks(String),
    /// This APIService (`spec.caBundle`).
    ApiService(String),
}

impl std::fmt::Display for CaBundleTarget {
    /// `Kind/name`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaBundleTarget::MutatingWebhooks(name) => write!(f, "MutatingWebhookConfiguration/{name}"),
            CaBundleTarget::ValidatingWebhooks(name) => write!(f, "ValidatingWebhookConfiguration/{name}"),
            CaBundleTarget::ApiService(name) => write!(f, "APIService/{name}"),
        }
    }
}

/// What the self-signed mode needs to know.
#[derive(Debug, Clone)]
pub struct SelfSignedConfig {
    /// Namespace of the Secret and the Service.
    pub namespace: String,
    /// Name of the Secret holding CA and serving pair.
    pub secret_name: String,
    /// Name of the Service in front of the webhook (its DNS names go into the certificate).
    pub service_name: String,
    /// Where the CA goes as `caBundle`.
    pub targets: Vec<CaBundleTarget>,
    /// Who manages the Secret (its `app.kubernetes.io/managed-by` label).
    pub manager: &'static str,
    /// CA lifetime.
    pub ca_lifetime: Duration,
    /// Serving certificate lifetime (renewed after [`RENEWAL_FRACTION`] of it).
    pub cert_lifetime: Duration,
}

impl SelfSignedConfig {
    /// The serving certificate's DNS names.
    pub fn dns_names(&self) -> Vec<String> {
        smolvm_certs::webhook_service_dns_names(&self.service_name, &self.namespace)
    }
}

/// The CA and serving pair, as PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    /// CA certificate (the caBundle).
    pub ca_cert_pem: String,
    /// CA key.
    pub ca_key_pem: String,
    /// Serving certificate.
    pub cert_pem: String,
    /// Serving key.
    pub key_pem: String,
}

/// A fresh CA and serving certificate.
pub fn generate(cfg: &SelfSignedConfig) -> Result<Material> {
    let ca = CertificateAuthority::generate(&format!("{}-ca", cfg.service_name), cfg.ca_lifetime)?;
    let leaf = ca.issue_server(&cfg.dns_names(), &[], cfg.cert_lifetime)?;
    Ok(Material {
        ca_cert_pem: ca.cert_pem().to_string(),
        ca_key_pem: ca.key_pem().to_string(),
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
    })
}

/// A new serving certificate from the same CA.
pub fn reissue_leaf(material: &Material, cfg: &SelfSignedConfig) -> Result<Material> {
    let ca = CertificateAuthority::from_pem(&material.ca_cert_pem, &material.ca_key_pem)?;
    let leaf = ca.issue_server(&cfg.dns_names(), &[], cfg.cert_lifetime)?;
    Ok(Material {
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
        ..material.clone()
    })
}

fn secret_text(data: &BTreeMap<String, ByteString>, key: &str, name: &str) -> Result<String> {
    let bytes = data.get(key).ok_or_else(|| Error::BadSecret {
        name: name.to_string(),
        message: format!("missing key {key}"),
    })?;
    String::from_utf8(bytes.0.clone()).map_err(|_| Error::BadSecret {
        name: name.to_string(),
        message: format!("key {key} is not UTF-8 PEM"),
    })
}

/// Reads the material out of a Secret (all four keys required).
pub fn material_from_secret(secret: &Secret) -> Result<Material> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    Ok(Material {
        ca_cert_pem: secret_text(data, KEY_CA_CERT, &name)?,
        ca_key_pem: secret_text(data, KEY_CA_KEY, &name)?,
        cert_pem: secret_text(data, KEY_TLS_CERT, &name)?,
        key_pem: secret_text(data, KEY_TLS_KEY, &name)?,
    })
}

fn secret_data(material: &Material) -> BTreeMap<String, ByteString> {
    [
        (KEY_CA_CERT, &material.ca_cert_pem),
        (KEY_CA_KEY, &material.ca_key_pem),
        (KEY_TLS_CERT, &material.cert_pem),
        (KEY_TLS_KEY, &material.key_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The Secret holding `material`, as created when none exists.
pub fn secret_for(cfg: &SelfSignedConfig, material: &Material) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(cfg.secret_name.clone()),
            namespace: Some(cfg.namespace.clone()),
            labels: Some(BTreeMap::from([(MANAGED_BY.to_string(), cfg.manager.to_string())])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(secret_data(material)),
        ..Default::default()
    }
}

/// Whether an existing Secret is an unfilled placeholder (pre-created by the install): it holds
/// no data at all. A Secret with some keys but not all is not one; it is reported, not
/// overwritten.
pub fn is_placeholder(secret: &Secret) -> bool {
    secret.data.as_ref().is_none_or(BTreeMap::is_empty) && secret.string_data.as_ref().is_none_or(BTreeMap::is_empty)
}

/// `existing` holding `material`, to be written with `replace`: its `resourceVersion` (the
/// precondition), type (immutable), labels and annotations are kept, and the managed-by label
/// is added where the Secret has none. An installer's own (Helm's `managed-by: Helm`) stays: the
/// write then changes the data only, so the installer's next server-side apply of the Secret
/// finds no field of its own taken over, and no conflict.
pub fn filled(cfg: &SelfSignedConfig, existing: &Secret, material: &Material) -> Secret {
    let mut next = existing.clone();
    next.metadata.managed_fields = None;
    next.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry(MANAGED_BY.to_string())
        .or_insert_with(|| cfg.manager.to_string());
    next.data = Some(secret_data(material));
    next.string_data = None;
    next
}

/// Whether the serving certificate must be (re)issued: it does not load, does not chain to
/// the CA for every Service DNS name, or has passed [`RENEWAL_FRACTION`] of its lifetime.
/// An error means the CA itself is unusable.
pub fn leaf_needs_reissue(material: &Material, cfg: &SelfSignedConfig, now: SystemTime) -> Result<bool> {
    let roots = smolvm_certs::root_store(&material.ca_cert_pem)?;
    CertificateAuthority::from_pem(&material.ca_cert_pem, &material.ca_key_pem)?;
    if ReloadableResolver::from_pem(&material.cert_pem, &material.key_pem).is_err() {
        return Ok(true);
    }
    let Ok(info) = parse_cert_pem(&material.cert_pem) else {
        return Ok(true);
    };
    if needs_renewal(&info, now, RENEWAL_FRACTION) {
        return Ok(true);
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), smolvm_certs::crypto_provider())
        .build()
        .map_err(|e| Error::Config(format!("verifier: {e}")))?;
    let chain = smolvm_certs::parse_pem_chain(&material.cert_pem)?;
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Ok(true);
    };
    let unix = UnixTime::since_unix_epoch(now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
    for dns in cfg.dns_names() {
        let Ok(name) = ServerName::try_from(dns) else {
            return Ok(true);
        };
        if verifier
            .verify_server_cert(leaf, intermediates, &name, &[], unix)
            .is_err()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// Makes sure the Secret exists and holds a current serving certificate; returns its material.
///
/// Created only if absent; on `409` the winner is read and used. An empty (pre-created) Secret
/// is filled with a new CA and serving certificate, and a serving certificate due for renewal
/// is reissued from the same CA; both are written with the `resourceVersion` read, and on `409`
/// the other writer's certificate is read and used.
pub async fn ensure_secret(api: &Api<Secret>, cfg: &SelfSignedConfig, now: SystemTime) -> Result<Material> {
    for attempt in 0..5 {
        match api.get_opt(&cfg.secret_name).await? {
            None => {
                let material = generate(cfg)?;
                match api.create(&PostParams::default(), &secret_for(cfg, &material)).await {
                    Ok(_) => {
                        tracing::info!(secret = %cfg.secret_name, "created the CA and serving certificate");
                        return Ok(material);
                    }
                    Err(e) if is_status(&e, 409) => {
                        tracing::info!(secret = %cfg.secret_name, attempt, "another replica created the Secret first; loading it");
                    }
                    Err(e) if is_status(&e, 403) => {
                        return Err(Error::BadSecret {
                            name: format!("{}/{}", cfg.namespace, cfg.secret_name),
                            message: format!(
                                "does not exist, and this ServiceAccount may not create it ({e}); apply the \
                                 install's empty Secret of that name (deploy/default) or grant `create` on secrets"
                            ),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Some(secret) => {
                let (material, done) = if is_placeholder(&secret) {
                    (
                        generate(cfg)?,
                        "filled the pre-created Secret with a new CA and serving certificate",
                    )
                } else {
                    let material = material_from_secret(&secret)?;
                    if !leaf_needs_reissue(&material, cfg, now)? {
                        return Ok(material);
                    }
                    (reissue_leaf(&material, cfg)?, "renewed the serving certificate")
                };
                match api
                    .replace(
                        &cfg.secret_name,
                        &PostParams::default(),
                        &filled(cfg, &secret, &material),
                    )
                    .await
                {
                    Ok(_) => {
                        tracing::info!(secret = %cfg.secret_name, "{done}");
                        return Ok(material);
                    }
                    Err(e) if is_status(&e, 409) => {
                        tracing::info!(secret = %cfg.secret_name, attempt, "another replica wrote the Secret first; loading theirs");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Err(Error::BadSecret {
        name: cfg.secret_name.clone(),
        message: "kept changing under concurrent writers; giving up for now".into(),
    })
}

/// The base64 text of `caBundle` for a PEM CA.
pub fn ca_bundle_value(ca_pem: &str) -> Value {
    serde_json::to_value(ByteString(ca_pem.as_bytes().to_vec())).unwrap_or(Value::Null)
}

/// A JSON patch touching only `webhooks[*].clientConfig.caBundle`, for the webhooks whose
/// caBundle differs. Each write is guarded by a `test` of that webhook's name so that a
/// concurrent reordering fails the patch instead of writing into the wrong entry.
/// `webhooks` is `(name, has clientConfig, current caBundle)` in order.
pub fn ca_bundle_patch(webhooks: &[(String, Option<ByteString>)], ca_pem: &str) -> Patch {
    let want = ByteString(ca_pem.as_bytes().to_vec());
    let value = ca_bundle_value(ca_pem);
    let mut ops = Vec::new();
    for (i, (name, current)) in webhooks.iter().enumerate() {
        if current.as_ref() == Some(&want) {
            continue;
        }
        let index = i.to_string();
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["webhooks", index.as_str(), "name"]),
            value: Value::String(name.clone()),
        }));
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["webhooks", index.as_str(), "clientConfig", "caBundle"]),
            value: value.clone(),
        }));
    }
    Patch(ops)
}

async fn patch_if_needed<K>(
    api: Api<K>,
    name: &str,
    webhooks: Vec<(String, Option<ByteString>)>,
    ca_pem: &str,
) -> Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = ca_bundle_patch(&webhooks, ca_pem);
    if patch.0.is_empty() {
        return Ok(false);
    }
    api.patch(name, &PatchParams::default(), &KubePatch::<()>::Json(patch))
        .await?;
    Ok(true)
}

/// Injects the CA into every target (only the caBundle fields). A missing configuration is
/// logged and skipped: it may be applied after this server started (a whole install applied at
/// once, on a slow cluster, can start the server first), so [`rotate_forever`] looks again soon
/// ([`MISSING_TARGET_RETRY`]). Returns the targets not found, as `Kind/name`.
pub async fn inject_ca_bundle(client: &Client, cfg: &SelfSignedConfig, ca_pem: &str) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for target in &cfg.targets {
        let found = match target {
            CaBundleTarget::MutatingWebhooks(name) => {
                let bundles = |c: MutatingWebhookConfiguration| {
                    let hooks = c.webhooks.unwrap_or_default();
                    hooks.into_iter().map(|w| (w.name, w.client_config.ca_bundle)).collect()
                };
                inject_into(
                    Api::all(client.clone()),
                    "MutatingWebhookConfiguration",
                    name,
                    bundles,
                    ca_pem,
                )
                .await?
            }
            CaBundleTarget::ValidatingWebhooks(name) => {
                let bundles = |c: ValidatingWebhookConfiguration| {
                    let hooks = c.webhooks.unwrap_or_default();
                    hooks.into_iter().map(|w| (w.name, w.client_config.ca_bundle)).collect()
                };
                inject_into(
                    Api::all(client.clone()),
                    "ValidatingWebhookConfiguration",
                    name,
                    bundles,
                    ca_pem,
                )
                .await?
            }
            CaBundleTarget::ApiService(name) => inject_into_api_service(client, name, ca_pem).await?,
        };
        if !found {
            missing.push(target.to_string());
        }
    }
    Ok(missing)
}

/// The merge patch that sets an APIService's `spec.caBundle`, or `None` when it already holds
/// `ca_pem`.
pub fn api_service_patch(current: Option<&ByteString>, ca_pem: &str) -> Option<Value> {
    let want = ByteString(ca_pem.as_bytes().to_vec());
    (current != Some(&want)).then(|| serde_json::json!({ "spec": { "caBundle": ca_bundle_value(ca_pem) } }))
}

/// `false` when the APIService does not exist (yet).
async fn inject_into_api_service(client: &Client, name: &str, ca_pem: &str) -> Result<bool> {
    let api: Api<APIService> = Api::all(client.clone());
    let Some(service) = api.get_opt(name).await? else {
        tracing::warn!(%name, kind = "APIService", "not found yet; caBundle not injected, looked for again soon");
        return Ok(false);
    };
    let current = service.spec.as_ref().and_then(|s| s.ca_bundle.as_ref());
    if let Some(patch) = api_service_patch(current, ca_pem) {
        api.patch(name, &PatchParams::default(), &KubePatch::Merge(patch))
            .await?;
        tracing::info!(%name, kind = "APIService", "caBundle injected");
    }
    Ok(true)
}

/// Patches one webhook configuration's caBundles (`bundles` lists its webhooks' names and
/// current bundles), or logs that it does not exist yet (`false`).
async fn inject_into<K>(
    api: Api<K>,
    kind: &str,
    name: &str,
    bundles: impl FnOnce(K) -> Vec<(String, Option<ByteString>)>,
    ca_pem: &str,
) -> Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_opt(name).await?.map(bundles) {
        Some(hooks) => {
            if patch_if_needed(api, name, hooks, ca_pem).await? {
                tracing::info!(%name, kind, "caBundle injected");
            }
            Ok(true)
        }
        None => {
            tracing::warn!(%name, kind, "not found yet; caBundle not injected, looked for again soon");
            Ok(false)
        }
    }
}

/// While a target of the caBundle is missing, how soon [`rotate_forever`] looks again: 1 s,
/// doubling to 30 s; once every target holds the bundle, its interval again. A webhook whose
/// configuration was created after it started is called by the API server within seconds, not
/// after the next hourly check.
pub const MISSING_TARGET_RETRY: crate::backoff::Schedule =
    crate::backoff::Schedule::new(Duration::from_secs(1), Duration::from_secs(30));

/// What a bootstrap found: the Secret's material, and the caBundle targets it did not find
/// (`Kind/name`; empty when every one holds the bundle).
#[derive(Debug, Clone)]
pub struct Bootstrapped {
    /// The CA and the serving certificate.
    pub material: Material,
    /// The targets not found.
    pub missing: Vec<String>,
}

/// One bootstrap: the Secret's material, with the caBundle injected where its targets exist.
pub async fn bootstrap(client: &Client, cfg: &SelfSignedConfig) -> Result<Bootstrapped> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let material = ensure_secret(&secrets, cfg, SystemTime::now()).await?;
    let missing = inject_ca_bundle(client, cfg, &material.ca_cert_pem).await?;
    Ok(Bootstrapped { material, missing })
}

/// The wait before the next check: `interval` when every target was found, else the retry
/// schedule's wait after `misses` checks in a row that did not find one.
pub fn next_check(interval: Duration, misses: u32) -> Duration {
    if misses == 0 {
        interval
    } else {
        MISSING_TARGET_RETRY.after(misses).min(interval)
    }
}

/// Re-checks every `interval` (sooner while a caBundle target is missing, [`next_check`]):
/// renews the serving certificate when due (or picks up another replica's renewal), swaps it
/// into `resolver` (new handshakes get it; open connections continue), and injects the caBundle
/// where it is missing or was reset. `on_swap` hears each swap: the new certificate's expiry
/// (Unix seconds) or the reason it was rejected.
pub async fn rotate_forever(
    client: Client,
    cfg: SelfSignedConfig,
    resolver: Arc<ReloadableResolver>,
    on_swap: impl Fn(std::result::Result<i64, &'static str>) + Send + 'static,
    first: Bootstrapped,
    interval: Duration,
) {
    let mut serving = first.material;
    let mut misses = u32::from(!first.missing.is_empty());
    loop {
        tokio::time::sleep(next_check(interval, misses)).await;
        match bootstrap(&client, &cfg).await {
            Ok(Bootstrapped { material, missing }) => {
                misses = if missing.is_empty() {
                    0
                } else {
                    misses.saturating_add(1)
                };
                if material.cert_pem != serving.cert_pem {
                    match resolver.swap_pem(&material.cert_pem, &material.key_pem) {
                        Ok(()) => {
                            on_swap(Ok(unix_seconds(resolver.current_not_after())));
                            tracing::info!("serving certificate rotated");
                            serving = material;
                        }
                        Err(e) => {
                            on_swap(Err(e.reason()));
                            tracing::error!(reason = e.reason(), error = %e, "rotated certificate rejected; keeping the current one");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(reason = e.reason(), error = %e, "self-signed certificate check failed; retrying")
            }
        }
    }
}

/// Seconds since the Unix epoch (0 before it).
pub fn unix_seconds(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn cfg(cert_lifetime: Duration) -> SelfSignedConfig {
        SelfSignedConfig {
            namespace: "smolvm-system".into(),
            secret_name: "smolvm-webhook-tls".into(),
            service_name: "smolvm-webhook".into(),
            targets: vec![
                CaBundleTarget::MutatingWebhooks("smolvm-webhook".into()),
                CaBundleTarget::ValidatingWebhooks("smolvm-webhook".into()),
            ],
            manager: "smolvm-webhook",
            ca_lifetime: Duration::from_secs(10 * 365 * 86_400),
            cert_lifetime,
        }
    }

    #[test]
    fn a_missing_target_is_looked_for_again_within_seconds_then_the_interval_resumes() {
        let hour = Duration::from_secs(3600);
        let table: &[(&str, Duration, u32, Duration)] = &[
            ("every target found: the interval", hour, 0, hour),
            ("first miss: 1 s", hour, 1, Duration::from_secs(1)),
            ("second miss in a row: 2 s", hour, 2, Duration::from_secs(2)),
            ("fifth: 16 s", hour, 5, Duration::from_secs(16)),
            ("many: capped at 30 s", hour, 40, Duration::from_secs(30)),
            (
                "never longer than the interval",
                Duration::from_secs(10),
                40,
                Duration::from_secs(10),
            ),
        ];
        for (case, interval, misses, want) in table {
            assert_eq!(next_check(*interval, *misses), *want, "{case}");
        }
        assert_eq!(
            CaBundleTarget::MutatingWebhooks("smolvm-webhook".into()).to_string(),
            "MutatingWebhookConfiguration/smolvm-webhook"
        );
    }

    #[test]
    fn reissue_decisions() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let c = cfg(Duration::from_secs(86_400));
        let m = generate(&c).unwrap_or_else(|e| panic!("{e}"));
        let other = generate(&c).unwrap_or_else(|e| panic!("{e}"));
        let now = SystemTime::now();
        let mut wrong_names = c.clone();
        wrong_names.service_name = "other".into();
        let foreign_leaf = Material {
            cert_pem: other.cert_pem.clone(),
            key_pem: other.key_pem.clone(),
            ..m.clone()
        };
        let table: Vec<(&str, Material, SelfSignedConfig, SystemTime, bool)> = vec![
            ("fresh", m.clone(), c.clone(), now, false),
            (
                "past 2/3 of lifetime",
                m.clone(),
                c.clone(),
                now + Duration::from_secs(60_000),
                true,
            ),
            ("other service names", m.clone(), wrong_names, now, true),
            ("leaf from another CA", foreign_leaf, c.clone(), now, true),
            (
                "garbage leaf",
                Material {
                    cert_pem: "x".into(),
                    ..m.clone()
                },
                c.clone(),
                now,
                true,
            ),
        ];
        for (what, material, config, at, want) in table {
            let got = leaf_needs_reissue(&material, &config, at).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(got, want, "{what}");
        }
        let renewed = reissue_leaf(&m, &c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(renewed.ca_cert_pem, m.ca_cert_pem);
        assert_ne!(renewed.cert_pem, m.cert_pem);
        assert!(!leaf_needs_reissue(&renewed, &c, now).unwrap_or(true));
        let bad_ca = Material {
            ca_key_pem: "x".into(),
            ..m
        };
        assert!(leaf_needs_reissue(&bad_ca, &c, now).is_err());
    }

    #[test]
    fn secret_round_trip_and_missing_keys() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let c = cfg(Duration::from_secs(86_400));
        let m = generate(&c).unwrap_or_else(|e| panic!("{e}"));
        let s = secret_for(&c, &m);
        assert_eq!(material_from_secret(&s).ok(), Some(m.clone()));
        for key in [KEY_CA_CERT, KEY_CA_KEY, KEY_TLS_CERT, KEY_TLS_KEY] {
            let mut broken = s.clone();
            if let Some(d) = broken.data.as_mut() {
                d.remove(key);
            }
            assert_eq!(
                material_from_secret(&broken).err().map(|e| e.reason()),
                Some("BadSecret"),
                "{key}"
            );
            // A Secret missing some keys is reported, never treated as an empty placeholder.
            assert!(!is_placeholder(&broken), "{key}");
        }
        assert!(is_placeholder(&Secret::default()));
        let empty = Secret {
            data: Some(BTreeMap::new()),
            ..Default::default()
        };
        assert!(is_placeholder(&empty));
        let filled_empty = filled(&c, &empty, &m);
        assert_eq!(material_from_secret(&filled_empty).ok(), Some(m.clone()));
        assert_eq!(filled_empty.type_, None, "the existing type is kept");
        assert_eq!(
            filled_empty.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)),
            Some(&c.manager.to_string()),
            "an unlabelled placeholder is labelled as the webhook's"
        );
        // A placeholder an installer labelled (Helm's chart) keeps every label as it was.
        let labels = BTreeMap::from([
            (MANAGED_BY.to_string(), "Helm".to_string()),
            ("helm.sh/chart".to_string(), "smolvm-operator-0.1.0".to_string()),
        ]);
        let labelled = Secret {
            metadata: ObjectMeta {
                labels: Some(labels.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(filled(&c, &labelled, &m).metadata.labels, Some(labels));
    }

    #[test]
    fn ca_bundle_patch_touches_only_stale_bundles() {
        let ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let hooks = vec![
            ("m.vm.smolvm.dev".to_string(), None),
            ("v.vm.smolvm.dev".to_string(), Some(ByteString(ca.as_bytes().to_vec()))),
            ("n.vm.smolvm.dev".to_string(), Some(ByteString(b"old".to_vec()))),
        ];
        let patch = ca_bundle_patch(&hooks, ca);
        let json = serde_json::to_value(&patch).unwrap_or_default();
        let b64 = ca_bundle_value(ca);
        assert_eq!(
            json,
            serde_json::json!([
                {"op": "test", "path": "/webhooks/0/name", "value": "m.vm.smolvm.dev"},
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": b64},
                {"op": "test", "path": "/webhooks/2/name", "value": "n.vm.smolvm.dev"},
                {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": b64},
            ])
        );
        assert!(ca_bundle_patch(&hooks[1..2], ca).0.is_empty());
    }

    #[test]
    fn api_service_patch_only_when_stale() {
        let ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let same = ByteString(ca.as_bytes().to_vec());
        let old = ByteString(b"old".to_vec());
        let table: [(&str, Option<&ByteString>, bool); 3] = [
            ("unset", None, true),
            ("stale", Some(&old), true),
            ("current", Some(&same), false),
        ];
        for (what, current, want) in table {
            let patch = api_service_patch(current, ca);
            assert_eq!(patch.is_some(), want, "{what}");
            if let Some(patch) = patch {
                assert_eq!(patch["spec"]["caBundle"], ca_bundle_value(ca), "{what}");
            }
        }
    }
}
