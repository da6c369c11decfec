//! The reconcile loop's I/O layer: it observes, asks [`crate::plan`] and [`crate::placement`]
//! what to do, does it through the API server and the node API, and records what happened in
//! status conditions and events.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::{core::v1::Service, discovery::v1::EndpointSlice},
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        controller::Action,
        events::{Event, EventType},
        reflector::{ObjectRef, Store},
    },
};
use serde_json::json;
use smolvm_api::{
    Phase, RestartPolicy, SmolVM, SmolVMNode, SmolVMStatus,
    constants::{
        FIELD_MANAGER_CONTROLLER, FINALIZER, FORCE_DELETE_ANNOTATION, RECREATE_LOST_MACHINE_ANNOTATION, condition,
        reason,
    },
    nodeapi::{ErrorCode, MachineState, MachineStatus},
};

use crate::{
    expose,
    nodeclient::{CallError, NodeClient},
    placement::{self, Ledger, Request},
    plan::{self, MachineAction, NodeHealth, RunGoal, Step},
};

/// Errors of the controller. `reason()` is stable, for metrics and conditions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a call.
    #[error("API server: {0}")]
    Kube(#[from] kube::Error),
    /// The object lacks something every stored object has.
    #[error("object has no {0}")]
    MissingField(&'static str),
    /// A status or patch could not be serialized.
    #[error("serialization: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl Error {
    /// Stable reason string.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "Conflict",
            Error::Kube(_) => "KubeError",
            Error::MissingField(_) => "MissingField",
            Error::Serialize(_) => "SerializationError",
        }
    }
}

/// Timings of the reconcile loop.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A node heartbeat older than this makes the node unreachable.
    pub heartbeat_timeout: SignedDuration,
    /// Slow resync of runtime state for a steady VM.
    pub resync: Duration,
    /// Retry of a VM whose node cannot be reached or that failed to start.
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            heartbeat_timeout: SignedDuration::from_secs(40),
            resync: Duration::from_secs(300),
            retry: Duration::from_secs(30),
        }
    }
}

/// What the reconciler needs.
pub struct Context {
    /// API client.
    pub client: Client,
    /// SmolVMNodes, from a reflector.
    pub nodes: Store<SmolVMNode>,
    /// What is committed on each node.
    pub ledger: Ledger,
    /// Client of the node API.
    pub node_client: NodeClient,
    /// Event sink.
    pub recorder: crate::events::EventSink,
    /// Timings.
    pub timing: Timing,
    /// Placement tunables.
    pub placement: placement::Config,
    /// Metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Consecutive unsettled converge passes per VM, for their backoff.
    pub unsettled: Unsettled,
}

/// Counts, per VM UID, the consecutive converge passes that did not settle.
#[derive(Debug, Default)]
pub struct Unsettled(std::sync::Mutex<std::collections::HashMap<String, u32>>);

impl Unsettled {
    /// Records one more unsettled pass of `uid`; returns how many in a row.
    pub fn bump(&self, uid: &str) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(uid.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    }

    /// `uid` settled (or is gone): its count starts again.
    pub fn reset(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

impl Context {
    /// Forgets a VM that is gone or no longer holds a node: its reservation and its counters.
    pub fn forget(&self, uid: &str) {
        self.ledger.release(uid);
        self.unsettled.reset(uid);
    }
}

/// Times a node API call into the latency histogram.
async fn timed<T>(ctx: &Context, operation: &str, call: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = call.await;
    ctx.metrics.runtime_call(operation, start.elapsed());
    out
}

/// Reconciles one SmolVM, recording the outcome and duration.
pub async fn reconcile(vm: Arc<SmolVM>, ctx: Arc<Context>) -> Result<Action, Error> {
    use tracing::Instrument;
    let span = tracing::info_span!("reconcile", namespace = %vm.namespace().unwrap_or_default(), name = %vm.name_any());
    let start = std::time::Instant::now();
    let result = reconcile_inner(vm, ctx.clone()).instrument(span).await;
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.reason(),
    };
    ctx.metrics.reconciled(label, start.elapsed());
    result
}

/// One pass over a SmolVM: the pure [`plan::next_step`] decides, this acts.
///
/// The finalizer is added and removed here rather than through `kube::runtime::finalizer`,
/// whose cleanup can keep the finalizer only by returning an error. A deletion held because the
/// node is unreachable is not a failed reconcile: it is `DeletionBlocked=True` with a requeue,
/// and as an error it would be counted in the failure metrics, backed off by the error policy,
/// and logged as one on every pass until the node returns or the force annotation is set.
async fn reconcile_inner(vm: Arc<SmolVM>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = vm.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<SmolVM> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = vm.uid().ok_or(Error::MissingField("metadata.uid"))?;
    match plan::next_step(&vm) {
        Step::Forget => {
            ctx.forget(&uid);
            Ok(Action::await_change())
        }
        Step::AddFinalizer => {
            let patch = match &vm.metadata.finalizers {
                // The `test` that the list is still absent (a JSON patch `test` of a missing path
                // against null succeeds): a finalizer another client added meanwhile makes the
                // patch fail (and the reconcile retry) instead of being overwritten.
                None => json!([
                    {"op": "test", "path": "/metadata/finalizers", "value": null},
                    {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}
                ]),
                Some(_) => json!([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]),
            };
            api.patch(
                &vm.name_any(),
                &PatchParams::default(),
                &Patch::Json::<()>(serde_json::from_value(patch)?),
            )
            .await?;
            Ok(Action::await_change())
        }
        Step::RemoveFinalizer => {
            remove_finalizer(&api, &vm).await?;
            ctx.forget(&uid);
            Ok(Action::await_change())
        }
        Step::DeleteMachine { node, machine, force } => delete(&api, &vm, &ctx, &uid, &node, &machine, force).await,
        Step::Place => place(&api, &vm, &ctx, &uid).await,
        Step::Converge { node, machine } => {
            ctx.ledger.observe_bound(&uid, &node, &Request::of(&vm));
            converge(&api, &vm, &ctx, &uid, &node, &machine).await
        }
    }
}

async fn remove_finalizer(api: &Api<SmolVM>, vm: &SmolVM) -> Result<(), Error> {
    let Some(index) = vm.metadata.finalizers.iter().flatten().position(|f| f == FINALIZER) else {
        return Ok(());
    };
    let patch = json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": FINALIZER},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")}
    ]);
    api.patch(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(patch)?),
    )
    .await?;
    Ok(())
}

