//! `smolvm-controller`: places SmolVMs on nodes, binds them, drives the node runtimes, and keeps
//! the finalizers honest. One replica leads at a time (a coordination.k8s.io Lease).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        events::{Recorder, Reporter},
        reflector::{self, ObjectRef},
        watcher,
    },
};
use smolvm_api::{SmolVM, SmolVMNode, constants::FIELD_MANAGER_CONTROLLER};
use smolvm_controller::{
    lease::{self, LeaseConfig},
    nodeclient::{ClientSettings, Endpoints, NodeClient},
    placement::{self, Ledger, Request},
    reconcile::{self, Context, Timing},
};
use tokio::sync::watch;

/// Flags (each also read from the environment).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Flags {
    /// CA certificate that signed the runtime agents' serving certificates.
    #[arg(long, env = "RUNTIME_CA_FILE", default_value = "/etc/smolvm/runtime-ca/ca.crt")]
    runtime_ca: PathBuf,
    /// The controller's client certificate for the node API.
    #[arg(long, env = "CLIENT_CERT_FILE", default_value = "/etc/smolvm/client/tls.crt")]
    client_cert: PathBuf,
    /// The key of that certificate.
    #[arg(long, env = "CLIENT_KEY_FILE", default_value = "/etc/smolvm/client/tls.key")]
    client_key: PathBuf,
    /// The node API bearer token (the mounted smolvm-runtime-auth Secret).
    #[arg(long, env = "RUNTIME_TOKEN_FILE", default_value = "/etc/smolvm/runtime-auth/token")]
    token_file: PathBuf,
    /// Address of /healthz and /readyz.
    #[arg(long, env = "OPS_ADDR", default_value = "0.0.0.0:8080")]
    ops_addr: SocketAddr,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "smolvm-system")]
    namespace: String,
    /// This replica's identity.
    #[arg(long, env = "POD_NAME", default_value = "smolvm-controller")]
    identity: String,
    /// Heartbeat age after which a node counts as unreachable, in seconds.
    #[arg(long, default_value_t = 40)]
    heartbeat_timeout_secs: u64,
    /// Slow resync of runtime state, in seconds.
    #[arg(long, default_value_t = 300)]
    resync_secs: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let flags = Flags::parse();
    let client = Client::try_default().await.context("connecting to the API server")?;

    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let ca = read(&flags.runtime_ca)?;
    let cert = read(&flags.client_cert)?;
    let key = read(&flags.client_key)?;
    let token = read(&flags.token_file)?.trim().to_string();
    let tls = smolvm_certs::client_config(&ca, Some((&cert, &key)), &[b"h2", b"http/1.1"])
        .context("building the node API client TLS config")?;
    let node_client = NodeClient::new(
        ClientSettings {
            tls: Arc::new(tls),
            token: Arc::new(std::sync::RwLock::new(token)),
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(300),
        },
        Endpoints::default(),
    );

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (leader_tx, mut leader_rx) = watch::channel(false);
    tokio::spawn(lease::run(
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
    tokio::spawn(serve_ops(flags.ops_addr, leader_rx.clone()));
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
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
    let (node_store, node_writer) = reflector::store::<SmolVMNode>();
    // The node cache for placement; the controller's own node watch below triggers reconciles.
    let node_cache = watcher(nodes_api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(node_writer);
    tokio::spawn(node_cache.for_each(|_| async {}));
    node_store
        .wait_until_ready()
        .await
        .context("waiting for the SmolVMNode cache")?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        nodes: node_store.clone(),
        ledger,
        node_client,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER_CONTROLLER.into(),
                instance: Some(flags.identity.clone()),
            },
        ),
        timing: Timing {
            heartbeat_timeout: k8s_openapi::jiff::SignedDuration::from_secs(
                i64::try_from(flags.heartbeat_timeout_secs).unwrap_or(40),
            ),
            resync: Duration::from_secs(flags.resync_secs),
            retry: Duration::from_secs(30),
        },
        placement: placement::Config::default(),
    });
    let controller = Controller::new(vms, watcher::Config::default());
    let vm_store = controller.store();
    let mut lost = leader_rx.clone();
    let mut stop = shutdown_rx.clone();
    controller
        // A node change concerns the VMs bound there and the VMs still waiting for a node.
        .watches(nodes_api, watcher::Config::default(), move |node: SmolVMNode| {
            let name = node.name_any();
            vm_store
                .state()
                .into_iter()
                .filter(|vm| vm.bound_node().is_none_or(|b| b == name))
                .map(|vm| ObjectRef::from_obj(vm.as_ref()))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(async move {
            tokio::select! {
                _ = stop.changed() => {}
                _ = async { while lost.changed().await.is_ok() { if !*lost.borrow() { break; } } } => {}
            }
        })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
    tracing::info!("controller stopped");
    Ok(())
}

async fn serve_ops(addr: SocketAddr, leader: watch::Receiver<bool>) {
    use axum::{Router, http::StatusCode, routing::get};
    let app = Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/readyz",
        get(move || {
            let leader = *leader.borrow();
            async move {
                // Standby replicas are ready too: they serve health and wait for the lease.
                (StatusCode::OK, if leader { "ok (leader)" } else { "ok (standby)" })
            }
        }),
    );
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "ops server failed");
            }
        }
        Err(e) => tracing::error!(error = %e, %addr, "cannot bind the ops port"),
    }
}
