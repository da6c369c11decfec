//! The canary boot: the proof that a guest boots on this node.
//!
//! `/dev/kvm` opening and answering KVM_GET_API_VERSION (the KVMAvailable condition) is not
//! proof that a guest boots: a host that is itself a VM with a paravirtual KVM (kvm_pvm), nested
//! virtualization without guest support, a device the VM's uid cannot open, or an unsupported
//! CPU all pass that check and fail every start. The agent therefore boots a smallest machine
//! from smolvm's own guest (no image pull, no network), then deletes it, and reports the result
//! as the SmolVMNode's GuestBootable condition.
//!
//! The rules are pure and table-tested: [`due`] says when to check again, [`diagnose`] turns
//! smolvm's cause and what the host shows into a cause a reader can act on. [`boot_once`] and
//! [`spawn`] are the thin I/O around them.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use smolvm_api::constants::CANARY_MACHINE_NAME;
use smolvm_api::text::clean_external;
use tokio::sync::{Notify, watch};

use crate::metrics::Metrics;
use crate::supervisor::RuntimeStatus;
use crate::vmm::{MachineSpec, Vmm};

/// vCPUs of the canary machine: the fewest smolvm accepts.
pub const CANARY_CPUS: u32 = 1;
/// Memory of the canary machine in MiB: the least smolvm accepts. It comes out of the host's
/// reservation (the agent's allocatable never offers it to VMs), so the check runs on a full
/// node too and never competes with VMs.
pub const CANARY_MEMORY_MIB: u32 = 64;
/// Disks of the canary machine in GiB (sparse files: nothing is written but the guest's boot).
pub const CANARY_DISK_GIB: u64 = 1;

/// Why a guest did not boot, as far as the agent can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// `/dev/kvm` cannot be opened by the uid smolvm runs each VM under.
    DeviceNotAccessible,
    /// The host's KVM cannot run smolvm's guest kernel: the host is itself a VM without nested
    /// virtualization for its guests (no vmx/svm), or its KVM is paravirtual (kvm_pvm).
    HostCannotRunGuest,
    /// The guest made no boot progress within the bound.
    Timeout,
    /// Anything else smolvm reported.
    InternalError,
}

impl Cause {
    /// Stable name (metrics label, log field).
    pub fn reason(self) -> &'static str {
        match self {
            Cause::DeviceNotAccessible => "DeviceNotAccessible",
            Cause::HostCannotRunGuest => "HostCannotRunGuest",
            Cause::Timeout => "Timeout",
            Cause::InternalError => "InternalError",
        }
    }
}

/// What the host shows about KVM, read once per check ([`HostFacts::read`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFacts {
    /// Permission bits of the KVM device, when it exists.
    pub kvm_mode: Option<u32>,
    /// Group of the KVM device, when it exists.
    pub kvm_gid: Option<u32>,
    /// Whether smolvm drops each VM to a uid of its own (`SMOLVM_VM_UID_DROP` not `off`) while
    /// the agent runs as root.
    pub uid_drop: bool,
    /// `/proc/cpuinfo` lists `vmx` or `svm`.
    pub virt_flags: bool,
    /// `/proc/cpuinfo` lists `hypervisor`: this host is itself a virtual machine.
    pub hypervisor: bool,
    /// The paravirtual KVM module (`kvm_pvm`) is loaded.
    pub pvm: bool,
}

impl HostFacts {
    /// Reads the facts: the device's metadata, `/proc/cpuinfo`, `/sys/module`, and whether
    /// smolvm drops privileges (from the environment it is given, then the agent's own).
    pub fn read(kvm_device: &Path, smolvm_env: &[(String, String)]) -> Self {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(kvm_device).ok();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = cpu_flags(&cpuinfo);
        let drop_setting = smolvm_env
            .iter()
            .rev()
            .find(|(k, _)| k == "SMOLVM_VM_UID_DROP")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("SMOLVM_VM_UID_DROP").ok());
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        HostFacts {
            kvm_mode: meta.as_ref().map(|m| m.permissions().mode() & 0o7777),
            kvm_gid: meta.as_ref().map(MetadataExt::gid),
            uid_drop: root && !matches!(drop_setting.as_deref(), Some("off" | "0" | "false")),
            virt_flags: flags.iter().any(|f| *f == "vmx" || *f == "svm"),
            hypervisor: flags.contains(&"hypervisor"),
            pvm: Path::new("/sys/module/kvm_pvm").exists(),
        }
    }

    /// Whether the device is open to every uid (what a VM under a uid of its own needs).
    fn device_open_to_others(&self) -> bool {
        self.kvm_mode.is_none_or(|mode| mode & 0o006 == 0o006)
    }
}

