//! The node API's operations, one row each ([`Operation::spec`]): method, path, the query it
//! reads, what the request and the answer carry, and the stable name.
//!
//! Every side derives its part from this table, as from a service definition:
//! - the controller's client builds its paths with [`Operation::path`] (and
//!   [`Operation::file_path`]) and its typed JSON calls from [`JsonCall`];
//! - the agent's router registers [`Operation::template`] for each row, and its metrics and logs
//!   name a request with [`Operation::name_of`] (the labels are [`Operation::name`]);
//! - the access API builds the paths it forwards to with [`Operation::path`].
//!
//! A new operation is one row here (a variant, its [`Spec`] in its group of `rows` with its arm
//! in [`Operation::spec`], its [`JsonCall`] when it speaks JSON) and one handler in the agent,
//! whose router matches every operation, so the compiler asks for it.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::wire::{
    BranchRequest, DeleteResponse, ExecRequest, ExecResponse, HealthResponse, IdentityResponse, LeaseRequest,
    MachineSpec, MachineStatus, PoolList, PoolResize, PoolSpec, PoolStatus, ResizeSpec, StartRequest, SuspendRequest,
    VolumeMounts,
};

/// The path segment of this protocol version (the paths start `/v1/`).
pub const VERSION_SEGMENT: &str = "v1";

/// The HTTP method of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`.
    Get,
    /// `PUT`.
    Put,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// The method as HTTP spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
        }
    }
}

/// One segment of an operation's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// A fixed word.
    Fixed(&'static str),
    /// The machine's name (`{name}`), a DNS label ([`super::validate_machine_name`]); in the
    /// pool operations, the pool's, which follows the same rule.
    Machine,
    /// The rest of the path: a file's absolute path in the machine (`{*path}`), each segment
    /// percent-encoded.
    Rest,
}

/// What a request or an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// No body.
    Empty,
    /// A JSON object of the named type of [`super::wire`].
    Json(&'static str),
    /// A JSON object of the named type of [`super::wire`], or no body at all (its default).
    OptionalJson(&'static str),
    /// Plain text lines, streamed (`text/plain; charset=utf-8`).
    Text,
    /// A file's bytes, streamed (`application/octet-stream`), or a directory's listing as JSON.
    File,
    /// A WebSocket upgrade speaking Kubernetes' channel protocol ([`super::channel`]).
    Channel,
    /// A JSON object `{"path": …, "bytes": …}`: the file written.
    FileWritten,
}

/// One row of the table: everything about an operation but its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// HTTP method.
    pub method: Method,
    /// The path, segment by segment.
    pub segments: &'static [Segment],
    /// The query parameters read (none when empty).
    pub query: &'static [&'static str],
    /// What the request carries.
    pub request: Payload,
    /// What a success carries (every failure is a [`super::NodeApiError`]).
    pub response: Payload,
}

/// Declares [`Operation`] with [`Operation::ALL`] and [`Operation::name`] from one list, so a
/// new operation is written once (its row in [`Operation::spec`] is asked for by the compiler).
macro_rules! operations {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Every operation of the node API. The variant's name is its stable name (metric and
        /// log labels, the controller's call timings).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Operation {
            $($(#[$doc])* $name,)*
        }

        impl Operation {
            /// Every operation, in the table's order.
            pub const ALL: &'static [Operation] = &[$(Operation::$name,)*];

            /// The stable name, for metric and log labels.
            pub fn name(self) -> &'static str {
                match self {
                    $(Operation::$name => stringify!($name),)*
                }
            }
        }
    };
}

