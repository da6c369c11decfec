//! The guest boot check (canary): against the real `smolvm serve`, where no guest boots on these
//! machines (the check must say so, cleaned, and leave no machine behind), and against
//! `BootingRuntime`, a TEST DOUBLE of a runtime whose guests boot (the happy path, which cannot
//! run here), for the triggers: first run, a runtime restart (smolvm's boot id), and a request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use smolvm_api::constants::CANARY_MACHINE_NAME;
use smolvm_runtime::canary::{self, BootCheck, CheckState, HostFacts, Outcome};
use smolvm_runtime::metrics::Metrics;
use smolvm_runtime::supervisor::RuntimeStatus;
use smolvm_runtime::vmm::{
    DeleteOutcome, Machine, MachineSpec, MachineState, RegistryAuth, ResizeRequest, Vmm, VmmCapacity, VmmError,
    VmmHealth,
};
use smolvm_testkit::node::{self as common, Pki, TestAgent};
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_smolvm_reports_that_no_guest_boots_here_and_leaves_nothing() {
    common::init();
    let dir = tempfile::tempdir().expect("dir");
    let Some(agent) = TestAgent::with_smolvm("canary", dir.path(), Arc::new(Pki::new())).await else {
        return;
    };
    let env = vec![("SMOLVM_VM_UID_DROP".to_string(), "off".to_string())];
    let facts = HostFacts::read(std::path::Path::new("/dev/kvm"), &env);
    let started = Instant::now();
    let metrics = Arc::new(Metrics::default());
    let check = canary::spawn(
        agent.agent.vmm().clone(),
        agent.agent.supervisor().status(),
        metrics.clone(),
        canary::Config {
            interval: Duration::from_secs(3600),
            boot_timeout: Duration::from_secs(180),
            poll: Duration::from_millis(200),
            kvm_device: "/dev/kvm".into(),
            smolvm_env: env,
        },
    );
    let mut updates = check.subscribe();
    let done = tokio::time::timeout(Duration::from_secs(240), async {
        loop {
            let state = updates.borrow_and_update().clone();
            if let CheckState::Done(outcome) = &state.state {
                return (outcome.clone(), state);
            }
            if updates.changed().await.is_err() {
                panic!("the check stopped");
            }
        }
    })
    .await
    .expect("the check finished within 240 s");
    println!(
        "guest boot check finished after {:?} (host facts: {facts:?})",
        started.elapsed()
    );
    let (outcome, state) = done;
    assert_eq!(state.smolvm_version.as_deref(), Some("1.32.2"));
    assert!(state.last_run.is_some());
    match outcome {
        Outcome::Booted { millis } => println!("a guest booted on this machine in {millis} ms"),
        Outcome::Failed(diagnosis) => {
            println!("no guest booted: {:?}: {}", diagnosis.cause, diagnosis.message);
            common::assert_cleaned_cause(&diagnosis.message);
            assert!(
                diagnosis.message.starts_with("no guest booted: "),
                "{}",
                diagnosis.message
            );
            if facts.pvm || (facts.hypervisor && !facts.virt_flags) {
                assert_eq!(
                    diagnosis.cause,
                    canary::Cause::HostCannotRunGuest,
                    "{}",
                    diagnosis.message
                );
            }
            assert_eq!(metrics.canary_checks(diagnosis.cause.reason()), 1);
            assert!(metrics.encode().contains("smolvm_runtime_guest_bootable 0"));
        }
    }
    let left: Vec<String> = agent
        .agent
        .vmm()
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.name)
        .filter(|name| name.contains("canary"))
        .collect();
    assert!(left.is_empty(), "the canary machine was deleted: {left:?}");
    drop(check);
    agent.agent.shutdown().await;
}

/// TEST DOUBLE of a runtime whose guests boot: create, start (after `boot`) and delete of one
/// machine, and a `/capacity` boot id the test changes to play a restart of `smolvm serve`.
struct BootingRuntime {
    boot: Duration,
    boot_id: Mutex<String>,
    starts: AtomicUsize,
    machines: Mutex<Vec<String>>,
}

impl BootingRuntime {
    fn new(boot: Duration) -> Self {
        BootingRuntime {
            boot,
            boot_id: Mutex::new("serve-1".into()),
            starts: AtomicUsize::new(0),
            machines: Mutex::new(Vec::new()),
        }
    }

    fn machine(name: &str, state: MachineState) -> Machine {
        Machine {
            name: name.into(),
            state,
            cpus: 1,
            memory_mib: 64,
            storage_gib: Some(1),
            overlay_gib: Some(1),
            image: None,
            ports: Vec::new(),
            network: false,
            pid: None,
            raw: serde_json::Value::Null,
        }
    }
}

