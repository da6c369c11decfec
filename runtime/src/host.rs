//! Facts about this host: KVM usability and machine capacity. Parsing and arithmetic are pure
//! functions; the thin I/O wrappers read `/dev/kvm`, `/proc/meminfo` and `statvfs`.

use std::path::Path;

use smolvm_api::types::NodeResources;

/// `KVM_GET_API_VERSION` = `_IO(KVMIO, 0x00)` with `KVMIO` = 0xAE.
pub const KVM_GET_API_VERSION: u64 = 0xAE00;
/// The only stable KVM API version.
pub const KVM_API_VERSION: i32 = 12;

/// Whether KVM can be used, with the reason when not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvmStatus {
    /// `/dev/kvm` opened and answered version 12.
    pub available: bool,
    /// What was found.
    pub message: String,
}

/// Interprets the result of `KVM_GET_API_VERSION`.
pub fn kvm_status_from_version(version: Result<i32, String>) -> KvmStatus {
    match version {
        Ok(KVM_API_VERSION) => KvmStatus {
            available: true,
            message: format!("KVM API version {KVM_API_VERSION}"),
        },
        Ok(other) => KvmStatus {
            available: false,
            message: format!("KVM API version {other}, expected {KVM_API_VERSION}"),
        },
        Err(error) => KvmStatus {
            available: false,
            message: error,
        },
    }
}

/// Opens `path` (normally `/dev/kvm`) and asks its API version.
pub fn check_kvm(path: &Path) -> KvmStatus {
    use std::os::fd::AsRawFd;
    let version = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
        .and_then(|file| {
            // SAFETY: ioctl on an fd we own; KVM_GET_API_VERSION takes no argument.
            let result = unsafe { libc::ioctl(file.as_raw_fd(), KVM_GET_API_VERSION as _, 0) };
            if result < 0 {
                Err(format!(
                    "KVM_GET_API_VERSION on {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                ))
            } else {
                Ok(result)
            }
        });
    kvm_status_from_version(version)
}

/// `MemTotal` from `/proc/meminfo` text, in MiB.
pub fn parse_meminfo_total_mib(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") | None => Some(value / 1024),
            _ => None,
        }
    })
}

/// Reservations subtracted from capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservations {
    /// CPUs kept for the host.
    pub cpus: i64,
    /// Memory in MiB kept for the host.
    pub memory_mib: i64,
    /// Storage in GiB kept for the host.
    pub storage_gib: i64,
}

/// A `--reserved-*` flag: `auto` (the default, sized from the host) or a fixed amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reserve {
    /// Sized from the host's capacity by [`auto_reservations`].
    #[default]
    Auto,
    /// This amount.
    Fixed(i64),
}

/// Parses a `--reserved-*` value: `auto` or a whole number of at least 0.
pub fn parse_reserve(text: &str) -> Result<Reserve, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("auto") {
        return Ok(Reserve::Auto);
    }
    match text.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(Reserve::Fixed(n)),
        _ => Err(format!("{text:?} must be \"auto\" or a whole number of at least 0")),
    }
}

/// What `auto` keeps back for the host (the kubelet, the container runtime, this agent and
/// `smolvm serve`, the pods beside them), as cloud providers size the kubelet's reservation:
/// - CPUs: 1 on a host with 2 or more CPUs, else 0;
/// - memory: 25% of the first 4 GiB, 20% of the next 4 GiB, 10% of the next 8 GiB, 6% of the
///   next 112 GiB and 2% of the rest (a 4 GiB host keeps 1 GiB, 16 GiB keeps 2.6 GiB, 64 GiB keeps
///   5.5 GiB, rounded up to a whole MiB);
/// - storage: 0 (the state directory's filesystem holds only the VMs' disks).
pub fn auto_reservations(capacity: NodeResources) -> Reservations {
    const TIERS: [(i64, i64); 4] = [(4096, 25), (4096, 20), (8192, 10), (114_688, 6)];
    let mut left = capacity.memory_mib.max(0);
    let mut reserved_hundredths = 0i64;
    for (size, percent) in TIERS {
        let part = left.min(size);
        reserved_hundredths += part * percent;
        left -= part;
    }
    reserved_hundredths += left * 2;
    Reservations {
        cpus: i64::from(capacity.cpus >= 2),
        memory_mib: (reserved_hundredths + 99) / 100,
        storage_gib: 0,
    }
}

/// The reservations the flags ask for on a host of `capacity`.
pub fn reservations(capacity: NodeResources, cpus: Reserve, memory_mib: Reserve, storage_gib: i64) -> Reservations {
    let auto = auto_reservations(capacity);
    let pick = |r: Reserve, auto: i64| match r {
        Reserve::Auto => auto,
        Reserve::Fixed(n) => n,
    };
    Reservations {
        cpus: pick(cpus, auto.cpus),
        memory_mib: pick(memory_mib, auto.memory_mib),
        storage_gib: storage_gib.max(0),
    }
}

