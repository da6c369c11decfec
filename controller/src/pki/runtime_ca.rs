//! The runtime CA: made once, kept in a Secret only the controller reads, published as a bundle
//! in a ConfigMap the agents mount, and rotated without cutting a node off.
//!
//! The CA signs two things: the agents' serving certificates (through their CSRs) and the
//! controller's client certificate for the node API. An agent trusts the bundle for client
//! certificates; the controller trusts it for serving certificates.
//!
//! A rotation (asked for with the Secret annotation [`ROTATE_RUNTIME_CA_ANNOTATION`], or due at
//! two thirds of the CA's life) keeps both CAs trusted until every live node's agent serves a
//! certificate from the new one:
//! 1. Begin: a new CA signs from now on; the old one is kept in the Secret (`previous.crt`,
//!    `previous.key`) and the bundle lists the new CA first and the old one after it. The
//!    controller trusts both and keeps presenting a client certificate from the old CA, which
//!    every agent trusts whether or not its bundle has changed yet.
//! 2. Each agent, as soon as it trusts the new bundle, files a CSR, serves the new certificate and
//!    reports the new CA's fingerprint in `status.servingCertificate.caFingerprint`.
//! 3. Finish, once every node with a fresh heartbeat reports it: the old CA is dropped, the
//!    controller presents a client certificate from the new CA (which those agents trust, having
//!    re-filed only after trusting it) and trusts only the new CA. A node that was away meanwhile
//!    re-files when it comes back and sees the new bundle.
//!
//! [`rotation_step`] decides; [`run_rotation`] does the I/O.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::{ByteString, api::core::v1::ObjectReference};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use smolvm_api::SmolVMNode;
use smolvm_api::constants::{FIELD_MANAGER_CONTROLLER, ROTATE_RUNTIME_CA_ANNOTATION};
use smolvm_certs::{
    CertificateAuthority, RENEWAL_FRACTION, ReloadableResolver, fingerprint, needs_renewal, parse_cert_pem,
};

use crate::events::EventSink;
use crate::nodeclient::{ClientTls, client_tls};
use crate::pki::SignerError;

/// Name of the Secret holding the runtime CA (certificate and key); only the controller reads it.
pub const CA_SECRET: &str = smolvm_api::constants::RUNTIME_CA;
/// Name of the ConfigMap publishing the runtime CA bundle (`ca.crt`) to the runtime agents.
pub const CA_CONFIGMAP: &str = smolvm_api::constants::RUNTIME_CA;
/// Lifetime of the runtime serving certificates and of the controller's client certificate.
pub const LEAF_LIFETIME: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Lifetime of the runtime CA.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Common name of every runtime CA.
const CA_NAME: &str = "smolvm-runtime-ca";
/// Secret keys of the previous CA, present during a rotation.
const PREVIOUS_CRT: &str = "previous.crt";
const PREVIOUS_KEY: &str = "previous.key";

/// What to do about the runtime CA at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaAction {
    /// Load the CA from its Secret.
    Load,
    /// Make the first CA (or, when allowed, a new one).
    Generate,
    /// Refuse: the Secret is gone while agents still trust (and serve with) the old CA.
    Refuse,
}

/// Pure: the CA action, given whether the Secret exists, how many SmolVMNodes exist, and whether
/// a new CA was explicitly allowed.
pub fn ca_action(secret_exists: bool, nodes: usize, allow_new: bool) -> CaAction {
    match (secret_exists, nodes, allow_new) {
        (true, _, _) => CaAction::Load,
        (false, 0, _) | (false, _, true) => CaAction::Generate,
        (false, _, false) => CaAction::Refuse,
    }
}

/// The runtime CAs in force: the one signing now and, during a rotation, the one before it.
#[derive(Clone, Debug)]
pub struct CaSet {
    /// Signs every new certificate.
    pub current: Arc<CertificateAuthority>,
    /// Still trusted until the rotation finishes.
    pub previous: Option<Arc<CertificateAuthority>>,
}

