//! What smolvm 1.32.2 does with a start's registry credentials, against a registry that needs
//! a login, through the agent's node API (real mTLS, a real `smolvm serve`): the private-image
//! check ([`smolvm_runtime::images`]) lets a start with other credentials through on the ground
//! that smolvm presents that start's own credentials to the registry, and this test shows it
//! does, and that a start without credentials is refused by the registry, not served from what
//! an earlier start fetched.
//!
//! The registry is `TokenRegistry`, a TEST DOUBLE of an OCI distribution registry with token
//! authentication over TLS (its CA given to smolvm through `SSL_CERT_FILE`), served in-process:
//! smolvm 1.32.2 refuses a registry's `Basic` challenge ("unsupported authenticate challenge")
//! and sends `Basic` credentials to HTTPS token services only, so Debian's `docker-registry` with
//! an htpasswd file cannot serve it; smolvm speaks plain HTTP to `localhost`, so the registry is
//! reached by this host's own name, which must resolve to a loopback address (else the test
//! prints `skipped: …`). No guest boots here, so no start succeeds; the pull happens on the host
//! before the boot, which is what is observed.

use std::net::{SocketAddr, ToSocketAddrs as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use serde_json::json;
use smolvm_testkit::node::{self as common, Pki, TestAgent};

/// What the registry saw of one request: the path (without the query) and the credential it
/// carried (`None`, `Basic user:password` or `Bearer token`).
type Seen = (String, Option<String>);

#[derive(Clone)]
struct TokenRegistry {
    realm: String,
    user: String,
    password: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

const TOKEN: &str = "registry-token-robot";
const MANIFEST: &[u8] = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2}]}"#;

fn credential(request: &Request) -> Option<String> {
    let value = request.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(basic) = value.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD.decode(basic).ok()?;
        return Some(format!("Basic {}", String::from_utf8_lossy(&decoded)));
    }
    Some(value.to_string())
}

fn answer(status: StatusCode, content_type: &str, body: &'static [u8]) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap_or_default()
}

async fn serve_registry(State(registry): State<TokenRegistry>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let credential = credential(&request);
    if let Ok(mut seen) = registry.seen.lock() {
        seen.push((path.clone(), credential.clone()));
    }
    if path == "/token" {
        let good = format!("Basic {}:{}", registry.user, registry.password);
        return if credential.as_deref() == Some(good.as_str()) {
            answer(
                StatusCode::OK,
                "application/json",
                br#"{"token":"registry-token-robot","access_token":"registry-token-robot"}"#,
            )
        } else {
            answer(StatusCode::UNAUTHORIZED, "application/json", br#"{"errors":[]}"#)
        };
    }
    if credential.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        let mut refused = answer(StatusCode::UNAUTHORIZED, "application/json", br#"{"errors":[]}"#);
        if let Ok(value) = format!(
            r#"Bearer realm="{}",service="test-registry",scope="repository:team-a/app:pull""#,
            registry.realm
        )
        .parse()
        {
            refused.headers_mut().insert(header::WWW_AUTHENTICATE, value);
        }
        return refused;
    }
    if path.contains("/manifests/") {
        let mut ok = answer(StatusCode::OK, "application/vnd.oci.image.manifest.v1+json", MANIFEST);
        if let Ok(value) = "sha256:0000000000000000000000000000000000000000000000000000000000000000".parse() {
            ok.headers_mut().insert("docker-content-digest", value);
        }
        return ok;
    }
    // Every blob is the same two bytes, not a real layer: the start fails after the pull.
    answer(StatusCode::OK, "application/octet-stream", b"{}")
}

/// This host's own name, when it resolves to loopback addresses only (and is not `localhost`,
/// which smolvm reaches over plain HTTP).
fn loopback_host_name() -> Result<String, String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| format!("no host name: {e}"))?
        .trim()
        .to_string();
    if name.is_empty() || name == "localhost" {
        return Err(format!("the host name {name:?} cannot name a TLS registry for smolvm"));
    }
    let addresses: Vec<SocketAddr> = (name.as_str(), 443)
        .to_socket_addrs()
        .map_err(|e| format!("the host name {name} does not resolve: {e}"))?
        .collect();
    if addresses.is_empty() || !addresses.iter().all(|a| a.ip().is_loopback()) {
        return Err(format!(
            "the host name {name} does not resolve to loopback only: {addresses:?}"
        ));
    }
    Ok(name)
}

