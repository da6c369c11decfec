//! Who is calling: the API server's front proxy, vouching for a user in request headers.
//!
//! The API server authenticates the user, authorizes the request, and proxies it here with a
//! client certificate from its requestheader CA and the user in headers (`X-Remote-User`,
//! `X-Remote-Group`, `X-Remote-Extra-*` by default). The headers mean something only on a
//! connection that presented such a certificate, with a name the API server's configuration
//! allows: anything else is refused, so a caller that reaches this port directly cannot claim
//! to be anyone. The settings are the API server's own, published in the ConfigMap
//! `kube-system/extension-apiserver-authentication`, as every aggregated API server reads them.

use std::collections::BTreeMap;

use axum::http::HeaderMap;

use super::AccessError;

/// Namespace of the API server's authentication ConfigMap.
pub const CONFIGMAP_NAMESPACE: &str = "kube-system";
/// The API server's authentication ConfigMap.
pub const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// The front-proxy (requestheader) settings of the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderConfig {
    /// The CA the front proxy's client certificate chains to (PEM).
    pub client_ca_pem: String,
    /// Common names the proxy's certificate may carry; empty: any certificate of the CA.
    pub allowed_names: Vec<String>,
    /// Headers naming the user (the first present wins).
    pub username_headers: Vec<String>,
    /// Headers naming the user's UID.
    pub uid_headers: Vec<String>,
    /// Headers naming the user's groups (every value counts).
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying the user's extra attributes, lower-cased (as header names
    /// arrive).
    pub extra_prefixes: Vec<String>,
}

/// The user a request is made for, as the API server authenticated them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The UID, when the API server sends one.
    pub uid: Option<String>,
    /// The groups.
    pub groups: Vec<String>,
    /// Extra attributes (lowercased keys).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The verified client certificate of a connection, if it presented one: its subject common
/// name. Put on every request of the connection by the TLS acceptor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peer {
    /// The common name of a certificate that chained to the requestheader CA.
    pub common_name: Option<String>,
    /// Whether a certificate was presented (and verified) at all.
    pub presented: bool,
}

fn json_list(data: &BTreeMap<String, String>, key: &str) -> Result<Vec<String>, AccessError> {
    match data.get(key).map(|s| s.trim()) {
        None | Some("") => Ok(Vec::new()),
        Some(text) => serde_json::from_str::<Vec<String>>(text).map_err(|e| {
            AccessError::NotReady(format!(
                "{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}: {key} is not a JSON list of strings ({e})"
            ))
        }),
    }
}

impl RequestHeaderConfig {
    /// Reads the settings from the ConfigMap's data. Without a requestheader CA the API server
    /// is not configured for aggregation, and nothing can be served.
    pub fn from_configmap(data: &BTreeMap<String, String>) -> Result<Self, AccessError> {
        let client_ca_pem = data
            .get("requestheader-client-ca-file")
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                AccessError::NotReady(format!(
                    "the API server is not configured for aggregated APIs: {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME} has no \
                     requestheader-client-ca-file (start kube-apiserver with --requestheader-client-ca-file and \
                     --proxy-client-cert-file)"
                ))
            })?
            .to_string();
        let username_headers = json_list(data, "requestheader-username-headers")?;
        if username_headers.is_empty() {
            return Err(AccessError::NotReady(format!(
                "{CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}: requestheader-username-headers is empty"
            )));
        }
        Ok(Self {
            client_ca_pem,
            allowed_names: json_list(data, "requestheader-allowed-names")?,
            username_headers,
            uid_headers: json_list(data, "requestheader-uid-headers")?,
            group_headers: json_list(data, "requestheader-group-headers")?,
            extra_prefixes: json_list(data, "requestheader-extra-headers-prefix")?
                .into_iter()
                .map(|p| p.to_ascii_lowercase())
                .collect(),
        })
    }

    /// Whether `peer` is the front proxy: a certificate of the requestheader CA (the TLS
    /// handshake checked the chain) with a name the API server allows (any, when it lists none).
    pub fn allows_name(&self, common_name: Option<&str>) -> bool {
        self.allowed_names.is_empty() || common_name.is_some_and(|cn| self.allowed_names.iter().any(|n| n == cn))
    }

    /// Checks that a connection from `peer` is the front proxy's. The TLS handshake refuses
    /// every other caller already; this holds for a connection made before the API server's
    /// allowed names changed.
    pub fn check_proxy(&self, peer: &Peer) -> Result<(), AccessError> {
        if !peer.presented {
            return Err(AccessError::Unauthenticated(
                "no front-proxy client certificate: this API is served through the Kubernetes API server \
                 (kubectl smolvm ..., or /apis/subresources.vm.smolvm.dev/...)"
                    .into(),
            ));
        }
        if !self.allows_name(peer.common_name.as_deref()) {
            return Err(AccessError::Unauthenticated(format!(
                "the client certificate's common name {:?} is not among the API server's requestheader-allowed-names",
                peer.common_name.as_deref().unwrap_or("")
            )));
        }
        Ok(())
    }

    /// The user a request's headers name (the first username header present), not yet
    /// checked against the connection: only for counting a user's share of the replica.
    pub fn named_user(&self, headers: &HeaderMap) -> Option<String> {
        self.username_headers
            .iter()
            .find_map(|h| headers.get(h.as_str()).and_then(|v| v.to_str().ok()))
            .map(|v| v.trim().to_string())
    }

    /// The user of a request on a connection from `peer`, or why there is none.
    pub fn authenticate(&self, peer: &Peer, headers: &HeaderMap) -> Result<User, AccessError> {
        self.check_proxy(peer)?;
        let first = |names: &[String]| {
            names
                .iter()
                .find_map(|h| headers.get(h.as_str()).and_then(|v| v.to_str().ok()))
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let name = first(&self.username_headers)
            .ok_or_else(|| AccessError::Unauthenticated("the front proxy named no user".into()))?;
        let uid = first(&self.uid_headers);
        let groups = self
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h.as_str()))
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let header = header.as_str();
            let Some(key) = self
                .extra_prefixes
                .iter()
                .find_map(|p| header.strip_prefix(p.as_str()).filter(|k| !k.is_empty()))
            else {
                continue;
            };
            if let Ok(value) = value.to_str() {
                extra
                    .entry(percent_decode(key).to_ascii_lowercase())
                    .or_default()
                    .push(value.to_string());
            }
        }
        Ok(User {
            name,
            uid,
            groups,
            extra,
        })
    }
}

