//! Act: the I/O of a pass. It gathers what [`super::decide`] needs ([`super::observe`]), makes
//! the node calls decide asks for, and hands the outcome to [`super::status`], which writes it.
//!
//! The finalizer is added and removed here rather than through `kube::runtime::finalizer`,
//! whose cleanup can keep the finalizer only by returning an error. A deletion held because the
//! node is unreachable is not a failed reconcile: it is `DeletionBlocked=True` with a requeue,
//! and as an error it would be counted in the failure metrics, backed off by the error policy,
//! and logged as one on every pass until the node returns or the force annotation is set.

use std::{sync::Arc, time::Duration};

use k8s_openapi::jiff::Timestamp;
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use smolvm_api::{
    SmolVM,
    constants::reason,
    nodeapi::{BranchRequest, EnvVar, LeaseRequest, MachineSpec, MachineStatus, Operation, RegistryAuth},
};

use super::decide::{self, Call, Decision, DeleteFailure, Failure, Progress};
use super::events;
use super::metadata::{add_finalizer, remove_finalizer};
use super::observe::{self, Around, Prior};
use super::rules::{self, Step};
use super::status;
use super::volumes::{self, kube::Look};
use super::{Context, Error};
use crate::placement::Request;

/// One pass over a SmolVM: [`rules::next_step`] decides which, this carries it out.
pub async fn pass(vm: Arc<SmolVM>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = vm.namespace().ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<SmolVM> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = vm.uid().ok_or(Error::MissingField("metadata.uid"))?;
    if ctx.superseded.is_stale(&uid, vm.resource_version().as_deref()) {
        // A version this controller already wrote over: the watch brings the newer one.
        return Ok(Action::await_change());
    }
    let pass = Pass {
        api: &api,
        ctx: &ctx,
        uid: &uid,
    };
    match rules::next_step(&vm) {
        Step::Forget => {
            ctx.forget(&uid);
            Ok(Action::await_change())
        }
        Step::AddFinalizer => {
            add_finalizer(&api, &vm).await?;
            Ok(Action::await_change())
        }
        Step::RemoveFinalizer => {
            // Never placed: its claims made before placement may go with it.
            release_volumes(&ctx, &vm).await?;
            remove_finalizer(&api, &vm).await?;
            ctx.forget(&uid);
            Ok(Action::await_change())
        }
        Step::DeleteMachine { node, machine, force } => delete(pass, &vm, &node, &machine, force).await,
        Step::Place => place(pass, &vm).await,
        Step::Converge { node, machine } => {
            ctx.ledger.observe_vm(&uid, &node, &vm);
            converge(pass, &vm, &node, &machine, Prior::default()).await
        }
    }
}

/// What each step of a pass works with besides the SmolVM: its API, the context and its UID.
#[derive(Clone, Copy)]
struct Pass<'a> {
    api: &'a Api<SmolVM>,
    ctx: &'a Context,
    uid: &'a str,
}

async fn delete(pass: Pass<'_>, vm: &SmolVM, node: &str, machine: &str, force: bool) -> Result<Action, Error> {
    let Pass { api, ctx, uid } = pass;
    // A branch source goes after its branches (SPEC 2.6).
    let branches = match vm.spec.branchable() {
        true => super::branched::live_branches(ctx, vm),
        false => Vec::new(),
    };
    if !branches.is_empty() {
        let (delete, outcome) = decide::branches_first(vm, node, &branches, Timestamp::now());
        if delete {
            super::branched::delete_branches(ctx, vm, &branches).await?;
        }
        return status::report(ctx, api, vm, uid, outcome).await;
    }
    sync_endpoint(ctx, node);
    let result = timed(
        ctx,
        Operation::DeleteMachine,
        ctx.node_client.delete_machine(node, machine),
    )
    .await;
    let gone = match &result {
        Ok(outcome) => Ok(outcome.missing),
        Err(e) if decide::delete_failure(force, e) == DeleteFailure::GiveUp => Err(e),
        Err(e) => {
            let failure = decide::delete_failure(force, e);
            let outcome = decide::deletion_blocked(vm, node, machine, failure, e, Timestamp::now());
            return status::report(ctx, api, vm, uid, outcome).await;
        }
    };
    let (service, slice) = observe::owned_objects(ctx, vm, false).await?;
    let writes = decide::removal(vm, service.as_deref(), slice.as_deref());
    status::write_exposure(ctx, vm, &writes).await?;
    release_volumes(ctx, vm).await?;
    remove_finalizer(api, vm).await?;
    ctx.forget(uid);
    events::publish(ctx, vm, &decide::deleted(node, machine, gone)).await;
    Ok(Action::await_change())
}

