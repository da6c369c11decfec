//! Images.

use super::*;

/// Every container image of every workload: (workload, container, image).
pub(super) fn images(all: &[Value]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (workload, template) in workloads(all) {
        let spec = pod_spec(&template, &workload);
        for c in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
            out.push((workload.clone(), c.name.clone(), c.image.clone().unwrap_or_default()));
        }
    }
    out
}

pub(super) fn expected_image<'a>(workload: &str, operator: &'a str, runtime: &'a str) -> &'a str {
    if workload == RUNTIME { runtime } else { operator }
}

#[test]
pub(super) fn checked_in_overlays_use_the_placeholder_images() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let found = images(rendered(overlay));
        assert_eq!(found.len(), 3, "deploy/{overlay}: {found:?}");
        for (workload, container, image) in found {
            assert_eq!(
                image,
                expected_image(&workload, "smolvm-operator", "smolvm-runtime"),
                "deploy/{overlay}: {workload}/{container}"
            );
        }
    }
}

#[test]
pub(super) fn make_deploy_substitutes_the_images() {
    require_kubectl!();
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let cases = [
        (
            "default",
            "localhost:5000/team/smolvm-operator:v1.2.3".to_string(),
            format!("my-registry/smolvm-runtime@{digest}"),
        ),
        (
            "cert-manager",
            "my-registry/smolvm-operator".to_string(),
            "smolvm-runtime:dev".to_string(),
        ),
        (
            "default",
            "localhost:5000/smolvm-operator".to_string(),
            "localhost:5000/smolvm-runtime:v2".to_string(),
        ),
    ];
    for (overlay, img, runtime_img) in &cases {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = run(script("deploy/scripts/overlay.sh")
            .args([overlay, img.as_str(), runtime_img.as_str()])
            .arg(dir.path()));
        assert!(
            output.status.success(),
            "overlay.sh {overlay} {img} {runtime_img}: {}",
            text(&output.stderr)
        );
        let found = images(&kustomize(dir.path()));
        assert_eq!(found.len(), 3, "{found:?}");
        for (workload, container, image) in found {
            assert_eq!(
                image,
                expected_image(&workload, img, runtime_img),
                "{overlay} IMG={img} RUNTIME_IMG={runtime_img}: {workload}/{container}"
            );
        }
    }
    for (overlay, img) in [
        ("default", "bad image"),
        ("default", "repo@md5:abc"),
        ("nope", "x"),
        ("../deploy", "x"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = run(script("deploy/scripts/overlay.sh")
            .args([overlay, img, "smolvm-runtime:1"])
            .arg(dir.path()));
        assert!(!output.status.success(), "overlay.sh must refuse {overlay} {img:?}");
        assert!(!text(&output.stderr).is_empty(), "and say why");
    }
}
