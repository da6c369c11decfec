//! The workload of a SmolVM (rule V11): its environment and where its values come from, the
//! registry credentials it pulls with, its restart policy, and the schema's maxima.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The schema's most `env` entries (the policy's `maxEnv` may lower it).
pub const MAX_ENV: i64 = 256;
/// The schema's most `command` (and `args`) entries (the policy's `maxArgs` may lower it).
pub const MAX_ARGS: i64 = 256;
/// The schema's most `network.allowedHosts` entries (the policy's `maxAllowedHosts` may lower it).
pub const MAX_ALLOWED_HOSTS: i64 = 64;
/// The schema's most bytes per env value, command or args entry (the policy's `maxValueBytes`
/// may lower it).
pub const MAX_VALUE_BYTES: i64 = 32_768;

/// One environment variable of the workload.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.valueFrom)").message("an env entry has exactly one of value and valueFrom (V11)"))]
pub struct EnvVar {
    /// Name of the variable: not empty, without '='.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("!self.contains('=')").message("an env name must not contain '=' (V11)"))]
    pub name: String,

    /// A literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,

    /// A value read from a key of a Secret or ConfigMap in the SmolVM's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where an env value comes from: exactly one of a Secret's or a ConfigMap's key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("valueFrom has exactly one of secretKeyRef and configMapKeyRef (V11)"))]
pub struct EnvVarSource {
    /// A key of a Secret in the SmolVM's namespace (the controller needs the workload-secrets component to read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,

    /// A key of a ConfigMap in the SmolVM's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
}

/// A key of a Secret or ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeySelector {
    /// Name of the Secret or ConfigMap (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("a referenced name must be a DNS-1123 subdomain (V11)"))]
    pub name: String,

    /// The key: letters, digits, '-', '_' and '.'.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message("a key is made of letters, digits, '-', '_' and '.' (V11)"))]
    pub key: String,

    /// Whether a missing object or key is allowed (the variable is then left out). Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A reference to an object by name in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the object (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')").message("imagePullSecrets names must be DNS-1123 subdomains (V11)"))]
    pub name: String,
}

/// What happens when the workload's machine stops on its own while spec.running is true.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RestartPolicy {
    /// Started again by the controller after every exit, while spec.running is true (the default).
    #[default]
    Always,
    /// Restarted by smolvm after a failed exit; left stopped after a clean one.
    OnFailure,
    /// Left stopped after any exit.
    Never,
}

impl RestartPolicy {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }
}
