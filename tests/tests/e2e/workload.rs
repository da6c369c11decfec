//! Workloads: command, args, env from a Secret and a ConfigMap, a pull secret, restart policy,
//! egress host names; the controller's reads refused without the workload-secrets component;
//! the workload immutable once bound; and no secret value anywhere it must not be.

use std::{path::Path, time::Duration};

use anyhow::{anyhow, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use smolvm_api::constants;
use smolvm_tests::env::{self, Env, eventually};

use crate::{
    NS, Scenario, condition, delete_and_wait, events_for, expect_event, expect_rejected, kubectl_apply, vm, vms,
    wait_vm,
};

pub(crate) fn scenarios() -> Vec<(&'static str, Scenario)> {
    scenarios![workload_from_secrets_and_config_maps_reaches_smolvm_and_no_secret_leaks]
}

const SECRET_ENV_VALUE: &str = "e2e-env-secret-value-9Vq2";
const REGISTRY_PASSWORD: &str = "e2e-registry-pa55-Lk3x";
const COMPONENT_RBAC: &str = "deploy/components/workload-secrets/rbac.yaml";

fn ready_reason(v: &smolvm_api::SmolVM) -> Option<(String, String, String)> {
    condition(v, constants::condition::READY).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Every file under `dir` whose bytes contain `needle` (none are skipped).
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            stack.extend(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        } else if meta.is_file()
            && let Ok(bytes) = std::fs::read(&path)
            && memchr::memmem::find(&bytes, needle).is_some()
        {
            found.push(path);
        }
    }
    found
}

/// smolvm's own record of machine `name`, from its database under the runtime's state directory.
fn smolvm_record(state: &Path, name: &str) -> Option<Value> {
    let needle = format!("{{\"name\":\"{name}\"");
    for file in files_containing(state, needle.as_bytes()) {
        let Ok(bytes) = std::fs::read(&file) else { continue };
        let mut at = 0;
        while let Some(offset) = memchr::memmem::find(&bytes[at..], needle.as_bytes()) {
            let start = at + offset;
            let mut stream = serde_json::Deserializer::from_slice(&bytes[start..]).into_iter::<Value>();
            if let Some(Ok(record)) = stream.next()
                && record.get("entrypoint").is_some()
            {
                return Some(record);
            }
            at = start + 1;
        }
    }
    None
}

