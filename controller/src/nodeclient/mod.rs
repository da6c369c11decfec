//! The controller's client of the runtime agents' node API: mTLS with the controller's client
//! certificate, the bearer token, pooled connections per node, and per-call timeouts.
//!
//! Every path and method comes from the contract's table ([`Operation`]); requests are
//! addressed to `https://<node><path>`. The connector resolves `<node>` to the
//! endpoint its SmolVMNode advertises, and verifies that the server's certificate names that
//! node's runtime (`<node>.runtime.vm.smolvm.dev`, see [`smolvm_certs::runtime_server_name`]), so
//! a stale or hijacked endpoint can never impersonate another node.

mod connector;
mod error;
mod exchange;
mod tls;
mod token;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::{Serialize, de::DeserializeOwned};
use smolvm_api::nodeapi::{
    BranchRequest, DeleteResponse, ErrorCode, HealthResponse, IdentityResponse, JsonCall, LeaseRequest, MachineSpec,
    MachineStatus, Operation, PoolSpec, PoolStatus, RegistryAuth, ResizeSpec, StartRequest, SuspendRequest,
    VolumeMounts, calls,
};

pub use connector::{Endpoints, NodeConnector, NodeStream};
pub use error::CallError;
pub use tls::{ClientCert, ClientTls, client_tls};
pub use token::{BearerToken, PREVIOUS_TOKEN_GRACE};

/// Largest response body read from a node.
const MAX_BODY: usize = 4 << 20;

/// Settings of a [`NodeClient`].
#[derive(Clone)]
pub struct ClientSettings {
    /// rustls config trusting only the runtime CAs, with the controller's client certificate.
    pub tls: Arc<ClientTls>,
    /// Bearer token of the `smolvm-runtime-auth` Secret.
    pub token: Arc<BearerToken>,
    /// Timeout of connect and handshake.
    pub connect_timeout: Duration,
    /// Timeout of quick calls (get, health, delete, stop, resize, create).
    pub call_timeout: Duration,
    /// Timeout of ensure-running, stop, suspend, resume and delete (a start can take minutes).
    pub start_timeout: Duration,
}

impl ClientSettings {
    /// The controller's settings: 5 s to connect, 30 s for quick calls, 5 minutes for a start.
    pub fn standard(tls: Arc<ClientTls>, token: Arc<BearerToken>) -> Self {
        ClientSettings {
            tls,
            token,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(300),
        }
    }
}

/// A request body streamed to a node as it is produced (a file's content on its way from a
/// user of the access API), never held whole.
pub type StreamedBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The node API client.
#[derive(Clone)]
pub struct NodeClient {
    client: Client<NodeConnector, Full<Bytes>>,
    /// The same connector, for requests whose body streams ([`NodeClient::open_streaming`]).
    streaming: Client<NodeConnector, StreamedBody>,
    connector: NodeConnector,
    endpoints: Endpoints,
    settings: ClientSettings,
}

impl NodeClient {
    /// A client with pooled connections per node.
    pub fn new(settings: ClientSettings, endpoints: Endpoints) -> Self {
        let connector = NodeConnector {
            endpoints: endpoints.clone(),
            tls: settings.tls.clone(),
            connect_timeout: settings.connect_timeout,
        };
        let builder = {
            let mut builder = Client::builder(TokioExecutor::new());
            builder
                .pool_idle_timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(4);
            builder
        };
        let client = builder.build(connector.clone());
        let streaming = builder.build(connector.clone());
        NodeClient {
            client,
            streaming,
            connector,
            endpoints,
            settings,
        }
    }

    /// The endpoints this client resolves nodes with.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// [`Operation::Health`].
    pub async fn health(&self, node: &str) -> Result<HealthResponse, CallError> {
        self.json::<calls::Health>(node, "", None, self.settings.call_timeout)
            .await
    }

    /// [`Operation::Identity`].
    pub async fn identity(&self, node: &str) -> Result<IdentityResponse, CallError> {
        self.json::<calls::Identity>(node, "", None, self.settings.call_timeout)
            .await
    }

