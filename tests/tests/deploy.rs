//! The deployment under deploy/, the Dockerfile's scripts, the Makefile's deploy targets and the
//! operator docs.
//!
//! The manifest tests render every kustomization with `kubectl kustomize` (kustomize v5, as in
//! kubectl 1.27 and later). Without such a kubectl they print `skipped: …` and return: they never
//! pass by pretending. The script tests run the scripts the Dockerfile runs, outside Docker.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use k8s_openapi::{
    api::{
        admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
            ValidatingWebhookConfiguration,
        },
        apps::v1::{DaemonSet, Deployment},
        core::v1::{
            ConfigMap, Container, Namespace, PodSpec, PodTemplateSpec, ResourceRequirements, Secret, Service,
            ServiceAccount,
        },
        networking::v1::{NetworkPolicy, NetworkPolicyPort},
        policy::v1::PodDisruptionBudget,
        rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Value, json};
use smolvm_api::policy::{Policy, service_account};

const NAMESPACE: &str = "smolvm-system";
/// The overlays a platform team installs.
const OVERLAYS: [&str; 2] = ["default", "cert-manager"];
const WEBHOOK: &str = "smolvm-webhook";
const CONTROLLER: &str = "smolvm-controller";
const RUNTIME: &str = "smolvm-runtime";
const NODE_API_PORT: i32 = 10443;
const RUNTIME_OPS_PORT: i32 = 9090;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A shell script run by the interpreter its first line names (`sh` or `bash`).
fn script(relative: &str) -> Command {
    let path = repo().join(relative);
    let first = read(relative).lines().next().unwrap_or_default().to_string();
    let shell = if first.contains("bash") { "bash" } else { "sh" };
    let mut command = Command::new(shell);
    command.arg(path);
    command
}

/// Whether a usable kubectl is on PATH: `Err` says why not (the test then skips).
fn kubectl_ready() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            let output = Command::new("kubectl")
                .args(["version", "--client"])
                .output()
                .map_err(|_| "kubectl not found".to_string())?;
            if !output.status.success() {
                return Err(format!("`kubectl version --client` failed: {}", text(&output.stderr)));
            }
            let out = text(&output.stdout);
            let kustomize = out
                .lines()
                .find_map(|l| l.strip_prefix("Kustomize Version: v"))
                .unwrap_or("0");
            let major: u32 = kustomize.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
            if major < 5 {
                return Err(format!(
                    "kubectl's kustomize (v{kustomize}) is older than v5; install kubectl 1.27 or newer"
                ));
            }
            Ok(())
        })
        .clone()
}

macro_rules! require_kubectl {
    () => {
        if let Err(why) = kubectl_ready() {
            println!("skipped: {why}");
            return;
        }
    };
}

/// `kubectl kustomize DIR`, as JSON values, one per object.
fn kustomize(dir: &Path) -> Vec<Value> {
    let output = run(Command::new("kubectl").arg("kustomize").arg(dir));
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        text(&output.stderr)
    );
    let yaml = text(&output.stdout);
    serde_norway::Deserializer::from_str(&yaml)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: rendered YAML: {e}", dir.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// A checked-in kustomization under deploy/, rendered once.
fn rendered(name: &str) -> &'static [Value] {
    static CACHE: OnceLock<BTreeMap<String, Vec<Value>>> = OnceLock::new();
    let all = CACHE.get_or_init(|| {
        kustomizations()
            .into_iter()
            .map(|name| {
                let objects = kustomize(&repo().join("deploy").join(&name));
                (name, objects)
            })
            .collect()
    });
    all.get(name)
        .unwrap_or_else(|| panic!("deploy/{name} is not a kustomization"))
        .as_slice()
}

/// Every directory under deploy/ (recursively) with a kustomization.yaml of kind Kustomization
/// (components are rendered through an overlay of their own), relative to deploy/.
fn kustomizations() -> Vec<String> {
    fn walk(dir: &Path, deploy: &Path, out: &mut Vec<String>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                let k = path.join("kustomization.yaml");
                if k.is_file() {
                    let text = std::fs::read_to_string(&k).unwrap_or_else(|e| panic!("{}: {e}", k.display()));
                    if !text.lines().any(|l| l.trim() == "kind: Component") {
                        let relative = path.strip_prefix(deploy).expect("under deploy/");
                        out.push(relative.to_string_lossy().into_owned());
                    }
                }
                walk(&path, deploy, out);
            }
        }
    }
    let deploy = repo().join("deploy");
    let mut out = Vec::new();
    walk(&deploy, &deploy, &mut out);
    out.sort();
    out
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn describe(object: &Value) -> String {
    let ns = str_at(object, "/metadata/namespace");
    let name = str_at(object, "/metadata/name");
    let kind = str_at(object, "/kind");
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

/// Deserializes `object` into `T`, failing on any field `T` does not know (a misspelling or a
/// field of another API version), naming the object and the field's path.
fn strict<T: DeserializeOwned>(object: &Value) -> Result<T, String> {
    let mut unknown = Vec::new();
    // serde_ignored marks each Option layer with a `?` segment; the field path reads better without.
    let typed = serde_ignored::deserialize(object.clone(), |path| {
        unknown.push(path.to_string().replace(".?", "").replace("?.", ""))
    })
    .map_err(|e| format!("{}: {e}", describe(object)))?;
    if unknown.is_empty() {
        Ok(typed)
    } else {
        Err(format!("{}: unknown fields {unknown:?}", describe(object)))
    }
}

fn typed<T: DeserializeOwned>(object: &Value) -> T {
    strict(object).unwrap_or_else(|e| panic!("{e}"))
}

fn objects<'a>(all: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    all.iter().filter(move |o| str_at(o, "/kind") == kind)
}

fn find<'a>(all: &'a [Value], kind: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|o| str_at(o, "/kind") == kind && str_at(o, "/metadata/name") == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

/// Every Deployment and DaemonSet: (name, pod template).
fn workloads(all: &[Value]) -> Vec<(String, PodTemplateSpec)> {
    let mut out = Vec::new();
    for o in all {
        let name = str_at(o, "/metadata/name").to_string();
        match str_at(o, "/kind") {
            "Deployment" => out.push((name, typed::<Deployment>(o).spec.expect("spec").template)),
            "DaemonSet" => out.push((name, typed::<DaemonSet>(o).spec.expect("spec").template)),
            _ => {}
        }
    }
    out
}

fn pod_spec(template: &PodTemplateSpec, name: &str) -> PodSpec {
    template.spec.clone().unwrap_or_else(|| panic!("{name}: no pod spec"))
}

fn pod_labels(all: &[Value], workload: &str) -> BTreeMap<String, String> {
    workloads(all)
        .into_iter()
        .find(|(n, _)| n == workload)
        .and_then(|(_, t)| t.metadata.and_then(|m| m.labels))
        .unwrap_or_else(|| panic!("{workload}: no pod labels"))
}

fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    assert!(
        selector.match_expressions.is_none(),
        "matchExpressions are not evaluated by this test; use matchLabels"
    );
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
}

// ---------------------------------------------------------------------------------------------
// Rendering and strict typing
// ---------------------------------------------------------------------------------------------