/// The largest CPU allocation ratio the agent accepts.
pub const MAX_CPU_ALLOCATION_RATIO: f64 = 16.0;

/// Checks a CPU allocation ratio: a finite number from 1 to [`MAX_CPU_ALLOCATION_RATIO`].
pub fn parse_cpu_allocation_ratio(text: &str) -> Result<f64, String> {
    let ratio: f64 = text.trim().parse().map_err(|_| format!("{text:?} is not a number"))?;
    if !ratio.is_finite() || !(1.0..=MAX_CPU_ALLOCATION_RATIO).contains(&ratio) {
        return Err(format!("{text:?} must lie between 1 and {MAX_CPU_ALLOCATION_RATIO}"));
    }
    Ok(ratio)
}

/// Capacity minus reservations, never negative. CPUs are first multiplied by
/// `cpu_allocation_ratio` (vCPUs per host CPU, rounded down; 1 means no overcommit); memory and
/// storage are never overcommitted.
pub fn allocatable(capacity: NodeResources, reserved: Reservations, cpu_allocation_ratio: f64) -> NodeResources {
    // The ratio is validated to 1..=16 and CPU counts are small, so the product fits an i64.
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
    let cpus = (capacity.cpus as f64 * cpu_allocation_ratio.clamp(1.0, MAX_CPU_ALLOCATION_RATIO)).floor() as i64;
    NodeResources {
        cpus: cpus.saturating_sub(reserved.cpus).max(0),
        memory_mib: capacity.memory_mib.saturating_sub(reserved.memory_mib).max(0),
        storage_gib: capacity.storage_gib.saturating_sub(reserved.storage_gib).max(0),
    }
}

/// Total bytes of the filesystem holding `path`.
pub fn filesystem_total_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)]
    Ok((stat.f_blocks as u64).saturating_mul(stat.f_frsize as u64))
}

