//! Quota at admission (rule V15, SPEC 6.3): a SmolVM's write that raises its namespace's usage is
//! charged to the namespace's ResourceQuotas before it is admitted, and refused in
//! kube-apiserver's own words beyond a limit.
//!
//! Charged once, by the validating review, on the final object (the mutating review never
//! charges); a dry run is judged the same and never charged (the webhook configuration says
//! `sideEffects: NoneOnDryRun`). The quotas come from a watch ([`Quotas`]); a namespace without a
//! quota naming the product's keys costs the review nothing more than one atomic load, and one
//! with such a quota costs one more API write per charge ([`smolvm_kit::quota::Charger`]).
//!
//! What a write asks ([`charge_of`]) is pure: the growth of [`smolvm_api::quota::usage`] from
//! the old object to the new one. A pooled SmolVM created while its pool holds a ready slot asks
//! nothing: that slot's charge (made by the controller's pool keeper when it started the slot)
//! moves to it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::runtime::reflector::Store;
use serde::Deserialize;
use smolvm_api::validate::RuleId;
use smolvm_api::{
    NodeResources, SmolVMSpec,
    pool::PoolCatalog,
    quota::{Limits, increase, usage},
};
use smolvm_kit::quota::{ChargeError, Charger};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::review::{Outcome, Reviewed, Route, refusal};

/// The namespaces' ResourceQuotas as a watch keeps them, and the charger.
pub struct Quotas {
    store: Store<ResourceQuota>,
    /// The namespaces with a quota that names a product key, rebuilt at each change of the
    /// watch ([`Quotas::refresh`]).
    namespaces: RwLock<HashSet<String>>,
    /// Whether any namespace has one: the one load a review pays where none does.
    any: AtomicBool,
    charger: Charger,
}

impl Quotas {
    /// Quotas read from `store` and charged through `charger`.
    pub fn new(store: Store<ResourceQuota>, charger: Charger) -> Self {
        Quotas {
            store,
            namespaces: RwLock::default(),
            any: AtomicBool::new(false),
            charger,
        }
    }

    /// Rebuilds which namespaces have a quota naming a product key (after each watch event).
    pub fn refresh(&self) {
        let quotas = self.store.state();
        let namespaces: HashSet<String> = quotas
            .iter()
            .filter(|q| Limits::of(q).is_some())
            .filter_map(|q| q.metadata.namespace.clone())
            .collect();
        let live: HashSet<String> = quotas
            .iter()
            .map(|q| {
                format!(
                    "{}/{}",
                    q.metadata.namespace.as_deref().unwrap_or(""),
                    q.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect();
        self.charger.retain(&live);
        self.any.store(!namespaces.is_empty(), Ordering::Release);
        *self.namespaces.write().unwrap_or_else(|e| e.into_inner()) = namespaces;
    }

    /// Whether any namespace has a quota naming a product key.
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Whether `namespace` has a quota naming a product key.
    pub fn limits(&self, namespace: &str) -> bool {
        self.namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(namespace)
    }

    /// Charges `charge` to its namespace's quotas.
    pub async fn charge(&self, charge: &Charge) -> Result<smolvm_kit::quota::Charged, ChargeError> {
        let quotas: Vec<Arc<ResourceQuota>> = self
            .store
            .state()
            .into_iter()
            .filter(|q| q.metadata.namespace.as_deref() == Some(charge.namespace.as_str()))
            .collect();
        self.charger
            .charge(&charge.namespace, quotas, &charge.requested, charge.dry_run)
            .await
    }
}

/// What one admission request asks of its namespace's quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The request's uid (echoed in the answer).
    pub uid: String,
    /// The SmolVM's namespace.
    pub namespace: String,
    /// A dry run: judged, never written.
    pub dry_run: bool,
    /// The growth of the namespace's usage.
    pub requested: NodeResources,
}

#[derive(Deserialize)]
struct Envelope {
    request: Request,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(default)]
    object: Option<Object>,
    #[serde(default)]
    old_object: Option<Object>,
}

#[derive(Deserialize)]
struct Object {
    spec: SmolVMSpec,
}

/// Only the namespace, for the quick look of [`namespace_of`].
#[derive(Deserialize)]
struct NamespaceEnvelope {
    request: NamespaceOnly,
}

#[derive(Deserialize)]
struct NamespaceOnly {
    #[serde(default)]
    namespace: Option<String>,
}

/// The namespace of an admission request's body, without decoding its objects.
pub fn namespace_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<NamespaceEnvelope>(body)
        .ok()
        .and_then(|e| e.request.namespace)
}

