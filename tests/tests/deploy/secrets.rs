//! Secrets and the policy.

use super::*;

/// The one Secret a manifest may hold: the webhook's TLS Secret, empty (the webhook fills it).
pub(super) fn check_no_secret_material(object: &Value, place: &str) {
    if str_at(object, "/kind") != "Secret" {
        return;
    }
    assert_eq!(
        str_at(object, "/metadata/name"),
        "smolvm-webhook-tls",
        "{place}: ships a Secret"
    );
    for key in ["data", "stringData"] {
        assert!(
            object
                .get(key)
                .is_none_or(|d| d.as_object().is_some_and(|m| m.is_empty())),
            "{place}: the placeholder Secret carries {key}"
        );
    }
}

#[test]
pub(super) fn no_secret_material_ships_in_any_manifest() {
    // No generator either: the node API token is created at install by the controller, random;
    // the webhook's TLS Secret ships empty and the webhook fills it. The chart's templates are
    // YAML only once rendered: helm.rs checks its renders.
    fn walk(dir: &Path) {
        for entry in std::fs::read_dir(dir).expect("read deploy/").flatten() {
            let path = entry.path();
            if path.is_dir() && path.ends_with("helm/smolvm-operator/templates") {
                continue;
            } else if path.is_dir() {
                walk(&path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                let text = std::fs::read_to_string(&path).expect("read a manifest");
                assert!(!text.contains("secretGenerator"), "{}: secretGenerator", path.display());
                for doc in serde_norway::Deserializer::from_str(&text) {
                    let value = Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    check_no_secret_material(&value, &path.display().to_string());
                }
            }
        }
    }
    walk(&repo().join("deploy"));
    require_kubectl!();
    for name in kustomizations() {
        let secrets: Vec<&Value> = rendered(&name)
            .iter()
            .filter(|o| str_at(o, "/kind") == "Secret")
            .collect();
        for object in &secrets {
            check_no_secret_material(object, &format!("deploy/{name}: {}", describe(object)));
        }
        // Exactly the overlays whose webhook runs in self-signed mode carry the placeholder.
        let self_signed = rendered(&name).iter().any(|o| {
            str_at(o, "/kind") == "Deployment"
                && o.pointer("/spec/template/spec/containers/0/args")
                    .and_then(Value::as_array)
                    .is_some_and(|args| args.iter().any(|a| a == "--tls-mode=self-signed"))
        });
        assert_eq!(
            secrets.len(),
            usize::from(self_signed),
            "deploy/{name}: the webhook TLS placeholder"
        );
    }
}

/// The usernames the identity ValidatingAdmissionPolicies name are the policy's and the rendered
/// ServiceAccounts': a renamed namespace or account shows up here, never as a silently open rule.
#[test]
pub(super) fn admission_policies_name_the_deployments_service_accounts() {
    require_kubectl!();
    let literals = |o: &Value| -> BTreeSet<String> {
        let text = serde_json::to_string(&o["spec"]).unwrap_or_default();
        text.split('\'')
            .filter(|piece| piece.starts_with("system:serviceaccount:"))
            .map(str::to_string)
            .collect()
    };
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let map: ConfigMap = typed(find(all, "ConfigMap", "smolvm-policy"));
        let text = map
            .data
            .as_ref()
            .and_then(|d| d.get("policy.yaml"))
            .expect("policy.yaml");
        let policy = Policy::from_yaml(text).unwrap_or_else(|e| panic!("deploy/{overlay}: policy.yaml: {e}"));
        let accounts: BTreeSet<String> = objects(all, "ServiceAccount")
            .map(|o| service_account(str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name")))
            .collect();
        let expected = [
            ("smolvm-status-binding", policy.controller_usernames.clone()),
            ("smolvm-runtime-own-node", policy.runtime_usernames.clone()),
            (
                "smolvm-webhook-cabundle-only",
                vec![service_account(NAMESPACE, WEBHOOK)],
            ),
            ("smolvm-controller-own-services", policy.controller_usernames.clone()),
            (
                "smolvm-quota-keys",
                [
                    vec![service_account(NAMESPACE, WEBHOOK)],
                    policy.controller_usernames.clone(),
                ]
                .concat(),
            ),
        ];
        for (name, users) in expected {
            let vap = find(all, "ValidatingAdmissionPolicy", name);
            let named = literals(vap);
            assert_eq!(
                named,
                users.iter().cloned().collect::<BTreeSet<_>>(),
                "deploy/{overlay}: {name} names other users than the policy"
            );
            for user in &named {
                assert!(
                    accounts.contains(user),
                    "deploy/{overlay}: {name}: {user} is not a ServiceAccount here"
                );
            }
            let binding = find(all, "ValidatingAdmissionPolicyBinding", name);
            assert_eq!(str_at(binding, "/spec/policyName"), name, "deploy/{overlay}");
            assert_eq!(
                binding["spec"]["validationActions"],
                serde_json::json!(["Deny"]),
                "deploy/{overlay}"
            );
            assert_eq!(str_at(vap, "/spec/failurePolicy"), "Fail", "deploy/{overlay}: {name}");
        }
    }
}

#[test]
pub(super) fn policy_config_map_parses_and_names_the_service_accounts() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let map: ConfigMap = typed(find(all, "ConfigMap", "smolvm-policy"));
        let text = map
            .data
            .as_ref()
            .and_then(|d| d.get("policy.yaml"))
            .unwrap_or_else(|| panic!("deploy/{overlay}: smolvm-policy has no policy.yaml"));
        let policy = Policy::from_yaml(text).unwrap_or_else(|e| panic!("deploy/{overlay}: policy.yaml: {e}"));
        let accounts: BTreeSet<String> = objects(all, "ServiceAccount")
            .map(|o| service_account(str_at(o, "/metadata/namespace"), str_at(o, "/metadata/name")))
            .collect();
        assert_eq!(
            policy.controller_usernames,
            vec![service_account(NAMESPACE, CONTROLLER)]
        );
        assert_eq!(policy.runtime_usernames, vec![service_account(NAMESPACE, RUNTIME)]);
        for user in policy.controller_usernames.iter().chain(&policy.runtime_usernames) {
            assert!(
                accounts.contains(user),
                "deploy/{overlay}: {user} is not a ServiceAccount here"
            );
        }
        // The webhook, the controller and the runtime agents (--policy) read the mounted file.
        for (workload, flag) in [
            (WEBHOOK, "--policy="),
            (CONTROLLER, "--policy="),
            (RUNTIME, "--policy="),
        ] {
            let (_, template) = workloads(all)
                .into_iter()
                .find(|(n, _)| n == workload)
                .expect("workload");
            let spec = pod_spec(&template, workload);
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.config_map.as_ref().is_some_and(|c| c.name == "smolvm-policy"))
                .unwrap_or_else(|| panic!("deploy/{overlay}: {workload} does not mount smolvm-policy"));
            let c = &spec.containers[0];
            let mount = c
                .volume_mounts
                .iter()
                .flatten()
                .find(|m| m.name == volume.name)
                .expect("policy mount");
            assert!(mount.sub_path.is_none(), "subPath mounts never see ConfigMap updates");
            let arg = c
                .args
                .iter()
                .flatten()
                .find_map(|a| a.strip_prefix(flag))
                .unwrap_or_else(|| panic!("deploy/{overlay}: {workload} has no {flag}"));
            assert_eq!(
                arg,
                format!("{}/policy.yaml", mount.mount_path),
                "deploy/{overlay}: {workload}"
            );
        }
    }
    let checked_in = Policy::from_yaml(&read("deploy/base/policy/policy.yaml")).expect("policy.yaml");
    assert_eq!(
        checked_in,
        Policy::default(),
        "policy.yaml documents the built-in defaults"
    );
}