/// The flags of the first processor in `/proc/cpuinfo` text.
pub fn cpu_flags(cpuinfo: &str) -> Vec<&str> {
    cpuinfo
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then(|| value.split_whitespace().collect())
        })
        .unwrap_or_default()
}

/// A failed check, explained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The cause, as far as it can be told.
    pub cause: Cause,
    /// For the condition: what happened, why, and what would fix it, then smolvm's own cause
    /// (cleaned).
    pub message: String,
}

/// Explains a failed boot: `code` is the node API code of smolvm's error (`StartFailed`,
/// `RuntimeTimeout`, …), `raw` its message as smolvm wrote it, `facts` what the host shows.
/// Host facts decide where they are unambiguous, because smolvm's own text often says only
/// that the boot process exited.
pub fn diagnose(code: &str, raw: &str, facts: &HostFacts) -> Diagnosis {
    let said = clean_external(raw);
    let lower = raw.to_ascii_lowercase();
    let (cause, why) = if (facts.uid_drop && !facts.device_open_to_others())
        || lower.contains("permission denied")
        || lower.contains("eacces")
    {
        let mode = facts.kvm_mode.map_or("unknown".to_string(), |m| format!("{m:04o}"));
        let group = facts.kvm_gid.map_or("unknown".to_string(), |g| g.to_string());
        (
            Cause::DeviceNotAccessible,
            format!(
                "the KVM device (mode {mode}, group {group}) cannot be opened by the uid smolvm runs each VM under; make it mode 0666 (as most distributions' udev rules do), or mode 0660 with a group the VM uids belong to"
            ),
        )
    } else if facts.pvm || (facts.hypervisor && !facts.virt_flags) || lower.contains("kvm_exit_internal_error") {
        let what = if facts.pvm {
            "this host is itself a virtual machine whose KVM is paravirtual (kvm_pvm)"
        } else if facts.hypervisor {
            "this host is itself a virtual machine and exposes no hardware virtualization (no vmx or svm flag)"
        } else {
            "the host's KVM failed inside the guest (KVM_EXIT_INTERNAL_ERROR)"
        };
        (
            Cause::HostCannotRunGuest,
            format!(
                "{what}: smolvm's guest kernel cannot run here; run VMs on bare metal, or on virtual machines with nested virtualization enabled"
            ),
        )
    } else if code == "RuntimeTimeout" || lower.contains("no boot progress") || lower.contains("timed out") {
        (
            Cause::Timeout,
            "the guest made no boot progress in time; check the host's load and smolvm's console log".to_string(),
        )
    } else {
        (
            Cause::InternalError,
            "smolvm could not boot a guest; read the agent's log and smolvm's console log".to_string(),
        )
    };
    let message = if said.is_empty() {
        format!("no guest booted: {why}")
    } else {
        format!("no guest booted: {why} (smolvm: {said})")
    };
    Diagnosis { cause, message }
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The guest booted, in this many milliseconds.
    Booted {
        /// Time from start request to running.
        millis: u64,
    },
    /// It did not.
    Failed(Diagnosis),
}

/// The state of the check, as the reporter reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CheckState {
    /// No check has finished yet.
    #[default]
    Pending,
    /// The last check finished with this outcome.
    Done(Outcome),
}

/// The guest boot check and the host's capabilities, as the SmolVMNode reports them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BootCheck {
    /// Pending, or the last outcome.
    pub state: CheckState,
    /// When the last check finished.
    pub last_run: Option<Timestamp>,
    /// smolvm's version at the last check.
    pub smolvm_version: Option<String>,
    /// smolvm runs nested-virtualization machines here (its `/health`).
    pub nested_virt: Option<bool>,
    /// CUDA devices smolvm sees (its `/capacity`).
    pub gpu_count: Option<u32>,
}

