//! The fault injector: the seeded schedule (smolvm-soak's `schedule`) made real, each fault
//! recorded in the history with the time it fell, then the time until what it affected was
//! reconciled again.
//!
//! How each kind is made:
//! - controller: SIGKILL of the replica the Lease names as its holder; restarted (the same
//!   identity, as a kubelet restarts a crashed container in its Pod) after 10 s, the kubelet's
//!   first restart back-off;
//! - webhook: SIGKILL of the replica the schedule names; restarted after 10 s;
//! - agent: SIGKILL of the node's runtime agent (the real one, or the double-backed one);
//!   restarted after 10 s with the same flags, token and state directory;
//! - smolvm: SIGKILL of the `smolvm serve` the real node's agent supervises (found as its child
//!   process); the agent must notice and recover on its own;
//! - etcd, apiserver: SIGKILL, then started again after the schedule's downtime on the same
//!   ports and data directory;
//! - partition: the relay in front of the simulated node's node API is cut for the fault's
//!   duration (see `relay`): the controller's calls to it go unanswered; its heartbeats still
//!   reach the API server;
//! - clock: the node's agent restarted with libfaketime preloaded (`LD_PRELOAD`, `FAKETIME`
//!   set minutes off, monotonic clocks left true), then restarted with the true clock when the
//!   fault ends. Without libfaketime the kind is skipped and says so. A clock set behind is a
//!   fault the product must report: where the agent failed under it, each failure must name the
//!   clock (reason `ClockBehind`), and where its heartbeat went stale, its SmolVMNode must carry
//!   a `HeartbeatLost` event; a clock fault that broke things silently is counted as not
//!   recovered.
//!
//! Recovery, for each fault: the SmolVMs it affected (those bound to its node, for a node's
//! fault; every soak SmolVM, for the others), as they are when it falls (a partition or a clock:
//! when it ends), each seen reconciled again (its status observed its latest generation and shows
//! a settled phase: Running, Stopped, Suspended, Failed, or Pending saying why), and for a
//! controller kill a leader renewing the Lease, for a node's fault its SmolVMNode Ready with a new
//! heartbeat. The time is from the fault (a partition or a clock: from its end) until the last.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, ResourceExt};
use smolvm_api::{Phase, SmolVM, SmolVMNode, constants};
use smolvm_soak::{
    clock::ClockFailures,
    history::Event,
    report::Recovery,
    schedule::{Fault, FaultKind, Schedule, Target},
};
use smolvm_tests::{controlplane::Part, env::NAMESPACE};

use crate::clients::is_soak_namespace;
use crate::recorder::History;
use crate::runner::Soak;

/// How long after a kill the killed process is started again (a kubelet's first back-off).
const RESTART_AFTER: Duration = Duration::from_secs(10);
/// How long a recovery is waited for at most.
const RECOVERY_LIMIT: Duration = Duration::from_secs(300);
/// Where Debian's `faketime` puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// What the injector does, when.
#[derive(Clone, Debug)]
enum Step {
    /// The fault falls.
    Inject,
    /// What it killed is started again.
    Restart,
    /// A lasting fault ends.
    Undo,
}

/// The steps of a schedule, by time.
fn steps(schedule: &Schedule) -> Vec<(Duration, Step, Fault)> {
    let mut steps = Vec::new();
    for fault in &schedule.faults {
        steps.push((fault.at, Step::Inject, fault.clone()));
        match fault.kind {
            FaultKind::Controller | FaultKind::Webhook | FaultKind::Agent => {
                steps.push((fault.at + RESTART_AFTER, Step::Restart, fault.clone()));
            }
            FaultKind::Etcd | FaultKind::Apiserver => steps.push((fault.end(), Step::Restart, fault.clone())),
            FaultKind::Partition | FaultKind::Clock => steps.push((fault.end(), Step::Undo, fault.clone())),
            FaultKind::Smolvm => {}
        }
    }
    steps.sort_by_key(|(at, _, _)| *at);
    steps
}