impl CaSet {
    /// One CA, no rotation under way.
    pub fn single(ca: CertificateAuthority) -> Self {
        CaSet {
            current: Arc::new(ca),
            previous: None,
        }
    }

    /// Reads the CAs from the Secret's data.
    pub fn from_secret(secret: &Secret) -> Result<Self, SignerError> {
        let current = CertificateAuthority::from_pem(
            &secret_text(secret, "tls.crt")?.ok_or(SignerError::Incomplete(CA_SECRET, "tls.crt"))?,
            &secret_text(secret, "tls.key")?.ok_or(SignerError::Incomplete(CA_SECRET, "tls.key"))?,
        )?;
        let previous = match (secret_text(secret, PREVIOUS_CRT)?, secret_text(secret, PREVIOUS_KEY)?) {
            (Some(cert), Some(key)) => Some(Arc::new(CertificateAuthority::from_pem(&cert, &key)?)),
            (None, None) => None,
            (Some(_), None) => return Err(SignerError::Incomplete(CA_SECRET, PREVIOUS_KEY)),
            (None, Some(_)) => return Err(SignerError::Incomplete(CA_SECRET, PREVIOUS_CRT)),
        };
        Ok(CaSet {
            current: Arc::new(current),
            previous,
        })
    }

    /// The Secret's data for these CAs.
    pub fn secret_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::from([
            ("tls.crt".to_string(), bytes(self.current.cert_pem())),
            ("tls.key".to_string(), bytes(self.current.key_pem())),
        ]);
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS_CRT.to_string(), bytes(previous.cert_pem()));
            data.insert(PREVIOUS_KEY.to_string(), bytes(previous.key_pem()));
        }
        data
    }

    /// The published bundle: the signing CA first, then the previous one (if any).
    pub fn bundle_pem(&self) -> String {
        let mut bundle = self.current.cert_pem().to_string();
        if let Some(previous) = &self.previous {
            if !bundle.ends_with('\n') {
                bundle.push('\n');
            }
            bundle.push_str(previous.cert_pem());
        }
        bundle
    }

    /// The CA the controller's client certificate comes from: during a rotation the previous one,
    /// which every agent trusts whether or not it has seen the new bundle yet.
    pub fn client_issuer(&self) -> &Arc<CertificateAuthority> {
        self.previous.as_ref().unwrap_or(&self.current)
    }

    /// Fingerprint of the signing CA, as agents report it.
    pub fn current_fingerprint(&self) -> String {
        fingerprint(self.current.cert_der())
    }

    /// Whether both sets hold the same certificates.
    pub fn same_as(&self, other: &CaSet) -> bool {
        self.current.cert_pem() == other.current.cert_pem()
            && self.previous.as_ref().map(|p| p.cert_pem()) == other.previous.as_ref().map(|p| p.cert_pem())
    }
}

fn bytes(text: &str) -> ByteString {
    ByteString(text.as_bytes().to_vec())
}

fn secret_text(secret: &Secret, key: &'static str) -> Result<Option<String>, SignerError> {
    match secret.data.as_ref().and_then(|d| d.get(key)) {
        None => Ok(None),
        Some(b) => String::from_utf8(b.0.clone())
            .map(Some)
            .map_err(|_| SignerError::Incomplete(CA_SECRET, key)),
    }
}

/// What the controller does with the runtime CAs, swapped as a whole when they change: it signs
/// with the current one, verifies agents against the bundle, and presents a client certificate
/// from [`CaSet::client_issuer`].
pub struct RuntimeTrust {
    cas: RwLock<CaSet>,
    tls: Arc<ClientTls>,
    client_cert: Arc<ReloadableResolver>,
}

impl std::fmt::Debug for RuntimeTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeTrust")
            .field("current", &self.cas().current_fingerprint())
            .field("rotating", &self.cas().previous.is_some())
            .finish()
    }
}

