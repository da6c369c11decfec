//! SmolVMClasses on the real API server: the example's three classes go in, a SmolVM with only an
//! image and a class comes back with the class's sizes and the record of it (M3), a class changed
//! afterwards leaves it as it was, and V12 refuses an unknown class (listing the known ones) and a
//! second default class (naming the first). Deleting a class in use is allowed, with a warning.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use kube::{Api, api::DeleteParams};
use serde_json::{Value, json};
use smolvm_api::{
    SmolVMClass,
    constants::{ANNOTATION_CLASS, ANNOTATION_CLASS_GENERATION, LABEL_CLASS},
};
use smolvm_tests::env::{Env, eventually, repo_root};

use crate::{NS, Scenario, delete_and_wait, dry_run_until_admitted, expect_rejected, kubectl_apply, vm, vms};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![classes_fill_a_smolvm_once_and_v12_guards_them]
}

/// The objects of `deploy/examples/classes.yaml`, as JSON.
fn example() -> anyhow::Result<Vec<Value>> {
    let path = repo_root().join("deploy/examples/classes.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = <Value as serde::Deserialize>::deserialize(doc)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or_default()
}

async fn classes_fill_a_smolvm_once_and_v12_guards_them(env: &mut Env) -> anyhow::Result<()> {
    let objects = example()?;
    let (classes, examples): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(|o| kind(o) == "SmolVMClass");
    ensure!(
        classes.len() == 3 && examples.len() == 3,
        "the example has three classes and a SmolVM of each"
    );
    for class in &classes {
        kubectl_apply(env, class)?.map_err(|e| anyhow!("applying a class of the example: {e}"))?;
    }
    // A class of our own with a small disk, for the SmolVM this scenario stores (the node's disk
    // is the machine's real one).
    let tiny = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMClass", "metadata": {"name": "e2e-tiny"},
        "spec": {"resources": {"cpus": 1, "memoryMiB": 256}, "storage": {"storageGiB": 1, "overlayGiB": 1}, "terminationGracePeriodSeconds": 3}
    });
    kubectl_apply(env, &tiny)?.map_err(|e| anyhow!("applying e2e-tiny: {e}"))?;
    let api: Api<SmolVMClass> = Api::all(env.admin().await?);

    // The webhook's class cache follows the API within moments; the example's SmolVMs, checked
    // with a server-side dry run (admission runs; nothing is stored), get their classes.
    let expected = [
        ("dev-box", "small", json!({"cpus": 1, "memoryMiB": 2048})),
        ("web", "medium", json!({"cpus": 2, "memoryMiB": 4096})),
        ("batch", "large", json!({"cpus": 4, "memoryMiB": 16384})),
    ];
    for (name, class, resources) in expected {
        let object = examples
            .iter()
            .find(|o| o["metadata"]["name"] == name)
            .with_context(|| format!("the example has no SmolVM {name}"))?;
        let out = dry_run_until_admitted(env, object, &format!("{name} admitted with its class")).await?;
        ensure!(
            out["spec"]["className"] == class,
            "{name}: className {}",
            out["spec"]["className"]
        );
        ensure!(
            out["spec"]["resources"] == resources,
            "{name}: resources {}",
            out["spec"]["resources"]
        );
        ensure!(
            out["metadata"]["annotations"][ANNOTATION_CLASS] == class,
            "{name}: {}",
            out["metadata"]
        );
        ensure!(
            out["metadata"]["labels"][LABEL_CLASS] == class,
            "{name}: {}",
            out["metadata"]
        );
    }
    println!("    the example's SmolVMs take small (the default), medium and large; batch keeps its own memory");

    // Stored: only an image and a class.
    let stored = vm(
        "classy",
        json!({"image": "alpine:3.20", "className": "e2e-tiny", "running": false}),
    );
    kubectl_apply(env, &stored)?.map_err(|e| anyhow!("applying classy: {e}"))?;
    let got = vms(env).await?.get("classy").await?;
    let generation = api.get("e2e-tiny").await?.metadata.generation.unwrap_or(0);
    let annotations = got.metadata.annotations.clone().unwrap_or_default();
    ensure!(
        got.spec.resources.as_ref().and_then(|r| r.memory_mib) == Some(256)
            && got.spec.storage.as_ref().and_then(|s| s.storage_gib) == Some(1)
            && got.spec.termination_grace_period_seconds == Some(3),
        "classy did not get e2e-tiny's values: {:?}",
        got.spec
    );
    ensure!(
        annotations.get(ANNOTATION_CLASS).map(String::as_str) == Some("e2e-tiny")
            && annotations.get(ANNOTATION_CLASS_GENERATION) == Some(&generation.to_string()),
        "annotations {annotations:?}, class generation {generation}"
    );

    // The class changes; the SmolVM does not.
    let bigger = json!({"spec": {"resources": {"memoryMiB": 512}}});
    let out = env.kubectl(
        &[
            "patch",
            "smolvmclass",
            "e2e-tiny",
            "--type=merge",
            "-p",
            &bigger.to_string(),
        ],
        None,
    )?;
    ensure!(
        out.status.success(),
        "patching e2e-tiny: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = vms(env).await?.get("classy").await?;
    ensure!(
        after.spec == got.spec,
        "the SmolVM changed with its class: {:?}",
        after.spec
    );
    ensure!(
        after
            .metadata
            .annotations
            .unwrap_or_default()
            .get(ANNOTATION_CLASS_GENERATION)
            == Some(&generation.to_string()),
        "the recorded generation moved"
    );
    println!("    classy took e2e-tiny (generation {generation}); the class changed afterwards, classy did not");

    // V12: the class never changes after CREATE (the CRD's CEL rule and the webhook).
    let out = env.kubectl(
        &[
            "patch",
            "smolvm",
            "classy",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"className":"large"}}"#,
        ],
        None,
    )?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("className") && stderr.contains("V12"),
        "{stderr}"
    );

    // V12: an unknown class, refused with the list of known ones.
    let stderr = expect_rejected(
        env,
        &vm("odd", json!({"image": "alpine:3.20", "className": "huge"})),
        &["spec.className", "V12", "e2e-tiny, large, medium, small"],
    )?;
    println!(
        "    unknown class refused: {}",
        stderr.lines().next().unwrap_or_default()
    );

    // V12: a second default class, refused naming the first; a class out of policy too.
    let second = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMClass",
        "metadata": {"name": "xl", "annotations": {"vm.smolvm.dev/is-default-class": "true"}}, "spec": {}
    });
    expect_rejected(env, &second, &["\"small\"", "V12"])?;
    let huge = json!({
        "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMClass",
        "metadata": {"name": "huge"}, "spec": {"resources": {"cpus": 64}}
    });
    expect_rejected(env, &huge, &["spec.resources.cpus", "V2"])?;

    // kubectl get shows the classes with their columns.
    let out = env.kubectl(&["get", "svmc"], None)?;
    let table = String::from_utf8_lossy(&out.stdout);
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "CPUS", "MEMORY", "STORAGE", "DEFAULT", "AGE"] {
        ensure!(header.contains(column), "kubectl get svmc lacks {column}: {table}");
    }
    ensure!(
        table.lines().any(|l| l.starts_with("small") && l.contains("true")),
        "small shows as the default: {table}"
    );

    // Deleting a class in use is allowed, with a warning that counts its SmolVMs.
    let out = eventually("the class's SmolVM counted", Duration::from_secs(30), || async {
        // A dry run first, so that the class is deleted only once the count is there.
        let out = env.kubectl(&["delete", "smolvmclass", "e2e-tiny", "--dry-run=server"], None)?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        Ok((out.status.success() && stderr.contains("1 SmolVM(s) name the class")).then_some(stderr))
    })
    .await?;
    let deleted = env.kubectl(&["delete", "smolvmclass", "e2e-tiny"], None)?;
    ensure!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    println!("    deleting a class in use: {}", out.trim());
    let still = vms(env).await?.get("classy").await?;
    ensure!(still.spec == got.spec, "the SmolVM changed when its class went");

    delete_and_wait(env, "classy").await?;
    for class in ["small", "medium", "large"] {
        if let Err(e) = api.delete(class, &DeleteParams::default()).await {
            bail!("deleting the class {class}: {e}");
        }
    }
    Ok(())
}
