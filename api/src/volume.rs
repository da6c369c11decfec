//! A SmolVM's volumes (SPEC 2.5): data that outlives the VM, mounted by the kubelet into the
//! VM's holder Pod on its node and passed to smolvm as host mounts (virtiofs).
//!
//! Each item is a Pod's volume with its mount on the same item, since a VM has one workload.
//! Exactly one source: an existing claim, a claim made from a template, a ConfigMap or a Secret.

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The schema's most volumes (the policy's `maxVolumes`, 8 by default, may lower it).
pub const MAX_VOLUMES_SCHEMA: usize = 16;

/// One volume of the VM and where the guest sees it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.persistentVolumeClaim), has(self.claimTemplate), has(self.configMap), has(self.secret)].filter(x, x).size() == 1").message("a volume has exactly one of persistentVolumeClaim, claimTemplate, configMap and secret (V16)"))]
pub struct Volume {
    /// Name of the volume: a DNS-1123 label, unique among the SmolVM's volumes. A claim made from `claimTemplate` is named `<smolvm>-<name>`.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("a volume name must be a DNS-1123 label: lower-case letters, digits and '-' (V16)"))]
    pub name: String,

    /// Where the guest sees the volume: an absolute path other than `/`, unique among the SmolVM's volumes.
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && self.matches('[^/]')").message("mountPath must be an absolute path other than / (V16)"))]
    pub mount_path: String,

    /// Whether the guest may only read the volume. Defaults to false; ConfigMap and Secret volumes are always read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,

    /// An existing PersistentVolumeClaim in the SmolVM's namespace. A claim that does not exist yet is waited for (VolumesReady=False, reason ClaimMissing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<ClaimSource>,

    /// A PersistentVolumeClaim the controller makes, named `<smolvm>-<name>` and labelled `vm.smolvm.dev/smolvm=<smolvm>`, before the VM is placed. A SmolVM made again under the same name adopts the claim it left, as a StatefulSet's Pod does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_template: Option<ClaimTemplate>,

    /// The keys of a ConfigMap in the SmolVM's namespace, as read-only files (the role of cloud-init user data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapVolume>,

    /// The keys of a Secret in the SmolVM's namespace, as read-only files. Whoever may create SmolVMs in a namespace may so read its Secrets, as with env from Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretVolume>,
}

/// An existing claim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSource {
    /// Name of the PersistentVolumeClaim in the SmolVM's namespace (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,
}

/// A claim the controller makes for the SmolVM.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.spec.volumeMode) || self.spec.volumeMode == 'Filesystem'").message("a claim template is mounted as a filesystem: smolvm mounts directories, so volumeMode Block is refused (V16)"))]
#[x_kube(validation = Rule::new("has(self.spec.accessModes) && size(self.spec.accessModes) > 0").message("a claim template names its access modes, such as [ReadWriteOnce] (V16)"))]
#[x_kube(validation = Rule::new("has(self.spec.resources) && has(self.spec.resources.requests) && 'storage' in self.spec.resources.requests").message("a claim template names a storage request, such as 10Gi (V16)"))]
pub struct ClaimTemplate {
    /// The claim's spec, as a PersistentVolumeClaim's: it names its access modes and a storage request; `volumeMode: Block` is refused (smolvm mounts directories).
    pub spec: PersistentVolumeClaimSpec,

    /// What happens to the claim when the SmolVM is deleted: `Retain` (the default) keeps it and its data, for a SmolVM made again under the same name to adopt; `Delete` deletes it with the SmolVM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_deleted: Option<WhenDeleted>,
}

/// What happens to a claim made from a template when its SmolVM is deleted.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WhenDeleted {
    /// The claim and its data stay (the default).
    #[default]
    Retain,
    /// The claim is deleted with the SmolVM (it is owned by it).
    Delete,
}

impl WhenDeleted {
    /// The policy as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WhenDeleted::Retain => "Retain",
            WhenDeleted::Delete => "Delete",
        }
    }
}

/// A ConfigMap's keys as files.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapVolume {
    /// Name of the ConfigMap in the SmolVM's namespace (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// Whether the VM may start without the ConfigMap (the directory is then empty). Defaults to false: a missing ConfigMap keeps the VM waiting (VolumesReady=False, reason VolumeSourceMissing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A Secret's keys as files.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolume {
    /// Name of the Secret in the SmolVM's namespace (a DNS-1123 subdomain).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,

    /// Whether the VM may start without the Secret (the directory is then empty). Defaults to false: a missing Secret keeps the VM waiting (VolumesReady=False, reason VolumeSourceMissing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Which source a volume names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Source<'a> {
    /// An existing claim.
    Claim(&'a ClaimSource),
    /// A claim made from a template.
    Template(&'a ClaimTemplate),
    /// A ConfigMap.
    ConfigMap(&'a ConfigMapVolume),
    /// A Secret.
    Secret(&'a SecretVolume),
}

impl Volume {
    /// The volume's one source, or `None` when it names none or more than one (refused by V16).
    pub fn source(&self) -> Option<Source<'_>> {
        let mut found = None;
        let mut count = 0;
        if let Some(c) = &self.persistent_volume_claim {
            found = Some(Source::Claim(c));
            count += 1;
        }
        if let Some(t) = &self.claim_template {
            found = Some(Source::Template(t));
            count += 1;
        }
        if let Some(c) = &self.config_map {
            found = Some(Source::ConfigMap(c));
            count += 1;
        }
        if let Some(s) = &self.secret {
            found = Some(Source::Secret(s));
            count += 1;
        }
        if count == 1 { found } else { None }
    }

    /// Whether the guest may only read it: `readOnly`, and always for ConfigMaps and Secrets.
    pub fn is_read_only(&self) -> bool {
        self.read_only.unwrap_or(false) || self.config_map.is_some() || self.secret.is_some()
    }

    /// The name of the PersistentVolumeClaim this volume uses in a SmolVM named `smolvm`: the
    /// claim it names, or `<smolvm>-<name>` for a template; `None` for a ConfigMap or Secret.
    pub fn claim_name(&self, smolvm: &str) -> Option<String> {
        match self.source()? {
            Source::Claim(c) => Some(c.claim_name.clone()),
            Source::Template(_) => Some(template_claim_name(smolvm, &self.name)),
            Source::ConfigMap(_) | Source::Secret(_) => None,
        }
    }
}

/// The name of the claim a SmolVM named `smolvm` makes for its template volume `volume`.
pub fn template_claim_name(smolvm: &str, volume: &str) -> String {
    format!("{smolvm}-{volume}")
}

/// The name of the holder Pod of a SmolVM named `smolvm`.
pub fn holder_name(smolvm: &str) -> String {
    format!("{smolvm}{}", crate::constants::volumes::HOLDER_SUFFIX)
}
