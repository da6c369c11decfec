//! [`LeasedVmm`]: the runtime as the node API sees it, with the machines served from pools
//! under their own names.
//!
//! A machine served from a pool is `svm-<uid>` on the node API, in status and in the node's
//! report (identity stays as it is, rule V9); in smolvm it is the pool's worker its lease holds.
//! This wrapper maps the name to the worker in every machine call (get, start, stop, resize,
//! suspend, logs, exec, files), the worker back to the name in every answer and in the list,
//! and ends the lease on delete, so nothing above it needs to know a machine was pooled.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use super::PoolBook;
use crate::vmm::{
    BranchRequest, DeleteOutcome, ExecOutput, ExecRequest, FileContent, InteractiveRequest, LeaseInfo, LeaseRequest,
    LogQuery, LogStream, Machine, MachineSpec, PoolInfo, PoolRequest, RegistryAuth, ResizeRequest, Session, Vmm,
    VmmCapacity, VmmError, VmmHealth,
};

/// The runtime with the machines served from pools under their own names.
pub struct LeasedVmm {
    inner: Arc<dyn Vmm>,
    book: Arc<PoolBook>,
}

impl LeasedVmm {
    /// `inner` with the leases of `book`.
    pub fn new(inner: Arc<dyn Vmm>, book: Arc<PoolBook>) -> Self {
        Self { inner, book }
    }

    /// smolvm's name of the machine `name`: its worker when it is served from a pool.
    fn target(&self, name: &str) -> String {
        self.book
            .leases
            .read(name)
            .map_or_else(|| name.to_string(), |record| record.worker)
    }

    /// `machine` under the name `name`.
    fn named(name: &str, mut machine: Machine) -> Machine {
        machine.name = name.to_string();
        machine
    }

    /// An error about the worker, told about the machine: its name in place of the worker's.
    fn about(name: &str, target: &str, error: VmmError) -> VmmError {
        if name == target {
            return error;
        }
        let swap = |message: String| message.replace(target, name);
        match error {
            VmmError::NotFound { message } => VmmError::NotFound { message: swap(message) },
            VmmError::Conflict { message } => VmmError::Conflict { message: swap(message) },
            VmmError::NotRunning { message } => VmmError::NotRunning { message: swap(message) },
            VmmError::NotPaused { message } => VmmError::NotPaused { message: swap(message) },
            VmmError::BadRequest { message } => VmmError::BadRequest { message: swap(message) },
            VmmError::StartFailed { message } => VmmError::StartFailed { message: swap(message) },
            other => other,
        }
    }

    /// Runs a machine call on the machine's smolvm name, answering under its own name.
    async fn on_machine<F, Fut>(&self, name: &str, call: F) -> Result<Machine, VmmError>
    where
        F: FnOnce(String) -> Fut,
        Fut: std::future::Future<Output = Result<Machine, VmmError>>,
    {
        let target = self.target(name);
        call(target.clone())
            .await
            .map(|machine| Self::named(name, machine))
            .map_err(|error| Self::about(name, &target, error))
    }
}

