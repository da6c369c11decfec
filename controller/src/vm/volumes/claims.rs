//! The claims of a SmolVM's volumes: what each is ([`classify`]), the claims to make from
//! templates or adopt ([`writes`]), what they say about VolumesReady ([`problem`]), where their
//! data can be reached ([`reach`], for placement) and the claims a deleted SmolVM takes with it
//! ([`on_delete`]). Pure.
//!
//! As a StatefulSet's: a template's claim `<smolvm>-<volume>` is labelled with the SmolVM's name
//! and the volume's; `whenDeleted: Delete` makes the SmolVM its owner, `Retain` (the default)
//! leaves it unowned, for a SmolVM made again under the same name to adopt.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{PersistentVolume, PersistentVolumeClaim},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use smolvm_api::{
    SmolVM,
    constants::{reason, volumes as names},
    volume::{ClaimTemplate, Source, Volume, WhenDeleted},
};

use super::{Seen, VolumeWrite};
use crate::placement::VolumeReach;

/// The annotation the scheduler writes on a `WaitForFirstConsumer` claim once it chose a node
/// for the Pod that uses it.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

/// What one claim of the SmolVM is.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimState<'a> {
    /// No claim of that name exists (a template's is made by this pass).
    Missing,
    /// A claim of a template's name that is not this SmolVM's: why.
    Conflict(String),
    /// This SmolVM's template claim, being deleted: a new one is made once it is gone.
    Going,
    /// Not bound to a volume yet (its phase: Pending, or Lost).
    Unbound(&'a PersistentVolumeClaim),
    /// Bound to the PersistentVolume `pv` (the object, when observed).
    Bound {
        /// The claim.
        claim: &'a PersistentVolumeClaim,
        /// The PV's name (the directory the kubelet gives the volume in the holder).
        pv: &'a str,
        /// The PV, when observed.
        volume: Option<&'a PersistentVolume>,
    },
}

/// One volume of the SmolVM that is a claim, and what its claim is.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim<'a> {
    /// The volume.
    pub volume: &'a Volume,
    /// The claim's name.
    pub name: String,
    /// The template it is made from, for a `claimTemplate` volume.
    pub template: Option<&'a ClaimTemplate>,
    /// What the claim is.
    pub state: ClaimState<'a>,
}

/// Each claim volume of `vm`, in the spec's order, with what `seen` holds of its claim.
pub fn classify<'a>(vm: &'a SmolVM, seen: &'a Seen) -> Vec<Claim<'a>> {
    let smolvm = vm.metadata.name.as_deref().unwrap_or_default();
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    vm.spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|volume| {
            let name = volume.claim_name(smolvm)?;
            let template = match volume.source()? {
                Source::Template(t) => Some(t),
                _ => None,
            };
            let claim = seen.claims.get(&name).and_then(|c| c.as_deref());
            let state = state_of(claim, template.is_some(), smolvm, uid, seen);
            Some(Claim {
                volume,
                name,
                template,
                state,
            })
        })
        .collect()
}

/// What a claim is; `template`: it is a template's, which must carry this SmolVM's label.
fn state_of<'a>(
    claim: Option<&'a PersistentVolumeClaim>,
    template: bool,
    smolvm: &str,
    uid: &str,
    seen: &'a Seen,
) -> ClaimState<'a> {
    let Some(claim) = claim else { return ClaimState::Missing };
    if template {
        let label = claim.metadata.labels.as_ref().and_then(|l| l.get(names::LABEL_SMOLVM));
        if label.map(String::as_str) != Some(smolvm) {
            return ClaimState::Conflict(match label {
                Some(other) => format!("it carries {}={other}", names::LABEL_SMOLVM),
                None => format!("it does not carry {}={smolvm}", names::LABEL_SMOLVM),
            });
        }
        let other_owner = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true) && r.uid != uid);
        if claim.metadata.deletion_timestamp.is_some() {
            return ClaimState::Going;
        }
        if let Some(owner) = other_owner {
            return ClaimState::Conflict(format!(
                "it is owned by {} {} (UID {})",
                owner.kind, owner.name, owner.uid
            ));
        }
    }
    let status = claim.status.as_ref();
    let bound = status.and_then(|s| s.phase.as_deref()) == Some("Bound");
    match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(pv) if bound && !pv.is_empty() => ClaimState::Bound {
            claim,
            pv,
            volume: seen.bound.get(pv).map(|v| v.as_ref()),
        },
        _ => ClaimState::Unbound(claim),
    }
}

