//! The SmolVM's metadata writes, each a JSON patch with a `test` so that what another client
//! wrote meanwhile is never overwritten: the finalizer, added on the first pass and removed once
//! the machine is gone, and the annotations a pass is done with ([`super::decide::AnnotationDrop`]).

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use smolvm_api::{SmolVM, constants::FINALIZER};

use super::Context;
use super::Error;
use super::decide::AnnotationDrop;
use super::events::publish;

/// Adds the controller's finalizer.
pub(super) async fn add_finalizer(api: &Api<SmolVM>, vm: &SmolVM) -> Result<(), Error> {
    let patch = match &vm.metadata.finalizers {
        // The `test` that the list is still absent (a JSON patch `test` of a missing path
        // against null succeeds): a finalizer another client added meanwhile makes the patch
        // fail (and the reconcile retry) instead of being overwritten.
        None => json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
        ]),
        Some(_) => json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]),
    };
    json_patch(api, vm, patch).await?;
    Ok(())
}

/// Removes the controller's finalizer, only from where the pass saw it.
pub(super) async fn remove_finalizer(api: &Api<SmolVM>, vm: &SmolVM) -> Result<(), Error> {
    let Some(index) = vm.metadata.finalizers.iter().flatten().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let patch = json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")}
    ]);
    json_patch(api, vm, patch).await?;
    Ok(())
}

/// Drops an annotation the pass is done with, only while it still holds the value acted on, and
/// tells it.
pub(super) async fn drop_annotation(
    ctx: &Context,
    api: &Api<SmolVM>,
    vm: &SmolVM,
    drop: &AnnotationDrop,
) -> Result<(), Error> {
    let pointer = format!(
        "/metadata/annotations/{}",
        drop.key.replace('~', "~0").replace('/', "~1")
    );
    let patch = json!([
        {"op": "test", "path": pointer, "value": drop.value},
        {"op": "remove", "path": pointer}
    ]);
    let result = json_patch(api, vm, patch).await;
    match result {
        Ok(_) => {}
        // The test failed: a newer value replaced it; the next pass acts on that one.
        Err(Error::Kube(kube::Error::Api(s))) if drop.newer_may_replace && (s.code == 422 || s.code == 409) => {
            return Ok(());
        }
        Err(e) => return Err(e),
    }
    publish(ctx, vm, &drop.then).await;
    Ok(())
}

/// A JSON patch of the SmolVM object (its metadata: finalizers, annotations).
async fn json_patch(api: &Api<SmolVM>, vm: &SmolVM, patch: serde_json::Value) -> Result<SmolVM, Error> {
    let patch = Patch::Json::<()>(serde_json::from_value(patch)?);
    Ok(api.patch(&vm.name_any(), &PatchParams::default(), &patch).await?)
}
