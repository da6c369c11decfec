//! The admission policy: resource bounds, the host port range and its excluded ports, and the
//! identities of the operator's own components.
//!
//! It comes from a YAML file mounted from a ConfigMap; every field is optional and falls back to
//! the built-in default. A bad file gets an error naming the field.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Default namespace of the operator's components.
pub const DEFAULT_NAMESPACE: &str = "smolvm-system";

/// Bounds and identities the webhook enforces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Policy {
    /// Fewest virtual CPUs a SmolVM may ask for.
    pub min_cpus: i64,
    /// Most virtual CPUs a SmolVM may ask for.
    pub max_cpus: i64,
    /// Least memory (MiB).
    #[serde(rename = "minMemoryMiB")]
    pub min_memory_mib: i64,
    /// Most memory (MiB).
    #[serde(rename = "maxMemoryMiB")]
    pub max_memory_mib: i64,
    /// Smallest storage disk (GiB).
    #[serde(rename = "minStorageGiB")]
    pub min_storage_gib: i64,
    /// Largest storage disk (GiB).
    #[serde(rename = "maxStorageGiB")]
    pub max_storage_gib: i64,
    /// Smallest overlay (GiB).
    #[serde(rename = "minOverlayGiB")]
    pub min_overlay_gib: i64,
    /// Largest overlay (GiB).
    #[serde(rename = "maxOverlayGiB")]
    pub max_overlay_gib: i64,
    /// Lowest host port a SmolVM may forward.
    pub host_port_min: i64,
    /// Highest host port a SmolVM may forward.
    pub host_port_max: i64,
    /// Host ports no SmolVM may publish, inside the range or not: the node's own services (the
    /// kubelet, kube-proxy, the NodePort range) and the runtime agent's listeners. Each entry is
    /// a port (`10250`) or an inclusive range (`"30000-32767"`). A file that sets the list
    /// replaces the default list whole. The webhook (V3) and every node's agent enforce it.
    pub excluded_host_ports: Vec<PortRange>,
    /// Most forwarded ports per SmolVM.
    pub max_ports: i64,
    /// Most allowedCIDRs entries per SmolVM.
    #[serde(rename = "maxAllowedCIDRs")]
    pub max_allowed_cidrs: i64,
    /// Most `env` entries per SmolVM.
    pub max_env: i64,
    /// Most entries in `command`, and in `args`, per SmolVM.
    pub max_args: i64,
    /// Most `network.allowedHosts` entries per SmolVM.
    pub max_allowed_hosts: i64,
    /// Most bytes in one env value, one `command` or `args` entry, or `workingDir`.
    pub max_value_bytes: i64,
    /// Most ready slots a SmolVMPool may keep on each node (`spec.slotsPerNode`, V14).
    pub max_slots_per_node: i64,
    /// Most `spec.volumes` entries per SmolVM (V16).
    pub max_volumes: i64,
    /// Longest `spec.lifecycle.suspendAfterIdle` a SmolVM may ask for, in seconds (V18; at least
    /// 30 s is the floor, whatever this says).
    pub max_suspend_after_idle_seconds: i64,
    /// Usernames of the controller (the only identity that may write binding fields).
    pub controller_usernames: Vec<String>,
    /// Usernames of the runtime agents (restricted to their own node's SmolVMNode).
    pub runtime_usernames: Vec<String>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_cpus: 1,
            max_cpus: 32,
            min_memory_mib: 128,
            max_memory_mib: 131_072,
            min_storage_gib: 1,
            max_storage_gib: 2048,
            min_overlay_gib: 1,
            max_overlay_gib: 1024,
            host_port_min: 1024,
            host_port_max: 65_535,
            excluded_host_ports: DEFAULT_EXCLUDED_HOST_PORTS.to_vec(),
            max_ports: 16,
            max_allowed_cidrs: 32,
            max_env: 64,
            max_args: 64,
            max_allowed_hosts: 32,
            max_value_bytes: 16_384,
            max_slots_per_node: 64,
            max_volumes: 8,
            max_suspend_after_idle_seconds: 7 * 24 * 3600,
            controller_usernames: vec![service_account(DEFAULT_NAMESPACE, "smolvm-controller")],
            runtime_usernames: vec![service_account(DEFAULT_NAMESPACE, "smolvm-runtime")],
        }
    }
}

