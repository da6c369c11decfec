//! Workloads.

use super::*;

/// The source files whose flags and environment variables each container uses.
pub(super) fn binary_source(workload: &str) -> String {
    match workload {
        WEBHOOK => read("webhook/src/cli.rs"),
        CONTROLLER => read("controller/src/cli.rs"),
        RUNTIME => read("runtime/src/cli.rs"),
        other => panic!("unknown workload {other}"),
    }
}

/// Every `--flag` the container passes is one the binary defines (clap derives `--foo-bar` from a
/// field `foo_bar`, or takes `long = "foo-bar"`), and every environment variable it sets is one
/// the binary reads.
pub(super) fn check_flags_and_env(workload: &str, container: &Container) {
    let source = binary_source(workload);
    for arg in container.args.iter().flatten() {
        let Some(flag) = arg.strip_prefix("--") else { continue };
        let flag = flag.split('=').next().unwrap_or_default();
        let field = format!("{}:", flag.replace('-', "_"));
        let long = format!("long = \"{flag}\"");
        assert!(
            source.contains(&field) || source.contains(&long),
            "{workload}: --{flag} is not a flag of the binary"
        );
    }
    for env in container.env.iter().flatten() {
        if env.name == "RUST_LOG" {
            continue; // tracing_subscriber's EnvFilter
        }
        assert!(
            source.contains(&format!("\"{}\"", env.name)),
            "{workload}: the binary never reads ${}",
            env.name
        );
    }
}

pub(super) fn field_ref(container: &Container, name: &str) -> String {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone())
        .unwrap_or_else(|| panic!("{}: no ${name} from the downward API", container.name))
}

pub(super) fn port(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
        .unwrap_or_else(|| panic!("{}: no port named {name}", container.name))
}

#[test]
pub(super) fn workloads_are_hardened_and_probed() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let found = workloads(all);
        let names: BTreeSet<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            BTreeSet::from([CONTROLLER, RUNTIME, WEBHOOK]),
            "deploy/{overlay}"
        );
        for (workload, template) in &found {
            let what = format!("deploy/{overlay}: {workload}");
            let spec = pod_spec(template, workload);
            assert_eq!(spec.service_account_name.as_deref(), Some(workload.as_str()), "{what}");
            assert_ne!(
                spec.automount_service_account_token,
                Some(false),
                "{what}: it talks to the API"
            );
            // The runtime alone is on the host network (it forwards published ports; see the
            // test below).
            if workload != RUNTIME {
                assert_ne!(spec.host_network, Some(true), "{what}: hostNetwork");
            }
            for (flag, value) in [("hostPID", spec.host_pid), ("hostIPC", spec.host_ipc)] {
                assert_ne!(value, Some(true), "{what}: {flag}");
            }
            let pod_security = spec.security_context.clone().unwrap_or_default();
            assert_eq!(
                pod_security.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
                Some("RuntimeDefault"),
                "{what}: seccomp"
            );
            assert!(
                spec.init_containers.is_none(),
                "{what}: init containers are not audited here"
            );
            assert_eq!(spec.containers.len(), 1, "{what}");
            let c = &spec.containers[0];
            let ops = port(c, "ops");
            for (probe, p) in [
                ("startup", &c.startup_probe),
                ("readiness", &c.readiness_probe),
                ("liveness", &c.liveness_probe),
            ] {
                let get = p
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .unwrap_or_else(|| panic!("{what}: no HTTP {probe} probe"));
                assert_eq!(
                    get.port,
                    IntOrString::String("ops".into()),
                    "{what}: {probe} probe port"
                );
                let path = get.path.as_deref().unwrap_or_default();
                assert!(
                    matches!(path, "/healthz" | "/readyz"),
                    "{what}: {probe} probe path {path}"
                );
            }
            let resources = c.resources.clone().unwrap_or_default();
            let requests = resources.requests.clone().unwrap_or_default();
            assert!(
                requests.contains_key("cpu") && requests.contains_key("memory"),
                "{what}: requests"
            );
            let security = c.security_context.clone().unwrap_or_default();
            assert_eq!(
                security.read_only_root_filesystem,
                Some(true),
                "{what}: readOnlyRootFilesystem"
            );
            check_flags_and_env(workload, c);
            for mount in c.volume_mounts.iter().flatten() {
                assert!(
                    spec.volumes.iter().flatten().any(|v| v.name == mount.name),
                    "{what}: mount of unknown volume {}",
                    mount.name
                );
            }
            if workload == RUNTIME {
                check_runtime(&what, &spec, c, &resources);
            } else {
                let non_root = security.run_as_non_root.or(pod_security.run_as_non_root);
                assert_eq!(non_root, Some(true), "{what}: runAsNonRoot");
                assert_ne!(security.run_as_user.or(pod_security.run_as_user), Some(0), "{what}");
                assert_eq!(security.allow_privilege_escalation, Some(false), "{what}");
                assert_ne!(security.privileged, Some(true), "{what}");
                let caps = security.capabilities.clone().unwrap_or_default();
                assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{what}: drop ALL");
                assert!(caps.add.is_none(), "{what}: no added capabilities");
                assert!(
                    resources.limits.as_ref().is_some_and(|l| l.contains_key("memory")),
                    "{what}: a memory limit"
                );
                assert!(
                    spec.volumes.iter().flatten().all(|v| v.host_path.is_none()),
                    "{what}: hostPath"
                );
                assert_eq!(ops, 8080, "{what}: the ops port is the binary's default 8080");
            }
            if workload == CONTROLLER {
                assert_eq!(field_ref(c, "POD_NAME"), "metadata.name", "{what}");
                assert_eq!(field_ref(c, "POD_NAMESPACE"), "metadata.namespace", "{what}");
            }
        }

        let webhook: Deployment = typed(find(all, "Deployment", WEBHOOK));
        let spec = webhook.spec.expect("webhook spec");
        assert_eq!(spec.replicas, Some(2), "deploy/{overlay}: webhook replicas");
        let anti = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.pod_anti_affinity.as_ref())
            .expect("webhook anti-affinity");
        assert!(
            anti.preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
                .any(|t| t.pod_affinity_term.topology_key == "kubernetes.io/hostname"),
            "deploy/{overlay}: webhook replicas spread over nodes"
        );
        let webhook_labels = pod_labels(all, WEBHOOK);
        let pdbs: Vec<PodDisruptionBudget> = objects(all, "PodDisruptionBudget").map(typed).collect();
        assert!(
            pdbs.iter().any(|p| {
                let s = p.spec.clone().unwrap_or_default();
                s.selector.as_ref().is_some_and(|sel| selects(sel, &webhook_labels))
                    && s.min_available == Some(IntOrString::Int(1))
            }),
            "deploy/{overlay}: a PodDisruptionBudget keeps one webhook replica"
        );
        let service: Service = typed(find(all, "Service", WEBHOOK));
        let service_spec = service.spec.expect("service spec");
        assert_eq!(
            service_spec.selector.as_ref(),
            Some(&BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                WEBHOOK.to_string()
            )]))
        );
        assert!(
            service_spec
                .ports
                .iter()
                .flatten()
                .any(|p| p.port == 443 && p.target_port == Some(IntOrString::String("https".into()))),
            "deploy/{overlay}: the webhook Service serves 443"
        );
    }
}