/// What a deleted SmolVM's volumes leave, once its machine is gone: its holder Pod, then its
/// claims whose policy is `Delete` ([`volumes::on_delete`]).
async fn release_volumes(ctx: &Context, vm: &SmolVM) -> Result<(), Error> {
    let Some(seen) = volumes::kube::observe(ctx, vm, Look::Delete).await? else {
        return Ok(());
    };
    let writes = volumes::on_delete(vm, &seen);
    volumes::kube::write(ctx, vm, &writes).await.map_err(|(_, e)| e.into())
}

/// Before a SmolVM with volumes is placed: the claims made from its templates (or adopted),
/// and, unless a claim keeps it waiting, the restriction of where its data can be reached on
/// `request`. `Some(action)`: it waits, reported ([`decide::waiting_for_volumes`]).
async fn volume_prelude(pass: Pass<'_>, vm: &SmolVM, request: &mut Request) -> Result<Option<Action>, Error> {
    let Pass { api, ctx, uid } = pass;
    let Some(seen) = volumes::kube::observe(ctx, vm, Look::Placement).await? else {
        return Ok(None);
    };
    let prelude = volumes::before_placement(vm, &seen);
    let failed = volumes::kube::write(ctx, vm, &prelude.writes).await.err();
    let wait = match failed {
        Some((write, error)) => Some(write.failed(&super::describe_kube_error(&error))),
        None => prelude.wait,
    };
    if let Some((why, message)) = wait {
        let outcome = decide::waiting_for_volumes(vm, why, message, Timestamp::now());
        return status::report(ctx, api, vm, uid, outcome).await.map(Some);
    }
    request.volumes = prelude.reach;
    Ok(None)
}