async fn publish(ctx: &Context, vm: &SmolVM, type_: EventType, reason: &str, action: &str, note: String) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &vm.object_ref(&())).await {
        tracing::warn!(error = %e, "could not record event");
    }
}

async fn delete(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    uid: &str,
    node: &str,
    machine: &str,
    force: bool,
) -> Result<Action, Error> {
    sync_endpoint(ctx, node);
    match timed(ctx, "DeleteMachine", ctx.node_client.delete_machine(node, machine)).await {
        Ok(outcome) => {
            unexpose(ctx, vm).await?;
            remove_finalizer(api, vm).await?;
            ctx.forget(uid);
            let note = if outcome.missing {
                format!("machine {machine} was already gone from node {node}")
            } else {
                format!("deleted machine {machine} on node {node}")
            };
            publish(ctx, vm, EventType::Normal, "Deleted", "Delete", note).await;
            Ok(Action::await_change())
        }
        Err(e) if delete_failure(force, &e) == DeleteFailure::GiveUp => {
            unexpose(ctx, vm).await?;
            remove_finalizer(api, vm).await?;
            ctx.forget(uid);
            let note = format!(
                "node {node} is unreachable ({}); finalizer removed because of {FORCE_DELETE_ANNOTATION}; the local state of machine {machine} on {node} may be orphaned",
                e.message()
            );
            publish(ctx, vm, EventType::Warning, reason::FORCE_DELETED, "Delete", note).await;
            Ok(Action::await_change())
        }
        Err(e) => {
            let (why, message) = if delete_failure(force, &e) == DeleteFailure::AgentUnreachable {
                (
                    reason::RUNTIME_UNREACHABLE,
                    format!(
                        "node {node} cannot confirm that machine {machine} is gone: {}. Deletion waits for it; to give up on the local state, annotate the SmolVM with {FORCE_DELETE_ANNOTATION}=true",
                        e.message()
                    ),
                )
            } else if delete_failure(force, &e) == DeleteFailure::RuntimeUnavailable {
                // The agent answers but smolvm does not: the machine may well still run, so
                // giving up on it is not offered; the delete is retried.
                (
                    reason::RUNTIME_UNREACHABLE,
                    format!(
                        "node {node} answers but its runtime cannot delete machine {machine} now: {}. Deletion is retried; {FORCE_DELETE_ANNOTATION} applies only while the node's agent cannot be reached at all",
                        e.message()
                    ),
                )
            } else {
                (
                    "RuntimeError",
                    format!("node {node} failed to delete machine {machine}: {}", e.message()),
                )
            };
            let problem = Problem {
                phase: Phase::Deleting,
                condition: condition::DELETION_BLOCKED,
                status: "True",
                reason: why,
                message,
                event_reason: "DeletionBlocked",
                action: "Delete",
                note: None,
            };
            report(api, vm, ctx, vm.status.clone().unwrap_or_default(), problem).await
        }
    }
}

async fn place(api: &Api<SmolVM>, vm: &SmolVM, ctx: &Context, uid: &str) -> Result<Action, Error> {
    // This VM was bound a moment ago and the cache has not caught up: binding again would only
    // meet a 409 (and drop the reservation the real binding holds). The watch brings the bound
    // object soon; look again then.
    if ctx.ledger.node_of(uid).is_some() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let nodes = ctx.nodes.state();
    let request = Request::of(vm);
    let now = Timestamp::now();
    let chosen = ctx
        .ledger
        .place_and_reserve(uid, &request, nodes.iter().map(|n| n.as_ref()), now, &ctx.placement);
    let mut status = vm.status.clone().unwrap_or_default();
    let node_name = match chosen {
        Ok(name) => name,
        Err(unplaceable) => {
            ctx.metrics
                .placement_failures
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: unplaceable.reason.into(),
                })
                .inc();
            let problem = Problem {
                phase: Phase::Pending,
                condition: condition::SCHEDULED,
                status: "False",
                reason: reason::UNSCHEDULABLE,
                message: unplaceable.message,
                event_reason: "FailedScheduling",
                action: "Schedule",
                note: None,
            };
            return report(api, vm, ctx, status, problem).await;
        }
    };
    let node_uid = ctx
        .nodes
        .get(&ObjectRef::new(&node_name))
        .and_then(|n| n.status.as_ref().and_then(|s| s.node_uid.clone()));
    let Some(node_uid) = node_uid else {
        ctx.ledger.release(uid);
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    status.node_name = Some(node_name.clone());
    status.node_uid = Some(node_uid);
    status.machine_name = plan::machine_name(vm);
    status.phase = Some(Phase::Scheduled);
    status.observed_generation = vm.metadata.generation;
    plan::set_condition(
        &mut status.conditions,
        condition::SCHEDULED,
        "True",
        reason::BOUND,
        &format!("bound to node {node_name}"),
        vm.metadata.generation,
        now,
    );
    // The binding is written once, with the object's resourceVersion as precondition.
    let mut bound = vm.clone();
    bound.status = Some(status);
    match api.replace_status(&vm.name_any(), &PostParams::default(), &bound).await {
        Ok(_) => {
            publish(
                ctx,
                vm,
                EventType::Normal,
                "Scheduled",
                "Bind",
                format!("bound to node {node_name}"),
            )
            .await;
            // Our own write comes back through the watch and triggers the next step.
            Ok(Action::await_change())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // Someone else changed the object first: forget the reservation and look again.
            ctx.ledger.release(uid);
            Ok(Action::requeue(Duration::from_millis(200)))
        }
        Err(e) => {
            ctx.ledger.release(uid);
            Err(e.into())
        }
    }
}

