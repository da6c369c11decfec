//! The SmolVM's status writer, the report step of a pass: what a pass decided, written. The
//! Service and EndpointSlice first (a failure there becomes the ServiceExposed condition, so the
//! machine's own status is still written), then the volumes' claim and holder writes (a failure
//! there becomes VolumesReady), one status write (none when nothing changed), the events
//! ([`super::events`]), and the annotations the pass is done with ([`super::metadata`]). A
//! binding is written here too ([`write_binding`]), with the object's resourceVersion as
//! precondition.

use std::time::Duration;

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::controller::Action,
};
use smolvm_api::{SmolVM, constants::FIELD_MANAGER_CONTROLLER};

use crate::status_apply;

use super::decide::{ExposureWrite, Note, Outcome, Requeue};
use super::{Context, Error};

/// Writes an outcome and says when to look again.
pub async fn report(
    ctx: &Context,
    api: &Api<SmolVM>,
    vm: &SmolVM,
    uid: &str,
    mut outcome: Outcome,
) -> Result<Action, Error> {
    if let Some(hold) = outcome.hold {
        ctx.ledger.set_hold(uid, hold);
    }
    expose(ctx, vm, &mut outcome).await;
    mount(ctx, vm, &mut outcome).await;
    // One status write, skipped when nothing changed.
    if vm.status.as_ref() != Some(&outcome.status) {
        apply_status(ctx, api, vm, uid, &outcome.status).await?;
    }
    finish(ctx, api, vm, uid, outcome).await
}

/// Reports the first pass of a warm claim (`act::claim`), whose binding (`bound`, the SmolVM
/// as the pass read it with its binding status) is not written yet: the binding and the outcome
/// go in one status write ([`write_binding`]). The binding's own event is left out when the
/// pass's events already tell it ([`Outcome::tells_binding`]).
pub async fn report_binding(
    ctx: &Context,
    api: &Api<SmolVM>,
    uid: &str,
    binding: (&str, &Note),
    mut bound: SmolVM,
    mut outcome: Outcome,
) -> Result<Action, Error> {
    expose(ctx, &bound, &mut outcome).await;
    mount(ctx, &bound, &mut outcome).await;
    bound.status = Some(outcome.status.clone());
    let (node, note) = binding;
    let note = (!outcome.tells_binding()).then_some(note);
    let written = match write_binding(ctx, api, uid, (node, note), bound).await? {
        Ok(written) => written,
        Err(next) => return Ok(next),
    };
    if let Some(hold) = outcome.hold {
        ctx.ledger.set_hold(uid, hold);
    }
    finish(ctx, api, &written, uid, outcome).await
}

/// Writes a binding to `node`: `bound` is the SmolVM as the pass read it, with its binding
/// status, written with its resourceVersion as precondition, as a binding always is. Written,
/// it is booked on the node and its event (`note`, if any) published, and the object the API
/// server answered comes back; refused, its reservation goes and what the pass does next comes
/// back (after a conflict, someone changed the object first: it looks again shortly).
pub async fn write_binding(
    ctx: &Context,
    api: &Api<SmolVM>,
    uid: &str,
    (node, note): (&str, Option<&Note>),
    bound: SmolVM,
) -> Result<Result<SmolVM, Action>, Error> {
    let conflict = || Ok(Err(Action::requeue(Duration::from_millis(200))));
    let version = match take_over_once(ctx, api, &bound, uid).await {
        Ok(version) => version,
        Err(error) => {
            ctx.ledger.release(uid);
            return Err(error);
        }
    };
    // The fields were taken over from a newer version than the pass read: someone changed the
    // object first, and the binding must meet the version it was decided on.
    let Some(version) = version else {
        ctx.ledger.release(uid);
        return conflict();
    };
    let body = status_apply::apply_body::<SmolVM>(&bound.name_any(), Some(&version), &bound.status);
    match api
        .patch_status(&bound.name_any(), &status_apply::apply_params(), &Patch::Apply(&body))
        .await
    {
        Ok(written) => {
            ctx.superseded.replaced(uid, Some(&version));
            ctx.ledger.observe_vm(uid, node, &written);
            if let Some(note) = note {
                super::events::publish(ctx, &bound, note).await;
            }
            Ok(Ok(written))
        }
        Err(error) => {
            ctx.ledger.release(uid);
            match error {
                kube::Error::Api(s) if s.code == 409 => conflict(),
                e => Err(e.into()),
            }
        }
    }
}

/// Before the first apply to a SmolVM whose status the previous release wrote, takes its fields
/// over ([`status_apply`]). The version the apply then replaces: the pass's own when there was
/// nothing to take over (or the take-over failed), the take-over's when it took over the version
/// the pass read, `None` when the object had changed since.
async fn take_over_once(ctx: &Context, api: &Api<SmolVM>, vm: &SmolVM, uid: &str) -> Result<Option<String>, Error> {
    let read = vm.resource_version();
    if !status_apply::has_legacy_status(vm.meta()) {
        return Ok(read);
    }
    match status_apply::take_over_status(api, &vm.name_any()).await {
        Ok(None) => Ok(read),
        Ok(Some(taken)) => {
            ctx.superseded.replaced(uid, taken.read.as_deref());
            Ok(taken.written.filter(|_| taken.read == read))
        }
        // The take-over is not what the pass is for: its status is applied all the same (the
        // previous release's fields then stay co-owned until a later pass takes them over).
        Err(error) => {
            tracing::info!(vm = %vm.name_any(), %error, "taking over the previous release's status fields failed; applying the status all the same");
            Ok(read)
        }
    }
}