pub(super) fn check_runtime(what: &str, spec: &PodSpec, c: &Container, resources: &ResourceRequirements) {
    // Root for /dev/kvm and smolvm's per-VM uids; privileged for the device cgroup. The manifest
    // must say so where it does it.
    let security = c.security_context.clone().unwrap_or_default();
    assert_eq!(security.run_as_user, Some(0), "{what}: runs as root");
    assert_eq!(security.privileged, Some(true), "{what}: privileged in the base");
    let daemonset = read("deploy/base/runtime/daemonset.yaml");
    for reason in [
        "Root, and privileged, because",
        "device cgroup",
        "per-VM",
        "deploy/components/kvm-device-plugin",
    ] {
        assert!(
            daemonset.contains(reason),
            "{what}: the DaemonSet must explain: {reason}"
        );
    }
    assert!(
        resources.limits.is_none(),
        "{what}: the VMs run in this container's cgroup; a limit would cap every VM on the node"
    );
    assert_eq!(field_ref(c, "NODE_NAME"), "spec.nodeName", "{what}");
    assert_eq!(field_ref(c, "POD_IP"), "status.podIP", "{what}");
    assert_eq!(port(c, "ops"), RUNTIME_OPS_PORT, "{what}");
    assert_eq!(port(c, "node-api"), NODE_API_PORT, "{what}");
    let source = read("runtime/src/cli.rs");
    assert!(source.contains("default_value = \"0.0.0.0:9090\"") && source.contains("default_value_t = 10443"));

    let host_paths: BTreeMap<String, (String, String)> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.clone(), (h.path.clone(), h.type_.clone().unwrap_or_default())))
        })
        .collect();
    let want: BTreeMap<String, (String, String)> = [
        ("kvm", "/dev/kvm", "CharDevice"),
        ("state", "/var/lib/smolvm", "DirectoryOrCreate"),
        ("run", "/var/run/smolvm", "DirectoryOrCreate"),
        // Holder Pods' volumes, as the kubelet mounts them (SPEC 2.5).
        ("kubelet-pods", "/var/lib/kubelet/pods", "Directory"),
    ]
    .into_iter()
    .map(|(n, p, t)| (n.to_string(), (p.to_string(), t.to_string())))
    .collect();
    assert_eq!(host_paths, want, "{what}: exactly these host paths");
    let mounts: BTreeMap<String, String> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.clone(), m.mount_path.clone()))
        .collect();
    for (name, (path, _)) in &want {
        assert_eq!(
            mounts.get(name),
            Some(path),
            "{what}: {name} mounted at the host's path"
        );
    }
    // The kubelet's mounts made after the agent started reach it (HostToContainer), and the
    // agent is told where the kubelet keeps them.
    let propagation = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "kubelet-pods")
        .and_then(|m| m.mount_propagation.clone());
    assert_eq!(
        propagation.as_deref(),
        Some("HostToContainer"),
        "{what}: kubelet-pods propagation"
    );
    assert!(
        c.args
            .iter()
            .flatten()
            .any(|a| a == "--kubelet-root-dir=/var/lib/kubelet"),
        "{what}: the agent is not told the kubelet's root directory"
    );
    // The token and the client CA are whole-directory mounts: the kubelet updates those in place
    // (a subPath mount never changes), so a new token or a rotated CA reaches the running agent.
    for volume in ["auth", "client-ca"] {
        let sub_paths: Vec<_> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| m.name == volume)
            .filter_map(|m| m.sub_path.clone())
            .collect();
        assert!(
            sub_paths.is_empty(),
            "{what}: {volume} mounted with subPath {sub_paths:?}"
        );
    }
    // The token and the client CA land where the binary reads them by default.
    for (volume, file, default) in [
        ("auth", "token", "/etc/smolvm-runtime/auth/token"),
        ("client-ca", "ca.crt", "/etc/smolvm-runtime/ca/ca.crt"),
    ] {
        let mount = mounts
            .get(volume)
            .unwrap_or_else(|| panic!("{what}: no {volume} mount"));
        assert_eq!(format!("{mount}/{file}"), default, "{what}: {volume}");
        assert!(source.contains(&format!("default_value = \"{default}\"")), "{default}");
    }
    let volume = |name: &str| {
        spec.volumes
            .iter()
            .flatten()
            .find(|v| v.name == name)
            .cloned()
            .unwrap_or_else(|| panic!("{what}: no volume {name}"))
    };
    assert_eq!(
        volume("auth").secret.and_then(|s| s.secret_name).as_deref(),
        Some("smolvm-runtime-auth")
    );
    assert_eq!(
        volume("client-ca").config_map.map(|c| c.name).as_deref(),
        Some("smolvm-runtime-ca")
    );
    // Tolerations chosen on purpose: never "tolerate everything".
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .all(|t| t.key.as_deref().is_some_and(|k| !k.is_empty())),
        "{what}: a toleration without a key tolerates every taint: {tolerations:?}"
    );
    assert_eq!(
        tolerations
            .iter()
            .map(|t| t.key.clone().unwrap_or_default())
            .collect::<Vec<_>>(),
        vec!["vm.smolvm.dev/dedicated".to_string()],
        "{what}"
    );
    assert_eq!(
        spec.node_selector
            .as_ref()
            .and_then(|n| n.get("kubernetes.io/arch"))
            .map(String::as_str),
        Some("amd64"),
        "{what}: smolvm ships for amd64 only"
    );
}