impl RuntimeTrust {
    /// Trust in `cas`, with a client certificate from its client issuer.
    pub fn new(cas: CaSet) -> Result<Arc<Self>, SignerError> {
        let issued = cas
            .client_issuer()
            .issue_client(FIELD_MANAGER_CONTROLLER, LEAF_LIFETIME)?;
        let client_cert = Arc::new(ReloadableResolver::from_pem(&issued.cert_pem, &issued.key_pem)?);
        Ok(Arc::new(RuntimeTrust {
            tls: ClientTls::new(client_tls(&cas.bundle_pem(), client_cert.clone())?),
            client_cert,
            cas: RwLock::new(cas),
        }))
    }

    /// The CAs in force.
    pub fn cas(&self) -> CaSet {
        self.cas.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The CA that signs agents' certificates now.
    pub fn signing(&self) -> Arc<CertificateAuthority> {
        self.cas().current
    }

    /// Puts `next` in force: agents' certificates are verified against its bundle from the next
    /// handshake on, and the client certificate is re-issued if its issuer changes.
    pub fn install(&self, next: CaSet) -> Result<(), SignerError> {
        // Built first: a bundle that does not parse leaves everything as it was.
        let config = client_tls(&next.bundle_pem(), self.client_cert.clone())?;
        if self.cas().client_issuer().cert_pem() != next.client_issuer().cert_pem() {
            let issued = next
                .client_issuer()
                .issue_client(FIELD_MANAGER_CONTROLLER, LEAF_LIFETIME)?;
            self.client_cert.swap_pem(&issued.cert_pem, &issued.key_pem)?;
        }
        self.tls.replace(config);
        *self.cas.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    /// The node API client's TLS, which follows [`RuntimeTrust::install`]: WebPKI verification
    /// of every agent against the bundle in force, and the current client certificate.
    pub fn client_tls(&self) -> Arc<ClientTls> {
        self.tls.clone()
    }

    /// Re-issues the client certificate once two thirds of its life have passed; checks every
    /// minute at most. Runs until aborted.
    pub async fn keep_client_cert_fresh(self: Arc<Self>) {
        loop {
            let info = self.client_cert.current_cert_info();
            let lifetime = info.not_after.duration_since(info.not_before).unwrap_or_default();
            let renew_at = info.not_before + lifetime.mul_f64(RENEWAL_FRACTION);
            let wait = renew_at.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::time::sleep(wait.max(Duration::from_secs(60))).await;
            if !needs_renewal(
                &self.client_cert.current_cert_info(),
                SystemTime::now(),
                RENEWAL_FRACTION,
            ) {
                continue;
            }
            match self
                .cas()
                .client_issuer()
                .issue_client(FIELD_MANAGER_CONTROLLER, LEAF_LIFETIME)
                .and_then(|c| self.client_cert.swap_pem(&c.cert_pem, &c.key_pem))
            {
                Ok(()) => tracing::info!("rotated the node API client certificate"),
                Err(e) => {
                    tracing::error!(error = %e, reason = e.reason(), "client certificate rotation failed; retrying")
                }
            }
        }
    }
}

/// What a node tells about its trust in the runtime CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTrust {
    /// SmolVMNode name.
    pub name: String,
    /// Its heartbeat is fresh: its agent runs and would be cut off by dropping a CA it uses.
    pub live: bool,
    /// Fingerprint of the CA that signed its serving certificate, as reported.
    pub ca_fingerprint: Option<String>,
}

impl NodeTrust {
    /// What `node` reports, judged live at `now` as `liveness` says (the controller's clock: a
    /// far-future heartbeat never keeps a dead node live and so never blocks a rotation).
    pub fn of(node: &SmolVMNode, now: Timestamp, liveness: &crate::placement::Config) -> Self {
        NodeTrust {
            name: node.metadata.name.clone().unwrap_or_default(),
            live: liveness.fresh(node, now),
            ca_fingerprint: node
                .status
                .as_ref()
                .and_then(|s| s.serving_certificate.as_ref())
                .and_then(|c| c.ca_fingerprint.clone()),
        }
    }
}

/// Why a rotation begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotationCause {
    /// The Secret carries the rotation annotation.
    Requested,
    /// Two thirds of the CA's life have passed.
    CaExpiring,
}

