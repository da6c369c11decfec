//! The machine a pool's slot is ([`slot_vm`]): its template filled as admission fills a SmolVM
//! that names the pool.

use kube::ResourceExt;
use serde_json::json;
use smolvm_api::{SmolVM, SmolVMPool, class::ClassCatalog, defaulting::default_pooled_smolvm, validate::Operation};

/// The SmolVM a slot of `pool` is: the template, its class's defaults and the built-in ones, as
/// admission fills a SmolVM that names the pool (M4, M3, M1). `Err` says why it cannot be built.
pub fn slot_vm(pool: &SmolVMPool, classes: &dyn ClassCatalog) -> Result<SmolVM, String> {
    let object = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1",
        "kind": "SmolVM",
        "metadata": {"name": pool.name_any(), "namespace": pool.namespace()},
        "spec": {"poolRef": {"name": pool.name_any()}}
    });
    let patch = default_pooled_smolvm(Operation::Create, &object, pool, classes);
    let mut filled = object;
    json_patch::patch(&mut filled, &patch).map_err(|e| format!("the template does not apply: {e}"))?;
    serde_json::from_value(filled).map_err(|e| format!("the template does not make a SmolVM: {e}"))
}
