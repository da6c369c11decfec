//! V16, a SmolVM's volumes (SPEC 2.5): names, sources, mount paths and claim templates, within
//! the policy; immutable once bound.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;

use crate::{
    constants::volumes::IDENTITY_VOLUME,
    policy::Policy,
    quota::parse_quantity,
    syntax,
    types::SmolVM,
    volume::{ClaimTemplate, Volume, template_claim_name},
};

use super::verdict::*;

/// The access modes a claim may ask for (Kubernetes' own list).
const ACCESS_MODES: [&str; 4] = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"];

/// Longest SmolVM name that may carry volumes: its holder Pod and claims carry it as a label
/// value (`vm.smolvm.dev/smolvm`), which holds at most 63 characters.
const MAX_NAME_WITH_VOLUMES: usize = 63;

/// V16 on a SmolVM's volumes: every violation, each naming its path.
pub(super) fn check_volumes(vm: &SmolVM, policy: &Policy, v: &mut Verdict) {
    let Some(volumes) = vm.spec.volumes.as_deref() else {
        return;
    };
    v.too_many(
        RuleId::V16,
        "spec.volumes",
        "volumes",
        volumes.len(),
        policy.max_volumes,
        "maxVolumes",
    );
    let name = vm.metadata.name.as_deref().unwrap_or("");
    if !volumes.is_empty() && name.len() > MAX_NAME_WITH_VOLUMES {
        v.violation(
            RuleId::V16,
            "metadata.name",
            render(name),
            format!(
                "{} has {} characters; a SmolVM with volumes has a name of at most {MAX_NAME_WITH_VOLUMES}: its holder Pod and claims carry it in the label vm.smolvm.dev/smolvm",
                render(name),
                name.len()
            ),
        );
    }
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut paths: BTreeMap<String, usize> = BTreeMap::new();
    for (i, volume) in volumes.iter().enumerate() {
        let at = format!("spec.volumes[{i}]");
        check_volume(&at, name, volume, v);
        if let Some(first) = names.insert(volume.name.as_str(), i) {
            v.violation(
                RuleId::V16,
                &format!("{at}.name"),
                render(&volume.name),
                format!(
                    "{} is already the name of spec.volumes[{first}]; volume names are unique",
                    render(&volume.name)
                ),
            );
        }
        if let Some(first) = paths.insert(normal_path(&volume.mount_path), i) {
            v.violation(
                RuleId::V16,
                &format!("{at}.mountPath"),
                render(&volume.mount_path),
                format!(
                    "{} is already where spec.volumes[{first}] is mounted; mount paths are unique",
                    render(&volume.mount_path)
                ),
            );
        }
    }
}

/// A mount path without its trailing slashes, so `/data/` and `/data` are one path.
fn normal_path(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() { "/".into() } else { trimmed.into() }
}