/// Port of the runtime agent's node API (its `--port` default).
pub const AGENT_NODE_API_PORT: u16 = 10443;
/// Port of the runtime agent's ops listener (its `--ops-address` default).
pub const AGENT_OPS_PORT: u16 = 9090;
/// smolvm's guest rollout port on the node's loopback (the agent's `--guest-rollout-port` default).
pub const SMOLVM_GUEST_ROLLOUT_PORT: u16 = 10081;

/// The default excluded host ports: kube-proxy's metrics (10249) and health (10256) ports, the
/// kubelet's API (10250), the NodePort range, and the runtime agent's own ports (its release
/// hook's on the node's loopback among them).
pub const DEFAULT_EXCLUDED_HOST_PORTS: [PortRange; 8] = [
    PortRange::one(10249),
    PortRange::one(10250),
    PortRange::one(10256),
    PortRange {
        first: 30000,
        last: 32767,
    },
    PortRange::one(AGENT_OPS_PORT),
    PortRange::one(SMOLVM_GUEST_ROLLOUT_PORT),
    PortRange::one(AGENT_NODE_API_PORT),
    PortRange::one(crate::constants::volumes::DEFAULT_RELEASE_PORT),
];

/// Most entries in `excludedHostPorts`.
pub const MAX_EXCLUDED_HOST_PORTS: usize = 256;

/// A host port, or an inclusive range of host ports. Written as a number (`10250`) or as a
/// string (`"30000-32767"`, or `"10250"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    /// The first port of the range.
    pub first: u16,
    /// The last port of the range (equal to `first` for one port).
    pub last: u16,
}

impl PortRange {
    /// One port.
    pub const fn one(port: u16) -> Self {
        PortRange {
            first: port,
            last: port,
        }
    }

    /// Whether `port` lies in the range.
    pub fn contains(&self, port: i64) -> bool {
        (i64::from(self.first)..=i64::from(self.last)).contains(&port)
    }

    /// Reads `"10250"` or `"30000-32767"`: ports 1 to 65535, the first not above the last.
    pub fn parse(text: &str) -> Result<PortRange, String> {
        let port = |t: &str| -> Result<u16, String> {
            t.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p >= 1)
                .ok_or_else(|| format!("{:?} is not a port number (1-65535)", t.trim()))
        };
        let range = match text.split_once('-') {
            Some((first, last)) => PortRange {
                first: port(first)?,
                last: port(last)?,
            },
            None => PortRange::one(port(text)?),
        };
        if range.first > range.last {
            return Err(format!(
                "{text:?} is not a range: {} is above {}",
                range.first, range.last
            ));
        }
        Ok(range)
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl Serialize for PortRange {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.first == self.last {
            serializer.serialize_u16(self.first)
        } else {
            serializer.collect_str(self)
        }
    }
}

