//! SmolVMPools on the real API server: the example's pool goes in and reads well in `kubectl get
//! svmp`; the example's SmolVMs come back filled from the template, their own env after the
//! template's (M4); V14 refuses a pooled SmolVM that sets what a lease cannot carry (naming each
//! field), an unknown pool (listing the namespace's), a template out of the rules, and any change
//! to a stored pooled SmolVM but running and suspended.

use std::time::Duration;

use anyhow::{Context as _, anyhow, ensure};
use serde_json::{Value, json};
use smolvm_api::constants::LABEL_POOL;
use smolvm_tests::env::{Env, eventually, repo_root};

use crate::{NS, Scenario, delete_and_wait, expect_rejected, kubectl_apply, patch_vm, vm, vms};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![pools_fill_a_smolvm_from_the_template_and_v14_guards_them]
}

/// The objects of `deploy/examples/pool.yaml`, as JSON.
fn example() -> anyhow::Result<Vec<Value>> {
    let path = repo_root().join("deploy/examples/pool.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let mut value = <Value as serde::Deserialize>::deserialize(doc)?;
        if !value.is_null() {
            value["metadata"]["namespace"] = json!(NS);
            out.push(value);
        }
    }
    Ok(out)
}

fn pool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVMPool", "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

async fn pools_fill_a_smolvm_from_the_template_and_v14_guards_them(env: &mut Env) -> anyhow::Result<()> {
    let objects = example()?;
    let (pools, claims): (Vec<Value>, Vec<Value>) = objects.into_iter().partition(|o| o["kind"] == "SmolVMPool");
    ensure!(
        pools.len() == 1 && claims.len() == 2,
        "the example has a pool and two SmolVMs"
    );
    kubectl_apply(env, &pools[0])?.map_err(|e| anyhow!("applying the example's pool: {e}"))?;
    let out = env.kubectl(&["get", "svmp", "sandboxes", "-n", NS], None)?;
    let table = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(
        header == ["NAME", "SLOTS/NODE", "READY", "TOTAL", "WHEN", "EMPTY", "AGE"],
        "kubectl get svmp: {table}"
    );
    println!("    kubectl get svmp: {}", table.lines().nth(1).unwrap_or_default());

    // The webhook's pool cache follows the API within moments; the example's SmolVMs, checked
    // with a server-side dry run, come back filled from the template.
    for claim in &claims {
        let name = claim["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let text = serde_json::to_string(claim)?;
        let out = eventually(
            &format!("{name} filled from its pool"),
            Duration::from_secs(30),
            || async {
                let out = env.kubectl(&["apply", "--dry-run=server", "-o", "json", "-f", "-"], Some(&text))?;
                Ok(out
                    .status
                    .success()
                    .then(|| serde_json::from_slice::<Value>(&out.stdout).ok())
                    .flatten())
            },
        )
        .await?;
        ensure!(out["spec"]["image"] == "python:3.12-slim", "{name}: {}", out["spec"]);
        ensure!(
            out["spec"]["resources"] == json!({"cpus": 1, "memoryMiB": 1024}),
            "{name}: {}",
            out["spec"]
        );
        let env_names: Vec<&str> = out["spec"]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str())
            .collect();
        ensure!(env_names == ["PYTHONUNBUFFERED", "JOB_ID"], "{name}: env {env_names:?}");
        ensure!(
            out["metadata"]["labels"][LABEL_POOL] == "sandboxes",
            "{name}: {}",
            out["metadata"]
        );
    }
    println!("    the example's SmolVMs take the template's image, size and env, their JOB_ID after it");

    // V14: a pooled SmolVM sets only poolRef, env, running and suspended; each other field is
    // named, with the filled object's own violations in the same answer.
    let stderr = expect_rejected(
        env,
        &vm(
            "greedy",
            json!({"poolRef": {"name": "sandboxes"}, "image": "alpine:3.20", "nodeName": "elsewhere"}),
        ),
        &["spec.image", "spec.nodeName", "V14"],
    )?;
    println!(
        "    a pooled SmolVM setting its image and a pin: {}",
        first_line(&stderr)
    );
    expect_rejected(
        env,
        &vm("lost", json!({"poolRef": {"name": "gpus"}})),
        &["spec.poolRef.name", "V14", "sandboxes"],
    )?;
    // V14 on pools: a template out of the rules, all at once, and slots beyond the policy.
    let stderr = expect_rejected(
        env,
        &pool(
            "broken",
            json!({"slotsPerNode": 100, "template": {"image": "alpine:3.20", "resources": {"cpus": 99},
                "network": {"enabled": true, "ports": [{"hostPort": 8080, "guestPort": 80}]}}}),
        ),
        &[
            "spec.template.resources.cpus",
            "spec.template.network.ports",
            "spec.slotsPerNode",
            "V14",
        ],
    )?;
    println!("    a pool out of the rules: {}", first_line(&stderr));

    // A stored pooled SmolVM (a small pool of our own: the node's disk is the machine's real one).
    let tiny = pool(
        "e2e-tiny",
        json!({"slotsPerNode": 0, "template": {"image": "alpine:3.20", "resources": {"memoryMiB": 128},
            "storage": {"storageGiB": 1, "overlayGiB": 1}}}),
    );
    kubectl_apply(env, &tiny)?.map_err(|e| anyhow!("applying e2e-tiny: {e}"))?;
    let claim = vm("pooled", json!({"poolRef": {"name": "e2e-tiny"}, "running": false}));
    let text = serde_json::to_string(&claim)?;
    eventually("pooled stored", Duration::from_secs(30), || async {
        let out = env.kubectl(&["apply", "-f", "-"], Some(&text))?;
        Ok(out.status.success().then_some(()))
    })
    .await?;
    let stored = vms(env).await?.get("pooled").await?;
    ensure!(
        stored.spec.image == "alpine:3.20" && stored.spec.storage.as_ref().and_then(|s| s.storage_gib) == Some(1),
        "pooled: {:?}",
        stored.spec
    );
    for (patch, needle) in [
        (r#"{"spec":{"resources":{"cpus":2}}}"#, "spec.resources"),
        (r#"{"spec":{"poolRef":{"name":"sandboxes"}}}"#, "spec.poolRef"),
    ] {
        let out = patch_vm(env, "pooled", patch)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(needle) && stderr.contains("V14"),
            "{patch}: {stderr}"
        );
    }
    let out = patch_vm(env, "pooled", r#"{"spec":{"suspended":true}}"#)?;
    ensure!(
        out.status.success(),
        "suspended may change: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("    a stored pooled SmolVM: resize and another pool refused (V14), suspended accepted");

    delete_and_wait(env, "pooled").await?;
    for name in ["e2e-tiny", "sandboxes"] {
        let out = env.kubectl(&["delete", "svmp", name, "-n", NS, "--wait=false"], None)?;
        ensure!(
            out.status.success(),
            "deleting {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