/// What the admitted write in `body` (a SmolVM's CREATE or UPDATE, already judged valid) asks of
/// its namespace's quotas, with `pools` to tell a pooled SmolVM whose pool holds a ready slot:
/// `Ok(None)` when it raises nothing. `Err` when the body does not hold SmolVMs after all.
pub fn charge_of(body: &[u8], pools: &dyn PoolCatalog) -> Result<Option<Charge>, serde_json::Error> {
    let Envelope { request } = serde_json::from_slice(body)?;
    let Some(new) = request.object else { return Ok(None) };
    let namespace = request.namespace.unwrap_or_default();
    let new_usage = usage(&new.spec);
    let requested = match &request.old_object {
        Some(old) => increase(Some(&usage(&old.spec)), &new_usage),
        None if moves_a_ready_slot(&new.spec, &namespace, pools) => NodeResources::default(),
        None => new_usage,
    };
    if requested == NodeResources::default() {
        return Ok(None);
    }
    Ok(Some(Charge {
        uid: request.uid,
        namespace,
        dry_run: request.dry_run.unwrap_or(false),
        requested,
    }))
}

/// Whether a SmolVM created from `spec` is served from a ready slot of its pool, whose charge
/// moves to it: its pool reports one ready.
fn moves_a_ready_slot(spec: &SmolVMSpec, namespace: &str, pools: &dyn PoolCatalog) -> bool {
    spec.pool_ref
        .as_ref()
        .and_then(|r| pools.pool(namespace, &r.name))
        .and_then(|p| p.status.and_then(|s| s.ready_slots))
        .is_some_and(|ready| ready > 0)
}

/// Whether a review on `route` with `outcome` is one that charges: an admitted CREATE or UPDATE
/// of a SmolVM (not its status, which the webhook does not intercept).
pub fn charges(route: Route, outcome: &Outcome) -> bool {
    route == Route::ValidateSmolVM
        && outcome.resource == "smolvms"
        && outcome.verdict == "allowed"
        && matches!(outcome.operation, "CREATE" | "UPDATE")
}

/// The longest a charge may take, its writes and conflicts' reads included; past it the write is
/// refused (the API server gives the webhook call 10 s, the shipped configuration 5 s).
pub const CHARGE_TIMEOUT: Duration = Duration::from_secs(4);

/// Charges the admitted write `reviewed` (from `body`) to its namespace's quotas: `reviewed` as
/// it is when nothing is to be charged or the charge was made, else its refusal (403 with
/// kube-apiserver's words when a limit would be exceeded; 500 when the quota could not be
/// updated, which the user may retry).
pub async fn settle(
    quotas: &Quotas,
    pools: &(dyn PoolCatalog + Send + Sync),
    metrics: &Metrics,
    body: &[u8],
    reviewed: Reviewed,
) -> Reviewed {
    let Some(namespace) = namespace_of(body) else {
        return reviewed;
    };
    if !quotas.limits(&namespace) {
        return reviewed;
    }
    let charge = match charge_of(body, pools) {
        Ok(Some(charge)) => charge,
        Ok(None) => return reviewed,
        Err(error) => {
            let message = format!("cannot read the SmolVM to charge its namespace's quota: {error}");
            return refused(reviewed, 500, "InternalError", &message);
        }
    };
    let charged = tokio::time::timeout(CHARGE_TIMEOUT, quotas.charge(&charge)).await;
    match charged {
        Ok(Ok(charged)) => {
            if charge.dry_run {
                metrics.observe_quota("judged", charged.conflicts);
            } else if !charged.quotas.is_empty() {
                metrics.observe_quota("charged", charged.conflicts);
            }
            reviewed
        }
        Ok(Err(error)) => {
            metrics.observe_quota(error.reason(), 0);
            match error {
                ChargeError::Exceeded(exceeded) => refused(reviewed, 403, "Forbidden", &exceeded.message),
                other => {
                    tracing::warn!(namespace = %charge.namespace, reason = other.reason(), error = %other, "quota charge failed; the write is refused");
                    refused(reviewed, 500, "InternalError", &other.to_string())
                }
            }
        }
        Err(_) => {
            metrics.observe_quota("QuotaBusy", 0);
            let message = format!(
                "cannot charge the quotas of namespace {}: no answer within {}s; try again",
                charge.namespace,
                CHARGE_TIMEOUT.as_secs()
            );
            refused(reviewed, 500, "InternalError", &message)
        }
    }
}

