//! smolvm's branches of a running machine (`POST /api/v1/machines/{source}/branches`, its
//! `ForkRequest`): a child with copy-on-write memory and disks. smolvm answers 404 for a source
//! it does not know and 409 for a source that is not branchable or a child name that exists
//! (its OpenAPI document, `testkit/data/smolvm-1.32.2-openapi.json`).

use hyper::Method;
use serde::Serialize;

use super::SmolvmClient;
use super::errors::Operation;
use super::paths::machine_path;
use super::wire::{PortWireOut, env_assignments, to_json};
use crate::vmm::{BranchRequest, Machine, VmmError};

/// `ForkRequest`, the fields the agent sets (`Debug` is not derived: the env values are
/// secret). `ports` is always sent: without it smolvm remaps the source's forwards to fresh
/// host ports, and a branch publishes only its own.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ForkWire<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    ports: Vec<PortWireOut>,
}

fn fork_wire<'a>(request: &BranchRequest<'a>) -> ForkWire<'a> {
    ForkWire {
        name: request.name,
        env: env_assignments(request.env),
        ports: request.ports.iter().map(PortWireOut::from).collect(),
    }
}

impl SmolvmClient {
    pub(super) async fn branch_call(&self, source: &str, request: &BranchRequest<'_>) -> Result<Machine, VmmError> {
        let body = to_json(&fork_wire(request))?;
        let path = format!("{}/branches", machine_path(source));
        self.machine_call(Operation::Branch, Method::POST, &path, Some(body))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmm::{PortMapping, Sensitive};
    use smolvm_api::Protocol;

    #[test]
    fn the_fork_request_carries_the_name_env_and_only_the_branchs_ports() {
        let env = [("ROLE".to_string(), Sensitive("b1".to_string()))];
        let ports = [PortMapping {
            host_port: 18080,
            guest_port: 80,
            protocol: Protocol::Tcp,
        }];
        let cases = [
            (
                BranchRequest {
                    name: "b",
                    env: &[],
                    ports: &[],
                },
                serde_json::json!({"name": "b", "ports": []}),
            ),
            (
                BranchRequest {
                    name: "b",
                    env: &env,
                    ports: &ports,
                },
                serde_json::json!({"name": "b", "env": ["ROLE=b1"], "ports": [{"host": 18080, "guest": 80, "protocol": "tcp"}]}),
            ),
        ];
        for (request, want) in cases {
            assert_eq!(serde_json::to_value(fork_wire(&request)).ok(), Some(want));
        }
    }
}