/// The SmolVM's env comes from a Secret and a ConfigMap: refused without the component
/// (SecretAccessDenied), a missing key (CreateConfigError) until it is created, then the
/// resolved values reach smolvm's machine record with the command, args, working directory,
/// restart policy and stop timeout. The pull secret's credential reaches the agent's start (its
/// log names the registry). Changing the command after binding is refused with V6's message. No
/// secret value is in any log, event, status or metric; the registry password nowhere on disk.
pub(crate) async fn workload_from_secrets_and_config_maps_reaches_smolvm_and_no_secret_leaks(
    env: &mut Env,
) -> anyhow::Result<()> {
    let admin = env.admin().await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), NS);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wl-creds"},
        "stringData": {"token": SECRET_ENV_VALUE}});
    secrets
        .create(&PostParams::default(), &serde_json::from_value(secret)?)
        .await?;
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "wl-conf"},
        "data": {"mode": "fast"}});
    config_maps
        .create(&PostParams::default(), &serde_json::from_value(config)?)
        .await?;
    let auth = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("robot:{REGISTRY_PASSWORD}"))
    };
    let docker_config = json!({"auths": {"https://index.docker.io/v1/": {"auth": auth}}}).to_string();
    let pull = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "wl-regcred"}, "stringData": {".dockerconfigjson": docker_config}});
    secrets
        .create(&PostParams::default(), &serde_json::from_value(pull)?)
        .await?;

    let name = "workload";
    let spec = json!({
        "image": "alpine:3.20",
        "resources": {"memoryMiB": 128},
        "storage": {"storageGiB": 1, "overlayGiB": 1},
        "command": ["/bin/sh", "-c"],
        "args": ["echo \"$MODE\" && sleep 3600"],
        "workingDir": "/tmp",
        "env": [
            {"name": "GREETING", "value": "hello"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "wl-creds", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "wl-conf", "key": "mode"}}},
            {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "wl-conf", "key": "level"}}},
            {"name": "EXTRA", "valueFrom": {"secretKeyRef": {"name": "wl-absent", "key": "x", "optional": true}}},
        ],
        "imagePullSecrets": [{"name": "wl-regcred"}],
        "restartPolicy": "OnFailure",
        "terminationGracePeriodSeconds": 20,
        "network": {"enabled": true, "allowedHosts": ["example.com"]},
    });
    kubectl_apply(env, &vm(name, spec))?.map_err(|e| anyhow!("applying {name}: {e}"))?;

    // deploy/default does not let the controller read Secrets: told, with the permission.
    let denied = wait_vm(
        env,
        name,
        "Ready=False SecretAccessDenied",
        Duration::from_secs(60),
        |v| ready_reason(v).is_some_and(|(s, r, _)| s == "False" && r == constants::reason::SECRET_ACCESS_DENIED),
    )
    .await?;
    let (_, _, message) = ready_reason(&denied).unwrap_or_default();
    for part in ["may not get secrets", NS, "workload-secrets"] {
        ensure!(message.contains(part), "SecretAccessDenied lacks {part:?}: {message}");
    }
    expect_event(env, name, constants::reason::SECRET_ACCESS_DENIED).await?;

    // With the component, the reads work; the missing ConfigMap key is told, by name.
    let rbac = std::fs::read_to_string(env::repo_root().join(COMPONENT_RBAC))?;
    let out = env.kubectl(&["apply", "-f", "-"], Some(&rbac))?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let missing = wait_vm(
        env,
        name,
        "Ready=False CreateConfigError",
        Duration::from_secs(90),
        |v| ready_reason(v).is_some_and(|(s, r, _)| s == "False" && r == constants::reason::CREATE_CONFIG_ERROR),
    )
    .await?;
    let (_, _, message) = ready_reason(&missing).unwrap_or_default();
    for part in ["level", "ConfigMap wl-conf", "LEVEL"] {
        ensure!(message.contains(part), "CreateConfigError lacks {part:?}: {message}");
    }
    ensure!(
        !message.contains("wl-absent"),
        "an optional reference was reported: {message}"
    );
    expect_event(env, name, constants::reason::CREATE_CONFIG_ERROR).await?;

    // The key appears: the machine is created with every value resolved.
    config_maps
        .patch(
            "wl-conf",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"level": "7"}})),
        )
        .await?;
    let created = wait_vm(env, name, "the machine created", Duration::from_secs(90), |v| {
        v.status.as_ref().is_some_and(|s| s.effective.is_some())
    })
    .await?;
    let machine = created
        .status
        .as_ref()
        .and_then(|s| s.machine_name.clone())
        .ok_or_else(|| anyhow!("no machine name"))?;
    let state = env.dir().join("rt-state");
    let record = smolvm_record(&state, &machine).ok_or_else(|| anyhow!("no smolvm record of {machine}"))?;
    ensure!(record["entrypoint"] == json!(["/bin/sh", "-c"]), "{record}");
    ensure!(record["cmd"] == json!(["echo \"$MODE\" && sleep 3600"]), "{record}");
    ensure!(record["workdir"] == "/tmp", "{record}");
    ensure!(record["restart"]["policy"] == "on-failure", "{record}");
    ensure!(record["stop_timeout_secs"] == 20, "{record}");
    let env_text = record["env"].to_string();
    for part in [
        "GREETING",
        "hello",
        "TOKEN",
        SECRET_ENV_VALUE,
        "MODE",
        "fast",
        "LEVEL",
        "\"7\"",
    ] {
        ensure!(env_text.contains(part), "smolvm's env lacks {part}: {env_text}");
    }
    ensure!(
        !env_text.contains("EXTRA"),
        "an optional missing value was set: {env_text}"
    );
    ensure!(record.to_string().contains("example.com"), "allowedHosts: {record}");

    // The start carried the credential for docker.io (the agent's log names the registry).
    eventually(
        "the agent's start with a registry credential",
        Duration::from_secs(90),
        || {
            let log = env.log_tail("smolvm-runtime", 400);
            let machine = machine.clone();
            async move {
                Ok(log
                    .lines()
                    .any(|l| l.contains("registry credential") && l.contains("docker.io") && l.contains(&machine))
                    .then_some(()))
            }
        },
    )
    .await?;

    // Bound: the workload is immutable.
    let mut changed = vm(name, json!({"image": "alpine:3.20"}));
    changed["spec"] = serde_json::to_value(&created.spec)?;
    changed["spec"]["command"] = json!(["/bin/other"]);
    expect_rejected(env, &changed, &["spec.command", "delete and recreate", "V6"])?;

    // No secret value in any log, event, the status, or a metric; the registry password nowhere
    // under the run's directory (smolvm's state included: it is per start only).
    let logs: Vec<_> = std::fs::read_dir(env.dir())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    ensure!(!logs.is_empty(), "no component logs under the run directory");
    for value in [SECRET_ENV_VALUE, REGISTRY_PASSWORD] {
        for log in &logs {
            let text = std::fs::read(log)?;
            ensure!(
                memchr::memmem::find(&text, value.as_bytes()).is_none(),
                "{} holds a secret value",
                log.display()
            );
        }
        let events = serde_json::to_string(&events_for(env, name).await?)?;
        ensure!(!events.contains(value), "an event holds a secret value");
        let status = serde_json::to_string(&vms(env).await?.get(name).await?.status)?;
        ensure!(!status.contains(value), "the status holds a secret value");
        for (component, addr) in &env.ops {
            let (code, body) = env::http_get(addr, "/metrics").await?;
            ensure!(code == 200, "{component} /metrics answered {code}");
            ensure!(!body.contains(value), "{component}'s metrics hold a secret value");
        }
    }
    let leaked = files_containing(env.dir(), REGISTRY_PASSWORD.as_bytes());
    ensure!(leaked.is_empty(), "the registry password was written to {leaked:?}");

    delete_and_wait(env, name).await?;
    let out = env.kubectl(&["delete", "-f", "-"], Some(&rbac))?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for secret in ["wl-creds", "wl-regcred"] {
        secrets.delete(secret, &DeleteParams::default()).await?;
    }
    config_maps.delete("wl-conf", &DeleteParams::default()).await?;
    Ok(())
}