fn sync_endpoint(ctx: &Context, node: &str) {
    match ctx
        .nodes
        .get(&ObjectRef::new(node))
        .and_then(|n| n.status.as_ref().and_then(|s| s.endpoint.clone()))
    {
        Some(ep) => match u16::try_from(ep.port) {
            Ok(port) => ctx.node_client.endpoints().set(node, &ep.address, port),
            Err(_) => ctx.node_client.endpoints().remove(node),
        },
        None => ctx.node_client.endpoints().remove(node),
    }
}

async fn converge(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    uid: &str,
    node: &str,
    machine: &str,
) -> Result<Action, Error> {
    let now = Timestamp::now();
    let generation = vm.metadata.generation;
    let mut status = vm.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let node_obj = ctx.nodes.get(&ObjectRef::new(node));
    let health = plan::node_health(vm, node_obj.as_deref(), now, &ctx.placement);
    let unhealthy = match health {
        NodeHealth::Healthy => None,
        NodeHealth::Missing => Some((
            "Unknown",
            reason::NODE_MISSING,
            format!("node {node} has no SmolVMNode; the binding stays"),
        )),
        NodeHealth::Replaced { bound, reported } => Some((
            "False",
            reason::NODE_REPLACED,
            format!(
                "node {node} was replaced (bound to UID {bound}, it now reports {reported}); the machine is not adopted and the binding stays; delete and recreate the SmolVM"
            ),
        )),
        NodeHealth::Unreachable { why } => Some((
            "Unknown",
            reason::NODE_UNREACHABLE,
            format!("node {node} is unreachable: {why}"),
        )),
    };
    if let Some((cond_status, why, message)) = unhealthy {
        // As for a Pod on a NotReady node, the endpoint of a VM whose node cannot be vouched
        // for is not ready.
        if vm.spec.expose_service() {
            let address = node_obj
                .as_ref()
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.internal_ip.clone());
            if let Some((exposed, reason, message)) = expose(ctx, vm, node, address.as_deref(), false).await {
                plan::set_condition(
                    &mut status.conditions,
                    condition::SERVICE_EXPOSED,
                    exposed,
                    reason,
                    &message,
                    generation,
                    now,
                );
            }
        }
        return report_node_problem(api, vm, ctx, status, cond_status, why, message).await;
    }
    sync_endpoint(ctx, node);
    let observed = match timed(ctx, "GetMachine", ctx.node_client.get_machine(node, machine)).await {
        Ok(m) => m,
        Err(e) => return report_call_error(api, vm, ctx, status, node, RuntimeCall::Get, e).await,
    };
    let desired = match plan::machine_spec(vm) {
        Ok(d) => d,
        Err(message) => {
            status.phase = Some(Phase::Failed);
            plan::set_condition(
                &mut status.conditions,
                condition::READY,
                "False",
                "InvalidSpec",
                &message,
                generation,
                now,
            );
            write_status(api, vm, &status).await?;
            return Ok(Action::await_change());
        }
    };
    let mut recreating = false;
    if observed.is_none() {
        match plan::missing_machine(vm) {
            plan::MissingMachine::Create => {}
            plan::MissingMachine::Recreate => recreating = true,
            plan::MissingMachine::Lost => {
                let problem = Problem {
                    phase: Phase::Failed,
                    condition: condition::READY,
                    status: "False",
                    reason: reason::MACHINE_LOST,
                    message: format!(
                        "machine {machine} existed on node {node} and is gone (its state there was removed); it is not re-created empty. To start over with a fresh, empty machine, annotate the SmolVM with {RECREATE_LOST_MACHINE_ANNOTATION}=true"
                    ),
                    event_reason: reason::MACHINE_LOST,
                    action: "Observe",
                    note: None,
                };
                return report(api, vm, ctx, status, problem).await;
            }
        }
    }
    // A restart request (`kubectl smolvm restart`): a running machine is stopped here and started
    // by the steps below, whatever the restart policy; the request is dropped after the status
    // write, once.
    let restart = plan::restart(vm, observed.as_ref());
    let goal = match restart {
        plan::Restart::StopThenRun | plan::Restart::Run => plan::RunGoal::Run,
        plan::Restart::None | plan::Restart::Skip | plan::Restart::Done => plan::run_goal(vm, observed.as_ref()),
    };
    if matches!(restart, plan::Restart::StopThenRun | plan::Restart::Run)
        && let Some(requested) = plan::restart_request(vm)
    {
        // Recorded before acting: if dropping the annotation fails later, the next pass sees
        // the request handled and does not restart the machine a second time.
        let patch = json!({ "status": { "restartHandled": requested } });
        api.patch_status(&vm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        status.restart_handled = Some(requested.to_string());
    }
    let running = goal.running();
    // Drive the machine through as many steps as it needs in this pass (create, then start; or
    // resize, then start), so a new VM costs one status write rather than one per step.
    let mut machine_now = observed;
    let mut done: Vec<MachineAction> = Vec::new();
    if restart == plan::Restart::StopThenRun {
        match timed(ctx, "StopMachine", ctx.node_client.stop_machine(node, machine)).await {
            Ok(m) => {
                machine_now = Some(m);
                done.push(MachineAction::Stop);
            }
            Err(e) => return report_call_error(api, vm, ctx, status, node, RuntimeCall::Stop, e).await,
        }
    }
    let mut settled = false;
    // Warning events to publish after the status write: (reason, action, note).
    let mut warnings: Vec<(&str, &str, String)> = Vec::new();
    for _ in 0..MAX_STEPS_PER_PASS {
        let action = plan::machine_action(&desired, running, machine_now.as_ref());
        let result = match &action {
            MachineAction::Create(spec) => match workload_env(ctx, vm).await {
                Ok(env) => {
                    let mut spec = spec.clone();
                    spec.workload.env = env;
                    timed(
                        ctx,
                        "CreateMachine",
                        ctx.node_client.create_machine(node, machine, &spec),
                    )
                    .await
                    .map_err(Failure::Call)
                }
                Err(failure) => Err(failure),
            },
            MachineAction::EnsureRunning => match registry_auth(ctx, vm).await {
                Ok(auth) => timed(
                    ctx,
                    "EnsureMachineRunning",
                    ctx.node_client.ensure_running(node, machine, auth.as_ref()),
                )
                .await
                .map_err(Failure::Call),
                Err(failure) => Err(failure),
            },
            MachineAction::Stop => timed(ctx, "StopMachine", ctx.node_client.stop_machine(node, machine))
                .await
                .map_err(Failure::Call),
            MachineAction::Resize(spec) => {
                // A resize up needs room on the node: its allocatable minus what the other VMs
                // bound there hold. Without it the node is not asked; the VM reports why.
                let current = machine_now.as_ref().map(plan::machine_resources).unwrap_or_default();
                let allocatable = node_obj
                    .as_ref()
                    .and_then(|n| n.status.as_ref())
                    .and_then(|s| s.allocatable);
                let others = ctx.ledger.used_by_others(node, uid);
                if let Some(short) =
                    plan::resize_shortfall(spec, &vm.spec.request(), &current, allocatable.as_ref(), &others)
                {
                    let message = short.message(node);
                    let changed = plan::set_condition(
                        &mut status.conditions,
                        condition::RESIZE_PENDING,
                        "True",
                        reason::INSUFFICIENT_CAPACITY,
                        &message,
                        generation,
                        now,
                    );
                    if changed {
                        warnings.push((reason::INSUFFICIENT_CAPACITY, "Resize", message));
                    }
                    settled = true;
                    break;
                }
                timed(
                    ctx,
                    "ResizeMachine",
                    ctx.node_client.resize_machine(node, machine, spec),
                )
                .await
                .map_err(Failure::Call)
            }
            MachineAction::ResizePending(message) => {
                plan::set_condition(
                    &mut status.conditions,
                    condition::RESIZE_PENDING,
                    "True",
                    reason::RESIZE_NOT_APPLIED,
                    message,
                    generation,
                    now,
                );
                settled = true;
                break;
            }
            MachineAction::None => {
                plan::clear_condition(&mut status.conditions, condition::RESIZE_PENDING);
                settled = true;
                break;
            }
        };
        match result {
            Ok(m) => {
                machine_now = Some(m);
                done.push(action);
            }
            Err(Failure::Call(e)) if e.code() == Some(&ErrorCode::ResizeRequiresRunning) => {
                plan::set_condition(
                    &mut status.conditions,
                    condition::RESIZE_PENDING,
                    "True",
                    reason::RESIZE_NOT_APPLIED,
                    e.message(),
                    generation,
                    now,
                );
                settled = true;
                break;
            }
            Err(failure) => {
                publish_steps(ctx, vm, node, machine, &done, goal).await;
                if recreating && done.iter().any(|a| matches!(a, MachineAction::Create(_))) {
                    forget_recreate_request(api, vm, ctx, node, machine).await?;
                }
                // The restart was carried out as far as it goes: a start that failed is retried
                // like any other, whatever the restart policy.
                if restart != plan::Restart::None {
                    forget_restart_request(api, vm, ctx, restart, node, machine).await?;
                }
                // The machine exists (it may have been created in this pass): record that, so
                // its later loss is told as MachineLost rather than re-created empty.
                if let Some(m) = machine_now.as_ref() {
                    status.effective = Some(effective_of(m));
                }
                return match failure {
                    Failure::Call(e) => {
                        report_call_error(api, vm, ctx, status, node, RuntimeCall::of(&action), e).await
                    }
                    Failure::Config { reason: why, message } => {
                        let problem = Problem {
                            phase: if machine_now.is_some() {
                                Phase::Stopped
                            } else {
                                Phase::Scheduled
                            },
                            condition: condition::READY,
                            status: "False",
                            reason: why,
                            message,
                            event_reason: why,
                            action: if matches!(action, MachineAction::Create(_)) {
                                "Create"
                            } else {
                                "Start"
                            },
                            note: None,
                        };
                        report(api, vm, ctx, status, problem).await?;
                        // Retried with a backoff (1 s doubling to 30 s), so the VM proceeds soon
                        // after the missing object appears or the permission is granted.
                        Ok(Action::requeue(plan::unsettled_delay(ctx.unsettled.bump(uid))))
                    }
                    Failure::Kube(e) => Err(Error::Kube(e)),
                };
            }
        }
    }
    let steps_reported = publish_steps(ctx, vm, node, machine, &done, goal).await;
    apply_machine(
        &mut status,
        machine_now.as_ref(),
        goal,
        vm.spec.restart_policy(),
        generation,
        now,
    );
    plan::clear_condition(&mut status.conditions, condition::DELETION_BLOCKED);
    let address = node_obj
        .as_ref()
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.internal_ip.clone());
    status.node_address = address.clone();
    status.ports = expose::ports_summary(vm.spec.ports());
    let machine_runs = machine_now.as_ref().is_some_and(|m| m.state == MachineState::Running);
    let exposed = expose(ctx, vm, node, address.as_deref(), machine_runs).await;
    let exposure_changed = match &exposed {
        Some((cond_status, why, message)) => plan::set_condition(
            &mut status.conditions,
            condition::SERVICE_EXPOSED,
            cond_status,
            why,
            message,
            generation,
            now,
        ),
        None => plan::clear_condition(&mut status.conditions, condition::SERVICE_EXPOSED),
    };
    if exposure_changed && let Some(("False", why, message)) = &exposed {
        warnings.push((why, "Expose", message.clone()));
    }
    write_status(api, vm, &status).await?;
    if recreating && done.iter().any(|a| matches!(a, MachineAction::Create(_))) {
        forget_recreate_request(api, vm, ctx, node, machine).await?;
    }
    if restart != plan::Restart::None {
        forget_restart_request(api, vm, ctx, restart, node, machine).await?;
    }
    // A transition no action of this pass told (a crash, a recovery, a start that finished).
    if let Some(t) = plan::transition_event(vm.status.as_ref(), &status, steps_reported) {
        let type_ = if t.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish(ctx, vm, type_, &t.reason, "Observe", t.note).await;
    }
    for (why, verb, note) in warnings {
        publish(ctx, vm, EventType::Warning, why, verb, note).await;
    }
    Ok(if settled {
        ctx.unsettled.reset(uid);
        Action::requeue(ctx.timing.resync)
    } else {
        // Still on its way (e.g. a runtime that does not report Running yet): look again with a
        // backoff, so a runtime that never settles is not hammered.
        Action::requeue(plan::unsettled_delay(ctx.unsettled.bump(uid)))
    })
}