operations! {
    /// `GET /v1/health`: 200 [`HealthResponse`] when smolvm answered its health check.
    Health,
    /// `GET /v1/identity`: 200 [`IdentityResponse`].
    Identity,
    /// `GET /v1/machines/{name}`: 200 [`MachineStatus`].
    GetMachine,
    /// `PUT /v1/machines/{name}` with a [`MachineSpec`]: 201 [`MachineStatus`] (created), 200
    /// when an identical machine exists.
    CreateMachine,
    /// `DELETE /v1/machines/{name}`: 200 [`DeleteResponse`].
    DeleteMachine,
    /// `POST /v1/machines/{name}/ensure-running`, optionally with a [`StartRequest`]: 200
    /// [`MachineStatus`].
    EnsureMachineRunning,
    /// `POST /v1/machines/{name}/stop`: 200 [`MachineStatus`].
    StopMachine,
    /// `POST /v1/machines/{name}/resize` with a [`ResizeSpec`]: 200 [`MachineStatus`].
    ResizeMachine,
    /// `POST /v1/machines/{name}/suspend`, optionally with a [`SuspendRequest`]: 200
    /// [`MachineStatus`] in state `Suspended`. A running
    /// machine is paused (smolvm saves its RAM and disks durably, then stops it); a suspended one
    /// answers as it is. Refused with 409 `MachineNotRunning` for a machine that is not running.
    SuspendMachine,
    /// `POST /v1/machines/{name}/resume`: 200 [`MachineStatus`] in state `Running`. A suspended
    /// machine is resumed with its processes as they were; a running one answers as it is.
    /// Refused with 409 `NoSavedState` for a machine that was not suspended.
    ResumeMachine,
    /// `PUT /v1/machines/{name}/volumes` with [`VolumeMounts`]: 200 [`MachineStatus`], the
    /// machine's mounts pointed at a new holder Pod's volumes (after its holder was evicted and
    /// made again). Refused with 409 `MachineRunning` while the machine runs, 403
    /// `HolderNotOwned` or `VolumePathOutsideHolder` when the holder or a path is not the
    /// machine's, 409 `VolumeNotMounted` when the kubelet has not mounted a volume.
    BindVolumes,
    /// `GET /v1/machines/{name}/logs?source=console|workload&tail=N&follow=true`: the log as
    /// text lines, streamed.
    MachineLogs,
    /// `POST /v1/machines/{name}/exec` with an [`ExecRequest`]: 200 [`ExecResponse`].
    ExecInMachine,
    /// `GET /v1/machines/{name}/exec?command=…&stdin=…&stdout=…&stderr=…&tty=…`, upgraded to
    /// a WebSocket in Kubernetes' channel protocol.
    ExecInteractive,
    /// `GET /v1/machines/{name}/files/{path}`: the file, streamed, or a directory's listing.
    ReadFile,
    /// `PUT /v1/machines/{name}/files/{path}?mode=0644` with the file's bytes.
    WriteFile,
    /// `POST /v1/machines/{name}/lease` with a [`LeaseRequest`]: 200 [`MachineStatus`], the
    /// machine served from a ready slot of the pool (the same answer again for the same name).
    /// Refused with 409 `NoReadySlot` when the pool has none, 404 `PoolNotFound`.
    LeaseMachine,
    /// `POST /v1/machines/{name}/branch` with a [`BranchRequest`]: 200 [`MachineStatus`], the
    /// machine made a copy-on-write branch of the running branchable `source` (the same answer
    /// again for the same name). Refused with 404 `SourceNotFound`, 409 `SourceNotRunning` or
    /// `SourceNotBranchable`, 409 `Conflict` when `{name}` is another machine (SPEC 2.6).
    BranchMachine,
    /// `GET /v1/pools`: 200 [`PoolList`].
    ListPools,
    /// `PUT /v1/pools/{name}` with a [`PoolSpec`]: 200 [`PoolStatus`].
    ApplyPool,
    /// `DELETE /v1/pools/{name}`: 200 [`DeleteResponse`] once its ready slots and its source
    /// machine are gone; 409 `PoolInUse` while machines served from it remain.
    DeletePool,
    /// `POST /v1/pools/{name}/resize` with a [`PoolResize`]: 200 [`PoolStatus`], the pool's
    /// wanted slots set (its ready machines beyond them deleted at once, before the answer): the
    /// controller gives a ready slot's room to a SmolVM so, before it creates the machine.
    /// 404 `PoolNotFound` for a pool the node does not keep.
    ResizePool,
}

const V: Segment = Segment::Fixed(VERSION_SEGMENT);
const MACHINES: Segment = Segment::Fixed("machines");
const POOLS: Segment = Segment::Fixed("pools");

impl Operation {
    /// The label of a request that names no operation.
    pub const UNKNOWN: &'static str = "Unknown";

