//! What the node API's handlers share: who the agent is ([`Identity`]), the runtime and the
//! records every handler reads ([`NodeApiState`]), and the per-machine locks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use super::answer::ApiError;
use super::auth::TokenAuth;
use super::failure::ApiFailure;
use super::mapping;
use super::types::ErrorCode;
use crate::metrics::Metrics;
use crate::vmm::Vmm;

/// What the agent knows about itself, shared with the supervisor and the reporter.
#[derive(Debug)]
pub struct Identity {
    /// Kubernetes Node name.
    pub node_name: String,
    /// Kubernetes Node UID once known.
    pub node_uid: RwLock<Option<String>>,
    /// smolvm's version once it answered.
    pub runtime_version: RwLock<Option<String>>,
}

impl Identity {
    /// An identity with only the node name known.
    pub fn new(node_name: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            node_name: node_name.into(),
            node_uid: RwLock::new(None),
            runtime_version: RwLock::new(None),
        })
    }

    /// Records the node UID.
    pub fn set_node_uid(&self, uid: Option<String>) {
        if let Ok(mut slot) = self.node_uid.write() {
            *slot = uid;
        }
    }

    /// Records smolvm's version.
    pub fn set_runtime_version(&self, version: Option<String>) {
        if let Ok(mut slot) = self.runtime_version.write() {
            *slot = version;
        }
    }

    pub(super) fn snapshot(&self) -> (Option<String>, Option<String>) {
        (
            self.node_uid.read().ok().and_then(|v| v.clone()),
            self.runtime_version.read().ok().and_then(|v| v.clone()),
        )
    }
}

/// Everything the handlers share.
#[derive(Clone)]
pub struct NodeApiState {
    /// The machine runtime.
    pub vmm: Arc<dyn Vmm>,
    /// Bearer token check.
    pub auth: Arc<TokenAuth>,
    /// Who we are.
    pub identity: Arc<Identity>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// smolvm's local image directory (to compare `local:` images).
    pub local_image_dir: Option<PathBuf>,
    /// Digests of each machine's workload (for create's idempotency); `None` keeps none.
    pub workload_records: Option<crate::workload_records::WorkloadRecords>,
    /// The forwards of published ports to the node's address; `None` where forwarding is off.
    pub forwarder: Option<Arc<crate::forward::Forwarder>>,
    /// Host ports no new machine may publish ([`crate::guards`]); `None` refuses none.
    pub host_ports: Option<Arc<crate::guards::HostPortGuard>>,
    /// Images started with credentials on this node ([`crate::images`]); `None` keeps none.
    pub images: Option<Arc<crate::images::ImageGuard>>,
    /// The exec and log-follow streams open now, capped per machine and per node.
    pub streams: Arc<super::stream::Streams>,
    /// The bytes of file uploads held at once ([`super::uploads::UploadBudget`]).
    pub uploads: super::uploads::UploadBudget,
    /// The machines this agent suspended ([`crate::suspensions`]); in memory unless
    /// [`NodeApiState::with_suspend_records`] gives files.
    pub suspensions: Arc<crate::suspensions::SuspendRecords>,
    /// The pools this agent keeps and the machines it served from them ([`crate::pools`]); in
    /// memory unless [`NodeApiState::with_pool_book`] gives files.
    pub pools: Arc<crate::pools::PoolBook>,
    /// The machines' volumes ([`crate::volumes`]); machines with volumes are refused unless
    /// [`NodeApiState::with_volumes`] gives them a place.
    pub volumes: Arc<crate::volumes::Volumes>,
    /// Each machine's use ([`crate::activity`]): exec, log-follow and copy sessions count.
    pub activity: Arc<crate::activity::Activity>,
    locks: MachineLocks,
}