/// What a check depends on: a change of any part asks for a new one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunKey {
    /// The host's boot id (`/proc/sys/kernel/random/boot_id`): changes when the host reboots.
    pub host_boot_id: Option<String>,
    /// smolvm's own boot id (its `/capacity`): changes when `smolvm serve` restarts.
    pub runtime_boot_id: Option<String>,
    /// smolvm's version.
    pub version: Option<String>,
}

/// Why a check runs (log field, metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// None ran since the agent started.
    First,
    /// The host rebooted.
    HostRebooted,
    /// `smolvm serve` restarted.
    RuntimeRestarted,
    /// smolvm's version changed.
    VersionChanged,
    /// The interval passed.
    Interval,
    /// Someone asked (the recheck annotation).
    Requested,
}

impl Why {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::First => "First",
            Why::HostRebooted => "HostRebooted",
            Why::RuntimeRestarted => "RuntimeRestarted",
            Why::VersionChanged => "VersionChanged",
            Why::Interval => "Interval",
            Why::Requested => "Requested",
        }
    }
}

/// Whether a check is due: `last` is the key of the last check and how long ago it finished
/// (`None` before the first), `key` what holds now, `requested` whether someone asked.
pub fn due(last: Option<(&RunKey, Duration)>, key: &RunKey, interval: Duration, requested: bool) -> Option<Why> {
    let Some((last_key, ago)) = last else {
        return Some(Why::First);
    };
    if last_key.host_boot_id != key.host_boot_id {
        Some(Why::HostRebooted)
    } else if last_key.runtime_boot_id != key.runtime_boot_id {
        Some(Why::RuntimeRestarted)
    } else if last_key.version != key.version {
        Some(Why::VersionChanged)
    } else if requested {
        Some(Why::Requested)
    } else if ago >= interval {
        Some(Why::Interval)
    } else {
        None
    }
}

/// Boots the canary once: removes a leftover, creates the smallest machine from smolvm's own
/// guest, starts it within `timeout`, and deletes it whatever happened.
pub async fn boot_once(vmm: &dyn Vmm, timeout: Duration, facts: &HostFacts) -> Outcome {
    remove(vmm).await;
    let mut spec = MachineSpec::new(CANARY_MACHINE_NAME, CANARY_CPUS, CANARY_MEMORY_MIB);
    spec.storage_gib = Some(CANARY_DISK_GIB);
    spec.overlay_gib = Some(CANARY_DISK_GIB);
    let outcome = match vmm.create(&spec).await {
        Err(error) => Outcome::Failed(diagnose(error.code(), &error.to_string(), facts)),
        Ok(_) => {
            let started = Instant::now();
            match tokio::time::timeout(timeout, vmm.start(CANARY_MACHINE_NAME, None)).await {
                Ok(Ok(_)) => Outcome::Booted {
                    millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                },
                Ok(Err(error)) => Outcome::Failed(diagnose(error.code(), &error.to_string(), facts)),
                Err(_) => Outcome::Failed(diagnose(
                    "RuntimeTimeout",
                    &format!("the guest was not running after {}s", timeout.as_secs()),
                    facts,
                )),
            }
        }
    };
    remove(vmm).await;
    outcome
}

async fn remove(vmm: &dyn Vmm) {
    if let Err(error) = vmm.delete(CANARY_MACHINE_NAME).await {
        tracing::warn!(%error, reason = error.code(), machine = CANARY_MACHINE_NAME, "deleting the canary machine failed; the next check tries again");
    }
}

/// Tunables of the check.
#[derive(Debug, Clone)]
pub struct Config {
    /// Time between checks when nothing changes.
    pub interval: Duration,
    /// Longest a canary start may take.
    pub boot_timeout: Duration,
    /// How often the key (boot ids, version) and the host's capabilities are read.
    pub poll: Duration,
    /// The KVM device (for the diagnosis).
    pub kvm_device: std::path::PathBuf,
    /// The environment `smolvm serve` is given (for the diagnosis).
    pub smolvm_env: Vec<(String, String)>,
}

