//! The real-cluster tier (`make cluster-e2e`): a single Kubernetes node on this machine, with
//! `deploy/default` installed by `make deploy` and running as real pods.
//!
//! Two processes. The outer one (the test binary as cargo starts it) checks what the tier needs,
//! builds the images ([`images`]), makes the [`sandbox`] and starts itself again inside it; that
//! inner process starts the node ([`node`]): etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd, the kubelet and kube-proxy, then deploys the operator and runs the
//! scenarios. When the inner process ends, or on Ctrl-C, the outer one kills what is left in the
//! sandbox's cgroups, removes the sandbox, and compares the host with how it found it.
//!
//! Nothing the node starts can send traffic off this machine: its network namespace has no link
//! to the host, only an interface whose far end answers nobody.

pub mod images;
pub mod node;
pub mod sandbox;

use std::path::PathBuf;

/// The node's address, on its interface inside the sandbox's network namespace.
pub const NODE_IP: &str = "10.240.0.10";
/// The prefix length of [`NODE_IP`]'s network.
pub const NODE_PREFIX: u8 = 24;
/// The pods' network (a CNI bridge with host-local addresses).
pub const POD_CIDR: &str = "10.241.0.0/24";
/// The Services' network.
pub const SERVICE_CIDR: &str = "10.242.0.0/24";
/// The node's name, as a cloud names its nodes (its `kubernetes.io/hostname` label must fit 63
/// characters, so the kubelet cannot take the e2e tier's 69-character name).
pub const NODE_NAME: &str = "ip-10-240-0-10.ap-southeast-2.compute.internal";
/// The operator image the harness builds and imports.
pub const OPERATOR_IMAGE: &str = "localhost/smolvm-operator:cluster-e2e";
/// The runtime image the harness builds and imports.
pub const RUNTIME_IMAGE: &str = "localhost/smolvm-runtime:cluster-e2e";
/// The pods' sandbox (pause) image.
pub const PAUSE_IMAGE: &str = "localhost/smolvm-cluster-e2e/pause:1";
/// A small image with a shell and network clients, for pods that probe the network.
pub const PROBE_IMAGE: &str = "localhost/smolvm-cluster-e2e/probe:1";

/// The kubelet's `--root-dir`: the default, which `deploy/base/runtime/daemonset.yaml` mounts
/// (`/var/lib/kubelet/pods`) and passes to the agent (`--kubelet-root-dir`).
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// Host paths the node writes to that no flag moves: inside the sandbox each is a bind mount of a
/// directory under the run's work directory, so nothing lands on the host. The runtime's
/// hostPath volumes (`/var/lib/smolvm`, `/var/run/smolvm`) are among them.
pub const HOST_PATHS: &[&str] = &[
    "/var/lib/cni",
    "/var/lib/smolvm",
    "/run/smolvm",
    "/var/log/pods",
    "/var/log/containers",
    // containerd pins each pod's network namespace here; `ip netns add` mounts it on the host.
    "/run/netns",
    // The kubelet's root directory (its device manager listens in device-plugins/ whatever the
    // flag says), at the path deploy/ mounts into the runtime for holder Pods' volumes; a shared
    // mount inside the sandbox, so that the kubelet's volume mounts propagate into the runtime
    // container (HostToContainer).
    KUBELET_ROOT,
    // containerd's shims listen here whatever its state directory is.
    "/run/containerd/s",
];

/// The Debian packages the tier needs, as `tests/scripts/cluster-deps.sh` installs them, with the
/// program that shows each is there.
pub const DEBIAN_TOOLS: &[(&str, &str)] = &[
    ("containerd", "containerd"),
    ("ctr", "containerd"),
    ("runc", "runc"),
    ("buildah", "buildah"),
    ("catatonit", "catatonit"),
    ("iptables", "iptables"),
    ("ip", "iproute2"),
    ("etcd", "etcd-server"),
    ("prometheus", "prometheus"),
];

/// Where Debian's containernetworking-plugins put the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// Finds a host program on `PATH` or in the system directories.
pub fn host_tool(name: &str) -> Option<PathBuf> {
    crate::assets::on_path(name)
}

/// What keeps the tier from running here, as the line to print (`skipped: …`), or `None`.
pub fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("skipped: the cluster tier runs a kubelet and containerd and must run as root".to_string());
    }
    let missing: Vec<&str> = DEBIAN_TOOLS
        .iter()
        .filter(|(tool, _)| host_tool(tool).is_none())
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        return Some(format!(
            "skipped: missing Debian packages {} (bash tests/scripts/cluster-deps.sh installs them)",
            missing.join(", ")
        ));
    }
    for plugin in ["bridge", "host-local", "portmap", "loopback"] {
        if !std::path::Path::new(CNI_BIN_DIR).join(plugin).exists() {
            return Some(format!(
                "skipped: no CNI plugin {plugin} in {CNI_BIN_DIR} (bash tests/scripts/cluster-deps.sh installs containernetworking-plugins)"
            ));
        }
    }
    if !std::path::Path::new("/dev/kvm").exists() {
        return Some("skipped: no /dev/kvm (the runtime DaemonSet mounts it)".to_string());
    }
    None
}
