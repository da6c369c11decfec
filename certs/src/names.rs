//! Naming schemes for the certificates this operator issues.
//!
//! # Runtime serving certificates
//!
//! A node's runtime agent serves the node API with a certificate whose only SAN is
//! [`runtime_server_name`]`(node)` = `<node-name>.runtime.vm.smolvm.dev` (a digest form for
//! node names too long for that). The request carries no subject common name: a CN is capped at
//! 64 characters, and node names run to 253.
//! That name is never resolved through DNS: the controller dials the endpoint the node reports
//! and passes this name as the TLS `ServerName`, so the handshake succeeds only if the
//! certificate, signed by the runtime CA, names exactly the node the controller meant to reach.
//!
//! The controller's CSR signer (signer name [`RUNTIME_SERVING_SIGNER_NAME`]) signs a runtime
//! CSR only when, after checking the requester's node, [`crate::validate_runtime_serving_csr`]
//! accepts it: the DNS SANs must be exactly [`runtime_serving_sans`]`(node)`, with no IP, URI,
//! email or other SANs, no CA request and no other extensions.

use rcgen::{DistinguishedName, DnType};
use rustls::pki_types::DnsName;

use crate::error::{Error, Result};

/// Upper bound for a subject common name (X.509 `ub-common-name`).
const MAX_COMMON_NAME_LEN: usize = 64;

/// DNS suffix under which runtime serving certificates name their node.
pub const RUNTIME_SERVING_DNS_SUFFIX: &str = "runtime.vm.smolvm.dev";

/// Kubernetes CertificateSigningRequest signer name for runtime serving certificates.
pub const RUNTIME_SERVING_SIGNER_NAME: &str = "vm.smolvm.dev/runtime-serving";

/// Longest DNS name a certificate (and a TLS server name) can carry.
pub const MAX_DNS_NAME_LEN: usize = 253;

/// The DNS name (TLS server name) a node's runtime certificate carries:
/// `<node_name>.runtime.vm.smolvm.dev` whenever that is a valid DNS name of at most 253
/// characters, which holds for every node name of up to 231 characters. A longer node name
/// (Kubernetes allows 253) is named by its digest instead: `h-<56 hex digits of
/// SHA-256(node_name)>.runtime.vm.smolvm.dev`. Both sides (the agent's CSR, the signer's check
/// and the controller's handshake) derive the name from the node name with this one function,
/// so every valid node name has exactly one name that fits.
pub fn runtime_server_name(node_name: &str) -> String {
    let plain = format!("{node_name}.{RUNTIME_SERVING_DNS_SUFFIX}");
    if plain.len() <= MAX_DNS_NAME_LEN && DnsName::try_from(plain.as_str()).is_ok() {
        return plain;
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, node_name.as_bytes());
    let hex: String = digest.as_ref().iter().take(28).map(|b| format!("{b:02x}")).collect();
    format!("h-{hex}.{RUNTIME_SERVING_DNS_SUFFIX}")
}

/// The complete list of DNS SANs allowed in a node's runtime serving certificate (exactly one).
pub fn runtime_serving_sans(node_name: &str) -> Vec<String> {
    vec![runtime_server_name(node_name)]
}

/// DNS names under which a webhook Service is reached in-cluster:
/// `svc`, `svc.ns`, `svc.ns.svc`, `svc.ns.svc.cluster.local`.
pub fn webhook_service_dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

/// Checks that `name` is a syntactically valid DNS name for a certificate SAN.
pub fn validate_dns_name(name: &str) -> Result<()> {
    DnsName::try_from(name).map(|_| ()).map_err(|e| Error::InvalidName {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// A subject naming only `common_name`, refused when longer than X.509 allows or with control characters.
pub(crate) fn distinguished_name(common_name: &str) -> Result<DistinguishedName> {
    if common_name.len() > MAX_COMMON_NAME_LEN {
        return Err(Error::InvalidName {
            name: common_name.to_string(),
            reason: format!("common name longer than {MAX_COMMON_NAME_LEN} bytes"),
        });
    }
    if common_name.chars().any(char::is_control) {
        return Err(Error::InvalidName {
            name: common_name.to_string(),
            reason: "common name contains control characters".to_string(),
        });
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    Ok(dn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_names() {
        assert_eq!(runtime_server_name("worker-1"), "worker-1.runtime.vm.smolvm.dev");
        assert_eq!(
            runtime_serving_sans("ip-10-0-0-1.ec2.internal"),
            vec!["ip-10-0-0-1.ec2.internal.runtime.vm.smolvm.dev".to_string()]
        );
        validate_dns_name(&runtime_server_name("worker-1")).unwrap();
    }

    #[test]
    fn every_valid_node_name_gets_one_name_that_fits() {
        let long_label = "a".repeat(63);
        let max = [long_label.as_str(); 3].join(".") + "." + &"b".repeat(61); // 253 characters
        assert_eq!(max.len(), 253);
        let cases = [
            ("n", false),
            ("worker-1", false),
            ("ip-192-168-101-202.ap-southeast-2.compute.internal", false),
            ("gke-prod-europe-west4-default-pool-6f5c2a1b-x7kq", false),
            ("aks-nodepool1-12345678-vmss000000", false),
            ("10.0.0.1", false),
            (&"a".repeat(63), false),
            (&max[..231], false),
            (&max[..232], true),
            (max.as_str(), true),
        ];
        for (node, hashed) in cases {
            let name = runtime_server_name(node);
            validate_dns_name(&name).unwrap_or_else(|e| panic!("{node:?} ({} chars): {e}", node.len()));
            assert!(name.len() <= MAX_DNS_NAME_LEN, "{node:?}");
            assert_eq!(name.starts_with("h-"), hashed, "{node:?} -> {name}");
            if !hashed {
                assert_eq!(name, format!("{node}.{RUNTIME_SERVING_DNS_SUFFIX}"));
            }
        }
        // Distinct long names get distinct server names.
        let other = format!("{}c", &max[..252]);
        assert_ne!(runtime_server_name(&max), runtime_server_name(&other));
    }

    #[test]
    fn webhook_names() {
        assert_eq!(
            webhook_service_dns_names("smolvm-webhook", "smolvm-system"),
            vec![
                "smolvm-webhook",
                "smolvm-webhook.smolvm-system",
                "smolvm-webhook.smolvm-system.svc",
                "smolvm-webhook.smolvm-system.svc.cluster.local",
            ]
        );
    }

    #[test]
    fn dns_name_validation_table() {
        for (name, ok) in [
            ("a.b.c", true),
            ("node-1.runtime.vm.smolvm.dev", true),
            ("", false),
            ("bad name", false),
            ("-leading.example", false),
            ("a..b", false),
            ("ünicode.example", false),
        ] {
            assert_eq!(validate_dns_name(name).is_ok(), ok, "{name:?}");
        }
    }
}