/// Keeps the Service and EndpointSlice of a SmolVM with `network.exposeService` in line
/// ([`expose::desired`]) and returns its ServiceExposed condition (status, reason, message), or
/// `None` when the SmolVM does not ask for one (an owned Service left from an earlier
/// `exposeService: true` is then deleted). Failures become the condition, so the machine's own
/// status is still written.
async fn expose(
    ctx: &Context,
    vm: &SmolVM,
    node: &str,
    address: Option<&str>,
    running: bool,
) -> Option<(&'static str, &'static str, String)> {
    let name = vm.name_any();
    let namespace = vm.namespace().unwrap_or_default();
    if !vm.spec.expose_service() {
        if let Err(e) = unexpose(ctx, vm).await {
            return Some((
                "False",
                reason::SERVICE_ERROR,
                format!("removing Service {namespace}/{name}: {}", describe_kube_error(&e)),
            ));
        }
        return None;
    }
    let exposure = match expose::desired(vm, node, address, running) {
        Ok(exposure) => exposure,
        Err(expose::NotExposed::NoPorts) => {
            return Some((
                "False",
                reason::NO_PORTS,
                "network.exposeService is true but the SmolVM publishes no port: no Service is made".into(),
            ));
        }
        Err(expose::NotExposed::InvalidName) => {
            return Some((
                "False",
                reason::INVALID_SERVICE_NAME,
                format!(
                    "a Service cannot be named {name:?}: Service names are DNS-1035 labels (at most 63 characters: lowercase letters, digits and '-', starting with a letter)"
                ),
            ));
        }
        Err(expose::NotExposed::Incomplete) => return None,
    };
    match apply_exposure(ctx, vm, &namespace, &exposure).await {
        Ok(Some(foreign)) => Some((
            "False",
            reason::SERVICE_NOT_OWNED,
            format!("{foreign}; it is left untouched: delete or rename it, or set network.exposeService to false"),
        )),
        Err(e) => Some((
            "False",
            reason::SERVICE_ERROR,
            format!("writing Service {namespace}/{name}: {}", describe_kube_error(&e)),
        )),
        Ok(None) => Some(expose::condition(&exposure, &name, node, address, running)),
    }
}

