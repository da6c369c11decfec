//! The network of a SmolVM (rule V3): whether it has one, its forwarded ports and their
//! protocol, the CIDRs and host names it may reach, and its Service.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Most ports a schema admits (the policy usually allows fewer).
pub const MAX_PORTS_SCHEMA: usize = 64;
/// Most allowed CIDRs a schema admits (the policy usually allows fewer).
pub const MAX_CIDRS_SCHEMA: usize = 64;

/// Networking of a machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.ports) || size(self.ports) == 0 || (has(self.enabled) && self.enabled)").message("ports need network.enabled: true (V3)").field_path(".ports"))]
#[x_kube(validation = Rule::new("!has(self.allowedCIDRs) || size(self.allowedCIDRs) == 0 || (has(self.enabled) && self.enabled)").message("allowedCIDRs need network.enabled: true (V3)").field_path(".allowedCIDRs"))]
#[x_kube(validation = Rule::new("!has(self.allowedHosts) || size(self.allowedHosts) == 0 || (has(self.enabled) && self.enabled)").message("allowedHosts need network.enabled: true (V11)").field_path(".allowedHosts"))]
pub struct Network {
    /// Whether the machine has a network interface. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Host ports forwarded into the machine. Each (hostPort, protocol) pair is unique, and the host port must lie in the policy's allowed range (by default 1024 to 65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["hostPort".into(), "protocol".into()]))]
    pub ports: Option<Vec<Port>>,

    /// Destination CIDRs the machine may reach (for example `10.0.0.0/8` or `2001:db8::/32`). Empty means no restriction beyond smolvm's defaults.
    #[serde(default, rename = "allowedCIDRs", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every allowedCIDRs entry must be a CIDR such as 10.0.0.0/8 (V3)"))]
    pub allowed_cidrs: Option<Vec<CidrString>>,

    /// Host names the machine may reach, with their subdomains (smolvm `allowedHosts`): DNS names such as `api.example.com`, or `*.example.com`. Needs `enabled`. Immutable once bound; the policy bounds the number (by default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 253),
            regex(pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub allowed_hosts: Option<Vec<String>>,

    /// Whether the controller keeps a Service named like the SmolVM in its namespace (ClusterIP, one port per published port, named `<protocol>-<guestPort>`, targetPort = hostPort), whose EndpointSlice points at the node's InternalIP while the machine runs. A Service of that name the SmolVM does not own is never touched. Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose_service: Option<bool>,
}

/// A CIDR in string form (at most 64 characters).
pub type CidrString = String;

/// One forwarded port.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port on the node's host network, 1 to 65535 and inside the policy's allowed range.
    #[schemars(range(min = 1, max = 65535))]
    pub host_port: i32,

    /// Port inside the machine, 1 to 65535.
    #[schemars(range(min = 1, max = 65535))]
    pub guest_port: i32,

    /// Transport protocol: TCP (the default) or UDP.
    #[serde(default = "default_protocol")]
    #[schemars(extend("maxLength" = 3))]
    pub protocol: Protocol,
}

fn default_protocol() -> Protocol {
    Protocol::Tcp
}

/// Transport protocol of a forwarded port.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default,
)]
pub enum Protocol {
    /// TCP.
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
