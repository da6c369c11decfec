//! Real TLS handshakes on 127.0.0.1 against configs built by smolvm-certs.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use smolvm_certs::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

const DAY: Duration = Duration::from_secs(86_400);
const STEP: Duration = Duration::from_secs(10);

fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// An echo server; handshake errors are reported on the returned channel. It lives until the
/// test's runtime shuts down.
async fn spawn_server(config: ServerConfig) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(mut tls) => {
                        let mut buf = [0u8; 64];
                        while let Ok(n) = tls.read(&mut buf).await {
                            if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(e.to_string());
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// What the client saw on a successful exchange.
#[derive(Debug)]
struct Seen {
    leaf: CertInfo,
    alpn: Option<Vec<u8>>,
}

/// Connects, completes the handshake and one echo round trip (so a server-side rejection of
/// the client certificate in TLS 1.3 surfaces as an error too).
async fn connect(
    addr: SocketAddr,
    client: &ClientConfig,
    server_name: &str,
) -> Result<(Seen, TlsStream<TcpStream>), String> {
    let name = ServerName::try_from(server_name.to_string()).map_err(|e| e.to_string())?;
    // Every call is a full handshake: no resumption of a session made by an earlier call.
    let mut client = client.clone();
    client.resumption = rustls::client::Resumption::disabled();
    let connector = TlsConnector::from(Arc::new(client));
    let fut = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
        ping(&mut tls).await?;
        let (_, conn) = tls.get_ref();
        let leaf = conn
            .peer_certificates()
            .and_then(|c| c.first())
            .ok_or("no peer certificate")?;
        let seen = Seen {
            leaf: cert_info_from_der(leaf).map_err(|e| e.to_string())?,
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
        };
        Ok((seen, tls))
    };
    tokio::time::timeout(STEP, fut)
        .await
        .map_err(|_| "timed out".to_string())?
}

async fn ping(tls: &mut TlsStream<TcpStream>) -> Result<(), String> {
    tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4];
    tls.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
    if &buf != b"ping" {
        return Err(format!("unexpected echo {buf:?}"));
    }
    Ok(())
}

async fn next_server_error(rx: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(STEP, rx.recv())
        .await
        .expect("server reported nothing")
        .expect("server channel closed")
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn server_auth_table() {
    init();
    let ca = CertificateAuthority::generate("webhook CA", DAY).unwrap();
    let reloaded_ca = CertificateAuthority::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
    let other_ca = CertificateAuthority::generate("other CA", DAY).unwrap();
    let now = SystemTime::now();
    let dns = webhook_service_dns_names("smolvm-webhook", "smolvm-system");
    let localhost: IpAddr = "127.0.0.1".parse().unwrap();

    let good = ca.issue_server(&dns, &[localhost], DAY).unwrap();
    let from_reloaded = reloaded_ca.issue_server(&dns, &[], DAY).unwrap();
    let expired = ca
        .issue_server(&dns, &[], Validity::between(now - 2 * DAY, now - DAY))
        .unwrap();
    let not_yet_valid = ca
        .issue_server(&dns, &[], Validity::between(now + DAY, now + 2 * DAY))
        .unwrap();
    let client_only = ca.issue_client("smolvm-webhook.smolvm-system.svc", DAY).unwrap();

    let svc = "smolvm-webhook.smolvm-system.svc";
    // (case, served cert, CA the client trusts, name dialled, expected error substring or None)
    let cases: Vec<(&str, &IssuedCert, &str, &str, Option<&str>)> = vec![
        ("trusted CA, svc name", &good, ca.cert_pem(), svc, None),
        ("trusted CA, short name", &good, ca.cert_pem(), "smolvm-webhook", None),
        ("trusted CA, IP SAN", &good, ca.cert_pem(), "127.0.0.1", None),
        (
            "signed by CA reloaded from PEM",
            &from_reloaded,
            ca.cert_pem(),
            svc,
            None,
        ),
        ("other CA", &good, other_ca.cert_pem(), svc, Some("UnknownIssuer")),
        ("expired", &expired, ca.cert_pem(), svc, Some("expired")),
        (
            "not yet valid",
            &not_yet_valid,
            ca.cert_pem(),
            svc,
            Some("not valid yet"),
        ),
        (
            "SAN mismatch",
            &good,
            ca.cert_pem(),
            "other.smolvm-system.svc",
            Some("not valid for name"),
        ),
        (
            "IP mismatch",
            &good,
            ca.cert_pem(),
            "127.0.0.2",
            Some("not valid for name"),
        ),
        (
            "clientAuth-only cert as server",
            &client_only,
            ca.cert_pem(),
            svc,
            Some("extended key usage for server authentication"),
        ),
    ];
    for (case, served, trusted, name, want_err) in cases {
        let resolver = Arc::new(ReloadableResolver::from_pem(&served.cert_pem, &served.key_pem).unwrap());
        let (addr, mut server_errors) = spawn_server(server_config(resolver).unwrap()).await;
        let client = client_config(trusted, None, &[b"h2", b"http/1.1"]).unwrap();
        let res = connect(addr, &client, name).await;
        match (want_err, res) {
            (None, Ok((seen, _))) => {
                assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]), "{case}");
                assert_eq!(seen.leaf.dns_names, parse_cert_pem(&served.cert_pem).unwrap().dns_names);
            }
            (Some(want), Err(e)) => {
                assert!(e.contains(want), "{case}: error {e:?} lacks {want:?}");
                // The client aborts; the server sees the alert.
                next_server_error(&mut server_errors).await;
            }
            (want, got) => panic!("{case}: wanted error {want:?}, got {:?}", got.map(|s| s.0)),
        }
    }
}

