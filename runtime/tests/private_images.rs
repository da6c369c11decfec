//! Private images over the node API (SPEC 6, Tenants): the agent's real router over real mTLS
//! with the bearer token, in front of `RegistryRuntime`, a TEST DOUBLE of smolvm. No guest boots
//! on these machines, so a start never succeeds against real smolvm here; the double starts a
//! machine when its image is public or the credentials presented are ones its registry accepts,
//! and fails the start as smolvm does when the registry refuses them. As smolvm 1.32.2 does, a
//! start presents its own credentials (`registryAuth`) when it has some, and otherwise the
//! operator-level credentials configured on the node, which are not per tenant: that is the
//! path by which a tenant without a pull secret would reach another tenant's private image.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::json;
use smolvm_runtime::images::ImageGuard;
use smolvm_runtime::nodeapi::tls::MtlsServer;
use smolvm_runtime::vmm::{
    DeleteOutcome, Machine, MachineSpec, MachineState, RegistryAuth, ResizeRequest, Vmm, VmmError, VmmHealth,
};
use smolvm_testkit::node::{self as common, NODE, NodeClient, Pki, TOKEN};

/// TEST DOUBLE of smolvm with a registry behind it: `private` maps a repository prefix to the
/// passwords its registry accepts; a start of such an image without one of them fails as
/// smolvm's does when the registry refuses (500, `StartFailed`). A start without credentials
/// presents `node_credential`, as smolvm presents credentials configured on the node. Records
/// each start's own password.
#[derive(Default)]
struct RegistryRuntime {
    private: Mutex<BTreeMap<String, Vec<String>>>,
    node_credential: Option<String>,
    machines: Mutex<HashMap<String, Machine>>,
    /// (machine, the password the start presented), in order.
    starts: Mutex<Vec<(String, Option<String>)>>,
}

impl RegistryRuntime {
    fn accept(&self, repository: &str, password: &str) {
        if let Ok(mut private) = self.private.lock() {
            private.entry(repository.into()).or_default().push(password.into());
        }
    }

    fn starts_of(&self, name: &str) -> Vec<Option<String>> {
        self.starts
            .lock()
            .map(|s| s.iter().filter(|(n, _)| n == name).map(|(_, p)| p.clone()).collect())
            .unwrap_or_default()
    }
}

#[async_trait]
impl Vmm for RegistryRuntime {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Err(VmmError::Unavailable {
            message: "test double".into(),
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(self
            .machines
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default())
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        Ok(self.machines.lock().ok().and_then(|m| m.get(name).cloned()))
    }
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        let machine = Machine::created_from(spec);
        let mut machines = self
            .machines
            .lock()
            .map_err(|_| VmmError::Protocol("poisoned".into()))?;
        if machines.contains_key(&spec.name) {
            return Err(VmmError::Conflict {
                message: format!("machine '{}' already exists", spec.name),
            });
        }
        machines.insert(spec.name.clone(), machine.clone());
        Ok(machine)
    }
    async fn start(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        let password = registry_auth.map(|a| a.password.expose().to_string());
        if let Ok(mut starts) = self.starts.lock() {
            starts.push((name.to_string(), password.clone()));
        }
        let mut machines = self
            .machines
            .lock()
            .map_err(|_| VmmError::Protocol("poisoned".into()))?;
        let machine = machines.get_mut(name).ok_or_else(|| VmmError::NotFound {
            message: format!("machine '{name}' not found"),
        })?;
        let image = machine.image.clone().unwrap_or_default();
        let accepted = self.private.lock().ok().and_then(|private| {
            private
                .iter()
                .find(|(repository, _)| image.starts_with(repository.as_str()))
                .map(|(_, passwords)| passwords.clone())
        });
        let presented = password.clone().or_else(|| self.node_credential.clone());
        if let Some(accepted) = accepted
            && !presented.as_ref().is_some_and(|p| accepted.contains(p))
        {
            return Err(VmmError::StartFailed {
                message: "registry authentication failed: token service returned 401 Unauthorized".into(),
            });
        }
        machine.state = MachineState::Running;
        Ok(machine.clone())
    }
    async fn stop(&self, name: &str) -> Result<Machine, VmmError> {
        let mut machines = self
            .machines
            .lock()
            .map_err(|_| VmmError::Protocol("poisoned".into()))?;
        let machine = machines.get_mut(name).ok_or_else(|| VmmError::NotFound {
            message: format!("machine '{name}' not found"),
        })?;
        machine.state = MachineState::Stopped;
        Ok(machine.clone())
    }
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let removed = self.machines.lock().ok().and_then(|mut m| m.remove(name));
        Ok(if removed.is_some() {
            DeleteOutcome::Deleted
        } else {
            DeleteOutcome::Missing
        })
    }
    async fn resize(&self, name: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        self.get(name).await?.ok_or_else(|| VmmError::NotFound {
            message: format!("machine '{name}' not found"),
        })
    }
}

