//! `kubectl smolvm start|stop|suspend|resume|restart`: merge patches on the SmolVM itself,
//! reported the way kubectl reports a change (`smolvm.vm.smolvm.dev/web stopped`).

use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::cli::GlobalArgs;
use crate::client::Cluster;
use crate::error::Error;
use crate::paths::{check_name, display_name};

/// The annotation that asks the controller for one restart; its value is the time of asking.
pub const RESTART_ANNOTATION: &str = "vm.smolvm.dev/restart-requested-at";
/// The annotation that asks the controller to wake a SmolVM it suspended for idleness; its value
/// is the time of asking.
pub use smolvm_api::constants::WAKE_ANNOTATION;

/// A switch of the spec the plugin sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// `spec.running`: `start` and `stop`.
    Running,
    /// `spec.suspended`: `suspend` and `resume`.
    Suspended,
}

impl Switch {
    /// The field under `spec`.
    pub fn field(self) -> &'static str {
        match self {
            Switch::Running => "running",
            Switch::Suspended => "suspended",
        }
    }

    /// Its value when absent (the webhook's default).
    pub fn default_value(self) -> bool {
        matches!(self, Switch::Running)
    }

    /// The past tense kubectl-style reports use: `started`, `stopped`, `suspended`, `resumed`.
    pub fn done(self, on: bool) -> &'static str {
        match (self, on) {
            (Switch::Running, true) => "started",
            (Switch::Running, false) => "stopped",
            (Switch::Suspended, true) => "suspended",
            (Switch::Suspended, false) => "resumed",
        }
    }

    /// What the SmolVM's spec says, its default when absent.
    pub fn value_of(self, smolvm: &DynamicObject) -> bool {
        smolvm
            .data
            .get("spec")
            .and_then(|spec| spec.get(self.field()))
            .and_then(Value::as_bool)
            .unwrap_or(self.default_value())
    }

    /// The merge patch that sets it.
    pub fn patch(self, on: bool) -> Value {
        json!({ "spec": { self.field(): on } })
    }
}

/// What `spec.running` says, `true` when it is absent (the default).
pub fn running_of(smolvm: &DynamicObject) -> bool {
    Switch::Running.value_of(smolvm)
}

/// Whether the controller suspended the SmolVM for idleness (its Suspended condition says
/// `IdleSuspended`): `spec.suspended` is false, so `resume` asks for a wake instead.
pub fn idle_suspended(smolvm: &DynamicObject) -> bool {
    smolvm
        .data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Suspended")
                    && c.get("status").and_then(Value::as_str) == Some("True")
                    && c.get("reason").and_then(Value::as_str) == Some("IdleSuspended")
            })
        })
}

/// The merge patch that asks for a wake at `at` (RFC 3339).
pub fn wake_patch(at: &str) -> Value {
    json!({ "metadata": { "annotations": { WAKE_ANNOTATION: at } } })
}

/// The merge patch that asks for a restart at `at` (RFC 3339).
pub fn restart_patch(at: &str) -> Value {
    json!({ "metadata": { "annotations": { RESTART_ANNOTATION: at } } })
}

/// `at` in RFC 3339, UTC, to the second: `2025-06-01T12:00:00Z`.
pub fn rfc3339_seconds(at: jiff::Timestamp) -> String {
    // A whole second of a valid timestamp is itself valid; the fallback is never taken.
    jiff::Timestamp::from_second(at.as_second()).unwrap_or(at).to_string()
}

/// What is printed after a start, stop, suspend or resume: `smolvm.vm.smolvm.dev/web started`,
/// with ` (no change)` when it already was.
pub fn report(name: &str, switch: Switch, on: bool, changed: bool) -> String {
    let suffix = if changed { "" } else { " (no change)" };
    format!("{} {}{suffix}", display_name(name), switch.done(on))
}

/// Sets `spec.running` or `spec.suspended` to `on`, unless it already is. Suspending a SmolVM
/// whose `spec.running` is false is allowed (it is suspended once it runs), and said.
pub async fn set(global: &GlobalArgs, name: &str, switch: Switch, on: bool) -> Result<(), Error> {
    check_name(name)?;
    let cluster = Cluster::connect(global).await?;
    let current = cluster.get_smolvm(name).await?;
    if switch == Switch::Suspended && !on && idle_suspended(&current) {
        // The controller's suspension, not the user's: a wake, as the next connection would ask.
        let at = rfc3339_seconds(jiff::Timestamp::now());
        cluster.merge_patch_smolvm(name, &wake_patch(&at)).await?;
        println!("{} wake requested (it was suspended for idleness)", display_name(name));
        return Ok(());
    }
    let changed = switch.value_of(&current) != on;
    if changed {
        cluster.merge_patch_smolvm(name, &switch.patch(on)).await?;
    }
    println!("{}", report(name, switch, on, changed));
    if switch == Switch::Suspended && on && !running_of(&current) {
        eprintln!(
            "note: spec.running is false, so there is nothing to save: it is started and suspended once spec.running is true (kubectl smolvm start {name})"
        );
    }
    Ok(())
}