#[tokio::test]
async fn alpn_falls_back_to_http11() {
    init();
    let ca = CertificateAuthority::generate("ca", DAY).unwrap();
    let leaf = ca.issue_server(&names(&["a.example"]), &[], DAY).unwrap();
    let resolver = Arc::new(ReloadableResolver::from_pem(&leaf.cert_pem, &leaf.key_pem).unwrap());
    let (addr, _rx) = spawn_server(server_config(resolver).unwrap()).await;
    for (offer, want) in [(vec![&b"http/1.1"[..]], Some(b"http/1.1".to_vec())), (vec![], None)] {
        let client = client_config(ca.cert_pem(), None, &offer).unwrap();
        let (seen, _) = connect(addr, &client, "a.example").await.unwrap();
        assert_eq!(seen.alpn, want);
    }
}

#[tokio::test]
async fn mtls_table() {
    init();
    let server_ca = CertificateAuthority::generate("runtime serving CA", DAY).unwrap();
    let client_ca = CertificateAuthority::generate("runtime client CA", DAY).unwrap();
    let other_ca = CertificateAuthority::generate("other CA", DAY).unwrap();
    let now = SystemTime::now();
    let node = "node-a";
    let serving = server_ca.issue_server(&runtime_serving_sans(node), &[], DAY).unwrap();
    let resolver = Arc::new(ReloadableResolver::from_pem(&serving.cert_pem, &serving.key_pem).unwrap());
    let (addr, mut server_errors) = spawn_server(mtls_server_config(resolver, client_ca.cert_pem()).unwrap()).await;

    let right = client_ca.issue_client("smolvm-controller", DAY).unwrap();
    let foreign = other_ca.issue_client("smolvm-controller", DAY).unwrap();
    let expired = client_ca
        .issue_client("smolvm-controller", Validity::between(now - 2 * DAY, now - DAY))
        .unwrap();
    let server_usage = client_ca
        .issue_server(&names(&["controller.example"]), &[], DAY)
        .unwrap();

    // (case, client identity, expected server-side error substring or None for success)
    let cases: Vec<(&str, Option<&IssuedCert>, Option<&str>)> = vec![
        ("no client cert", None, Some("peer sent no certificates")),
        ("client cert from another CA", Some(&foreign), Some("UnknownIssuer")),
        ("expired client cert", Some(&expired), Some("expired")),
        (
            "serverAuth-only cert as client",
            Some(&server_usage),
            Some("extended key usage for client authentication"),
        ),
        ("right client cert", Some(&right), None),
    ];
    for (case, identity, want_err) in cases {
        let client = client_config(
            server_ca.cert_pem(),
            identity.map(|i| (i.cert_pem.as_str(), i.key_pem.as_str())),
            &[b"h2"],
        )
        .unwrap();
        let res = connect(addr, &client, &runtime_server_name(node)).await;
        match want_err {
            None => {
                let (seen, _) = res.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(seen.leaf.dns_names, runtime_serving_sans(node));
            }
            Some(want) => {
                assert!(res.is_err(), "{case}: handshake unexpectedly succeeded");
                let server_err = next_server_error(&mut server_errors).await;
                assert!(
                    server_err.contains(want),
                    "{case}: server error {server_err:?} lacks {want:?}"
                );
            }
        }
    }
    // The controller reaching the wrong node fails even with a valid client certificate.
    let client = client_config(server_ca.cert_pem(), Some((&right.cert_pem, &right.key_pem)), &[]).unwrap();
    let err = connect(addr, &client, &runtime_server_name("node-b"))
        .await
        .unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn csr_flow_node_key_never_leaves_node() {
    init();
    let runtime_ca = CertificateAuthority::generate("smolvm runtime CA", DAY).unwrap();
    // The controller may run from a CA loaded out of its Secret.
    let signer = CertificateAuthority::from_pem(runtime_ca.cert_pem(), runtime_ca.key_pem()).unwrap();
    let node = "worker-7";

    // On the node.
    let node_key = generate_key_pair().unwrap();
    let csr = build_csr(&node_key, "", &runtime_serving_sans(node)).unwrap();

    // In the controller: inspect, apply policy, sign with our usages only.
    let info = parse_csr(&csr).unwrap();
    assert_eq!(info.common_name, None);
    assert_eq!(info.key_algorithm, KeyAlgorithm::EcdsaP256);
    assert_eq!(info.dns_names, runtime_serving_sans(node));
    assert!(info.ip_addrs.is_empty());
    assert!(!info.has_unexpected_requests());
    validate_runtime_serving_csr(&info, node).unwrap();
    assert_eq!(
        validate_runtime_serving_csr(&info, "worker-8").unwrap_err().reason(),
        "CsrRejected"
    );
    let cert_pem = signer.sign_csr(&csr, DAY, LeafUsage::Server).unwrap();
    let cert = parse_cert_pem(&cert_pem).unwrap();
    assert_eq!(cert.dns_names, runtime_serving_sans(node));
    assert!(!cert.is_ca);

    // Back on the node: serve it with the node-local key, over mTLS.
    let client_ca = CertificateAuthority::generate("client CA", DAY).unwrap();
    let controller = client_ca.issue_client("smolvm-controller", DAY).unwrap();
    let resolver = Arc::new(ReloadableResolver::from_pem(&cert_pem, &node_key).unwrap());
    let (addr, _rx) = spawn_server(mtls_server_config(resolver, client_ca.cert_pem()).unwrap()).await;
    let client = client_config(
        runtime_ca.cert_pem(),
        Some((&controller.cert_pem, &controller.key_pem)),
        &[b"h2"],
    )
    .unwrap();
    let (seen, _) = connect(addr, &client, &runtime_server_name(node)).await.unwrap();
    assert_eq!(seen.leaf.serial_hex, cert.serial_hex);
    let err = connect(addr, &client, &runtime_server_name("worker-8"))
        .await
        .unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
}

/// What one node of the given name goes through to serve the node API: its CSR (as the agent
/// files it: no CN, the runtime SANs), the signer's judgement and signature, and the
/// controller's verified mTLS handshake with the name it derives from the node name.
struct JoinBench {
    runtime_ca: CertificateAuthority,
    client_ca_pem: String,
    client: ClientConfig,
}

impl JoinBench {
    fn new() -> Self {
        let runtime_ca = CertificateAuthority::generate("smolvm runtime CA", DAY).unwrap();
        let client_ca = CertificateAuthority::generate("client CA", DAY).unwrap();
        let controller = client_ca.issue_client("smolvm-controller", DAY).unwrap();
        let client = client_config(
            runtime_ca.cert_pem(),
            Some((&controller.cert_pem, &controller.key_pem)),
            &[b"h2"],
        )
        .unwrap();
        JoinBench {
            runtime_ca,
            client_ca_pem: client_ca.cert_pem().to_string(),
            client,
        }
    }

    async fn join(&self, node: &str) -> Result<(), String> {
        let key = generate_key_pair().map_err(|e| e.to_string())?;
        let csr = build_csr(&key, "", &runtime_serving_sans(node)).map_err(|e| format!("build: {e}"))?;
        let info = parse_csr(&csr).map_err(|e| format!("parse: {e}"))?;
        validate_runtime_serving_csr(&info, node).map_err(|e| format!("judge: {e}"))?;
        let cert = self
            .runtime_ca
            .sign_csr(&csr, DAY, LeafUsage::Server)
            .map_err(|e| format!("sign: {e}"))?;
        let resolver = Arc::new(ReloadableResolver::from_pem(&cert, &key).map_err(|e| format!("serve: {e}"))?);
        let (addr, _rx) = spawn_server(mtls_server_config(resolver, &self.client_ca_pem).unwrap()).await;
        let (_, mut tls) = connect(addr, &self.client, &runtime_server_name(node)).await?;
        ping(&mut tls).await
    }
}

#[tokio::test]
async fn node_names_of_every_valid_length_join() {
    init();
    let bench = JoinBench::new();
    let label63 = "a".repeat(63);
    let max = [label63.as_str(); 3].join(".") + "." + &"z".repeat(61);
    assert_eq!(max.len(), 253);
    let names = [
        "n".to_string(),
        "worker-1".into(),
        // EKS, GKE and AKS style names.
        "ip-192-168-101-202.ap-southeast-2.compute.internal".into(),
        "ip-10-0-12-34.us-gov-west-1.compute.internal".into(),
        "gke-production-cluster-europe-west4-default-pool-6f5c2a1b-x7kq".into(),
        "aks-nodepool1-12345678-vmss000000".into(),
        "10.0.0.1".into(),
        label63.clone(),
        max[..231].to_string(),
        max[..232].to_string(),
        max.clone(),
    ];
    for node in &names {
        bench
            .join(node)
            .await
            .unwrap_or_else(|e| panic!("node name of {} characters ({node:?}): {e}", node.len()));
    }
}

#[tokio::test]
async fn a_csr_for_another_key_type_is_rejected() {
    init();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let params = rcgen::CertificateParams::new(runtime_serving_sans("n1")).unwrap();
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    let info = parse_csr(&csr).unwrap();
    assert!(matches!(info.key_algorithm, KeyAlgorithm::Other(_)), "{info:?}");
    let err = validate_runtime_serving_csr(&info, "n1").unwrap_err();
    assert_eq!(err.reason(), "CsrRejected");
    assert!(err.to_string().contains("P-256"), "{err}");
}

mod names_proptest {
    use proptest::prelude::*;

    use super::*;

    /// DNS-1123 subdomains: labels of 1 to 63 lower-case letters, digits and '-', starting and
    /// ending alphanumeric, at most 253 characters in all.
    fn node_name() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", 1..8)
            .prop_map(|labels| labels.join("."))
            .prop_filter("at most 253 characters", |n| n.len() <= 253)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn any_valid_node_name_joins(node in node_name()) {
            init();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let result = runtime.block_on(async { JoinBench::new().join(&node).await });
            prop_assert!(result.is_ok(), "{} characters: {:?}", node.len(), result);
        }
    }
}

