//! `make bench-e2e`: 1,000 SmolVMs placed on 50 simulated nodes, then 10,000, on a real
//! kube-apiserver with the real webhook and controller (separate processes, as in e2e).
//!
//! TEST DOUBLE: each simulated node is the runtime agent's real node API server (mTLS, bearer
//! token, the same router) backed by `MemoryVmm`, an in-memory machine table standing in for
//! `smolvm serve`. It is used only here: fifty real smolvm servers cannot run on one machine, and
//! guests cannot boot on these machines anyway.
//!
//! Prints: the time until every VM is bound and created (phase Running), API writes per VM
//! (from kube-apiserver's own request counters), and the controller's peak RSS at 1,000 and at
//! 10,000 VMs. Figures are printed, never asserted. Environment: SCALE_NODES (50), SCALE_FIRST
//! (1000), SCALE_TOTAL (10000; 0 skips the second stage), SCALE_CONCURRENCY (32).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow};
use async_trait::async_trait;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use smolvm_api::{SmolVM, SmolVMNode, constants};
use smolvm_certs::{CertificateAuthority, ReloadableResolver, runtime_serving_sans};
use smolvm_runtime::{
    metrics::Metrics,
    nodeapi::{Identity, NodeApiState, auth::TokenAuth, router, tls::MtlsServer},
    vmm::{DeleteOutcome, Machine, MachineSpec, MachineState, ResizeRequest, Vmm, VmmError, VmmHealth},
};
use smolvm_tests::{
    assets,
    env::{Env, NAMESPACE, Options},
};

/// TEST DOUBLE of `smolvm serve`: machines in a map; start always succeeds.
#[derive(Default)]
struct MemoryVmm {
    machines: Mutex<HashMap<String, Machine>>,
}

impl MemoryVmm {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Machine>) -> T) -> T {
        let mut guard = self.machines.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    fn transition(&self, name: &str, state: MachineState) -> Result<Machine, VmmError> {
        self.with(|m| match m.get_mut(name) {
            Some(machine) => {
                machine.state = state;
                Ok(machine.clone())
            }
            None => Err(VmmError::NotFound {
                message: format!("machine '{name}' not found"),
            }),
        })
    }
}

#[async_trait]
impl Vmm for MemoryVmm {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Ok(VmmHealth {
            status: "ok".into(),
            version: "memory-double".into(),
            nested_virt: false,
            machines_total: Some(self.with(|m| m.len() as u64)),
            machines_running: None,
            uptime_seconds: None,
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(self.with(|m| m.values().cloned().collect()))
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        Ok(self.with(|m| m.get(name).cloned()))
    }
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        self.with(|m| {
            if m.contains_key(&spec.name) {
                return Err(VmmError::Conflict {
                    message: format!("machine '{}' already exists", spec.name),
                });
            }
            let machine = Machine::created_from(spec);
            m.insert(spec.name.clone(), machine.clone());
            Ok(machine)
        })
    }
    async fn start(&self, name: &str, _auth: Option<&smolvm_api::nodeapi::RegistryAuth>) -> Result<Machine, VmmError> {
        self.transition(name, MachineState::Running)
    }
    async fn stop(&self, name: &str) -> Result<Machine, VmmError> {
        self.transition(name, MachineState::Stopped)
    }
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        Ok(match self.with(|m| m.remove(name)) {
            Some(_) => DeleteOutcome::Deleted,
            None => DeleteOutcome::Missing,
        })
    }
    async fn resize(&self, name: &str, request: &ResizeRequest) -> Result<Machine, VmmError> {
        self.with(|m| match m.get_mut(name) {
            Some(machine) => {
                if let Some(c) = request.cpus {
                    machine.cpus = c;
                }
                if let Some(mem) = request.memory_mib {
                    machine.memory_mib = u64::from(mem);
                }
                Ok(machine.clone())
            }
            None => Err(VmmError::NotFound {
                message: format!("machine '{name}' not found"),
            }),
        })
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2);
    assets::bench_main("scale", runtime, run)
}

/// Writes (POST, PUT, PATCH, DELETE) kube-apiserver has served, by resource.
async fn writes(admin: &Client) -> anyhow::Result<HashMap<String, f64>> {
    let text = admin
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut by_resource = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default()
                .to_string()
        };
        if !matches!(label("verb").as_str(), "POST" | "PUT" | "PATCH" | "DELETE") {
            continue;
        }
        let key = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        let value = value.parse::<f64>().unwrap_or(0.0);
        // Totals count the writes that took effect; refused ones show in the breakdown.
        if label("code").starts_with('2') {
            *by_resource.entry(key.clone()).or_insert(0.0) += value;
        }
        // The same by verb and code, for the breakdown (409s are retried binds).
        *by_resource
            .entry(format!("{key} {} {}", label("verb"), label("code")))
            .or_insert(0.0) += value;
    }
    Ok(by_resource)
}