impl<'de> Deserialize<'de> for PortRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = PortRange;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a port (1-65535) or a range such as \"30000-32767\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<PortRange, E> {
                u16::try_from(v)
                    .ok()
                    .filter(|p| *p >= 1)
                    .map(PortRange::one)
                    .ok_or_else(|| E::custom(format!("{v} is not a port number (1-65535)")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PortRange, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("{v} is not a port number (1-65535)"))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PortRange, E> {
                PortRange::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// The username of a ServiceAccount, as the API server reports it.
pub fn service_account(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// What an identity is to the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller.
    Controller,
    /// A runtime agent.
    Runtime,
    /// Anyone else: users, admins, other controllers.
    Other,
}

impl Policy {
    /// Parses a policy from YAML text. Absent fields keep their defaults; unknown fields, wrong
    /// types and inconsistent bounds are errors that name the field.
    pub fn from_yaml(text: &str) -> Result<Policy, Error> {
        if text.trim().is_empty() {
            return Ok(Policy::default());
        }
        let de = serde_norway::Deserializer::from_str(text);
        let policy: Policy = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let message = match inner.location() {
                Some(loc) => format!("{inner} (line {}, column {})", loc.line(), loc.column()),
                None => inner.to_string(),
            };
            Error::PolicyInvalid { field, message }
        })?;
        policy.check()?;
        Ok(policy)
    }

    /// Reads and parses a policy file.
    pub fn from_file(path: &std::path::Path) -> Result<Policy, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::PolicyRead {
            path: path.display().to_string(),
            source,
        })?;
        Policy::from_yaml(&text)
    }

    /// Checks that the bounds are consistent.
    pub fn check(&self) -> Result<(), Error> {
        let pairs: [(&str, i64, &str, i64, i64); 5] = [
            ("minCpus", self.min_cpus, "maxCpus", self.max_cpus, 1),
            (
                "minMemoryMiB",
                self.min_memory_mib,
                "maxMemoryMiB",
                self.max_memory_mib,
                1,
            ),
            (
                "minStorageGiB",
                self.min_storage_gib,
                "maxStorageGiB",
                self.max_storage_gib,
                1,
            ),
            (
                "minOverlayGiB",
                self.min_overlay_gib,
                "maxOverlayGiB",
                self.max_overlay_gib,
                1,
            ),
            ("hostPortMin", self.host_port_min, "hostPortMax", self.host_port_max, 1),
        ];
        for (min_name, min, max_name, max, floor) in pairs {
            if min < floor {
                return Err(invalid(min_name, format!("{min} is below {floor}")));
            }
            if max < min {
                return Err(invalid(max_name, format!("{max} is below {min_name} {min}")));
            }
        }
        if self.host_port_max > 65_535 {
            return Err(invalid("hostPortMax", format!("{} is above 65535", self.host_port_max)));
        }
        self.check_maxima()?;
        if self.excluded_host_ports.len() > MAX_EXCLUDED_HOST_PORTS {
            return Err(invalid(
                "excludedHostPorts",
                format!(
                    "{} entries exceed the maximum {MAX_EXCLUDED_HOST_PORTS}",
                    self.excluded_host_ports.len()
                ),
            ));
        }
        for (i, range) in self.excluded_host_ports.iter().enumerate() {
            if range.first < 1 || range.first > range.last {
                return Err(invalid(
                    &format!("excludedHostPorts[{i}]"),
                    format!("{}-{} is not a port range", range.first, range.last),
                ));
            }
        }
        for (name, list) in [
            ("controllerUsernames", &self.controller_usernames),
            ("runtimeUsernames", &self.runtime_usernames),
        ] {
            if let Some(i) = list.iter().position(|u| u.trim().is_empty()) {
                return Err(invalid(&format!("{name}[{i}]"), "is empty".into()));
            }
        }
        Ok(())
    }

    /// The policy's maxima lie within the schema's own limits.
    fn check_maxima(&self) -> Result<(), Error> {
        for (name, value) in [
            ("maxPorts", self.max_ports),
            ("maxAllowedCIDRs", self.max_allowed_cidrs),
        ] {
            if !(0..=64).contains(&value) {
                return Err(invalid(name, format!("{value} is outside 0..=64 (the schema's limit)")));
            }
        }
        for (name, value, low, high) in [
            ("maxEnv", self.max_env, 0, crate::types::MAX_ENV),
            ("maxArgs", self.max_args, 0, crate::types::MAX_ARGS),
            (
                "maxAllowedHosts",
                self.max_allowed_hosts,
                0,
                crate::types::MAX_ALLOWED_HOSTS,
            ),
            ("maxValueBytes", self.max_value_bytes, 1, crate::types::MAX_VALUE_BYTES),
            (
                "maxSlotsPerNode",
                self.max_slots_per_node,
                0,
                crate::pool::MAX_SLOTS_PER_NODE,
            ),
            (
                "maxVolumes",
                self.max_volumes,
                0,
                crate::volume::MAX_VOLUMES_SCHEMA as i64,
            ),
        ] {
            if !(low..=high).contains(&value) {
                return Err(invalid(
                    name,
                    format!("{value} is outside {low}..={high} (the schema's limit)"),
                ));
            }
        }
        Ok(())
    }

    /// The excluded range that holds host port `port`, if any (V3; the agent checks the same).
    pub fn excluded_host_port(&self, port: i64) -> Option<PortRange> {
        self.excluded_host_ports.iter().copied().find(|r| r.contains(port))
    }

    /// The role of a username under this policy.
    pub fn role_of(&self, username: &str) -> Role {
        if self.controller_usernames.iter().any(|u| u == username) {
            Role::Controller
        } else if self.runtime_usernames.iter().any(|u| u == username) {
            Role::Runtime
        } else {
            Role::Other
        }
    }
}