/// A hostile CSR built directly with rcgen: extra SANs, CA request, extra usages.
fn hostile_csr(node: &str) -> (String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, CustomExtension, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
    };
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(runtime_serving_sans(node)).unwrap();
    params
        .subject_alt_names
        .push(SanType::URI("spiffe://evil/admin".try_into().unwrap()));
    params
        .subject_alt_names
        .push(SanType::Rfc822Name("root@evil.example".try_into().unwrap()));
    params
        .subject_alt_names
        .push(SanType::IpAddress("10.1.2.3".parse().unwrap()));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
        ExtendedKeyUsagePurpose::CodeSigning,
    ];
    params
        .custom_extensions
        .push(CustomExtension::from_oid_content(&[1, 2, 3, 4, 5], vec![0x05, 0x00]));
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    (csr, key.serialize_pem())
}

#[tokio::test]
async fn hostile_csr_is_reported_and_signing_copies_nothing_extra() {
    init();
    let ca = CertificateAuthority::generate("runtime CA", DAY).unwrap();
    let node = "n1";
    let (csr, key) = hostile_csr(node);

    let info = parse_csr(&csr).unwrap();
    assert!(info.has_unexpected_requests());
    assert_eq!(info.dns_names, runtime_serving_sans(node));
    assert_eq!(info.ip_addrs, vec!["10.1.2.3".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        info.other_sans,
        vec!["uri:spiffe://evil/admin", "email:root@evil.example"]
    );
    assert!(info.requests_ca);
    assert_eq!(info.other_extensions, vec!["1.2.3.4.5"]);
    assert_eq!(
        validate_runtime_serving_csr(&info, node).unwrap_err().reason(),
        "CsrRejected"
    );

    // Even if a caller signed it anyway, nothing beyond CN/DNS/IP and our usage is copied.
    let cert_pem = ca.sign_csr(csr.as_bytes(), DAY, LeafUsage::Server).unwrap();
    let der = parse_pem_chain(&cert_pem).unwrap().remove(0);
    let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
    let bc = x509.basic_constraints().unwrap().map(|b| b.value.ca);
    assert_ne!(bc, Some(true), "CA flag copied");
    let eku = x509.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth && !eku.code_signing && eku.other.is_empty());
    let san = x509.subject_alternative_name().unwrap().unwrap().value;
    for name in &san.general_names {
        assert!(
            matches!(
                name,
                x509_parser::extensions::GeneralName::DNSName(_) | x509_parser::extensions::GeneralName::IPAddress(_)
            ),
            "copied SAN {name:?}"
        );
    }
    assert!(
        x509.extensions().iter().all(|e| e.oid.to_id_string() != "1.2.3.4.5"),
        "custom extension copied"
    );

    // And the result is a working server certificate that is not a CA (a leaf it "signs" is refused).
    let resolver = Arc::new(ReloadableResolver::from_pem(&cert_pem, &key).unwrap());
    let (addr, _rx) = spawn_server(server_config(resolver).unwrap()).await;
    let client = client_config(ca.cert_pem(), None, &[]).unwrap();
    connect(addr, &client, &runtime_server_name(node)).await.unwrap();

    // Client usage gets clientAuth only.
    let client_cert = ca.sign_csr(&csr, DAY, LeafUsage::Client).unwrap();
    let der = parse_pem_chain(&client_cert).unwrap().remove(0);
    let (_, x509) = x509_parser::parse_x509_certificate(&der).unwrap();
    let eku = x509.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth && !eku.server_auth && !eku.code_signing);
}

