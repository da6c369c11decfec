//! A branch (SPEC 2.6): what it finds of its source ([`source_of`]), where it may go
//! ([`BranchSource::node`]) and whether its create can be the branch of the running source now
//! ([`branch_call`]). Pure: the source is observed once per pass
//! ([`crate::vm::branched::source_of`]), the branch made by act, and the `BranchPending` reason
//! comes back in the pass's outcome.

use kube::{ResourceExt, runtime::reflector::ObjectRef};
use smolvm_api::{
    BranchedFrom, Phase, SmolVM,
    constants::{ANNOTATION_BRANCH_OF_UID, LABEL_BRANCH_OF},
};

/// What a branch finds of its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BranchSource {
    /// It is no branch (or its machine was made already: a branch is branched once).
    None,
    /// Its source cannot give it a machine: gone, made again under the same name, or no longer a
    /// branch source. The message says which.
    Lost(String),
    /// Its source is not placed yet: the branch waits, unplaced.
    Unplaced(String),
    /// Its source is bound to `node`; `running` when its machine runs there (only a running
    /// machine can be branched).
    Bound {
        /// The source's name and UID, for `status.branchedFrom`.
        from: BranchedFrom,
        /// The source's node.
        node: String,
        /// The source's machine there.
        machine: String,
        /// Whether it runs.
        running: bool,
    },
}

/// What `vm`, a branch of `source` (as read now; `None` when there is no such SmolVM), finds of
/// it: the source its admission recorded (its UID in `vm.smolvm.dev/branch-of-uid`), bound and
/// running, or why not. Pure.
pub fn source_of(vm: &SmolVM, source: Option<&SmolVM>) -> BranchSource {
    let Some(name) = vm.spec.source() else {
        return BranchSource::None;
    };
    let Some(source) = source else {
        return BranchSource::Lost(format!(
            "its source SmolVM {name} is gone: a branch is made only from its running source; delete this branch"
        ));
    };
    let recorded = vm.annotations().get(ANNOTATION_BRANCH_OF_UID);
    let uid = source.uid().unwrap_or_default();
    if recorded.is_some_and(|r| *r != uid) {
        return BranchSource::Lost(format!(
            "its source SmolVM {name} was deleted and made again after this branch was admitted: the new one is never branched for it; delete this branch"
        ));
    }
    if source.is_deleting() {
        return BranchSource::Lost(format!(
            "its source SmolVM {name} is being deleted: it is branched no more; delete this branch"
        ));
    }
    if !source.spec.branchable() {
        return BranchSource::Lost(format!("its source SmolVM {name} is not branchable"));
    }
    let status = source.status.as_ref();
    let (Some(node), Some(machine)) = (source.bound_node(), source.machine_name()) else {
        return BranchSource::Unplaced(format!(
            "waits for its source SmolVM {name} to be placed and to run: a branch goes on its source's node"
        ));
    };
    BranchSource::Bound {
        from: BranchedFrom {
            name: name.to_string(),
            uid,
        },
        node: node.to_string(),
        machine,
        running: status.and_then(|s| s.phase) == Some(Phase::Running),
    }
}

impl BranchSource {
    /// Whether the SmolVM is a branch whose machine is still to be branched.
    pub fn is_branch(&self) -> bool {
        !matches!(self, BranchSource::None)
    }

    /// The node a branch may go to: its source's, once the source is bound; `Err` with why it
    /// cannot be placed yet. `Ok(None)` for a SmolVM that is no branch.
    pub fn node(&self) -> Result<Option<&str>, &str> {
        match self {
            BranchSource::None => Ok(None),
            BranchSource::Lost(why) | BranchSource::Unplaced(why) => Err(why),
            BranchSource::Bound { node, .. } => Ok(Some(node)),
        }
    }
}

/// The branch's create, once placed on `node`: the branch of the running source's machine
/// there, with the source's name and UID; or (`Err`) why it waits. Pure.
pub fn branch_call<'s>(source: &'s BranchSource, node: &str) -> Result<(&'s str, &'s BranchedFrom), String> {
    match source {
        BranchSource::Bound {
            from,
            node: at,
            machine,
            running,
        } => {
            if at != node {
                Err(format!(
                    "its source SmolVM {} is on node {at}, not on this branch's node {node}: branches are node-local; delete this branch",
                    from.name
                ))
            } else if !running {
                Err(format!(
                    "waits for its source SmolVM {} to run on node {node}: only a running machine can be branched",
                    from.name
                ))
            } else {
                Ok((machine, from))
            }
        }
        BranchSource::Lost(why) | BranchSource::Unplaced(why) => Err(why.clone()),
        BranchSource::None => Err("it is no branch".into()),
    }
}

/// Whether `vm` is a branch of `source`: in its namespace, labelled with its name and naming it
/// in `branchOf`, and admitted for this very source (the UID its admission recorded, when it
/// recorded one). Pure.
pub fn is_branch_of(vm: &SmolVM, source: &SmolVM) -> bool {
    let name = source.name_any();
    vm.namespace() == source.namespace()
        && vm.labels().get(LABEL_BRANCH_OF) == Some(&name)
        && vm.spec.source() == Some(name.as_str())
        && vm
            .annotations()
            .get(ANNOTATION_BRANCH_OF_UID)
            .is_none_or(|recorded| Some(recorded) == source.uid().as_ref())
}

/// Of `vms`, the branches of `source` ([`is_branch_of`]) that wait for it (not made yet), once
/// it is a branch source that runs; none otherwise. Pure.
pub fn waiting_on<'a>(vms: impl IntoIterator<Item = &'a SmolVM>, source: &SmolVM) -> Vec<ObjectRef<SmolVM>> {
    let running = source.status.as_ref().and_then(|s| s.phase) == Some(Phase::Running);
    if !source.spec.branchable() || !running {
        return Vec::new();
    }
    vms.into_iter()
        .filter(|vm| is_branch_of(vm, source))
        .filter(|vm| vm.status.as_ref().is_none_or(|s| s.branched_from.is_none()))
        .map(ObjectRef::from_obj)
        .collect()
}
