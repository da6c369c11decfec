//! The JSON bodies of smolvm's calls besides a machine's own record ([`super::machine`]): the
//! requests as smolvm takes them and the answer fields the agent reads, with the encoding and
//! decoding every call uses.

use serde::{Deserialize, Serialize};
use smolvm_api::Protocol;

use crate::vmm::{MachineSpec, PortMapping, RegistryAuth, Sensitive, VmmError};

pub(super) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, VmmError> {
    serde_json::from_slice(bytes).map_err(|error| {
        VmmError::Protocol(format!(
            "cannot read the {what} smolvm sent ({error}): {}",
            snippet(bytes)
        ))
    })
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// An environment as smolvm's fork and lease requests take it: `KEY=VALUE` strings.
pub(super) fn env_assignments(env: &[(String, Sensitive)]) -> Vec<String> {
    env.iter().map(|(name, value)| format!("{name}={}", value.0)).collect()
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, VmmError> {
    serde_json::to_vec(value).map_err(|error| VmmError::Protocol(format!("cannot encode request: {error}")))
}

#[derive(Debug, Deserialize)]
pub(super) struct HealthWire {
    pub(super) status: String,
    pub(super) version: String,
    #[serde(default)]
    pub(super) nested_virt: bool,
    #[serde(default)]
    pub(super) machines: Option<CountsWire>,
    #[serde(default)]
    pub(super) uptime_seconds: Option<u64>,
}

/// smolvm's `/capacity`, the fields the agent reads (`CapacityResponse` in its OpenAPI document).
#[derive(Debug, Deserialize)]
pub(super) struct CapacityWire {
    #[serde(default)]
    pub(super) boot_id: Option<String>,
    #[serde(default)]
    pub(super) cuda_devices: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct CountsWire {
    pub(super) total: u64,
    pub(super) running: u64,
}

#[derive(Debug, Deserialize)]
pub(super) struct ListWire {
    pub(super) machines: Vec<serde_json::Value>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CreateWire<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    cpus: u32,
    memory_mb: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    storage_gb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlay_gb: Option<u64>,
    network: bool,
    ports: Vec<PortWireOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_cidrs: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_hosts: Option<&'a [String]>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    entrypoint: &'a [String],
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cmd: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<EnvWire<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart: Option<RestartWire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<MountWire<'a>>,
}

/// A host mount as smolvm's create takes it (`MountSpec`).
#[derive(Debug, Serialize)]
struct MountWire<'a> {
    source: &'a std::path::Path,
    target: &'a str,
    readonly: bool,
}

/// smolvm's create request for `spec`, with its image resolved.
pub(super) fn create_wire(spec: &MachineSpec, image: Option<String>) -> CreateWire<'_> {
    CreateWire {
        name: &spec.name,
        image,
        cpus: spec.cpus,
        memory_mb: spec.memory_mib,
        storage_gb: spec.storage_gib,
        overlay_gb: spec.overlay_gib,
        network: spec.network,
        ports: spec.ports.iter().map(PortWireOut::from).collect(),
        allowed_cidrs: spec.allowed_cidrs.as_deref(),
        allowed_hosts: spec.allowed_hosts.as_deref(),
        entrypoint: &spec.workload.entrypoint,
        cmd: &spec.workload.cmd,
        workdir: spec.workload.workdir.as_deref(),
        env: spec
            .workload
            .env
            .iter()
            .map(|(name, value)| EnvWire { name, value })
            .collect(),
        restart: spec.workload.restart.map(|policy| RestartWire { policy }),
        stop_timeout_secs: spec.workload.stop_timeout_secs,
        mounts: spec
            .mounts
            .iter()
            .map(|mount| MountWire {
                source: &mount.source,
                target: &mount.target,
                readonly: mount.read_only,
            })
            .collect(),
    }
}

/// An environment variable as smolvm takes it (`Debug` hides the value).
#[derive(Debug, Serialize)]
pub(super) struct EnvWire<'a> {
    pub(super) name: &'a str,
    pub(super) value: &'a Sensitive,
}

