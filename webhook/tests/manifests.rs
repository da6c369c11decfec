//! The webhook configuration manifests (deploy/base/webhook): their shape, and their
//! matchConditions CEL evaluated offline with kube's `cel` feature (kube-cel). A real API server
//! remains the final judge of the CEL; this checks the logic on the cases that matter.

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::core::cel::{AdmissionRequest, VapEvaluator, VapExpression};
use serde::Deserialize;
use serde_json::{Value, json};
use smolvm_api::fixtures;

fn manifests() -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/base/webhook/webhook-configurations.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut docs = serde_norway::Deserializer::from_str(&text);
    let m = MutatingWebhookConfiguration::deserialize(docs.next().unwrap_or_else(|| panic!("no document")))
        .unwrap_or_else(|e| panic!("mutating: {e}"));
    let v = ValidatingWebhookConfiguration::deserialize(docs.next().unwrap_or_else(|| panic!("no document")))
        .unwrap_or_else(|e| panic!("validating: {e}"));
    (m, v)
}

#[test]
fn webhook_configurations_have_the_required_shape() {
    let (m, v) = manifests();
    let mut resources = Vec::new();
    let mutating = m.webhooks.unwrap_or_default();
    let validating = v.webhooks.unwrap_or_default();
    assert_eq!(mutating.len(), 1);
    assert_eq!(validating.len(), 5);
    for w in &mutating {
        assert_eq!(w.reinvocation_policy.as_deref(), Some("IfNeeded"), "{}", w.name);
    }
    let all = mutating
        .iter()
        .map(|w| {
            (
                &w.name,
                &w.failure_policy,
                &w.side_effects,
                w.timeout_seconds,
                &w.admission_review_versions,
                &w.rules,
                &w.match_conditions,
                &w.client_config,
            )
        })
        .chain(validating.iter().map(|w| {
            (
                &w.name,
                &w.failure_policy,
                &w.side_effects,
                w.timeout_seconds,
                &w.admission_review_versions,
                &w.rules,
                &w.match_conditions,
                &w.client_config,
            )
        }));
    for (name, failure, side_effects, timeout, versions, rules, conditions, client) in all {
        // The one webhook a DELETE reaches is the SmolVMClass deletion warning: it refuses
        // nothing, so it fails open; every other webhook fails closed and never sees a DELETE.
        let warn_only = name.starts_with("warn-delete.");
        let classes = rules
            .iter()
            .flatten()
            .all(|r| r.resources.iter().flatten().all(|x| x == "smolvmclasses"));
        assert_eq!(
            failure.as_deref(),
            Some(if warn_only { "Ignore" } else { "Fail" }),
            "{name}"
        );
        // The validating review of SmolVMs charges their namespace's ResourceQuotas (V15), never
        // on a dry run; no other webhook writes anything.
        let charges = name == "validate.smolvms.vm.smolvm.dev";
        assert_eq!(side_effects, if charges { "NoneOnDryRun" } else { "None" }, "{name}");
        assert!(timeout.is_some_and(|t| (1..=5).contains(&t)), "{name}");
        assert_eq!(versions, &vec!["v1".to_string()], "{name}");
        // Classes have no finalizers to exempt.
        assert_eq!(
            conditions.as_ref().map(Vec::len),
            if classes { None } else { Some(1) },
            "{name}: the finalizer exemption"
        );
        let service = client.service.as_ref().unwrap_or_else(|| panic!("{name}: service"));
        assert_eq!(
            (service.name.as_str(), service.namespace.as_str(), service.port),
            ("smolvm-webhook", "smolvm-system", Some(443))
        );
        for rule in rules.iter().flatten() {
            let ops = rule.operations.clone().unwrap_or_default();
            if warn_only {
                assert_eq!(ops, vec!["DELETE".to_string()], "{name}");
            } else {
                assert!(!ops.iter().any(|o| o == "DELETE" || o == "*"), "{name}: {ops:?}");
                assert!(ops.contains(&"CREATE".to_string()) && ops.contains(&"UPDATE".to_string()));
            }
            resources.extend(rule.resources.clone().unwrap_or_default());
        }
    }
    for r in ["smolvms", "smolvmnodes", "smolvmclasses", "smolvmpools"] {
        assert!(resources.iter().any(|x| x == r), "{r} not covered");
    }
    // Status writes (heartbeats, the controller's status) never wait on the webhook: their
    // identity rules are ValidatingAdmissionPolicies and CRD CEL, which the API server runs itself.
    for r in ["smolvms/status", "smolvmnodes/status"] {
        assert!(!resources.iter().any(|x| x == r), "{r} is sent to the webhook");
    }
    let paths: Vec<_> = mutating
        .iter()
        .map(|w| w.client_config.service.as_ref().and_then(|s| s.path.clone()))
        .chain(
            validating
                .iter()
                .map(|w| w.client_config.service.as_ref().and_then(|s| s.path.clone())),
        )
        .collect();
    assert_eq!(
        paths,
        vec![
            Some("/mutate/smolvms".into()),
            Some("/validate/smolvms".into()),
            Some("/validate/smolvmnodes".into()),
            Some("/validate/smolvmclasses".into()),
            Some("/validate/smolvmpools".into()),
            Some("/validate/smolvmclasses".into())
        ]
    );
}

