//! The node's sandbox, made and removed by the harness's outer process: a network namespace with
//! the node's address on an interface that leads nowhere (nothing in it has a path off this machine), a cgroup
//! subtree in every cgroup hierarchy (the v1 ones and, on a hybrid host, the cgroup2 one, where runc
//! makes each container's cgroup too) that holds every process the node starts (containerd's
//! shims and the pods included), and the host directories the node writes through its own bind
//! mounts. The inner process runs in the network namespace and in a mount namespace of its own
//! (made at spawn, see [`Sandbox::command`]), so every mount the node makes dies with it.
//!
//! [`HostSnapshot`] records what the host looked like before, so the teardown can show that it
//! left no process, mount, network namespace, link, route, iptables rule, directory or cgroup
//! behind.

use std::{
    collections::BTreeSet,
    ffi::CString,
    os::unix::{ffi::OsStrExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{HOST_PATHS, NODE_IP, NODE_PREFIX, SERVICE_CIDR};

/// The sandbox of one run, named after the harness's process id.
#[derive(Debug)]
pub struct Sandbox {
    /// `smolvm-ce2e-<pid>`: the network namespace's name and the cgroup subtree's.
    pub id: String,
    /// Every cgroup hierarchy's mount point (`/sys/fs/cgroup/cpu`, …, and on a hybrid host
    /// `/sys/fs/cgroup/unified`).
    hierarchies: Vec<PathBuf>,
    /// Host directories the harness created as mount points (removed at teardown).
    created: Vec<PathBuf>,
    torn_down: bool,
}

impl Sandbox {
    /// Makes the network namespace, its interfaces and routes, the cgroup subtrees and the mount
    /// points. On error, whatever was made is removed again.
    pub fn create() -> anyhow::Result<Self> {
        let id = format!("smolvm-ce2e-{}", std::process::id());
        let hierarchies = cgroup_mounts()?;
        if !hierarchies.iter().any(|(_, v1)| *v1) {
            bail!(
                "no cgroup v1 hierarchy is mounted; the cluster tier's kubelet runs with the cgroupfs driver on cgroup v1"
            );
        }
        let mut sandbox = Self {
            id,
            hierarchies: hierarchies.into_iter().map(|(path, _)| path).collect(),
            created: Vec::new(),
            torn_down: false,
        };
        if let Err(e) = sandbox.make() {
            sandbox.teardown();
            return Err(e);
        }
        Ok(sandbox)
    }

    fn make(&mut self) -> anyhow::Result<()> {
        for path in HOST_PATHS {
            // Every directory made on the way, outermost first, so that teardown removes them all.
            let mut missing: Vec<&Path> = Path::new(path).ancestors().take_while(|p| !p.exists()).collect();
            missing.reverse();
            for dir in missing {
                std::fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
                self.created.push(dir.to_path_buf());
            }
        }
        let ns = self.id.clone();
        run("ip", &["netns", "add", &ns])?;
        let addr = format!("{NODE_IP}/{NODE_PREFIX}");
        for args in [
            vec!["link", "set", "lo", "up"],
            // The node's interface: one end of a veth pair whose other end, in the same namespace,
            // has no address. What is sent out of node0 finds no neighbour (nobody answers ARP)
            // and is dropped. The namespace has no link to the host at all.
            vec!["link", "add", "node0", "type", "veth", "peer", "name", "node0-sink"],
            vec!["addr", "add", addr.as_str(), "dev", "node0"],
            vec!["link", "set", "node0-sink", "up"],
            vec!["link", "set", "node0", "up"],
            // The kubelet and kube-proxy want a default route; it leads into that sink.
            vec!["route", "add", "default", "dev", "node0"],
            // Second guard: the Service range is sunk the same way. Not a `blackhole` route:
            // that fails a host-network client's connect() before kube-proxy's OUTPUT rules can
            // translate the ClusterIP, and the runtime agent is such a client.
            vec!["route", "add", SERVICE_CIDR, "dev", "node0"],
        ] {
            let mut full = vec!["-n", ns.as_str()];
            full.extend(args);
            run("ip", &full)?;
        }
        for hierarchy in &self.hierarchies {
            let dir = hierarchy.join(&self.id);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if hierarchy.ends_with("cpuset") {
                // A cpuset cgroup takes no task until it has CPUs and memory nodes.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = std::fs::read_to_string(hierarchy.join(file))?;
                    std::fs::write(dir.join(file), parent.trim())
                        .with_context(|| format!("writing {}", dir.join(file).display()))?;
                }
            }
        }
        Ok(())
    }

    /// The cgroup root the kubelet puts its pods under (`/smolvm-ce2e-<pid>`).
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.id)
    }

    /// A command that starts in the sandbox: in the network namespace, in a new mount namespace
    /// whose mounts never propagate back to the host, and in the cgroup subtree.
    pub fn command(&self, program: &Path) -> anyhow::Result<Command> {
        let netns = CString::new(format!("/run/netns/{}", self.id))?;
        let procs = self
            .hierarchies
            .iter()
            .map(|h| CString::new(h.join(&self.id).join("cgroup.procs").as_os_str().as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cmd = Command::new(program);
        // SAFETY: only async-signal-safe system calls run between fork and exec, on memory
        // prepared before the fork (the CStrings above).
        unsafe {
            cmd.pre_exec(move || {
                for path in &procs {
                    // Writing 0 to cgroup.procs moves the writer itself.
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                    if written != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                let fd = libc::open(netns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                if libc::unshare(libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Host mounts still show inside; nothing mounted inside shows on the host.
                let root = c"/";
                if libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // Whatever happens to the harness, the node goes with it.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(cmd)
    }

    /// Every process still in the sandbox's cgroups.
    pub fn processes(&self) -> BTreeSet<i32> {
        let mut pids = BTreeSet::new();
        for hierarchy in &self.hierarchies {
            collect_pids(&hierarchy.join(&self.id), &mut pids);
        }
        pids
    }

    /// Kills every process in the sandbox (SIGKILL, until none is left or `timeout` passed) and
    /// removes the cgroups, the network namespace and the mount points it created. Idempotent.
    pub fn teardown(&mut self) -> Vec<String> {
        if self.torn_down {
            return Vec::new();
        }
        self.torn_down = true;
        let mut problems = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pids = self.processes();
            if pids.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                problems.push(format!("processes that would not die: {pids:?}"));
                break;
            }
            for pid in pids {
                // SAFETY: kill(2) on a pid read from our own cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for hierarchy in &self.hierarchies {
            let root = hierarchy.join(&self.id);
            if root.exists()
                && let Err(e) = remove_cgroup_tree(&root)
            {
                problems.push(format!("cgroup {}: {e}", root.display()));
            }
        }
        if netns_exists(&self.id) {
            // The namespace outlives its last process only through its /run/netns bind mount.
            if let Err(e) = run("ip", &["netns", "delete", &self.id]) {
                problems.push(format!("network namespace {}: {e:#}", self.id));
            }
        }
        let mounts = mount_points();
        for path in self.created.drain(..).rev() {
            // `ip netns add` bind-mounts /run/netns on itself when it makes the directory.
            if mounts.contains(&*path.to_string_lossy())
                && let Ok(c) = CString::new(path.as_os_str().as_bytes())
            {
                // SAFETY: umount2(2) on a NUL-terminated path we own.
                unsafe {
                    libc::umount2(c.as_ptr(), libc::MNT_DETACH);
                }
            }
            if let Err(e) = std::fs::remove_dir(&path) {
                problems.push(format!("mount point {}: {e}", path.display()));
            }
        }
        problems
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for problem in self.teardown() {
            eprintln!("cluster sandbox teardown: {problem}");
        }
    }
}

/// What the host looked like: compared before and after a run, the differences are what the run
/// left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSnapshot {
    /// Mount points (`/proc/self/mountinfo`).
    pub mounts: BTreeSet<String>,
    /// Network namespaces (`ip netns list`).
    pub netns: BTreeSet<String>,
    /// Links, by name (`ip -o link`).
    pub links: BTreeSet<String>,
    /// Routes (`ip route`, IPv4 and IPv6).
    pub routes: BTreeSet<String>,
    /// iptables rules and chains (`iptables-save`, counters dropped).
    pub iptables: BTreeSet<String>,
    /// Whether each of [`HOST_PATHS`] exists.
    pub paths: BTreeSet<String>,
    /// The top-level cgroups of every hierarchy (`/sys/fs/cgroup/unified/smolvm-ce2e-1`, …).
    pub cgroups: BTreeSet<String>,
}

impl HostSnapshot {
    /// Reads the host as it is now (from the harness's own, the host's, namespaces).
    pub fn take() -> anyhow::Result<Self> {
        let mounts = mount_points();
        let netns = output("ip", &["netns", "list"])?
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect();
        let links = output("ip", &["-o", "link"])?
            .lines()
            .filter_map(|l| l.split(": ").nth(1).map(str::to_string))
            .collect();
        let routes = [
            output("ip", &["-4", "route"])?,
            output("ip", &["-6", "route"]).unwrap_or_default(),
        ]
        .iter()
        .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
        .collect();
        let iptables = match super::host_tool("iptables-save") {
            Some(bin) => output_of(&bin, &[])?
                .lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| match l.split_once(" [") {
                    // `:CHAIN POLICY [packets:bytes]`: the counters change on their own.
                    Some((head, _)) if l.starts_with(':') => head.to_string(),
                    _ => l.to_string(),
                })
                .collect(),
            None => BTreeSet::new(),
        };
        let paths = HOST_PATHS
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| (*p).to_string())
            .collect();
        let cgroups = cgroup_mounts()?
            .iter()
            .flat_map(|(hierarchy, _)| std::fs::read_dir(hierarchy).into_iter().flatten().flatten())
            .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
            .map(|entry| entry.path().display().to_string())
            .collect();
        Ok(Self {
            mounts,
            netns,
            links,
            routes,
            iptables,
            paths,
            cgroups,
        })
    }

    /// What `after` has that `self` had not, one line per thing, empty when nothing was left.
    pub fn left_behind(&self, after: &Self) -> Vec<String> {
        fn added(what: &str, before: &BTreeSet<String>, after: &BTreeSet<String>, out: &mut Vec<String>) {
            out.extend(after.difference(before).map(|x| format!("{what}: {x}")));
        }
        let mut out = Vec::new();
        added("mount", &self.mounts, &after.mounts, &mut out);
        added("network namespace", &self.netns, &after.netns, &mut out);
        added("link", &self.links, &after.links, &mut out);
        added("route", &self.routes, &after.routes, &mut out);
        added("iptables", &self.iptables, &after.iptables, &mut out);
        added("directory", &self.paths, &after.paths, &mut out);
        added("cgroup", &self.cgroups, &after.cgroups, &mut out);
        out
    }
}

/// The host's mount points (the harness's own mount namespace is the host's).
fn mount_points() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// The mount points of every cgroup hierarchy, from `/proc/self/mountinfo`, each with whether it
/// is a v1 hierarchy. On a hybrid host the cgroup2 one (`/sys/fs/cgroup/unified`) is among them:
/// runc makes each container's cgroup there too, so the sandbox's subtree must be there as well.
fn cgroup_mounts() -> anyhow::Result<Vec<(PathBuf, bool)>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_cgroup_mounts(&info))
}

fn parse_cgroup_mounts(mountinfo: &str) -> Vec<(PathBuf, bool)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            let mount_point = left.split(' ').nth(4)?;
            match fstype {
                "cgroup" => Some((PathBuf::from(mount_point), true)),
                "cgroup2" => Some((PathBuf::from(mount_point), false)),
                _ => None,
            }
        })
        .collect()
}