#[derive(Debug, Serialize)]
struct RestartWire {
    policy: &'static str,
}

/// The optional body of smolvm's start (`Debug` hides the credentials).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StartWire<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) registry_auth: Option<&'a RegistryAuth>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) branchable: bool,
}

/// smolvm's `PortSpec`.
#[derive(Debug, Serialize)]
pub(super) struct PortWireOut {
    host: u16,
    guest: u16,
    protocol: &'static str,
}

impl From<&PortMapping> for PortWireOut {
    fn from(port: &PortMapping) -> Self {
        PortWireOut {
            host: port.host_port,
            guest: port.guest_port,
            protocol: smolvm_protocol(port.protocol),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ResizeWire {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cpus: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) memory_mb: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) storage_gb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) overlay_gb: Option<u64>,
}

/// smolvm's exec request (`deny_unknown_fields` on its side).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecWire<'a> {
    pub(super) command: &'a [String],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) env: Vec<EnvWire<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) workdir: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stdin: Option<&'a str>,
    pub(super) timeout_secs: u32,
    pub(super) auto_start: bool,
}

/// smolvm's exec answer: the byte-exact base64 fields are read, the lossy text ones are not.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ExecAnswerWire {
    pub(super) exit_code: i32,
    #[serde(rename = "stdoutB64")]
    pub(super) stdout_b64: String,
    #[serde(rename = "stderrB64")]
    pub(super) stderr_b64: String,
}

/// smolvm's spelling of a port protocol (lower case; the node API and the CRD write `TCP`).
fn smolvm_protocol(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_body_matches_smolvm_fields() {
        let spec = MachineSpec {
            name: "m".into(),
            image: None,
            cpus: 1,
            memory_mib: 256,
            storage_gib: Some(20),
            overlay_gib: None,
            network: false,
            ports: vec![crate::vmm::PortMapping {
                host_port: 8080,
                guest_port: 80,
                protocol: crate::vmm::Protocol::Tcp,
            }],
            allowed_cidrs: None,
            allowed_hosts: None,
            workload: Default::default(),
            mounts: Vec::new(),
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"name":"m","cpus":1,"memoryMb":256,"storageGb":20,"network":false,
                "ports":[{"host":8080,"guest":80,"protocol":"tcp"}]})
        );
        let spec = MachineSpec {
            network: true,
            allowed_hosts: Some(vec!["api.example.com".into()]),
            workload: crate::vmm::Workload {
                entrypoint: vec!["/bin/app".into()],
                cmd: vec!["--port".into(), "80".into()],
                workdir: Some("/srv".into()),
                env: vec![("TOKEN".into(), Sensitive("s3cret".into()))],
                restart: Some("on-failure"),
                stop_timeout_secs: Some(10),
            },
            ..spec
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(json["entrypoint"], serde_json::json!(["/bin/app"]));
        assert_eq!(json["cmd"], serde_json::json!(["--port", "80"]));
        assert_eq!(json["workdir"], "/srv");
        assert_eq!(json["env"], serde_json::json!([{"name": "TOKEN", "value": "s3cret"}]));
        assert_eq!(json["restart"], serde_json::json!({"policy": "on-failure"}));
        assert_eq!(json["stopTimeoutSecs"], 10);
        assert_eq!(json["allowedHosts"], serde_json::json!(["api.example.com"]));
        assert!(json.get("mounts").is_none(), "no mounts, no field");
        let spec = MachineSpec {
            mounts: vec![crate::vmm::HostMount {
                source: "/var/lib/smolvm/volumes/svm-a/data".into(),
                target: "/data".into(),
                read_only: true,
            }],
            ..spec
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&create_wire(&spec, None)).expect("encodes")).expect("json");
        assert_eq!(
            json["mounts"],
            serde_json::json!([{"source": "/var/lib/smolvm/volumes/svm-a/data", "target": "/data", "readonly": true}])
        );
        // The request's Debug form (what a log line could show) hides the value.
        assert!(!format!("{:?}", create_wire(&spec, None)).contains("s3cret"));
    }
}