/// The object as its k8s-openapi type, strictly; cert-manager objects structurally.
fn check_typed(object: &Value) -> Result<(), String> {
    let api_version = str_at(object, "/apiVersion");
    let kind = str_at(object, "/kind");
    match (api_version, kind) {
        ("v1", "Namespace") => strict::<Namespace>(object).map(drop),
        ("v1", "ServiceAccount") => strict::<ServiceAccount>(object).map(drop),
        ("v1", "ConfigMap") => strict::<ConfigMap>(object).map(drop),
        ("v1", "Secret") => strict::<Secret>(object).map(drop),
        ("v1", "Service") => strict::<Service>(object).map(drop),
        ("apps/v1", "Deployment") => strict::<Deployment>(object).map(drop),
        ("apps/v1", "DaemonSet") => strict::<DaemonSet>(object).map(drop),
        ("policy/v1", "PodDisruptionBudget") => strict::<PodDisruptionBudget>(object).map(drop),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict::<NetworkPolicy>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => strict::<ClusterRole>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => strict::<ClusterRoleBinding>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "Role") => strict::<Role>(object).map(drop),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => strict::<RoleBinding>(object).map(drop),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            strict::<MutatingWebhookConfiguration>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            strict::<ValidatingAdmissionPolicy>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            strict::<ValidatingAdmissionPolicyBinding>(object).map(drop)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            strict::<ValidatingWebhookConfiguration>(object).map(drop)
        }
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => strict::<CustomResourceDefinition>(object).map(drop),
        ("cert-manager.io/v1", "Issuer") => check_shape(object, &issuer_shape(), &describe(object)),
        ("cert-manager.io/v1", "Certificate") => check_shape(object, &certificate_shape(), &describe(object)),
        _ => Err(format!(
            "{}: no type known for {api_version} {kind}; add one to check_typed",
            describe(object)
        )),
    }
}

fn metadata_shape() -> Value {
    json!({"name": "string", "namespace": "string", "labels": "map", "annotations": "map"})
}

/// The cert-manager.io/v1 Issuer fields these manifests may use.
fn issuer_shape() -> Value {
    json!({
        "apiVersion": "string", "kind": "string", "metadata": metadata_shape(),
        "spec": {"selfSigned": {"crlDistributionPoints": "strings"}, "ca": {"secretName": "string"}}
    })
}

/// The cert-manager.io/v1 Certificate fields these manifests may use.
fn certificate_shape() -> Value {
    json!({
        "apiVersion": "string", "kind": "string", "metadata": metadata_shape(),
        "spec": {
            "secretName": "string", "commonName": "string", "isCA": "bool",
            "duration": "duration", "renewBefore": "duration",
            "dnsNames": "strings", "ipAddresses": "strings",
            "usages": ["signing", "digital signature", "content commitment", "key encipherment",
                       "key agreement", "data encipherment", "cert sign", "crl sign",
                       "encipher only", "decipher only", "any", "server auth", "client auth",
                       "code signing", "email protection", "s/mime", "ipsec end system",
                       "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
                       "microsoft sgc", "netscape sgc"],
            "privateKey": {
                "algorithm": ["RSA", "ECDSA", "Ed25519"], "size": "int",
                "rotationPolicy": ["Never", "Always"], "encoding": ["PKCS1", "PKCS8"]
            },
            "issuerRef": {"name": "string", "kind": ["Issuer", "ClusterIssuer"], "group": ["cert-manager.io"]}
        }
    })
}

/// Checks `value` against `shape`: an object lists the allowed keys; "string", "bool", "int",
/// "map" (of strings), "strings" (list of strings) and "duration" (Go, hours/minutes/seconds)
/// are leaf types; an array lists the allowed strings (a list value must use only those).
fn check_shape(value: &Value, shape: &Value, path: &str) -> Result<(), String> {
    let fail = |what: &str| Err(format!("{path}: {what}, got {value}"));
    match shape {
        Value::Object(fields) => {
            let Some(map) = value.as_object() else {
                return fail("expected an object");
            };
            for (k, v) in map {
                let Some(s) = fields.get(k) else {
                    return Err(format!("{path}: unknown field {k:?}"));
                };
                check_shape(v, s, &format!("{path}.{k}"))?;
            }
            Ok(())
        }
        Value::Array(allowed) => {
            let values: Vec<&Value> = match value {
                Value::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for v in values {
                if !allowed.contains(v) {
                    return Err(format!("{path}: {v} is not one of {shape}"));
                }
            }
            Ok(())
        }
        Value::String(leaf) => {
            let ok = match leaf.as_str() {
                "string" => value.is_string(),
                "bool" => value.is_boolean(),
                "int" => value.is_i64(),
                "map" => value.as_object().is_some_and(|m| m.values().all(Value::is_string)),
                "strings" => value.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                "duration" => value.as_str().is_some_and(is_go_duration),
                other => panic!("bad shape leaf {other}"),
            };
            if ok { Ok(()) } else { fail(&format!("expected {leaf}")) }
        }
        other => panic!("bad shape {other}"),
    }
}

fn is_go_duration(s: &str) -> bool {
    let mut digits = false;
    let mut any = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            digits = true;
        } else if matches!(c, 'h' | 'm' | 's') && digits {
            digits = false;
            any = true;
        } else {
            return false;
        }
    }
    any && !digits
}

#[test]
fn every_kustomization_renders_and_every_object_is_strictly_typed() {
    require_kubectl!();
    let all = kustomizations();
    for overlay in OVERLAYS {
        assert!(all.iter().any(|k| k == overlay), "deploy/{overlay} is missing");
    }
    let mut failures = Vec::new();
    for name in &all {
        let objects = rendered(name);
        assert!(!objects.is_empty(), "deploy/{name} renders nothing");
        let mut seen = BTreeSet::new();
        for object in objects {
            if let Err(e) = check_typed(object) {
                failures.push(format!("deploy/{name}: {e}"));
            }
            assert!(
                seen.insert(describe(object)),
                "deploy/{name}: {} appears twice",
                describe(object)
            );
        }
        println!("deploy/{name}: {} objects, all strictly typed", objects.len());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn strict_typing_names_an_unknown_field() {
    let mut deployment: Value = serde_json::to_value(Deployment::default()).expect("json");
    deployment["apiVersion"] = json!("apps/v1");
    deployment["kind"] = json!("Deployment");
    deployment["metadata"] = json!({"name": "x", "namespace": "ns"});
    deployment["spec"] = json!({
        "selector": {},
        "template": {"spec": {"containers": [{"name": "c", "imagePullPolicyy": "Always"}]}}
    });
    let error = check_typed(&deployment).expect_err("a misspelled field must fail");
    assert!(
        error.contains("Deployment ns/x") && error.contains("spec.template.spec.containers.0.imagePullPolicyy"),
        "{error}"
    );
    let mut certificate = json!({
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i", "kind": "Issuer"}, "dnsName": ["x"]}
    });
    let error = check_typed(&certificate).expect_err("a misspelled cert-manager field must fail");
    assert!(error.contains("spec") && error.contains("dnsName"), "{error}");
    certificate["spec"] = json!({"secretName": "s", "duration": "90d"});
    assert!(check_typed(&certificate).is_err(), "90d is not a Go duration");
    let unknown = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    assert!(check_typed(&unknown).is_err());
}

#[test]
fn every_object_is_labelled_and_namespaced_in_smolvm_system() {
    require_kubectl!();
    for overlay in OVERLAYS {
        for object in rendered(overlay) {
            assert_eq!(
                str_at(object, "/metadata/labels/app.kubernetes.io~1part-of"),
                "smolvm-operator",
                "deploy/{overlay}: {} lacks app.kubernetes.io/part-of",
                describe(object)
            );
            let ns = str_at(object, "/metadata/namespace");
            assert!(
                ns.is_empty() || ns == NAMESPACE,
                "deploy/{overlay}: {} is in namespace {ns}",
                describe(object)
            );
        }
    }
}

#[test]
fn crds_in_the_install_are_the_generated_ones() {
    let kustomization: Value =
        serde_norway::from_str(&read("deploy/crds/kustomization.yaml")).expect("deploy/crds/kustomization.yaml");
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_string())
        .collect();
    let generated: BTreeSet<String> = smolvm_api::crd::render()
        .expect("render the CRDs")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        listed, generated,
        "deploy/crds/kustomization.yaml must list every generated CRD"
    );
    require_kubectl!();
    let want: BTreeSet<String> = smolvm_api::crd::crds()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    for overlay in OVERLAYS {
        let got: BTreeSet<String> = objects(rendered(overlay), "CustomResourceDefinition")
            .map(|o| str_at(o, "/metadata/name").to_string())
            .collect();
        assert_eq!(got, want, "deploy/{overlay}");
    }
}