/// Applies the Service and its EndpointSlice unless they already match. `Ok(Some(who))` when one
/// of that name exists and this SmolVM does not own it (nothing is written then).
async fn apply_exposure(
    ctx: &Context,
    vm: &SmolVM,
    namespace: &str,
    exposure: &expose::Exposure,
) -> Result<Option<String>, kube::Error> {
    let name = vm.name_any();
    let params = PatchParams::apply(FIELD_MANAGER_CONTROLLER).force();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), namespace);
    let have_service = services.get_opt(&name).await?;
    if let Some(have) = &have_service
        && let Err(who) = expose::check_owner(&have.metadata, vm)
    {
        return Ok(Some(format!("Service {namespace}/{name} {who}")));
    }
    let have_slice = slices.get_opt(&name).await?;
    if let Some(have) = &have_slice
        && let Err(who) = expose::check_owner(&have.metadata, vm)
    {
        return Ok(Some(format!("EndpointSlice {namespace}/{name} {who}")));
    }
    if !have_service
        .as_ref()
        .is_some_and(|have| expose::service_matches(have, &exposure.service))
    {
        services.patch(&name, &params, &Patch::Apply(&exposure.service)).await?;
    }
    match &have_slice {
        Some(have) if expose::slice_matches(have, &exposure.slice) => {}
        Some(have) if have.address_type != exposure.slice.address_type => {
            // addressType is immutable: the node's address changed family.
            ignore_missing(slices.delete(&name, &Default::default()).await.map(drop))?;
            slices.patch(&name, &params, &Patch::Apply(&exposure.slice)).await?;
        }
        _ => {
            slices.patch(&name, &params, &Patch::Apply(&exposure.slice)).await?;
        }
    }
    Ok(None)
}