/// The recoveries measured, and those that did not come.
#[derive(Default)]
pub struct Recoveries {
    /// Each fault's recovery time.
    pub samples: Mutex<Vec<Recovery>>,
    /// One line for each fault whose affected SmolVMs were not all reconciled in time.
    pub missing: Mutex<Vec<String>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Recoveries {
    /// Whether a recovery is still being measured.
    pub fn pending(&self) -> bool {
        let tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.iter().any(|t| !t.is_finished())
    }
}

/// The injector of one run.
pub struct Injector<'a> {
    soak: &'a mut Soak,
    history: Arc<History>,
    /// The recoveries.
    pub recoveries: Arc<Recoveries>,
    /// Kinds that cannot be made real here, and why.
    pub skipped: BTreeMap<FaultKind, String>,
    /// Where the recoveries must end by at the latest.
    end: Instant,
    /// Who led when each controller kill fell (restarted by identity).
    killed_leaders: BTreeMap<Duration, String>,
    /// Components seen exited on their own, since when (by log file).
    crashed: BTreeMap<std::path::PathBuf, Instant>,
    /// For each clock fault in progress (by when it fell): its agent's log, the length it had
    /// then, and the wall time.
    clock_logs: BTreeMap<Duration, (std::path::PathBuf, u64, Timestamp)>,
}

impl<'a> Injector<'a> {
    /// An injector on `soak`, recording into `history`; no recovery is waited for past `end`.
    pub fn new(soak: &'a mut Soak, history: Arc<History>, end: Instant) -> Self {
        let mut skipped = BTreeMap::new();
        if !Path::new(LIBFAKETIME).exists() {
            skipped.insert(
                FaultKind::Clock,
                format!("no libfaketime ({LIBFAKETIME}; Debian's faketime package)"),
            );
        }
        Injector {
            soak,
            history,
            recoveries: Arc::default(),
            skipped,
            end,
            killed_leaders: BTreeMap::new(),
            crashed: BTreeMap::new(),
            clock_logs: BTreeMap::new(),
        }
    }

    /// Makes every fault of `schedule` at its time (what the kinds in [`Injector::skipped`]
    /// would do is not done), until `until`; all along, a component that exits on its own is
    /// started again after [`RESTART_AFTER`], as a kubelet restarts a crashed container.
    pub async fn run(&mut self, schedule: &Schedule, until: Instant) {
        for (at, step, fault) in steps(schedule) {
            if self.skipped.contains_key(&fault.kind) {
                continue;
            }
            self.supervise_until(self.history.instant(at)).await;
            let done = match step {
                Step::Inject => self.inject(&fault).await,
                Step::Restart => self.restart(&fault).await,
                Step::Undo => self.undo(&fault).await,
            };
            if let Err(e) = done {
                println!("fault {fault} ({step:?}): {e:#}");
            }
        }
        self.supervise_until(until).await;
    }

    /// Revives crashed components once a second until `when`.
    pub async fn supervise_until(&mut self, when: Instant) {
        loop {
            for line in self.soak.revive(&mut self.crashed, RESTART_AFTER) {
                println!("{:>6.1}s {line}", self.history.now().as_secs_f64());
            }
            let now = Instant::now();
            if now >= when {
                return;
            }
            tokio::time::sleep_until((now + Duration::from_secs(1)).min(when).into()).await;
        }
    }