async fn place(pass: Pass<'_>, vm: &SmolVM) -> Result<Action, Error> {
    let Pass { api, ctx, uid } = pass;
    // This VM was bound a moment ago and the cache has not caught up: binding again would only
    // meet a 409 (and drop the reservation the real binding holds). The watch brings the bound
    // object soon; look again then.
    if ctx.ledger.node_of(uid).is_some() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let mut request = Request::of(vm);
    if let Some(waits) = volume_prelude(pass, vm, &mut request).await? {
        return Ok(waits);
    }
    let now = Timestamp::now();
    // A branch goes on its source's node only (branches are node-local), once its source is
    // bound there.
    let source = super::branched::source_of(ctx, vm).await?;
    match source.node() {
        Ok(None) => {}
        Ok(Some(node)) => {
            request.pin = Some(node.to_string());
            request.source = vm.spec.source().map(str::to_string);
        }
        Err(why) => {
            let outcome = decide::branch_waits(vm, why.to_string(), now);
            return status::report(ctx, api, vm, uid, outcome).await;
        }
    }
    let pool_of = super::pooled::pool_of(ctx, vm).await?;
    let (node, warm) = match reserve(pass, vm, &request, &pool_of, now).await? {
        Ok(placed) => placed,
        Err(next) => return Ok(next),
    };
    let node_uid = ctx
        .nodes
        .get(&ObjectRef::new(&node))
        .and_then(|n| n.status.as_ref().and_then(|s| s.node_uid.clone()));
    let Some(node_uid) = node_uid else {
        ctx.ledger.release(uid);
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    // The binding is written once, with the object's resourceVersion as precondition.
    let mut bound = vm.clone();
    bound.status = Some(decide::bound(vm, &node, node_uid, now));
    let note = decide::Note::bound(format!("bound to node {node}"));
    let branch = source.is_branch();
    let prior = Prior {
        pool: Some(pool_of),
        source: Some(source),
    };
    // A warm claim's lease and a branch's branch are idempotent by name: their binding rides on
    // the pass's one status write.
    if warm || branch {
        return claim(pass, bound, &node, note, prior).await;
    }
    match status::write_binding(ctx, api, uid, (&node, Some(&note)), bound).await? {
        // The same pass goes on against the node it bound to, from the object the API server
        // answered with, rather than waiting for its own write to come back through the watch.
        Ok(bound) => {
            let machine = rules::machine_name(&bound).unwrap_or_default();
            converge(pass, &bound, &node, &machine, prior).await
        }
        Err(next) => Ok(next),
    }
}

/// Reserves a node for `request` in the ledger: `(node, warm)`, warm when it goes where its pool
/// has a ready slot that fits (that slot's room moves to it); else anywhere, beside the pools'
/// ready slots, or taking their room where it fits only without them (given back first).
/// `Err(action)`: it was not placed, reported (Unschedulable) or looked at again soon.
async fn reserve(
    pass: Pass<'_>,
    vm: &SmolVM,
    request: &Request,
    pool_of: &super::pooled::PoolOf,
    now: Timestamp,
) -> Result<Result<(String, bool), Action>, Error> {
    let Pass { api, ctx, uid } = pass;
    let nodes = ctx.nodes.state();
    let warm_nodes = match pool_of.node_pool() {
        Some(node_pool) => crate::placement::with_ready_slot(&nodes, node_pool),
        None => Vec::new(),
    };
    let warm_pool = pool_of.node_pool().map(|pool| (pool, warm_nodes.as_slice()));
    let reserved = ctx.ledger.reserve(
        uid,
        request,
        nodes.iter().map(|n| n.as_ref()),
        warm_pool,
        now,
        &ctx.placement,
    );
    match reserved {
        Ok(reserved) => {
            if !reserved.give_back.is_empty() && !give_back(ctx, vm, &reserved.node, &reserved.give_back).await {
                ctx.ledger.release(uid);
                return Ok(Err(Action::requeue(Duration::from_secs(2))));
            }
            Ok(Ok((reserved.node, reserved.warm)))
        }
        Err(unplaceable) => {
            ctx.metrics
                .placement_failures
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: unplaceable.reason.into(),
                })
                .inc();
            let outcome = decide::unschedulable(vm, unplaceable.message, now);
            status::report(ctx, api, vm, uid, outcome).await.map(Err)
        }
    }
}

/// The first pass of a warm claim, placed on `node` where its pool has a ready slot, or of a
/// branch, placed on its source's node. Its node call is one lease or one branch, keyed by the
/// SmolVM's UID (or, should the slot have gone meanwhile, the cold create `whenEmpty: Cold` asks
/// for, keyed by its machine name), so the binding rides on the pass's one status write
/// ([`status::report_binding`]): a claim costs one status write, not two. Should that write
/// fail, the next pass binds again: on the same node the call answers with the same machine; on
/// another, the one made here is an orphan (booked at once, collected after the grace period).
async fn claim(pass: Pass<'_>, bound: SmolVM, node: &str, note: decide::Note, prior: Prior) -> Result<Action, Error> {
    let Pass { api, ctx, uid } = pass;
    let machine = rules::machine_name(&bound).unwrap_or_default();
    let warm = prior.pool.as_ref().is_some_and(|p| p.node_pool().is_some());
    let acted = act(pass, &bound, node, &machine, prior).await;
    if warm {
        // A slot was taken (or the claim went cold): the pools' pass books and asks for the refill.
        ctx.pools_wake.poke();
    }
    match acted {
        Ok(Some(outcome)) => status::report_binding(ctx, api, uid, (node, &note), bound, outcome).await,
        // Nothing was bound: the reservation goes with the pass.
        Ok(None) => {
            ctx.ledger.release(uid);
            Ok(Action::requeue(ctx.timing.retry))
        }
        Err(e) => {
            ctx.ledger.release(uid);
            Err(e)
        }
    }
}