/// The Service and EndpointSlice writes; a failure becomes the ServiceExposed condition.
async fn expose(ctx: &Context, vm: &SmolVM, outcome: &mut Outcome) {
    if let Err(e) = write_exposure(ctx, vm, &outcome.exposure.writes).await {
        outcome.exposure_failed(vm, &super::describe_kube_error(&e), Timestamp::now());
    }
}

/// The claim and holder writes of the volumes; a failure becomes the VolumesReady condition.
async fn mount(ctx: &Context, vm: &SmolVM, outcome: &mut Outcome) {
    if let Err((write, error)) = super::volumes::kube::write(ctx, vm, &outcome.volumes).await {
        outcome.volume_write_failed(vm, &write, &super::describe_kube_error(&error), Timestamp::now());
    }
}

/// What follows the status write: the events, the annotations the pass is done with, and when
/// to look again.
async fn finish(ctx: &Context, api: &Api<SmolVM>, vm: &SmolVM, uid: &str, outcome: Outcome) -> Result<Action, Error> {
    for note in &outcome.events {
        if note.reason == smolvm_api::constants::reason::IDLE_SUSPENDED {
            ctx.metrics.idle_suspensions.inc();
        }
        super::events::publish(ctx, vm, note).await;
    }
    for drop in &outcome.drops {
        super::metadata::drop_annotation(ctx, api, vm, drop).await?;
    }
    if let Some(lifetime) = outcome.expire {
        expire(ctx, api, vm, uid, lifetime).await?;
    }
    let wait = match outcome.requeue {
        Requeue::AwaitChange => None,
        Requeue::Retry => Some(ctx.timing.retry),
        Requeue::Settled => {
            ctx.unsettled.reset(uid);
            Some(ctx.timing.resync)
        }
        // Still on its way (e.g. a runtime that does not report Running yet): look again with a
        // backoff, so a runtime that never settles is not hammered.
        Requeue::Unsettled => Some(ctx.unsettled.bump(uid)),
        Requeue::After(wait) => Some(wait),
    };
    // The next lifetime to pass is never looked at late; a second past it, so that it has.
    let due = outcome.due.map(|left| left + Duration::from_secs(1));
    Ok(match wait.into_iter().chain(due).min() {
        Some(wait) => Action::requeue(wait),
        None => Action::await_change(),
    })
}

/// Deletes a SmolVM whose lifetime passed (SPEC 2.7), this very object (its UID as
/// precondition): its finalizer then removes its machine as for any deletion. One gone already,
/// or made again under its name, is no failure.
async fn expire(ctx: &Context, api: &Api<SmolVM>, vm: &SmolVM, uid: &str, lifetime: &'static str) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&vm.name_any(), &params).await {
        Ok(_) => {
            ctx.metrics.expired(lifetime);
            tracing::info!(vm = %vm.name_any(), lifetime, "a lifetime passed; the SmolVM is deleted");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies `status` as the whole of the SmolVM's status the controller owns, by server-side
/// apply: a field it no longer sets leaves the stored status.
pub async fn apply_status(
    ctx: &Context,
    api: &Api<SmolVM>,
    vm: &SmolVM,
    uid: &str,
    status: &smolvm_api::SmolVMStatus,
) -> Result<(), Error> {
    let replaced = take_over_once(ctx, api, vm, uid)
        .await?
        .or_else(|| vm.resource_version());
    let body = status_apply::apply_body::<SmolVM>(&vm.name_any(), None, status);
    api.patch_status(&vm.name_any(), &status_apply::apply_params(), &Patch::Apply(&body))
        .await?;
    ctx.superseded.replaced(uid, replaced.as_deref());
    Ok(())
}

/// Carries out Service and EndpointSlice writes, in order; the first failure stops them.
pub async fn write_exposure(ctx: &Context, vm: &SmolVM, writes: &[ExposureWrite]) -> Result<(), kube::Error> {
    if writes.is_empty() {
        return Ok(());
    }
    let (name, namespace) = (vm.name_any(), vm.namespace().unwrap_or_default());
    let params = PatchParams::apply(FIELD_MANAGER_CONTROLLER).force();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &namespace);
    for write in writes {
        match write {
            ExposureWrite::ApplyService(service) => {
                services.patch(&name, &params, &Patch::Apply(service.as_ref())).await?;
            }
            ExposureWrite::ApplySlice(slice) => {
                slices.patch(&name, &params, &Patch::Apply(slice.as_ref())).await?;
            }
            ExposureWrite::DeleteSlice => ignore_missing(slices.delete(&name, &Default::default()).await.map(drop))?,
            ExposureWrite::DeleteService => {
                ignore_missing(services.delete(&name, &Default::default()).await.map(drop))?;
            }
        }
    }
    Ok(())
}

/// A delete whose object is already gone succeeded.
fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}