/// The next rotation step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rotation {
    /// Nothing to do.
    Idle,
    /// Make a new CA and start trusting both.
    Begin(RotationCause),
    /// Rotating: these live nodes still serve a certificate from another CA.
    Waiting(Vec<String>),
    /// Every live node has a certificate from the new CA: drop the old one.
    Finish,
}

/// Pure: the next step, given whether a rotation is under way, whether one is asked for or due,
/// the signing CA's fingerprint and what the nodes report. Nodes whose heartbeat is stale do not
/// hold a rotation up: their agents re-file when they come back and read the new bundle.
pub fn rotation_step(
    rotating: bool,
    requested: bool,
    ca_expiring: bool,
    current_fingerprint: &str,
    nodes: &[NodeTrust],
) -> Rotation {
    if !rotating {
        return match (requested, ca_expiring) {
            (true, _) => Rotation::Begin(RotationCause::Requested),
            (false, true) => Rotation::Begin(RotationCause::CaExpiring),
            (false, false) => Rotation::Idle,
        };
    }
    let mut pending: Vec<String> = nodes
        .iter()
        .filter(|n| n.live && n.ca_fingerprint.as_deref() != Some(current_fingerprint))
        .map(|n| n.name.clone())
        .collect();
    pending.sort();
    if pending.is_empty() {
        Rotation::Finish
    } else {
        Rotation::Waiting(pending)
    }
}

/// Loads the runtime CAs from their Secret, creating the first CA once if absent (never while
/// SmolVMNodes exist, unless `allow_new`: see [`ca_action`]). When two replicas race, the one
/// whose create loses (409) loads the winner's. Then publishes the bundle.
pub async fn ensure_runtime_ca(client: kube::Client, namespace: &str, allow_new: bool) -> Result<CaSet, SignerError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let existing = secrets.get_opt(CA_SECRET).await?;
    let nodes = if existing.is_some() {
        0
    } else {
        let nodes: Api<SmolVMNode> = Api::all(client.clone());
        nodes
            .list_metadata(&ListParams::default().limit(500))
            .await?
            .items
            .len()
    };
    let action = ca_action(existing.is_some(), nodes, allow_new);
    let secret = match (existing, action) {
        (Some(s), _) => s,
        (None, CaAction::Refuse) => return Err(SignerError::CaMissing(nodes)),
        (None, _) => {
            if nodes > 0 {
                tracing::warn!(
                    nodes,
                    "making a new runtime CA as --allow-new-runtime-ca asks; every agent re-files its serving certificate when it reads the new CA"
                );
            }
            let cas = CaSet::single(CertificateAuthority::generate(CA_NAME, CA_LIFETIME)?);
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(CA_SECRET.into()),
                    ..Default::default()
                },
                type_: Some("kubernetes.io/tls".into()),
                data: Some(cas.secret_data()),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                Err(kube::Error::Api(s)) if s.code == 409 => secrets.get(CA_SECRET).await?,
                Err(e) => return Err(e.into()),
            }
        }
    };
    let cas = CaSet::from_secret(&secret)?;
    publish(&Api::namespaced(client, namespace), &cas).await?;
    Ok(cas)
}

