//! The next step for a SmolVM, from the object alone ([`next_step`]): its finalizer, its
//! placement, its machine's convergence or deletion; and what to do about a machine its node does
//! not have ([`missing_machine`]), with the annotations that change both.

use smolvm_api::{
    SmolVM,
    constants::{
        FINALIZER, FORCE_DELETE_ANNOTATION, FORCE_DELETE_VALUE, RECREATE_LOST_MACHINE_ANNOTATION,
        RECREATE_LOST_MACHINE_VALUE,
    },
};

use super::machine::machine_name;

/// The next thing to do for a SmolVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Not being deleted and the finalizer is missing: add it first.
    AddFinalizer,
    /// Being deleted and nothing holds it on a node: remove the finalizer.
    RemoveFinalizer,
    /// Being deleted and bound: delete the machine on its node, then remove the finalizer.
    DeleteMachine {
        /// Bound node.
        node: String,
        /// Machine on it.
        machine: String,
        /// Whether the force-delete annotation allows removing the finalizer if the node cannot
        /// be reached.
        force: bool,
    },
    /// Being deleted, and the finalizer is already gone: nothing to do.
    Forget,
    /// Not bound: choose a node and bind.
    Place,
    /// Bound: bring the machine on the node in line with the spec.
    Converge {
        /// Bound node.
        node: String,
        /// Machine on it.
        machine: String,
    },
}

/// Decides the next step from the object alone.
pub fn next_step(vm: &SmolVM) -> Step {
    let has_finalizer = vm.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER);
    let bound = vm.bound_node().map(str::to_string);
    // Always the UID-derived name: a status write (which tenants may be allowed) must never
    // point a create or a delete at another VM's machine.
    let machine = machine_name(vm).unwrap_or_default();
    if vm.is_deleting() {
        if !has_finalizer {
            return Step::Forget;
        }
        return match bound {
            None => Step::RemoveFinalizer,
            Some(node) => Step::DeleteMachine {
                node,
                machine,
                force: force_delete(vm),
            },
        };
    }
    if !has_finalizer {
        return Step::AddFinalizer;
    }
    match bound {
        None => Step::Place,
        Some(node) => Step::Converge { node, machine },
    }
}

/// What to do about a machine the node does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingMachine {
    /// It was never seen on the node: create it.
    Create,
    /// The node reported it before (`status.effective` is set) and it is gone: report
    /// MachineLost and do not re-create an empty one behind the user's back.
    Lost,
    /// Lost, and the recreate-lost-machine annotation asks for a fresh machine.
    Recreate,
}

/// Judges a missing machine from the object alone.
pub fn missing_machine(vm: &SmolVM) -> MissingMachine {
    let seen = vm.status.as_ref().is_some_and(|s| s.effective.is_some());
    if !seen {
        return MissingMachine::Create;
    }
    if recreate_lost_machine(vm) {
        MissingMachine::Recreate
    } else {
        MissingMachine::Lost
    }
}

/// Whether the recreate-lost-machine annotation is set to exactly `"true"`.
pub fn recreate_lost_machine(vm: &SmolVM) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RECREATE_LOST_MACHINE_ANNOTATION))
        .map(String::as_str)
        == Some(RECREATE_LOST_MACHINE_VALUE)
}

/// Whether the force-delete annotation is set to exactly `"true"`.
pub fn force_delete(vm: &SmolVM) -> bool {
    vm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FORCE_DELETE_ANNOTATION))
        .map(String::as_str)
        == Some(FORCE_DELETE_VALUE)
}