/// The number of online CPUs listed in `/proc/stat` (its `cpuN` lines).
pub fn parse_proc_stat_cpus(stat: &str) -> Option<usize> {
    let count = stat
        .lines()
        .filter(|line| {
            line.strip_prefix("cpu")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    (count > 0).then_some(count)
}

/// Capacity of this host: its online CPUs (from `/proc/stat`, so a CPU limit or cpuset on the
/// agent's own container does not shrink it), MemTotal, and the size of the filesystem holding
/// `state_dir` (the nearest existing ancestor when it does not exist yet).
pub fn host_capacity(state_dir: &Path) -> crate::error::Result<NodeResources> {
    let cpus = std::fs::read_to_string("/proc/stat")
        .ok()
        .as_deref()
        .and_then(parse_proc_stat_cpus)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1);
    let meminfo =
        std::fs::read_to_string("/proc/meminfo").map_err(|e| crate::error::Error::io("reading", "/proc/meminfo", e))?;
    let memory_mib = parse_meminfo_total_mib(&meminfo)
        .ok_or_else(|| crate::error::Error::Config("/proc/meminfo has no MemTotal line".into()))?;
    let existing = state_dir.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let bytes = filesystem_total_bytes(existing).map_err(|e| crate::error::Error::io("statvfs", existing, e))?;
    Ok(NodeResources {
        cpus: i64::try_from(cpus).unwrap_or(i64::MAX),
        memory_mib: i64::try_from(memory_mib).unwrap_or(i64::MAX),
        storage_gib: i64::try_from(bytes / (1024 * 1024 * 1024)).unwrap_or(i64::MAX),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_cpus_are_counted() {
        let stat =
            "cpu  10 0 5 100 0 0 0 0 0 0\ncpu0 5 0 2 50 0 0 0 0 0 0\ncpu1 5 0 3 50 0 0 0 0 0 0\nintr 1\nctxt 2\n";
        assert_eq!(parse_proc_stat_cpus(stat), Some(2));
        assert_eq!(parse_proc_stat_cpus("cpu  1 2 3\nintr 1\n"), None);
        assert_eq!(parse_proc_stat_cpus(""), None);
        let real = std::fs::read_to_string("/proc/stat").ok();
        if let Some(real) = real {
            assert!(parse_proc_stat_cpus(&real).is_some_and(|n| n >= 1));
        }
    }

    #[test]
    fn meminfo_total() {
        let cases = [
            ("MemTotal:       24684532 kB\nMemFree:  1 kB\n", Some(24105)),
            ("MemFree: 1 kB\nMemTotal: 2048 kB\n", Some(2)),
            ("MemTotal: 1048576\n", Some(1024)),
            ("MemFree: 1 kB\n", None),
            ("MemTotal: lots kB\n", None),
            ("MemTotal: 5 MB\n", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_meminfo_total_mib(text), expected, "{text:?}");
        }
    }

    #[test]
    fn cpu_allocation_ratio_multiplies_cpus_only_and_rounds_down() {
        let cap = NodeResources {
            cpus: 2,
            memory_mib: 4096,
            storage_gib: 50,
        };
        let reserved = Reservations {
            cpus: 1,
            ..Default::default()
        };
        let cases = [(1.0, 1), (1.5, 2), (4.0, 7), (16.0, 31)];
        for (ratio, cpus) in cases {
            let got = allocatable(cap, reserved, ratio);
            assert_eq!(got.cpus, cpus, "ratio {ratio}");
            assert_eq!((got.memory_mib, got.storage_gib), (4096, 50), "ratio {ratio}");
        }
    }

    #[test]
    fn auto_reservations_follow_the_host_size() {
        let host = |cpus, memory_mib| NodeResources {
            cpus,
            memory_mib,
            storage_gib: 100,
        };
        // (cpus, memory MiB) -> (reserved cpus, reserved memory MiB)
        let cases = [
            ((1, 1024), (0, 256)),
            ((2, 4096), (1, 1024)),
            ((2, 8192), (1, 1844)),
            ((4, 16384), (1, 2663)),
            ((2, 24576), (1, 3154)),
            ((16, 65536), (1, 5612)),
            ((64, 131_072), (1, 9544)),
            ((128, 262_144), (1, 12166)),
            ((0, 0), (0, 0)),
        ];
        for ((cpus, memory), (want_cpus, want_memory)) in cases {
            let r = auto_reservations(host(cpus, memory));
            assert_eq!(
                (r.cpus, r.memory_mib, r.storage_gib),
                (want_cpus, want_memory, 0),
                "{cpus} CPUs, {memory} MiB"
            );
            assert!(r.memory_mib <= memory, "never more than the host");
        }
    }

    #[test]
    fn reservation_flags_are_auto_or_a_number() {
        assert_eq!(parse_reserve("auto"), Ok(Reserve::Auto));
        assert_eq!(parse_reserve("AUTO"), Ok(Reserve::Auto));
        assert_eq!(parse_reserve("0"), Ok(Reserve::Fixed(0)));
        assert_eq!(parse_reserve("2048"), Ok(Reserve::Fixed(2048)));
        for bad in ["-1", "1.5", "", "lots"] {
            let err = parse_reserve(bad).expect_err(bad);
            assert!(err.contains(&format!("{:?}", bad.trim())), "{err}");
        }
        let cap = NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 100,
        };
        assert_eq!(
            reservations(cap, Reserve::Auto, Reserve::Fixed(512), 10),
            Reservations {
                cpus: 1,
                memory_mib: 512,
                storage_gib: 10
            }
        );
        assert_eq!(
            reservations(cap, Reserve::Fixed(0), Reserve::Auto, 0),
            Reservations {
                cpus: 0,
                memory_mib: 2663,
                storage_gib: 0
            }
        );
    }

    #[test]
    fn cpu_allocation_ratio_parsing_names_the_bad_value() {
        assert_eq!(parse_cpu_allocation_ratio("2.5"), Ok(2.5));
        for bad in ["0.5", "17", "NaN", "inf", "x", ""] {
            let err = parse_cpu_allocation_ratio(bad).expect_err(bad);
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn allocatable_is_capacity_minus_reservations_never_negative() {
        let cap = NodeResources {
            cpus: 8,
            memory_mib: 16384,
            storage_gib: 100,
        };
        let cases = [
            (Reservations::default(), (8, 16384, 100)),
            (
                Reservations {
                    cpus: 1,
                    memory_mib: 1024,
                    storage_gib: 10,
                },
                (7, 15360, 90),
            ),
            (
                Reservations {
                    cpus: 16,
                    memory_mib: 99999,
                    storage_gib: 101,
                },
                (0, 0, 0),
            ),
        ];
        for (reserved, (cpus, memory_mib, storage_gib)) in cases {
            assert_eq!(
                allocatable(cap, reserved, 1.0),
                NodeResources {
                    cpus,
                    memory_mib,
                    storage_gib
                }
            );
        }
    }

    #[test]
    fn kvm_versions() {
        let cases = [
            (Ok(12), true),
            (Ok(11), false),
            (Err("cannot open /dev/kvm: No such file".to_string()), false),
        ];
        for (version, available) in cases {
            assert_eq!(
                kvm_status_from_version(version.clone()).available,
                available,
                "{version:?}"
            );
        }
    }

    #[test]
    fn real_host_facts_are_readable() {
        let capacity = host_capacity(Path::new("/nonexistent/state")).expect("capacity");
        assert!(capacity.cpus >= 1 && capacity.memory_mib > 0);
        let kvm = check_kvm(Path::new("/dev/kvm"));
        println!("KVM on this host: {kvm:?}");
        let missing = check_kvm(Path::new("/nonexistent/kvm"));
        assert!(!missing.available && missing.message.contains("cannot open"));
    }
}
