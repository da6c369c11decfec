//! Test harness: the real webhook server on 127.0.0.1 with a generated CA, and AdmissionReview
//! bodies shaped as kube-apiserver sends them.
#![allow(dead_code)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use smolvm_api::{Policy, SmolVMNode, validate::Identity};
use smolvm_certs::{CertificateAuthority, ReloadableResolver};
use smolvm_webhook::{
    listener::{Listening, serve_tls},
    server::{admission_service, serve_ops},
    state::{AppState, PolicyHandle},
};
use smolvm_webhook_bench::client::{self, Connection, Version};

pub const SERVER_NAME: &str = "smolvm-webhook.smolvm-system.svc";
pub const DAY: Duration = Duration::from_secs(86_400);

pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub fn ok<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

pub struct Harness {
    pub addr: SocketAddr,
    pub ops_addr: SocketAddr,
    pub ca: CertificateAuthority,
    pub resolver: Arc<ReloadableResolver>,
    pub state: AppState,
    /// Sending `true` shuts the webhook's listener down (its connections then drain).
    pub shutdown: tokio::sync::watch::Sender<bool>,
}

impl Harness {
    pub async fn start(nodes: Vec<SmolVMNode>) -> Harness {
        Self::start_with(nodes, |_| {}).await
    }

    pub async fn start_with(nodes: Vec<SmolVMNode>, tweak: impl FnOnce(&mut AppState)) -> Harness {
        Self::start_listening(nodes, tweak, |_| {}).await
    }

    /// As [`Harness::start_with`], the listener's bounds changed by `listening` from the
    /// defaults.
    pub async fn start_listening(
        nodes: Vec<SmolVMNode>,
        tweak: impl FnOnce(&mut AppState),
        listening: impl FnOnce(&mut Listening),
    ) -> Harness {
        install_provider();
        let ca = ok(CertificateAuthority::generate("smolvm-webhook-test-ca", DAY));
        let leaf = ok(ca.issue_server(
            &smolvm_certs::webhook_service_dns_names("smolvm-webhook", "smolvm-system"),
            &[],
            DAY,
        ));
        let resolver = Arc::new(ok(ReloadableResolver::from_pem(&leaf.cert_pem, &leaf.key_pem)));
        let mut state = AppState::new(PolicyHandle::new(Policy::default()), Arc::new(nodes));
        tweak(&mut state);
        let streams = u32::try_from(state.max_concurrent_reviews).unwrap_or(u32::MAX);
        let mut bounds = Listening::defaults(streams);
        listening(&mut bounds);
        state.readiness.set_tls_loaded();
        let listener = ok(std::net::TcpListener::bind("127.0.0.1:0"));
        let addr = ok(listener.local_addr());
        let (shutdown, mut stop) = tokio::sync::watch::channel(false);
        tokio::spawn(serve_tls(
            listener,
            admission_service(state.clone()),
            resolver.clone(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            bounds,
            state.metrics.clone(),
        ));
        let ops = ok(tokio::net::TcpListener::bind("127.0.0.1:0").await);
        let ops_addr = ok(ops.local_addr());
        tokio::spawn(serve_ops(ops, state.clone(), futures::future::pending()));
        Harness {
            addr,
            ops_addr,
            ca,
            resolver,
            state,
            shutdown,
        }
    }

    pub async fn connect(&self, version: Version) -> Connection {
        let config = ok(client::tls_config(self.ca.cert_pem(), version));
        ok(client::connect(self.addr, SERVER_NAME, config, version).await)
    }

    /// Plain HTTP GET on the ops port: (status, body).
    pub async fn ops_get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = ok(tokio::net::TcpStream::connect(self.ops_addr).await);
        ok(
            s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
                .await,
        );
        let mut out = String::new();
        ok(s.read_to_string(&mut out).await);
        let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }
}

/// An AdmissionReview exactly as kube-apiserver sends it.
pub fn review(resource: &str, sub: &str, op: &str, user: &Identity, object: &Value, old: Option<&Value>) -> Value {
    let kind = match resource {
        "smolvmnodes" => "SmolVMNode",
        "smolvmclasses" => "SmolVMClass",
        "smolvmpools" => "SmolVMPool",
        _ => "SmolVM",
    };
    let gvk = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "kind": kind});
    let gvr = json!({"group": "vm.smolvm.dev", "version": "v1alpha1", "resource": resource});
    let options_kind = match op {
        "CREATE" => "CreateOptions",
        "DELETE" => "DeleteOptions",
        _ => "UpdateOptions",
    };
    let mut request = json!({
        "uid": format!("uid-{}-{}", op.to_lowercase(), rand_suffix()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": object["metadata"]["name"],
        "operation": op,
        "userInfo": {
            "username": user.username,
            "uid": "8a6f1c22-user",
            "groups": if user.groups.is_empty() { json!(["system:authenticated"]) } else { json!(user.groups) },
            "extra": user.extra,
        },
        "object": object,
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": options_kind},
    });
    if !sub.is_empty() {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if let Some(ns) = object["metadata"]["namespace"].as_str() {
        request["namespace"] = json!(ns);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

/// POSTs a review and returns (HTTP status, parsed body).
pub async fn post(conn: &mut Connection, path: &str, body: &Value) -> (u16, Value) {
    let bytes = Bytes::from(ok(serde_json::to_vec(body)));
    let (status, out) = ok(conn.post_json(path, bytes).await);
    let value = serde_json::from_slice(&out).unwrap_or(Value::Null);
    (status, value)
}
