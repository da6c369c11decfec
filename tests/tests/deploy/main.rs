//! The deployment under deploy/, the Dockerfile's scripts, the Makefile's deploy targets and the
//! operator docs.
//!
//! The manifest tests render every kustomization with `kubectl kustomize` (kustomize v5, as in
//! kubectl 1.27 and later). Without such a kubectl they print `skipped: …` and return: they never
//! pass by pretending. The script tests run the scripts the Dockerfile runs, outside Docker.
//! The Helm chart's tests (helm.rs) render it with `helm template` and compare it with kustomize.

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
        scheduling::v1::PriorityClass,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
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

mod cluster_images;
mod dockerfile;
mod docs;
mod helm;
mod images;
mod monitoring;
mod network_policy;
mod rbac;
mod render;
mod secrets;
mod tls;
mod workloads;

#[allow(unused_imports)]
use dockerfile::*;
#[allow(unused_imports)]
use docs::*;
#[allow(unused_imports)]
use helm::*;
#[allow(unused_imports)]
use images::*;
#[allow(unused_imports)]
use network_policy::*;
#[allow(unused_imports)]
use rbac::*;
#[allow(unused_imports)]
use render::*;
#[allow(unused_imports)]
use secrets::*;
#[allow(unused_imports)]
use tls::*;
#[allow(unused_imports)]
use workloads::*;
