//! The self-signed bootstrap of two replicas racing against one API server.
//!
//! The kube API server cannot run here, so it is replaced by a TEST DOUBLE (`FakeApiServer`)
//! behind tower-test mock services: it stores Secrets and webhook configurations, answers
//! `409 AlreadyExists` to a second create and `409 Conflict` to a stale replace (or `403` to any
//! create, when told to), and applies
//! JSON patches. It makes both replicas read "no Secret" (or the same stale Secret) before
//! either writes, so the race really happens.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use http::Method;
use serde_json::{Value, json};
use smolvm_kit::selfsigned::{self, CaBundleTarget, Material, SelfSignedConfig, ca_bundle_value};
use tokio::sync::Barrier;

const NS: &str = "smolvm-system";
const SECRET: &str = "smolvm-webhook-tls";
const SECRETS: &str = "/api/v1/namespaces/smolvm-system/secrets";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/smolvm-webhook";
const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/smolvm-webhook";

fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

fn cfg() -> SelfSignedConfig {
    SelfSignedConfig {
        namespace: NS.into(),
        secret_name: SECRET.into(),
        service_name: "smolvm-webhook".into(),
        targets: vec![
            CaBundleTarget::MutatingWebhooks("smolvm-webhook".into()),
            CaBundleTarget::ValidatingWebhooks("smolvm-webhook".into()),
        ],
        manager: "smolvm-webhook",
        ca_lifetime: Duration::from_secs(3650 * 86_400),
        cert_lifetime: Duration::from_secs(3 * 86_400),
    }
}

#[derive(Default)]
struct Store {
    secret: Option<Value>,
    resource_version: u64,
    objects: BTreeMap<&'static str, Value>,
    creates_ok: u32,
    creates_conflict: u32,
    replaces_ok: u32,
    replaces_conflict: u32,
    patches: Vec<(String, Value)>,
    secret_gets: u32,
    /// Answer `403 Forbidden` to a Secret create (a ServiceAccount without `create`).
    create_forbidden: bool,
}

/// TEST DOUBLE of kube-apiserver for Secrets and webhook configurations.
#[derive(Clone)]
struct FakeApiServer {
    store: Arc<Mutex<Store>>,
    /// The first two Secret GETs wait for each other, so both replicas see the same state.
    barrier: Arc<Barrier>,
}

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code}),
    )
}

fn webhook_configuration(kind: &str, hooks: &[&str]) -> Value {
    let webhooks: Vec<Value> = hooks
        .iter()
        .map(|name| {
            json!({
                "name": name,
                "clientConfig": {"service": {"name": "smolvm-webhook", "namespace": NS, "path": "/x", "port": 443}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
            })
        })
        .collect();
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "smolvm-webhook", "resourceVersion": "1"}, "webhooks": webhooks})
}

