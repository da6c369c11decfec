//! Status by server-side apply: a status field the controller no longer sets leaves the stored
//! status, for a SmolVM whose status this release wrote and for one whose status the previous
//! release wrote (JSON merge patches and a replace, recorded by the API server as an `Update` of
//! the `status` subresource by the same field manager, which the controller takes over once).
//!
//! In both, the field is written here as the controller's manager would have written it: by an
//! apply of the whole status under `smolvm-controller` (this release), or by a merge patch under
//! it (the previous release). The controller's next pass, which these writes wake, decides a
//! status without it; with a merge patch of its status, as before, the field would stay.

use std::time::Duration;

use anyhow::{anyhow, ensure};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use smolvm_api::{SmolVM, constants::FIELD_MANAGER_CONTROLLER};
use smolvm_tests::env::Env;

use crate::{NS, Scenario, delete_and_wait, kubectl_apply, small, vm, vms, wait_vm};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![a_status_field_the_controller_no_longer_sets_leaves_the_stored_status]
}

/// The field written here: a VM without published ports has no `status.ports`.
const STRAY: &str = "1->2/TCP";

/// The status entries of `vm`'s managedFields: (manager, operation).
fn status_entries(vm: &SmolVM) -> Vec<(String, String)> {
    vm.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e: &&ManagedFieldsEntry| e.subresource.as_deref() == Some("status"))
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Creates `name` (stopped, without ports) and waits for its binding: the controller has
/// applied its status.
async fn bound(env: &Env, name: &str) -> anyhow::Result<SmolVM> {
    kubectl_apply(env, &vm(name, small(false)))?.map_err(|e| anyhow!("applying {name}: {e}"))?;
    wait_vm(env, name, "bound", Duration::from_secs(60), |v| {
        v.status.as_ref().is_some_and(|s| s.node_name.is_some())
    })
    .await
}

/// Waits until the stray field is gone from `name`'s stored status and only the controller's
/// apply owns status fields there; the binding is unchanged.
async fn stray_gone(env: &Env, name: &str, node: &Option<String>) -> anyhow::Result<SmolVM> {
    let gone = wait_vm(env, name, "status.ports gone", Duration::from_secs(60), |v| {
        v.status.as_ref().is_some_and(|s| s.ports.is_none())
    })
    .await?;
    let status = gone.status.clone().unwrap_or_default();
    ensure!(
        &status.node_name == node,
        "the binding changed: {:?} (was {node:?})",
        status.node_name
    );
    let entries = status_entries(&gone);
    ensure!(
        entries == vec![(FIELD_MANAGER_CONTROLLER.to_string(), "Apply".to_string())],
        "the status is owned by the controller's apply alone: {entries:?}"
    );
    Ok(gone)
}

pub(crate) async fn a_status_field_the_controller_no_longer_sets_leaves_the_stored_status(
    env: &mut Env,
) -> anyhow::Result<()> {
    let api: Api<SmolVM> = vms(env).await?;

    // This release: the status the controller applies, and an apply of it with one more field
    // under its manager (as one of its own passes would have set it).
    let name = "status-apply-new";
    let first = bound(env, name).await?;
    let entries = status_entries(&first);
    ensure!(
        entries.contains(&(FIELD_MANAGER_CONTROLLER.to_string(), "Apply".to_string()))
            && !entries.iter().any(|(_, operation)| operation == "Update"),
        "a new SmolVM's status is applied, never updated: {entries:?}"
    );
    let node = first.status.as_ref().and_then(|s| s.node_name.clone());
    let mut status = serde_json::to_value(first.status.clone().unwrap_or_default())?;
    status["ports"] = json!(STRAY);
    let body = json!({"apiVersion": smolvm_api::constants::API_VERSION, "kind": "SmolVM",
        "metadata": {"name": name, "namespace": NS}, "status": status});
    let written = api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER_CONTROLLER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    ensure!(
        written.status.as_ref().and_then(|s| s.ports.as_deref()) == Some(STRAY),
        "the stray field was written: {:?}",
        written.status
    );
    stray_gone(env, name, &node).await?;

    // The previous release: its merge patch of the status under the same manager (an Update
    // entry), which the controller's next apply takes over and then drops the field.
    let name = "status-apply-legacy";
    let first = bound(env, name).await?;
    let node = first.status.as_ref().and_then(|s| s.node_name.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER_CONTROLLER.into()),
        ..PatchParams::default()
    };
    let written = api
        .patch_status(name, &params, &Patch::Merge(json!({"status": {"ports": STRAY}})))
        .await?;
    let entries = status_entries(&written);
    ensure!(
        written.status.as_ref().and_then(|s| s.ports.as_deref()) == Some(STRAY)
            && entries.contains(&(FIELD_MANAGER_CONTROLLER.to_string(), "Update".to_string())),
        "the previous release's write: {:?}, {entries:?}",
        written.status
    );
    stray_gone(env, name, &node).await?;

    delete_and_wait(env, "status-apply-new").await?;
    delete_and_wait(env, "status-apply-legacy").await?;
    Ok(())
}