fn collect_pids(dir: &Path, pids: &mut BTreeSet<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_pids(&entry.path(), pids);
            }
        }
    }
}

/// Removes a cgroup directory and its children, deepest first (a cgroup's files go with it).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path())?;
            }
        }
    }
    // A cgroup whose last task just died can be busy for a moment.
    let mut tries = 0;
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if tries < 50 && e.raw_os_error() == Some(libc::EBUSY) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    output(program, args).map(drop)
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let bin = super::host_tool(program).with_context(|| format!("{program} is not installed"))?;
    output_of(&bin, args)
}

fn output_of(bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} failed: {}",
            bin.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> HostSnapshot {
        HostSnapshot {
            mounts: ["/".to_string()].into(),
            netns: BTreeSet::new(),
            links: ["lo".to_string()].into(),
            routes: BTreeSet::new(),
            iptables: [":INPUT ACCEPT".to_string()].into(),
            paths: BTreeSet::new(),
            cgroups: ["/sys/fs/cgroup/cpu/user.slice".to_string()].into(),
        }
    }

    #[test]
    fn an_unchanged_host_shows_nothing_left_behind() {
        assert!(snap().left_behind(&snap()).is_empty());
    }

    #[test]
    fn each_kind_of_leftover_is_named() {
        let mut after = snap();
        after.mounts.insert("/var/lib/cni".into());
        after.netns.insert("smolvm-ce2e-1".into());
        after.links.insert("cni0".into());
        after.iptables.insert("-A KUBE-SERVICES -j DROP".into());
        after.cgroups.insert("/sys/fs/cgroup/unified/smolvm-ce2e-1".into());
        let left = snap().left_behind(&after);
        assert_eq!(
            left,
            [
                "mount: /var/lib/cni",
                "network namespace: smolvm-ce2e-1",
                "link: cni0",
                "iptables: -A KUBE-SERVICES -j DROP",
                "cgroup: /sys/fs/cgroup/unified/smolvm-ce2e-1"
            ]
        );
    }

    #[test]
    fn a_hybrid_host_s_cgroup2_mount_is_a_hierarchy_too() {
        // Two lines of a hybrid host's /proc/self/mountinfo, and one that is no cgroup.
        let info = "\
35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:11 - cgroup cgroup rw,cpu,cpuacct
24 1 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
";
        assert_eq!(
            parse_cgroup_mounts(info),
            [
                (PathBuf::from("/sys/fs/cgroup/unified"), false),
                (PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"), true)
            ]
        );
    }
}