impl FakeApiServer {
    fn new(secret: Option<Value>) -> Self {
        let mut store = Store {
            resource_version: 10,
            ..Default::default()
        };
        if let Some(mut s) = secret {
            s["metadata"]["resourceVersion"] = json!("10");
            store.secret = Some(s);
        }
        store.objects.insert(
            MWC,
            webhook_configuration("MutatingWebhookConfiguration", &["mutate.smolvms.vm.smolvm.dev"]),
        );
        store.objects.insert(
            VWC,
            webhook_configuration(
                "ValidatingWebhookConfiguration",
                &["validate.smolvms.vm.smolvm.dev", "validate.smolvmnodes.vm.smolvm.dev"],
            ),
        );
        FakeApiServer {
            store: Arc::new(Mutex::new(store)),
            barrier: Arc::new(Barrier::new(2)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn handle(&self, method: Method, path: String, body: Vec<u8>) -> (u16, Value) {
        let secret_path = format!("{SECRETS}/{SECRET}");
        if method == Method::GET && path == secret_path {
            let first_two = {
                let mut s = self.lock();
                s.secret_gets += 1;
                s.secret_gets <= 2
            };
            // Read the state, then (for the first two reads) wait until the other replica
            // has read too before answering.
            let answer = match self.lock().secret.clone() {
                Some(secret) => (200, secret),
                None => status(404, "NotFound", "secrets \"smolvm-webhook-tls\" not found"),
            };
            if first_two {
                self.barrier.wait().await;
            }
            return answer;
        }
        let mut s = self.lock();
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        match (method, path.as_str()) {
            (Method::POST, SECRETS) => {
                if s.create_forbidden {
                    return status(
                        403,
                        "Forbidden",
                        "secrets is forbidden: User \"system:serviceaccount:smolvm-system:smolvm-webhook\" cannot create resource \"secrets\"",
                    );
                }
                if s.secret.is_some() {
                    s.creates_conflict += 1;
                    return status(409, "AlreadyExists", "secrets \"smolvm-webhook-tls\" already exists");
                }
                s.creates_ok += 1;
                s.resource_version += 1;
                let mut secret = parsed;
                secret["metadata"]["resourceVersion"] = json!(s.resource_version.to_string());
                s.secret = Some(secret.clone());
                (201, secret)
            }
            (Method::PUT, p) if p == secret_path => {
                let current = s.resource_version.to_string();
                if parsed["metadata"]["resourceVersion"] != json!(current) {
                    s.replaces_conflict += 1;
                    return status(409, "Conflict", "the object has been modified");
                }
                s.replaces_ok += 1;
                s.resource_version += 1;
                let mut secret = parsed;
                secret["metadata"]["resourceVersion"] = json!(s.resource_version.to_string());
                s.secret = Some(secret.clone());
                (200, secret)
            }
            (Method::GET, p) if p == MWC || p == VWC => {
                let key = if p == MWC { MWC } else { VWC };
                match s.objects.get(key) {
                    Some(object) => (200, object.clone()),
                    None => status(404, "NotFound", "no such configuration"),
                }
            }
            (Method::PATCH, p) if p == MWC || p == VWC => {
                let key = if p == MWC { MWC } else { VWC };
                s.patches.push((key.to_string(), parsed.clone()));
                let patch: json_patch::Patch = match serde_json::from_value(parsed) {
                    Ok(p) => p,
                    Err(e) => return status(400, "BadRequest", &e.to_string()),
                };
                let Some(object) = s.objects.get_mut(key) else {
                    return status(404, "NotFound", "no such configuration");
                };
                let mut next = object.clone();
                if let Err(e) = json_patch::patch(&mut next, &patch) {
                    return status(422, "Invalid", &e.to_string());
                }
                *object = next.clone();
                (200, next)
            }
            (m, p) => status(404, "NotFound", &format!("the double does not serve {m} {p}")),
        }
    }

    /// A client (one replica) whose requests this fake answers, through the shared API-server
    /// double (`smolvm_testkit::apiserver`), concurrently, until the client is dropped.
    fn client(&self) -> kube::Client {
        let (client, handle) = smolvm_testkit::apiserver::client(NS);
        let fake = self.clone();
        smolvm_testkit::apiserver::serve_with(handle, move |method, path, body| {
            let fake = fake.clone();
            async move { fake.handle(method, path, body).await }
        });
        client
    }
}

fn stored_material(fake: &FakeApiServer) -> Option<Material> {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(fake.lock().secret.clone()?).ok()?;
    selfsigned::material_from_secret(&secret).ok()
}

fn bundles(fake: &FakeApiServer) -> Vec<Value> {
    let s = fake.lock();
    s.objects
        .values()
        .flat_map(|o| o["webhooks"].as_array().cloned().unwrap_or_default())
        .map(|w| w["clientConfig"]["caBundle"].clone())
        .collect()
}

/// Two replicas bootstrap at once against `fake`; both must end with the same material, which
/// is returned (the caller checks how the double saw the race).
async fn race(fake: &FakeApiServer, c: &SelfSignedConfig) -> Material {
    let (a, b) = (fake.client(), fake.client());
    let (ra, rb) = tokio::join!(selfsigned::bootstrap(&a, c), selfsigned::bootstrap(&b, c));
    let (ra, rb) = (ok(ra), ok(rb));
    assert!(ra.missing.is_empty() && rb.missing.is_empty(), "every target found");
    let (ma, mb) = (ra.material, rb.material);
    assert_eq!(ma, mb, "both replicas serve the winner's CA and certificate");
    ma
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_bootstrap_to_one_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = FakeApiServer::new(None);
    let c = cfg();
    let ma = race(&fake, &c).await;
    {
        let s = fake.lock();
        assert_eq!(
            (s.creates_ok, s.creates_conflict),
            (1, 1),
            "both tried to create; one won"
        );
    }
    assert_eq!(stored_material(&fake).as_ref(), Some(&ma));
    // Every webhook of both configurations carries the winner's CA, and only caBundle changed.
    let want = ca_bundle_value(&ma.ca_cert_pem);
    assert_eq!(bundles(&fake), vec![want.clone(), want.clone(), want]);
    for (_, patch) in fake.lock().patches.iter() {
        for op in patch.as_array().cloned().unwrap_or_default() {
            let path = op["path"].as_str().unwrap_or("");
            assert!(
                path.ends_with("/clientConfig/caBundle") || path.ends_with("/name"),
                "{path}"
            );
            assert!(op["op"] == "add" || op["op"] == "test", "{op}");
        }
    }
    // A later check is a no-op: no new Secret, no patch.
    let patches_before = fake.lock().patches.len();
    let again = ok(selfsigned::bootstrap(&fake.client(), &c).await).material;
    assert_eq!(again, ma);
    assert_eq!(fake.lock().patches.len(), patches_before);
    assert_eq!(fake.lock().creates_ok, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_renew_to_one_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = cfg();
    // A Secret whose serving certificate is past two thirds of its lifetime.
    let ca = ok(smolvm_certs::CertificateAuthority::generate(
        "smolvm-webhook-ca",
        c.ca_lifetime,
    ));
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let old_leaf = ok(ca.issue_server(
        &c.dns_names(),
        &[],
        smolvm_certs::Validity::between(now - 5 * day / 2, now + day / 2),
    ));
    let old = Material {
        ca_cert_pem: ca.cert_pem().to_string(),
        ca_key_pem: ca.key_pem().to_string(),
        cert_pem: old_leaf.cert_pem,
        key_pem: old_leaf.key_pem,
    };
    assert!(ok(selfsigned::leaf_needs_reissue(&old, &c, now)));
    let fake = FakeApiServer::new(Some(ok(serde_json::to_value(selfsigned::secret_for(&c, &old)))));
    let ma = race(&fake, &c).await;
    {
        let s = fake.lock();
        assert_eq!(
            (s.replaces_ok, s.replaces_conflict),
            (1, 1),
            "both tried to renew; one won"
        );
        assert_eq!(s.creates_ok, 0);
    }
    assert_eq!(ma.ca_cert_pem, old.ca_cert_pem, "the CA is kept");
    assert_ne!(ma.cert_pem, old.cert_pem, "the serving certificate is renewed");
    assert!(!ok(selfsigned::leaf_needs_reissue(&ma, &c, SystemTime::now())));
    assert_eq!(stored_material(&fake).as_ref(), Some(&ma));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_fill_a_precreated_empty_secret_to_one_ca() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = cfg();
    // The install's placeholder (deploy/default): no data, type Opaque, its own labels.
    let placeholder = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": SECRET, "namespace": NS,
            "labels": {"app.kubernetes.io/part-of": "smolvm-operator"},
            "annotations": {"note": "kept"},
        },
    });
    let fake = FakeApiServer::new(Some(placeholder));
    // Without `create`, as deploy/default's RBAC has it: the placeholder must be enough.
    fake.lock().create_forbidden = true;
    let ma = race(&fake, &c).await;
    {
        let s = fake.lock();
        assert_eq!(
            (s.replaces_ok, s.replaces_conflict),
            (1, 1),
            "both tried to fill it; one won"
        );
        assert_eq!((s.creates_ok, s.creates_conflict), (0, 0));
    }
    assert!(!ok(selfsigned::leaf_needs_reissue(&ma, &c, SystemTime::now())));
    assert_eq!(stored_material(&fake).as_ref(), Some(&ma));
    let stored = fake.lock().secret.clone().unwrap_or(Value::Null);
    assert_eq!(stored["type"], "Opaque", "a Secret's type is immutable: kept");
    assert_eq!(
        stored["metadata"]["labels"]["app.kubernetes.io/part-of"],
        "smolvm-operator"
    );
    assert_eq!(
        stored["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "smolvm-webhook"
    );
    assert_eq!(stored["metadata"]["annotations"]["note"], "kept");
    assert_eq!(bundles(&fake), vec![ca_bundle_value(&ma.ca_cert_pem); 3]);
}

/// A whole install applied at once on a slow cluster can start the webhook before its
/// configurations exist (found by the cluster tier: every admission failed with an unknown
/// authority until the next hourly check). The bootstrap names what it did not find, so the
/// check looks again within seconds; once the configuration exists, the next one injects it.
#[tokio::test]
async fn a_configuration_created_after_the_bootstrap_gets_the_bundle_at_the_next_check() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = FakeApiServer::new(None);
    // One replica: release the barrier the double keeps for the first two reads.
    fake.lock().secret_gets = 2;
    let mutating = fake.lock().objects.remove(MWC);
    let first = ok(selfsigned::bootstrap(&fake.client(), &cfg()).await);
    assert_eq!(
        first.missing,
        vec!["MutatingWebhookConfiguration/smolvm-webhook".to_string()]
    );
    assert_eq!(
        bundles(&fake),
        vec![ca_bundle_value(&first.material.ca_cert_pem); 2],
        "the configuration that exists got the bundle"
    );
    assert!(selfsigned::next_check(Duration::from_secs(3600), 1) <= Duration::from_secs(1));
    if let Some(object) = mutating {
        fake.lock().objects.insert(MWC, object);
    }
    let next = ok(selfsigned::bootstrap(&fake.client(), &cfg()).await);
    assert!(next.missing.is_empty(), "{:?}", next.missing);
    assert_eq!(next.material, first.material, "the same CA");
    assert_eq!(bundles(&fake), vec![ca_bundle_value(&first.material.ca_cert_pem); 3]);
}

#[tokio::test]
async fn a_missing_secret_without_create_permission_is_a_clear_error() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = FakeApiServer::new(None);
    fake.lock().create_forbidden = true;
    // One replica: release the barrier the double keeps for the first two reads.
    fake.lock().secret_gets = 2;
    let error = match selfsigned::bootstrap(&fake.client(), &cfg()).await {
        Ok(_) => panic!("bootstrapped without a Secret and without create"),
        Err(e) => e,
    };
    let text = error.to_string();
    assert_eq!(error.reason(), "BadSecret");
    assert!(text.contains("smolvm-system/smolvm-webhook-tls"), "{text}");
    assert!(
        text.contains("may not create it") && text.contains("deploy/default"),
        "{text}"
    );
    assert_eq!(fake.lock().creates_ok, 0);
}