// ---------------------------------------------------------------------------------------------
// Images
// ---------------------------------------------------------------------------------------------

/// Every container image of every workload: (workload, container, image).
fn images(all: &[Value]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (workload, template) in workloads(all) {
        let spec = pod_spec(&template, &workload);
        for c in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
            out.push((workload.clone(), c.name.clone(), c.image.clone().unwrap_or_default()));
        }
    }
    out
}

fn expected_image<'a>(workload: &str, operator: &'a str, runtime: &'a str) -> &'a str {
    if workload == RUNTIME { runtime } else { operator }
}

#[test]
fn checked_in_overlays_use_the_placeholder_images() {
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
fn make_deploy_substitutes_the_images() {
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

// ---------------------------------------------------------------------------------------------
// RBAC
// ---------------------------------------------------------------------------------------------

/// The full verb list of each ServiceAccount, one row per (account, scope, group/resource, names).
/// Compared with the expected tables below; printed by the audit test. The controller and the
/// runtime hold the same grants in both overlays; only the webhook's differ.
const RBAC_CONTROLLER_AND_RUNTIME: &str = "
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests  -  list,watch
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests/approval  -  patch
smolvm-controller  cluster        certificates.k8s.io/certificatesigningrequests/status  -  patch
smolvm-controller  cluster        certificates.k8s.io/signers  vm.smolvm.dev/runtime-serving  approve,sign
smolvm-controller  cluster        core/nodes  -  get
smolvm-controller  cluster        core/services  -  create,delete,get,patch
smolvm-controller  cluster        discovery.k8s.io/endpointslices  -  create,delete,get,patch
smolvm-controller  cluster        events.k8s.io/events  -  create
smolvm-controller  cluster        vm.smolvm.dev/smolvmnodes  -  list,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvms  -  list,patch,watch
smolvm-controller  cluster        vm.smolvm.dev/smolvms/status  -  patch,update
smolvm-controller  smolvm-system  coordination.k8s.io/leases  -  create
smolvm-controller  smolvm-system  coordination.k8s.io/leases  smolvm-controller  get,update
smolvm-controller  smolvm-system  core/configmaps  -  create
smolvm-controller  smolvm-system  core/configmaps  smolvm-runtime-ca  patch
smolvm-controller  smolvm-system  core/secrets  -  create
smolvm-controller  smolvm-system  core/secrets  smolvm-runtime-auth  get
smolvm-controller  smolvm-system  core/secrets  smolvm-runtime-ca  get,update
smolvm-runtime     cluster        certificates.k8s.io/certificatesigningrequests  -  create,get
smolvm-runtime     cluster        core/nodes  -  get
smolvm-runtime     cluster        vm.smolvm.dev/smolvmnodes  -  create,get,patch
smolvm-runtime     cluster        vm.smolvm.dev/smolvmnodes/status  -  patch
";

/// The webhook in the default overlay (self-signed TLS: its Secret and the caBundle injection).
const RBAC_WEBHOOK_DEFAULT: &str = "
smolvm-webhook     cluster        admissionregistration.k8s.io/mutatingwebhookconfigurations  smolvm-webhook  get,patch
smolvm-webhook     cluster        admissionregistration.k8s.io/validatingwebhookconfigurations  smolvm-webhook  get,patch
smolvm-webhook     cluster        vm.smolvm.dev/smolvmnodes  -  list,watch
smolvm-webhook     smolvm-system  core/secrets  smolvm-webhook-tls  get,update
";

/// deploy/components/workload-secrets: the controller reads, by name, the Secrets and ConfigMaps a
/// SmolVM's workload names, in any namespace. Only with the component.
const RBAC_WORKLOAD_SECRETS: &str = "
smolvm-controller  cluster        core/configmaps  -  get
smolvm-controller  cluster        core/secrets  -  get
";

/// cert-manager mode: the webhook needs neither its TLS Secret nor the webhook configurations.
const RBAC_WEBHOOK_CERT_MANAGER: &str = "
smolvm-webhook     cluster        vm.smolvm.dev/smolvmnodes  -  list,watch
";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    account: String,
    /// `cluster`, or the namespace of a RoleBinding.
    scope: String,
    group: String,
    resource: String,
    /// Sorted; empty means every object of the resource.
    names: Vec<String>,
}

/// Each ServiceAccount's grants (verbs merged), after following every binding to its role.
fn effective_rbac(all: &[Value], overlay: &str) -> BTreeMap<Grant, BTreeSet<String>> {
    let cluster_roles: BTreeMap<String, Vec<PolicyRule>> = objects(all, "ClusterRole")
        .map(|o| {
            let role: ClusterRole = typed(o);
            assert!(
                role.aggregation_rule.is_none(),
                "deploy/{overlay}: {} aggregates roles",
                describe(o)
            );
            (str_at(o, "/metadata/name").to_string(), role.rules.unwrap_or_default())
        })
        .collect();
    let roles: BTreeMap<(String, String), Vec<PolicyRule>> = objects(all, "Role")
        .map(|o| {
            let role: Role = typed(o);
            let key = (
                str_at(o, "/metadata/namespace").to_string(),
                str_at(o, "/metadata/name").to_string(),
            );
            (key, role.rules.unwrap_or_default())
        })
        .collect();
    let accounts: BTreeSet<(String, String)> = objects(all, "ServiceAccount")
        .map(|o| {
            (
                str_at(o, "/metadata/namespace").to_string(),
                str_at(o, "/metadata/name").to_string(),
            )
        })
        .collect();

    let mut bindings = Vec::new();
    for o in objects(all, "ClusterRoleBinding") {
        let b: ClusterRoleBinding = typed(o);
        bindings.push((
            describe(o),
            "cluster".to_string(),
            b.role_ref,
            b.subjects.unwrap_or_default(),
        ));
    }
    for o in objects(all, "RoleBinding") {
        let b: RoleBinding = typed(o);
        let ns = str_at(o, "/metadata/namespace").to_string();
        bindings.push((describe(o), ns, b.role_ref, b.subjects.unwrap_or_default()));
    }

    let mut grants: BTreeMap<Grant, BTreeSet<String>> = BTreeMap::new();
    let mut bound = BTreeSet::new();
    for (what, scope, role_ref, subjects) in bindings {
        let rules = match role_ref.kind.as_str() {
            "ClusterRole" => cluster_roles.get(&role_ref.name),
            "Role" => roles.get(&(scope.clone(), role_ref.name.clone())),
            other => panic!("deploy/{overlay}: {what}: roleRef kind {other}"),
        }
        .unwrap_or_else(|| {
            panic!(
                "deploy/{overlay}: {what} binds {} {}, which this install does not define (no built-in roles)",
                role_ref.kind, role_ref.name
            )
        });
        assert!(!subjects.is_empty(), "deploy/{overlay}: {what} has no subjects");
        for subject in subjects {
            assert_eq!(subject.kind, "ServiceAccount", "deploy/{overlay}: {what}");
            let ns = subject.namespace.clone().unwrap_or_default();
            assert!(
                accounts.contains(&(ns.clone(), subject.name.clone())),
                "deploy/{overlay}: {what} binds {ns}/{}, which is not a ServiceAccount of this install",
                subject.name
            );
            bound.insert((ns, subject.name.clone()));
            for rule in rules {
                assert!(
                    rule.non_resource_urls.is_none(),
                    "deploy/{overlay}: {what}: nonResourceURLs"
                );
                let groups = rule.api_groups.clone().unwrap_or_default();
                let resources = rule.resources.clone().unwrap_or_default();
                let mut names = rule.resource_names.clone().unwrap_or_default();
                names.sort();
                assert!(
                    !groups.is_empty() && !resources.is_empty() && !rule.verbs.is_empty(),
                    "deploy/{overlay}: {what}: a rule without groups, resources or verbs: {rule:?}"
                );
                for field in [&groups, &resources, &names, &rule.verbs] {
                    assert!(
                        !field.iter().any(|x| x.contains('*')),
                        "deploy/{overlay}: {what}: wildcard in {rule:?}"
                    );
                }
                for verb in &rule.verbs {
                    assert!(
                        !matches!(verb.as_str(), "escalate" | "bind" | "impersonate"),
                        "deploy/{overlay}: {what}: verb {verb}"
                    );
                }
                for group in &groups {
                    for resource in &resources {
                        let grant = Grant {
                            account: subject.name.clone(),
                            scope: scope.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            names: names.clone(),
                        };
                        grants.entry(grant).or_default().extend(rule.verbs.iter().cloned());
                    }
                }
            }
        }
    }
    for account in &accounts {
        assert!(
            bound.contains(account),
            "deploy/{overlay}: ServiceAccount {}/{} has no binding",
            account.0,
            account.1
        );
    }
    grants
}

fn rbac_table(grants: &BTreeMap<Grant, BTreeSet<String>>) -> Vec<String> {
    grants
        .iter()
        .map(|(g, verbs)| {
            let group = if g.group.is_empty() { "core" } else { g.group.as_str() };
            let names = if g.names.is_empty() {
                "-".to_string()
            } else {
                g.names.join(",")
            };
            let verbs: Vec<&str> = verbs.iter().map(String::as_str).collect();
            format!(
                "{:<18} {:<14} {group}/{}  {names}  {}",
                g.account,
                g.scope,
                g.resource,
                verbs.join(",")
            )
        })
        .collect()
}

fn normalize(table: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn rbac_is_least_privilege_and_matches_the_expected_table() {
    require_kubectl!();
    let with_secrets = with_component("default", "workload-secrets");
    for object in &with_secrets {
        check_typed(object).unwrap_or_else(|e| panic!("components/workload-secrets: {e}"));
    }
    for (overlay, all, webhook, extra) in [
        ("default", rendered("default"), RBAC_WEBHOOK_DEFAULT, ""),
        ("cert-manager", rendered("cert-manager"), RBAC_WEBHOOK_CERT_MANAGER, ""),
        (
            "default + components/workload-secrets",
            with_secrets.as_slice(),
            RBAC_WEBHOOK_DEFAULT,
            RBAC_WORKLOAD_SECRETS,
        ),
    ] {
        let expected = format!("{RBAC_CONTROLLER_AND_RUNTIME}{webhook}{extra}");
        let expected = expected.as_str();
        let grants = effective_rbac(all, overlay);
        let table = rbac_table(&grants);
        println!(
            "deploy/{overlay}: every verb of every ServiceAccount\n{}\n",
            table.join("\n")
        );

        for (grant, verbs) in &grants {
            if grant.group.is_empty() && grant.resource.starts_with("secrets") {
                match grant.account.as_str() {
                    RUNTIME => panic!("deploy/{overlay}: the runtime may not touch Secrets: {verbs:?}"),
                    WEBHOOK => {
                        assert_eq!(grant.scope, NAMESPACE, "deploy/{overlay}");
                        // Only its TLS Secret, by name: no `create`, which RBAC could not narrow
                        // (the install creates that Secret empty).
                        assert_eq!(
                            grant.names,
                            ["smolvm-webhook-tls"],
                            "deploy/{overlay}: the webhook may reach only its TLS Secret: {verbs:?}"
                        );
                    }
                    _ => {}
                }
            }
            if grant.account != CONTROLLER {
                assert!(
                    !(grant.group == "certificates.k8s.io" && grant.resource == "signers"),
                    "deploy/{overlay}: only the controller approves and signs: {grant:?}"
                );
            }
        }
        let got = normalize(&table.join("\n"));
        let want = normalize(expected);
        let missing: Vec<_> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<_> = got.iter().filter(|l| !want.contains(l)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "deploy/{overlay}: RBAC differs from the expected table\nmissing: {missing:#?}\nunexpected: {extra:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------------------

/// The source files whose flags and environment variables each container uses.
fn binary_source(workload: &str) -> String {
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
fn check_flags_and_env(workload: &str, container: &Container) {
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

fn field_ref(container: &Container, name: &str) -> String {
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

fn port(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
        .unwrap_or_else(|| panic!("{}: no port named {name}", container.name))
}

#[test]
fn workloads_are_hardened_and_probed() {
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

fn check_runtime(what: &str, spec: &PodSpec, c: &Container, resources: &ResourceRequirements) {
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
fn with_component(overlay: &str, component: &str) -> Vec<Value> {
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
fn the_unprivileged_component_drops_privileged_and_the_kvm_host_path() {
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

// ---------------------------------------------------------------------------------------------
// NetworkPolicy
// ---------------------------------------------------------------------------------------------

/// Whether a NetworkPolicy port entry admits TCP `number` (named `name` on the container).
fn admits_port(ports: Option<&Vec<NetworkPolicyPort>>, number: i32, name: &str) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true; // no ports: every port
    };
    ports.iter().any(|p| {
        if p.protocol.as_deref().unwrap_or("TCP") != "TCP" {
            return false;
        }
        match &p.port {
            None => true,
            Some(IntOrString::String(n)) => n == name,
            Some(IntOrString::Int(start)) => {
                let end = p.end_port.unwrap_or(*start);
                (*start..=end).contains(&number)
            }
        }
    })
}

#[test]
fn the_runtime_is_on_the_host_network_and_no_network_policy_pretends_to_guard_it() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let runtime = pod_labels(all, RUNTIME);
        // Published ports are forwarded from the node's address (runtime/src/forward.rs).
        let ds = objects(all, "DaemonSet")
            .into_iter()
            .find(|o| str_at(o, "/metadata/name") == RUNTIME)
            .expect("the runtime DaemonSet");
        assert_eq!(
            ds.pointer("/spec/template/spec/hostNetwork"),
            Some(&json!(true)),
            "deploy/{overlay}"
        );
        assert_eq!(
            ds.pointer("/spec/template/spec/dnsPolicy"),
            Some(&json!("ClusterFirstWithHostNet")),
            "deploy/{overlay}: cluster DNS on the host network"
        );
        let env = ds
            .pointer("/spec/template/spec/containers/0/env")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert!(
            env.iter()
                .any(|e| e["name"] == "NODE_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"),
            "deploy/{overlay}: NODE_IP from status.hostIP is the publish address"
        );
        // NetworkPolicies cannot select host-network pods: one that seemed to would mislead.
        for o in objects(all, "NetworkPolicy") {
            let policy: NetworkPolicy = typed(o);
            let selector = policy.spec.and_then(|s| s.pod_selector).unwrap_or_default();
            assert!(
                !selects(&selector, &runtime),
                "deploy/{overlay}: {} selects the host-network runtime pods, where it has no effect",
                describe(o)
            );
        }
    }
}

#[test]
fn network_policy_admits_only_addresses_to_the_admission_port() {
    require_kubectl!();
    for overlay in OVERLAYS {
        let all = rendered(overlay);
        let webhook = pod_labels(all, WEBHOOK);
        let (mut isolating, mut admission_admitted, mut ops_admitted) = (0, false, false);
        for o in objects(all, "NetworkPolicy") {
            let policy: NetworkPolicy = typed(o);
            let what = format!("deploy/{overlay}: {}", describe(o));
            let spec = policy.spec.expect("spec");
            if !selects(&spec.pod_selector.clone().unwrap_or_default(), &webhook) {
                continue;
            }
            isolating += 1;
            for rule in spec.ingress.iter().flatten() {
                if admits_port(rule.ports.as_ref(), 8080, "ops") {
                    ops_admitted = true;
                }
                if !admits_port(rule.ports.as_ref(), 9443, "https") {
                    continue;
                }
                let peers = rule.from.clone().unwrap_or_default();
                assert!(!peers.is_empty(), "{what}: admits every pod to the admission port");
                for peer in peers {
                    // The API server is not a pod: an address block is the only right peer.
                    assert!(
                        peer.pod_selector.is_none() && peer.namespace_selector.is_none() && peer.ip_block.is_some(),
                        "{what}: admits pods to the admission port: {peer:?}"
                    );
                }
                admission_admitted = true;
            }
        }
        assert!(
            isolating > 0,
            "deploy/{overlay}: no NetworkPolicy isolates the webhook pods"
        );
        assert!(
            admission_admitted,
            "deploy/{overlay}: the API server must reach the webhook"
        );
        assert!(
            ops_admitted,
            "deploy/{overlay}: the webhook's ops port must stay reachable"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Secrets and the policy
// ---------------------------------------------------------------------------------------------

/// The one Secret a manifest may hold: the webhook's TLS Secret, empty (the webhook fills it).
fn check_no_secret_material(object: &Value, place: &str) {
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
fn no_secret_material_ships_in_any_manifest() {
    // No generator either: the node API token is created at install by the controller, random;
    // the webhook's TLS Secret ships empty and the webhook fills it.
    fn walk(dir: &Path) {
        for entry in std::fs::read_dir(dir).expect("read deploy/").flatten() {
            let path = entry.path();
            if path.is_dir() {
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
fn admission_policies_name_the_deployments_service_accounts() {
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
fn policy_config_map_parses_and_names_the_service_accounts() {
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
        // The webhook and the controller (--policy) read the mounted file.
        for (workload, flag) in [(WEBHOOK, "--policy="), (CONTROLLER, "--policy=")] {
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

// ---------------------------------------------------------------------------------------------
// TLS modes
// ---------------------------------------------------------------------------------------------

fn webhook_args(all: &[Value]) -> Vec<String> {
    let (_, template) = workloads(all).into_iter().find(|(n, _)| n == WEBHOOK).expect("webhook");
    pod_spec(&template, WEBHOOK).containers[0]
        .args
        .clone()
        .unwrap_or_default()
}

fn inject_annotation(all: &[Value], kind: &str) -> String {
    str_at(
        find(all, kind, WEBHOOK),
        "/metadata/annotations/cert-manager.io~1inject-ca-from",
    )
    .to_string()
}

#[test]
fn each_overlay_wires_its_tls_mode() {
    require_kubectl!();
    let default = rendered("default");
    assert!(webhook_args(default).contains(&"--tls-mode=self-signed".to_string()));
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        assert_eq!(
            inject_annotation(default, kind),
            "",
            "default: {kind} is injected by the webhook"
        );
    }
    assert!(objects(default, "Certificate").next().is_none());

    let cm = rendered("cert-manager");
    let args = webhook_args(cm);
    assert!(args.contains(&"--tls-mode=files".to_string()), "{args:?}");
    let certificates: BTreeMap<String, &Value> = objects(cm, "Certificate")
        .map(|o| (str_at(o, "/metadata/name").to_string(), o))
        .collect();
    let issuers: BTreeSet<String> = objects(cm, "Issuer")
        .map(|o| str_at(o, "/metadata/name").to_string())
        .collect();
    for (name, cert) in &certificates {
        let issuer = str_at(cert, "/spec/issuerRef/name");
        assert!(issuers.contains(issuer), "Certificate {name}: no Issuer {issuer}");
    }
    for issuer in objects(cm, "Issuer") {
        let secret = str_at(issuer, "/spec/ca/secretName");
        if !secret.is_empty() {
            assert!(
                certificates
                    .values()
                    .any(|c| str_at(c, "/spec/secretName") == secret && c["spec"]["isCA"] == json!(true)),
                "{}: its CA Secret {secret} comes from no CA Certificate",
                describe(issuer)
            );
        }
    }
    for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
        let from = inject_annotation(cm, kind);
        let (ns, name) = from
            .split_once('/')
            .unwrap_or_else(|| panic!("{kind}: inject-ca-from {from:?}"));
        assert_eq!(ns, NAMESPACE);
        let serving = certificates
            .get(name)
            .unwrap_or_else(|| panic!("{kind}: no Certificate {name}"));
        let dns: BTreeSet<&str> = serving["spec"]["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for want in smolvm_certs::webhook_service_dns_names(WEBHOOK, NAMESPACE) {
            assert!(dns.contains(want.as_str()), "Certificate {name} lacks {want}");
        }
        // The webhook mounts that Certificate's Secret and reads the pair from it.
        let secret = str_at(serving, "/spec/secretName");
        let (_, template) = workloads(cm).into_iter().find(|(n, _)| n == WEBHOOK).expect("webhook");
        let spec = pod_spec(&template, WEBHOOK);
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret))
            .unwrap_or_else(|| panic!("the webhook does not mount {secret}"));
        let mount = spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == volume.name)
            .expect("tls mount");
        assert!(args.contains(&format!("--tls-cert={}/tls.crt", mount.mount_path)));
        assert!(args.contains(&format!("--tls-key={}/tls.key", mount.mount_path)));
    }
}

// ---------------------------------------------------------------------------------------------
// The Dockerfile and its scripts
// ---------------------------------------------------------------------------------------------

fn workspace_members() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn dockerfile_builds_both_images_from_official_bases() {
    let dockerfile = read("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let mut stages = Vec::new();
    for line in &lines {
        if let Some(rest) = line.strip_prefix("FROM ") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let image = words[0];
            // No registry host: the first path component of a Docker Hub name has no '.' or ':'.
            let first = image.split('/').next().unwrap_or_default();
            let registry = image.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
            assert!(!registry, "FROM {image} names a registry host");
            if let Some(i) = words.iter().position(|w| w.eq_ignore_ascii_case("AS")) {
                stages.push(words[i + 1].to_string());
            }
        }
        if let Some(rest) = line.strip_prefix("COPY ") {
            if rest.starts_with("--from") {
                continue;
            }
            let words: Vec<&str> = rest.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            for source in &words[..words.len() - 1] {
                if *source != "." {
                    assert!(repo().join(source).exists(), "COPY {source}: no such file");
                }
            }
        }
    }
    for stage in ["deps", "build", "smolvm", "runtime", "operator"] {
        assert!(stages.iter().any(|s| s == stage), "no stage {stage}: {stages:?}");
    }
    for member in workspace_members() {
        assert!(
            dockerfile.contains(&format!("COPY {member}/Cargo.toml {member}/Cargo.toml")),
            "the deps stage must copy {member}/Cargo.toml"
        );
    }
    for bin in ["smolvm-controller", "smolvm-webhook", "smolvm-runtime"] {
        assert!(dockerfile.contains(&format!("--bin {bin}")), "{bin} is not built");
    }
    // The operator image runs as a non-root user; the runtime's root is documented.
    let operator = dockerfile.split("AS operator").nth(1).expect("operator stage");
    let user = operator
        .lines()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("USER in the operator stage");
    assert!(!user.starts_with('0') && !user.starts_with("root"), "USER {user}");
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/smolvm-runtime-entrypoint\"]"));
}

#[test]
fn smolvm_pin_matches_the_ci_install() {
    let install = read(".ci/install-smolvm.sh");
    let version = install
        .lines()
        .find_map(|l| l.strip_prefix("SMOLVM_VERSION=\""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("SMOLVM_VERSION in .ci/install-smolvm.sh");
    let pin = read("deploy/image/smolmachines.txt");
    let line = pin
        .lines()
        .find(|l| l.starts_with("smolmachines=="))
        .expect("the smolmachines requirement");
    assert!(
        line.starts_with(&format!("smolmachines=={version} --hash=sha256:")),
        "deploy/image/smolmachines.txt: {line} (CI installs {version})"
    );
    let hash = line.rsplit(':').next().unwrap_or_default();
    assert!(
        hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{hash}"
    );
    assert!(read("Dockerfile").contains(&format!("smolvm {version}")));
}

/// The files the runtime needs from the wheel: the ones .ci/install-smolvm.sh checks.
const SMOLVM_FILES: [&str; 6] = [
    "smol-vmm",
    "libkrun.so",
    "libkrunfw.so.5",
    "agent-rootfs.tar.zst",
    "overlay-template.ext4.zst",
    "storage-template.ext4.zst",
];

fn python3() -> Option<&'static str> {
    Command::new("python3")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

/// A wheel-shaped zip with `files` under smol/ (content: their names) and a METADATA.
fn fake_wheel(dir: &Path, files: &[&str]) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("smol/licenses")).expect("mkdir");
    std::fs::create_dir_all(tree.join("smolmachines-1.32.2.dist-info")).expect("mkdir");
    for f in files {
        std::fs::write(tree.join("smol").join(f), f.as_bytes()).expect("write");
    }
    std::fs::write(tree.join("smol/__init__.py"), "").expect("write");
    std::fs::write(tree.join("smol/licenses/LICENSE"), "license").expect("write");
    std::fs::write(
        tree.join("smolmachines-1.32.2.dist-info/METADATA"),
        "Metadata-Version: 2.4\nName: smolmachines\nVersion: 1.32.2\n",
    )
    .expect("write");
    let wheel = dir.join("smolmachines-1.32.2-cp39-abi3-manylinux_2_28_x86_64.whl");
    let output = run(Command::new("python3")
        .current_dir(&tree)
        .args(["-m", "zipfile", "-c"])
        .arg(&wheel)
        .args(["smol", "smolmachines-1.32.2.dist-info"]));
    assert!(output.status.success(), "zip: {}", text(&output.stderr));
    wheel
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn unpack_smolvm_copies_what_the_runtime_needs() {
    if python3().is_none() {
        println!("skipped: python3 not found (the image's smolvm stage has it)");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let wheel = fake_wheel(dir.path(), &SMOLVM_FILES);
    let dest = dir.path().join("opt/smolvm");
    let output = run(script("deploy/image/unpack-smolvm.sh").arg(&wheel).arg(&dest));
    assert!(output.status.success(), "unpack-smolvm.sh: {}", text(&output.stderr));
    for f in SMOLVM_FILES {
        let got = std::fs::read_to_string(dest.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(got, f);
    }
    assert_eq!(mode(&dest.join("smol-vmm")), 0o755);
    assert_eq!(mode(&dest.join("libkrun.so")), 0o755);
    assert_eq!(mode(&dest.join("agent-rootfs.tar.zst")), 0o644);
    assert!(dest.join("licenses/LICENSE").is_file());
    assert!(!dest.join("__init__.py").exists(), "the Python SDK stays out");
    assert_eq!(
        std::fs::read_to_string(dest.join("VERSION")).expect("VERSION"),
        "1.32.2\n"
    );

    let broken_dir = tempfile::tempdir().expect("temp dir");
    let broken = fake_wheel(broken_dir.path(), &SMOLVM_FILES[..5]);
    let output = run(script("deploy/image/unpack-smolvm.sh")
        .arg(&broken)
        .arg(broken_dir.path().join("out")));
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("smol/storage-template.ext4.zst is missing"));
    let output = run(script("deploy/image/unpack-smolvm.sh")
        .arg(dir.path().join("nothing.whl"))
        .arg(&dest));
    assert!(!output.status.success());
}

#[test]
fn the_pinned_wheel_has_the_files_the_image_copies() {
    // `make test` exports the real smolvm's package directory (.ci/install-smolvm.sh).
    let Some(lib_dir) = std::env::var_os("SMOLVM_LIB_DIR") else {
        println!("skipped: SMOLVM_LIB_DIR is not set (run through `make test`, which installs smolvm)");
        return;
    };
    let lib_dir = PathBuf::from(lib_dir);
    for f in SMOLVM_FILES {
        assert!(lib_dir.join(f).is_file(), "{} lacks {f}", lib_dir.display());
    }
}

/// The variables .ci/install-smolvm.sh exports for smolvm (not its own SMOLVM_HOME).
fn install_script_exports() -> BTreeSet<String> {
    read(".ci/install-smolvm.sh")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("echo \"export "))
        .filter_map(|l| l.split('=').next())
        .filter(|v| *v != "SMOLVM_HOME")
        .map(str::to_string)
        .collect()
}

struct EntrypointRun {
    ok: bool,
    stderr: String,
    env: BTreeMap<String, String>,
    args: Vec<String>,
}

fn run_entrypoint(root: &Path, args: &[&str]) -> EntrypointRun {
    let record = root.join("record");
    let fake = root.join("fake-runtime");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nenv > '{0}.env'\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > '{0}.args'\n",
            record.display()
        ),
    )
    .expect("write the fake runtime");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let _ = std::fs::remove_file(record.with_extension("env"));
    let output = run(script("deploy/image/runtime-entrypoint.sh")
        .args(args)
        .env("SMOLVM_DIST", root.join("dist"))
        .env("SMOLVM_RUNTIME_STATE_DIR", root.join("state"))
        .env("SMOLVM_RUNTIME_BIN", &fake));
    let env = std::fs::read_to_string(record.with_extension("env"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args = std::fs::read_to_string(record.with_extension("args"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    EntrypointRun {
        ok: output.status.success(),
        stderr: text(&output.stderr),
        env,
        args,
    }
}

#[test]
fn runtime_entrypoint_prepares_a_persistent_library_directory() {
    let root = tempfile::tempdir().expect("temp dir");
    let dist = root.path().join("dist");
    std::fs::create_dir_all(&dist).expect("mkdir");
    for f in SMOLVM_FILES {
        std::fs::write(dist.join(f), f).expect("write");
    }
    std::fs::write(dist.join("VERSION"), "1.32.2\n").expect("write");

    let first = run_entrypoint(root.path(), &["--log-format", "text", "two words"]);
    assert!(first.ok, "entrypoint: {}", first.stderr);
    let lib = root.path().join("state/lib/smolvm-1.32.2");
    for f in SMOLVM_FILES {
        assert_eq!(std::fs::read_to_string(lib.join(f)).expect("copied"), f);
    }
    assert_eq!(mode(&lib.join("smol-vmm")), 0o755);
    assert_eq!(mode(&lib), 0o755, "smolvm's per-VM uids must traverse it");
    assert_eq!(
        first.args,
        ["--log-format", "text", "two words"],
        "arguments pass through"
    );
    let lib_text = lib.display().to_string();
    let want: BTreeMap<String, String> = [
        ("SMOLVM_LIB_DIR", lib_text.clone()),
        ("SMOLVM_BIN", format!("{lib_text}/smol-vmm")),
        ("SMOLVM_BOOT_BINARY", format!("{lib_text}/smol-vmm")),
        ("SMOLVM_AGENT_ROOTFS_TAR", format!("{lib_text}/agent-rootfs.tar.zst")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in &want {
        assert_eq!(first.env.get(k), Some(v), "{k}");
    }
    assert_eq!(
        want.keys().cloned().collect::<BTreeSet<_>>(),
        install_script_exports(),
        "the image sets the same variables as .ci/install-smolvm.sh"
    );

    // smolvm unpacks its templates into the directory and machines' disks point at them: a
    // restart must keep the directory as it is.
    std::fs::write(lib.join("overlay-template.ext4"), "unpacked by smolvm").expect("write");
    std::fs::write(dist.join("smol-vmm"), "a different build").expect("write");
    let second = run_entrypoint(root.path(), &[]);
    assert!(second.ok, "{}", second.stderr);
    assert_eq!(
        std::fs::read_to_string(lib.join("overlay-template.ext4")).expect("kept"),
        "unpacked by smolvm"
    );
    assert_eq!(std::fs::read_to_string(lib.join("smol-vmm")).expect("kept"), "smol-vmm");

    // A new smolvm version gets a directory of its own; the old one stays.
    std::fs::write(dist.join("VERSION"), "1.40.0\n").expect("write");
    let upgraded = run_entrypoint(root.path(), &[]);
    assert!(upgraded.ok, "{}", upgraded.stderr);
    assert!(root.path().join("state/lib/smolvm-1.40.0/.complete").is_file());
    assert!(lib.join("overlay-template.ext4").is_file());

    // An interrupted earlier copy (no marker) is replaced, not trusted.
    let stale = root.path().join("state/lib/smolvm-1.41.0");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("smol-vmm"), "half").expect("write");
    std::fs::write(dist.join("VERSION"), "1.41.0\n").expect("write");
    let repaired = run_entrypoint(root.path(), &[]);
    assert!(repaired.ok, "{}", repaired.stderr);
    assert_ne!(
        std::fs::read_to_string(stale.join("smol-vmm")).expect("replaced"),
        "half"
    );

    // Refusals, with a reason and without starting the runtime.
    std::fs::write(dist.join("VERSION"), "../escape\n").expect("write");
    let bad_version = run_entrypoint(root.path(), &[]);
    assert!(!bad_version.ok && bad_version.stderr.contains("unusable version"));
    assert!(bad_version.env.is_empty());
    std::fs::write(dist.join("VERSION"), "1.50.0\n").expect("write");
    std::fs::remove_file(dist.join("libkrun.so")).expect("remove");
    let missing = run_entrypoint(root.path(), &[]);
    assert!(
        !missing.ok && missing.stderr.contains("libkrun.so is missing"),
        "{}",
        missing.stderr
    );
    assert!(!root.path().join("state/lib/smolvm-1.50.0").exists());
}

/// `cargo fetch --locked --offline` in DIR (for the host platform): Err carries stderr.
fn cargo_fetch(dir: &Path) -> Result<(), String> {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let host = Command::new("rustc").arg("-vV").output().ok().and_then(|o| {
        text(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
    });
    let mut command = Command::new(cargo);
    command
        .current_dir(dir)
        .args(["fetch", "--locked", "--offline", "--quiet"]);
    if let Some(host) = host {
        command.args(["--target", &host]);
    }
    let output = run(&mut command);
    if output.status.success() {
        Ok(())
    } else {
        Err(text(&output.stderr))
    }
}

#[test]
fn stub_workspace_lets_cargo_resolve_the_dependencies_without_sources() {
    let dir = tempfile::tempdir().expect("temp dir");
    for file in ["Cargo.toml", "Cargo.lock"] {
        std::fs::copy(repo().join(file), dir.path().join(file)).expect("copy");
    }
    for member in workspace_members() {
        std::fs::create_dir_all(dir.path().join(&member)).expect("mkdir");
        std::fs::copy(
            repo().join(&member).join("Cargo.toml"),
            dir.path().join(&member).join("Cargo.toml"),
        )
        .expect("copy a member manifest");
    }
    // With only src/lib.rs in each member Cargo refuses the workspace: the declared bins and
    // benches are missing. (The placeholders must cover every declared target.)
    for member in workspace_members() {
        std::fs::create_dir_all(dir.path().join(&member).join("src")).expect("mkdir");
        std::fs::write(dir.path().join(&member).join("src/lib.rs"), "").expect("write");
    }
    let before = cargo_fetch(dir.path()).expect_err("lib.rs alone must not resolve");
    assert!(before.contains("can't find"), "unexpected failure: {before}");
    let output = run(script("deploy/image/stub-workspace.sh").arg(dir.path()));
    assert!(output.status.success(), "stub-workspace.sh: {}", text(&output.stderr));
    if let Err(e) = cargo_fetch(dir.path()) {
        if e.contains("can't find") {
            panic!("stub-workspace.sh left a target out: {e}");
        }
        println!("skipped: the offline package cache lacks a dependency: {e}");
        return;
    }
    assert!(dir.path().join("controller/src/bin/crdgen.rs").is_file());
    assert!(dir.path().join("webhook/src/main.rs").is_file());
    // Idempotent, and it never overwrites a real file.
    std::fs::write(dir.path().join("api/src/lib.rs"), "// real").expect("write");
    std::fs::remove_file(dir.path().join("webhook/src/main.rs")).expect("remove");
    let again = run(script("deploy/image/stub-workspace.sh").arg(dir.path()));
    assert!(again.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("api/src/lib.rs")).expect("read"),
        "// real"
    );
    assert!(dir.path().join("webhook/src/main.rs").is_file());
}

#[test]
fn every_deploy_script_parses() {
    let mut scripts = Vec::new();
    for sub in ["deploy/image", "deploy/scripts"] {
        for entry in std::fs::read_dir(repo().join(sub)).expect("read").flatten() {
            if entry.path().extension().is_some_and(|e| e == "sh") {
                scripts.push(format!("{sub}/{}", entry.file_name().to_string_lossy()));
            }
        }
    }
    assert!(scripts.len() >= 5, "{scripts:?}");
    for s in scripts {
        let first = read(&s).lines().next().unwrap_or_default().to_string();
        let shell = if first.contains("bash") {
            "bash"
        } else if first == "#!/bin/sh" {
            "sh"
        } else {
            panic!("{s}: unexpected interpreter line {first}")
        };
        let output = run(Command::new(shell).arg("-n").arg(repo().join(&s)));
        assert!(output.status.success(), "{s}: {}", text(&output.stderr));
    }
}

// ---------------------------------------------------------------------------------------------
// Makefile and docs
// ---------------------------------------------------------------------------------------------

#[test]
fn makefile_offers_the_deploy_targets() {
    let Ok(help) = Command::new("make").current_dir(repo()).arg("help").output() else {
        println!("skipped: make not found");
        return;
    };
    let help = text(&help.stdout);
    for target in [
        "generate",
        "manifests",
        "fmt",
        "vet",
        "build",
        "test",
        "install",
        "uninstall",
        "docker-build",
        "docker-build-runtime",
        "deploy",
        "undeploy",
        "run",
    ] {
        assert!(
            help.lines().any(|l| l.split_whitespace().next() == Some(target)),
            "make help lacks {target}:\n{help}"
        );
    }
    let missing = run(Command::new("make").current_dir(repo()).args(["deploy", "IMG=x"]));
    assert!(!missing.status.success(), "deploy needs RUNTIME_IMG too");
    assert!(text(&missing.stderr).contains("usage: make deploy"));
    let dry = run(Command::new("make").current_dir(repo()).args([
        "-n",
        "deploy",
        "IMG=a:1",
        "RUNTIME_IMG=b:2",
        "OVERLAY=cert-manager",
    ]));
    let dry = text(&dry.stdout);
    assert!(
        dry.contains("deploy/scripts/overlay.sh \"cert-manager\" \"a:1\" \"b:2\"")
            && dry.contains("apply --server-side -k"),
        "{dry}"
    );
}

/// The string constants of `pub mod NAME { … }` in api/src/constants.rs.
fn constants_of(module: &str) -> Vec<String> {
    let source = read("api/src/constants.rs");
    let start = source
        .find(&format!("pub mod {module} {{"))
        .unwrap_or_else(|| panic!("no module {module}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    body.lines()
        .filter(|l| l.trim_start().starts_with("pub const"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_string)
        .collect()
}

#[test]
fn operations_doc_explains_every_condition_and_reason() {
    let doc = read("docs/operations.md");
    let mut names = constants_of("condition");
    names.extend(constants_of("reason"));
    assert!(names.len() > 10, "{names:?}");
    // Reasons the code spells out where it uses them (each checked to still be there).
    let literal = [
        ("controller/src/reconcile.rs", "RuntimeError"),
        ("controller/src/reconcile.rs", "InvalidSpec"),
        ("controller/src/reconcile.rs", "MachineFailed"),
        ("controller/src/placement.rs", "NoNodes"),
        ("controller/src/placement.rs", "PinnedNodeUnknown"),
        ("controller/src/placement.rs", "PinnedNodeIneligible"),
        ("controller/src/placement.rs", "NoEligibleNode"),
        ("controller/src/signer/judge.rs", "RequesterNotRuntime"),
        ("controller/src/signer/judge.rs", "NoNodeClaim"),
        ("controller/src/signer/judge.rs", "UsageNotAllowed"),
        ("controller/src/signer/judge.rs", "InvalidRequest"),
        ("controller/src/signer/judge.rs", "NamesNotAllowed"),
        ("controller/src/signer/handle.rs", "RuntimeNodeVerified"),
    ];
    for (file, reason) in literal {
        assert!(
            read(file).contains(&format!("\"{reason}\"")),
            "{file} no longer uses {reason}; update this list"
        );
        names.push(reason.to_string());
    }
    let mut missing = Vec::new();
    for name in names {
        if !doc.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "docs/operations.md does not explain: {missing:?}");
    for section in [
        "## Install",
        "## Upgrade",
        "## Uninstall",
        "## Production notes",
        "## Troubleshooting",
    ] {
        assert!(doc.contains(section), "docs/operations.md lacks {section}");
    }
    // The token replacement, as one command once shell line continuations are joined.
    let joined = doc
        .replace("\\\n", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let replace = "kubectl -n smolvm-system create secret generic smolvm-runtime-auth \
                   --from-literal=token=$(openssl rand -hex 32) --dry-run=client -o yaml | kubectl apply -f -";
    let replace = replace.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains(&replace),
        "docs/operations.md must show how to replace the token: {replace}"
    );
}
