//! Quota (SPEC 6.3, rule V15): what a namespace's SmolVMs and warm pools use, in the keys of an
//! ordinary ResourceQuota, and the judgement of a charge against its limits, worded as
//! kube-apiserver's own quota admission words it.
//!
//! SmolVMs start no Pods, so a ResourceQuota's `requests.cpu` never counts them. A platform team
//! limits them with the product's keys ([`Key`]) in `spec.hard`, beside the native
//! `count/smolvms.vm.smolvm.dev`:
//!
//! ```yaml
//! apiVersion: v1
//! kind: ResourceQuota
//! metadata: {name: vms, namespace: team-a}
//! spec:
//!   hard:
//!     vm.smolvm.dev/cpus: "16"
//!     vm.smolvm.dev/memory: 32Gi
//!     vm.smolvm.dev/storage: 500Gi
//! ```
//!
//! What counts ([`usage`]) is what the controller's ledger books on a node: a SmolVM's CPUs and
//! memory unless it is suspended (a stopped VM keeps its room on its node), its storage and
//! overlay, and a suspended VM's saved memory as storage; a pool's source machine and its ready
//! slots, each the size of the template's machine.
//!
//! Everything here is pure: the webhook and the controller do the reading and writing (an
//! update of `status.used` with the resourceVersion it read, retried on conflict).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::types::{NodeResources, Phase, SmolVMSpec, SmolVMStatus};

/// The prefix of every product key.
pub const KEY_PREFIX: &str = "vm.smolvm.dev/";

/// One of the product's quota keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// `vm.smolvm.dev/cpus`: CPUs, counted as a quantity of cores (`"16"`, `"500m"`).
    Cpus,
    /// `vm.smolvm.dev/memory`: memory, a quantity of bytes (`"32Gi"`).
    Memory,
    /// `vm.smolvm.dev/storage`: disk (storage, overlay and saved memory), bytes (`"500Gi"`).
    Storage,
}

/// Thousandths in one unit: every amount is kept in thousandths of its unit (a CPU, a byte), as
/// a Kubernetes quantity keeps millis, so `"500m"` CPUs compare exactly.
const MILLI: i128 = 1000;
const MIB: i128 = 1 << 20;
const GIB: i128 = 1 << 30;

impl Key {
    /// Every key, in the order they are listed.
    pub const ALL: [Key; 3] = [Key::Cpus, Key::Memory, Key::Storage];

    /// The key as a ResourceQuota names it.
    pub fn name(self) -> &'static str {
        match self {
            Key::Cpus => "vm.smolvm.dev/cpus",
            Key::Memory => "vm.smolvm.dev/memory",
            Key::Storage => "vm.smolvm.dev/storage",
        }
    }

    /// The key named `name`, if it is one of the product's.
    pub fn named(name: &str) -> Option<Key> {
        Key::ALL.into_iter().find(|k| k.name() == name)
    }

    /// `amount`'s figure for this key, in thousandths of the key's unit.
    pub fn milli(self, amount: &NodeResources) -> i128 {
        match self {
            Key::Cpus => i128::from(amount.cpus) * MILLI,
            Key::Memory => i128::from(amount.memory_mib) * MIB * MILLI,
            Key::Storage => i128::from(amount.storage_gib) * GIB * MILLI,
        }
    }

    /// `milli` thousandths of this key's unit as a canonical quantity: CPUs in decimal (`"4"`,
    /// `"1500m"`), bytes with the largest binary suffix that divides them (`"512Mi"`, `"2Gi"`).
    pub fn format(self, milli: i128) -> String {
        if milli % MILLI != 0 {
            return format!("{milli}m");
        }
        let units = milli / MILLI;
        match self {
            Key::Cpus => units.to_string(),
            Key::Memory | Key::Storage => binary(units),
        }
    }
}