    /// The operation's row (its constant in `rows`, by group).
    pub fn spec(self) -> Spec {
        use rows::*;
        match self {
            Operation::Health => HEALTH,
            Operation::Identity => IDENTITY,
            Operation::GetMachine => GET_MACHINE,
            Operation::CreateMachine => CREATE_MACHINE,
            Operation::DeleteMachine => DELETE_MACHINE,
            Operation::EnsureMachineRunning => ENSURE_MACHINE_RUNNING,
            Operation::StopMachine => STOP_MACHINE,
            Operation::ResizeMachine => RESIZE_MACHINE,
            Operation::SuspendMachine => SUSPEND_MACHINE,
            Operation::ResumeMachine => RESUME_MACHINE,
            Operation::BindVolumes => BIND_VOLUMES,
            Operation::MachineLogs => MACHINE_LOGS,
            Operation::ExecInMachine => EXEC_IN_MACHINE,
            Operation::ExecInteractive => EXEC_INTERACTIVE,
            Operation::ReadFile => READ_FILE,
            Operation::WriteFile => WRITE_FILE,
            Operation::LeaseMachine => LEASE_MACHINE,
            Operation::BranchMachine => BRANCH_MACHINE,
            Operation::ListPools => LIST_POOLS,
            Operation::ApplyPool => APPLY_POOL,
            Operation::DeletePool => DELETE_POOL,
            Operation::ResizePool => RESIZE_POOL,
        }
    }

    /// The HTTP method.
    pub fn method(self) -> Method {
        self.spec().method
    }

    /// The path template as axum's router reads it: `/v1/machines/{name}/files/{*path}`.
    pub fn template(self) -> String {
        let mut out = String::new();
        for segment in self.spec().segments {
            out.push('/');
            out.push_str(match segment {
                Segment::Fixed(word) => word,
                Segment::Machine => "{name}",
                Segment::Rest => "{*path}",
            });
        }
        out
    }

    /// The path of this operation on `machine` (ignored by the node-wide operations), the name
    /// percent-encoded (a valid machine name is unchanged; an invalid one reaches the agent
    /// as one segment, which refuses it). For [`Operation::ReadFile`] and
    /// [`Operation::WriteFile`] this is the files root: see [`Operation::file_path`].
    pub fn path(self, machine: &str) -> String {
        let mut out = String::new();
        for segment in self.spec().segments {
            match segment {
                Segment::Fixed(word) => {
                    out.push('/');
                    out.push_str(word);
                }
                Segment::Machine => {
                    out.push('/');
                    push_encoded(&mut out, machine);
                }
                Segment::Rest => {}
            }
        }
        out
    }

    /// The path of this operation on `machine`, followed by `file` (an absolute path in the
    /// machine) segment by segment, each percent-encoded (the agent checks the segments
    /// themselves): `/v1/machines/{machine}/files/{file}`. An operation whose path does not end
    /// in a file's path ignores `file`.
    pub fn file_path(self, machine: &str, file: &str) -> String {
        let mut out = self.path(machine);
        if self.spec().segments.last() != Some(&Segment::Rest) {
            return out;
        }
        for segment in file.split('/').filter(|s| !s.is_empty()) {
            out.push('/');
            push_encoded(&mut out, segment);
        }
        out
    }

    /// The operation a request names, and its machine segment (as sent, still percent-encoded)
    /// when the path has one: `method` as HTTP spells it, `segments` the path's segments
    /// without the leading `/`.
    pub fn route<'a>(method: &str, segments: &[&'a str]) -> Option<(Operation, Option<&'a str>)> {
        Operation::ALL.iter().copied().find_map(|operation| {
            if operation.method().as_str() != method {
                return None;
            }
            operation.matches(segments).map(|machine| (operation, machine))
        })
    }

    /// [`Operation::route`] of a request's path (`/v1/machines/m1/stop`).
    pub fn route_path<'a>(method: &str, path: &'a str) -> Option<(Operation, Option<&'a str>)> {
        let segments: Vec<&'a str> = path.trim_start_matches('/').split('/').collect();
        Operation::route(method, &segments)
    }

    /// The label of a request: its operation's [`Operation::name`], or [`Operation::UNKNOWN`].
    pub fn name_of(method: &str, path: &str) -> &'static str {
        Operation::route_path(method, path).map_or(Operation::UNKNOWN, |(operation, _)| operation.name())
    }

    /// Whether `segments` fit this operation's path; `Some(machine segment)` when they do.
    fn matches<'a>(self, segments: &[&'a str]) -> Option<Option<&'a str>> {
        let template = self.spec().segments;
        let mut machine = None;
        for (i, segment) in template.iter().enumerate() {
            match segment {
                Segment::Rest => return Some(machine),
                Segment::Fixed(word) => {
                    if segments.get(i).copied() != Some(*word) {
                        return None;
                    }
                }
                Segment::Machine => machine = Some(*segments.get(i)?),
            }
        }
        (segments.len() == template.len()).then_some(machine)
    }
}