#[tokio::test]
async fn resolver_swap_is_seen_by_new_handshakes_only() {
    init();
    let ca = CertificateAuthority::generate("ca", DAY).unwrap();
    let dns = names(&["svc.example"]);
    let first = ca.issue_server(&dns, &[], DAY).unwrap();
    let second = ca.issue_server(&dns, &[], 2 * DAY).unwrap();
    let stranger = ca.issue_server(&dns, &[], 3 * DAY).unwrap();
    let (first_info, second_info) = (
        parse_cert_pem(&first.cert_pem).unwrap(),
        parse_cert_pem(&second.cert_pem).unwrap(),
    );

    let resolver = Arc::new(ReloadableResolver::from_pem(&first.cert_pem, &first.key_pem).unwrap());
    let (addr, _rx) = spawn_server(server_config(resolver.clone()).unwrap()).await;
    let client = client_config(ca.cert_pem(), None, &[]).unwrap();

    let (seen1, mut conn1) = connect(addr, &client, "svc.example").await.unwrap();
    assert_eq!(seen1.leaf.serial_hex, first_info.serial_hex);
    assert_eq!(resolver.current_not_after(), first_info.not_after);

    resolver.swap_pem(&second.cert_pem, &second.key_pem).unwrap();
    assert_eq!(resolver.current_not_after(), second_info.not_after);
    let (seen2, _conn2) = connect(addr, &client, "svc.example").await.unwrap();
    assert_eq!(seen2.leaf.serial_hex, second_info.serial_hex);
    assert_eq!(seen2.leaf.not_after, second_info.not_after);

    // The connection made before the swap is still alive.
    tokio::time::timeout(STEP, ping(&mut conn1)).await.unwrap().unwrap();

    // Mismatched pairs and garbage are refused; the good certificate stays.
    for (cert, key) in [
        (stranger.cert_pem.as_str(), second.key_pem.as_str()),
        (second.cert_pem.as_str(), stranger.key_pem.as_str()),
        ("garbage", second.key_pem.as_str()),
        (second.cert_pem.as_str(), "garbage"),
    ] {
        assert!(resolver.swap_pem(cert, key).is_err());
    }
    assert_eq!(resolver.current_not_after(), second_info.not_after);
    let (seen3, _) = connect(addr, &client, "svc.example").await.unwrap();
    assert_eq!(seen3.leaf.serial_hex, second_info.serial_hex);
}