impl NodeApiState {
    /// State for a runtime.
    pub fn new(
        vmm: Arc<dyn Vmm>,
        auth: Arc<TokenAuth>,
        identity: Arc<Identity>,
        metrics: Arc<Metrics>,
        local_image_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            vmm,
            auth,
            identity,
            metrics,
            local_image_dir,
            workload_records: None,
            forwarder: None,
            host_ports: None,
            images: None,
            streams: super::stream::Streams::new(super::stream::StreamLimits::default()),
            uploads: super::uploads::UploadBudget::new(super::uploads::DEFAULT_UPLOAD_BYTES),
            suspensions: Arc::new(crate::suspensions::SuspendRecords::in_memory()),
            pools: Arc::new(crate::pools::PoolBook::in_memory()),
            volumes: Arc::new(crate::volumes::Volumes::unconfigured()),
            activity: crate::activity::Activity::new(),
            locks: Arc::default(),
        }
    }

    /// Caps the exec and log-follow streams with `limits` instead of the defaults.
    pub fn with_stream_limits(mut self, limits: super::stream::StreamLimits) -> Self {
        self.streams = super::stream::Streams::new(limits);
        self
    }

    /// Holds at most `bytes` of file uploads at once instead of the default.
    pub fn with_upload_budget(mut self, bytes: usize) -> Self {
        self.uploads = super::uploads::UploadBudget::new(bytes);
        self
    }

    /// One more exec or log-follow stream on `machine`, or 429 `TooManyStreams`. The machine
    /// counts as in use while the stream is open.
    pub(super) fn open_stream(&self, machine: &str) -> Result<super::stream::StreamPermit, ApiError> {
        self.streams
            .open(machine)
            .map(|permit| permit.in_use(self.activity.session(machine)))
            .map_err(|cap| ApiError(super::stream::too_many_streams(machine, cap, &self.streams.limits())))
    }

    /// Records machines' use in `activity` (shared with the forwarder and the heartbeat).
    pub fn with_activity(mut self, activity: Arc<crate::activity::Activity>) -> Self {
        self.activity = activity;
        self
    }

    /// Forwards published ports with `forwarder` (and checks them on its address too).
    pub fn with_forwarder(mut self, forwarder: Arc<crate::forward::Forwarder>) -> Self {
        self.forwarder = Some(forwarder);
        self
    }

    /// HostPortInUse before smolvm is asked: every published port of `machine` must be free on
    /// 127.0.0.1 (where smolvm binds it) and on the forwarder's address, except where this
    /// machine's own forward holds it.
    pub(super) fn check_ports(&self, machine: &str, ports: &[crate::vmm::PortMapping]) -> Result<(), ApiError> {
        use crate::forward::{PortKey, port_free};
        for p in ports {
            let key = PortKey {
                port: p.host_port,
                protocol: p.protocol,
            };
            let loopback_taken = !port_free(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), key);
            let node_taken = self
                .forwarder
                .as_ref()
                .is_some_and(|f| !f.holds(key, machine) && !port_free(f.address(), key));
            if loopback_taken || node_taken {
                let protocol = p.protocol.as_str();
                return Err(ApiFailure::new(
                    ErrorCode::HostPortInUse,
                    format!("host port {key} is already in use on this node"),
                )
                .with_details(serde_json::json!({"hostPort": p.host_port, "protocol": protocol}))
                .into());
            }
        }
        Ok(())
    }

    /// Refuses a new machine on host ports the policy excludes ([`crate::guards`]).
    pub fn with_host_ports(mut self, guard: Arc<crate::guards::HostPortGuard>) -> Self {
        self.host_ports = Some(guard);
        self
    }

    /// Keeps the records of images started with credentials, and refuses a start of one
    /// without credentials ([`crate::images`]).
    pub fn with_images(mut self, guard: Arc<crate::images::ImageGuard>) -> Self {
        self.images = Some(guard);
        self
    }

    /// Tells the forwarder a machine changed.
    pub(super) fn poke_forwarder(&self) {
        if let Some(f) = &self.forwarder {
            f.poke();
        }
    }

    /// Keeps workload records (see [`crate::workload_records`]) in `dir`.
    pub fn with_workload_records(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workload_records = Some(crate::workload_records::WorkloadRecords::new(dir));
        self
    }

    /// Keeps the records of suspended machines in `records` (shared with the supervisor, which
    /// reports them).
    pub fn with_suspend_records(mut self, records: Arc<crate::suspensions::SuspendRecords>) -> Self {
        self.suspensions = records;
        self
    }

    /// Keeps the records of pools and served machines in `book` (the one the runtime's
    /// [`crate::pools::LeasedVmm`] maps names with).
    pub fn with_pool_book(mut self, book: Arc<crate::pools::PoolBook>) -> Self {
        self.pools = book;
        self
    }

    /// Finds, binds and records the machines' volumes with `volumes` (shared with the release
    /// hook).
    pub fn with_volumes(mut self, volumes: Arc<crate::volumes::Volumes>) -> Self {
        self.volumes = volumes;
        self
    }

    /// `machine` as the node API reports it: `Suspended` when this agent suspended it, with
    /// its pool and its volumes.
    pub(super) fn status_of(&self, machine: &crate::vmm::Machine) -> super::types::MachineStatus {
        let mut status = mapping::to_status_with(machine, self.suspensions.read(&machine.name).as_ref());
        status.pool = self.pools.leases.read(&machine.name).map(|record| record.pool);
        status.volumes = self.volumes.status(&machine.name);
        status
    }

    /// A private image is never started without credentials (SPEC 6, Tenants): an image that
    /// was started on this node with registry credentials needs this start's own, for its
    /// registry (`ImagePullCredentialsRequired`).
    pub(super) fn check_image(
        &self,
        name: &str,
        image: Option<&str>,
        auth: Option<&super::types::RegistryAuth>,
    ) -> Result<(), ApiError> {
        let (Some(guard), Some(image)) = (&self.images, image) else {
            return Ok(());
        };
        match guard.check(image, auth) {
            crate::images::PullDecision::CredentialsRequired { registry } => Err(ApiFailure::new(
                ErrorCode::ImagePullCredentialsRequired,
                format!(
                    "image {image} needs registry credentials on this node and this start has none for {registry}: give the SmolVM an imagePullSecret for {registry}"
                ),
            )
            .with_details(serde_json::json!({ "registry": registry }))
            .into()),
            crate::images::PullDecision::PullAgain => {
                tracing::info!(machine = %name, "the image was started on this node with other credentials: this start presents its own to the registry");
                Ok(())
            }
            crate::images::PullDecision::Start | crate::images::PullDecision::Verified => Ok(()),
        }
    }

    /// After a start with registry credentials: the image is recorded as private to them.
    pub(super) fn remember_image(&self, name: &str, image: Option<&str>, auth: Option<&super::types::RegistryAuth>) {
        if let (Some(guard), Some(image), Some(auth)) = (&self.images, image, auth)
            && let Err(error) = guard.remember(image, auth)
        {
            tracing::warn!(machine = %name, %error, "could not record the image's credential digest");
        }
    }

    /// Serializes mutating operations per machine name. The guard drops the name's entry when
    /// no other request holds or awaits it, so the table holds only names in use.
    pub(super) async fn lock(&self, name: &str) -> MachineGuard {
        let lock = match self.locks.lock() {
            Ok(mut locks) => locks.entry(name.to_string()).or_default().clone(),
            Err(poisoned) => poisoned.into_inner().entry(name.to_string()).or_default().clone(),
        };
        MachineGuard {
            guard: Some(lock.lock_owned().await),
            locks: self.locks.clone(),
            name: name.to_string(),
        }
    }
}

/// The per-machine locks, by name.
type MachineLocks = Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>;

/// A held per-machine lock; see [`NodeApiState::lock`].
pub(super) struct MachineGuard {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    locks: MachineLocks,
    name: String,
}

impl Drop for MachineGuard {
    fn drop(&mut self) {
        // Under the table's lock: the entry goes only if the table's Arc and this guard's are
        // the last (nobody else holds or waits on it), so a waiter never ends up on a mutex
        // the table no longer hands out.
        let mut locks = match self.locks.lock() {
            Ok(locks) => locks,
            Err(poisoned) => poisoned.into_inner(),
        };
        let last = self
            .guard
            .as_ref()
            .is_some_and(|g| Arc::strong_count(tokio::sync::OwnedMutexGuard::mutex(g)) <= 2);
        self.guard = None;
        if last {
            locks.remove(&self.name);
        }
    }
}