/// Deletes the Service and EndpointSlice this SmolVM owns, if it ever had them (its status has
/// the ServiceExposed condition); one it does not own is left.
async fn unexpose(ctx: &Context, vm: &SmolVM) -> Result<(), kube::Error> {
    let had = vm
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == condition::SERVICE_EXPOSED));
    if !had {
        return Ok(());
    }
    let name = vm.name_any();
    let namespace = vm.namespace().unwrap_or_default();
    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(have) = slices.get_opt(&name).await?
        && expose::check_owner(&have.metadata, vm).is_ok()
    {
        ignore_missing(slices.delete(&name, &Default::default()).await.map(drop))?;
    }
    if let Some(have) = services.get_opt(&name).await?
        && expose::check_owner(&have.metadata, vm).is_ok()
    {
        ignore_missing(services.delete(&name, &Default::default()).await.map(drop))?;
    }
    Ok(())
}

/// A delete whose object is already gone succeeded.
fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), kube::Error> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        other => other,
    }
}

/// An API server error for a condition: a refusal names the permission.
fn describe_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.code == 403 => format!(
            "the controller lacks a permission ({}); check its ClusterRole (deploy/base/controller/rbac.yaml)",
            status.message
        ),
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Why a step of [`converge`] did not happen.
enum Failure {
    /// The node API call failed.
    Call(CallError),
    /// The workload's configuration could not be read: a condition reason and its message.
    Config { reason: &'static str, message: String },
    /// Reading the configuration failed at the API server (other than 403 and 404).
    Kube(kube::Error),
}

/// The workload's environment, resolved from the Secrets and ConfigMaps it refers to in the
/// SmolVM's namespace, read now (at create) and passed on; never logged.
async fn workload_env(ctx: &Context, vm: &SmolVM) -> Result<Vec<smolvm_api::nodeapi::EnvVar>, Failure> {
    let refs = crate::workload::env_references(vm);
    let namespace = vm.namespace().unwrap_or_default();
    let fetched = if refs.is_empty() {
        Default::default()
    } else {
        crate::fetch::env_sources(&ctx.client, &namespace, &refs)
            .await
            .map_err(Failure::Kube)?
    };
    crate::workload::resolve_env(vm, &fetched).map_err(|e| Failure::Config {
        reason: e.reason(),
        message: e.message(&namespace),
    })
}

/// The credential for the SmolVM's image from its `imagePullSecrets`, read on every start. A
/// pull secret that is missing or unreadable is skipped with a warning in the log (naming it,
/// never its contents), as the kubelet does; one the controller may not read stops the start.
async fn registry_auth(ctx: &Context, vm: &SmolVM) -> Result<Option<smolvm_api::nodeapi::RegistryAuth>, Failure> {
    let names: Vec<String> = vm
        .spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let namespace = vm.namespace().unwrap_or_default();
    let read = crate::fetch::pull_secrets(&ctx.client, &namespace, &names)
        .await
        .map_err(Failure::Kube)?;
    if !read.forbidden.is_empty() {
        return Err(Failure::Config {
            reason: reason::SECRET_ACCESS_DENIED,
            message: format!(
                "the controller may not get secrets in namespace {namespace} (imagePullSecrets {}); grant it with the deploy/components/workload-secrets component: the machine is not started until this is fixed (retried)",
                read.forbidden.join(", ")
            ),
        });
    }
    for name in &read.skipped {
        tracing::warn!(secret = %name, namespace = %namespace, "image pull secret is missing or holds no .dockerconfigjson; skipped");
    }
    let (auth, problems) = crate::workload::registry_auth(&vm.spec.image, &read.configs);
    for crate::workload::PullSecretProblem::Unreadable(name) in problems {
        tracing::warn!(secret = %name, namespace = %namespace, "image pull secret is not a readable docker configuration; skipped");
    }
    Ok(auth)
}

/// After a fresh machine replaced a lost one: removes the recreate-lost-machine annotation (so a
/// later loss is reported again rather than silently re-created) and tells it in an event.
async fn forget_recreate_request(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    node: &str,
    machine: &str,
) -> Result<(), Error> {
    let pointer = format!(
        "/metadata/annotations/{}",
        RECREATE_LOST_MACHINE_ANNOTATION.replace('/', "~1")
    );
    let patch = json!([
        {"op": "test", "path": pointer, "value": smolvm_api::constants::RECREATE_LOST_MACHINE_VALUE},
        {"op": "remove", "path": pointer}
    ]);
    api.patch(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(patch)?),
    )
    .await?;
    publish(
        ctx,
        vm,
        EventType::Normal,
        "Recreated",
        "Create",
        format!(
            "created a fresh, empty machine {machine} on node {node} in place of the lost one, as {RECREATE_LOST_MACHINE_ANNOTATION} asked"
        ),
    )
    .await;
    Ok(())
}

