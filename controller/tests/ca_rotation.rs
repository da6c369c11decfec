//! A runtime CA rotation under a running agent: the controller's node client (real mTLS, its
//! trust swapped as the rotation goes) calls the real agent (its client CA re-read from the
//! published bundle file, its serving certificate replaced from the new CA) the whole time, each
//! call on a new connection, and no call fails.
//!
//! The API server's part (the Secret, the ConfigMap the kubelet mounts, the CSR) is played here
//! by writing the bundle file and signing the agent's CSR with the controller's signing CA; the
//! rotation's decisions are the controller's own (`rotation_step`, `renewal_due`, `report`).

use smolvm_testkit::node as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{NODE, TOKEN};
use smolvm_certs::{CertificateAuthority, LeafUsage, ReloadableResolver, Validity};
use smolvm_controller::nodeclient::{BearerToken, ClientSettings, ClientTls, Endpoints, NodeClient};
use smolvm_controller::pki::runtime_ca::{CaSet, NodeTrust, Rotation, RuntimeTrust, rotation_step};
use smolvm_runtime::agent::{Agent, AgentOptions, ClientCa};
use smolvm_runtime::nodeapi::auth::TokenAuth;
use smolvm_runtime::serving_cert::{Renewal, renewal_due, report_current};
use smolvm_runtime::supervisor::SupervisorConfig;

const DAY: Duration = Duration::from_secs(86_400);

/// A serving pair for [`NODE`] the way the agent gets one: key made here, CSR signed by `ca`.
fn serving_pair(ca: &CertificateAuthority) -> (String, String) {
    let key = smolvm_certs::generate_key_pair().expect("key");
    let csr = smolvm_certs::build_csr(&key, "", &smolvm_certs::runtime_serving_sans(NODE)).expect("csr");
    let cert = ca
        .sign_csr(csr, Validity::from_now(DAY), LeafUsage::Server)
        .expect("sign");
    (cert, key)
}

/// Writes the bundle as the kubelet updates a ConfigMap volume: a new file renamed into place.
fn publish(path: &std::path::Path, cas: &CaSet) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, cas.bundle_pem()).expect("write bundle");
    std::fs::rename(&tmp, path).expect("rename bundle");
}