/// Publishes the bundle in the ConfigMap the agents mount (server-side apply).
pub async fn publish(configmaps: &Api<ConfigMap>, cas: &CaSet) -> Result<(), SignerError> {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CA_CONFIGMAP},
        "data": {"ca.crt": cas.bundle_pem()}
    });
    configmaps
        .patch(
            CA_CONFIGMAP,
            &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

/// Whether the CA is past two thirds of its life.
fn ca_expiring(ca: &CertificateAuthority, now: SystemTime) -> bool {
    parse_cert_pem(ca.cert_pem()).is_ok_and(|info| needs_renewal(&info, now, RENEWAL_FRACTION))
}

/// Everything [`run_rotation`] needs.
pub struct RotationContext {
    /// API client.
    pub client: kube::Client,
    /// The controller's namespace (Secret, ConfigMap).
    pub namespace: String,
    /// The trust to keep current.
    pub trust: Arc<RuntimeTrust>,
    /// The SmolVMNode cache.
    pub nodes: Store<SmolVMNode>,
    /// How heartbeats are judged (the controller's clock).
    pub liveness: crate::placement::Config,
    /// Where events go.
    pub events: EventSink,
}

/// Looks at the runtime CA every `interval` and takes the next rotation step. Also follows the
/// Secret when it changes under the controller (another replica rotated, or an administrator
/// restored a backup). Runs until aborted.
pub async fn run_rotation(ctx: RotationContext, interval: Duration) {
    let mut waiting_for: Vec<String> = Vec::new();
    loop {
        tokio::time::sleep(interval).await;
        match rotation_tick(&ctx, &mut waiting_for).await {
            Ok(()) => {}
            Err(error) => {
                tracing::warn!(%error, reason = error.reason(), "runtime CA rotation step failed; retrying")
            }
        }
    }
}

async fn rotation_tick(ctx: &RotationContext, waiting_for: &mut Vec<String>) -> Result<(), SignerError> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let Some(mut secret) = secrets.get_opt(CA_SECRET).await? else {
        tracing::error!(
            secret = CA_SECRET,
            "the runtime CA Secret is gone; keeping the CA in memory. Restore the Secret from a backup (docs/operations.md, \"Certificate rotation\")"
        );
        return Ok(());
    };
    let stored = CaSet::from_secret(&secret)?;
    if !stored.same_as(&ctx.trust.cas()) {
        tracing::info!(
            current = %stored.current_fingerprint(),
            rotating = stored.previous.is_some(),
            "the runtime CA Secret changed; following it"
        );
        ctx.trust.install(stored.clone())?;
        publish(&configmaps, &stored).await?;
    }
    let requested = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROTATE_RUNTIME_CA_ANNOTATION))
        .is_some_and(|v| v == "true");
    let now = Timestamp::now();
    let nodes: Vec<NodeTrust> = ctx
        .nodes
        .state()
        .iter()
        .map(|n| NodeTrust::of(n, now, &ctx.liveness))
        .collect();
    let current_fingerprint = stored.current_fingerprint();
    let step = rotation_step(
        stored.previous.is_some(),
        requested,
        ca_expiring(&stored.current, SystemTime::now()),
        &current_fingerprint,
        &nodes,
    );
    match step {
        Rotation::Idle => {}
        Rotation::Begin(cause) => {
            let next = CaSet {
                current: Arc::new(CertificateAuthority::generate(CA_NAME, CA_LIFETIME)?),
                previous: Some(stored.current.clone()),
            };
            if let Some(annotations) = secret.metadata.annotations.as_mut() {
                annotations.remove(ROTATE_RUNTIME_CA_ANNOTATION);
            }
            commit(ctx, &secrets, &configmaps, secret, &next).await?;
            let why = match cause {
                RotationCause::Requested => format!("the annotation {ROTATE_RUNTIME_CA_ANNOTATION} asked for it"),
                RotationCause::CaExpiring => "the CA passed two thirds of its lifetime".to_string(),
            };
            let note = format!(
                "runtime CA rotation started ({why}): new CA {}; the old CA {} stays trusted until every live node's agent serves a certificate from the new one",
                next.current_fingerprint(),
                current_fingerprint
            );
            tracing::info!("{note}");
            ctx.event(EventType::Normal, "RuntimeCARotationStarted", note).await;
        }
        Rotation::Waiting(pending) => {
            if *waiting_for != pending {
                tracing::info!(
                    pending = pending.len(),
                    nodes = %pending.iter().take(10).cloned().collect::<Vec<_>>().join(", "),
                    "runtime CA rotation: waiting for these nodes' agents to serve a certificate from the new CA"
                );
                *waiting_for = pending;
            }
        }
        Rotation::Finish => {
            let next = CaSet {
                current: stored.current.clone(),
                previous: None,
            };
            commit(ctx, &secrets, &configmaps, secret, &next).await?;
            waiting_for.clear();
            let note = format!(
                "runtime CA rotation finished: every live node serves a certificate from {current_fingerprint}; the old CA is no longer trusted"
            );
            tracing::info!("{note}");
            ctx.event(EventType::Normal, "RuntimeCARotated", note).await;
        }
    }
    Ok(())
}