fn calls_webhook(expression: &str, op: &str, object: &Value, old: Option<&Value>) -> bool {
    let mut builder = VapEvaluator::builder()
        .object(object.clone())
        .request(AdmissionRequest {
            operation: op.into(),
            ..Default::default()
        });
    if let Some(old) = old {
        builder = builder.old_object(old.clone());
    }
    let results = builder.build().evaluate(&[VapExpression {
        expression: expression.to_string(),
        message: None,
        message_expression: None,
    }]);
    assert_eq!(results.len(), 1);
    if let Some(message) = &results[0].message {
        assert!(!message.contains("rror"), "evaluation error: {message}");
    }
    results[0].passed
}

#[test]
fn match_condition_never_sends_finalizer_removal() {
    let (m, v) = manifests();
    let mut expressions: Vec<String> = m
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .flat_map(|w| w.match_conditions.unwrap_or_default())
        .chain(
            v.webhooks
                .unwrap_or_default()
                .into_iter()
                .flat_map(|w| w.match_conditions.unwrap_or_default()),
        )
        .map(|c| c.expression)
        .collect();
    expressions.dedup();
    assert_eq!(expressions.len(), 1, "the same exemption everywhere");
    let expr = &expressions[0];

    let live = fixtures::bound(fixtures::alpine(), "node-a");
    let deleting = fixtures::deleting(live.clone());
    let mut released = deleting.clone();
    released["metadata"]["finalizers"] = json!([]);
    let mut released_absent = deleting.clone();
    if let Some(meta) = released_absent["metadata"].as_object_mut() {
        meta.remove("finalizers");
    }
    let mut released_and_spec = released.clone();
    released_and_spec["spec"]["image"] = json!("evil:latest");
    let mut released_and_annotated = released.clone();
    released_and_annotated["metadata"]["annotations"] = json!({"vm.smolvm.dev/force-delete-local-state": "true"});
    let mut live_finalizer_removed = live.clone();
    live_finalizer_removed["metadata"]["finalizers"] = json!([]);
    let mut live_with_finalizer = live.clone();
    live_with_finalizer["metadata"]["finalizers"] = json!(["vm.smolvm.dev/node-cleanup"]);
    let node = serde_json::to_value(fixtures::node("node-a", 4, 4096, 100)).unwrap_or_default();

    // (case, operation, object, oldObject, webhook called?)
    let table: Vec<(&str, &str, &Value, Option<&Value>, bool)> = vec![
        ("create", "CREATE", &live, None, true),
        ("ordinary update", "UPDATE", &live, Some(&live), true),
        (
            "finalizer removal while deleting: exempt",
            "UPDATE",
            &released,
            Some(&deleting),
            false,
        ),
        (
            "finalizers field dropped while deleting: exempt",
            "UPDATE",
            &released_absent,
            Some(&deleting),
            false,
        ),
        (
            "finalizer removal plus spec change: checked",
            "UPDATE",
            &released_and_spec,
            Some(&deleting),
            true,
        ),
        (
            "finalizer removal plus annotation: checked",
            "UPDATE",
            &released_and_annotated,
            Some(&deleting),
            true,
        ),
        (
            "other update while deleting: checked",
            "UPDATE",
            &deleting,
            Some(&deleting),
            true,
        ),
        (
            "finalizer removal on a live object: checked",
            "UPDATE",
            &live_finalizer_removed,
            Some(&live_with_finalizer),
            true,
        ),
        ("smolvmnode update", "UPDATE", &node, Some(&node), true),
    ];
    for (case, op, object, old, want) in table {
        assert_eq!(calls_webhook(expr, op, object, old), want, "{case}");
    }
}

// ---------------------------------------------------------------------------------------------
// The identity ValidatingAdmissionPolicies (deploy/base/admission-policies/identity.yaml), with
// their variables, matchConditions and validations evaluated offline by the cel crate kube-cel
// builds on, with Kubernetes' CEL libraries registered. The e2e tier runs them on a real API
// server; the caBundle policy (CEL optional syntax, which this evaluator does not parse) is
// judged there only.
// ---------------------------------------------------------------------------------------------

mod policies {
    use kube::core::cel::{
        KubeCelExt,
        cel::{Context, Program, Value as Cel},
    };
    use serde_json::{Value, json};
    use smolvm_api::fixtures;

    const CONTROLLER: &str = "system:serviceaccount:smolvm-system:smolvm-controller";
    const RUNTIME: &str = "system:serviceaccount:smolvm-system:smolvm-runtime";
    const WEBHOOK: &str = "system:serviceaccount:smolvm-system:smolvm-webhook";

