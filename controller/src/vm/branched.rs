//! A branch (SPEC 2.6): its source observed ([`source_of`], once per pass, from the cache) for
//! placement, which puts it on its source's node only, and for decide, which makes its create
//! the branch of the running source's machine there (node API BranchMachine), or a wait
//! (`BranchPending`) while the source does not run ([`super::rules::branch_call`]). Its machine
//! is `svm-<uid>` as any SmolVM's.
//!
//! A branch source's deletion waits for its branches ([`live_branches`]): smolvm keeps a machine
//! while branches of it live, and refuses to delete it.

use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use smolvm_api::SmolVM;

pub use super::rules::{BranchSource, source_of as judge};

use super::{Context, Error};

/// What `vm` finds of the source it names, as [`judge`] says (from the cache, or the API server
/// for a source the cache does not hold yet). [`BranchSource::None`] for a SmolVM that is no
/// branch, or whose machine was made already.
pub async fn source_of(ctx: &Context, vm: &SmolVM) -> Result<BranchSource, Error> {
    let Some(name) = vm.spec.source() else {
        return Ok(BranchSource::None);
    };
    if vm.status.as_ref().is_some_and(|s| s.branched_from.is_some()) {
        return Ok(BranchSource::None);
    }
    let namespace = vm.namespace().unwrap_or_default();
    let cached = ctx.vms.get(&ObjectRef::new(name).within(&namespace));
    let source = match cached {
        Some(source) => Some((*source).clone()),
        None => {
            let api: Api<SmolVM> = Api::namespaced(ctx.client.clone(), &namespace);
            api.get_opt(name).await?
        }
    };
    Ok(judge(vm, source.as_ref()))
}

/// The names of the branches of `source` ([`super::rules::is_branch_of`]) that are in the
/// cache, sorted: their machines may live on its node.
pub fn live_branches(ctx: &Context, source: &SmolVM) -> Vec<String> {
    let mut names: Vec<String> = ctx
        .vms
        .state()
        .iter()
        .filter(|vm| super::rules::is_branch_of(vm, source))
        .map(|vm| vm.name_any())
        .collect();
    names.sort();
    names
}

/// The branches in the cache that wait for `source`, once it runs ([`super::rules::waiting_on`]):
/// their passes are woken, so that they are made at once rather than at their next look (1 s
/// doubling to 30 s).
pub fn waiting_on(ctx: &Context, source: &SmolVM) -> Vec<ObjectRef<SmolVM>> {
    if !source.spec.branchable() {
        return Vec::new();
    }
    let vms = ctx.vms.state();
    super::rules::waiting_on(vms.iter().map(|vm| vm.as_ref()), source)
}

/// Deletes the branches `names` of `source` (those not being deleted already), for its
/// `vm.smolvm.dev/delete-branches` annotation; one already gone is no failure.
pub async fn delete_branches(ctx: &Context, source: &SmolVM, names: &[String]) -> Result<(), Error> {
    let namespace = source.namespace().unwrap_or_default();
    let api: Api<SmolVM> = Api::namespaced(ctx.client.clone(), &namespace);
    for name in names {
        let deleting = ctx
            .vms
            .get(&ObjectRef::new(name).within(&namespace))
            .is_some_and(|vm| vm.is_deleting());
        if deleting {
            continue;
        }
        match api.delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
