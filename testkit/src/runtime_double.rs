//! `ScriptedRuntime`, a TEST DOUBLE of the runtime (a [`Vmm`]) for interactive exec, which
//! cannot really run here (no guest boots on these machines). It plays a command as smolvm's
//! documented interactive exec does: it echoes stdin to stdout, answers a resize with the size
//! (`size COLSxROWS`), writes stdin `err` to stderr, and exits with N on stdin `exit N`. Used
//! behind the agent's real node API router by the runtime's and the controller's tests.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use smolvm_api::channel::Ending;
use smolvm_runtime::vmm::{
    DeleteOutcome, InteractiveRequest, Machine, MachineSpec, MachineState, RegistryAuth, ResizeRequest, Session,
    SessionInput, SessionOutput, Vmm, VmmError, VmmHealth,
};

/// A machine as a runtime double reports it: `name` in `state`, 1 vCPU, 256 MiB, no image, no
/// ports, no network.
pub fn machine(name: &str, state: MachineState) -> Machine {
    Machine {
        name: name.into(),
        state,
        cpus: 1,
        memory_mib: 256,
        storage_gib: None,
        overlay_gib: None,
        image: None,
        ports: Vec::new(),
        network: false,
        pid: None,
        raw: serde_json::Value::Null,
    }
}

/// TEST DOUBLE of the runtime: machine `running` (and every name that starts with it) runs,
/// `stopped` does not; interactive exec plays the script in the module's doc. Counts sessions
/// opened and records that a session's caller went.
#[derive(Default)]
pub struct ScriptedRuntime {
    /// Interactive sessions opened.
    pub opened: AtomicUsize,
    /// Set when a session's caller went before the command exited: its input ended, or its
    /// output could no longer be delivered.
    pub input_ended: Arc<AtomicBool>,
    /// The command of each session opened, in order.
    pub commands: Mutex<Vec<Vec<String>>>,
}

#[async_trait]
impl Vmm for ScriptedRuntime {
    async fn health(&self) -> Result<VmmHealth, VmmError> {
        Err(VmmError::Unavailable {
            message: "test double".into(),
        })
    }
    async fn list(&self) -> Result<Vec<Machine>, VmmError> {
        Ok(Vec::new())
    }
    async fn get(&self, name: &str) -> Result<Option<Machine>, VmmError> {
        let state = match name {
            "stopped" => MachineState::Stopped,
            running if running.starts_with("running") => MachineState::Running,
            _ => return Ok(None),
        };
        Ok(Some(machine(name, state)))
    }
    async fn create(&self, _: &MachineSpec) -> Result<Machine, VmmError> {
        unreachable_call()
    }
    async fn start(&self, _: &str, _: Option<&RegistryAuth>) -> Result<Machine, VmmError> {
        unreachable_call()
    }
    async fn stop(&self, _: &str) -> Result<Machine, VmmError> {
        unreachable_call()
    }
    async fn delete(&self, _: &str) -> Result<DeleteOutcome, VmmError> {
        unreachable_call()
    }
    async fn resize(&self, _: &str, _: &ResizeRequest) -> Result<Machine, VmmError> {
        unreachable_call()
    }
    async fn exec_interactive(&self, _: &str, request: &InteractiveRequest) -> Result<Session, VmmError> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut commands) = self.commands.lock() {
            commands.push(request.command.clone());
        }
        let (session, mut input, output) = Session::pair();
        let ended = self.input_ended.clone();
        tokio::spawn(async move {
            let out = |b: &[u8]| SessionOutput::Stdout(Bytes::copy_from_slice(b));
            while let Some(message) = input.recv().await {
                let reply = match message {
                    SessionInput::Resize { cols, rows } => out(format!("size {cols}x{rows}").as_bytes()),
                    SessionInput::Stdin(bytes) if bytes.as_ref() == b"err" => {
                        SessionOutput::Stderr(Bytes::from_static(b"err"))
                    }
                    SessionInput::Stdin(bytes) => match std::str::from_utf8(&bytes)
                        .ok()
                        .and_then(|t| t.strip_prefix("exit "))
                        .and_then(|code| code.parse().ok())
                    {
                        Some(code) => SessionOutput::Ended(Ending::Exited(code)),
                        None => out(&bytes),
                    },
                };
                let last = matches!(reply, SessionOutput::Ended(_));
                if output.send(reply).await.is_err() {
                    break;
                }
                if last {
                    return;
                }
            }
            ended.store(true, Ordering::SeqCst);
        });
        Ok(session)
    }
}

fn unreachable_call<T>() -> Result<T, VmmError> {
    Err(VmmError::BadRequest {
        message: "not part of this test double".into(),
    })
}