/// `bytes` with the largest binary suffix that divides it exactly, as Kubernetes writes a
/// binary quantity.
fn binary(bytes: i128) -> String {
    if bytes == 0 {
        return "0".into();
    }
    for (suffix, power) in [("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)] {
        let unit = 1i128 << power;
        if bytes % unit == 0 {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// A quantity that is not one (the API server validates every quantity it stores, so this
/// comes only from a hand-made object).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity")]
pub struct NotAQuantity(pub String);

/// A Kubernetes quantity (`"2"`, `"1.5"`, `"500m"`, `"32Gi"`, `"10G"`, `"1e3"`) in thousandths of
/// its unit, rounded up as Kubernetes rounds a quantity to millis.
pub fn parse_quantity(text: &str) -> Result<i128, NotAQuantity> {
    let bad = || NotAQuantity(text.to_string());
    let s = text.trim();
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let number_end = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad());
    }
    // The mantissa as an integer over 10^scale.
    let digits = format!("{whole}{fraction}");
    let mut mantissa: i128 = 0;
    for d in digits.bytes() {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(i128::from(d - b'0')))
            .ok_or_else(bad)?;
    }
    let scale = u32::try_from(fraction.len()).map_err(|_| bad())?;
    // The multiplier as numerator / denominator (both powers of ten or of two).
    let (numerator, denominator): (i128, i128) = match suffix {
        "" => (1, 1),
        "n" => (1, 1_000_000_000),
        "u" => (1, 1_000_000),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exponent => {
            let e = exponent
                .strip_prefix(['e', 'E'])
                .ok_or_else(bad)?
                .parse::<i32>()
                .map_err(|_| bad())?;
            let power = 10i128
                .checked_pow(e.unsigned_abs())
                .filter(|_| e.abs() <= 30)
                .ok_or_else(bad)?;
            if e >= 0 { (power, 1) } else { (1, power) }
        }
    };
    let top = mantissa
        .checked_mul(numerator)
        .and_then(|v| v.checked_mul(MILLI))
        .ok_or_else(bad)?;
    let bottom = denominator
        .checked_mul(10i128.checked_pow(scale).ok_or_else(bad)?)
        .ok_or_else(bad)?;
    let milli = top.checked_add(bottom - 1).ok_or_else(bad)? / bottom;
    Ok(if negative { -milli } else { milli })
}

/// What a VM of `request` holds, suspended or not: suspended, its CPU and memory are given back
/// and its saved memory is counted as disk ([`saved_state_gib`]).
pub fn held(request: &NodeResources, suspended: bool) -> NodeResources {
    if !suspended {
        return *request;
    }
    NodeResources {
        cpus: 0,
        memory_mib: 0,
        storage_gib: request.storage_gib.saturating_add(saved_state_gib(request.memory_mib)),
    }
}

/// Whether a stored status says its VM holds only a suspended VM's share ([`held`]): in phase
/// Suspended, or in a phase the controller writes without the machine's state (its node
/// unreachable, or the VM being deleted) while its `Suspended` condition still says the machine
/// was suspended when last seen and no resume was made (reason `Suspended` or `ResumePending`;
/// `Resuming` may have resumed it, so it holds its whole request). Only a hint, for a VM whose
/// suspends and resumes were not seen: the controller's own are newer than any stored status.
pub fn status_holds_suspended(status: Option<&SmolVMStatus>) -> bool {
    use crate::constants::{condition, reason};
    let Some(status) = status else { return false };
    match status.phase {
        Some(Phase::Suspended) => true,
        Some(Phase::Unknown | Phase::Deleting) => status.conditions.iter().any(|c| {
            c.type_ == condition::SUSPENDED
                && c.status == "True"
                && (c.reason == reason::SUSPENDED || c.reason == reason::RESUME_PENDING)
        }),
        _ => false,
    }
}

/// The disk a suspended VM's saved memory is counted as: its memory, in whole GiB (rounded up).
/// smolvm reports no saved-state size, so the whole memory: the worst case.
pub fn saved_state_gib(memory_mib: i64) -> i64 {
    memory_mib.max(0).saturating_add(1023) / 1024
}

/// What a SmolVM of `spec` counts against its namespace's quota: [`held`] of its request, with
/// `spec.suspended` (a stopped VM keeps its room on its node, so it counts in full).
pub fn usage(spec: &SmolVMSpec) -> NodeResources {
    held(&spec.request(), spec.suspended())
}

/// What a write taking a SmolVM from `old` (none at a create) to `new` asks of its quota: the
/// growth in each key, never negative (a shrink is given back by the controller's recount, as
/// kube-apiserver's quota controller gives back a deleted Pod's requests).
pub fn increase(old: Option<&NodeResources>, new: &NodeResources) -> NodeResources {
    let old = old.copied().unwrap_or_default();
    NodeResources {
        cpus: new.cpus.saturating_sub(old.cpus).max(0),
        memory_mib: new.memory_mib.saturating_sub(old.memory_mib).max(0),
        storage_gib: new.storage_gib.saturating_sub(old.storage_gib).max(0),
    }
}

/// A figure as a quota states it: thousandths of the key's unit, and the text it was read from
/// (for the refusal's words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    /// Thousandths of the key's unit.
    pub milli: i128,
    /// As the quota writes it.
    pub text: String,
}

