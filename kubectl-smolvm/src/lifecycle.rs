//! `kubectl smolvm start|stop|restart`: merge patches on the SmolVM itself, reported the way
//! kubectl reports a change (`smolvm.vm.smolvm.dev/web stopped`).

use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::cli::GlobalArgs;
use crate::client::Cluster;
use crate::error::Error;
use crate::paths::{check_name, display_name};

/// The annotation that asks the controller for one restart; its value is the time of asking.
pub const RESTART_ANNOTATION: &str = "vm.smolvm.dev/restart-requested-at";

/// What `spec.running` says, `true` when it is absent (the default).
pub fn running_of(smolvm: &DynamicObject) -> bool {
    smolvm
        .data
        .pointer("/spec/running")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// The merge patch that sets `spec.running`.
pub fn running_patch(running: bool) -> Value {
    json!({ "spec": { "running": running } })
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

/// What is printed after a start or stop: `smolvm.vm.smolvm.dev/web started`, with
/// ` (no change)` when it already was.
pub fn report(name: &str, running: bool, changed: bool) -> String {
    let verb = if running { "started" } else { "stopped" };
    let suffix = if changed { "" } else { " (no change)" };
    format!("{} {verb}{suffix}", display_name(name))
}

/// Sets `spec.running` to `running`, unless it already is.
pub async fn set_running(global: &GlobalArgs, name: &str, running: bool) -> Result<(), Error> {
    check_name(name)?;
    let cluster = Cluster::connect(global).await?;
    let current = cluster.get_smolvm(name).await?;
    let changed = running_of(&current) != running;
    if changed {
        cluster.merge_patch_smolvm(name, &running_patch(running)).await?;
    }
    println!("{}", report(name, running, changed));
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
    fn patches() {
        assert_eq!(running_patch(false), json!({ "spec": { "running": false } }));
        assert_eq!(running_patch(true).to_string(), r#"{"spec":{"running":true}}"#);
        assert_eq!(
            restart_patch("2025-06-01T12:00:00Z"),
            json!({ "metadata": { "annotations": { "vm.smolvm.dev/restart-requested-at": "2025-06-01T12:00:00Z" } } })
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
        let cases = [
            (true, true, "smolvm.vm.smolvm.dev/web started"),
            (false, true, "smolvm.vm.smolvm.dev/web stopped"),
            (true, false, "smolvm.vm.smolvm.dev/web started (no change)"),
            (false, false, "smolvm.vm.smolvm.dev/web stopped (no change)"),
        ];
        for (running, changed, want) in cases {
            assert_eq!(report("web", running, changed), want);
        }
    }
}