#[async_trait]
impl Vmm for LeasedVmm {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        self.inner.health().await
    }

    async fn capacity(&self) -> Result<VmmCapacity, VmmError> {
        self.inner.capacity().await
    }

    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        let names: BTreeMap<String, String> = self
            .book
            .leases
            .all()
            .into_iter()
            .map(|(name, record)| (record.worker, name))
            .collect();
        Ok(self
            .inner
            .list()
            .await?
            .into_iter()
            .map(|machine| match names.get(&machine.name) {
                Some(name) => Self::named(name, machine),
                None => machine,
            })
            .collect())
    }

    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        let target = self.target(name);
        Ok(self.inner.get(&target).await?.map(|m| Self::named(name, m)))
    }

    async fn create(&self, spec: &MachineSpec) -> Result<Machine, VmmError> {
        if self.book.leases.exists(&spec.name) {
            return Err(VmmError::Conflict {
                message: format!("machine '{}' already exists (served from a pool)", spec.name),
            });
        }
        self.inner.create(spec).await
    }

    async fn start(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        self.on_machine(name, |t| async move { self.inner.start(&t, registry_auth).await })
            .await
    }

    async fn stop(&self, name: &str) -> Result<Machine, VmmError> {
        self.on_machine(name, |t| async move { self.inner.stop(&t).await })
            .await
    }

    /// A machine served from a pool: its lease is completed (smolvm retires the worker), the
    /// worker deleted if it is still there, and the record dropped.
    async fn delete(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let Some(record) = self.book.leases.read(name) else {
            return self.inner.delete(name).await;
        };
        match self.inner.complete_lease(&record.pool, &record.lease).await {
            // Unknown (expired, or smolvm restarted) or already ended: the worker goes below.
            Ok(_) | Err(VmmError::NotFound { .. }) | Err(VmmError::Conflict { .. }) => {}
            Err(error) => return Err(Self::about(name, &record.worker, error)),
        }
        // Retired by the completion (then missing here) or deleted now: either way it is gone.
        self.inner
            .delete(&record.worker)
            .await
            .map_err(|error| Self::about(name, &record.worker, error))?;
        self.book.leases.remove(name);
        Ok(DeleteOutcome::Deleted)
    }

    async fn resize(&self, name: &str, request: &ResizeRequest) -> Result<Machine, VmmError> {
        self.on_machine(name, |t| async move { self.inner.resize(&t, request).await })
            .await
    }

    async fn pause(&self, name: &str) -> Result<Machine, VmmError> {
        self.on_machine(name, |t| async move { self.inner.pause(&t).await })
            .await
    }

    async fn resume(&self, name: &str) -> Result<Machine, VmmError> {
        self.on_machine(name, |t| async move { self.inner.resume(&t).await })
            .await
    }

    async fn start_branchable(&self, name: &str, registry_auth: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        self.inner.start_branchable(name, registry_auth).await
    }

    /// A branch takes a name no pooled machine has, of the source's smolvm machine.
    async fn branch(&self, source: &str, request: &BranchRequest<'_>) -> Result<Machine, VmmError> {
        if self.book.leases.exists(request.name) {
            return Err(VmmError::Conflict {
                message: format!("machine '{}' already exists (served from a pool)", request.name),
            });
        }
        let target = self.target(source);
        self.inner
            .branch(&target, request)
            .await
            .map_err(|error| Self::about(source, &target, error))
    }

    async fn pools(&self) -> Result<Vec<PoolInfo>, VmmError> {
        self.inner.pools().await
    }

    async fn create_pool(&self, request: &PoolRequest<'_>) -> Result<PoolInfo, VmmError> {
        self.inner.create_pool(request).await
    }

    async fn resize_pool(&self, name: &str, ready: u32) -> Result<PoolInfo, VmmError> {
        self.inner.resize_pool(name, ready).await
    }

    async fn delete_pool(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        self.inner.delete_pool(name).await
    }

    async fn acquire_lease(&self, pool: &str, request: &LeaseRequest<'_>) -> Result<LeaseInfo, VmmError> {
        self.inner.acquire_lease(pool, request).await
    }

    async fn heartbeat_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.inner.heartbeat_lease(pool, lease).await
    }

    async fn complete_lease(&self, pool: &str, lease: &str) -> Result<LeaseInfo, VmmError> {
        self.inner.complete_lease(pool, lease).await
    }

    async fn logs(&self, name: &str, query: &LogQuery) -> Result<LogStream, VmmError> {
        let target = self.target(name);
        self.inner
            .logs(&target, query)
            .await
            .map_err(|e| Self::about(name, &target, e))
    }

    async fn exec(&self, name: &str, request: &ExecRequest) -> Result<ExecOutput, VmmError> {
        let target = self.target(name);
        self.inner
            .exec(&target, request)
            .await
            .map_err(|e| Self::about(name, &target, e))
    }

    async fn exec_interactive(&self, name: &str, request: &InteractiveRequest) -> Result<Session, VmmError> {
        let target = self.target(name);
        self.inner
            .exec_interactive(&target, request)
            .await
            .map_err(|e| Self::about(name, &target, e))
    }

    async fn read_file(&self, name: &str, path: &str, limit: u64) -> Result<FileContent, VmmError> {
        let target = self.target(name);
        self.inner
            .read_file(&target, path, limit)
            .await
            .map_err(|e| Self::about(name, &target, e))
    }

    async fn write_file(
        &self,
        name: &str,
        path: &str,
        mode: Option<u32>,
        content: bytes::Bytes,
    ) -> Result<(), VmmError> {
        let target = self.target(name);
        self.inner
            .write_file(&target, path, mode, content)
            .await
            .map_err(|e| Self::about(name, &target, e))
    }
}
