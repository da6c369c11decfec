//! TLS modes.

use super::*;

pub(super) fn webhook_args(all: &[Value]) -> Vec<String> {
    let (_, template) = workloads(all).into_iter().find(|(n, _)| n == WEBHOOK).expect("webhook");
    pod_spec(&template, WEBHOOK).containers[0]
        .args
        .clone()
        .unwrap_or_default()
}

pub(super) fn inject_annotation(all: &[Value], kind: &str) -> String {
    str_at(
        find(all, kind, WEBHOOK),
        "/metadata/annotations/cert-manager.io~1inject-ca-from",
    )
    .to_string()
}

#[test]
pub(super) fn each_overlay_wires_its_tls_mode() {
    require_kubectl!();
    let default = rendered("default");
    assert!(webhook_args(default).contains(&"--tls-mode=self-signed".to_string()));
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        assert_eq!(
            inject_annotation(default, kind),
            "",
            "default: {kind} is injected by the webhook"
        );
    }
    assert!(objects(default, "Certificate").next().is_none());

    let cm = rendered("cert-manager");
    let args = webhook_args(cm);
    assert!(args.contains(&"--tls-mode=files".to_string()), "{args:?}");
    let certificates: BTreeMap<String, &Value> = objects(cm, "Certificate")
        .map(|o| (str_at(o, "/metadata/name").to_string(), o))
        .collect();
    let issuers: BTreeSet<String> = objects(cm, "Issuer")
        .map(|o| str_at(o, "/metadata/name").to_string())
        .collect();
    for (name, cert) in &certificates {
        let issuer = str_at(cert, "/spec/issuerRef/name");
        assert!(issuers.contains(issuer), "Certificate {name}: no Issuer {issuer}");
    }
    for issuer in objects(cm, "Issuer") {
        let secret = str_at(issuer, "/spec/ca/secretName");
        if !secret.is_empty() {
            assert!(
                certificates
                    .values()
                    .any(|c| str_at(c, "/spec/secretName") == secret && c["spec"]["isCA"] == json!(true)),
                "{}: its CA Secret {secret} comes from no CA Certificate",
                describe(issuer)
            );
        }
    }
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let from = inject_annotation(cm, kind);
        let (ns, name) = from
            .split_once('/')
            .unwrap_or_else(|| panic!("{kind}: inject-ca-from {from:?}"));
        assert_eq!(ns, NAMESPACE);
        let serving = certificates
            .get(name)
            .unwrap_or_else(|| panic!("{kind}: no Certificate {name}"));
        let dns: BTreeSet<&str> = serving["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for want in smolvm_certs::webhook_service_dns_names(WEBHOOK, NAMESPACE) {
            assert!(dns.contains(want.as_str()), "Certificate {name} lacks {want}");
        }
        // The webhook mounts that Certificate's Secret and reads the pair from it.
        let secret = str_at(serving, "/spec/secretName");
        let (_, template) = workloads(cm).into_iter().find(|(n, _)| n == WEBHOOK).expect("webhook");
        let spec = pod_spec(&template, WEBHOOK);
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret))
            .unwrap_or_else(|| panic!("the webhook does not mount {secret}"));
        let mount = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume.name)
            .expect("tls mount");
        assert!(args.contains(&format!("--tls-cert={}/tls.crt", mount.mount_path)));
        assert!(args.contains(&format!("--tls-key={}/tls.key", mount.mount_path)));
    }
}