/// The controller may write only the Services and EndpointSlices it makes for a SmolVM: the
/// ValidatingAdmissionPolicy matches both resources for create, update and delete, and names
/// the label and the owner the controller really sets (controller/src/vm/exposure.rs).
#[test]
pub(super) fn the_controller_writes_only_services_and_endpoint_slices_of_smolvms() {
    require_kubectl!();
    const POLICY: &str = "smolvm-controller-own-services";
    let expose = read("controller/src/vm/exposure.rs");
    for set in [
        "\"app.kubernetes.io/managed-by\".to_string(),",
        "\"smolvm-controller\".to_string(),",
    ] {
        assert!(
            expose.contains(set),
            "controller/src/vm/exposure.rs no longer sets {set}: update {POLICY}"
        );
    }
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let vap: ValidatingAdmissionPolicy = typed(find(all, "ValidatingAdmissionPolicy", POLICY));
        let spec = vap.spec.expect("spec");
        let rules = spec
            .match_constraints
            .as_ref()
            .and_then(|m| m.resource_rules.clone())
            .unwrap_or_default();
        let mut matched: Vec<(String, String, Vec<String>)> = rules
            .iter()
            .flat_map(|r| {
                let groups = r.api_groups.clone().unwrap_or_default();
                let resources = r.resources.clone().unwrap_or_default();
                let mut operations = r.operations.clone().unwrap_or_default();
                operations.sort();
                groups.into_iter().flat_map(move |g| {
                    let operations = operations.clone();
                    resources
                        .clone()
                        .into_iter()
                        .map(move |res| (g.clone(), res, operations.clone()))
                })
            })
            .collect();
        matched.sort();
        let all_writes = vec!["CREATE".to_string(), "DELETE".into(), "UPDATE".into()];
        assert_eq!(
            matched,
            [
                (String::new(), "services".to_string(), all_writes.clone()),
                (
                    "discovery.k8s.io".to_string(),
                    "endpointslices".to_string(),
                    all_writes.clone()
                ),
            ],
            "deploy/{overlay}: {POLICY} matches"
        );
        let text = serde_json::to_string(&spec).unwrap_or_default();
        for needle in [
            "'app.kubernetes.io/managed-by'",
            "== 'smolvm-controller'",
            "r.kind == 'SmolVM'",
            "vm.smolvm.dev/",
            "r.controller",
            "oldObject",
        ] {
            assert!(
                text.contains(needle),
                "deploy/{overlay}: {POLICY} does not check {needle}"
            );
        }
    }
}