#[async_trait]
impl Vmm for BootingRuntime {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Ok(VmmHealth {
            status: "ok".into(),
            version: "1.32.2".into(),
            nested_virt: true,
            machines_total: None,
            machines_running: None,
            uptime_seconds: None,
        })
    }
    async fn capacity(&self) -> Result<VmmCapacity, VmmError> {
        Ok(VmmCapacity {
            boot_id: self.boot_id.lock().ok().map(|id| id.clone()),
            gpu_count: 2,
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        let names = self.machines.lock().map(|m| m.clone()).unwrap_or_default();
        Ok(names.iter().map(|n| Self::machine(n, MachineState::Created)).collect())
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        let known = self
            .machines
            .lock()
            .map(|m| m.iter().any(|n| n == name))
            .unwrap_or(false);
        Ok(known.then(|| Self::machine(name, MachineState::Created)))
    }
    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        assert_eq!(spec.image, None, "the canary boots smolvm's own guest: no image pull");
        assert!(!spec.network, "the canary has no network");
        assert_eq!(
            (spec.cpus, spec.memory_mib),
            (canary::CANARY_CPUS, canary::CANARY_MEMORY_MIB)
        );
        if let Ok(mut machines) = self.machines.lock() {
            machines.push(spec.name.clone());
        }
        Ok(Self::machine(&spec.name, MachineState::Created))
    }
    async fn start(&self, name: &str, _: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        tokio::time::sleep(self.boot).await;
        self.starts.fetch_add(1, Ordering::SeqCst);
        Ok(Self::machine(name, MachineState::Running))
    }
    async fn stop(&self, name: &str) -> Result<Machine, VmmError> {
        Ok(Self::machine(name, MachineState::Stopped))
    }
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let mut machines = self.machines.lock().map_err(|_| VmmError::BadRequest {
            message: "poisoned".into(),
        })?;
        let before = machines.len();
        machines.retain(|n| n != name);
        Ok(if machines.len() < before {
            DeleteOutcome::Deleted
        } else {
            DeleteOutcome::Missing
        })
    }
    async fn resize(&self, _: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        Err(VmmError::BadRequest {
            message: "no resize here".into(),
        })
    }
}

async fn wait_for_runs(updates: &mut watch::Receiver<BootCheck>, runtime: &BootingRuntime, runs: usize) -> BootCheck {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if runtime.starts.load(Ordering::SeqCst) >= runs {
                let state = updates.borrow_and_update().clone();
                if matches!(state.state, CheckState::Done(_)) && state.last_run.is_some() {
                    return state;
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), updates.changed()).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{runs} checks within 30 s"))
}

#[tokio::test]
async fn a_booting_runtime_is_bootable_and_checked_again_when_smolvm_restarts_or_asked() {
    let runtime = Arc::new(BootingRuntime::new(Duration::from_millis(30)));
    let (_status, status_rx) = watch::channel(RuntimeStatus {
        ready: true,
        version: Some("1.32.2".into()),
        ..Default::default()
    });
    let metrics = Arc::new(Metrics::default());
    let check = canary::spawn(
        runtime.clone(),
        status_rx,
        metrics.clone(),
        canary::Config {
            interval: Duration::from_secs(3600),
            boot_timeout: Duration::from_secs(10),
            poll: Duration::from_millis(20),
            kvm_device: "/dev/kvm".into(),
            smolvm_env: Vec::new(),
        },
    );
    let mut updates = check.subscribe();
    let first = wait_for_runs(&mut updates, &runtime, 1).await;
    match first.state {
        CheckState::Done(Outcome::Booted { millis }) => assert!(millis >= 30, "the boot time is measured: {millis}"),
        other => panic!("expected a boot, got {other:?}"),
    }
    assert_eq!(first.nested_virt, Some(true));
    assert_eq!(first.gpu_count, Some(2));
    assert!(
        runtime.machines.lock().map(|m| m.is_empty()).unwrap_or(false),
        "the canary machine is deleted after it booted"
    );
    assert_eq!(metrics.canary_checks("Booted"), 1);
    // Nothing changed: no second check.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(runtime.starts.load(Ordering::SeqCst), 1, "no check without a reason");
    // smolvm restarted (a new boot id): checked again.
    if let Ok(mut id) = runtime.boot_id.lock() {
        *id = "serve-2".into();
    }
    wait_for_runs(&mut updates, &runtime, 2).await;
    // Asked for (the recheck annotation).
    check.request();
    wait_for_runs(&mut updates, &runtime, 3).await;
    assert_eq!(metrics.canary_checks("Booted"), 3);
    assert!(metrics.encode().contains("smolvm_runtime_guest_bootable 1"));
    assert_eq!(
        runtime.get(CANARY_MACHINE_NAME).await.ok().flatten(),
        None,
        "nothing named after the canary is left"
    );
}