/// The ready slots `slots` given back on `node`, deleted there before the machine is created
/// or grows (ResizePool to what the ledger still books of each pool), each pool told by an event
/// naming the node, the slots and the SmolVM that took their room. `false` when a node call
/// failed: the pass looks again (the slots' room stays given back in the ledger, and the pools'
/// pass asks the node again).
async fn give_back(ctx: &Context, vm: &SmolVM, node: &str, slots: &[(String, u32)]) -> bool {
    sync_endpoint(ctx, node);
    let pools = ctx.pools.state();
    let taker = format!("SmolVM {}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
    for (pool, n) in slots {
        let left = ctx.ledger.slots(node, pool);
        let resized = timed(
            ctx,
            Operation::ResizePool,
            ctx.node_client.resize_pool(node, pool, left),
        )
        .await;
        match resized {
            Ok(_) => {
                if let Some(owner) = crate::placement::owner_of(pools.iter().map(AsRef::as_ref), pool) {
                    events::slots_given_back(ctx, owner, node, *n, &taker).await;
                }
            }
            Err(error) if error.code() == Some(&smolvm_api::nodeapi::ErrorCode::PoolNotFound) => {}
            Err(error) => {
                tracing::info!(%node, %pool, code = ?error.code(), message = error.message(), "giving ready slots back failed; placed again later");
                return false;
            }
        }
    }
    ctx.pools_wake.poke();
    true
}

/// Points the node client at the endpoint the node's SmolVMNode advertises.
pub fn sync_endpoint(ctx: &Context, node: &str) {
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

/// A pass over a bound SmolVM: observe, act until decided, then report.
/// `prior`: the SmolVM's pool and branch source, when the binding pass just read them.
async fn converge(pass: Pass<'_>, vm: &SmolVM, node: &str, machine: &str, prior: Prior) -> Result<Action, Error> {
    let Pass { api, ctx, uid } = pass;
    match act(pass, vm, node, machine, prior).await? {
        Some(outcome) => status::report(ctx, api, vm, uid, outcome).await,
        None => Ok(Action::requeue(ctx.timing.retry)),
    }
}

/// Observes a SmolVM on its node, then decides and acts until decide has nothing more to call
/// (at most [`decide::MAX_STEPS_PER_PASS`] machine steps and a read); `None` when decide asked
/// for more calls than that.
async fn act(
    pass: Pass<'_>,
    vm: &SmolVM,
    node: &str,
    machine: &str,
    prior: Prior,
) -> Result<Option<decide::Outcome>, Error> {
    let Pass { api, ctx, uid } = pass;
    let now = Timestamp::now();
    let around = Around::read(ctx, vm, node, prior).await?;
    let mut observed = around.observed(ctx, vm, (node, machine), uid, now);
    let mut progress = Progress::default();
    // A read and the machine steps, each at most once, plus the restart's stop: the bound keeps
    // a decision that would loop from calling the node forever.
    for _ in 0..decide::MAX_STEPS_PER_PASS + 3 {
        let (call, record_first, expose_first) = match decide::converge(&observed, &progress) {
            Decision::Report(outcome) => {
                remember_start(ctx, vm, uid, &progress);
                remember_use(ctx, machine, &progress, now);
                return Ok(Some(*outcome));
            }
            Decision::Act {
                call,
                record_first,
                expose_first,
            } => (call, record_first, expose_first),
        };
        if call != Call::Get && progress.exposed.is_none() {
            // A failure here is decided again, and reported, at the end of the pass.
            match status::write_exposure(ctx, vm, &expose_first).await {
                Ok(()) => progress.exposed = Some(expose_first),
                Err(error) => tracing::debug!(%error, "Service or EndpointSlice write before the machine calls failed"),
            }
        }
        if let Some(requested) = record_first {
            // Recorded before acting: if dropping the annotation fails later, the next pass sees
            // the request handled and does not restart the machine a second time.
            // Applied with the rest of the status as the cache holds it: an apply owns the
            // whole status, so this one must carry it all.
            let mut status = vm.status.clone().unwrap_or_default();
            status.restart_handled = Some(requested);
            status::apply_status(ctx, api, vm, uid, &status).await?;
        }
        if call == Call::Get {
            sync_endpoint(ctx, node);
        }
        if call == Call::Resume && !may_resume(ctx, vm, (node, uid), &progress, &mut observed).await {
            continue;
        }
        // A resume or a resize takes room that ready slots may hold: they are deleted first
        // (SPEC 6.3: nothing starts where it does not fit). Should that fail, the machine does
        // not grow in this pass.
        if matches!(call, Call::Resume | Call::Resize(_))
            && let Some(allocatable) = observed.room.allocatable
        {
            let taken = ctx.ledger.make_room(node, &allocatable);
            if !taken.is_empty() && !give_back(ctx, vm, node, &taken).await {
                return Ok(None);
            }
        }
        let started = std::time::Instant::now();
        let waking = call == Call::Resume && rules::idle_suspended(progress.machine.as_ref());
        let result = node_call(ctx, vm, node, machine, &call).await?;
        progress.took = started.elapsed();
        if waking && result.as_ref().is_ok_and(Option::is_some) {
            let asked = ctx.use_seen.wake_waited(node, machine).unwrap_or(progress.took);
            ctx.metrics.woke(asked.max(progress.took));
        }
        progress.record(call, result);
    }
    tracing::error!(
        node,
        machine,
        "a pass asked for more node calls than it may make; looking again later"
    );
    Ok(None)
}

/// Records a start or resume the pass made: the machine is quiet from now (SPEC 2.7).
fn remember_use(ctx: &Context, machine: &str, progress: &Progress, now: Timestamp) {
    if progress.started() {
        ctx.use_seen.started(machine, now);
    }
}

/// Whether the resume decide asked for may go: a wake is charged to the namespace's quota, and
/// the room is claimed in the ledger. When not, `observed` says why (the quota's refusal, or
/// what the ledger holds now), and deciding again waits, saying so.
async fn may_resume(
    ctx: &Context,
    vm: &SmolVM,
    (node, uid): (&str, &str),
    progress: &Progress,
    observed: &mut decide::Observed<'_>,
) -> bool {
    if rules::idle_suspended(progress.machine.as_ref())
        && let Some(refused) = charge_wake(ctx, vm).await
    {
        observed.quota_refused = Some(refused);
        return false;
    }
    if ctx
        .ledger
        .claim_resume(uid, observed.room.allocatable.as_ref())
        .is_err()
    {
        // Another VM took the room since this pass looked.
        observed.room.others = ctx.ledger.used_by_others(node, uid);
        return false;
    }
    true
}

/// Charges a wake (the resume of a VM the controller suspended for idleness) to its namespace's
/// quotas (SPEC 6.3: no user's write did): `None` when charged (or nothing is to be), else why
/// not, for the ResumePending condition.
async fn charge_wake(ctx: &Context, vm: &SmolVM) -> Option<String> {
    let charging = ctx.quotas.as_ref()?;
    let request = vm.spec.request();
    let amount = smolvm_api::NodeResources {
        cpus: request.cpus,
        memory_mib: request.memory_mib,
        storage_gib: 0,
    };
    let namespace = vm.namespace().unwrap_or_default();
    match charging.charge(&namespace, &amount).await {
        Ok(_) => None,
        Err(error) => {
            tracing::info!(vm = %vm.name_any(), %namespace, reason = error.reason(), %error, "the wake was not charged: it waits");
            Some(match error {
                smolvm_kit::quota::ChargeError::Exceeded(exceeded) => format!(
                    "waits to wake: the namespace's ResourceQuota has no room for its {} CPUs and {} MiB: {exceeded}",
                    amount.cpus, amount.memory_mib
                ),
                other => format!("waits to wake: its charge to the namespace's ResourceQuota failed: {other}"),
            })
        }
    }
}

/// Records a start that failed on the node (for the start backoff), or forgets the failures of
/// a machine that runs.
fn remember_start(ctx: &Context, vm: &SmolVM, uid: &str, progress: &Progress) {
    match &progress.failed {
        Some((Call::EnsureRunning, Failure::Call(e))) if !e.is_unreachable() => {
            ctx.start_failures
                .failed(uid, vm.metadata.generation, std::time::Instant::now());
        }
        _ if progress
            .machine
            .as_ref()
            .is_some_and(|m| m.state == smolvm_api::nodeapi::MachineState::Running) =>
        {
            ctx.start_failures.reset(uid);
        }
        _ => {}
    }
}

/// What a node call gave, for decide to judge.
type Called = Result<Option<MachineStatus>, Failure>;

/// Makes one node call, timed. `Err` only for an API server failure while reading the
/// workload's configuration; a call's own failure is the `Ok((Err(…), _))` decide judges.
async fn node_call(ctx: &Context, vm: &SmolVM, node: &str, machine: &str, call: &Call) -> Result<Called, Error> {
    let client = &ctx.node_client;
    let op = call.operation();
    let done = |r: Result<MachineStatus, crate::nodeclient::CallError>| r.map(Some).map_err(Failure::Call);
    let result = match call {
        Call::Get => timed(ctx, op, client.get_machine(node, machine))
            .await
            .map_err(Failure::Call),
        Call::Create(spec) => return create(ctx, vm, node, machine, spec).await,
        Call::Lease { node_pool, .. } => return lease(ctx, vm, node, machine, node_pool).await,
        Call::Branch { spec, source, .. } => return branch(ctx, vm, node, machine, (spec, source)).await,
        Call::EnsureRunning => match registry_auth(ctx, vm).await? {
            Ok(auth) => {
                let started = client.ensure_running(node, machine, auth.as_ref(), vm.spec.branchable());
                done(timed(ctx, op, started).await)
            }
            Err(failure) => Err(failure),
        },
        Call::Stop => done(timed(ctx, op, client.stop_machine(node, machine)).await),
        Call::Resize(spec) => done(timed(ctx, op, client.resize_machine(node, machine, spec)).await),
        Call::Suspend => {
            let request = rules::suspend_request(vm);
            done(timed(ctx, op, client.suspend_machine(node, machine, &request)).await)
        }
        Call::Resume => done(timed(ctx, op, client.resume_machine(node, machine)).await),
        Call::Discard => done(timed(ctx, op, client.stop_machine(node, machine)).await),
        Call::BindVolumes(mounts) => done(timed(ctx, op, client.bind_volumes(node, machine, mounts)).await),
    };
    Ok(result)
}

/// Creates `machine` cold from `spec`, with the workload's environment resolved now.
async fn create(ctx: &Context, vm: &SmolVM, node: &str, machine: &str, spec: &MachineSpec) -> Result<Called, Error> {
    let env = match workload_env(ctx, vm).await? {
        Ok(env) => env,
        Err(failure) => return Ok(Err(failure)),
    };
    let mut spec = spec.clone();
    spec.workload.env = env;
    let created = timed(
        ctx,
        Operation::CreateMachine,
        ctx.node_client.create_machine(node, machine, &spec),
    )
    .await;
    Ok(created.map(Some).map_err(Failure::Call))
}

/// Makes `machine` from a ready slot of node pool `node_pool` on `node`, keyed by the SmolVM's
/// UID, with the workload's environment resolved now (the lease carries it). A slot gone
/// meanwhile is decide's to judge (`NoReadySlot`: the create goes as `whenEmpty` says).
async fn lease(ctx: &Context, vm: &SmolVM, node: &str, machine: &str, node_pool: &str) -> Result<Called, Error> {
    let env = match workload_env(ctx, vm).await? {
        Ok(env) => env,
        Err(failure) => return Ok(Err(failure)),
    };
    let request = LeaseRequest {
        pool: node_pool.to_string(),
        env,
    };
    let leased = timed(
        ctx,
        Operation::LeaseMachine,
        ctx.node_client.lease_machine(node, machine, &request),
    )
    .await;
    Ok(leased.map(Some).map_err(Failure::Call))
}

/// Makes `machine` a copy-on-write branch of the running machine `source` on `node`, with the
/// branch's own environment resolved now and its own published ports (those of `spec`).
async fn branch(
    ctx: &Context,
    vm: &SmolVM,
    node: &str,
    machine: &str,
    (spec, source): (&MachineSpec, &str),
) -> Result<Called, Error> {
    let env = match workload_env(ctx, vm).await? {
        Ok(env) => env,
        Err(failure) => return Ok(Err(failure)),
    };
    let request = BranchRequest {
        source: source.to_string(),
        env,
        ports: spec.network.ports.clone(),
    };
    let branched = timed(
        ctx,
        Operation::BranchMachine,
        ctx.node_client.branch_machine(node, machine, &request),
    )
    .await;
    Ok(branched.map(Some).map_err(Failure::Call))
}

/// Times a node API call into the latency histogram.
async fn timed<T>(ctx: &Context, operation: Operation, call: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = call.await;
    ctx.metrics.runtime_call(operation.name(), start.elapsed());
    out
}

/// The workload's environment and the image's registry credential for `vm`, read now in its
/// namespace (a pool's source machine is made from a SmolVM the template describes); the
/// failure's words when one cannot be read.
pub async fn secrets_of(
    ctx: &Context,
    vm: &SmolVM,
) -> Result<Result<(Vec<EnvVar>, Option<RegistryAuth>), String>, Error> {
    let words = |failure: Failure| match failure {
        Failure::Config { message, .. } => message,
        Failure::Call(error) => error.message().to_string(),
    };
    let env = match workload_env(ctx, vm).await? {
        Ok(env) => env,
        Err(failure) => return Ok(Err(words(failure))),
    };
    Ok(registry_auth(ctx, vm).await?.map(|auth| (env, auth)).map_err(words))
}

/// The workload's environment, resolved from the Secrets and ConfigMaps it refers to in the
/// SmolVM's namespace, read now (at create) and passed on; never logged.
async fn workload_env(ctx: &Context, vm: &SmolVM) -> Result<Result<Vec<EnvVar>, Failure>, Error> {
    let refs = super::workload::env_references(vm);
    let namespace = vm.namespace().unwrap_or_default();
    let fetched = if refs.is_empty() {
        Default::default()
    } else {
        super::fetch::env_sources(&ctx.client, &namespace, &refs).await?
    };
    Ok(super::workload::resolve_env(vm, &fetched).map_err(|e| Failure::Config {
        reason: e.reason(),
        message: e.message(&namespace),
    }))
}

/// The credential for the SmolVM's image from its `imagePullSecrets`, read on every start. A
/// pull secret that is missing or unreadable is skipped with a warning in the log (naming it,
/// never its contents), as the kubelet does; one the controller may not read stops the start.
async fn registry_auth(ctx: &Context, vm: &SmolVM) -> Result<Result<Option<RegistryAuth>, Failure>, Error> {
    let names: Vec<String> = vm
        .spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|r| r.name.clone())
        .collect();
    if names.is_empty() {
        return Ok(Ok(None));
    }
    let namespace = vm.namespace().unwrap_or_default();
    let read = super::fetch::pull_secrets(&ctx.client, &namespace, &names).await?;
    if !read.forbidden.is_empty() {
        return Ok(Err(Failure::Config {
            reason: reason::SECRET_ACCESS_DENIED,
            message: format!(
                "the controller may not get secrets in namespace {namespace} (imagePullSecrets {}); grant it with the deploy/components/workload-secrets component: the machine is not started until this is fixed (retried)",
                read.forbidden.join(", ")
            ),
        }));
    }
    for name in &read.skipped {
        tracing::warn!(secret = %name, namespace = %namespace, "image pull secret is missing or holds no .dockerconfigjson; skipped");
    }
    let (auth, problems) = super::workload::registry_auth(&vm.spec.image, &read.configs);
    for super::workload::PullSecretProblem::Unreadable(name) in problems {
        tracing::warn!(secret = %name, namespace = %namespace, "image pull secret is not a readable docker configuration; skipped");
    }
    Ok(Ok(auth))
}
