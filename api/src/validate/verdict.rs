//! What validation answers: the rule ids, each [`Finding`] (rule, field path,
//! JSON pointer, value, message) and the [`Verdict`] that gathers them.

use std::fmt;

/// The rule a finding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleId {
    /// The object does not have the API's shape.
    Schema,
    /// V1: image.
    V1,
    /// V2: resource and storage bounds.
    V2,
    /// V3: ports and CIDRs.
    V3,
    /// V4: node name and selector syntax.
    V4,
    /// V5: pin rules.
    V5,
    /// V6: immutability after binding.
    V6,
    /// V7: force-delete annotation.
    V7,
    /// V8: objects being deleted.
    V8,
    /// V9: status binding fields.
    V9,
    /// V10: SmolVMNode writes.
    V10,
    /// V11: the workload (command, args, env, pull secrets, restart, egress by host name).
    V11,
    /// V12: classes (a known, unchanging `spec.className`; classes within the policy; one default).
    V12,
    /// V13: suspend (`suspended` with `running: false` is warned about; no CPU or memory resize
    /// while suspended).
    V13,
    /// V14: warm pools (a known, unchanging `spec.poolRef`; a pooled SmolVM sets only what a
    /// lease carries; a pool's template passes every SmolVM rule; `slotsPerNode` within policy).
    V14,
    /// V15: quota (a write that raises its namespace's SmolVM usage beyond a ResourceQuota's
    /// `vm.smolvm.dev/*` limit; judged by the webhook's charge, [`crate::quota`]).
    V15,
    /// V16: volumes (unique names, one source each, absolute unique mount paths, valid claim
    /// templates in filesystem mode, within the policy's `maxVolumes`; immutable once bound).
    V16,
    /// V17: branches (a `branchOf` naming a branchable SmolVM of the namespace; a branch sets
    /// only `branchOf`, `env`, `running`, `suspended`, `lifecycle` and `network.ports`; a
    /// branchable SmolVM has no volumes and is no branch; both never change; the
    /// delete-branches annotation).
    V17,
    /// V18: lifecycle (`ttlSecondsAfterFinished` and `activeDeadlineSeconds` 0 or more, at most
    /// ten years; `suspendAfterIdle` a duration of at least 30 s and at most the policy's
    /// maximum; `wakeOnTraffic` needs `suspendAfterIdle`).
    V18,
}

impl RuleId {
    /// The rule id as written in the spec and in metrics (`V1` ... `V10`, `schema`).
    pub fn as_str(self) -> &'static str {
        match self {
            RuleId::Schema => "schema",
            RuleId::V1 => "V1",
            RuleId::V2 => "V2",
            RuleId::V3 => "V3",
            RuleId::V4 => "V4",
            RuleId::V5 => "V5",
            RuleId::V6 => "V6",
            RuleId::V7 => "V7",
            RuleId::V8 => "V8",
            RuleId::V9 => "V9",
            RuleId::V10 => "V10",
            RuleId::V11 => "V11",
            RuleId::V12 => "V12",
            RuleId::V13 => "V13",
            RuleId::V14 => "V14",
            RuleId::V15 => "V15",
            RuleId::V16 => "V16",
            RuleId::V17 => "V17",
            RuleId::V18 => "V18",
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One violation or warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The rule.
    pub rule: RuleId,
    /// Field path, such as `spec.resources.cpus` or `spec.network.ports[1].hostPort`.
    pub path: String,
    /// The offending value, rendered as JSON (`96`, `"alpine latest"`), or empty when absent.
    pub value: String,
    /// What is wrong, naming the value and the bound or rule it breaks.
    pub message: String,
    /// JSON pointer of the field, used to tell new violations from pre-existing ones.
    pub(super) pointer: String,
}

impl Finding {
    /// A finding at `path`, the field as a user reads it; the JSON pointer is derived from it, so
    /// the two never disagree.
    pub(super) fn new(rule: RuleId, path: impl Into<String>, value: String, message: String) -> Self {
        let path = path.into();
        Finding {
            rule,
            pointer: pointer_of(&path),
            path,
            value,
            message,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}]", self.path, self.message, self.rule)
    }
}