#[test]
fn renewal_and_expiry_on_real_certificates() {
    init();
    let ca = CertificateAuthority::generate("ca", DAY).unwrap();
    let now = SystemTime::now();
    let s = Duration::from_secs;
    // (not_before offset into the past, lifetime, renew at 2/3?, expired?)
    let cases = [
        (s(100), s(300), false, false), // one third elapsed
        (s(190), s(300), false, false), // just under two thirds
        (s(210), s(300), true, false),  // past two thirds
        (s(400), s(300), true, true),   // expired
    ];
    for (age, lifetime, renew, expired) in cases {
        let not_before = now - age;
        let cert = ca
            .issue_client("c", Validity::between(not_before, not_before + lifetime))
            .unwrap();
        let info = parse_cert_pem(&cert.cert_pem).unwrap();
        assert_eq!(needs_renewal(&info, now, RENEWAL_FRACTION), renew, "{age:?}");
        assert_eq!(is_expired(&info, now), expired, "{age:?}");
    }
    let ca_info = parse_cert_pem(ca.cert_pem()).unwrap();
    assert!(ca_info.is_ca);
    assert!(!needs_renewal(&ca_info, now, RENEWAL_FRACTION));
    assert!(needs_renewal(&ca_info, now + DAY, RENEWAL_FRACTION));
}