/// Stores `next` in the CA Secret, puts it in force and publishes its bundle. The `secret` as read
/// carries its resourceVersion, so the write is a compare-and-swap: a concurrent change (409) is
/// seen on the next look, and nothing else is done.
async fn commit(
    ctx: &RotationContext,
    secrets: &Api<Secret>,
    configmaps: &Api<ConfigMap>,
    mut secret: Secret,
    next: &CaSet,
) -> Result<(), SignerError> {
    secret.data = Some(next.secret_data());
    secrets.replace(CA_SECRET, &PostParams::default(), &secret).await?;
    ctx.trust.install(next.clone())?;
    publish(configmaps, next).await
}

impl RotationContext {
    async fn event(&self, type_: EventType, reason: &str, note: String) {
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Secret".into()),
            name: Some(CA_SECRET.into()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "RotateRuntimeCA".into(),
            secondary: None,
        };
        if let Err(error) = self.events.publish(&event, &regarding).await {
            tracing::warn!(%error, reason, "could not publish the event");
        }
    }
}

/// Tells each SmolVMNode (as a Warning event) that the runtime CA is missing and how to recover.
pub async fn report_missing_ca(client: &kube::Client, events: &EventSink, error: &SignerError) {
    let nodes: Api<SmolVMNode> = Api::all(client.clone());
    let Ok(list) = nodes.list_metadata(&ListParams::default().limit(500)).await else {
        return;
    };
    let event = Event {
        type_: EventType::Warning,
        reason: error.reason().into(),
        note: Some(error.to_string()),
        action: "LoadRuntimeCA".into(),
        secondary: None,
    };
    for node in list.items {
        let regarding = crate::events::node_reference(node.metadata.name.clone(), node.metadata.uid.clone());
        if let Err(e) = events.publish(&event, &regarding).await {
            tracing::warn!(error = %e, "could not publish the RuntimeCAMissing event");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_runtime_ca_is_made_only_when_no_node_trusts_the_old_one() {
        let cases = [
            ("secret present", true, 3, false, CaAction::Load),
            ("first install", false, 0, false, CaAction::Generate),
            ("secret lost with nodes", false, 3, false, CaAction::Refuse),
            ("secret lost, new CA asked for", false, 3, true, CaAction::Generate),
            ("secret present, flag left on", true, 3, true, CaAction::Load),
        ];
        for (name, secret, nodes, allow, expected) in cases {
            assert_eq!(ca_action(secret, nodes, allow), expected, "{name}");
        }
        let refusal = SignerError::CaMissing(3).to_string();
        assert!(
            refusal.contains("--allow-new-runtime-ca") && refusal.contains("3 SmolVMNode"),
            "{refusal}"
        );
        assert_eq!(SignerError::CaMissing(3).reason(), "RuntimeCAMissing");
    }

    fn node(name: &str, live: bool, fingerprint: Option<&str>) -> NodeTrust {
        NodeTrust {
            name: name.into(),
            live,
            ca_fingerprint: fingerprint.map(str::to_string),
        }
    }

    #[test]
    fn rotation_steps() {
        let new = "sha256:new";
        let mixed = [
            node("b", true, Some("sha256:old")),
            node("a", true, None),
            node("c", true, Some(new)),
            node("away", false, Some("sha256:old")),
        ];
        let done = [node("c", true, Some(new)), node("away", false, Some("sha256:old"))];
        // (name, rotating, requested, CA expiring, nodes, expected)
        type Case<'a> = (&'a str, bool, bool, bool, &'a [NodeTrust], Rotation);
        let cases: [Case<'_>; 8] = [
            ("nothing asked", false, false, false, &mixed, Rotation::Idle),
            (
                "asked",
                false,
                true,
                false,
                &mixed,
                Rotation::Begin(RotationCause::Requested),
            ),
            (
                "CA expiring",
                false,
                false,
                true,
                &[],
                Rotation::Begin(RotationCause::CaExpiring),
            ),
            (
                "asked and expiring: the request is the cause",
                false,
                true,
                true,
                &[],
                Rotation::Begin(RotationCause::Requested),
            ),
            (
                "rotating: live nodes without the new CA hold it, sorted; a node away does not",
                true,
                false,
                false,
                &mixed,
                Rotation::Waiting(vec!["a".into(), "b".into()]),
            ),
            (
                "rotating, every live node re-filed",
                true,
                false,
                false,
                &done,
                Rotation::Finish,
            ),
            ("rotating, no nodes", true, false, false, &[], Rotation::Finish),
            (
                "rotating and asked again: finish first",
                true,
                true,
                false,
                &done,
                Rotation::Finish,
            ),
        ];
        for (name, rotating, requested, expiring, nodes, expected) in cases {
            assert_eq!(
                rotation_step(rotating, requested, expiring, new, nodes),
                expected,
                "{name}"
            );
        }
    }

    fn secret_of(cas: &CaSet) -> Secret {
        Secret {
            data: Some(cas.secret_data()),
            ..Default::default()
        }
    }

    #[test]
    fn ca_sets_round_trip_through_the_secret_and_publish_the_signing_ca_first() {
        let old = CertificateAuthority::generate(CA_NAME, Duration::from_secs(3600)).expect("old");
        let new = CertificateAuthority::generate(CA_NAME, Duration::from_secs(3600)).expect("new");
        let single = CaSet::single(old);
        let rotating = CaSet {
            current: Arc::new(new),
            previous: Some(single.current.clone()),
        };
        for cas in [&single, &rotating] {
            let back = CaSet::from_secret(&secret_of(cas)).expect("round trip");
            assert!(back.same_as(cas));
        }
        let bundle = smolvm_certs::parse_pem_chain(&rotating.bundle_pem()).expect("bundle");
        assert_eq!(bundle.len(), 2);
        assert_eq!(fingerprint(&bundle[0]), rotating.current_fingerprint());
        assert_eq!(
            rotating.client_issuer().cert_pem(),
            single.current.cert_pem(),
            "during a rotation the client certificate comes from the CA every agent trusts"
        );
        assert_eq!(single.client_issuer().cert_pem(), single.current.cert_pem());
        let mut half = secret_of(&rotating);
        if let Some(data) = half.data.as_mut() {
            data.remove(PREVIOUS_KEY);
        }
        assert_eq!(
            CaSet::from_secret(&half).map(|_| ()).map_err(|e| e.reason()),
            Err("CASecretIncomplete")
        );
        assert_eq!(
            CaSet::from_secret(&Secret::default())
                .map(|_| ())
                .map_err(|e| e.reason()),
            Err("CASecretIncomplete")
        );
    }
}
