//! The workload's configuration, resolved: environment values from Secrets and ConfigMaps, and
//! the registry credential from `imagePullSecrets`. Pure functions of what was fetched; the
//! fetching is in `reconcile`.
//!
//! Values read here may be secret. They go into the node API request and nowhere else: no error,
//! condition, event or log line built here carries a value, only object names and keys.

use std::collections::{BTreeMap, BTreeSet};

use smolvm_api::{
    SmolVM,
    nodeapi::{EnvVar, RegistryAuth, Sensitive},
    syntax::{normalize_registry_host, registry_of},
};

/// The kind of object an env value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

impl Source {
    /// The kind, as Kubernetes spells it.
    pub fn kind(self) -> &'static str {
        match self {
            Source::Secret => "Secret",
            Source::ConfigMap => "ConfigMap",
        }
    }

    /// The resource, as RBAC spells it.
    pub fn resource(self) -> &'static str {
        match self {
            Source::Secret => "secrets",
            Source::ConfigMap => "configmaps",
        }
    }
}

/// What reading one referenced object gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// Its data, by key (ConfigMap `data` and `binaryData`, Secret `data`).
    Data(BTreeMap<String, Vec<u8>>),
    /// It does not exist.
    Missing,
    /// The controller may not read it (403).
    Forbidden,
}

/// Every object the SmolVM's env refers to, each once.
pub fn env_references(vm: &SmolVM) -> BTreeSet<(Source, String)> {
    vm.spec
        .env
        .iter()
        .flatten()
        .filter_map(|var| var.value_from.as_ref())
        .flat_map(|from| {
            let secret = from.secret_key_ref.as_ref().map(|r| (Source::Secret, r.name.clone()));
            let config_map = from
                .config_map_key_ref
                .as_ref()
                .map(|r| (Source::ConfigMap, r.name.clone()));
            secret.into_iter().chain(config_map)
        })
        .collect()
}

/// Why the environment could not be resolved: every problem, so one message tells them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Objects the controller may not read: (kind, name).
    pub forbidden: Vec<(Source, String)>,
    /// Objects or keys missing, or values that are not text, each described.
    pub missing: Vec<String>,
}

impl ConfigError {
    /// The condition reason: `SecretAccessDenied` when a read was refused, else
    /// `CreateConfigError`.
    pub fn reason(&self) -> &'static str {
        if self.forbidden.is_empty() {
            smolvm_api::constants::reason::CREATE_CONFIG_ERROR
        } else {
            smolvm_api::constants::reason::SECRET_ACCESS_DENIED
        }
    }

    /// The condition message: the objects and keys, and for a refused read the permission.
    pub fn message(&self, namespace: &str) -> String {
        let mut parts = Vec::new();
        for (source, name) in &self.forbidden {
            parts.push(format!(
                "the controller may not get {} in namespace {namespace} ({} {name}); grant it with the deploy/components/workload-secrets component",
                source.resource(),
                source.kind()
            ));
        }
        parts.extend(self.missing.iter().cloned());
        let mut message = parts.join("; ");
        message.push_str(": the machine is not created until this is fixed (retried)");
        message
    }
}

/// Resolves the SmolVM's env with the objects fetched, in the spec's order. A missing object or
/// key that is `optional` leaves the variable out (as a Pod does); one that is not is an error.
pub fn resolve_env(vm: &SmolVM, fetched: &BTreeMap<(Source, String), Fetched>) -> Result<Vec<EnvVar>, ConfigError> {
    let mut out = Vec::new();
    let mut error = ConfigError {
        forbidden: Vec::new(),
        missing: Vec::new(),
    };
    for var in vm.spec.env.iter().flatten() {
        if let Some(value) = &var.value {
            out.push(EnvVar {
                name: var.name.clone(),
                value: Sensitive(value.clone()),
            });
            continue;
        }
        let Some(from) = &var.value_from else { continue };
        let (source, selector) = match (&from.secret_key_ref, &from.config_map_key_ref) {
            (Some(s), _) => (Source::Secret, s),
            (None, Some(c)) => (Source::ConfigMap, c),
            (None, None) => continue,
        };
        let optional = selector.optional.unwrap_or(false);
        let key = (source, selector.name.clone());
        match fetched.get(&key) {
            Some(Fetched::Forbidden) => {
                if !error.forbidden.contains(&key) {
                    error.forbidden.push(key);
                }
            }
            None | Some(Fetched::Missing) => {
                if !optional {
                    error.missing.push(format!(
                        "{} {} (for env {}) not found",
                        source.kind(),
                        selector.name,
                        var.name
                    ));
                }
            }
            Some(Fetched::Data(data)) => match data.get(&selector.key) {
                Some(bytes) => match String::from_utf8(bytes.clone()) {
                    Ok(text) => out.push(EnvVar {
                        name: var.name.clone(),
                        value: Sensitive(text),
                    }),
                    Err(_) => error.missing.push(format!(
                        "key {} of {} {} (for env {}) is not UTF-8 text",
                        selector.key,
                        source.kind(),
                        selector.name,
                        var.name
                    )),
                },
                None if optional => {}
                None => error.missing.push(format!(
                    "key {} not found in {} {} (for env {})",
                    selector.key,
                    source.kind(),
                    selector.name,
                    var.name
                )),
            },
        }
    }
    if error.forbidden.is_empty() && error.missing.is_empty() {
        Ok(out)
    } else {
        Err(error)
    }
}