#[test]
fn garbage_inputs_never_panic() {
    init();
    let ca = CertificateAuthority::generate("ca", DAY).unwrap();
    let inputs: &[&str] = &[
        "",
        " ",
        "garbage",
        "-----BEGIN CERTIFICATE-----\n",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        "-----BEGIN CERTIFICATE REQUEST-----\nMAA=\n-----END CERTIFICATE REQUEST-----\n",
        "\u{0}\u{7f}\u{10ffff}",
    ];
    for input in inputs {
        assert!(parse_cert_pem(input).is_err(), "{input:?}");
        assert!(parse_pem_chain(input).is_err(), "{input:?}");
        assert!(parse_private_key_pem(input).is_err(), "{input:?}");
        assert!(parse_csr(input).is_err(), "{input:?}");
        assert!(ca.sign_csr(input, DAY, LeafUsage::Server).is_err(), "{input:?}");
        assert!(
            CertificateAuthority::from_pem(input, ca.key_pem()).is_err(),
            "{input:?}"
        );
        assert!(
            CertificateAuthority::from_pem(ca.cert_pem(), input).is_err(),
            "{input:?}"
        );
        assert!(ReloadableResolver::from_pem(input, input).is_err(), "{input:?}");
        assert!(client_config(input, None, &[]).is_err(), "{input:?}");
        assert!(build_csr(input, "cn", &[]).is_err(), "{input:?}");
        let err = parse_cert_pem(input).unwrap_err();
        assert!(!err.reason().is_empty() && !err.to_string().is_empty());
    }
}