fn peak_rss_mib(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    match (field("VmHWM:"), field("VmRSS:")) {
        (Some(peak), Some(now)) => format!("peak RSS {peak:.1} MiB (now {now:.1} MiB)"),
        _ => "RSS unavailable".into(),
    }
}

async fn run(assets: assets::Assets) -> anyhow::Result<()> {
    let nodes_n = env_usize("SCALE_NODES", 50);
    let first = env_usize("SCALE_FIRST", 1000);
    let total = env_usize("SCALE_TOTAL", 10_000);
    let concurrency = env_usize("SCALE_CONCURRENCY", 32);
    let bins = assets::operator_bins()?;
    let tmp = tempfile::Builder::new().prefix("smolvm-scale-").tempdir()?;
    let options = Options {
        runtime: false,
        heartbeat_timeout: Duration::from_secs(120),
        ..Options::default()
    };
    let env = Env::start(&assets, bins, tmp.path(), options).await?;
    let admin = env.admin().await?;
    let controller_pid = env
        .controller
        .as_ref()
        .and_then(|p| p.pid())
        .ok_or_else(|| anyhow!("no controller process"))?;

    // The runtime CA and token the controller created, as the simulated runtimes' kubelet would
    // mount them (the CA's key is read here only to issue the doubles' serving certificates).
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let text = |s: &Secret, k: &str| -> anyhow::Result<String> {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| anyhow!("Secret lacks {k}"))
    };
    let ca_secret = secrets.get(constants::RUNTIME_CA).await.context("runtime CA Secret")?;
    let ca = CertificateAuthority::from_pem(&text(&ca_secret, "tls.crt")?, &text(&ca_secret, "tls.key")?)?;
    let token = text(&secrets.get(constants::RUNTIME_AUTH_SECRET).await?, "token")?;

    // Fifty simulated nodes: real node API servers over MemoryVmm, and their SmolVMNodes.
    let node_api: Api<SmolVMNode> = Api::all(admin.clone());
    let mut servers = Vec::new();
    let mut endpoints = Vec::new();
    for i in 0..nodes_n {
        let name = format!("sim-node-{i:02}");
        let leaf = ca.issue_server(&runtime_serving_sans(&name), &[], Duration::from_secs(24 * 3600))?;
        let resolver = Arc::new(ReloadableResolver::from_pem(&leaf.cert_pem, &leaf.key_pem)?);
        let identity = Identity::new(name.clone());
        let uid = format!("sim-uid-{i:02}");
        identity.set_node_uid(Some(uid.clone()));
        identity.set_runtime_version(Some("memory-double".into()));
        let state = NodeApiState::new(
            Arc::new(MemoryVmm::default()),
            TokenAuth::fixed(token.clone())?,
            identity,
            Arc::new(Metrics::default()),
            None,
        );
        let listener = std::net::TcpListener::bind((IpAddr::V4(Ipv4Addr::LOCALHOST), 0))?;
        let port = listener.local_addr()?.port();
        servers.push(MtlsServer::start(listener, router(state), resolver, ca.cert_pem())?);
        let node: SmolVMNode = serde_json::from_value(json!({
            "apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
            "metadata": {"name": name}, "spec": {},
        }))?;
        match node_api.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        endpoints.push((name, uid, port));
    }
    let heartbeat = |admin: Client, endpoints: Vec<(String, String, u16)>| async move {
        let api: Api<SmolVMNode> = Api::all(admin);
        for (name, uid, port) in &endpoints {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let status = json!({
                "apiVersion": constants::API_VERSION, "kind": "SmolVMNode",
                "status": {
                    "nodeUID": uid,
                    "endpoint": {"address": "127.0.0.1", "port": port},
                    "runtimeVersion": "memory-double",
                    "protocolVersion": constants::PROTOCOL_VERSION,
                    "heartbeatTime": now,
                    "capacity": {"cpus": 512, "memoryMiB": 262144, "storageGiB": 8192},
                    "allocatable": {"cpus": 512, "memoryMiB": 262144, "storageGiB": 8192},
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "RuntimeReady", "message": "simulated", "lastTransitionTime": now},
                        {"type": "RuntimeReady", "status": "True", "reason": "Serving", "message": "simulated", "lastTransitionTime": now},
                        {"type": "KVMAvailable", "status": "True", "reason": "Simulated", "message": "simulated", "lastTransitionTime": now},
                    ],
                },
            });
            if let Err(e) = api
                .patch_status(
                    name,
                    &PatchParams::apply("smolvm-scale-bench").force(),
                    &Patch::Apply(&status),
                )
                .await
            {
                eprintln!("heartbeat of {name}: {e}");
            }
        }
    };
    heartbeat(admin.clone(), endpoints.clone()).await;
    let beat = tokio::spawn({
        let (admin, endpoints) = (admin.clone(), endpoints.clone());
        async move {
            loop {
                tokio::time::sleep(Duration::from_secs(20)).await;
                heartbeat(admin.clone(), endpoints.clone()).await;
            }
        }
    });
    // Let the controller's node cache see the nodes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "scale: {nodes_n} simulated nodes up; controller idle: {}",
        peak_rss_mib(controller_pid)
    );

    let vms: Api<SmolVM> = Api::namespaced(admin.clone(), "default");
    let mut created = 0usize;
    for target in [first, total] {
        if target <= created {
            continue;
        }
        let before = writes(&admin).await?;
        let started = Instant::now();
        let failures = stream::iter(created..target)
            .map(|i| {
                let vms = vms.clone();
                async move {
                    let vm: SmolVM = serde_json::from_value(json!({
                        "apiVersion": constants::API_VERSION, "kind": "SmolVM",
                        "metadata": {"name": format!("scale-{i:05}")},
                        "spec": {"image": "alpine:3.20", "resources": {"cpus": 1, "memoryMiB": 128},
                                 "storage": {"storageGiB": 1, "overlayGiB": 1}},
                    }))?;
                    vms.create(&PostParams::default(), &vm)
                        .await
                        .map(|_| ())
                        .map_err(anyhow::Error::from)
                }
            })
            .buffer_unordered(concurrency)
            .filter_map(|r| async move { r.err() })
            .collect::<Vec<_>>()
            .await;
        if let Some(e) = failures.first() {
            return Err(anyhow!("{} creates failed; first: {e:#}", failures.len()));
        }
        let created_in = started.elapsed();
        let new = target - created;
        created = target;
        let mut peak = String::new();
        loop {
            let list = vms.list(&ListParams::default()).await?;
            let done = list
                .items
                .iter()
                .filter(|v| {
                    v.status.as_ref().is_some_and(|s| {
                        s.machine_name.is_some() && s.phase.as_ref().is_some_and(|p| format!("{p:?}") == "Running")
                    })
                })
                .count();
            if done >= created {
                break;
            }
            if started.elapsed() > Duration::from_secs(1800) {
                return Err(anyhow!("only {done}/{created} VMs Running after 30 min"));
            }
            peak = peak_rss_mib(controller_pid);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let all_done = started.elapsed();
        let after = writes(&admin).await?;
        let delta = |k: &str| after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
        let object_writes = delta("smolvms") - new as f64; // minus the benchmark's own creates
        let status_writes = delta("smolvms/status");
        let events = delta("events");
        println!(
            "scale: {new} new VMs ({created} in all) on {nodes_n} nodes: created in {:.1}s; all bound, created and Running after {:.1}s",
            created_in.as_secs_f64(),
            all_done.as_secs_f64()
        );
        println!(
            "scale:   API writes per VM by the operator (2xx): {:.2} (smolvms {:.2} + smolvms/status {:.2}); events writes per VM {:.2}",
            (object_writes + status_writes) / new as f64,
            object_writes / new as f64,
            status_writes / new as f64,
            events / new as f64
        );
        let mut breakdown: Vec<String> = after
            .keys()
            .filter(|k| (k.starts_with("smolvms") || k.starts_with("events")) && k.contains(' '))
            .map(|k| (k, delta(k)))
            .filter(|(_, d)| *d > 0.0)
            .map(|(k, d)| format!("{k}: {d:.0}"))
            .collect();
        breakdown.sort();
        println!("scale:   by verb and code: {}", breakdown.join(", "));
        let _ = peak;
        println!("scale:   controller at {created} VMs: {}", peak_rss_mib(controller_pid));
    }
    beat.abort();
    drop(servers);
    drop(env);
    Ok(())
}
