//! Another host on this machine: a network namespace joined to this one by a veth pair, each end
//! with an address of a /30 of its own. A test's node gets a non-loopback address (the host end)
//! and its clients can come from another host (the namespace), as across a network. Needs root
//! and iproute2 ([`why_not`] says which is missing).

use std::process::Command;

/// A network namespace with a veth pair to this one; removed on drop, whatever happened.
pub struct OtherHost {
    /// The namespace's name (`ip netns exec NAME …` runs in it).
    pub ns: String,
    host_if: String,
}

impl OtherHost {
    /// Makes namespace `svm-<kind>-<tag>` with `peer_ip`, and its veth's host end here with
    /// `host_ip` (both /30).
    pub fn create(kind: &str, tag: &str, host_ip: &str, peer_ip: &str) -> Result<Self, String> {
        let ns = format!("svm-{kind}-{tag}");
        let host_if = format!("svmh{tag}");
        let peer_if = format!("svmp{tag}");
        let this = Self {
            ns: ns.clone(),
            host_if: host_if.clone(),
        };
        let steps: [&[&str]; 8] = [
            &["netns", "add", &ns],
            &["link", "add", &host_if, "type", "veth", "peer", "name", &peer_if],
            &["link", "set", &peer_if, "netns", &ns],
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
            &["link", "set", &host_if, "up"],
            &["-n", &ns, "addr", "add", &format!("{peer_ip}/30"), "dev", &peer_if],
            &["-n", &ns, "link", "set", &peer_if, "up"],
            &["-n", &ns, "link", "set", "lo", "up"],
        ];
        for args in steps {
            let out = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(this)
    }
}

impl Drop for OtherHost {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Why another host cannot be made here: not root, or no `ip`; `None` when it can.
pub fn why_not() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root (network namespaces need it)".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2)".into());
    }
    None
}