fn invalid(field: &str, message: String) -> Error {
    Error::PolicyInvalid {
        field: field.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_defaults_and_partial_files() {
        assert_eq!(Policy::from_yaml("").unwrap(), Policy::default());
        let p = Policy::from_yaml("maxCpus: 8\nhostPortMin: 30000\n").unwrap();
        assert_eq!(p.max_cpus, 8);
        assert_eq!(p.host_port_min, 30000);
        assert_eq!(p.max_memory_mib, Policy::default().max_memory_mib);
    }

    #[test]
    fn policy_errors_name_the_field() {
        let cases = [
            ("maxCpus: lots\n", "maxCpus"),
            ("maxCPUs: 4\n", "maxCPUs"),
            ("minCpus: 0\n", "minCpus"),
            ("minCpus: 8\nmaxCpus: 4\n", "maxCpus"),
            ("hostPortMax: 70000\n", "hostPortMax"),
            ("maxPorts: 100\n", "maxPorts"),
            ("controllerUsernames: ['']\n", "controllerUsernames[0]"),
            ("runtimeUsernames: 3\n", "runtimeUsernames"),
            ("excludedHostPorts: [0]\n", "excludedHostPorts[0]"),
            ("excludedHostPorts: [10250, 70000]\n", "excludedHostPorts[1]"),
            ("excludedHostPorts: ['32767-30000']\n", "excludedHostPorts[0]"),
            ("excludedHostPorts: ['a-b']\n", "excludedHostPorts[0]"),
            ("excludedHostPorts: [-1]\n", "excludedHostPorts[0]"),
            ("excludedHostPorts: 10250\n", "excludedHostPorts"),
            ("- a\n", "."),
        ];
        for (text, field) in cases {
            match Policy::from_yaml(text) {
                Err(Error::PolicyInvalid { field: f, message }) => {
                    assert_eq!(f, field, "{text:?}: {message}");
                    assert!(!message.is_empty());
                }
                other => panic!("{text:?}: expected PolicyInvalid, got {other:?}"),
            }
        }
        let unknown = Policy::from_yaml("maxCPUs: 4\n").unwrap_err().to_string();
        assert!(unknown.contains("maxCPUs"), "{unknown}");
    }

    #[test]
    fn excluded_host_ports() {
        let p = Policy::default();
        for (port, rule) in [
            (10249, Some("10249")),
            (10250, Some("10250")),
            (10256, Some("10256")),
            (30000, Some("30000-32767")),
            (31234, Some("30000-32767")),
            (32767, Some("30000-32767")),
            (AGENT_NODE_API_PORT.into(), Some("10443")),
            (AGENT_OPS_PORT.into(), Some("9090")),
            (SMOLVM_GUEST_ROLLOUT_PORT.into(), Some("10081")),
            (crate::constants::volumes::DEFAULT_RELEASE_PORT.into(), Some("10262")),
            (8080, None),
            (29999, None),
            (32768, None),
            (10251, None),
        ] {
            assert_eq!(
                p.excluded_host_port(port).map(|r| r.to_string()).as_deref(),
                rule,
                "{port}"
            );
        }
        // A file's list replaces the default; ports are numbers or strings, ranges strings.
        let p = Policy::from_yaml("excludedHostPorts: [22, '8000-8099', '443']\n").unwrap();
        assert_eq!(
            p.excluded_host_ports,
            vec![
                PortRange::one(22),
                PortRange {
                    first: 8000,
                    last: 8099
                },
                PortRange::one(443)
            ]
        );
        assert_eq!(p.excluded_host_port(10250), None);
        assert_eq!(
            p.excluded_host_port(8050),
            Some(PortRange {
                first: 8000,
                last: 8099
            })
        );
        let p = Policy::from_yaml("excludedHostPorts: []\n").unwrap();
        assert!(p.excluded_host_ports.is_empty());
        // Written back as it is read.
        let text = serde_norway::to_string(&Policy::default()).unwrap();
        assert_eq!(Policy::from_yaml(&text).unwrap(), Policy::default());
        assert!(text.contains("30000-32767"), "{text}");
    }

    #[test]
    fn policy_roles() {
        let p = Policy::default();
        assert_eq!(
            p.role_of("system:serviceaccount:smolvm-system:smolvm-controller"),
            Role::Controller
        );
        assert_eq!(
            p.role_of("system:serviceaccount:smolvm-system:smolvm-runtime"),
            Role::Runtime
        );
        assert_eq!(p.role_of("kubernetes-admin"), Role::Other);
    }
}