    async fn inject(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let node = self.node_of(fault);
        match (fault.kind, fault.target) {
            (FaultKind::Controller, _) => {
                // Bounded: the injector never waits long on the API server (an etcd restart
                // due meanwhile would wait too).
                let leader = tokio::time::timeout(Duration::from_secs(10), self.soak.env.leader())
                    .await
                    .map_err(|_| anyhow::anyhow!("the Lease was not readable within 10 s"))??
                    .ok_or_else(|| anyhow::anyhow!("no leader"))?;
                let proc = self
                    .soak
                    .env
                    .controller_of(&leader)
                    .ok_or_else(|| anyhow::anyhow!("the leader {leader} is no replica of this run"))?;
                running(proc)?.kill();
                self.killed_leaders.insert(fault.at, leader);
            }
            (FaultKind::Webhook, Target::Replica(i)) => running(self.soak.webhook(i)?)?.kill(),
            (FaultKind::Agent, Target::Node(i)) => {
                running(self.soak.agent(i)?)?;
                self.soak.kill_agent(i)?;
            }
            (FaultKind::Smolvm, Target::Node(i)) => {
                let agent = self
                    .soak
                    .agent(i)?
                    .pid()
                    .ok_or_else(|| anyhow::anyhow!("the agent is down"))?;
                let serve = smolvm_serve_of(agent).ok_or_else(|| anyhow::anyhow!("no smolvm serve under the agent"))?;
                // SAFETY: plain kill(2) on the smolvm serve our own agent started.
                unsafe {
                    libc::kill(serve, libc::SIGKILL);
                }
            }
            (FaultKind::Etcd, _) => self.soak.env.plane.kill(Part::Etcd),
            (FaultKind::Apiserver, _) => self.soak.env.plane.kill(Part::ApiServer),
            (FaultKind::Partition, Target::Node(i)) => self.soak.relay(i)?.set_cut(true),
            (FaultKind::Clock, Target::Node(i)) => {
                let minutes = fault.skew_minutes.unwrap_or(0);
                let log = self.soak.agent(i)?.log().to_path_buf();
                let length = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
                self.clock_logs.insert(fault.at, (log, length, Timestamp::now()));
                self.soak.set_agent_env(i, faketime(minutes))?;
            }
            (kind, target) => anyhow::bail!("no {kind} fault on {target}"),
        }
        self.history.record(Event::Fault {
            kind: fault.kind,
            target: fault.target,
        });
        println!(
            "{:>6.1}s fault: {fault}{}",
            self.history.now().as_secs_f64(),
            describe(&node)
        );
        if !fault.kind.lasts_on_a_node() {
            self.measure(fault.kind, node);
        }
        Ok(())
    }

    async fn restart(&mut self, fault: &Fault) -> anyhow::Result<()> {
        match (fault.kind, fault.target) {
            (FaultKind::Controller, _) => {
                let leader = self.killed_leaders.remove(&fault.at).unwrap_or_default();
                if let Some(proc) = self.soak.env.controller_of(&leader) {
                    proc.respawn(&[])?;
                }
            }
            (FaultKind::Webhook, Target::Replica(i)) => self.soak.webhook(i)?.respawn(&[])?,
            (FaultKind::Agent, Target::Node(i)) => self.soak.restart_agent(i)?,
            (FaultKind::Etcd, _) => self.soak.env.plane.start_again(Part::Etcd).await?,
            (FaultKind::Apiserver, _) => self.soak.env.plane.start_again(Part::ApiServer).await?,
            _ => {}
        }
        Ok(())
    }

    async fn undo(&mut self, fault: &Fault) -> anyhow::Result<()> {
        let node = self.node_of(fault);
        match (fault.kind, fault.target) {
            (FaultKind::Partition, Target::Node(i)) => self.soak.relay(i)?.set_cut(false),
            (FaultKind::Clock, Target::Node(i)) => {
                if let Some(node) = &node {
                    let read = self.clock_logs.remove(&fault.at);
                    self.report_clock(fault.at, node.clone(), read);
                }
                self.soak.set_agent_env(i, Vec::new())?;
            }
            _ => return Ok(()),
        }
        println!("{:>6.1}s fault over: {fault}", self.history.now().as_secs_f64());
        self.measure(fault.kind, node);
        Ok(())
    }

    /// What the clock fault that fell at `at` on `node` left behind (its agent's log from where
    /// `read` says, the HeartbeatLost events since), printed, and counted as not recovered if it
    /// went unreported. In a task of its own, bounded: the injector never waits on the API
    /// server (a restart of etcd falling meanwhile would wait for it, and stay down as long).
    fn report_clock(&self, at: Duration, node: String, read: Option<(std::path::PathBuf, u64, Timestamp)>) {
        let client = self.soak.admin.clone();
        let recoveries = self.recoveries.clone();
        let task = tokio::spawn(async move {
            let look = async {
                let ready = node_report(&client, &node).await;
                let seen = match read {
                    Some((log, from, wall)) => Some((
                        clock_failures(&log, from),
                        heartbeat_lost_events(&client, &node, wall).await,
                    )),
                    None => None,
                };
                (ready, seen)
            };
            let Ok((ready, seen)) = tokio::time::timeout(Duration::from_secs(60), look).await else {
                println!("        clock fault on {node}: the API server did not answer within 60 s");
                return;
            };
            println!(
                "        clock fault on {node}: {ready}{}",
                seen.as_ref()
                    .map(|(failures, lost)| format!("; {failures}; {lost} HeartbeatLost event(s)"))
                    .unwrap_or_default()
            );
            if let Some(why) = seen.and_then(|(failures, lost)| failures.unreported(lost)) {
                recoveries
                    .missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("clock at {:.1}s on {node}: {why}", at.as_secs_f64()));
            }
        });
        self.recoveries
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }

    fn node_of(&self, fault: &Fault) -> Option<String> {
        match fault.target {
            Target::Node(i) => self.soak.node_name(i),
            _ => None,
        }
    }

    /// Starts measuring the recovery from a fault of `kind` (on `node`) now.
    fn measure(&self, kind: FaultKind, node: Option<String>) {
        let from = self.history.now();
        let client = self.soak.admin.clone();
        let recoveries = self.recoveries.clone();
        let deadline = (Instant::now() + RECOVERY_LIMIT).min(self.end);
        let wall = Timestamp::now();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            match recovered(&client, kind, node.as_deref(), wall, deadline).await {
                Ok(()) => recoveries
                    .samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Recovery {
                        kind,
                        took: started.elapsed(),
                    }),
                Err(why) => recoveries
                    .missing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!(
                        "{kind} at {:.1}s{}: not recovered: {why}",
                        from.as_secs_f64(),
                        describe(&node)
                    )),
            }
        });
        self.recoveries
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(task);
    }
}