impl Figure {
    fn read(quantity: &Quantity) -> Result<Figure, NotAQuantity> {
        Ok(Figure {
            milli: parse_quantity(&quantity.0)?,
            text: quantity.0.clone(),
        })
    }
}

/// What a ResourceQuota says of the product's keys: its limits (`spec.hard`) and what it has
/// counted (`status.used`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The ResourceQuota's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The resourceVersion these figures were read at (the precondition of a charge).
    pub resource_version: Option<String>,
    /// The product keys of `spec.hard`, with their limit.
    pub hard: BTreeMap<Key, Figure>,
    /// The product keys of `status.used` (a key missing counts as 0).
    pub used: BTreeMap<Key, Figure>,
    /// The product keys of `status.hard` (what the API server's quota controller copies from
    /// `spec.hard`; where none runs, the controller's recount writes it).
    pub status_hard: BTreeMap<Key, Figure>,
}

/// The product keys of `list` (others, and figures that are not quantities, left out).
fn product_figures(list: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<Key, Figure> {
    list.into_iter()
        .flatten()
        .filter_map(|(name, q)| Some((Key::named(name)?, Figure::read(q).ok()?)))
        .collect()
}

impl Limits {
    /// The product's limits in `quota`; `None` when its `spec.hard` names none of the keys.
    pub fn of(quota: &ResourceQuota) -> Option<Limits> {
        let hard = product_figures(quota.spec.as_ref().and_then(|s| s.hard.as_ref()));
        if hard.is_empty() {
            return None;
        }
        let status = quota.status.as_ref();
        Some(Limits {
            name: quota.metadata.name.clone().unwrap_or_default(),
            namespace: quota.metadata.namespace.clone().unwrap_or_default(),
            resource_version: quota.metadata.resource_version.clone(),
            hard,
            used: product_figures(status.and_then(|s| s.used.as_ref())),
            status_hard: product_figures(status.and_then(|s| s.hard.as_ref())),
        })
    }

    /// What this quota has counted of `key` (0 when it has not).
    pub fn used_milli(&self, key: Key) -> i128 {
        self.used.get(&key).map_or(0, |f| f.milli)
    }

    /// Whether `status.hard` states the same limits as `spec.hard`, for the product's keys.
    pub fn status_hard_current(&self) -> bool {
        self.hard.len() == self.status_hard.len()
            && self
                .hard
                .iter()
                .all(|(k, f)| self.status_hard.get(k).is_some_and(|s| s.milli == f.milli))
    }
}

/// The room `quotas` (a namespace's) still leave, in whole units of each key (`i64::MAX` for a
/// key none limits); `None` when none limits anything: what the controller may still start there
/// on its own (a pool's source and slots).
pub fn room(quotas: &[Limits]) -> Option<NodeResources> {
    if quotas.is_empty() {
        return None;
    }
    let left = |key: Key, unit: i128| -> i64 {
        quotas
            .iter()
            .filter_map(|q| {
                q.hard
                    .get(&key)
                    .map(|hard| (hard.milli - q.used_milli(key)).max(0) / unit)
            })
            .min()
            .map_or(i64::MAX, |n| i64::try_from(n).unwrap_or(i64::MAX))
    };
    Some(NodeResources {
        cpus: left(Key::Cpus, MILLI),
        memory_mib: left(Key::Memory, MIB * MILLI),
        storage_gib: left(Key::Storage, GIB * MILLI),
    })
}

/// A charge refused: the quota it exceeds and kube-apiserver's own words for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Exceeded {
    /// The ResourceQuota exceeded.
    pub quota: String,
    /// `exceeded quota: NAME, requested: KEY=VALUE, used: KEY=VALUE, limited: KEY=VALUE`, each
    /// list naming every key exceeded, sorted, joined by commas.
    pub message: String,
}

/// What a charge does to one quota: the keys it raises, each with its figure afterwards.
pub type Charged = BTreeMap<Key, i128>;