/// The claim made from `template` for `vm`'s volume `volume`: `<smolvm>-<volume>`, labelled
/// with both names, owned by the SmolVM only for `whenDeleted: Delete`. `None` for a SmolVM not
/// stored yet.
pub fn template_claim(vm: &SmolVM, volume: &Volume, template: &ClaimTemplate) -> Option<PersistentVolumeClaim> {
    let smolvm = vm.metadata.name.as_deref()?;
    let owned = template.when_deleted.unwrap_or_default() == WhenDeleted::Delete;
    let owner = crate::vm::exposure::owner_reference(vm)?;
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(smolvm_api::volume::template_claim_name(smolvm, &volume.name)),
            namespace: vm.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (names::LABEL_SMOLVM.to_string(), smolvm.to_string()),
                (names::LABEL_VOLUME.to_string(), volume.name.clone()),
            ])),
            owner_references: owned.then(|| vec![owner]),
            ..Default::default()
        },
        spec: Some(template.spec.clone()),
        status: None,
    })
}

/// The claim writes `claims` ask for: each missing template claim made; a retained one adopted
/// (its owner reference added) when the policy is `Delete` and it lacks it.
pub fn writes(vm: &SmolVM, claims: &[Claim]) -> Vec<VolumeWrite> {
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    claims
        .iter()
        .filter_map(|c| {
            let template = c.template?;
            let delete = template.when_deleted == Some(WhenDeleted::Delete);
            match c.state {
                ClaimState::Missing => {
                    template_claim(vm, c.volume, template).map(|pvc| VolumeWrite::MakeClaim(Box::new(pvc)))
                }
                ClaimState::Unbound(claim) | ClaimState::Bound { claim, .. } if delete => adoption(vm, claim, uid),
                _ => None,
            }
        })
        .collect()
}

/// The owner reference a retained `claim` gets when a SmolVM whose policy is `Delete` adopts it;
/// `None` when it carries it already.
fn adoption(vm: &SmolVM, claim: &PersistentVolumeClaim, uid: &str) -> Option<VolumeWrite> {
    if claim.metadata.owner_references.iter().flatten().any(|r| r.uid == uid) {
        return None;
    }
    let owner = crate::vm::exposure::owner_reference(vm)?;
    Some(VolumeWrite::AdoptClaim(Box::new(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: claim.metadata.name.clone(),
            namespace: vm.metadata.namespace.clone(),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: None,
        status: None,
    })))
}

/// Whether the holder cannot be made yet: a claim is missing or not this SmolVM's (its Pod would
/// name a claim that is not there, or another's).
pub fn block_holder(claims: &[Claim]) -> bool {
    claims.iter().any(|c| {
        matches!(
            c.state,
            ClaimState::Missing | ClaimState::Conflict(_) | ClaimState::Going
        )
    })
}

/// The first claim reason that holds, in order: ClaimMissing, ClaimPending, ClaimConflict (each
/// with its message); `None` when every claim is this SmolVM's and bound, or waits for the
/// holder. A claim that is not bound waits for the holder (rather than being reported Pending)
/// while `holder_unscheduled` and the scheduler chose no node for it: a `WaitForFirstConsumer`
/// claim binds once the holder is scheduled, and the holder's own reason says why it is not.
pub fn problem(claims: &[Claim], namespace: &str, holder_unscheduled: bool) -> Option<(&'static str, String)> {
    let missing = claims.iter().find(|c| c.state == ClaimState::Missing);
    if let Some(c) = missing {
        let message = match c.template {
            Some(_) => format!(
                "claim {namespace}/{} (volume {}) is being made from its template",
                c.name, c.volume.name
            ),
            None => format!(
                "claim {namespace}/{} (volume {}) does not exist: the VM waits for it",
                c.name, c.volume.name
            ),
        };
        return Some((reason::CLAIM_MISSING, message));
    }
    let pending = claims.iter().find_map(|c| match &c.state {
        ClaimState::Going => Some(format!(
            "claim {namespace}/{} (volume {}) is being deleted: a new one is made from the template once it is gone",
            c.name, c.volume.name
        )),
        ClaimState::Unbound(claim) => {
            let selected = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SELECTED_NODE_ANNOTATION));
            let phase = claim
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            match selected {
                None if holder_unscheduled => None,
                Some(node) => Some(format!(
                    "claim {namespace}/{} (volume {}) is {phase}: its volume is being provisioned on node {node}",
                    c.name, c.volume.name
                )),
                None => Some(format!(
                    "claim {namespace}/{} (volume {}) is {phase}: not bound to a volume yet",
                    c.name, c.volume.name
                )),
            }
        }
        _ => None,
    });
    if let Some(message) = pending {
        return Some((reason::CLAIM_PENDING, message));
    }
    claims.iter().find_map(|c| match &c.state {
        ClaimState::Conflict(why) => Some((
            reason::CLAIM_CONFLICT,
            format!(
                "claim {namespace}/{} exists and is not this SmolVM's ({why}); it is left untouched: delete or rename it, or rename the volume",
                c.name
            ),
        )),
        _ => None,
    })
}

