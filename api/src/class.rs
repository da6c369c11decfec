//! The `SmolVMClass` custom resource (instance types, SPEC section 2.2) and the catalogue of
//! known classes that admission reads.
//!
//! A class is a set of defaults: at CREATE the mutating webhook fills every field a SmolVM leaves
//! unset from its class (rule M3, [`crate::defaulting`]), so the stored SmolVM is complete and a
//! later change to the class never moves it. Rule V12 ([`crate::validate`]) keeps the classes
//! themselves within the policy and at most one of them the default.

// Clippy's duplicated_attributes lint misreads kube's repeated `printcolumn(type_ = ...)` arguments.
#![allow(clippy::duplicated_attributes)]

use std::{borrow::Borrow, collections::BTreeMap};

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::{
    constants::{ANNOTATION_IS_DEFAULT_CLASS, IS_DEFAULT_CLASS_VALUE},
    types::{CidrString, LabelValue, Resources, RestartPolicy, SmolVMSpec, Storage},
};

/// Defaults for the SmolVMs that name this class in `spec.className` (or, when this class is the
/// default, for those that name none).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "vm.smolvm.dev",
    version = "v1alpha1",
    kind = "SmolVMClass",
    doc = "An instance type for SmolVMs: sizes and defaults that the admission webhook copies, once, at CREATE, into every field a SmolVM that names the class (spec.className) leaves unset. The SmolVM's own fields always win, and a class changed or deleted later never changes an existing SmolVM. At most one class carries the annotation vm.smolvm.dev/is-default-class: \"true\"; it applies to SmolVMs that name no class.",
    plural = "smolvmclasses",
    singular = "smolvmclass",
    shortname = "svmc",
    category = "smolvm-all",
    printcolumn(
        name = "CPUs",
        type_ = "integer",
        json_path = ".spec.resources.cpus",
        description = "Virtual CPUs"
    ),
    printcolumn(
        name = "Memory",
        type_ = "integer",
        json_path = ".spec.resources.memoryMiB",
        description = "Memory in MiB"
    ),
    printcolumn(
        name = "Storage",
        type_ = "integer",
        json_path = ".spec.storage.storageGiB",
        description = "Storage disk in GiB"
    ),
    printcolumn(
        name = "Default",
        type_ = "string",
        json_path = ".metadata.annotations.vm\\.smolvm\\.dev/is-default-class",
        description = "Whether SmolVMs that name no class get this one"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct SmolVMClassSpec {
    /// CPU and memory for SmolVMs of this class; each member the SmolVM leaves unset is taken from here. Within the policy bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Disk sizes for SmolVMs of this class; each member the SmolVM leaves unset is taken from here. Within the policy bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Storage>,

    /// Network defaults for SmolVMs of this class: whether the network is enabled, and the egress allowed. Ports are never part of a class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<ClassNetwork>,

    /// Labels a SmolVMNode must carry, for SmolVMs of this class that set no nodeSelector of their own (taken as a whole, never merged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 32, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    pub node_selector: Option<BTreeMap<String, LabelValue>>,

    /// The workload's restart policy (Always, OnFailure or Never) for SmolVMs of this class that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,

    /// Seconds the workload gets to exit after its stop signal, 0 to 300, for SmolVMs of this class that set none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 300))]
    pub termination_grace_period_seconds: Option<i64>,

    /// How long SmolVMs of this class live (SPEC 2.7), member by member for those that set none: `ttlSecondsAfterFinished` and `activeDeadlineSeconds`, as a SmolVM's `lifecycle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<crate::types::Lifecycle>,
}

/// The network defaults of a class.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.allowedCIDRs) || size(self.allowedCIDRs) == 0 || (has(self.enabled) && self.enabled)").message("allowedCIDRs need network.enabled: true (V3)").field_path(".allowedCIDRs"))]
#[x_kube(validation = Rule::new("!has(self.allowedHosts) || size(self.allowedHosts) == 0 || (has(self.enabled) && self.enabled)").message("allowedHosts need network.enabled: true (V11)").field_path(".allowedHosts"))]
pub struct ClassNetwork {
    /// Whether SmolVMs of this class that do not say get a network interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Destination CIDRs SmolVMs of this class may reach, for those that set none and whose network is enabled. Needs `enabled`.
    #[serde(default, rename = "allowedCIDRs", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every allowedCIDRs entry must be a CIDR such as 10.0.0.0/8 (V3)"))]
    pub allowed_cidrs: Option<Vec<CidrString>>,

    /// Host names (and their subdomains) SmolVMs of this class may reach, for those that set none and whose network is enabled: DNS names such as `api.example.com`, or `*.example.com`. Needs `enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 253),
            regex(pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
        )
    )]
    pub allowed_hosts: Option<Vec<String>>,
}

