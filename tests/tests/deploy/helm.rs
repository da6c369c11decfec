//! The Helm chart (deploy/helm/smolvm-operator, SPEC section 10): with default values it renders,
//! object for object, what kustomize renders from deploy/default (the Namespace aside), and each
//! value of a TLS mode or a component what the matching overlay or component renders; its CRD
//! templates are the generated CRDs; its copies of deploy/ are current; its schema refuses a
//! mistyped value naming its path; `helm lint --strict` passes; every Checkov skip in either
//! render gives a reason.
//!
//! Helm is the pinned 4.1.4 that .ci/install-helm.sh takes out of a PyPI wheel
//! (`SMOLVM_HELM`), or a `helm` on PATH. Without one the tests print `skipped: no helm`, unless
//! CI=true or SMOLVM_REQUIRE_HELM is set, where its absence fails them.

use smolvm_api::policy::Policy;

use super::*;

const CHART: &str = "deploy/helm/smolvm-operator";
const RELEASE: &str = "smolvm-operator";
/// The labels Helm's templates add beside kustomize's `app.kubernetes.io/part-of`.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];
/// Each TLS mode and component of deploy/ and the chart values that select it.
const VARIANTS: [(&str, Option<&str>, &[&str]); 5] = [
    ("default", None, &[]),
    ("cert-manager", None, &["tls.mode=cert-manager"]),
    ("default", Some("monitoring"), &["monitoring.enabled=true"]),
    (
        "default",
        Some("workload-secrets"),
        &["workloadSecrets.namespaces={default}"],
    ),
    ("default", Some("kvm-device-plugin"), &["kvmDevicePlugin.enabled=true"]),
];

/// The helm binary, or `None` after printing why the test skips (a failure where it is required).
fn helm() -> Option<PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND
        .get_or_init(|| {
            std::env::var_os("SMOLVM_HELM")
                .map(PathBuf::from)
                .filter(|p| p.is_file())
                .or_else(|| {
                    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                        .map(|dir| dir.join("helm"))
                        .find(|p| p.is_file())
                })
        })
        .clone();
    if found.is_none() {
        let required =
            std::env::var_os("SMOLVM_REQUIRE_HELM").is_some() || std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !required,
            "CI or SMOLVM_REQUIRE_HELM is set and there is no helm (eval \"$(bash .ci/install-helm.sh)\")"
        );
        println!("skipped: no helm (SMOLVM_HELM or PATH; eval \"$(bash .ci/install-helm.sh)\" installs 4.1.4)");
    }
    found
}

/// `helm template` of the chart into smolvm-system with `--set` values: the output or stderr.
fn helm_template(helm: &Path, sets: &[&str]) -> Result<Vec<Value>, String> {
    let mut command = Command::new(helm);
    command
        .current_dir(repo())
        .args(["template", RELEASE, CHART, "--namespace", NAMESPACE]);
    for set in sets {
        command.args(["--set", set]);
    }
    let output = run(&mut command);
    if !output.status.success() {
        return Err(text(&output.stderr));
    }
    let yaml = text(&output.stdout);
    Ok(serde_norway::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("helm template {sets:?}: YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect())
}

fn rendered_chart(helm: &Path, sets: &[&str]) -> Vec<Value> {
    helm_template(helm, sets).unwrap_or_else(|e| panic!("helm template {sets:?} failed: {e}"))
}

/// The chart's appVersion, which its default image tags are.
fn app_version() -> String {
    let chart: Value = serde_norway::from_str(&read(&format!("{CHART}/Chart.yaml"))).expect("Chart.yaml");
    chart["appVersion"].as_str().expect("appVersion").to_string()
}

/// deploy/OVERLAY (with deploy/components/COMPONENT) rendered with the chart's default images, as
/// `make deploy IMG=smolvm-operator:<appVersion> RUNTIME_IMG=smolvm-runtime:<appVersion>` would.
fn kustomize_with_chart_images(overlay: &str, component: Option<&str>) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let deploy = repo().join("deploy");
    std::os::unix::fs::symlink(deploy.join(overlay), dir.path().join("install")).expect("symlink");
    let mut kustomization = String::from("resources: [install]\n");
    if let Some(component) = component {
        std::os::unix::fs::symlink(deploy.join("components").join(component), dir.path().join("component"))
            .expect("symlink");
        kustomization.push_str("components: [component]\n");
    }
    let version = app_version();
    kustomization.push_str(&format!(
        "images:\n  - {{name: smolvm-operator, newTag: \"{version}\"}}\n  - {{name: smolvm-runtime, newTag: \"{version}\"}}\n"
    ));
    std::fs::write(dir.path().join("kustomization.yaml"), kustomization).expect("write kustomization");
    kustomize(dir.path())
}

fn key(object: &Value) -> (String, String, String) {
    (
        str_at(object, "/kind").to_string(),
        str_at(object, "/metadata/namespace").to_string(),
        str_at(object, "/metadata/name").to_string(),
    )
}

/// Whitespace inside CEL and messages: kustomize re-serialises folded scalars (`>-`) and keeps a
/// line break before a more-indented line that the source's folding drops. The API server reads
/// the same expression either way. And integral floats, as integers.
fn normalize_text(value: &mut Value, key: Option<&str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                normalize_text(v, Some(k.as_str()));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| normalize_text(v, key)),
        Value::String(s) if matches!(key, Some("expression" | "messageExpression" | "message")) => {
            *s = s.split_whitespace().collect::<Vec<_>>().join(" ");
        }
        // crdgen writes a schema's bounds as floats (`maximum: 1024.0`), which kustomize
        // re-renders as integers; the API server reads the same number.
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15) {
                *value = Value::from(f as i64);
            }
        }
        _ => {}
    }
}