/// Calls `GET /v1/identity` until told to stop, each time on a new connection with a full
/// handshake (a new client, the one shared TLS config), and counts answers and failures.
struct Caller {
    ok: Arc<AtomicUsize>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Caller {
    fn start(trust: &RuntimeTrust, endpoints: Endpoints) -> Self {
        let trusted = trust.client_tls();
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ok2, failures2, stop2) = (ok.clone(), failures.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !stop2.load(Ordering::Relaxed) {
                // The config in force now, with no resumption: every call a full handshake (a
                // resumed session would carry the identities of an earlier one and prove nothing
                // about the certificates in force).
                let mut tls = (*trusted.current()).clone();
                tls.resumption = rustls::client::Resumption::disabled();
                let client = NodeClient::new(
                    ClientSettings {
                        tls: ClientTls::new(tls),
                        token: BearerToken::new(TOKEN.to_string()),
                        connect_timeout: Duration::from_secs(5),
                        call_timeout: Duration::from_secs(10),
                        start_timeout: Duration::from_secs(10),
                    },
                    endpoints.clone(),
                );
                match client.identity(NODE).await {
                    Ok(_) => {
                        ok2.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => failures2
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(error.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Caller {
            ok,
            failures,
            stop,
            task,
        }
    }

    /// Waits until `more` further calls have been answered.
    async fn answered(&self, more: usize, what: &str) {
        let target = self.ok.load(Ordering::Relaxed) + more;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.ok.load(Ordering::Relaxed) < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: calls stopped being answered; failures: {:?}",
                self.failures()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn failures(&self) -> Vec<String> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_ca_rotates_under_a_running_agent_without_losing_a_call() {
    common::init();
    let dir = tempfile::tempdir().expect("tempdir");
    let old = CertificateAuthority::generate("smolvm-runtime-ca", 365 * DAY).expect("old CA");
    let trust = RuntimeTrust::new(CaSet::single(old)).expect("trust");
    let before = trust.cas();
    let bundle_file = dir.path().join("ca.crt");
    publish(&bundle_file, &before);

    // The agent: serving certificate from the old CA, client CA read from the bundle file.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token file");
    let (auth, _token_watch) = TokenAuth::from_file(token_file, Duration::from_millis(100)).expect("token");
    let (cert, key) = serving_pair(&before.current);
    let resolver = Arc::new(ReloadableResolver::from_pem(&cert, &key).expect("resolver"));
    let mut supervisor = SupervisorConfig::new(dir.path().join("absent.sock"), None);
    supervisor.health_interval = Duration::from_millis(200);
    let agent = Agent::start(AgentOptions {
        node_name: NODE.into(),
        supervisor,
        local_image_dir: None,
        node_api_listener: std::net::TcpListener::bind("127.0.0.1:0").expect("bind"),
        ops_listener: None,
        resolver: resolver.clone(),
        serving_files: None,
        client_ca: ClientCa::File(bundle_file.clone()),
        auth,
        file_poll_interval: Duration::from_millis(50),
        pool_keep_interval: smolvm_runtime::pools::KEEP_INTERVAL,
        workload_records: None,
        publish_address: None,
        limits: Default::default(),
        guards: Default::default(),
    })
    .await
    .expect("agent starts");
    let in_force = agent.node_api().client_ca().clone();
    let endpoints = Endpoints::default();
    let addr = agent.node_api_addr();
    endpoints.set(NODE, &addr.ip().to_string(), addr.port());
    let node_trust = || NodeTrust {
        name: NODE.into(),
        live: true,
        ca_fingerprint: report_current(&resolver, &in_force).ca_fingerprint,
    };

    let mut caller = Caller::start(&trust, endpoints);
    caller.answered(20, "before the rotation").await;
    assert_eq!(
        rotation_step(false, true, false, &before.current_fingerprint(), &[node_trust()]),
        Rotation::Begin(smolvm_controller::pki::runtime_ca::RotationCause::Requested)
    );

    // Begin: a new signing CA; both trusted; the bundle published with the new CA first.
    let new = CertificateAuthority::generate("smolvm-runtime-ca", 365 * DAY).expect("new CA");
    let rotating = CaSet {
        current: Arc::new(new),
        previous: Some(before.current.clone()),
    };
    trust.install(rotating.clone()).expect("install the rotation");
    publish(&bundle_file, &rotating);
    caller.answered(20, "rotation begun, agent not yet re-filed").await;
    assert_eq!(
        rotation_step(true, false, false, &rotating.current_fingerprint(), &[node_trust()]),
        Rotation::Waiting(vec![NODE.to_string()]),
        "the agent still serves the old CA's certificate"
    );

    // The agent: once the bundle is in force, its certificate is due; it files a CSR, which the
    // controller signs with the CA signing now, and serves the new certificate.
    eventually("the agent trusts the new bundle", || {
        let (leaf, info) = (
            resolver.current_certified_key().cert[0].clone(),
            resolver.current_cert_info(),
        );
        let bundle = smolvm_certs::parse_pem_chain(&in_force.pem()).unwrap_or_default();
        renewal_due(&leaf, &info, &bundle, std::time::SystemTime::now()) == Some(Renewal::CaChanged)
    })
    .await;
    let (cert, key) = serving_pair(&trust.signing());
    resolver.swap_pem(&cert, &key).expect("swap in the new certificate");
    caller.answered(20, "agent serving the new CA's certificate").await;

    // Finish: the node reports the new CA; the old one is dropped everywhere.
    assert_eq!(
        rotation_step(true, false, false, &rotating.current_fingerprint(), &[node_trust()]),
        Rotation::Finish
    );
    let after = CaSet {
        current: rotating.current.clone(),
        previous: None,
    };
    trust.install(after.clone()).expect("install the new CA alone");
    publish(&bundle_file, &after);
    eventually("the agent drops the old CA", || in_force.pem() == after.bundle_pem()).await;
    caller.answered(20, "rotation finished").await;

    caller.stop.store(true, Ordering::Relaxed);
    let _ = (&mut caller.task).await;
    assert_eq!(
        caller.failures(),
        Vec::<String>::new(),
        "no call may fail during a rotation"
    );
    assert!(caller.ok.load(Ordering::Relaxed) >= 80);

    // The old CA is out: a client certificate from it is refused by the agent.
    let stale = before
        .current
        .issue_client("smolvm-controller", DAY)
        .expect("old client cert");
    let stale_tls = smolvm_certs::client_config(
        after.current.cert_pem(),
        Some((&stale.cert_pem, &stale.key_pem)),
        &[b"http/1.1"],
    )
    .expect("client config");
    let refused = async {
        let mut client = common::NodeClient::connect(
            addr,
            &smolvm_certs::runtime_server_name(NODE),
            Arc::new(stale_tls),
            Some(TOKEN),
        )
        .await?;
        client.send_raw("GET", "/v1/identity", None).await.map(|a| a.status)
    }
    .await;
    assert!(
        refused.is_err(),
        "an old-CA client certificate was accepted: {refused:?}"
    );
    agent.shutdown().await;
}