impl SmolVMClass {
    /// The class's name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or("")
    }

    /// Whether the class carries `vm.smolvm.dev/is-default-class: "true"`.
    pub fn is_default(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_IS_DEFAULT_CLASS))
            .is_some_and(|v| v == IS_DEFAULT_CLASS_VALUE)
    }

    /// The SmolVM spec made of this class's fields alone (the image a placeholder): what rule
    /// V12 checks against the SmolVM rules V2, V3, V4 and V11, whose paths it shares.
    pub fn as_smolvm_spec(&self) -> SmolVMSpec {
        let spec = &self.spec;
        let network = spec.network.as_ref().map(|n| crate::types::Network {
            enabled: n.enabled,
            allowed_cidrs: n.allowed_cidrs.clone(),
            allowed_hosts: n.allowed_hosts.clone(),
            ..Default::default()
        });
        SmolVMSpec {
            image: "class".into(),
            resources: spec.resources.clone(),
            storage: spec.storage.clone(),
            network,
            node_selector: spec.node_selector.clone(),
            restart_policy: spec.restart_policy,
            termination_grace_period_seconds: spec.termination_grace_period_seconds,
            lifecycle: spec.lifecycle.clone(),
            ..Default::default()
        }
    }
}

/// The known SmolVMClasses, as the webhook's cache sees them.
pub trait ClassCatalog {
    /// The class of that name, if known.
    fn class(&self, name: &str) -> Option<SmolVMClass>;
    /// Every known class's name, sorted.
    fn names(&self) -> Vec<String>;
    /// Every class annotated as the default.
    fn defaults(&self) -> Vec<SmolVMClass>;
    /// How many SmolVMs are known to carry the class label with this name, when they are
    /// counted (the webhook's cache does; a plain list of classes does not).
    fn users(&self, _name: &str) -> Option<usize> {
        None
    }
}

/// No classes at all (a [`ClassCatalog`] for contexts that have none).
pub static NO_CLASSES: Vec<SmolVMClass> = Vec::new();

/// A list of classes, owned or shared (`Vec<SmolVMClass>`, `Vec<Arc<SmolVMClass>>`).
impl<T: Borrow<SmolVMClass>> ClassCatalog for Vec<T> {
    fn class(&self, name: &str) -> Option<SmolVMClass> {
        self.iter().map(Borrow::borrow).find(|c| c.name() == name).cloned()
    }
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.iter().map(|c| c.borrow().name().to_string()).collect();
        names.sort();
        names
    }
    fn defaults(&self) -> Vec<SmolVMClass> {
        self.iter()
            .map(Borrow::borrow)
            .filter(|c| c.is_default())
            .cloned()
            .collect()
    }
}

/// The default class among `defaults`: the newest (as Kubernetes picks among several default
/// StorageClasses), ties broken by name. Several exist only when two were made at once, before
/// either was in the webhook's cache (rule V12 refuses a second otherwise).
pub fn newest_default(mut defaults: Vec<SmolVMClass>) -> Option<SmolVMClass> {
    defaults.sort_by(|a, b| {
        let created = |c: &SmolVMClass| c.metadata.creation_timestamp.clone().map(|t| t.0);
        created(a).cmp(&created(b)).then_with(|| b.name().cmp(a.name()))
    });
    defaults.pop()
}

/// The class a SmolVM at CREATE gets its defaults from: the one its `spec.className` names, or
/// else the default class. `Err` carries the unknown name (rule V12 reports it).
pub fn class_for(class_name: Option<&str>, catalog: &dyn ClassCatalog) -> Result<Option<SmolVMClass>, String> {
    match class_name {
        Some(name) => catalog.class(name).map(Some).ok_or_else(|| name.to_string()),
        None => Ok(newest_default(catalog.defaults())),
    }
}