/// A key of a dockerconfigjson `auths` map as (host, path prefix): the scheme and a trailing
/// `/v1/` or `/v2/` go, as kubelet reads them.
fn parse_auth_key(key: &str) -> (String, String) {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let path = path.trim_end_matches('/');
    let path = if matches!(path, "v1" | "v2") { "" } else { path };
    (normalize_registry_host(host), path.to_string())
}

/// Whether a dockerconfigjson key matches an image's registry and path: the host equal (a
/// leading `*.` in the key matching one label), and the key's path, if any, a prefix of the
/// image's path at a component boundary.
fn key_matches(key: &str, host: &str, path: &str) -> bool {
    let (key_host, key_path) = parse_auth_key(key);
    let host_ok = match key_host.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => key_host == host,
    };
    let path_ok = key_path.is_empty() || path == key_path || path.starts_with(&format!("{key_path}/"));
    host_ok && path_ok
}

/// One `auths` entry: `username` and `password`, or `auth` (base64 of `user:password`).
#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
}

#[derive(serde::Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

/// Why a pull secret gave no credential (for a warning; never a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullSecretProblem {
    /// Not readable as `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`) or `dockercfg`.
    Unreadable(String),
}

/// The credential for `image` from the pull secrets' contents (each the bytes of
/// `.dockerconfigjson`, or of a legacy `.dockercfg`, in `imagePullSecrets` order): the first
/// secret with an entry matching the image's registry wins, and within a secret the most
/// specific key (longest path). `None` when nothing matches, or for `local:` images.
pub fn registry_auth(image: &str, secrets: &[(String, Vec<u8>)]) -> (Option<RegistryAuth>, Vec<PullSecretProblem>) {
    let mut problems = Vec::new();
    let Some((host, path)) = registry_of(image) else {
        return (None, problems);
    };
    for (name, bytes) in secrets {
        let auths = match serde_json::from_slice::<DockerConfig>(bytes) {
            Ok(config) if !config.auths.is_empty() => config.auths,
            // The legacy `.dockercfg` form is the `auths` map itself.
            _ => match serde_json::from_slice::<BTreeMap<String, AuthEntry>>(bytes) {
                Ok(auths) => auths,
                Err(_) => {
                    problems.push(PullSecretProblem::Unreadable(name.clone()));
                    continue;
                }
            },
        };
        let best = auths
            .iter()
            .filter(|(key, _)| key_matches(key, &host, &path))
            .max_by_key(|(key, _)| parse_auth_key(key).1.len());
        if let Some((_, entry)) = best
            && let Some(auth) = credential(entry)
        {
            return (Some(auth), problems);
        }
    }
    (None, problems)
}