/// The outcome of validation: allowed when there is no violation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Reasons to reject, all of them.
    pub violations: Vec<Finding>,
    /// Things the requester should know; they never reject.
    pub warnings: Vec<Finding>,
}

impl Verdict {
    /// Whether the request may proceed.
    pub fn allowed(&self) -> bool {
        self.violations.is_empty()
    }

    /// Every violation, one per line, for the admission response message.
    pub fn message(&self) -> String {
        let mut out = String::new();
        for (i, v) in self.violations.iter().enumerate() {
            if i > 0 {
                out.push_str("; ");
            }
            out.push_str(&v.to_string());
        }
        out
    }

    /// The rule ids of the violations, deduplicated and sorted (for metrics).
    pub fn violated_rules(&self) -> Vec<RuleId> {
        let mut rules: Vec<RuleId> = self.violations.iter().map(|v| v.rule).collect();
        rules.sort();
        rules.dedup();
        rules
    }

    /// A violation at `path`; its JSON pointer is derived from it ([`pointer_of`]).
    pub(super) fn violation(&mut self, rule: RuleId, path: &str, value: String, message: String) {
        self.violations.push(Finding::new(rule, path, value, message));
    }

    /// A warning at `path`; its JSON pointer is derived from it ([`pointer_of`]).
    pub(super) fn warning(&mut self, rule: RuleId, path: &str, value: String, message: String) {
        self.warnings.push(Finding::new(rule, path, value, message));
    }

    /// The same findings with each path under `from` (such as `spec.`) moved under `to` (such as
    /// `spec.template.`): a pool's template is judged by the SmolVM rules, whose paths it shares
    /// below `spec`.
    pub(super) fn moved(mut self, from: &str, to: &str) -> Self {
        for finding in self.violations.iter_mut().chain(self.warnings.iter_mut()) {
            if let Some(rest) = finding.path.strip_prefix(from) {
                finding.path = format!("{to}{rest}");
                finding.pointer = pointer_of(&finding.path);
            }
        }
        self
    }

    /// Every finding of `other` added after these.
    pub fn extend(&mut self, other: Verdict) {
        self.violations.extend(other.violations);
        self.warnings.extend(other.warnings);
    }

    /// A list at `path` with more `noun` than the policy field `limit` (value `max`) allows.
    pub(super) fn too_many(&mut self, rule: RuleId, path: &str, noun: &str, count: usize, max: i64, limit: &str) {
        if count as i64 > max {
            self.violation(
                rule,
                path,
                format!("{count} {noun}"),
                format!("{count} {noun} exceed the maximum {max} (policy {limit})"),
            );
        }
    }

    /// A value at `path` longer than `max` bytes (policy maxValueBytes). Never echoes the value.
    pub(super) fn too_long(&mut self, rule: RuleId, path: &str, len: usize, max: usize) {
        if len > max {
            self.violation(
                rule,
                path,
                format!("{len} bytes"),
                format!("{len} bytes exceed the maximum {max} (policy maxValueBytes)"),
            );
        }
    }

    /// `value` at `path`, when `check` refuses it, shown with the reason.
    pub(super) fn invalid(&mut self, rule: RuleId, path: &str, value: &str, check: fn(&str) -> Result<(), String>) {
        if let Err(reason) = check(value) {
            self.violation(rule, path, render(value), format!("{} {reason}", render(value)));
        }
    }

    /// Each entry of the list at `path` that `check` refuses, shown with the reason.
    pub(super) fn each_invalid(
        &mut self,
        rule: RuleId,
        path: &str,
        entries: &[String],
        check: fn(&str) -> Result<(), String>,
    ) {
        for (i, entry) in entries.iter().enumerate() {
            self.invalid(rule, &format!("{path}[{i}]"), entry, check);
        }
    }
}