/// `proc`, if it runs: a kill of what is already down (killed moments ago, not yet restarted)
/// would be no fault at all.
fn running(proc: &mut smolvm_tests::process::Proc) -> anyhow::Result<&mut smolvm_tests::process::Proc> {
    match proc.is_running() {
        true => Ok(proc),
        false => anyhow::bail!("{} is already down (not injected)", proc.name()),
    }
}

fn describe(node: &Option<String>) -> String {
    node.as_ref().map(|n| format!(" on {n}")).unwrap_or_default()
}

/// The environment that sets a process's clock `minutes` off through libfaketime (monotonic
/// clocks left true, so timers and timeouts still measure real time).
fn faketime(minutes: i64) -> Vec<(String, String)> {
    [
        ("LD_PRELOAD", LIBFAKETIME.to_string()),
        ("FAKETIME", format!("{minutes:+}m")),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ("DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The pids of every `smolvm serve` listening on `socket`, from /proc.
pub fn smolvm_serves_on(socket: &Path) -> Vec<i32> {
    let listen = format!("unix://{}", socket.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let mut args = cmdline.split(|b| *b == 0);
            (args.any(|a| a == b"serve") && args.any(|a| a == listen.as_bytes())).then_some(pid)
        })
        .collect()
}

/// The pid of the `smolvm serve` whose parent is `agent`, from /proc.
fn smolvm_serve_of(agent: u32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid …`: comm may hold spaces, so read after the last ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let serves = cmdline.split(|b| *b == 0).any(|arg| arg == b"serve");
        if ppid == Some(agent) && serves {
            return Some(pid);
        }
    }
    None
}

/// What a node's SmolVMNode says of itself: its Ready condition.
async fn node_report(client: &Client, node: &str) -> String {
    let api: Api<SmolVMNode> = Api::all(client.clone());
    match api.get_opt(node).await {
        Ok(Some(n)) => n
            .status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == constants::condition::READY)
            })
            .map(|c| format!("Ready={} {}: {}", c.status, c.reason, c.message))
            .unwrap_or_else(|| "no Ready condition".to_string()),
        Ok(None) => "no SmolVMNode".to_string(),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// How the agent logged under a clock fault: what it logged past byte `from` of `log`.
fn clock_failures(log: &Path, from: u64) -> ClockFailures {
    let text = std::fs::read(log).unwrap_or_default();
    let tail = text
        .get(usize::try_from(from).unwrap_or(usize::MAX)..)
        .unwrap_or_default();
    ClockFailures::of(&String::from_utf8_lossy(tail))
}

/// The HeartbeatLost events on SmolVMNode `node` since `wall`.
async fn heartbeat_lost_events(client: &Client, node: &str, wall: Timestamp) -> usize {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let selector = format!("regarding.name={node},reason={}", constants::reason::HEARTBEAT_LOST);
    let params = kube::api::ListParams::default().fields(&selector);
    match events.list(&params).await {
        Ok(list) => list
            .items
            .iter()
            .filter(|e| {
                let last = e
                    .series
                    .as_ref()
                    .map(|s| s.last_observed_time.0)
                    .or(e.event_time.as_ref().map(|t| t.0));
                last.is_some_and(|t| t >= wall)
            })
            .count(),
        Err(_) => 0,
    }
}

/// Waits until what a fault of `kind` (on `node`, injected at `wall`) affected is reconciled
/// again; `Err` says what was not, at the deadline.
async fn recovered(
    client: &Client,
    kind: FaultKind,
    node: Option<&str>,
    wall: Timestamp,
    deadline: Instant,
) -> Result<(), String> {
    let vms: Api<SmolVM> = Api::all(client.clone());
    let mut affected: Option<BTreeSet<String>> = None;
    let mut heartbeat = None;
    loop {
        let why = match check(client, &vms, node, &mut affected, &mut heartbeat, kind, wall).await {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if Instant::now() > deadline {
            return Err(why);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One look: drops from `affected` each SmolVM seen reconciled; Ok when none is left and the
/// kind's own condition holds.
async fn check(
    client: &Client,
    vms: &Api<SmolVM>,
    node: Option<&str>,
    affected: &mut Option<BTreeSet<String>>,
    heartbeat: &mut Option<Option<Timestamp>>,
    kind: FaultKind,
    wall: Timestamp,
) -> Result<(), String> {
    let list = vms
        .list(&Default::default())
        .await
        .map_err(|e| format!("listing SmolVMs: {e}"))?;
    let in_scope = |vm: &&SmolVM| {
        is_soak_namespace(&vm.namespace().unwrap_or_default()) && (node.is_none() || vm.bound_node() == node)
    };
    let set = affected.get_or_insert_with(|| list.items.iter().filter(in_scope).filter_map(|v| v.uid()).collect());
    let present: BTreeSet<String> = list.items.iter().filter_map(|v| v.uid()).collect();
    set.retain(|uid| present.contains(uid));
    for vm in &list.items {
        if let Some(uid) = vm.uid()
            && settled(vm)
        {
            set.remove(&uid);
        }
    }
    if !set.is_empty() {
        let names: Vec<String> = list
            .items
            .iter()
            .filter(|v| v.uid().is_some_and(|u| set.contains(&u)))
            .map(|v| format!("{}/{} {}", v.namespace().unwrap_or_default(), v.name_any(), state(v)))
            .take(5)
            .collect();
        return Err(format!("{} SmolVMs not reconciled: {}", set.len(), names.join(", ")));
    }
    if let Some(node) = node {
        let api: Api<SmolVMNode> = Api::all(client.clone());
        let seen = api.get(node).await.map_err(|e| format!("reading {node}: {e}"))?;
        let status = seen.status.unwrap_or_default();
        let beat = status.heartbeat_time.map(|t| t.0);
        let before = *heartbeat.get_or_insert(beat);
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == constants::condition::READY && c.status == "True");
        if !ready || beat == before {
            return Err(format!("{node} not Ready with a new heartbeat"));
        }
    }
    if kind == FaultKind::Controller {
        let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
        let lease = leases
            .get(constants::FIELD_MANAGER_CONTROLLER)
            .await
            .map_err(|e| format!("reading the Lease: {e}"))?;
        let renewed = lease.spec.and_then(|s| s.renew_time).is_some_and(|t| t.0 > wall);
        if !renewed {
            return Err("no leader renewed the Lease since the kill".to_string());
        }
    }
    Ok(())
}

/// Whether a SmolVM's status observed its latest spec and shows a settled phase.
fn settled(vm: &SmolVM) -> bool {
    let Some(status) = &vm.status else { return false };
    let current = status.observed_generation.is_some() && status.observed_generation == vm.metadata.generation;
    let says_why = status
        .conditions
        .iter()
        .any(|c| c.type_ == constants::condition::SCHEDULED && c.status == "False");
    let phase = match status.phase {
        Some(Phase::Running | Phase::Stopped | Phase::Suspended | Phase::Failed) => true,
        Some(Phase::Pending) => says_why,
        _ => false,
    };
    current && phase && vm.metadata.deletion_timestamp.is_none()
}

fn state(vm: &SmolVM) -> String {
    let status = vm.status.as_ref();
    format!(
        "{} (generation {:?}, observed {:?})",
        status.and_then(|s| s.phase).map_or("no phase", |p| p.as_str()),
        vm.metadata.generation,
        status.and_then(|s| s.observed_generation)
    )
}