/// `reviewed` turned into a refusal (rule V15).
fn refused(mut reviewed: Reviewed, code: u16, reason: &'static str, message: &str) -> Reviewed {
    match refusal(&reviewed.outcome.uid, code, reason, message) {
        Ok(body) => {
            reviewed.body = body;
            reviewed.outcome.verdict = "denied";
            reviewed.outcome.rules = vec![RuleId::V15];
        }
        // Encoding a refusal fails only on text JSON cannot carry; never admit uncharged.
        Err(error) => {
            tracing::error!(%error, "cannot encode a quota refusal");
            reviewed.body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false}}"#.to_vec();
            reviewed.outcome.verdict = "denied";
        }
    }
    reviewed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use smolvm_api::{SmolVMPool, pool::SmolVMPoolStatus};

    fn body(operation: &str, object: serde_json::Value, old: serde_json::Value, dry_run: bool) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "namespace": "team-a", "operation": operation, "dryRun": dry_run,
                "object": object, "oldObject": old,
            }
        }))
        .unwrap_or_default()
    }

    fn vm(cpus: i32, memory: i64, suspended: bool) -> serde_json::Value {
        json!({"spec": {"image": "alpine", "running": true, "suspended": suspended,
            "resources": {"cpus": cpus, "memoryMiB": memory},
            "storage": {"storageGiB": 20, "overlayGiB": 10}}})
    }

    fn pool(ready: i32) -> SmolVMPool {
        let mut pool = SmolVMPool::new("warm", Default::default());
        pool.metadata.namespace = Some("team-a".into());
        pool.status = Some(SmolVMPoolStatus {
            ready_slots: Some(ready),
            ..Default::default()
        });
        pool
    }

    #[test]
    fn what_a_write_asks_of_its_quota() {
        let none: Vec<SmolVMPool> = Vec::new();
        let r = |cpus, memory_mib, storage_gib| NodeResources {
            cpus,
            memory_mib,
            storage_gib,
        };
        let pooled = json!({"spec": {"image": "alpine", "poolRef": {"name": "warm"},
            "resources": {"cpus": 2, "memoryMiB": 1024}}});
        // (case, body, what it asks and whether a dry run)
        type Row = (&'static str, Vec<u8>, Option<(NodeResources, bool)>);
        let table: Vec<Row> = vec![
            (
                "create",
                body("CREATE", vm(2, 1024, false), json!(null), false),
                Some((r(2, 1024, 30), false)),
            ),
            (
                "dry-run create",
                body("CREATE", vm(2, 1024, false), json!(null), true),
                Some((r(2, 1024, 30), true)),
            ),
            (
                "grow",
                body("UPDATE", vm(4, 1024, false), vm(2, 1024, false), false),
                Some((r(2, 0, 0), false)),
            ),
            (
                "shrink",
                body("UPDATE", vm(1, 512, false), vm(2, 1024, false), false),
                None,
            ),
            (
                "unchanged",
                body("UPDATE", vm(2, 1024, false), vm(2, 1024, false), false),
                None,
            ),
            // A suspend gives CPU and memory back and adds the saved memory as disk.
            (
                "suspend",
                body("UPDATE", vm(2, 2048, true), vm(2, 2048, false), false),
                Some((r(0, 0, 2), false)),
            ),
            // A resume takes them again.
            (
                "resume",
                body("UPDATE", vm(2, 2048, false), vm(2, 2048, true), false),
                Some((r(2, 2048, 0), false)),
            ),
            (
                "pooled, none ready",
                body("CREATE", pooled.clone(), json!(null), false),
                Some((r(2, 1024, 30), false)),
            ),
        ];
        for (name, body, want) in table {
            let got = charge_of(&body, &none).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got.map(|c| (c.requested, c.dry_run)), want, "{name}");
        }
        // A ready slot's charge moves to the pooled SmolVM it serves.
        let ready = vec![pool(3)];
        assert_eq!(
            charge_of(&body("CREATE", pooled.clone(), json!(null), false), &ready).ok(),
            Some(None)
        );
        let drained = vec![pool(0)];
        assert!(matches!(
            charge_of(&body("CREATE", pooled, json!(null), false), &drained),
            Ok(Some(_))
        ));
    }

    #[test]
    fn the_namespace_is_read_without_the_objects() {
        let b = body("CREATE", vm(1, 512, false), json!(null), false);
        assert_eq!(namespace_of(&b).as_deref(), Some("team-a"));
        assert_eq!(namespace_of(b"not json"), None);
    }
}