/// Whether a placement must wait: a claim missing (one a template's is made first) or another's.
/// `None`: place now.
pub fn before_placement(claims: &[Claim], namespace: &str) -> Option<(&'static str, String)> {
    let waits = claims.iter().any(|c| match c.state {
        ClaimState::Missing => c.template.is_none(),
        ClaimState::Conflict(_) | ClaimState::Going => true,
        _ => false,
    });
    if !waits {
        return None;
    }
    let named: Vec<Claim> = claims
        .iter()
        .filter(|c| !(c.state == ClaimState::Missing && c.template.is_some()))
        .cloned()
        .collect();
    problem(&named, namespace, true)
}

/// Where the data of `claims` can be reached: one [`VolumeReach`] per claim bound to a PV with a
/// required node affinity.
pub fn reach(claims: &[Claim]) -> Vec<VolumeReach> {
    claims
        .iter()
        .filter_map(|c| match c.state {
            ClaimState::Bound {
                pv, volume: Some(v), ..
            } => {
                let terms = v
                    .spec
                    .as_ref()?
                    .node_affinity
                    .as_ref()?
                    .required
                    .as_ref()?
                    .node_selector_terms
                    .clone();
                Some(VolumeReach {
                    pv: pv.to_string(),
                    terms,
                })
            }
            _ => None,
        })
        .collect()
}

/// For a machine lost from its node: the volumes whose data stays there (claims bound to a
/// node-pinned PV), in words: `volume data (claim default/db-data, PV local-3 is pinned to
/// node-b)`; `None` when none is.
pub fn lost_data(claims: &[Claim], namespace: &str) -> Option<String> {
    let pinned: Vec<String> = claims
        .iter()
        .zip(reach_each(claims))
        .filter_map(|(c, reach)| {
            reach.map(|r| {
                format!(
                    "volume {} (claim {namespace}/{}, {})",
                    c.volume.name,
                    c.name,
                    r.pinned()
                )
            })
        })
        .collect();
    (!pinned.is_empty()).then(|| pinned.join("; "))
}

/// [`reach`] per claim, `None` where a claim's data is not pinned.
fn reach_each(claims: &[Claim]) -> Vec<Option<VolumeReach>> {
    claims
        .iter()
        .map(|c| reach(std::slice::from_ref(c)).into_iter().next())
        .collect()
}

/// The claims a deleted SmolVM takes with it: its template claims whose policy is `Delete`,
/// where they exist, are this SmolVM's (its label, and its owner reference where it has one)
/// and are not being deleted already. Deleted explicitly: garbage collection may not run.
pub fn on_delete(vm: &SmolVM, seen: &Seen) -> Vec<VolumeWrite> {
    let uid = vm.metadata.uid.as_deref().unwrap_or_default();
    classify(vm, seen)
        .into_iter()
        .filter(|c| c.template.is_some_and(|t| t.when_deleted == Some(WhenDeleted::Delete)))
        .filter_map(|c| {
            let claim = seen.claims.get(&c.name)?.as_deref()?;
            let ours = matches!(c.state, ClaimState::Unbound(_) | ClaimState::Bound { .. });
            let owners = claim.metadata.owner_references.as_deref().unwrap_or_default();
            let owner_ok = owners.is_empty() || owners.iter().any(|r| r.uid == uid);
            (ours && owner_ok).then(|| VolumeWrite::DeleteClaim {
                name: c.name.clone(),
                uid: claim.metadata.uid.clone().unwrap_or_default(),
            })
        })
        .collect()
}
