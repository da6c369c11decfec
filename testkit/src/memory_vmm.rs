//! `MemoryVmm`: a TEST DOUBLE of `smolvm serve` for the control-plane benchmarks: machines in a
//! map, a start that always succeeds, and smolvm's fork pools and leases, refilled at once. It
//! stands behind the runtime agent's real node API (mTLS, bearer token, the same router) on each
//! simulated node, where fifty real smolvm servers cannot run on one machine and no guest boots.
//! A create's host mounts are kept and reported as smolvm reports them (`mounts` in the
//! machine's JSON: `tag`, `source`, `target`, `readonly`, `staged`), the source as given; no
//! directory is checked or served. A branch copies its running branchable source (`branchable`
//! is set by a branchable start) under its own name, with `parentMachine` naming the source.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use smolvm_runtime::vmm::{
    BranchRequest, DeleteOutcome, HostMount, LeaseInfo, LeaseRequest, Machine, MachineSpec, MachineState, PoolInfo,
    PoolRequest, ResizeRequest, Vmm, VmmError, VmmHealth,
};

/// A pool as the double keeps it.
#[derive(Debug, Clone)]
struct Pool {
    source: String,
    desired: u32,
    ready: Vec<String>,
    workers: u64,
}

#[derive(Debug, Default)]
struct World {
    machines: HashMap<String, Machine>,
    /// Each machine's host mounts, as its create gave them.
    mounts: HashMap<String, Vec<HostMount>>,
    pools: BTreeMap<String, Pool>,
    /// By idempotency key.
    leases: HashMap<String, LeaseInfo>,
    next_lease: u64,
}

/// The TEST DOUBLE; see the module's doc.
#[derive(Debug, Default)]
pub struct MemoryVmm {
    world: Mutex<World>,
}

fn not_found(what: &str) -> VmmError {
    VmmError::NotFound {
        message: format!("{what} not found"),
    }
}

impl MemoryVmm {
    fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        let mut guard = self.world.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    fn transition(&self, name: &str, state: MachineState) -> Result<Machine, VmmError> {
        self.with(|w| match w.machines.get_mut(name) {
            Some(machine) => {
                machine.state = state;
                Ok(machine.clone())
            }
            None => Err(not_found(&format!("machine '{name}'"))),
        })
    }

    /// A machine's host mounts as its create gave them, if it exists.
    pub fn mounts(&self, name: &str) -> Option<Vec<HostMount>> {
        self.with(|w| {
            w.machines
                .contains_key(name)
                .then(|| w.mounts.get(name).cloned().unwrap_or_default())
        })
    }

    /// The pools, each as `(name, ready, desired, active)`, sorted by name.
    pub fn pool_counts(&self) -> Vec<(String, u32, u32, u32)> {
        self.with(|w| {
            w.pools
                .iter()
                .map(|(name, p)| {
                    let active = w
                        .leases
                        .values()
                        .filter(|l| &l.pool == name && l.state == "active")
                        .count();
                    (name.clone(), p.ready.len() as u32, p.desired, active as u32)
                })
                .collect()
        })
    }
}

/// Host mounts as smolvm reports them (`MountInfo`).
fn mounts_json(mounts: &[HostMount]) -> serde_json::Value {
    mounts
        .iter()
        .enumerate()
        .map(|(i, m)| {
            serde_json::json!({
                "tag": format!("smolvm{i}"),
                "source": m.source.display().to_string(),
                "target": m.target,
                "readonly": m.read_only,
                "staged": false,
            })
        })
        .collect()
}

/// Sets `key` in the machine's runtime JSON (an object from then on).
fn set_raw(machine: &mut Machine, key: &str, value: serde_json::Value) {
    if !machine.raw.is_object() {
        machine.raw = serde_json::json!({});
    }
    if let Some(object) = machine.raw.as_object_mut() {
        object.insert(key.to_string(), value);
    }
}