/// A field path as a JSON pointer (RFC 6901): `spec.env[2].name` is `/spec/env/2/name`, and a
/// map key in brackets, bare or as a JSON string, is one escaped segment:
/// `metadata.annotations[vm.smolvm.dev/force-delete]` is
/// `/metadata/annotations/vm.smolvm.dev~1force-delete`, `spec.nodeSelector["a/b"]` is
/// `/spec/nodeSelector/a~1b`.
///
/// The path is the one form the rules write (it is what users read); the pointer, which tells a
/// new violation from one the stored object already had, is derived here rather than written
/// beside it, so the two never disagree.
pub(super) fn pointer_of(path: &str) -> String {
    fn push(out: &mut String, segment: &str) {
        out.push('/');
        for c in segment.chars() {
            match c {
                '~' => out.push_str("~0"),
                '/' => out.push_str("~1"),
                c => out.push(c),
            }
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(tail) = rest.strip_prefix('.') {
            rest = tail;
        } else if let Some(tail) = rest.strip_prefix('[') {
            // A quoted key is a JSON string (it may hold `]`); anything else runs to the `]`.
            let mut quoted = serde_json::Deserializer::from_str(tail).into_iter::<String>();
            let (key, used) = match (tail.starts_with('"'), quoted.next()) {
                (true, Some(Ok(key))) => (key, quoted.byte_offset()),
                _ => {
                    let end = tail.find(']').unwrap_or(tail.len());
                    (tail[..end].to_string(), end)
                }
            };
            push(&mut out, &key);
            rest = tail[used..].strip_prefix(']').unwrap_or(&tail[used..]);
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            push(&mut out, &rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

/// A value as a finding shows it: its JSON.
pub(super) fn render<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// A value as a finding on a field shows it: a scalar as JSON, a list or object by its size (its
/// contents may be long, or secret).
pub(super) fn shown_value(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Array(items) => format!("{} entries", items.len()),
        Value::Object(members) => format!("{} field(s)", members.len()),
        Value::String(s) if s.len() > 256 => format!("{} bytes", s.len()),
        scalar => scalar.to_string(),
    }
}

/// A name as a finding shows it, or `none`.
pub(super) fn shown_name(name: Option<&str>) -> String {
    name.map(render).unwrap_or_else(|| "none".into())
}

/// The top-level fields that differ between two specs, besides those `ignored`, sorted.
pub(super) fn changed_fields<T: serde::Serialize>(old: &T, new: &T, ignored: &[&str]) -> Vec<String> {
    use serde_json::Value;
    let (Ok(Value::Object(old)), Ok(Value::Object(new))) = (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    let mut fields: Vec<String> = old.keys().chain(new.keys()).cloned().collect();
    fields.sort();
    fields.dedup();
    fields.retain(|f| !ignored.contains(&f.as_str()) && old.get(f) != new.get(f));
    fields
}

#[cfg(test)]
mod tests {
    use super::pointer_of;

    #[test]
    fn field_paths_become_json_pointers() {
        for (path, pointer) in [
            ("spec.env", "/spec/env"),
            ("object", "/object"),
            ("spec.network.ports[1].hostPort", "/spec/network/ports/1/hostPort"),
            (
                "metadata.annotations[vm.smolvm.dev/force-delete]",
                "/metadata/annotations/vm.smolvm.dev~1force-delete",
            ),
            ("spec.nodeSelector[\"a/b~c\"]", "/spec/nodeSelector/a~1b~0c"),
            ("spec.nodeSelector[\"x]y\"]", "/spec/nodeSelector/x]y"),
            ("spec.env[2].name", "/spec/env/2/name"),
            ("spec.network.allowedHosts[0]", "/spec/network/allowedHosts/0"),
            ("spec.command[12]", "/spec/command/12"),
        ] {
            assert_eq!(pointer_of(path), pointer, "{path}");
        }
    }
}