/// Drops an honoured (or skipped) restart request, only if it still holds the value acted on: a
/// newer request made meanwhile stays for the next pass.
async fn forget_restart_request(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    restart: plan::Restart,
    node: &str,
    machine: &str,
) -> Result<(), Error> {
    let Some(requested) = plan::restart_request(vm) else {
        return Ok(());
    };
    let pointer = format!(
        "/metadata/annotations/{}",
        smolvm_api::constants::RESTART_ANNOTATION.replace('/', "~1")
    );
    let patch = json!([
        {"op": "test", "path": pointer, "value": requested},
        {"op": "remove", "path": pointer}
    ]);
    match api
        .patch(
            &vm.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(patch)?),
        )
        .await
    {
        Ok(_) => {}
        // The test failed: a newer request replaced it; the next pass honours that one.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let (reason, note) = if restart == plan::Restart::Skip && requested.len() > plan::MAX_RESTART_REQUEST {
        (
            "RestartSkipped",
            format!(
                "restart request not done: its value is longer than {} characters (kubectl smolvm restart writes the time of the request)",
                plan::MAX_RESTART_REQUEST
            ),
        )
    } else if restart == plan::Restart::Skip {
        (
            "RestartSkipped",
            format!("restart requested at {requested} not done: spec.running is false, nothing runs to restart"),
        )
    } else {
        (
            "Restarted",
            format!("machine {machine} on node {node} restarted as requested at {requested}"),
        )
    };
    publish(ctx, vm, EventType::Normal, reason, "Restart", note).await;
    Ok(())
}

/// What a failed DeleteMachine means for the finalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteFailure {
    /// The agent cannot be reached and the force-delete annotation is set: remove the finalizer.
    GiveUp,
    /// The agent cannot be reached: deletion waits (the annotation would let it go).
    AgentUnreachable,
    /// The agent answers but its runtime is unavailable: retried, never forced, since the
    /// machine may still run.
    RuntimeUnavailable,
    /// The node answered with a failure: retried.
    Failed,
}

/// Classifies a failed DeleteMachine. Only an agent that cannot be reached at all (connection
/// refused, TLS failure, timeout) lets the force-delete annotation give up the local state.
pub fn delete_failure(force: bool, e: &CallError) -> DeleteFailure {
    match (e.agent_unreachable(), e.is_unreachable()) {
        (true, _) if force => DeleteFailure::GiveUp,
        (true, _) => DeleteFailure::AgentUnreachable,
        (false, true) => DeleteFailure::RuntimeUnavailable,
        (false, false) => DeleteFailure::Failed,
    }
}

/// The node API call a converge step makes, for the reason of its failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeCall {
    /// GetMachine.
    Get,
    /// CreateMachine.
    Create,
    /// EnsureMachineRunning.
    Start,
    /// StopMachine.
    Stop,
    /// ResizeMachine.
    Resize,
}

impl RuntimeCall {
    fn of(action: &MachineAction) -> Self {
        match action {
            MachineAction::Create(_) => RuntimeCall::Create,
            MachineAction::EnsureRunning => RuntimeCall::Start,
            MachineAction::Stop => RuntimeCall::Stop,
            MachineAction::Resize(_) => RuntimeCall::Resize,
            MachineAction::ResizePending(_) | MachineAction::None => RuntimeCall::Get,
        }
    }
}

/// Phase and Ready reason after a node API call failed with an error other than unreachable:
/// the reason names the operation that failed (or smolvm's start failure, whatever the call).
/// `None` keeps the phase: a failed stop or resize leaves the machine as it was.
pub fn call_failure(call: RuntimeCall, code: Option<&ErrorCode>) -> (Option<Phase>, &'static str) {
    if code == Some(&ErrorCode::StartFailed) {
        return (Some(Phase::Failed), reason::START_FAILED);
    }
    if code == Some(&ErrorCode::HostPortInUse) && matches!(call, RuntimeCall::Create | RuntimeCall::Start) {
        return (Some(Phase::Failed), reason::HOST_PORT_IN_USE);
    }
    // The agent's own refusals, whatever admission did: an excluded host port (create), a
    // private image started without credentials (start).
    if code == Some(&ErrorCode::HostPortExcluded) {
        return (Some(Phase::Failed), reason::HOST_PORT_EXCLUDED);
    }
    if code == Some(&ErrorCode::ImagePullCredentialsRequired) {
        return (Some(Phase::Failed), reason::IMAGE_PULL_CREDENTIALS_REQUIRED);
    }
    match call {
        RuntimeCall::Get => (Some(Phase::Unknown), "RuntimeError"),
        RuntimeCall::Create => (Some(Phase::Failed), reason::CREATE_FAILED),
        RuntimeCall::Start => (Some(Phase::Failed), reason::START_FAILED),
        RuntimeCall::Stop => (None, reason::STOP_FAILED),
        RuntimeCall::Resize => (None, reason::RESIZE_FAILED),
    }
}

/// Machine steps one converge pass may take (create, start, and one spare).
const MAX_STEPS_PER_PASS: usize = 3;

/// Publishes [`plan::step_events`] as Normal events; returns whether it published any.
async fn publish_steps(
    ctx: &Context,
    vm: &SmolVM,
    node: &str,
    machine: &str,
    done: &[MachineAction],
    goal: RunGoal,
) -> bool {
    let events = plan::step_events(done, goal, machine, node);
    for e in &events {
        publish(ctx, vm, EventType::Normal, e.reason, e.action, e.note.clone()).await;
    }
    !events.is_empty()
}