/// Decodes `%XX` escapes (the API server escapes extra keys this way); an invalid escape is
/// kept as written.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn standard() -> BTreeMap<String, String> {
        data(&[
            ("requestheader-client-ca-file", "-----BEGIN CERTIFICATE-----\n"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ])
    }

    #[test]
    fn configmap_settings() {
        let cfg = RequestHeaderConfig::from_configmap(&standard()).expect("config");
        assert_eq!(cfg.allowed_names, ["front-proxy-client"]);
        assert_eq!(cfg.username_headers, ["X-Remote-User"]);
        let table: [(&str, Vec<(&str, &str)>); 3] = [
            ("no CA: aggregation not configured", vec![]),
            ("no user header", vec![("requestheader-client-ca-file", "pem")]),
            (
                "a list that is not JSON",
                vec![
                    ("requestheader-client-ca-file", "pem"),
                    ("requestheader-username-headers", "X-Remote-User"),
                ],
            ),
        ];
        for (what, pairs) in table {
            let error = RequestHeaderConfig::from_configmap(&data(&pairs)).expect_err(what);
            assert_eq!(error.reason(), "NotReady", "{what}");
        }
    }

    #[test]
    fn who_is_calling() {
        let cfg = RequestHeaderConfig::from_configmap(&standard()).expect("config");
        let proxy = Peer {
            common_name: Some("front-proxy-client".into()),
            presented: true,
        };
        let mut headers = HeaderMap::new();
        headers.insert("x-remote-user", HeaderValue::from_static("alice"));
        headers.append("x-remote-group", HeaderValue::from_static("dev"));
        headers.append("x-remote-group", HeaderValue::from_static("system:authenticated"));
        headers.insert("x-remote-extra-scopes%2fa", HeaderValue::from_static("x"));
        let user = cfg.authenticate(&proxy, &headers).expect("user");
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev", "system:authenticated"]);
        assert_eq!(user.extra.get("scopes/a"), Some(&vec!["x".to_string()]));

        let table: [(&str, Peer, bool); 4] = [
            ("no certificate: a forged header is ignored", Peer::default(), false),
            (
                "a certificate with a name not allowed",
                Peer {
                    common_name: Some("someone".into()),
                    presented: true,
                },
                false,
            ),
            (
                "a certificate without a name",
                Peer {
                    common_name: None,
                    presented: true,
                },
                false,
            ),
            ("the front proxy", proxy.clone(), true),
        ];
        for (what, peer, ok) in table {
            let got = cfg.authenticate(&peer, &headers);
            assert_eq!(got.is_ok(), ok, "{what}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.reason(), "Unauthenticated", "{what}");
            }
        }
        let no_user = cfg.authenticate(&proxy, &HeaderMap::new()).expect_err("no user");
        assert_eq!(no_user.reason(), "Unauthenticated");
        let any_name = RequestHeaderConfig {
            allowed_names: vec![],
            ..cfg
        };
        let peer = Peer {
            common_name: Some("other".into()),
            presented: true,
        };
        assert!(
            any_name.authenticate(&peer, &headers).is_ok(),
            "empty allowed names: any name of the CA"
        );
    }

    #[test]
    fn percent_decoding() {
        for (input, want) in [
            ("a%2fb", "a/b"),
            ("plain", "plain"),
            ("bad%zz", "bad%zz"),
            ("end%2", "end%2"),
        ] {
            assert_eq!(percent_decode(input), want, "{input}");
        }
    }
}