    /// [`Operation::GetMachine`]; `Ok(None)` when the node has no such machine.
    pub async fn get_machine(&self, node: &str, name: &str) -> Result<Option<MachineStatus>, CallError> {
        match self
            .json::<calls::GetMachine>(node, name, None, self.settings.call_timeout)
            .await
        {
            Ok(m) => Ok(Some(m)),
            Err(CallError::Api {
                code: ErrorCode::MachineNotFound,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Operation::CreateMachine`] (idempotent create).
    pub async fn create_machine(&self, node: &str, name: &str, spec: &MachineSpec) -> Result<MachineStatus, CallError> {
        self.json::<calls::CreateMachine>(node, name, Some(spec), self.settings.call_timeout)
            .await
    }

    /// [`Operation::EnsureMachineRunning`], with the registry credential for this start, and
    /// started as a branch source when `branchable` (SPEC 2.6; a running machine keeps how it
    /// was started). The body is sent only when it carries either.
    pub async fn ensure_running(
        &self,
        node: &str,
        name: &str,
        registry_auth: Option<&RegistryAuth>,
        branchable: bool,
    ) -> Result<MachineStatus, CallError> {
        let body = (registry_auth.is_some() || branchable).then(|| StartRequest {
            registry_auth: registry_auth.cloned(),
            branchable,
        });
        self.json::<calls::EnsureMachineRunning>(node, name, body.as_ref(), self.settings.start_timeout)
            .await
    }

    /// [`Operation::StopMachine`].
    pub async fn stop_machine(&self, node: &str, name: &str) -> Result<MachineStatus, CallError> {
        self.json::<calls::StopMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResizeMachine`].
    pub async fn resize_machine(&self, node: &str, name: &str, spec: &ResizeSpec) -> Result<MachineStatus, CallError> {
        self.json::<calls::ResizeMachine>(node, name, Some(spec), self.settings.call_timeout)
            .await
    }

    /// [`Operation::SuspendMachine`] (saving memory takes seconds per GiB: the start's time limit).
    /// An idle suspension says so (`request`, SPEC 2.7); a user's sends no body.
    pub async fn suspend_machine(
        &self,
        node: &str,
        name: &str,
        request: &SuspendRequest,
    ) -> Result<MachineStatus, CallError> {
        let body = (request != &SuspendRequest::default()).then_some(request);
        self.json::<calls::SuspendMachine>(node, name, body, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResumeMachine`].
    pub async fn resume_machine(&self, node: &str, name: &str) -> Result<MachineStatus, CallError> {
        self.json::<calls::ResumeMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::BindVolumes`]: the stopped machine's mounts pointed at the volumes of the
    /// holder Pod `mounts` names (a new holder, after its holder was evicted).
    pub async fn bind_volumes(
        &self,
        node: &str,
        name: &str,
        mounts: &VolumeMounts,
    ) -> Result<MachineStatus, CallError> {
        self.json::<calls::BindVolumes>(node, name, Some(mounts), self.settings.call_timeout)
            .await
    }

    /// [`Operation::DeleteMachine`].
    pub async fn delete_machine(&self, node: &str, name: &str) -> Result<DeleteResponse, CallError> {
        self.json::<calls::DeleteMachine>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// [`Operation::ApplyPool`]: the node keeps the pool `name` (its source machine may take a
    /// start's time to boot).
    pub async fn apply_pool(&self, node: &str, name: &str, spec: &PoolSpec) -> Result<PoolStatus, CallError> {
        self.json::<calls::ApplyPool>(node, name, Some(spec), self.settings.start_timeout)
            .await
    }

    /// [`Operation::LeaseMachine`]: the machine served from a ready slot of the node pool.
    pub async fn lease_machine(
        &self,
        node: &str,
        name: &str,
        request: &LeaseRequest,
    ) -> Result<MachineStatus, CallError> {
        self.json::<calls::LeaseMachine>(node, name, Some(request), self.settings.start_timeout)
            .await
    }

    /// [`Operation::BranchMachine`]: the machine made a copy-on-write branch of the running
    /// branch source `request.source` on the node.
    pub async fn branch_machine(
        &self,
        node: &str,
        name: &str,
        request: &BranchRequest,
    ) -> Result<MachineStatus, CallError> {
        self.json::<calls::BranchMachine>(node, name, Some(request), self.settings.start_timeout)
            .await
    }

    /// [`Operation::ResizePool`]: the node pool `name` keeps `slots` ready slots from now on (those
    /// beyond are deleted before the answer).
    pub async fn resize_pool(&self, node: &str, name: &str, slots: u32) -> Result<PoolStatus, CallError> {
        let body = smolvm_api::nodeapi::PoolResize { slots };
        self.json::<calls::ResizePool>(node, name, Some(&body), self.settings.call_timeout)
            .await
    }

    /// [`Operation::DeletePool`].
    pub async fn delete_pool(&self, node: &str, name: &str) -> Result<DeleteResponse, CallError> {
        self.json::<calls::DeletePool>(node, name, None, self.settings.start_timeout)
            .await
    }

    /// One JSON call of the contract's table on `machine` (ignored by node-wide calls): its
    /// method and path from the table, its body and answer typed by [`JsonCall`].
    async fn json<C: JsonCall>(
        &self,
        node: &str,
        machine: &str,
        body: Option<&C::Request>,
        timeout: Duration,
    ) -> Result<C::Response, CallError> {
        let operation = C::OPERATION;
        self.call(node, operation, &operation.path(machine), body, timeout)
            .await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        node: &str,
        operation: Operation,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<T, CallError> {
        let bytes = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b).map_err(|e| CallError::protocol(node, e.to_string()))?),
            None => Bytes::new(),
        };
        let response = self
            .open(node, operation, path, "application/json", bytes, timeout)
            .await?;
        let status = response.status();
        let collected = tokio::time::timeout(timeout, Limited::new(response.into_body(), MAX_BODY).collect())
            .await
            .map_err(|_| CallError::unreachable(node, format!("body not received within {timeout:?}")))?
            .map_err(|e| CallError::protocol(node, format!("reading the body: {e}")))?
            .to_bytes();
        serde_json::from_slice(&collected).map_err(|e| CallError::protocol(node, format!("{status}: {e}")))
    }
}