/// Phase, Ready and effective resources from the machine the node reports.
fn apply_machine(
    status: &mut SmolVMStatus,
    machine: Option<&MachineStatus>,
    goal: RunGoal,
    policy: RestartPolicy,
    generation: Option<i64>,
    now: Timestamp,
) {
    let Some(m) = machine else {
        status.phase = Some(Phase::Creating);
        plan::set_condition(
            &mut status.conditions,
            condition::READY,
            "False",
            reason::CREATING,
            "the machine is being created",
            generation,
            now,
        );
        return;
    };
    let running = goal.running();
    let (phase, ready, why, message) = match (&m.state, running) {
        (MachineState::Running, true) => (Phase::Running, "True", reason::RUNNING, "the machine runs".to_string()),
        (state, false) if goal == RunGoal::Exited && *state != MachineState::Running => {
            (Phase::Stopped, "False", reason::EXITED, plan::exited_message(policy))
        }
        (MachineState::Running, false) => (
            Phase::Running,
            "False",
            reason::STOPPED,
            "the machine is being stopped".into(),
        ),
        (MachineState::Failed, _) => (
            Phase::Failed,
            "False",
            "MachineFailed",
            format!("smolvm reports the machine as {}", m.runtime_state),
        ),
        (_, false) => (
            Phase::Stopped,
            "True",
            reason::STOPPED,
            "the machine is stopped as asked".into(),
        ),
        (_, true) => (
            Phase::Creating,
            "False",
            reason::CREATING,
            "the machine is starting".into(),
        ),
    };
    status.phase = Some(phase);
    plan::set_condition(
        &mut status.conditions,
        condition::READY,
        ready,
        why,
        &message,
        generation,
        now,
    );
    status.effective = Some(effective_of(m));
}

/// The resources and ports a machine has, as the status shows them.
fn effective_of(m: &MachineStatus) -> smolvm_api::EffectiveResources {
    smolvm_api::EffectiveResources {
        cpus: i32::try_from(m.cpus).unwrap_or(i32::MAX),
        memory_mib: i64::try_from(m.memory_mib).unwrap_or(i64::MAX),
        storage_gib: m.storage_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        overlay_gib: m.overlay_gib.and_then(|s| i64::try_from(s).ok()).unwrap_or_default(),
        ports: m
            .network
            .ports
            .iter()
            .map(|p| smolvm_api::Port {
                host_port: i32::from(p.host_port),
                guest_port: i32::from(p.guest_port),
                protocol: p.protocol,
            })
            .collect(),
    }
}

async fn report_node_problem(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    status: SmolVMStatus,
    cond_status: &str,
    why: &str,
    message: String,
) -> Result<Action, Error> {
    let problem = Problem {
        phase: Phase::Unknown,
        condition: condition::READY,
        status: cond_status,
        reason: why,
        message,
        event_reason: why,
        action: "Observe",
        note: None,
    };
    report(api, vm, ctx, status, problem).await
}

async fn report_call_error(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    status: SmolVMStatus,
    node: &str,
    call: RuntimeCall,
    e: CallError,
) -> Result<Action, Error> {
    if e.is_unreachable() {
        let message = format!("node {node} is unreachable: {}", e.message());
        return report_node_problem(api, vm, ctx, status, "Unknown", reason::NODE_UNREACHABLE, message).await;
    }
    let (phase, why) = call_failure(call, e.code());
    let problem = Problem {
        phase: phase.or(status.phase).unwrap_or(Phase::Unknown),
        condition: condition::READY,
        status: "False",
        reason: why,
        message: e.message().to_string(),
        event_reason: why,
        action: "Converge",
        note: Some(format!("node {node}: {}", e.message())),
    };
    report(api, vm, ctx, status, problem).await
}

/// A problem to show on a SmolVM: its phase, one condition, and a Warning event when the
/// condition changed.
struct Problem<'a> {
    phase: Phase,
    condition: &'a str,
    status: &'a str,
    reason: &'a str,
    message: String,
    event_reason: &'a str,
    action: &'a str,
    /// Event note, when it should differ from the condition message.
    note: Option<String>,
}

async fn report(
    api: &Api<SmolVM>,
    vm: &SmolVM,
    ctx: &Context,
    mut status: SmolVMStatus,
    p: Problem<'_>,
) -> Result<Action, Error> {
    status.phase = Some(p.phase);
    let changed = plan::set_condition(
        &mut status.conditions,
        p.condition,
        p.status,
        p.reason,
        &p.message,
        vm.metadata.generation,
        Timestamp::now(),
    );
    write_status(api, vm, &status).await?;
    if changed {
        publish(
            ctx,
            vm,
            EventType::Warning,
            p.event_reason,
            p.action,
            p.note.unwrap_or(p.message),
        )
        .await;
    }
    Ok(Action::requeue(ctx.timing.retry))
}

async fn write_status(api: &Api<SmolVM>, vm: &SmolVM, status: &SmolVMStatus) -> Result<(), Error> {
    if vm.status.as_ref() == Some(status) {
        return Ok(());
    }
    let patch = json!({ "status": status });
    api.patch_status(&vm.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// What the controller does after a failed reconcile.
pub fn error_policy(vm: Arc<SmolVM>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(
        namespace = %vm.namespace().unwrap_or_default(),
        name = %vm.name_any(),
        reason = error.reason(),
        error = %error,
        "reconcile failed"
    );
    match error.reason() {
        "Conflict" => Action::requeue(Duration::from_millis(500)),
        _ => Action::requeue(ctx.timing.retry),
    }
}