/// The agent's router with image records in `records` (none: as before they were kept),
/// served over mTLS.
fn serve(runtime: Arc<RegistryRuntime>, records: Option<&std::path::Path>, pki: &Pki) -> MtlsServer {
    let state = Pki::node_api_state(runtime);
    let state = match records {
        Some(records) => state.with_images(Arc::new(ImageGuard::open(records).expect("image records"))),
        None => state,
    };
    pki.serve(state)
}

async fn client(server: &MtlsServer, pki: &Pki) -> NodeClient {
    NodeClient::connect(
        server.local_addr(),
        &smolvm_certs::runtime_server_name(NODE),
        pki.client_tls(),
        Some(TOKEN),
    )
    .await
    .expect("connect")
}

fn spec(image: &str) -> serde_json::Value {
    json!({"image": image, "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1})
}

fn credentials(password: &str) -> serde_json::Value {
    json!({"registryAuth": {"username": "robot", "password": password}})
}

/// Tenant A starts its private image with its pull secret; tenant B, with no pull secret, is
/// refused (403 ImagePullCredentialsRequired naming the registry) whatever tag or digest of the
/// image it names, and smolvm is never asked; B with credentials of its own has them presented
/// to the registry (which refuses them); A with a rotated secret starts; a public image starts
/// without credentials. The records survive the agent's restart and hold no credential. Without
/// the records (as before), B's start reaches smolvm and boots A's image.
#[tokio::test]
async fn a_private_image_on_the_node_never_starts_without_credentials() {
    common::init();
    let dir = tempfile::tempdir().expect("tempdir");
    let records = dir.path().join("image-records");
    let pki = Pki::new();
    // The node has registry credentials of its own (an operator's), which the registry takes.
    let runtime = Arc::new(RegistryRuntime {
        node_credential: Some("node-operator-secret".into()),
        ..RegistryRuntime::default()
    });
    runtime.accept("registry.example.com/team-a/", "a-secret-1");
    runtime.accept("registry.example.com/team-a/", "node-operator-secret");
    let create = async |c: &mut NodeClient, name: &str, image: &str| {
        let created = c.call("PUT", &format!("/v1/machines/{name}"), Some(spec(image))).await;
        assert_eq!(created.status, 201, "{created:?}");
    };
    let start = async |c: &mut NodeClient, name: &str, body: Option<serde_json::Value>| {
        c.call("POST", &format!("/v1/machines/{name}/ensure-running"), body)
            .await
    };

    // Before: no records, and tenant B's start without a pull secret boots A's image.
    let before = serve(runtime.clone(), None, &pki);
    let mut c = client(&before, &pki).await;
    create(&mut c, "svm-before-a", "registry.example.com/team-a/app:1").await;
    let a = start(&mut c, "svm-before-a", Some(credentials("a-secret-1"))).await;
    assert_eq!(a.status, 200, "{a:?}");
    create(&mut c, "svm-before-b", "registry.example.com/team-a/app:1").await;
    let b = start(&mut c, "svm-before-b", None).await;
    assert_eq!(b.status, 200, "without records the hole is open: {b:?}");
    before.shutdown(std::time::Duration::from_secs(1)).await;

    let server = serve(runtime.clone(), Some(&records), &pki);
    let mut c = client(&server, &pki).await;

    // Tenant A: its own image, its own pull secret.
    create(&mut c, "svm-a", "registry.example.com/team-a/app:1").await;
    let started = start(&mut c, "svm-a", Some(credentials("a-secret-1"))).await;
    assert_eq!(
        (started.status, &started.body["state"]),
        (200, &json!("Running")),
        "{started:?}"
    );

    // Tenant B, no pull secret: refused before smolvm is asked, for any tag or digest of it.
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let images = [
        "registry.example.com/team-a/app:1".to_string(),
        "registry.example.com/team-a/app:latest".to_string(),
        format!("registry.example.com/team-a/app@{digest}"),
        "REGISTRY.EXAMPLE.COM/team-a/app".to_string(),
    ];
    for (i, image) in images.iter().enumerate() {
        let name = format!("svm-b-{i}");
        create(&mut c, &name, image).await;
        let refused = start(&mut c, &name, None).await;
        assert_eq!(refused.status, 403, "{image}: {refused:?}");
        assert_eq!(
            refused.body["code"], "ImagePullCredentialsRequired",
            "{image}: {refused:?}"
        );
        assert_eq!(
            refused.body["details"],
            json!({"registry": "registry.example.com"}),
            "{refused:?}"
        );
        assert!(runtime.starts_of(&name).is_empty(), "{image}: smolvm was asked");
    }

    // Tenant B with a pull secret of its own: the start goes to smolvm with B's credentials
    // (never A's), and the registry refuses them.
    let with_own = start(&mut c, "svm-b-0", Some(credentials("b-secret"))).await;
    assert_eq!(
        (with_own.status, &with_own.body["code"]),
        (500, &json!("StartFailed")),
        "{with_own:?}"
    );
    assert_eq!(runtime.starts_of("svm-b-0"), vec![Some("b-secret".to_string())]);
    // Refused by the registry, B's credentials were not remembered: without any, still refused.
    let still = start(&mut c, "svm-b-1", None).await;
    assert_eq!(still.body["code"], "ImagePullCredentialsRequired", "{still:?}");

    // Tenant A rotated its secret: other credentials, presented to the registry, which takes them.
    runtime.accept("registry.example.com/team-a/", "a-secret-2");
    create(&mut c, "svm-a-2", "registry.example.com/team-a/app:1").await;
    let rotated = start(&mut c, "svm-a-2", Some(credentials("a-secret-2"))).await;
    assert_eq!(rotated.status, 200, "{rotated:?}");
    assert_eq!(runtime.starts_of("svm-a-2"), vec![Some("a-secret-2".to_string())]);

    // A public image, never started with credentials here: no credentials needed.
    create(&mut c, "svm-public", "alpine:3").await;
    let public = start(&mut c, "svm-public", None).await;
    assert_eq!(public.status, 200, "{public:?}");

    // The records hold keyed digests, never a credential.
    for entry in std::fs::read_dir(&records).expect("records dir").flatten() {
        let bytes = std::fs::read(entry.path()).expect("read");
        for secret in ["a-secret-1", "a-secret-2", "b-secret", "robot"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} in {:?}",
                entry.path()
            );
        }
    }

    // After a restart of the agent, the same answers.
    server.shutdown(std::time::Duration::from_secs(1)).await;
    let server = serve(runtime.clone(), Some(&records), &pki);
    let mut c = client(&server, &pki).await;
    let refused = start(&mut c, "svm-b-2", None).await;
    assert_eq!(refused.body["code"], "ImagePullCredentialsRequired", "{refused:?}");
    let stopped = c.call("POST", "/v1/machines/svm-a/stop", None).await;
    assert_eq!(stopped.status, 200, "{stopped:?}");
    let again = start(&mut c, "svm-a", Some(credentials("a-secret-1"))).await;
    assert_eq!(again.status, 200, "{again:?}");
    server.shutdown(std::time::Duration::from_secs(1)).await;
}