    /// The policy `name` from the file `file` of deploy/base/admission-policies.
    fn policy_in(file: &str, name: &str) -> Value {
        let path = format!(
            "{}/../deploy/base/admission-policies/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        serde_norway::Deserializer::from_str(&text)
            .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
            .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{path}: no policy {name}"))
    }

    fn policy(name: &str) -> Value {
        policy_in("identity.yaml", name)
    }

    fn eval(expression: &str, ctx: &Context<'_>) -> Cel {
        let program = Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
        program
            .execute(ctx)
            .unwrap_or_else(|e| panic!("{expression}: evaluation error {e:?}"))
    }

    /// The messages of the validations that fail, or `None` when a matchCondition excludes the
    /// request.
    fn judge(policy: &Value, request: &Value, object: &Value, old: Option<&Value>) -> Option<Vec<String>> {
        judge_with_params(policy, request, object, old, &Value::Null)
    }

    /// [`judge`] for a policy with a `paramKind`: `params` is the object its binding names.
    fn judge_with_params(
        policy: &Value,
        request: &Value,
        object: &Value,
        old: Option<&Value>,
        params: &Value,
    ) -> Option<Vec<String>> {
        let mut ctx = Context::default();
        ctx.register_all();
        let to = |v: &Value| kube::core::cel::cel::to_value(v).unwrap_or_else(|e| panic!("{e}"));
        ctx.add_variable_from_value("object", to(object));
        ctx.add_variable_from_value("oldObject", old.map_or(Cel::Null, to));
        ctx.add_variable_from_value("request", to(request));
        ctx.add_variable_from_value("params", to(params));
        let spec = &policy["spec"];
        for condition in spec["matchConditions"].as_array().into_iter().flatten() {
            let expression = condition["expression"].as_str().unwrap_or_default();
            if eval(expression, &ctx) != Cel::Bool(true) {
                return None;
            }
        }
        let mut variables = std::collections::HashMap::new();
        for variable in spec["variables"].as_array().into_iter().flatten() {
            let name = variable["name"].as_str().unwrap_or_default().to_string();
            let value = eval(variable["expression"].as_str().unwrap_or_default(), &ctx);
            variables.insert(name, value);
            let map: std::collections::HashMap<String, Cel> = variables.clone();
            ctx.add_variable_from_value("variables", map);
        }
        let mut failed = Vec::new();
        for validation in spec["validations"].as_array().into_iter().flatten() {
            let expression = validation["expression"].as_str().unwrap_or_default();
            if eval(expression, &ctx) != Cel::Bool(true) {
                let message = match validation["messageExpression"].as_str() {
                    Some(m) => match eval(m, &ctx) {
                        Cel::String(s) => s.to_string(),
                        other => panic!("message is not a string: {other:?}"),
                    },
                    None => validation["message"].as_str().unwrap_or_default().to_string(),
                };
                failed.push(message);
            }
        }
        Some(failed)
    }

    /// One case of a policy's table: its name, the request, the old and new objects, and a
    /// fragment of each message that must fail, in order.
    type Case<'a> = (&'a str, Value, Option<&'a Value>, &'a Value, Vec<&'a str>);

    /// Judges every case of `cases` with `policy`: as many failures as fragments, each message
    /// matching its fragment (`matches`) and ending with `rule`.
    fn judge_cases(policy: &Value, cases: &[Case<'_>], rule: &str, matches: impl Fn(&str, &str) -> bool) {
        for (name, req, old, new, expected) in cases {
            let failed = judge(policy, req, new, *old).unwrap_or_else(|| panic!("{name}: not matched"));
            assert_eq!(failed.len(), expected.len(), "{name}: {failed:?}");
            for (message, fragment) in failed.iter().zip(expected) {
                assert!(
                    matches(message, fragment) && message.ends_with(rule),
                    "{name}: {message}"
                );
            }
        }
    }

    /// V15's guard (admission-policies/quota.yaml): the webhook and the controller may write only
    /// the product's keys of a ResourceQuota's status; others are not the policy's concern.
    #[test]
    fn v15_the_webhook_and_the_controller_write_only_the_products_quota_keys() {
        let p = policy_in("quota.yaml", "smolvm-quota-keys");
        let quota = |used: Value, hard: Value| {
            json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "vms", "namespace": "team-a"},
            "spec": {"hard": {"vm.smolvm.dev/cpus": "4", "pods": "10"}},
            "status": {"used": used, "hard": hard}})
        };
        let hard = json!({"vm.smolvm.dev/cpus": "4", "pods": "10"});
        let before = quota(json!({"vm.smolvm.dev/cpus": "2", "pods": "3"}), hard.clone());
        let charged = quota(json!({"vm.smolvm.dev/cpus": "4", "pods": "3"}), hard.clone());
        let freed_pods = quota(json!({"vm.smolvm.dev/cpus": "2", "pods": "0"}), hard.clone());
        let dropped_pods = quota(json!({"vm.smolvm.dev/cpus": "2"}), hard.clone());
        let added = quota(
            json!({"vm.smolvm.dev/cpus": "2", "pods": "3", "requests.cpu": "0"}),
            hard.clone(),
        );
        let hard_written = quota(
            json!({"vm.smolvm.dev/cpus": "2", "pods": "3"}),
            json!({"vm.smolvm.dev/cpus": "8", "pods": "10"}),
        );
        let pods_raised = quota(
            json!({"vm.smolvm.dev/cpus": "2", "pods": "3"}),
            json!({"vm.smolvm.dev/cpus": "4", "pods": "99"}),
        );
        let fresh = quota(json!({"vm.smolvm.dev/cpus": "0"}), json!({"vm.smolvm.dev/cpus": "4"}));
        let bare = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "vms"}, "spec": {"hard": {"pods": "10"}}});
        for user in [WEBHOOK, CONTROLLER] {
            let update = request(user, "UPDATE", "status", json!({}));
            let cases: Vec<Case<'_>> = vec![
                (
                    "a charge of the product's key",
                    update.clone(),
                    Some(&before),
                    &charged,
                    vec![],
                ),
                (
                    "status.hard of the product's key (the recount)",
                    update.clone(),
                    Some(&before),
                    &hard_written,
                    vec![],
                ),
                (
                    "the first figures of a bare quota",
                    update.clone(),
                    Some(&bare),
                    &fresh,
                    vec![],
                ),
                (
                    "another key lowered",
                    update.clone(),
                    Some(&before),
                    &freed_pods,
                    vec!["status.used: "],
                ),
                (
                    "another key removed",
                    update.clone(),
                    Some(&before),
                    &dropped_pods,
                    vec!["status.used: "],
                ),
                (
                    "another key added",
                    update.clone(),
                    Some(&before),
                    &added,
                    vec!["status.used: "],
                ),
                (
                    "another limit raised",
                    update.clone(),
                    Some(&before),
                    &pods_raised,
                    vec!["status.hard: "],
                ),
            ];
            judge_cases(&p, &cases, "[V15]", |message, fragment| message.starts_with(fragment));
        }
        // Anyone else (the quota controller, an admin) is not this policy's concern.
        let other = request("system:kube-controller-manager", "UPDATE", "status", json!({}));
        assert_eq!(judge(&p, &other, &freed_pods, Some(&before)), None);
    }

    /// A holder Pod as the controller makes it (SPEC 2.5, controller/src/vm/volumes.rs).
    fn holder_pod() -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "db-holder", "namespace": "team-a",
            "labels": {"vm.smolvm.dev/holder": "true", "vm.smolvm.dev/smolvm": "db",
                "app.kubernetes.io/managed-by": "smolvm-controller"},
            "annotations": {"vm.smolvm.dev/smolvm-uid": "1234"},
            "ownerReferences": [{"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM", "name": "db",
                "uid": "1234", "controller": true, "blockOwnerDeletion": true}]},
        "spec": {
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "priorityClassName": "smolvm-holder",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{"name": "hold", "image": "registry.example/smolvm-runtime:1",
                "command": ["/usr/local/bin/smolvm-runtime", "hold"],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}}}],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "db-data"}},
                {"name": "config", "configMap": {"name": "app"}},
                {"name": "smolvm-holder-identity", "downwardAPI": {"items": [
                    {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
            ]}})
    }

    /// The controller's holder Pods (admission-policies/holder-pods.yaml): only a holder's shape,
    /// of the holder image from the policy's param, and only holders deleted.
    #[test]
    fn the_controller_creates_and_deletes_only_holder_pods() {
        let p = policy_in("holder-pods.yaml", "smolvm-controller-holder-pods");
        let params = json!({"data": {"holderImage": "registry.example/smolvm-runtime:1"}});
        let named = |op: &str, name: &str| {
            json!({"operation": op, "namespace": "team-a", "name": name, "subResource": "",
                "userInfo": {"username": CONTROLLER, "extra": {}}})
        };
        let create = named("CREATE", "db-holder");
        let delete = named("DELETE", "db-holder");
        let delete_other = named("DELETE", "web");
        let good = holder_pod();
        let set = |pointer: &str, value: Value| fixtures::with(holder_pod(), pointer, value).expect(pointer);
        let cases: Vec<(&str, &Value, Option<&Value>, Value, usize)> = vec![
            ("the holder", &create, None, good.clone(), 0),
            (
                "privileged",
                &create,
                None,
                set("/spec/containers/0/securityContext/privileged", json!(true)),
                1,
            ),
            (
                "a capability added",
                &create,
                None,
                set(
                    "/spec/containers/0/securityContext/capabilities/add",
                    json!(["SYS_ADMIN"]),
                ),
                1,
            ),
            ("host network", &create, None, set("/spec/hostNetwork", json!(true)), 1),
            (
                "a token",
                &create,
                None,
                set("/spec/automountServiceAccountToken", json!(true)),
                1,
            ),
            ("a node name", &create, None, set("/spec/nodeName", json!("node-a")), 1),
            (
                "a hostPath",
                &create,
                None,
                set("/spec/volumes/0", json!({"name": "data", "hostPath": {"path": "/"}})),
                1,
            ),
            ("another name", &create, None, set("/metadata/name", json!("db")), 1),
            (
                "no owner",
                &create,
                None,
                set("/metadata/ownerReferences", json!([])),
                1,
            ),
            ("deleting a holder", &delete, Some(&good), Value::Null, 0),
        ];
        for (name, req, old, object, failures) in &cases {
            let failed =
                judge_with_params(&p, req, object, *old, &params).unwrap_or_else(|| panic!("{name}: not matched"));
            assert_eq!(failed.len(), *failures, "{name}: {failed:?}");
        }
        let other = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "team-a",
            "labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
        let failed = judge_with_params(&p, &delete_other, &Value::Null, Some(&other), &params).expect("matched");
        assert_eq!(failed.len(), 1, "deleting another Pod is refused: {failed:?}");
        assert!(failed[0].contains("team-a/web"), "{failed:?}");
        // Anyone else's Pods are not this policy's concern.
        let user = request("alice", "CREATE", "", json!({}));
        assert_eq!(judge_with_params(&p, &user, &other, None, &Value::Null), None);
        // The image is its own policy's, with the holder image as its param, matched to holder
        // Pods only (so that a param it cannot read never refuses anyone else's Pods).
        let image = policy_in("holder-pods.yaml", "smolvm-controller-holder-image");
        assert!(image["spec"]["paramKind"].is_object() && p["spec"]["paramKind"].is_null());
        assert_eq!(
            image["spec"]["matchConstraints"]["objectSelector"]["matchLabels"]["vm.smolvm.dev/holder"],
            "true"
        );
        let failures = |object: &Value| {
            judge_with_params(&image, &create, object, None, &params)
                .unwrap_or_else(|| panic!("not matched"))
                .len()
        };
        assert_eq!(failures(&good), 0);
        assert_eq!(failures(&set("/spec/containers/0/image", json!("evil:1"))), 1);
    }

    fn request(username: &str, op: &str, sub: &str, extra: Value) -> Value {
        json!({"operation": op, "subResource": sub, "userInfo": {"username": username, "extra": extra}})
    }

    fn stored() -> Value {
        fixtures::stored_alpine().unwrap_or_else(|| panic!("the fixture defaults"))
    }

    fn set(v: Value, pointer: &str, value: Value) -> Value {
        fixtures::with(v, pointer, value).unwrap_or_else(|| panic!("no {pointer}"))
    }

    /// V6, V12 and V14: how a spec may change, judged on spec writes only (the policy does not
    /// match `smolvms/status`), for every user.
    #[test]
    fn v6_v12_v14_spec_transitions() {
        let p = policy_in("spec-transitions.yaml", "smolvm-spec-transitions");
        let rules = &p["spec"]["matchConstraints"]["resourceRules"];
        assert_eq!(rules[0]["resources"], json!(["smolvms"]), "spec writes only");
        assert_eq!(rules[0]["operations"], json!(["UPDATE"]));
        let bound = fixtures::bound(stored(), "node-a");
        let unbound = stored();
        let cases: Vec<(&str, Value, Value, Option<&str>)> = vec![
            (
                "v6_cel_unbound_image_change_ok",
                unbound.clone(),
                set(unbound.clone(), "/spec/image", json!("alpine:3")),
                None,
            ),
            (
                "v6_cel_bound_image_change",
                bound.clone(),
                set(bound.clone(), "/spec/image", json!("alpine:3")),
                Some("spec.image is immutable"),
            ),
            (
                "v6_cel_bound_ports_change",
                bound.clone(),
                set(bound.clone(), "/spec/network/ports/0/hostPort", json!(9090)),
                Some("ports are immutable"),
            ),
            (
                "v6_cel_bound_network_disable",
                bound.clone(),
                set(bound.clone(), "/spec/network", json!({"enabled": false})),
                Some("network.enabled is immutable"),
            ),
            (
                "v6_cel_bound_cidrs_added",
                bound.clone(),
                set(bound.clone(), "/spec/network/allowedCIDRs", json!(["10.0.0.0/8"])),
                Some("allowedCIDRs are immutable"),
            ),
            (
                "v6_cel_bound_command_change",
                bound.clone(),
                set(bound.clone(), "/spec/command", json!(["/bin/other"])),
                Some("delete and recreate (V6)"),
            ),
            (
                "v6_cel_bound_env_added",
                bound.clone(),
                set(bound.clone(), "/spec/env", json!([{"name": "A", "value": "1"}])),
                Some("spec.env and spec.imagePullSecrets are immutable"),
            ),
            (
                "v6_cel_bound_restart_policy_change",
                bound.clone(),
                set(bound.clone(), "/spec/restartPolicy", json!("Never")),
                Some("spec.restartPolicy and spec.terminationGracePeriodSeconds are immutable"),
            ),
            (
                "v6_cel_bound_restart_policy_default_spelled_out_ok",
                bound.clone(),
                set(bound.clone(), "/spec/restartPolicy", json!("Always")),
                None,
            ),
            (
                "v6_cel_unbound_command_change_ok",
                unbound.clone(),
                set(unbound.clone(), "/spec/command", json!(["/bin/other"])),
                None,
            ),
            (
                "v6_cel_bound_storage_grow_ok",
                bound.clone(),
                set(bound.clone(), "/spec/storage/storageGiB", json!(40)),
                None,
            ),
            (
                "v6_cel_bound_storage_shrink",
                bound.clone(),
                set(bound.clone(), "/spec/storage/storageGiB", json!(10)),
                Some("storageGiB may only grow"),
            ),
            (
                "v6_cel_bound_overlay_shrink",
                bound.clone(),
                set(bound.clone(), "/spec/storage/overlayGiB", json!(1)),
                Some("overlayGiB may only grow"),
            ),
            (
                "v6_cel_bound_cpu_change_ok",
                bound.clone(),
                set(bound.clone(), "/spec/resources/cpus", json!(4)),
                None,
            ),
            ("v9_cel_binding_first_write_ok", unbound.clone(), bound.clone(), None),
            (
                "v14_cel_pool_ref_set_after_create",
                unbound.clone(),
                set(unbound.clone(), "/spec/poolRef", json!({"name": "sandboxes"})),
                Some("spec.poolRef never changes after CREATE"),
            ),
            (
                "v14_cel_pool_ref_changed",
                set(unbound.clone(), "/spec/poolRef", json!({"name": "sandboxes"})),
                set(unbound.clone(), "/spec/poolRef", json!({"name": "other"})),
                Some("(V14)"),
            ),
            (
                "v14_cel_pool_ref_kept_ok",
                set(unbound.clone(), "/spec/poolRef", json!({"name": "sandboxes"})),
                set(
                    set(unbound.clone(), "/spec/poolRef", json!({"name": "sandboxes"})),
                    "/spec/running",
                    json!(false),
                ),
                None,
            ),
            (
                "v6_bound_ports_removed",
                bound.clone(),
                set(bound.clone(), "/spec/network/ports", json!([])),
                Some("ports are immutable"),
            ),
            (
                "v6_bound_ports_absent_and_empty_are_the_same",
                set(bound.clone(), "/spec/network/ports", json!([])),
                {
                    let mut v = bound.clone();
                    if let Some(n) = v["spec"]["network"].as_object_mut() {
                        n.remove("ports");
                    }
                    v
                },
                None,
            ),
            (
                "v6_bound_allowed_hosts_added",
                bound.clone(),
                set(bound.clone(), "/spec/network/allowedHosts", json!(["example.com"])),
                Some("allowedHosts are immutable"),
            ),
            (
                "v12_class_changed",
                set(bound.clone(), "/spec/className", json!("small")),
                set(bound.clone(), "/spec/className", json!("large")),
                Some("spec.className never changes after CREATE"),
            ),
        ];
        let request = request("alice@example.com", "UPDATE", "", json!({}));
        for (name, old, new, expected) in cases {
            let failed = judge(&p, &request, &new, Some(&old)).unwrap_or_else(|| panic!("{name}: not matched"));
            match expected {
                None => assert!(failed.is_empty(), "{name}: {failed:?}"),
                Some(text) => assert!(
                    failed.iter().any(|m| m.contains(text)),
                    "{name}: expected {text:?}, got {failed:?}"
                ),
            }
        }
    }

    #[test]
    fn v9_binding_and_machine_name_are_the_controllers_to_write_once() {
        let p = policy("smolvm-status-binding");
        let unbound = fixtures::alpine();
        let bound = fixtures::bound(fixtures::alpine(), "node-a");
        let mut tampered = bound.clone();
        tampered["status"]["machineName"] = json!("svm-someone-else");
        let mut bound_no_machine = bound.clone();
        if let Some(s) = bound_no_machine["status"].as_object_mut() {
            s.remove("machineName");
        }
        let user = "alice@example.com";
        // (case, user, old, new, failing rule message fragments)
        let cases: Vec<(&str, &str, &Value, &Value, Vec<&str>)> = vec![
            ("controller binds", CONTROLLER, &unbound, &bound, vec![]),
            (
                "user binds",
                user,
                &unbound,
                &bound,
                vec![
                    "only the controller may write the binding fields",
                    "only the controller may write the machine name",
                ],
            ),
            (
                "controller writes a foreign machine name",
                CONTROLLER,
                &bound_no_machine,
                &tampered,
                vec!["must be svm-"],
            ),
            (
                "anyone writes other status fields of a bound VM",
                user,
                &bound,
                &bound,
                vec![],
            ),
            // Changing a written field is the CRD's transition rules' to refuse, for everyone.
            ("retarget left to the CRD rules", user, &bound, &tampered, vec![]),
        ];
        for (name, who, old, new, expected) in cases {
            let failed = judge(&p, &request(who, "UPDATE", "status", json!({})), new, Some(old))
                .unwrap_or_else(|| panic!("{name}: not matched"));
            assert_eq!(failed.len(), expected.len(), "{name}: {failed:?}");
            for (message, fragment) in failed.iter().zip(&expected) {
                assert!(
                    message.contains(fragment) && message.ends_with("[V9]"),
                    "{name}: {message}"
                );
            }
        }
    }

    /// (case, request, old, new, failing rule message fragments)
    type NodeCase<'a> = (&'a str, Value, Option<&'a Value>, &'a Value, Vec<&'a str>);

    #[test]
    fn v10_a_runtime_writes_only_its_own_node() {
        let p = policy("smolvm-runtime-own-node");
        let node = |name: &str, unschedulable: bool| {
            let mut n = serde_json::to_value(fixtures::node(name, 4, 4096, 100)).unwrap_or_default();
            n["metadata"]["uid"] = json!("0b7c5d2e-91aa-4c1e-8f00-5e4f3a2b1c0d");
            n["spec"]["unschedulable"] = json!(unschedulable);
            n
        };
        let claims = |name: &str, uid: &str| json!({"authentication.kubernetes.io/node-name": [name], "authentication.kubernetes.io/node-uid": [uid]});
        let own = claims("node-a", "uid-node-a");
        let (a, a_cordoned, b) = (node("node-a", false), node("node-a", true), node("node-b", false));
        let mut a_wrong_uid = a.clone();
        a_wrong_uid["status"]["nodeUID"] = json!("uid-other");
        // What an agent creates: no label but its own (the controller mirrors the Node's).
        let created = |unschedulable: bool| {
            let mut n = node("node-a", unschedulable);
            n["metadata"]["labels"] = json!({});
            n
        };
        let (a_created, a_created_cordoned) = (created(false), created(true));
        let cases: Vec<NodeCase<'_>> = vec![
            (
                "own heartbeat",
                request(RUNTIME, "UPDATE", "status", own.clone()),
                Some(&a),
                &a,
                vec![],
            ),
            (
                "own create",
                request(RUNTIME, "CREATE", "", own.clone()),
                None,
                &a_created,
                vec![],
            ),
            (
                "another node's heartbeat",
                request(RUNTIME, "UPDATE", "status", own.clone()),
                Some(&b),
                &b,
                vec![
                    "is not this runtime agent's node",
                    "is not the UID of the requester's node",
                ],
            ),
            (
                "no node claim",
                request(RUNTIME, "UPDATE", "status", json!({})),
                Some(&a),
                &a,
                vec!["carries no node claim"],
            ),
            (
                "another node's UID",
                request(RUNTIME, "UPDATE", "status", own.clone()),
                Some(&a),
                &a_wrong_uid,
                vec!["is not the UID of the requester's node"],
            ),
            (
                "runtime uncordons",
                request(RUNTIME, "UPDATE", "", own.clone()),
                Some(&a_cordoned),
                &a,
                vec!["cluster admin's cordon"],
            ),
            (
                "runtime creates cordoned",
                request(RUNTIME, "CREATE", "", own.clone()),
                None,
                &a_created_cordoned,
                vec!["cluster admin's cordon"],
            ),
            (
                "runtime keeps the admin's cordon",
                request(RUNTIME, "UPDATE", "", own.clone()),
                Some(&a_cordoned),
                &a_cordoned,
                vec![],
            ),
        ];
        judge_cases(&p, &cases, "[V10]", |message, fragment| message.contains(fragment));
        // An admin's cordon is not this policy's business.
        let admin = request("kubernetes-admin", "UPDATE", "", json!({}));
        assert_eq!(judge(&p, &admin, &a_cordoned, Some(&a)), None);
    }

    /// Issue 56: a runtime agent sets on its SmolVMNode only its status and its own three labels,
    /// as api/tests/rules/nodes.rs has the webhook's V10 say; each message names the key, the
    /// value and [V10].
    #[test]
    fn v10_a_runtime_sets_only_its_own_labels() {
        let p = policy("smolvm-runtime-own-node");
        let own = json!({"authentication.kubernetes.io/node-name": ["node-a"],
            "authentication.kubernetes.io/node-uid": ["uid-node-a"]});
        let owner = json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a"}]);
        let labelled = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
            "metadata": {"name": "node-a", "uid": "0b7c5d2e-91aa-4c1e-8f00-5e4f3a2b1c0d",
                "labels": {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1",
                    "team": "admins", "vm.smolvm.dev/node": "node-a", "vm.smolvm.dev/gpu-count": "1"},
                "annotations": {"vm.smolvm.dev/mirrored-labels": "kubernetes.io/hostname,topology.kubernetes.io/zone"},
                "ownerReferences": owner},
            "spec": {}, "status": {"nodeUID": "uid-node-a"}});
        let created = json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMNode",
            "metadata": {"name": "node-a", "ownerReferences": owner}, "spec": {}});
        let set = |object: &Value, pointer: &str, value: Value| {
            let mut object = object.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap_or_default();
            let key = key.replace("~1", "/");
            match object.pointer_mut(parent).and_then(Value::as_object_mut) {
                Some(map) if value.is_null() => {
                    map.remove(&key);
                }
                Some(map) => {
                    map.insert(key, value);
                }
                None => panic!("{pointer}: no parent"),
            }
            object
        };
        let labels = "/metadata/labels";
        let annotations = "/metadata/annotations";
        let tenant = set(&labelled, &format!("{labels}/tenant"), json!("a"));
        let bootable = set(
            &labelled,
            &format!("{labels}/vm.smolvm.dev~1guest-bootable"),
            json!("true"),
        );
        let no_gpu = set(&labelled, &format!("{labels}/vm.smolvm.dev~1gpu-count"), Value::Null);
        let zone = set(
            &labelled,
            &format!("{labels}/topology.kubernetes.io~1zone"),
            json!("z2"),
        );
        let no_team = set(&labelled, &format!("{labels}/team"), Value::Null);
        let recheck = set(
            &labelled,
            &format!("{annotations}/vm.smolvm.dev~1recheck-boot"),
            json!("true"),
        );
        let rewritten = set(
            &labelled,
            &format!("{annotations}/vm.smolvm.dev~1mirrored-labels"),
            json!(""),
        );
        let finalized = set(&labelled, "/metadata/finalizers", json!(["example.com/keep"]));
        let orphaned = set(&labelled, "/metadata/ownerReferences", Value::Null);
        let unannotated = set(&labelled, annotations, json!({}));
        let created_bootable = set(&created, labels, json!({"vm.smolvm.dev/guest-bootable": "false"}));
        let created_tenant = set(&created, labels, json!({"tenant": "a"}));
        let created_annotated = set(
            &created,
            annotations,
            json!({"vm.smolvm.dev/mirrored-labels": "tenant"}),
        );
        let created_finalized = set(&created, "/metadata/finalizers", json!(["example.com/keep"]));
        let created_elsewhere = set(
            &created,
            "/metadata/ownerReferences",
            json!([{"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": "uid-node-b"}]),
        );
        let created_forged = set(
            &created,
            "/metadata/ownerReferences",
            json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "forged"}]),
        );
        let create = request(RUNTIME, "CREATE", "", own.clone());
        let update = request(RUNTIME, "UPDATE", "", own.clone());
        let cases: Vec<NodeCase<'_>> = vec![
            (
                "create with its own label",
                create.clone(),
                None,
                &created_bootable,
                vec![],
            ),
            (
                "create with a tenant label",
                create.clone(),
                None,
                &created_tenant,
                vec![r#"metadata.labels["tenant"]: "a": a runtime agent sets only its own labels"#],
            ),
            (
                "create with an annotation",
                create.clone(),
                None,
                &created_annotated,
                vec![r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]: "tenant": a runtime agent may not set"#],
            ),
            (
                "create with a finalizer",
                create.clone(),
                None,
                &created_finalized,
                vec!["metadata.finalizers: a runtime agent may not set or change the finalizers"],
            ),
            (
                "create owned by another node",
                create.clone(),
                None,
                &created_elsewhere,
                vec![
                    "metadata.ownerReferences: a runtime agent's SmolVMNode is owned by its own Node only (v1 Node node-a, uid uid-node-a)",
                ],
            ),
            (
                "create owned by a forged node UID",
                create.clone(),
                None,
                &created_forged,
                vec!["metadata.ownerReferences: a runtime agent's SmolVMNode is owned by its own Node only"],
            ),
            ("set guest-bootable", update.clone(), Some(&labelled), &bootable, vec![]),
            ("remove gpu-count", update.clone(), Some(&labelled), &no_gpu, vec![]),
            (
                "add a tenant label",
                update.clone(),
                Some(&labelled),
                &tenant,
                vec![r#"metadata.labels["tenant"]: "a": a runtime agent sets only its own labels"#],
            ),
            (
                "change a mirrored label",
                update.clone(),
                Some(&labelled),
                &zone,
                vec![r#"metadata.labels["topology.kubernetes.io/zone"]: "z2" (was "z1"): a runtime agent"#],
            ),
            (
                "remove an admin's label",
                update.clone(),
                Some(&labelled),
                &no_team,
                vec![r#"metadata.labels["team"]: removed (was "admins"): a runtime agent"#],
            ),
            (
                "remove the recheck annotation",
                update.clone(),
                Some(&recheck),
                &labelled,
                vec![],
            ),
            (
                "set the recheck annotation",
                update.clone(),
                Some(&labelled),
                &recheck,
                vec![r#"metadata.annotations["vm.smolvm.dev/recheck-boot"]: "true": a runtime agent may not set"#],
            ),
            (
                "rewrite the mirrored-labels annotation",
                update.clone(),
                Some(&labelled),
                &rewritten,
                vec![r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]: "": a runtime agent may not set"#],
            ),
            (
                "remove the mirrored-labels annotation",
                update.clone(),
                Some(&labelled),
                &unannotated,
                vec![r#"metadata.annotations["vm.smolvm.dev/mirrored-labels"]: removed: a runtime agent may not"#],
            ),
            (
                "add a finalizer",
                update.clone(),
                Some(&labelled),
                &finalized,
                vec!["metadata.finalizers: a runtime agent may not set or change the finalizers"],
            ),
            (
                "drop its owner",
                update.clone(),
                Some(&labelled),
                &orphaned,
                vec!["metadata.ownerReferences: a runtime agent may not change the owner references"],
            ),
            (
                "a status write keeps the labels",
                request(RUNTIME, "UPDATE", "status", own.clone()),
                Some(&labelled),
                &labelled,
                vec![],
            ),
        ];
        judge_cases(&p, &cases, "[V10]", |message, fragment| message.starts_with(fragment));
        // Two foreign labels at once: both named in one message.
        let both = set(&tenant, &format!("{labels}/team"), json!("intruders"));
        let failed = judge(&p, &update, &both, Some(&labelled)).unwrap_or_default();
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(
            failed[0].contains(r#"metadata.labels["team"]: "intruders" (was "admins")"#)
                && failed[0].contains(r#"metadata.labels["tenant"]: "a""#),
            "{}",
            failed[0]
        );
        // The cluster admin and the controller are not this policy's concern.
        for who in ["kubernetes-admin", CONTROLLER] {
            let req = request(who, "UPDATE", "", json!({}));
            assert_eq!(judge(&p, &req, &tenant, Some(&labelled)), None, "{who}");
        }
    }
}