#[tokio::test]
async fn smolvm_presents_each_starts_own_credentials_to_the_registry() {
    common::init();
    let test = "smolvm_presents_each_starts_own_credentials_to_the_registry";
    let host = match loopback_host_name() {
        Ok(host) => host,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("smolvm-registry-")
        .tempdir()
        .expect("temp dir");
    let Some(mut spawn) = common::smolvm_spawn_config(test, dir.path()) else {
        return;
    };

    // The registry, over TLS with a certificate for this host's name from a test CA.
    let ca = smolvm_certs::CertificateAuthority::generate(
        "registry-test-ca",
        smolvm_certs::Validity::from_now(Duration::from_secs(3600)),
    )
    .expect("CA");
    let serving = ca
        .issue_server(
            std::slice::from_ref(&host),
            &[],
            smolvm_certs::Validity::from_now(Duration::from_secs(3600)),
        )
        .expect("serving certificate");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let registry = TokenRegistry {
        realm: format!("https://{host}:{port}/token"),
        user: "robot".into(),
        password: "registry-pa55-K2".into(),
        seen: Arc::default(),
    };
    let resolver =
        Arc::new(smolvm_certs::ReloadableResolver::from_pem(&serving.cert_pem, &serving.key_pem).expect("resolver"));
    let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(
        smolvm_certs::server_config(resolver).expect("server config"),
    ));
    listener.set_nonblocking(true).expect("nonblocking");
    let app = Router::new().fallback(serve_registry).with_state(registry.clone());
    let server = axum_server::from_tcp_rustls(listener, tls).expect("registry");
    let registry_task = tokio::spawn(async move { server.serve(app.into_make_service()).await });

    // smolvm trusts the test CA (and nothing else: no other registry is used here).
    let bundle = dir.path().join("registry-ca.pem");
    std::fs::write(&bundle, ca.cert_pem()).expect("CA bundle");
    spawn.env.push(("SSL_CERT_FILE".into(), bundle.display().to_string()));
    let agent = TestAgent::with_spawn(test, dir.path(), Arc::new(Pki::new()), spawn).await;
    let mut c = agent.client().await;
    let image = format!("{host}:{port}/team-a/app:1");
    let spec = json!({"image": image, "cpus": 1, "memoryMiB": 256, "storageGiB": 2, "overlayGiB": 1});
    let seen_since = |from: usize| -> Vec<Seen> {
        registry
            .seen
            .lock()
            .map(|seen| seen[from.min(seen.len())..].to_vec())
            .unwrap_or_default()
    };
    let count = || registry.seen.lock().map(|s| s.len()).unwrap_or_default();
    let start = async |c: &mut common::NodeClient, name: &str, password: Option<&str>| {
        let created = c.call("PUT", &format!("/v1/machines/{name}"), Some(spec.clone())).await;
        assert_eq!(created.status, 201, "{created:?}");
        let body = password.map(|p| json!({"registryAuth": {"username": "robot", "password": p}}));
        let t = std::time::Instant::now();
        let answer = c
            .call("POST", &format!("/v1/machines/{name}/ensure-running"), body)
            .await;
        println!("{name}: start answered {} in {:?}", answer.status, t.elapsed());
        answer
    };

    // Tenant A, with the registry's credentials: smolvm logs in with them and fetches the
    // manifest and the blobs on the host (the boot that follows fails here).
    let from = count();
    let a = start(&mut c, "svm-registry-a", Some("registry-pa55-K2")).await;
    assert_ne!(a.status, 200, "no guest boots here: {a:?}");
    let seen = seen_since(from);
    println!("tenant A's start: {seen:?}");
    let basic_good = Some("Basic robot:registry-pa55-K2".to_string());
    let bearer = Some(format!("Bearer {TOKEN}"));
    assert!(seen.iter().any(|(p, c)| p == "/token" && *c == basic_good), "{seen:?}");
    assert!(
        seen.iter().any(|(p, c)| p.contains("/manifests/") && *c == bearer),
        "{seen:?}"
    );

    // Tenant B, no credentials: smolvm asks the registry again, with nothing, and is refused;
    // what A's start fetched is not used.
    let from = count();
    let b = start(&mut c, "svm-registry-b", None).await;
    assert_eq!((b.status, &b.body["code"]), (500, &json!("StartFailed")), "{b:?}");
    let seen = seen_since(from);
    println!("tenant B's start without credentials: {seen:?}");
    assert!(!seen.is_empty(), "smolvm did not ask the registry");
    assert!(
        seen.iter().all(|(_, c)| c.is_none()),
        "B's start carried a credential: {seen:?}"
    );

    // Tenant B, its own (wrong) credentials: those, and only those, reach the token service.
    let from = count();
    let created = c
        .call(
            "POST",
            "/v1/machines/svm-registry-b/ensure-running",
            Some(json!({"registryAuth": {"username": "robot", "password": "tenant-b-guess"}})),
        )
        .await;
    assert_eq!(
        (created.status, &created.body["code"]),
        (500, &json!("StartFailed")),
        "{created:?}"
    );
    let seen = seen_since(from);
    println!("tenant B's start with its own credentials: {seen:?}");
    assert!(
        seen.iter()
            .any(|(p, c)| p == "/token" && c.as_deref() == Some("Basic robot:tenant-b-guess")),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|(_, c)| *c == basic_good || *c == bearer),
        "A's credentials were used for B: {seen:?}"
    );

    for name in ["svm-registry-a", "svm-registry-b"] {
        assert_eq!(
            c.call("DELETE", &format!("/v1/machines/{name}"), None).await.status,
            200
        );
    }
    agent.agent.shutdown().await;
    registry_task.abort();
}