/// Asks the controller to restart a SmolVM that should be running.
pub async fn restart(global: &GlobalArgs, name: &str) -> Result<(), Error> {
    check_name(name)?;
    let cluster = Cluster::connect(global).await?;
    let current = cluster.get_smolvm(name).await?;
    if !running_of(&current) {
        return Err(Error::NotRunning {
            namespace: cluster.namespace().to_string(),
            name: name.to_string(),
        });
    }
    let at = rfc3339_seconds(jiff::Timestamp::now());
    cluster.merge_patch_smolvm(name, &restart_patch(&at)).await?;
    println!("{} restart requested", display_name(name));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smolvm(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "vm.smolvm.dev/v1alpha1",
            "kind": "SmolVM",
            "metadata": { "name": "web", "namespace": "default" },
            "spec": spec
        }))
        .expect("a SmolVM")
    }

    #[test]
    fn running_defaults_to_true() {
        let cases = [
            (json!({}), true),
            (json!({ "running": true }), true),
            (json!({ "running": false }), false),
            (json!({ "running": "no" }), true),
        ];
        for (spec, want) in cases {
            assert_eq!(running_of(&smolvm(spec.clone())), want, "{spec}");
        }
    }

    #[test]
    fn suspended_defaults_to_false() {
        let cases = [
            (json!({}), false),
            (json!({ "suspended": true }), true),
            (json!({ "suspended": false }), false),
            (json!({ "suspended": "yes" }), false),
        ];
        for (spec, want) in cases {
            assert_eq!(Switch::Suspended.value_of(&smolvm(spec.clone())), want, "{spec}");
        }
    }

    #[test]
    fn patches() {
        assert_eq!(Switch::Running.patch(false), json!({ "spec": { "running": false } }));
        assert_eq!(Switch::Running.patch(true).to_string(), r#"{"spec":{"running":true}}"#);
        assert_eq!(
            Switch::Suspended.patch(true).to_string(),
            r#"{"spec":{"suspended":true}}"#
        );
        assert_eq!(
            restart_patch("2025-06-01T12:00:00Z"),
            json!({ "metadata": { "annotations": { "vm.smolvm.dev/restart-requested-at": "2025-06-01T12:00:00Z" } } })
        );
    }

    #[test]
    fn resume_of_an_idle_suspension_is_a_wake() {
        let with = |conditions: Value| {
            let mut vm = smolvm(json!({}));
            vm.data["status"] = json!({ "conditions": conditions });
            vm
        };
        let cases = [
            (
                json!([{"type": "Suspended", "status": "True", "reason": "IdleSuspended"}]),
                true,
            ),
            (
                json!([{"type": "Suspended", "status": "True", "reason": "Suspended"}]),
                false,
            ),
            (
                json!([{"type": "Suspended", "status": "False", "reason": "IdleSuspended"}]),
                false,
            ),
            (
                json!([{"type": "Ready", "status": "True", "reason": "IdleSuspended"}]),
                false,
            ),
            (json!("nonsense"), false),
        ];
        for (conditions, want) in cases {
            assert_eq!(idle_suspended(&with(conditions.clone())), want, "{conditions}");
        }
        assert!(!idle_suspended(&smolvm(json!({}))), "no status");
        assert_eq!(
            wake_patch("2025-06-01T12:00:00Z"),
            json!({ "metadata": { "annotations": { "vm.smolvm.dev/wake-requested-at": "2025-06-01T12:00:00Z" } } })
        );
    }

    #[test]
    fn timestamps_are_whole_seconds_in_utc() {
        let at: jiff::Timestamp = "2025-06-01T12:34:56.789+02:00".parse().expect("a timestamp");
        assert_eq!(rfc3339_seconds(at), "2025-06-01T10:34:56Z");
        let at: jiff::Timestamp = "1970-01-01T00:00:00Z".parse().expect("a timestamp");
        assert_eq!(rfc3339_seconds(at), "1970-01-01T00:00:00Z");
        let now = rfc3339_seconds(jiff::Timestamp::now());
        assert_eq!((now.len(), now.ends_with('Z')), (20, true), "{now}");
    }

    #[test]
    fn reports_read_like_kubectl() {
        use Switch::{Running, Suspended};
        let cases = [
            (Running, true, true, "smolvm.vm.smolvm.dev/web started"),
            (Running, false, true, "smolvm.vm.smolvm.dev/web stopped"),
            (Running, true, false, "smolvm.vm.smolvm.dev/web started (no change)"),
            (Running, false, false, "smolvm.vm.smolvm.dev/web stopped (no change)"),
            (Suspended, true, true, "smolvm.vm.smolvm.dev/web suspended"),
            (Suspended, false, true, "smolvm.vm.smolvm.dev/web resumed"),
            (Suspended, false, false, "smolvm.vm.smolvm.dev/web resumed (no change)"),
        ];
        for (switch, on, changed, want) in cases {
            assert_eq!(report("web", switch, on, changed), want);
        }
    }
}