/// The rows of [`Operation::spec`], by group of operations: the node's own, a machine's
/// lifecycle, what runs in a machine (logs, exec, files), and the warm pools.
mod rows {
    use super::{
        MACHINES, Method,
        Method::{Delete, Get, Post, Put},
        POOLS, Payload,
        Payload::{Channel, Empty, File, FileWritten, Json, OptionalJson, Text},
        Segment,
        Segment::{Fixed, Machine, Rest},
        Spec, V,
    };

    /// One row.
    const fn row(
        method: Method,
        segments: &'static [Segment],
        query: &'static [&'static str],
        request: Payload,
        response: Payload,
    ) -> Spec {
        Spec {
            method,
            segments,
            query,
            request,
            response,
        }
    }

    // The node's own.
    pub const HEALTH: Spec = row(Get, &[V, Fixed("health")], &[], Empty, Json("HealthResponse"));
    pub const IDENTITY: Spec = row(Get, &[V, Fixed("identity")], &[], Empty, Json("IdentityResponse"));

    // A machine's lifecycle.
    pub const GET_MACHINE: Spec = row(Get, &[V, MACHINES, Machine], &[], Empty, Json("MachineStatus"));
    pub const CREATE_MACHINE: Spec = row(
        Put,
        &[V, MACHINES, Machine],
        &[],
        Json("MachineSpec"),
        Json("MachineStatus"),
    );
    pub const DELETE_MACHINE: Spec = row(Delete, &[V, MACHINES, Machine], &[], Empty, Json("DeleteResponse"));
    pub const ENSURE_MACHINE_RUNNING: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("ensure-running")],
        &[],
        OptionalJson("StartRequest"),
        Json("MachineStatus"),
    );
    pub const STOP_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("stop")],
        &[],
        Empty,
        Json("MachineStatus"),
    );
    pub const RESIZE_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("resize")],
        &[],
        Json("ResizeSpec"),
        Json("MachineStatus"),
    );
    pub const SUSPEND_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("suspend")],
        &[],
        OptionalJson("SuspendRequest"),
        Json("MachineStatus"),
    );
    pub const RESUME_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("resume")],
        &[],
        Empty,
        Json("MachineStatus"),
    );
    pub const BIND_VOLUMES: Spec = row(
        Put,
        &[V, MACHINES, Machine, Fixed("volumes")],
        &[],
        Json("VolumeMounts"),
        Json("MachineStatus"),
    );

    // What runs in a machine: its logs, exec, its files.
    pub const MACHINE_LOGS: Spec = row(
        Get,
        &[V, MACHINES, Machine, Fixed("logs")],
        &["source", "tail", "follow"],
        Empty,
        Text,
    );
    pub const EXEC_IN_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("exec")],
        &[],
        Json("ExecRequest"),
        Json("ExecResponse"),
    );
    pub const EXEC_INTERACTIVE: Spec = row(
        Get,
        &[V, MACHINES, Machine, Fixed("exec")],
        &["command", "stdin", "stdout", "stderr", "tty"],
        Channel,
        Channel,
    );
    pub const READ_FILE: Spec = row(Get, &[V, MACHINES, Machine, Fixed("files"), Rest], &[], Empty, File);
    pub const WRITE_FILE: Spec = row(
        Put,
        &[V, MACHINES, Machine, Fixed("files"), Rest],
        &["mode"],
        File,
        FileWritten,
    );

    // The warm pools, and a machine served from one.
    pub const LEASE_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("lease")],
        &[],
        Json("LeaseRequest"),
        Json("MachineStatus"),
    );
    // A branch of a running machine (SPEC 2.6).
    pub const BRANCH_MACHINE: Spec = row(
        Post,
        &[V, MACHINES, Machine, Fixed("branch")],
        &[],
        Json("BranchRequest"),
        Json("MachineStatus"),
    );
    pub const LIST_POOLS: Spec = row(Get, &[V, POOLS], &[], Empty, Json("PoolList"));
    pub const APPLY_POOL: Spec = row(Put, &[V, POOLS, Machine], &[], Json("PoolSpec"), Json("PoolStatus"));
    pub const DELETE_POOL: Spec = row(Delete, &[V, POOLS, Machine], &[], Empty, Json("DeleteResponse"));
    pub const RESIZE_POOL: Spec = row(
        Post,
        &[V, POOLS, Machine, Fixed("resize")],
        &[],
        Json("PoolResize"),
        Json("PoolStatus"),
    );
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Appends `text` percent-encoded: RFC 3986's unreserved characters as they are, every other
/// byte as `%XX`.
fn push_encoded(out: &mut String, text: &str) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