fn sort_by_name(list: Option<&mut Value>) {
    if let Some(Value::Array(items)) = list {
        items.sort_by(|a, b| str_at(a, "/name").cmp(str_at(b, "/name")));
    }
}

/// What is left of an object once what each tool adds on its own is taken out: Helm's labels and
/// the CRDs' keep annotation (asserted, then removed), the CKV_K8S_14 skip on the workloads of
/// deploy/ (their placeholder images name no tag; the chart's always name one), the policy and
/// the dashboard compared as data, CEL whitespace, and the order of volumes and mounts (a
/// patch's volumes come first in kustomize's merge).
fn normalized(object: &Value, from_helm: bool) -> Value {
    let what = describe(object);
    let mut o = object.clone();
    let kind = str_at(object, "/kind").to_string();
    if let Some(labels) = o.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        for label in HELM_LABELS {
            let had = labels.remove(label).is_some();
            assert_eq!(had, from_helm, "{what}: label {label}");
        }
    }
    if let Some(annotations) = o.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        if kind == "CustomResourceDefinition" {
            let keep = annotations.remove("helm.sh/resource-policy");
            assert_eq!(keep.is_some(), from_helm, "{what}: helm.sh/resource-policy");
            if let Some(keep) = keep {
                assert_eq!(keep, "keep", "{what}");
            }
        }
        if !from_helm && matches!(kind.as_str(), "Deployment" | "DaemonSet") {
            let before = annotations.len();
            annotations.retain(|_, v| !v.as_str().unwrap_or_default().starts_with("CKV_K8S_14="));
            assert_eq!(before - annotations.len(), 1, "{what}: deploy/ skips CKV_K8S_14 once");
        }
        if annotations.is_empty() {
            o["metadata"].as_object_mut().expect("metadata").remove("annotations");
        }
    }
    match (kind.as_str(), str_at(object, "/metadata/name")) {
        ("ConfigMap", "smolvm-policy") => {
            let policy: Value = serde_norway::from_str(str_at(object, "/data/policy.yaml")).expect("policy YAML");
            o["data"]["policy.yaml"] = policy;
        }
        ("ConfigMap", "smolvm-grafana-dashboard") => {
            let dashboard: Value =
                serde_json::from_str(str_at(object, "/data/smolvm-operator.json")).expect("dashboard JSON");
            o["data"]["smolvm-operator.json"] = dashboard;
        }
        _ => {}
    }
    normalize_text(&mut o, None);
    if let Some(pod) = o.pointer_mut("/spec/template/spec") {
        sort_by_name(pod.get_mut("volumes"));
        for container in pod["containers"].as_array_mut().into_iter().flatten() {
            sort_by_name(container.get_mut("volumeMounts"));
        }
    }
    o
}

