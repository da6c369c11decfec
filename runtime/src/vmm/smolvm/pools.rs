//! smolvm's fork pools and their leases (`/api/v1/pools`): the calls and their wire types.
//!
//! A pool keeps `desiredReady` machines forked from a running branch source, parked at the
//! workload's branch point; a lease takes one (its idempotency key answers the same lease on a
//! retry), installs its env, and releases it to run. smolvm answers a lease with no ready
//! machine 503, a pool or lease it does not know 404 (`NOT_FOUND`), and a source that is not
//! running 409 (`CONFLICT`), as observed on smolvm 1.32.2 (`docs/smolvm-api.md`).

use hyper::Method;
use serde::{Deserialize, Serialize};

use super::SmolvmClient;
use super::errors::{Operation, map_error};
use super::paths::encode_segment;
use super::wire::{env_assignments, parse_json, to_json};
use crate::vmm::{DeleteOutcome, LeaseInfo, LeaseRequest, PoolInfo, PoolRequest, VmmError};

const POOLS: &str = "/api/v1/pools";

fn pool_path(name: &str) -> String {
    format!("{POOLS}/{}", encode_segment(name))
}

/// `CreateForkPoolRequest`, the fields the agent sets.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CreatePoolWire<'a> {
    name: &'a str,
    source: &'a str,
    desired_ready: u32,
    lease_ttl_secs: u64,
}

/// `ResizeForkPoolRequest`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResizePoolWire {
    desired_ready: u32,
}

/// `ForkPoolInfo`, the fields the agent reads.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PoolWire {
    name: String,
    source: String,
    desired_ready: u32,
    #[serde(default)]
    provisioning: u32,
    #[serde(default)]
    ready: u32,
    #[serde(default)]
    activating: u32,
    #[serde(default)]
    active: u32,
}

impl From<PoolWire> for PoolInfo {
    fn from(wire: PoolWire) -> Self {
        PoolInfo {
            name: wire.name,
            source: wire.source,
            desired: wire.desired_ready,
            ready: wire.ready,
            provisioning: wire.provisioning,
            active: wire.active + wire.activating,
        }
    }
}

/// `ListForkPoolsResponse`.
#[derive(Debug, Deserialize)]
struct PoolListWire {
    pools: Vec<PoolWire>,
}

/// `AcquireForkLeaseRequest`, the fields the agent sets (`Debug` hides the env values).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AcquireWire<'a> {
    idempotency_key: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    ttl_secs: u64,
}

/// `ForkLeaseInfo`, the fields the agent reads.
#[derive(Debug, Deserialize)]
struct LeaseWire {
    id: String,
    pool: String,
    machine: String,
    state: String,
}

impl From<LeaseWire> for LeaseInfo {
    fn from(wire: LeaseWire) -> Self {
        LeaseInfo {
            id: wire.id,
            pool: wire.pool,
            machine: wire.machine,
            state: wire.state,
        }
    }
}

impl SmolvmClient {
    /// One pool call whose success body is `T`.
    async fn pool_call<T: serde::de::DeserializeOwned>(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        what: &str,
    ) -> Result<T, VmmError> {
        let (status, bytes) = self.call(operation, method, path, body).await?;
        if !status.is_success() {
            return Err(map_error(operation, status, &bytes));
        }
        parse_json(&bytes, what)
    }

    pub(super) async fn list_pools(&self) -> Result<Vec<PoolInfo>, VmmError> {
        let list: PoolListWire = self
            .pool_call(Operation::Pools, Method::GET, POOLS, None, "pool list")
            .await?;
        Ok(list.pools.into_iter().map(PoolInfo::from).collect())
    }

    pub(super) async fn create_pool_call(&self, request: &PoolRequest<'_>) -> Result<PoolInfo, VmmError> {
        let body = to_json(&CreatePoolWire {
            name: request.name,
            source: request.source,
            desired_ready: request.ready,
            lease_ttl_secs: request.lease_ttl_secs,
        })?;
        self.pool_call::<PoolWire>(Operation::Pools, Method::POST, POOLS, Some(body), "pool")
            .await
            .map(PoolInfo::from)
    }

    pub(super) async fn resize_pool_call(&self, name: &str, ready: u32) -> Result<PoolInfo, VmmError> {
        let body = to_json(&ResizePoolWire { desired_ready: ready })?;
        let path = format!("{}/size", pool_path(name));
        self.pool_call::<PoolWire>(Operation::Pools, Method::PUT, &path, Some(body), "pool")
            .await
            .map(PoolInfo::from)
    }

    pub(super) async fn delete_pool_call(&self, name: &str) -> Result<DeleteOutcome, VmmError> {
        let (status, bytes) = self
            .call(Operation::Pools, Method::DELETE, &pool_path(name), None)
            .await?;
        if status.is_success() {
            return Ok(DeleteOutcome::Deleted);
        }
        match map_error(Operation::Pools, status, &bytes) {
            VmmError::NotFound { .. } => Ok(DeleteOutcome::Missing),
            error => Err(error),
        }
    }

    pub(super) async fn acquire_lease_call(
        &self,
        pool: &str,
        request: &LeaseRequest<'_>,
    ) -> Result<LeaseInfo, VmmError> {
        let body = to_json(&AcquireWire {
            idempotency_key: request.key,
            env: env_assignments(request.env),
            ttl_secs: request.ttl_secs,
        })?;
        let path = format!("{}/leases", pool_path(pool));
        self.pool_call::<LeaseWire>(Operation::Lease, Method::POST, &path, Some(body), "lease")
            .await
            .map(LeaseInfo::from)
    }

    pub(super) async fn lease_verb(&self, pool: &str, lease: &str, verb: &str) -> Result<LeaseInfo, VmmError> {
        let path = format!("{}/leases/{}/{verb}", pool_path(pool), encode_segment(lease));
        self.pool_call::<LeaseWire>(Operation::LeaseUpdate, Method::POST, &path, None, "lease")
            .await
            .map(LeaseInfo::from)
    }
}