/// V16 on one volume at `at`, of the SmolVM named `smolvm`.
fn check_volume(at: &str, smolvm: &str, volume: &Volume, v: &mut Verdict) {
    v.invalid(
        RuleId::V16,
        &format!("{at}.name"),
        &volume.name,
        syntax::check_dns1123_label,
    );
    if volume.name == IDENTITY_VOLUME {
        v.violation(
            RuleId::V16,
            &format!("{at}.name"),
            render(&volume.name),
            format!(
                "{} is the name of the holder Pod's own identity volume; choose another",
                render(&volume.name)
            ),
        );
    }
    check_mount_path(&format!("{at}.mountPath"), &volume.mount_path, v);
    let sources: Vec<&str> = [
        ("persistentVolumeClaim", volume.persistent_volume_claim.is_some()),
        ("claimTemplate", volume.claim_template.is_some()),
        ("configMap", volume.config_map.is_some()),
        ("secret", volume.secret.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if sources.len() != 1 {
        v.violation(
            RuleId::V16,
            at,
            render(&sources),
            format!(
                "names {} sources {}; a volume has exactly one of persistentVolumeClaim, claimTemplate, configMap and secret",
                sources.len(),
                render(&sources)
            ),
        );
    }
    if let Some(claim) = &volume.persistent_volume_claim {
        let path = format!("{at}.persistentVolumeClaim.claimName");
        v.invalid(RuleId::V16, &path, &claim.claim_name, syntax::check_dns1123_subdomain);
    }
    if let Some(map) = &volume.config_map {
        v.invalid(
            RuleId::V16,
            &format!("{at}.configMap.name"),
            &map.name,
            syntax::check_dns1123_subdomain,
        );
    }
    if let Some(secret) = &volume.secret {
        let path = format!("{at}.secret.secretName");
        v.invalid(RuleId::V16, &path, &secret.secret_name, syntax::check_dns1123_subdomain);
    }
    if let Some(template) = &volume.claim_template {
        check_template(&format!("{at}.claimTemplate"), smolvm, &volume.name, template, v);
    }
}

/// V16: an absolute guest path other than `/`, without `..` or empty segments.
fn check_mount_path(path: &str, mount_path: &str, v: &mut Verdict) {
    let problem = if !mount_path.starts_with('/') {
        Some("is not an absolute path")
    } else if normal_path(mount_path) == "/" {
        Some("is the guest's root; mount a volume below it, such as /data")
    } else if mount_path.split('/').any(|s| s == ".." || s == ".") {
        Some("has a '.' or '..' segment; give the path as it is")
    } else if mount_path.trim_end_matches('/').contains("//") {
        Some("has an empty segment ('//')")
    } else if mount_path.chars().any(char::is_control) {
        Some("has a control character")
    } else {
        None
    };
    if let Some(problem) = problem {
        v.violation(
            RuleId::V16,
            path,
            render(mount_path),
            format!("{} {problem}", render(mount_path)),
        );
    }
}

/// V16 on a claim template: the name it makes is a valid claim name, it names access modes and
/// a storage request, and it is not a block volume.
fn check_template(at: &str, smolvm: &str, volume: &str, template: &ClaimTemplate, v: &mut Verdict) {
    let claim = template_claim_name(smolvm, volume);
    if !smolvm.is_empty()
        && let Err(reason) = syntax::check_dns1123_subdomain(&claim)
    {
        v.violation(
            RuleId::V16,
            at,
            render(&claim),
            format!("makes the claim {}, whose name {reason}", render(&claim)),
        );
    }
    check_claim_spec(&format!("{at}.spec"), &template.spec, v);
}

/// V16 on a claim template's spec.
fn check_claim_spec(at: &str, spec: &PersistentVolumeClaimSpec, v: &mut Verdict) {
    let modes = spec.access_modes.as_deref().unwrap_or_default();
    if modes.is_empty() {
        v.violation(
            RuleId::V16,
            &format!("{at}.accessModes"),
            String::new(),
            format!(
                "a claim template names its access modes, such as [\"ReadWriteOnce\"] (one or more of {})",
                ACCESS_MODES.join(", ")
            ),
        );
    }
    for (i, mode) in modes.iter().enumerate() {
        if !ACCESS_MODES.contains(&mode.as_str()) {
            v.violation(
                RuleId::V16,
                &format!("{at}.accessModes[{i}]"),
                render(mode),
                format!("{} is not an access mode ({})", render(mode), ACCESS_MODES.join(", ")),
            );
        }
    }
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|requests| requests.get("storage"));
    let path = format!("{at}.resources.requests.storage");
    match storage.map(|q| (q, parse_quantity(&q.0))) {
        None => v.violation(
            RuleId::V16,
            &path,
            String::new(),
            "a claim template names a storage request, such as \"10Gi\"".into(),
        ),
        Some((q, Ok(millis))) if millis <= 0 => v.violation(
            RuleId::V16,
            &path,
            render(&q.0),
            format!("{} is not a positive storage request", render(&q.0)),
        ),
        Some((q, Err(_))) => v.violation(
            RuleId::V16,
            &path,
            render(&q.0),
            format!("{} is not a quantity (such as \"10Gi\")", render(&q.0)),
        ),
        Some(_) => {}
    }
    if let Some(mode) = spec.volume_mode.as_deref()
        && mode != "Filesystem"
    {
        v.violation(
            RuleId::V16,
            &format!("{at}.volumeMode"),
            render(mode),
            format!(
                "{} is refused: smolvm mounts directories into the guest, so a claim is mounted as a filesystem (volumeMode Filesystem, the default)",
                render(mode)
            ),
        );
    }
}

/// V16 once bound: the volumes stay as they were.
pub(super) fn check_volumes_unchanged(old: &SmolVM, new: &SmolVM, v: &mut Verdict) {
    if old.spec.volumes != new.spec.volumes {
        let names = |vm: &SmolVM| -> Vec<String> {
            vm.spec
                .volumes
                .iter()
                .flatten()
                .map(|volume| volume.name.clone())
                .collect()
        };
        v.violation(
            RuleId::V16,
            "spec.volumes",
            render(&names(new)),
            format!(
                "volumes {} (were {}) are immutable once the SmolVM is bound to a node; delete and recreate it to change them (a retained claim is adopted again)",
                render(&names(new)),
                render(&names(old))
            ),
        );
    }
}