/// Judges `requested` against `limits`: `Ok(None)` when it asks nothing of the keys the quota
/// limits, `Ok(Some(used))` with the figures afterwards of the keys it raises, or the refusal
/// when it takes any of them beyond the limit (every key exceeded named at once).
pub fn judge(limits: &Limits, requested: &NodeResources) -> Result<Option<Charged>, Exceeded> {
    let mut after = Charged::new();
    let mut exceeded = Vec::new();
    for (key, hard) in &limits.hard {
        let want = key.milli(requested);
        if want <= 0 {
            continue;
        }
        let total = limits.used_milli(*key).saturating_add(want);
        if total > hard.milli {
            exceeded.push((*key, want, hard));
        }
        after.insert(*key, total);
    }
    if !exceeded.is_empty() {
        // kube-apiserver's quota admission lists the same three for every key exceeded.
        let list = |each: &dyn Fn(Key, i128, &Figure) -> String| {
            exceeded
                .iter()
                .map(|(key, want, hard)| format!("{}={}", key.name(), each(*key, *want, hard)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let requested = list(&|key, want, _| key.format(want));
        let used = list(&|key, _, _| {
            limits
                .used
                .get(&key)
                .map_or_else(|| "0".to_string(), |f| f.text.clone())
        });
        let limited = list(&|_, _, hard| hard.text.clone());
        return Err(Exceeded {
            quota: limits.name.clone(),
            message: format!(
                "exceeded quota: {}, requested: {requested}, used: {used}, limited: {limited}",
                limits.name
            ),
        });
    }
    Ok((!after.is_empty()).then_some(after))
}

/// The `status` of a merge patch of a ResourceQuota that sets `used` for the keys given (in
/// canonical quantities) and, with `hard`, `status.hard` of the product keys to the limits in
/// `spec.hard`. Other keys are left as they are.
pub fn status_patch(limits: &Limits, used: &BTreeMap<Key, i128>, hard: bool) -> serde_json::Value {
    let used: serde_json::Map<String, serde_json::Value> = used
        .iter()
        .map(|(key, milli)| (key.name().to_string(), key.format(*milli).into()))
        .collect();
    let mut status = serde_json::json!({ "used": used });
    if hard {
        let hard: serde_json::Map<String, serde_json::Value> = limits
            .hard
            .iter()
            .map(|(key, f)| (key.name().to_string(), f.text.clone().into()))
            .collect();
        status["hard"] = hard.into();
    }
    serde_json::json!({
        "metadata": { "resourceVersion": limits.resource_version },
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_status_holds_suspended_by_its_phase_or_its_last_known_suspension() {
        use crate::constants::{condition, reason};
        let suspended = |status: &str, why: &str| k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: condition::SUSPENDED.into(),
            status: status.into(),
            reason: why.into(),
            message: String::new(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
            observed_generation: None,
        };
        let status = |phase: Option<Phase>, conditions: Vec<_>| SmolVMStatus {
            phase,
            conditions,
            ..SmolVMStatus::default()
        };
        // (name, status, holds suspended)
        let cases = [
            ("no status", None, false),
            ("phase Suspended", Some(status(Some(Phase::Suspended), vec![])), true),
            ("running", Some(status(Some(Phase::Running), vec![])), false),
            (
                "node unreachable, last seen suspended",
                Some(status(Some(Phase::Unknown), vec![suspended("True", reason::SUSPENDED)])),
                true,
            ),
            (
                "being deleted, waiting to resume",
                Some(status(
                    Some(Phase::Deleting),
                    vec![suspended("True", reason::RESUME_PENDING)],
                )),
                true,
            ),
            (
                "node unreachable while resuming: it may run",
                Some(status(Some(Phase::Unknown), vec![suspended("True", reason::RESUMING)])),
                false,
            ),
            (
                "node unreachable, being suspended: not yet",
                Some(status(
                    Some(Phase::Unknown),
                    vec![suspended("False", reason::SUSPENDING)],
                )),
                false,
            ),
            (
                "running with a stale condition: its phase wins",
                Some(status(Some(Phase::Running), vec![suspended("True", reason::SUSPENDED)])),
                false,
            ),
        ];
        for (name, status, want) in cases {
            assert_eq!(status_holds_suspended(status.as_ref()), want, "{name}");
        }
    }
    use k8s_openapi::api::core::v1::{ResourceQuotaSpec, ResourceQuotaStatus};

    #[test]
    fn quantities_read_as_kubernetes_reads_them() {
        let table: &[(&str, Option<i128>)] = &[
            ("4", Some(4000)),
            ("0", Some(0)),
            ("500m", Some(500)),
            ("1.5", Some(1500)),
            ("0.0001", Some(1)), // rounded up to a milli
            ("1Ki", Some(1024 * 1000)),
            ("512Mi", Some(512 * MIB * 1000)),
            ("2Gi", Some(2 * GIB * 1000)),
            ("1.5Gi", Some(3 * GIB * 1000 / 2)),
            ("10G", Some(10_000_000_000 * 1000)),
            ("1e3", Some(1_000_000)),
            ("1E-3", Some(1)),
            ("-2", Some(-2000)),
            ("", None),
            ("Gi", None),
            ("1.2.3", None),
            ("12x", None),
            ("1e99", None),
            ("99999999999999999999999999999999999999Ei", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_quantity(text).ok(), *want, "{text}");
        }
    }

    #[test]
    fn figures_are_written_canonically() {
        let table: &[(Key, i128, &str)] = &[
            (Key::Cpus, 4000, "4"),
            (Key::Cpus, 1500, "1500m"),
            (Key::Cpus, 0, "0"),
            (Key::Memory, 512 * MIB * 1000, "512Mi"),
            (Key::Memory, 2048 * MIB * 1000, "2Gi"),
            (Key::Memory, 1536 * MIB * 1000, "1536Mi"),
            (Key::Storage, 1024 * GIB * 1000, "1Ti"),
            (Key::Storage, 30 * GIB * 1000, "30Gi"),
            (Key::Storage, 1000, "1"),
        ];
        for (key, milli, want) in table {
            assert_eq!(key.format(*milli), *want, "{key:?} {milli}");
            assert_eq!(parse_quantity(want).ok(), Some(*milli), "{want} reads back");
        }
    }

    #[test]
    fn usage_counts_what_the_ledger_books() {
        let vm = |cpus: i32, memory: i64, suspended: bool, running: bool| SmolVMSpec {
            image: "alpine".into(),
            running: Some(running),
            suspended: Some(suspended),
            resources: Some(crate::types::Resources {
                cpus: Some(cpus),
                memory_mib: Some(memory),
            }),
            ..Default::default()
        };
        let table: &[(SmolVMSpec, NodeResources)] = &[
            // Defaults: 20 + 10 GiB of disk.
            (
                vm(2, 2048, false, true),
                NodeResources {
                    cpus: 2,
                    memory_mib: 2048,
                    storage_gib: 30,
                },
            ),
            // Stopped: its room stays its own.
            (
                vm(2, 2048, false, false),
                NodeResources {
                    cpus: 2,
                    memory_mib: 2048,
                    storage_gib: 30,
                },
            ),
            // Suspended: CPU and memory back, saved memory counted as disk (rounded up).
            (
                vm(2, 1536, true, true),
                NodeResources {
                    cpus: 0,
                    memory_mib: 0,
                    storage_gib: 32,
                },
            ),
            // Suspended but not running: the machine stops, nothing is saved.
            (
                vm(2, 1536, true, false),
                NodeResources {
                    cpus: 2,
                    memory_mib: 1536,
                    storage_gib: 30,
                },
            ),
        ];
        for (spec, want) in table {
            assert_eq!(usage(spec), *want, "{spec:?}");
        }
    }

    #[test]
    fn an_increase_is_the_growth_alone() {
        let r = |cpus, memory_mib, storage_gib| NodeResources {
            cpus,
            memory_mib,
            storage_gib,
        };
        assert_eq!(increase(None, &r(2, 512, 30)), r(2, 512, 30));
        assert_eq!(increase(Some(&r(2, 512, 30)), &r(4, 512, 30)), r(2, 0, 0));
        // A suspend: CPU and memory go back (not credited here), saved memory is added as disk.
        assert_eq!(increase(Some(&r(2, 2048, 30)), &r(0, 0, 32)), r(0, 0, 2));
        assert_eq!(increase(Some(&r(4, 4096, 30)), &r(2, 1024, 30)), r(0, 0, 0));
    }

    fn quota(hard: &[(&str, &str)], used: &[(&str, &str)]) -> ResourceQuota {
        let list = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), Quantity((*v).to_string())))
                    .collect(),
            )
        };
        ResourceQuota {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("vms".into()),
                namespace: Some("team-a".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: list(hard),
                ..Default::default()
            }),
            status: Some(ResourceQuotaStatus {
                used: list(used),
                hard: None,
            }),
        }
    }

    #[test]
    fn a_quota_without_the_products_keys_is_none_of_its_business() {
        assert_eq!(Limits::of(&quota(&[("requests.cpu", "4"), ("pods", "10")], &[])), None);
        let limits = Limits::of(&quota(&[("requests.cpu", "4"), ("vm.smolvm.dev/cpus", "4")], &[]))
            .expect("names a product key");
        assert_eq!(limits.hard.keys().copied().collect::<Vec<_>>(), vec![Key::Cpus]);
        assert!(!limits.status_hard_current());
    }

    #[test]
    fn charges_are_judged_as_kube_apiserver_judges_them() {
        let r = |cpus, memory_mib, storage_gib| NodeResources {
            cpus,
            memory_mib,
            storage_gib,
        };
        let limits = Limits::of(&quota(
            &[
                ("vm.smolvm.dev/cpus", "4"),
                ("vm.smolvm.dev/memory", "4Gi"),
                ("count/smolvms.vm.smolvm.dev", "9"),
            ],
            &[("vm.smolvm.dev/cpus", "2"), ("vm.smolvm.dev/memory", "1Gi")],
        ))
        .expect("names a product key");
        // Fits: the figures afterwards, for the keys the quota limits (storage is not limited).
        assert_eq!(
            judge(&limits, &r(2, 1024, 30)),
            Ok(Some(BTreeMap::from([(Key::Cpus, 4000), (Key::Memory, 2 * GIB * 1000)])))
        );
        // Asks nothing of what it limits.
        assert_eq!(judge(&limits, &r(0, 0, 30)), Ok(None));
        // One key over.
        assert_eq!(
            judge(&limits, &r(3, 1024, 30)).unwrap_err().message,
            "exceeded quota: vms, requested: vm.smolvm.dev/cpus=3, used: vm.smolvm.dev/cpus=2, limited: vm.smolvm.dev/cpus=4"
        );
        // Both over, sorted by key, joined by commas.
        assert_eq!(
            judge(&limits, &r(3, 4096, 30)).unwrap_err().message,
            "exceeded quota: vms, requested: vm.smolvm.dev/cpus=3,vm.smolvm.dev/memory=4Gi, used: vm.smolvm.dev/cpus=2,vm.smolvm.dev/memory=1Gi, limited: vm.smolvm.dev/cpus=4,vm.smolvm.dev/memory=4Gi"
        );
        // Nothing counted yet reads as 0.
        let fresh = Limits::of(&quota(&[("vm.smolvm.dev/cpus", "1")], &[])).expect("names a product key");
        assert_eq!(
            judge(&fresh, &r(2, 0, 0)).unwrap_err().message,
            "exceeded quota: vms, requested: vm.smolvm.dev/cpus=2, used: vm.smolvm.dev/cpus=0, limited: vm.smolvm.dev/cpus=1"
        );
    }

    #[test]
    fn the_room_left_is_the_least_any_quota_leaves() {
        assert_eq!(room(&[]), None);
        let a = Limits::of(&quota(
            &[("vm.smolvm.dev/cpus", "4"), ("vm.smolvm.dev/memory", "4Gi")],
            &[("vm.smolvm.dev/cpus", "1")],
        ))
        .expect("names a product key");
        let b = Limits::of(&quota(
            &[("vm.smolvm.dev/cpus", "2500m")],
            &[("vm.smolvm.dev/cpus", "6")],
        ))
        .expect("names a product key");
        assert_eq!(
            room(std::slice::from_ref(&a)),
            Some(NodeResources {
                cpus: 3,
                memory_mib: 4096,
                storage_gib: i64::MAX
            })
        );
        // Over its limit already: no room, never negative.
        assert_eq!(
            room(&[a, b]),
            Some(NodeResources {
                cpus: 0,
                memory_mib: 4096,
                storage_gib: i64::MAX
            })
        );
    }

    #[test]
    fn the_status_patch_names_its_precondition_and_only_the_products_keys() {
        let limits =
            Limits::of(&quota(&[("vm.smolvm.dev/cpus", "4"), ("pods", "3")], &[])).expect("names a product key");
        let patch = status_patch(&limits, &BTreeMap::from([(Key::Cpus, 2000)]), true);
        assert_eq!(
            patch,
            serde_json::json!({
                "metadata": {"resourceVersion": "42"},
                "status": {"used": {"vm.smolvm.dev/cpus": "2"}, "hard": {"vm.smolvm.dev/cpus": "4"}}
            })
        );
    }
}