/// Forks ready workers until every pool has its `desired`.
fn refill(w: &mut World) {
    let World { machines, pools, .. } = w;
    for (name, pool) in pools.iter_mut() {
        let Some(source) = machines.get(&pool.source).cloned() else {
            continue;
        };
        while (pool.ready.len() as u32) < pool.desired {
            pool.workers += 1;
            let worker = format!("{name}-w{}", pool.workers);
            let mut machine = source.clone();
            machine.name = worker.clone();
            machine.state = MachineState::Running;
            machines.insert(worker.clone(), machine);
            pool.ready.push(worker);
        }
    }
}

fn info(name: &str, pool: &Pool, active: u32) -> PoolInfo {
    PoolInfo {
        name: name.to_string(),
        source: pool.source.clone(),
        desired: pool.desired,
        ready: pool.ready.len() as u32,
        provisioning: 0,
        active,
    }
}

#[async_trait]
impl Vmm for MemoryVmm {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Ok(VmmHealth {
            status: "ok".into(),
            version: "memory-double".into(),
            nested_virt: false,
            machines_total: Some(self.with(|w| w.machines.len() as u64)),
            machines_running: None,
            uptime_seconds: None,
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(self.with(|w| w.machines.values().cloned().collect()))
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        Ok(self.with(|w| w.machines.get(name).cloned()))
    }
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        self.with(|w| {
            if w.machines.contains_key(&spec.name) {
                return Err(VmmError::Conflict {
                    message: format!("machine '{}' already exists", spec.name),
                });
            }
            let mut machine = Machine::created_from(spec);
            machine.raw = serde_json::json!({ "mounts": mounts_json(&spec.mounts) });
            w.machines.insert(spec.name.clone(), machine.clone());
            w.mounts.insert(spec.name.clone(), spec.mounts.clone());
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
        Ok(
            match self.with(|w| {
                w.mounts.remove(name);
                w.machines.remove(name)
            }) {
                Some(_) => DeleteOutcome::Deleted,
                None => DeleteOutcome::Missing,
            },
        )
    }
    async fn resize(&self, name: &str, request: &ResizeRequest) -> Result<Machine, VmmError> {
        self.with(|w| match w.machines.get_mut(name) {
            Some(machine) => {
                if let Some(c) = request.cpus {
                    machine.cpus = c;
                }
                if let Some(mem) = request.memory_mib {
                    machine.memory_mib = u64::from(mem);
                }
                Ok(machine.clone())
            }
            None => Err(not_found(&format!("machine '{name}'"))),
        })
    }
    async fn start_branchable(
        &self,
        name: &str,
        _auth: Option<&smolvm_api::nodeapi::RegistryAuth>,
    ) -> Result<Machine, VmmError> {
        let mut machine = self.transition(name, MachineState::Running)?;
        self.with(|w| {
            if let Some(kept) = w.machines.get_mut(name) {
                set_raw(kept, "branchable", serde_json::Value::Bool(true));
                machine = kept.clone();
            }
        });
        Ok(machine)
    }
    /// A branch is a copy of its running branchable source under its own name, running, with
    /// `parentMachine` naming the source and the request's ports.
    async fn branch(&self, source: &str, request: &BranchRequest<'_>) -> Result<Machine, VmmError> {
        self.with(|w| {
            let golden = match w.machines.get(source) {
                None => return Err(not_found(&format!("machine '{source}'"))),
                Some(m) if m.state != MachineState::Running => {
                    return Err(VmmError::Conflict {
                        message: format!("golden machine '{source}' is not running"),
                    });
                }
                Some(m) if !m.branchable() => {
                    return Err(VmmError::Conflict {
                        message: format!("golden machine '{source}' is not branchable"),
                    });
                }
                Some(m) => m.clone(),
            };
            if w.machines.contains_key(request.name) {
                return Err(VmmError::Conflict {
                    message: format!("machine '{}' already exists", request.name),
                });
            }
            let mut machine = golden;
            machine.name = request.name.to_string();
            machine.ports = request.ports.to_vec();
            set_raw(&mut machine, "branchable", serde_json::Value::Bool(false));
            set_raw(
                &mut machine,
                "parentMachine",
                serde_json::Value::String(source.to_string()),
            );
            w.machines.insert(request.name.to_string(), machine.clone());
            Ok(machine)
        })
    }
    async fn pools(&self) -> Result<Vec<PoolInfo>, VmmError> {
        Ok(self
            .pool_counts()
            .into_iter()
            .map(|(name, ready, desired, active)| PoolInfo {
                source: name.clone(),
                name,
                desired,
                ready,
                provisioning: 0,
                active,
            })
            .collect())
    }
    async fn create_pool(&self, request: &PoolRequest<'_>) -> Result<PoolInfo, VmmError> {
        self.with(|w| {
            match w.machines.get(request.source) {
                None => return Err(not_found(&format!("machine '{}'", request.source))),
                Some(m) if m.state != MachineState::Running => {
                    return Err(VmmError::Conflict {
                        message: format!("golden machine '{}' is not running", request.source),
                    });
                }
                Some(_) => {}
            }
            if w.pools.contains_key(request.name) {
                return Err(VmmError::Conflict {
                    message: format!("fork pool '{}' already exists", request.name),
                });
            }
            let pool = Pool {
                source: request.source.to_string(),
                desired: request.ready,
                ready: Vec::new(),
                workers: 0,
            };
            w.pools.insert(request.name.to_string(), pool);
            refill(w);
            let pool = &w.pools[request.name];
            Ok(info(request.name, pool, 0))
        })
    }
    async fn resize_pool(&self, name: &str, ready: u32) -> Result<PoolInfo, VmmError> {
        self.with(|w| {
            let pool = w
                .pools
                .get_mut(name)
                .ok_or_else(|| not_found(&format!("fork pool '{name}'")))?;
            pool.desired = ready;
            while pool.ready.len() as u32 > ready {
                if let Some(worker) = pool.ready.pop() {
                    w.machines.remove(&worker);
                }
            }
            refill(w);
            Ok(info(name, &w.pools[name], 0))
        })
    }
    async fn delete_pool(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        self.with(|w| {
            let Some(pool) = w.pools.remove(name) else {
                return Ok(DeleteOutcome::Missing);
            };
            for worker in pool.ready {
                w.machines.remove(&worker);
            }
            Ok(DeleteOutcome::Deleted)
        })
    }
    async fn acquire_lease(&self, pool: &str, request: &LeaseRequest<'_>) -> Result<LeaseInfo, VmmError> {
        self.with(|w| {
            if let Some(lease) = w.leases.get(request.key) {
                return Ok(lease.clone());
            }
            let entry = w
                .pools
                .get_mut(pool)
                .ok_or_else(|| not_found(&format!("fork pool '{pool}'")))?;
            if entry.ready.is_empty() {
                return Err(VmmError::NoReadySlot {
                    message: format!("no ready worker in fork pool '{pool}'"),
                });
            }
            let worker = entry.ready.remove(0);
            w.next_lease += 1;
            let lease = LeaseInfo {
                id: format!("lease-{}", w.next_lease),
                pool: pool.to_string(),
                machine: worker,
                state: "active".into(),
            };
            w.leases.insert(request.key.to_string(), lease.clone());
            refill(w);
            Ok(lease)
        })
    }
    async fn heartbeat_lease(&self, _pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.with(|w| {
            w.leases
                .values()
                .find(|l| l.id == lease)
                .cloned()
                .ok_or_else(|| not_found(&format!("fork lease '{lease}'")))
        })
    }
    async fn complete_lease(&self, _pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.with(|w| {
            let found = w.leases.values_mut().find(|l| l.id == lease);
            let Some(found) = found else {
                return Err(not_found(&format!("fork lease '{lease}'")));
            };
            found.state = "completed".into();
            let done = found.clone();
            w.machines.remove(&done.machine);
            Ok(done)
        })
    }
}