/// An operation that speaks JSON both ways: its request and answer types, which the
/// controller's client sends and reads and the agent reads and answers. `()` as the request:
/// the operation takes no body.
pub trait JsonCall {
    /// The operation.
    const OPERATION: Operation;
    /// What the request carries.
    type Request: Serialize + DeserializeOwned;
    /// What a success carries.
    type Response: Serialize + DeserializeOwned;
}

/// The [`JsonCall`] of each JSON operation, named as the operation.
pub mod calls {
    use super::*;

    macro_rules! json_calls {
        ($($name:ident: $request:ty => $response:ty;)*) => {$(
            #[doc = concat!("[`Operation::", stringify!($name), "`] as a typed JSON call.")]
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl JsonCall for $name {
                const OPERATION: Operation = Operation::$name;
                type Request = $request;
                type Response = $response;
            }
        )*};
    }

    json_calls! {
        Health: () => HealthResponse;
        Identity: () => IdentityResponse;
        GetMachine: () => MachineStatus;
        CreateMachine: MachineSpec => MachineStatus;
        DeleteMachine: () => DeleteResponse;
        EnsureMachineRunning: StartRequest => MachineStatus;
        StopMachine: () => MachineStatus;
        ResizeMachine: ResizeSpec => MachineStatus;
        SuspendMachine: SuspendRequest => MachineStatus;
        ResumeMachine: () => MachineStatus;
        BindVolumes: VolumeMounts => MachineStatus;
        ExecInMachine: ExecRequest => ExecResponse;
        LeaseMachine: LeaseRequest => MachineStatus;
        BranchMachine: BranchRequest => MachineStatus;
        ListPools: () => PoolList;
        ApplyPool: PoolSpec => PoolStatus;
        DeletePool: () => DeleteResponse;
        ResizePool: PoolResize => PoolStatus;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_route_to_their_operation() {
        // (method, path, operation, machine segment)
        let cases: [(&str, &str, Option<Operation>, Option<&str>); 30] = [
            ("GET", "/v1/health", Some(Operation::Health), None),
            ("GET", "/v1/identity", Some(Operation::Identity), None),
            ("GET", "/v1/machines/a", Some(Operation::GetMachine), Some("a")),
            ("PUT", "/v1/machines/a", Some(Operation::CreateMachine), Some("a")),
            ("DELETE", "/v1/machines/a", Some(Operation::DeleteMachine), Some("a")),
            (
                "POST",
                "/v1/machines/a/ensure-running",
                Some(Operation::EnsureMachineRunning),
                Some("a"),
            ),
            ("POST", "/v1/machines/a/stop", Some(Operation::StopMachine), Some("a")),
            (
                "POST",
                "/v1/machines/a/resize",
                Some(Operation::ResizeMachine),
                Some("a"),
            ),
            (
                "POST",
                "/v1/machines/a/suspend",
                Some(Operation::SuspendMachine),
                Some("a"),
            ),
            (
                "POST",
                "/v1/machines/a/resume",
                Some(Operation::ResumeMachine),
                Some("a"),
            ),
            ("PUT", "/v1/machines/a/volumes", Some(Operation::BindVolumes), Some("a")),
            ("GET", "/v1/machines/a/logs", Some(Operation::MachineLogs), Some("a")),
            ("POST", "/v1/machines/a/exec", Some(Operation::ExecInMachine), Some("a")),
            (
                "GET",
                "/v1/machines/a/exec",
                Some(Operation::ExecInteractive),
                Some("a"),
            ),
            (
                "GET",
                "/v1/machines/a/files/etc/hostname",
                Some(Operation::ReadFile),
                Some("a"),
            ),
            (
                "PUT",
                "/v1/machines/a/files/tmp/x",
                Some(Operation::WriteFile),
                Some("a"),
            ),
            ("POST", "/v1/machines/a/lease", Some(Operation::LeaseMachine), Some("a")),
            (
                "POST",
                "/v1/machines/a/branch",
                Some(Operation::BranchMachine),
                Some("a"),
            ),
            ("GET", "/v1/pools", Some(Operation::ListPools), None),
            ("PUT", "/v1/pools/p", Some(Operation::ApplyPool), Some("p")),
            ("DELETE", "/v1/pools/p", Some(Operation::DeletePool), Some("p")),
            ("POST", "/v1/pools/p/resize", Some(Operation::ResizePool), Some("p")),
            ("GET", "/v1/pools/p", None, None),
            ("POST", "/v1/machines/a", None, None),
            ("GET", "/v1/machines/a/stop", None, None),
            ("GET", "/v1/machines", None, None),
            ("GET", "/v1/machines/a/", None, None),
            ("GET", "/v2/health", None, None),
            ("GET", "/nope", None, None),
            ("PATCH", "/v1/machines/a", None, None),
        ];
        for (method, path, operation, machine) in cases {
            let routed = Operation::route_path(method, path);
            assert_eq!(routed.map(|r| r.0), operation, "{method} {path}");
            assert_eq!(routed.and_then(|r| r.1), machine, "{method} {path}");
            assert_eq!(
                Operation::name_of(method, path),
                operation.map_or("Unknown", Operation::name),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn every_operation_routes_back_from_its_own_path() {
        for &operation in Operation::ALL {
            let path = operation.file_path("svm-1", "/etc/my file");
            let routed = Operation::route_path(operation.method().as_str(), &path);
            assert_eq!(routed.map(|r| r.0), Some(operation), "{path}");
            assert_eq!(operation.to_string(), operation.name());
            // Two rows never share a method and a path.
            let twins = Operation::ALL
                .iter()
                .filter(|o| o.method() == operation.method() && o.template() == operation.template())
                .count();
            assert_eq!(twins, 1, "{operation}");
        }
    }

    #[test]
    fn paths_and_templates() {
        // (operation, path on svm-1, axum template)
        let cases = [
            (Operation::Health, "/v1/health", "/v1/health"),
            (Operation::GetMachine, "/v1/machines/svm-1", "/v1/machines/{name}"),
            (
                Operation::EnsureMachineRunning,
                "/v1/machines/svm-1/ensure-running",
                "/v1/machines/{name}/ensure-running",
            ),
            (
                Operation::ReadFile,
                "/v1/machines/svm-1/files",
                "/v1/machines/{name}/files/{*path}",
            ),
        ];
        for (operation, path, template) in cases {
            assert_eq!(operation.path("svm-1"), path);
            assert_eq!(operation.template(), template);
        }
        // A name that is no machine name stays one segment, for the agent to refuse.
        assert_eq!(Operation::StopMachine.path("a/b c"), "/v1/machines/a%2Fb%20c/stop");
        assert_eq!(
            Operation::WriteFile.file_path("svm-1", "/etc/my file"),
            "/v1/machines/svm-1/files/etc/my%20file"
        );
        assert_eq!(
            Operation::ReadFile.file_path("svm-1", "/a/b.txt"),
            "/v1/machines/svm-1/files/a/b.txt"
        );
    }

    /// The row's payloads name the types of its [`JsonCall`].
    fn payloads_match<C: JsonCall>() {
        let short = |name: &'static str| name.rsplit("::").next().unwrap_or(name);
        let spec = C::OPERATION.spec();
        let request = match spec.request {
            Payload::Json(name) | Payload::OptionalJson(name) => name,
            Payload::Empty => "()",
            other => panic!("{} is no JSON call: {other:?}", C::OPERATION),
        };
        assert_eq!(short(std::any::type_name::<C::Request>()), request, "{}", C::OPERATION);
        assert_eq!(
            spec.response,
            Payload::Json(short(std::any::type_name::<C::Response>())),
            "{}",
            C::OPERATION
        );
    }

    #[test]
    fn json_calls_agree_with_the_table() {
        payloads_match::<calls::Health>();
        payloads_match::<calls::Identity>();
        payloads_match::<calls::GetMachine>();
        payloads_match::<calls::CreateMachine>();
        payloads_match::<calls::DeleteMachine>();
        payloads_match::<calls::EnsureMachineRunning>();
        payloads_match::<calls::StopMachine>();
        payloads_match::<calls::ResizeMachine>();
        payloads_match::<calls::SuspendMachine>();
        payloads_match::<calls::ResumeMachine>();
        payloads_match::<calls::BindVolumes>();
        payloads_match::<calls::ExecInMachine>();
        payloads_match::<calls::LeaseMachine>();
        payloads_match::<calls::BranchMachine>();
        payloads_match::<calls::ListPools>();
        payloads_match::<calls::ApplyPool>();
        payloads_match::<calls::DeletePool>();
        payloads_match::<calls::ResizePool>();
    }
}