fn credential(entry: &AuthEntry) -> Option<RegistryAuth> {
    if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
        return Some(RegistryAuth {
            username: Sensitive(username.clone()),
            password: Sensitive(password.clone()),
        });
    }
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(entry.auth.as_deref()?.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (username, password) = text.split_once(':')?;
    Some(RegistryAuth {
        username: Sensitive(username.to_string()),
        password: Sensitive(password.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(env: serde_json::Value) -> SmolVM {
        serde_json::from_value(json!({
            "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": {"image": "alpine:3.20", "env": env}
        }))
        .expect("a SmolVM")
    }

    fn data(pairs: &[(&str, &str)]) -> Fetched {
        Fetched::Data(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    #[test]
    fn env_resolves_in_order_and_skips_only_optional_gaps() {
        let vm = vm(json!([
            {"name": "MODE", "value": "prod"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "level"}}},
            {"name": "EXTRA", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "x", "optional": true}}},
            {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "s", "key": "absent", "optional": true}}}
        ]));
        assert_eq!(
            env_references(&vm),
            [
                (Source::Secret, "s".to_string()),
                (Source::ConfigMap, "c".to_string()),
                (Source::ConfigMap, "gone".to_string())
            ]
            .into()
        );
        let fetched: BTreeMap<_, _> = [
            ((Source::Secret, "s".to_string()), data(&[("token", "s3cret")])),
            ((Source::ConfigMap, "c".to_string()), data(&[("level", "debug")])),
            ((Source::ConfigMap, "gone".to_string()), Fetched::Missing),
        ]
        .into();
        let env = resolve_env(&vm, &fetched).expect("resolved");
        let pairs: Vec<(&str, &str)> = env.iter().map(|e| (e.name.as_str(), e.value.expose())).collect();
        assert_eq!(pairs, vec![("MODE", "prod"), ("TOKEN", "s3cret"), ("LEVEL", "debug")]);
    }

    #[test]
    fn config_errors_name_objects_and_keys_never_values() {
        let vm = vm(json!([
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "missing-secret", "key": "k"}}},
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "nokey"}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "present"}}}
        ]));
        let fetched: BTreeMap<_, _> = [
            ((Source::Secret, "missing-secret".to_string()), Fetched::Missing),
            ((Source::ConfigMap, "c".to_string()), data(&[("present", "v4lue")])),
        ]
        .into();
        let error = resolve_env(&vm, &fetched).expect_err("missing");
        assert_eq!(error.reason(), "CreateConfigError");
        let message = error.message("ns");
        for needle in ["Secret missing-secret", "key nokey not found in ConfigMap c", "env B"] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
        assert!(!message.contains("v4lue"), "{message}");

        let forbidden: BTreeMap<_, _> = [
            ((Source::Secret, "missing-secret".to_string()), Fetched::Forbidden),
            (
                (Source::ConfigMap, "c".to_string()),
                data(&[("present", "v"), ("nokey", "v")]),
            ),
        ]
        .into();
        let error = resolve_env(&vm, &forbidden).expect_err("forbidden");
        assert_eq!(error.reason(), "SecretAccessDenied");
        let message = error.message("ns");
        assert!(
            message.contains("get secrets in namespace ns") && message.contains("workload-secrets"),
            "{message}"
        );

        let binary: BTreeMap<_, _> = [
            ((Source::Secret, "missing-secret".to_string()), data(&[("k", "x")])),
            (
                (Source::ConfigMap, "c".to_string()),
                Fetched::Data(
                    [
                        ("nokey".to_string(), vec![0xff, 0xfe]),
                        ("present".to_string(), b"v".to_vec()),
                    ]
                    .into(),
                ),
            ),
        ]
        .into();
        let error = resolve_env(&vm, &binary).expect_err("not text");
        assert!(error.message("ns").contains("not UTF-8"), "{}", error.message("ns"));
    }

    #[test]
    fn registries_of_images() {
        let cases = [
            ("alpine:3.20", Some(("docker.io", "library/alpine"))),
            ("bitnami/nginx", Some(("docker.io", "bitnami/nginx"))),
            ("docker.io/library/alpine", Some(("docker.io", "library/alpine"))),
            ("ghcr.io/org/app:1", Some(("ghcr.io", "org/app"))),
            (
                "registry.example.com:5000/team/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                Some(("registry.example.com:5000", "team/app")),
            ),
            ("localhost/app", Some(("localhost", "app"))),
            ("local:tiny", None),
        ];
        for (image, expected) in cases {
            assert_eq!(
                registry_of(image),
                expected.map(|(h, p)| (h.to_string(), p.to_string())),
                "{image}"
            );
        }
    }

    fn dockerconfig(auths: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({ "auths": auths })).expect("json")
    }

    #[test]
    fn pull_credentials_match_by_registry_as_kubelet_does() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:pa55");
        let secrets = vec![
            (
                "other".to_string(),
                dockerconfig(json!({"quay.io": {"username": "q", "password": "qp"}})),
            ),
            (
                "hub".to_string(),
                dockerconfig(json!({
                    "https://index.docker.io/v1/": {"auth": auth},
                    "ghcr.io": {"username": "g", "password": "gp"},
                    "ghcr.io/org/special": {"username": "gs", "password": "gsp"},
                    "*.example.com": {"username": "w", "password": "wp"}
                })),
            ),
        ];
        let cases = [
            ("alpine:3.20", Some(("robot", "pa55"))),
            ("quay.io/org/app", Some(("q", "qp"))),
            ("ghcr.io/org/app", Some(("g", "gp"))),
            ("ghcr.io/org/special/app", Some(("gs", "gsp"))),
            ("ghcr.io/org/specialist", Some(("g", "gp"))),
            ("registry.example.com/app", Some(("w", "wp"))),
            ("a.b.example.com/app", None),
            ("example.com/app", None),
            ("gcr.io/app", None),
            ("local:tiny", None),
        ];
        for (image, expected) in cases {
            let (found, problems) = registry_auth(image, &secrets);
            assert!(problems.is_empty(), "{image}: {problems:?}");
            let got = found.map(|a| (a.username.expose().to_string(), a.password.expose().to_string()));
            assert_eq!(got, expected.map(|(u, p)| (u.to_string(), p.to_string())), "{image}");
        }
        // A legacy .dockercfg (the auths map alone) works; garbage is reported by name only.
        let legacy = vec![(
            "legacy".to_string(),
            serde_json::to_vec(&json!({"ghcr.io": {"username": "l", "password": "lp"}})).expect("json"),
        )];
        assert!(registry_auth("ghcr.io/org/app", &legacy).0.is_some());
        let garbage = vec![("broken".to_string(), b"not json".to_vec())];
        assert_eq!(
            registry_auth("ghcr.io/org/app", &garbage).1,
            vec![PullSecretProblem::Unreadable("broken".into())]
        );
        // Debug never shows a credential.
        let (found, _) = registry_auth("alpine", &secrets);
        assert!(!format!("{found:?}").contains("pa55"));
    }
}