/// The JSON pointers where `a` and `b` differ, at most a few.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    if out.len() >= 8 || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = format!("{path}/{k}");
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => differences(va, vb, &p, out),
                    (va, vb) => out.push(format!("{p}: kustomize {va:?}, helm {vb:?}")),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                differences(va, vb, &format!("{path}/{i}"), out);
            }
        }
        _ => out.push(format!("{path}: kustomize {a}, helm {b}")),
    }
}

/// Compares the two renders object by object; the Namespace is the chart's install's
/// (`helm install -n smolvm-system --create-namespace`), not the chart's.
fn compare(what: &str, kustomized: &[Value], charted: &[Value]) -> usize {
    let mine: BTreeMap<_, _> = kustomized
        .iter()
        .filter(|o| str_at(o, "/kind") != "Namespace")
        .map(|o| (key(o), normalized(o, false)))
        .collect();
    let theirs: BTreeMap<_, _> = charted.iter().map(|o| (key(o), normalized(o, true))).collect();
    assert_eq!(charted.len(), theirs.len(), "{what}: the chart renders an object twice");
    let mut failures = Vec::new();
    for k in mine.keys().filter(|k| !theirs.contains_key(*k)) {
        failures.push(format!("{k:?}: only in kustomize's render"));
    }
    for k in theirs.keys().filter(|k| !mine.contains_key(*k)) {
        failures.push(format!("{k:?}: only in the chart's render"));
    }
    for (k, a) in &mine {
        if let Some(b) = theirs.get(k) {
            let mut diffs = Vec::new();
            differences(a, b, "", &mut diffs);
            if !diffs.is_empty() {
                failures.push(format!("{k:?}:\n    {}", diffs.join("\n    ")));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{what}: the chart and deploy/ differ\n{}",
        failures.join("\n")
    );
    mine.len()
}

#[test]
pub(super) fn the_chart_renders_what_kustomize_renders_for_every_tls_mode_and_component() {
    require_kubectl!();
    let Some(helm) = helm() else { return };
    for (overlay, component, sets) in VARIANTS {
        let what = match component {
            Some(c) => format!("deploy/{overlay} + components/{c} vs --set {}", sets.join(" ")),
            None if sets.is_empty() => format!("deploy/{overlay} vs default values"),
            None => format!("deploy/{overlay} vs --set {}", sets.join(" ")),
        };
        let kustomized = kustomize_with_chart_images(overlay, component);
        let charted = rendered_chart(&helm, sets);
        let count = compare(&what, &kustomized, &charted);
        println!("{what}: {count} objects, the same");
    }
}

#[test]
pub(super) fn every_object_the_chart_renders_is_strictly_typed_and_labelled() {
    let Some(helm) = helm() else { return };
    let all = rendered_chart(
        &helm,
        &[
            "tls.mode=cert-manager",
            "kvmDevicePlugin.enabled=true",
            "workloadSecrets.namespaces={team-a,team-b}",
        ],
    );
    let monitoring = rendered_chart(&helm, &["monitoring.enabled=true"]);
    let version = app_version();
    for object in all.iter().chain(&monitoring) {
        let what = describe(object);
        if !str_at(object, "/apiVersion").starts_with("monitoring.coreos.com/") {
            check_typed(object).unwrap_or_else(|e| panic!("the chart: {e}"));
        }
        check_no_secret_material(object, &format!("the chart: {what}"));
        for (label, value) in [
            ("app.kubernetes.io/part-of", "smolvm-operator"),
            ("app.kubernetes.io/managed-by", "Helm"),
            ("app.kubernetes.io/instance", RELEASE),
            ("app.kubernetes.io/version", version.as_str()),
        ] {
            let got = object
                .pointer(&format!("/metadata/labels/{}", label.replace('/', "~1")))
                .and_then(Value::as_str);
            assert_eq!(got, Some(value), "{what}: label {label}");
        }
    }
    let bindings: Vec<&str> = objects(&all, "RoleBinding")
        .filter(|o| str_at(o, "/roleRef/name") == "smolvm-controller-workload-secrets")
        .map(|o| str_at(o, "/metadata/namespace"))
        .collect();
    assert_eq!(bindings, ["team-a", "team-b"], "one RoleBinding per namespace");
    let none = rendered_chart(&helm, &[]);
    assert!(
        !none
            .iter()
            .any(|o| str_at(o, "/metadata/name").contains("workload-secrets")),
        "no namespaces: no workload-secrets objects"
    );
}

#[test]
pub(super) fn the_chart_installs_into_smolvm_system_only() {
    let Some(helm) = helm() else { return };
    let output =
        run(Command::new(&helm)
            .current_dir(repo())
            .args(["template", RELEASE, CHART, "--namespace", "operators"]));
    assert!(!output.status.success(), "installed into another namespace");
    let error = text(&output.stderr);
    assert!(
        error.contains("smolvm-system") && error.contains("\"operators\""),
        "{error}"
    );
}

#[test]
pub(super) fn the_crd_templates_are_the_generated_crds_and_kept_on_uninstall() {
    let Some(helm) = helm() else { return };
    let all = rendered_chart(&helm, &[]);
    let mut got: BTreeMap<String, Value> = BTreeMap::new();
    for crd in objects(&all, "CustomResourceDefinition") {
        assert_eq!(
            str_at(crd, "/metadata/annotations/helm.sh~1resource-policy"),
            "keep",
            "{}",
            describe(crd)
        );
        let mut crd = crd.clone();
        crd["metadata"].as_object_mut().expect("metadata").remove("labels");
        crd["metadata"].as_object_mut().expect("metadata").remove("annotations");
        got.insert(str_at(&crd, "/metadata/name").to_string(), crd);
    }
    let want: BTreeMap<String, Value> = smolvm_api::crd::crds()
        .into_iter()
        .map(|c| {
            let value = serde_json::to_value(&c).expect("CRD JSON");
            (c.metadata.name.clone().unwrap_or_default(), value)
        })
        .collect();
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the chart's CRDs"
    );
    for (name, crd) in &want {
        assert!(
            got[name] == *crd,
            "{name}: the chart's template is not the generated CRD (make generate)"
        );
    }
    let without = rendered_chart(&helm, &["crds.enabled=false"]);
    assert_eq!(objects(&without, "CustomResourceDefinition").count(), 0);
    assert_eq!(
        without.len() + want.len(),
        all.len(),
        "crds.enabled=false drops the CRDs only"
    );
}

/// The copies of deploy/ under the chart's templates are what deploy/scripts/chart-templates.sh
/// writes now (`make generate`), and nothing else claims to be generated.
#[test]
pub(super) fn the_charts_copies_of_deploy_are_current() {
    let chart = repo().join(CHART);
    let copy = tempfile::tempdir().expect("temp dir");
    let output = run(script("deploy/scripts/chart-templates.sh").arg(copy.path()));
    assert!(output.status.success(), "chart-templates.sh: {}", text(&output.stderr));
    fn files(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, base, out);
            } else {
                let relative = path.strip_prefix(base).expect("under base").display().to_string();
                out.insert(relative, std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let mut generated = BTreeMap::new();
    files(copy.path(), copy.path(), &mut generated);
    assert!(generated.len() > 20, "{} files generated", generated.len());
    for (path, body) in &generated {
        let checked_in = std::fs::read_to_string(chart.join(path)).unwrap_or_default();
        assert!(
            checked_in == *body,
            "{CHART}/{path} is not what `make generate` writes (run it)"
        );
    }
    let mut present = BTreeMap::new();
    files(&chart.join("templates"), &chart, &mut present);
    for (path, body) in present {
        if body.contains("Generated by `make generate`") {
            assert!(
                generated.contains_key(&path),
                "{CHART}/{path}: generated from nothing now"
            );
        }
    }
}

#[test]
pub(super) fn chart_version_and_app_version_are_the_workspaces() {
    let chart: Value = serde_norway::from_str(&read(&format!("{CHART}/Chart.yaml"))).expect("Chart.yaml");
    let workspace = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"].as_str(), Some(workspace), "Chart.yaml version");
    assert_eq!(chart["appVersion"].as_str(), Some(workspace), "Chart.yaml appVersion");
    assert_eq!(chart["name"].as_str(), Some("smolvm-operator"));
}

/// The default policy is deploy/base/policy/policy.yaml's (the built-in one, secrets.rs checks), the
/// schema knows exactly the policy's fields, and the rendered ConfigMap parses strictly.
#[test]
pub(super) fn the_policy_value_is_the_built_in_policy() {
    let values: Value = serde_norway::from_str(&read(&format!("{CHART}/values.yaml"))).expect("values.yaml");
    let schema: Value = serde_json::from_str(&read(&format!("{CHART}/values.schema.json"))).expect("schema");
    // secrets.rs checks that deploy/base/policy/policy.yaml is the built-in policy.
    let base = Policy::from_yaml(&read("deploy/base/policy/policy.yaml")).expect("policy.yaml");
    let default = serde_json::to_value(Policy::default()).expect("policy JSON");
    let policy: Policy = serde_json::from_value(values["policy"].clone()).expect("values.yaml policy");
    assert_eq!(policy, base, "values.yaml's policy is deploy/base/policy/policy.yaml's");
    let fields: BTreeSet<&String> = default.as_object().expect("an object").keys().collect();
    let known: BTreeSet<&String> = schema["properties"]["policy"]["properties"]
        .as_object()
        .expect("the schema's policy")
        .keys()
        .collect();
    assert_eq!(known, fields, "the schema's policy fields");
    let Some(helm) = helm() else { return };
    for sets in [
        &[][..],
        &["policy.maxCpus=64", "policy.excludedHostPorts={10250,30000-32767}"][..],
    ] {
        let all = rendered_chart(&helm, sets);
        let config: ConfigMap = typed(find(&all, "ConfigMap", "smolvm-policy"));
        let file = config
            .data
            .and_then(|d| d.get("policy.yaml").cloned())
            .expect("policy.yaml");
        let parsed = Policy::from_yaml(&file).unwrap_or_else(|e| panic!("--set {sets:?}: {e}"));
        if sets.is_empty() {
            assert_eq!(parsed, base);
        } else {
            assert_eq!(parsed.max_cpus, 64);
            assert_eq!(parsed.excluded_host_ports.len(), 2);
        }
    }
}

/// A mistyped, unknown or out-of-range value is refused before anything renders, and the
/// message names where it is.
#[test]
pub(super) fn the_schema_refuses_mistyped_values_naming_their_path() {
    let Some(helm) = helm() else { return };
    let digest = format!("sha256:{}", "ab".repeat(32));
    for (set, path, why) in [
        ("webhook.replicas=two", "/webhook/replicas", "want integer"),
        ("webhook.replicas=0", "/webhook/replicas", "minimum"),
        ("controller.replicas=1.5", "/controller/replicas", "integer"),
        ("tls.mode=selfsigned", "/tls/mode", "self-signed"),
        ("webhok.replicas=3", "", "webhok"),
        ("images.operator.digest=md5:abc", "/images/operator/digest", "pattern"),
        (
            "images.runtime.repository=my/runtime:v1",
            "/images/runtime/repository",
            "",
        ),
        ("images.pullPolicy=Sometimes", "/images/pullPolicy", "IfNotPresent"),
        (
            "runtime.resources.limits.memory=8Gi",
            "/runtime/resources/limits",
            "memory",
        ),
        (
            "webhook.resources.limits.cpu=lots",
            "/webhook/resources/limits/cpu",
            "pattern",
        ),
        (
            "runtime.kubeletRootDir=var/lib/kubelet",
            "/runtime/kubeletRootDir",
            "pattern",
        ),
        (
            "runtime.tolerations[0].operator=Maybe",
            "/runtime/tolerations/0/operator",
            "Exists",
        ),
        (
            "workloadSecrets.namespaces={kube-system}",
            "/workloadSecrets/namespaces/0",
            "",
        ),
        (
            "workloadSecrets.namespaces={Team_A}",
            "/workloadSecrets/namespaces/0",
            "pattern",
        ),
        (
            "webhook.allowedSources[0].cidr=everyone",
            "/webhook/allowedSources/0/cidr",
            "pattern",
        ),
        ("policy.maxCpus=-1", "/policy/maxCpus", "minimum"),
        ("policy.hostPortMax=70000", "/policy/hostPortMax", "maximum"),
        ("policy.maxCPUs=4", "/policy", "maxCPUs"),
        ("monitoring.enabled=yes", "/monitoring/enabled", "boolean"),
    ] {
        let error = helm_template(&helm, &[set]).expect_err(&format!("--set {set} was accepted"));
        assert!(
            error.contains(&format!("at '{path}'")) && error.contains(why),
            "--set {set}: the error does not name {path} ({why}):\n{error}"
        );
    }
    // And what must stay possible.
    for sets in [
        &[
            format!("images.operator.digest={digest}"),
            format!("images.runtime.digest={digest}"),
        ][..],
        &["images.operator.repository=localhost:5000/team/smolvm-operator".to_string()][..],
        &["runtime.resources.limits.hugepages-2Mi=1Gi".to_string()][..],
        &["webhook.allowedSources[0].cidr=10.0.0.0/8".to_string()][..],
    ] {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        helm_template(&helm, &sets).unwrap_or_else(|e| panic!("--set {sets:?} was refused: {e}"));
    }
}

/// Every image the chart sets follows images.*: the operator's two Deployments, the runtime's
/// DaemonSet, the controller's holder image and the holder policy's param (the runtime image),
/// by tag (the appVersion when empty) or by digest.
#[test]
pub(super) fn images_follow_the_values_by_tag_or_digest() {
    let Some(helm) = helm() else { return };
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let version = app_version();
    let runtime_digest = format!("images.runtime.digest={digest}");
    for (sets, operator, runtime) in [
        (
            vec![],
            format!("smolvm-operator:{version}"),
            format!("smolvm-runtime:{version}"),
        ),
        (
            vec![
                "images.operator.repository=localhost:5000/team/smolvm-operator",
                "images.operator.tag=v1.2.3",
                "images.runtime.repository=my-registry/smolvm-runtime",
                runtime_digest.as_str(),
            ],
            "localhost:5000/team/smolvm-operator:v1.2.3".to_string(),
            format!("my-registry/smolvm-runtime@{digest}"),
        ),
    ] {
        let all = rendered_chart(&helm, &sets);
        let found = images(&all);
        assert_eq!(found.len(), 3, "{found:?}");
        for (workload, container, image) in found {
            assert_eq!(
                image,
                expected_image(&workload, &operator, &runtime),
                "--set {sets:?}: {workload}/{container}"
            );
        }
        let controller: Deployment = typed(find(&all, "Deployment", CONTROLLER));
        let holder = controller
            .spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers[0].env.clone())
            .into_iter()
            .flatten()
            .find(|e| e.name == "SMOLVM_CONTROLLER_HOLDER_IMAGE")
            .and_then(|e| e.value);
        assert_eq!(
            holder.as_deref(),
            Some(runtime.as_str()),
            "--set {sets:?}: SMOLVM_CONTROLLER_HOLDER_IMAGE"
        );
        assert_eq!(
            str_at(find(&all, "ConfigMap", "smolvm-holder-policy"), "/data/holderImage"),
            runtime,
            "--set {sets:?}: the holder policy's param"
        );
    }
}

#[test]
pub(super) fn helm_lint_strict_passes() {
    let Some(helm) = helm() else { return };
    for sets in [
        &[][..],
        &[
            "tls.mode=cert-manager",
            "monitoring.enabled=true",
            "kvmDevicePlugin.enabled=true",
            "workloadSecrets.namespaces={default}",
        ][..],
    ] {
        let mut command = Command::new(&helm);
        command
            .current_dir(repo())
            .args(["lint", "--strict", CHART, "--namespace", NAMESPACE]);
        for set in sets {
            command.args(["--set", set]);
        }
        let output = run(&mut command);
        let all = format!("{}{}", text(&output.stdout), text(&output.stderr));
        assert!(output.status.success(), "helm lint --strict {sets:?}:\n{all}");
        assert!(all.contains("0 chart(s) failed"), "{all}");
    }
}

/// `checkov.io/skipN: CKV_…=reason`, as Checkov reads it: one `=` (Checkov splits on it and
/// fails on a second), a known check id and a reason a reviewer can check.
pub(super) fn check_skips(what: &str, all: &[Value]) -> usize {
    let mut count = 0;
    for object in all {
        let annotations = object
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for (key, value) in annotations {
            if !key.starts_with("checkov.io/") {
                continue;
            }
            let value = value.as_str().unwrap_or_default();
            let what = format!("{what}: {} {key}", describe(object));
            assert!(key.starts_with("checkov.io/skip"), "{what}");
            let parts: Vec<&str> = value.split('=').collect();
            let [id, reason] = parts.as_slice() else {
                panic!("{what}: `{value}` is not CHECK=REASON with one `=`");
            };
            assert!(
                id.starts_with("CKV_K8S_") || id.starts_with("CKV2_K8S_"),
                "{what}: check id {id}"
            );
            assert!(reason.len() >= 60, "{what}: the reason is too short to check: {reason}");
            count += 1;
        }
    }
    count
}

#[test]
pub(super) fn every_checkov_skip_in_either_render_has_a_reason() {
    require_kubectl!();
    let kustomized = check_skips("deploy/default", rendered("default"));
    assert_eq!(kustomized, 24, "deploy/default's skips (docs/operations.md lists them)");
    let Some(helm) = helm() else { return };
    let charted = check_skips("the chart", &rendered_chart(&helm, &[]));
    assert_eq!(charted, 21, "the chart's skips: deploy/default's but CKV_K8S_14");
    let digest = format!("sha256:{}", "ab".repeat(32));
    let pinned = rendered_chart(
        &helm,
        &[
            &format!("images.operator.digest={digest}"),
            &format!("images.runtime.digest={digest}"),
            "images.pullPolicy=Always",
        ],
    );
    assert_eq!(
        check_skips("the chart with digests", &pinned),
        15,
        "with digests and Always, CKV_K8S_43 and CKV_K8S_15 pass and are not skipped"
    );
}

/// docs/operations.md's values table has a row for every value of the schema (a `resources` or
/// `policy` object is one row) and gives values.yaml's default.
#[test]
pub(super) fn the_docs_values_table_is_the_schemas() {
    let schema: Value = serde_json::from_str(&read(&format!("{CHART}/values.schema.json"))).expect("schema");
    let values: Value = serde_norway::from_str(&read(&format!("{CHART}/values.yaml"))).expect("values.yaml");
    fn leaves(schema: &Value, root: &Value, path: &str, out: &mut Vec<String>) {
        let schema = match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => root.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("{r}")),
            None => schema,
        };
        let last = path.rsplit('.').next().unwrap_or_default();
        match schema.get("properties").and_then(Value::as_object) {
            Some(properties) if !matches!(last, "resources" | "policy") => {
                for (k, v) in properties {
                    if k == "global" {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, root, &p, out);
                }
            }
            _ => out.push(path.to_string()),
        }
    }
    let mut want = Vec::new();
    leaves(&schema, &schema, "", &mut want);
    let docs = read("docs/operations.md");
    let start = docs
        .find("## Install with Helm")
        .expect("docs/operations.md: Install with Helm");
    let section = &docs[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let path = cells[0].trim_start_matches("| ").trim_matches('`').to_string();
        rows.insert(path, cells.get(2).map(|c| c.trim().to_string()).unwrap_or_default());
    }
    let documented: BTreeSet<&String> = rows.keys().collect();
    let schema_paths: BTreeSet<&String> = want.iter().collect();
    assert_eq!(documented, schema_paths, "the values table's rows");
    for (path, default) in &rows {
        if path == "policy" {
            continue;
        }
        let value = values
            .pointer(&format!("/{}", path.replace('.', "/")))
            .unwrap_or_else(|| panic!("values.yaml has no {path}"));
        let json = serde_json::to_string(value).expect("JSON");
        let shown = default.trim_matches('`');
        let parsed: Option<Value> = serde_json::from_str(shown).ok();
        assert!(
            parsed.as_ref() == Some(value) || (value.is_string() && shown == value.as_str().unwrap_or_default()),
            "docs/operations.md: {path}'s default is `{json}`, the table says {default}"
        );
    }
}