/// A running check: its published state and a way to ask for a check now.
pub struct Canary {
    state: watch::Receiver<BootCheck>,
    recheck: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Canary {
    /// A receiver of state changes.
    pub fn subscribe(&self) -> watch::Receiver<BootCheck> {
        self.state.clone()
    }

    /// Asks for a check at once (the recheck annotation).
    pub fn request(&self) {
        self.recheck.notify_one();
    }

    /// A handle that asks for a check (for the reporter).
    pub fn requester(&self) -> Arc<Notify> {
        self.recheck.clone()
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn host_boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Starts the check loop: it waits for smolvm to serve, then checks at once and again whenever
/// [`due`] says so.
pub fn spawn(
    vmm: Arc<dyn Vmm>,
    runtime: watch::Receiver<RuntimeStatus>,
    metrics: Arc<Metrics>,
    config: Config,
) -> Canary {
    let (tx, rx) = watch::channel(BootCheck::default());
    let recheck = Arc::new(Notify::new());
    let task = tokio::spawn(run(vmm, runtime, metrics, config, tx, recheck.clone()));
    Canary {
        state: rx,
        recheck,
        task,
    }
}

async fn run(
    vmm: Arc<dyn Vmm>,
    runtime: watch::Receiver<RuntimeStatus>,
    metrics: Arc<Metrics>,
    config: Config,
    tx: watch::Sender<BootCheck>,
    recheck: Arc<Notify>,
) {
    let mut last: Option<(RunKey, Instant)> = None;
    let mut requested = false;
    loop {
        let status = runtime.borrow().clone();
        if status.ready {
            let capacity = vmm.capacity().await.ok();
            let nested = vmm.health().await.ok().map(|h| h.nested_virt);
            let key = RunKey {
                host_boot_id: host_boot_id(),
                runtime_boot_id: capacity.as_ref().and_then(|c| c.boot_id.clone()),
                version: status.version.clone(),
            };
            tx.send_modify(|check| {
                check.nested_virt = nested.or(check.nested_virt);
                check.gpu_count = capacity.as_ref().map(|c| c.gpu_count).or(check.gpu_count);
            });
            let previous = last.as_ref().map(|(k, at)| (k, at.elapsed()));
            if let Some(why) = due(previous, &key, config.interval, requested) {
                requested = false;
                tracing::info!(
                    why = why.as_str(),
                    machine = CANARY_MACHINE_NAME,
                    "guest boot check starting"
                );
                let facts = HostFacts::read(&config.kvm_device, &config.smolvm_env);
                let outcome = boot_once(vmm.as_ref(), config.boot_timeout, &facts).await;
                match &outcome {
                    Outcome::Booted { millis } => {
                        tracing::info!(boot_millis = millis, "guest boot check: a guest booted");
                        metrics.observe_canary(true, Some(Duration::from_millis(*millis)), "Booted");
                    }
                    Outcome::Failed(diagnosis) => {
                        tracing::warn!(cause = diagnosis.cause.reason(), message = %diagnosis.message, "guest boot check: no guest booted");
                        metrics.observe_canary(false, None, diagnosis.cause.reason());
                    }
                }
                tx.send_modify(|check| {
                    check.state = CheckState::Done(outcome);
                    check.last_run = Some(Timestamp::now());
                    check.smolvm_version = key.version.clone();
                });
                last = Some((key, Instant::now()));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.poll) => {}
            () = recheck.notified() => requested = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(host: &str, runtime: &str, version: &str) -> RunKey {
        RunKey {
            host_boot_id: Some(host.into()),
            runtime_boot_id: Some(runtime.into()),
            version: Some(version.into()),
        }
    }

    #[test]
    fn due_table() {
        let hour = Duration::from_secs(3600);
        let base = key("h1", "r1", "1.32.2");
        /// (name, the last check's key and age, the key now, requested, what is due)
        type Case = (&'static str, Option<(RunKey, Duration)>, RunKey, bool, Option<Why>);
        let cases: [Case; 7] = [
            ("first", None, base.clone(), false, Some(Why::First)),
            (
                "nothing changed",
                Some((base.clone(), Duration::from_secs(60))),
                base.clone(),
                false,
                None,
            ),
            (
                "host rebooted",
                Some((base.clone(), Duration::from_secs(60))),
                key("h2", "r1", "1.32.2"),
                false,
                Some(Why::HostRebooted),
            ),
            (
                "smolvm restarted",
                Some((base.clone(), Duration::from_secs(60))),
                key("h1", "r2", "1.32.2"),
                false,
                Some(Why::RuntimeRestarted),
            ),
            (
                "smolvm upgraded",
                Some((base.clone(), Duration::from_secs(60))),
                key("h1", "r1", "1.33.0"),
                false,
                Some(Why::VersionChanged),
            ),
            (
                "asked",
                Some((base.clone(), Duration::from_secs(1))),
                base.clone(),
                true,
                Some(Why::Requested),
            ),
            (
                "interval",
                Some((base.clone(), hour)),
                base.clone(),
                false,
                Some(Why::Interval),
            ),
        ];
        for (name, last, now, requested, want) in cases {
            let got = due(last.as_ref().map(|(k, d)| (k, *d)), &now, hour, requested);
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn cpu_flags_of_the_first_processor() {
        let text = "processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n\nprocessor\t: 1\nflags\t\t: fpu vmx\n";
        assert_eq!(cpu_flags(text), vec!["fpu", "vme", "hypervisor", "lahf_lm"]);
        assert!(cpu_flags("").is_empty());
    }

    fn facts() -> HostFacts {
        HostFacts {
            kvm_mode: Some(0o666),
            kvm_gid: Some(0),
            uid_drop: false,
            virt_flags: true,
            hypervisor: false,
            pvm: false,
        }
    }

    #[test]
    fn diagnosis_table() {
        let exited = "\u{1b}[2m2026-11-25T14:32:46.907679Z\u{1b}[0m \u{1b}[33m WARN\u{1b}[0m no IPv4 host resolver (boot process exited (code 1) before the agent was ready)";
        let cases: [(&str, &str, &str, HostFacts, Cause); 8] = [
            (
                "this machine: a VM whose KVM is kvm_pvm",
                "StartFailed",
                exited,
                HostFacts {
                    hypervisor: true,
                    virt_flags: false,
                    pvm: true,
                    ..facts()
                },
                Cause::HostCannotRunGuest,
            ),
            (
                "a VM without vmx or svm, smolvm timed out",
                "StartFailed",
                "no boot progress for 30 seconds",
                HostFacts {
                    hypervisor: true,
                    virt_flags: false,
                    ..facts()
                },
                Cause::HostCannotRunGuest,
            ),
            (
                "device 0600 while smolvm drops each VM's uid",
                "StartFailed",
                exited,
                HostFacts {
                    kvm_mode: Some(0o600),
                    uid_drop: true,
                    ..facts()
                },
                Cause::DeviceNotAccessible,
            ),
            (
                "smolvm says permission denied",
                "StartFailed",
                "open /dev/kvm: Permission denied (os error 13)",
                facts(),
                Cause::DeviceNotAccessible,
            ),
            (
                "device 0600 without the uid drop is fine",
                "StartFailed",
                "something else",
                HostFacts {
                    kvm_mode: Some(0o600),
                    uid_drop: false,
                    ..facts()
                },
                Cause::InternalError,
            ),
            (
                "KVM internal error on bare metal",
                "StartFailed",
                "vcpu run: KVM_EXIT_INTERNAL_ERROR",
                facts(),
                Cause::HostCannotRunGuest,
            ),
            (
                "our bound",
                "RuntimeTimeout",
                "the guest was not running after 180s",
                facts(),
                Cause::Timeout,
            ),
            (
                "smolvm's bound",
                "StartFailed",
                "no boot progress for 30 seconds",
                facts(),
                Cause::Timeout,
            ),
        ];
        for (name, code, raw, facts, want) in cases {
            let got = diagnose(code, raw, &facts);
            assert_eq!(got.cause, want, "{name}: {}", got.message);
            assert!(got.message.starts_with("no guest booted: "), "{name}: {}", got.message);
            assert!(!got.message.contains('\u{1b}'), "{name}: escape codes must be cleaned");
            assert!(
                !got.message.contains("2026-11-25T"),
                "{name}: timestamps must be cleaned"
            );
        }
        let device = diagnose(
            "StartFailed",
            exited,
            &HostFacts {
                kvm_mode: Some(0o600),
                uid_drop: true,
                ..facts()
            },
        );
        assert!(
            device.message.contains("mode 0600") && device.message.contains("0666"),
            "{}",
            device.message
        );
        let pvm = diagnose(
            "StartFailed",
            exited,
            &HostFacts {
                hypervisor: true,
                pvm: true,
                virt_flags: false,
                ..facts()
            },
        );
        assert!(pvm.message.contains("kvm_pvm"), "{}", pvm.message);
        assert!(
            pvm.message.contains("boot process exited"),
            "smolvm's cause is kept: {}",
            pvm.message
        );
    }
}