/// Issue 56: the runtime's own-node policy keeps an agent to its status and the labels the agent
/// owns, the same list the code names (smolvm_api::constants::AGENT_LABELS, the keys of
/// runtime/src/smolvm_node.rs capability_labels), on every SmolVMNode write it matches; it compares
/// labels, annotations (but the recheck annotation the agent removes), finalizers and owner
/// references with the stored object, and checks a new SmolVMNode's owner against the token's
/// node. (The RBAC table in rbac.rs gives the controller what mirroring the Node's labels takes.)
#[test]
pub(super) fn the_runtime_sets_only_its_own_labels_on_its_smolvm_node() {
    use smolvm_api::constants::{AGENT_LABELS, RECHECK_BOOT_ANNOTATION};
    require_kubectl!();
    const POLICY: &str = "smolvm-runtime-own-node";
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let vap: ValidatingAdmissionPolicy = typed(find(all, "ValidatingAdmissionPolicy", POLICY));
        let spec = vap.spec.expect("spec");
        let mut matched: Vec<(Vec<String>, Vec<String>)> = spec
            .match_constraints
            .as_ref()
            .and_then(|m| m.resource_rules.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|r| {
                let mut operations = r.operations.unwrap_or_default();
                operations.sort();
                let mut resources = r.resources.unwrap_or_default();
                resources.sort();
                (operations, resources)
            })
            .collect();
        matched.sort();
        assert_eq!(
            matched,
            [(
                vec!["CREATE".to_string(), "UPDATE".into()],
                vec!["smolvmnodes".to_string(), "smolvmnodes/status".into()]
            )],
            "deploy/{overlay}: {POLICY} matches"
        );
        let variables = spec.variables.unwrap_or_default();
        let own = variables
            .iter()
            .find(|v| v.name == "ownLabels")
            .unwrap_or_else(|| panic!("deploy/{overlay}: {POLICY} has no ownLabels variable"));
        let listed: Vec<String> = own
            .expression
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|k| k.trim().trim_matches('\'').to_string())
            .collect();
        assert_eq!(
            listed, AGENT_LABELS,
            "deploy/{overlay}: {POLICY}'s ownLabels and smolvm_api::constants::AGENT_LABELS differ"
        );
        let text = serde_json::to_string(&variables).unwrap_or_default()
            + &serde_json::to_string(&spec.validations).unwrap_or_default();
        for needle in [
            "oldObject.metadata.labels",
            "oldObject.metadata.annotations",
            "oldObject.metadata.finalizers",
            "oldObject.metadata.ownerReferences",
            &format!("k != '{RECHECK_BOOT_ANNOTATION}'"),
            "r.kind == 'Node'",
            "variables.uidClaim",
        ] {
            assert!(
                text.contains(needle),
                "deploy/{overlay}: {POLICY} does not check {needle}"
            );
        }
    }
}