/// `deploy/{overlay}` with `deploy/components/{component}`, rendered as a user's overlay would.
pub(super) fn with_component(overlay: &str, component: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let deploy = repo().join("deploy");
    std::os::unix::fs::symlink(deploy.join(overlay), dir.path().join("install")).expect("symlink");
    std::os::unix::fs::symlink(deploy.join("components").join(component), dir.path().join("component"))
        .expect("symlink");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [install]\ncomponents: [component]\n",
    )
    .expect("write kustomization");
    kustomize(dir.path())
}

#[test]
pub(super) fn the_unprivileged_component_drops_privileged_and_the_kvm_host_path() {
    require_kubectl!();
    let all = with_component("default", "kvm-device-plugin");
    for object in &all {
        check_typed(object).unwrap_or_else(|e| panic!("components/kvm-device-plugin: {e}"));
    }
    let daemonset: DaemonSet = typed(find(&all, "DaemonSet", RUNTIME));
    let spec = daemonset.spec.and_then(|s| s.template.spec).expect("runtime pod spec");
    let c = &spec.containers[0];
    let security = c.security_context.clone().unwrap_or_default();
    assert_eq!(security.privileged, Some(false));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert!(spec.volumes.iter().flatten().all(|v| v.name != "kvm"));
    assert!(c.volume_mounts.iter().flatten().all(|m| m.mount_path != "/dev/kvm"));
    let limits = c.resources.as_ref().and_then(|r| r.limits.clone()).unwrap_or_default();
    assert!(limits.contains_key("devices.kubevirt.io/kvm"), "{limits:?}");
    assert!(!limits.contains_key("memory") && !limits.contains_key("cpu"));
}
