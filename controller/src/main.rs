//! `smolvm-controller`: places SmolVMs on nodes, binds them, drives the node runtimes, and keeps
//! the finalizers honest. One replica leads at a time (a coordination.k8s.io Lease).

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, WatchStreamExt, events::Reporter, reflector, watcher},
};
use smolvm_api::policy::Policy;
use smolvm_api::{SmolVM, SmolVMNode, constants::FIELD_MANAGER_CONTROLLER};
use smolvm_controller::{
    cli::{Flags, RENAMED},
    lease::{self, LeaseConfig},
    metrics::Metrics,
    nodeclient::{self, ClientSettings, Endpoints, NodeClient},
    pki::{
        SignerError, runtime_auth,
        runtime_ca::{self, RuntimeTrust},
    },
    placement::{self, Ledger, Request},
    vm::{self, Context, Timing},
    tasks,
};
use tokio::sync::watch;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (flags, deprecated) = smolvm_kit::cli::parse::<Flags>(RENAMED);
    smolvm_kit::log::init(flags.log_format);
    smolvm_kit::cli::warn_deprecated(&deprecated);
    let client = Client::try_default().await.context("connecting to the API server")?;

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (leader_tx, mut leader_rx) = watch::channel(false);
    let lease_task = tokio::spawn(lease::run(
        client.clone(),
        LeaseConfig {
            namespace: flags.namespace.clone(),
            name: "smolvm-controller".into(),
            identity: flags.identity.clone(),
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        },
        leader_tx,
        shutdown_rx.clone(),
    ));
    let metrics = Arc::new(Metrics::default());
    let vm_store_slot: tasks::ops::VmStoreSlot = Arc::default();
    let ops_listener = tokio::net::TcpListener::bind(flags.ops_address)
        .await
        .with_context(|| format!("binding the ops address {}", flags.ops_address))?;
    let probe = tasks::ops::Probe {
        leader: leader_rx.clone(),
        metrics: metrics.clone(),
        vms: vm_store_slot.clone(),
    };
    tokio::spawn(async move {
        let router = smolvm_kit::ops::router(Arc::new(probe));
        if let Err(error) = smolvm_kit::ops::serve(ops_listener, router, std::future::pending()).await {
            tracing::error!(%error, "ops server failed");
        }
    });
    // The access API, on every replica (the standby too): it waits for the leader's runtime CA.
    if let Some(access) = flags.access()? {
        let listener = std::net::TcpListener::bind(access.address)
            .with_context(|| format!("binding the access API address {}", access.address))?;
        let mut stop = shutdown_rx.clone();
        let client = client.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(error) = smolvm_controller::access::run(client, access, listener, metrics, stopped).await {
                tracing::error!(error = format!("{error:#}"), "access API stopped");
            }
        });
    }
    // SIGTERM (a Pod being stopped) or Ctrl-C: stop reconciling and release the Lease, so a
    // standby replica takes over at once instead of waiting for the Lease to expire.
    tokio::spawn(async move {
        smolvm_kit::shutdown::signal().await;
        let _ = shutdown_tx.send(true);
    });

    // Wait for leadership before acting.
    while !*leader_rx.borrow() {
        if *shutdown_rx.borrow() {
            return Ok(());
        }
        let mut s = shutdown_rx.clone();
        tokio::select! {
            _ = leader_rx.changed() => {}
            _ = s.changed() => {}
        }
    }
    tracing::info!(identity = %flags.identity, "leading; starting the controller");

    // The runtime CA (created once, shared by every replica; rotated with an overlap, see
    // runtime_ca), the controller's client certificate for the node API (re-issued at 2/3 of its
    // life), and the CSR signer.
    let events = smolvm_controller::events::EventSink::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER_CONTROLLER.into(),
            instance: Some(flags.identity.clone()),
        },
    );
    let cas = loop {
        match runtime_ca::ensure_runtime_ca(client.clone(), &flags.namespace, flags.allow_new_runtime_ca).await {
            Ok(cas) => break cas,
            Err(error @ SignerError::CaMissing(_)) => {
                // Held, not crash-looping: every node hears why, and restoring the Secret is
                // enough to go on.
                tracing::error!(%error, reason = error.reason(), "runtime CA");
                runtime_ca::report_missing_ca(&client, &events, &error).await;
                let mut stop = shutdown_rx.clone();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                    _ = stop.changed() => return Ok(()),
                }
            }
            Err(error) => return Err(anyhow::Error::new(error).context("runtime CA")),
        }
    };
    let trust = RuntimeTrust::new(cas)?;
    tokio::spawn(trust.clone().keep_client_cert_fresh());
    let policy: tasks::policy::PolicySlot = Arc::new(std::sync::RwLock::new(match &flags.policy {
        Some(path) => Policy::from_file(path)?,
        None => Policy::default(),
    }));
    if let Some(path) = flags.policy.clone() {
        tasks::policy::spawn_reload(path, policy.clone());
    }
    tokio::spawn(tasks::csr::run(client.clone(), trust.clone(), policy));
    let token = nodeclient::BearerToken::new(node_api_token(&client, &flags).await?);
    if flags.token_file.is_none() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &flags.namespace);
        tokio::spawn(runtime_auth::refresh(
            secrets,
            flags.runtime_auth_secret.clone(),
            token.clone(),
        ));
    }
    let node_client = NodeClient::new(
        ClientSettings::standard(trust.client_tls(), token),
        Endpoints::default(),
    );

    let vms: Api<SmolVM> = Api::all(client.clone());
    let nodes_api: Api<SmolVMNode> = Api::all(client.clone());
    let ledger = Ledger::new();
    for vm in vms
        .list(&Default::default())
        .await
        .context("listing SmolVMs to seed the ledger")?
    {
        if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
            ledger.observe_bound(&uid, node, &Request::of(&vm));
        }
    }
    let heartbeat_timeout = k8s_openapi::jiff::SignedDuration::try_from(flags.heartbeat_timeout)
        .context("--heartbeat-timeout is out of range")?;
    let (node_store, node_writer) = reflector::store::<SmolVMNode>();
    // The SmolVM cache (filled once the controller runs, below); the node watch reads it to know
    // which VMs a node change concerns.
    let (vm_store, vm_writer) = reflector::store::<SmolVM>();
    // One node watch feeds both the placement cache and the wake-ups of the VMs a node change
    // concerns: only changes placement or health depends on (not the periodic heartbeat), plus
    // heartbeats going stale or coming back, found by a periodic look at the cache.
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded::<reflector::ObjectRef<SmolVM>>();
    // Heartbeats are judged by this controller's clock, from when it saw each one change.
    let liveness = placement::Config::observed(
        heartbeat_timeout,
        Arc::new(smolvm_controller::heartbeat::HeartbeatClock::new()),
    );
    let node_events = watcher(nodes_api, watcher::Config::default())
        .default_backoff()
        .reflect(node_writer);
    tokio::spawn(tasks::nodes::watch(
        node_events,
        node_store.clone(),
        vm_store.clone(),
        wake_tx,
        liveness.clone(),
        Some(events.clone()),
    ));
    anyhow::ensure!(
        smolvm_controller::store_ready(&node_store).await,
        "the SmolVMNode cache stopped before it was filled"
    );
    tokio::spawn(runtime_ca::run_rotation(
        runtime_ca::RotationContext {
            client: client.clone(),
            namespace: flags.namespace.clone(),
            trust: trust.clone(),
            nodes: node_store.clone(),
            liveness: liveness.clone(),
            events: events.clone(),
        },
        flags.runtime_ca_check_interval.max(Duration::from_secs(1)),
    ));
    let (owned, services, slices) = vm::owned_watches(&client);
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes: node_store.clone(),
        owned,
        ledger,
        node_client,
        recorder: events,
        timing: Timing {
            heartbeat_timeout,
            resync: flags.resync_interval,
            retry: Duration::from_secs(30),
        },
        placement: liveness,
        metrics: metrics.clone(),
        unsettled: Default::default(),
    });
    // The SmolVM cache drops managedFields as objects arrive: the controller never reads them,
    // and as JSON trees they were most of each cached object's memory. (A status update built
    // from a cached object then carries no managedFields, which leaves the server's untouched.)
    // A VM that vanishes is never reconciled again (the controller finds nothing in the cache to
    // hand over), so its reservation is released here, from the delete event; a periodic
    // comparison with the cache catches deletes the watch missed while disconnected.
    let on_delete = ctx.clone();
    let vm_events = watcher(vms, watcher::Config::default())
        .default_backoff()
        .modify(|vm| vm.metadata.managed_fields = None)
        .reflect(vm_writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(vm)) => {
                if let Some(uid) = vm.uid() {
                    on_delete.forget(&uid);
                }
            }
            // Placement counts every bound VM the watch has seen, at once: a binding written by
            // a previous leader (or any writer) after the seeding list is booked before this
            // replica places anything else on that node, not only once its reconcile runs.
            Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) => {
                if let (Some(uid), Some(node)) = (vm.uid(), vm.bound_node()) {
                    on_delete.ledger.observe_bound(&uid, node, &Request::of(vm));
                }
            }
            _ => {}
        })
        .touched_objects();
    tokio::spawn(tasks::ledger::prune(
        ctx.clone(),
        vm_store.clone(),
        Duration::from_secs(60),
    ));
    tokio::spawn(smolvm_controller::orphans::run(
        ctx.clone(),
        vm_store.clone(),
        Duration::from_secs(10),
        flags.orphan_grace,
    ));
    let controller = Controller::for_stream(vm_events, vm_store.clone());
    *vm_store_slot.write().unwrap_or_else(|e| e.into_inner()) = Some(vm_store.clone());
    let mut stop = shutdown_rx.clone();
    let running = controller
        // The VMs that node changes concern (see tasks::nodes).
        .reconcile_on(wake_rx)
        // A Service or EndpointSlice of a SmolVM changed or went: its pass puts it back.
        .owns_stream(services)
        .owns_stream(slices)
        // SIGTERM: let in-flight reconciles finish while the lease is still ours.
        .graceful_shutdown_on(async move {
            let _ = stop.changed().await;
        })
        .run(vm::reconcile, vm::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        });
    // Lost the lease: cancel every in-flight reconcile and node call now, and leave; returning
    // ends the signer, the ledger and the watch tasks with the process, before a standby can
    // take over. The pod restarts as a standby.
    let stopped = lease::while_leading(running, leader_rx.clone()).await;
    if stopped.is_none() && !*shutdown_rx.borrow() {
        tracing::warn!(identity = %flags.identity, "lost the lease: in-flight reconciles, the CSR signer and the ledger tasks are cancelled");
        return Ok(());
    }
    // Stopping (SIGTERM): the election steps down first, which cancels what was still running
    // above, then releases the Lease. Returning before that write lands would leave the standby
    // waiting for the Lease to expire instead of taking over at once.
    tracing::info!("controller stopped; releasing the lease");
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
    Ok(())
}

/// The node API token: from --token-file when given, else from the Secret (created when absent).
async fn node_api_token(client: &Client, flags: &Flags) -> anyhow::Result<String> {
    if let Some(path) = &flags.token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the node API token {}", path.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            anyhow::bail!("the node API token file {} is empty", path.display());
        }
        return Ok(token);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &flags.namespace);
    runtime_auth::ensure_token(&secrets, &flags.runtime_auth_secret)
        .await
        .with_context(|| {
            format!(
                "node API token Secret {}/{}",
                flags.namespace, flags.runtime_auth_secret
            )
        })
}
