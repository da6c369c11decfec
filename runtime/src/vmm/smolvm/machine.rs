//! A machine as smolvm reports it (`MachineInfo`): its fields, with the raw JSON kept beside
//! them, and its state word, read in one place.

use serde::Deserialize;
use smolvm_api::Protocol;

use super::wire::parse_json;
use crate::vmm::{Machine, MachineState, PortMapping, VmmError};

pub(super) fn parse_machine_bytes(bytes: &[u8]) -> Result<Machine, VmmError> {
    let value: serde_json::Value = parse_json(bytes, "machine")?;
    machine_from_json(value)
}

/// Reads smolvm's state word (case-insensitive): the one place the agent reads smolvm's words
/// for a machine's state. A word this protocol does not know is [`MachineState::Unknown`]; the
/// word itself stays in the machine's raw JSON ([`Machine::runtime_state`]).
pub fn state_from_word(word: &str) -> MachineState {
    match word.to_ascii_lowercase().as_str() {
        "created" => MachineState::Created,
        "running" => MachineState::Running,
        "stopped" => MachineState::Stopped,
        "failed" | "error" => MachineState::Failed,
        _ => MachineState::Unknown,
    }
}

/// smolvm's word for `state` (for a machine no runtime reported; `unknown` for
/// [`MachineState::Unknown`]).
pub fn state_word(state: MachineState) -> &'static str {
    match state {
        MachineState::Created => "created",
        MachineState::Running => "running",
        // A suspended machine is one smolvm paused: it reads `stopped`.
        MachineState::Stopped | MachineState::Suspended => "stopped",
        MachineState::Failed => "failed",
        MachineState::Unknown => "unknown",
    }
}

/// The state word of a machine object smolvm reported (its `state`), verbatim.
pub fn state_word_of(raw: &serde_json::Value) -> Option<&str> {
    raw.get("state").and_then(serde_json::Value::as_str)
}

/// Reads one machine object as smolvm reports it (`MachineInfo`), keeping the raw JSON.
pub fn machine_from_json(value: serde_json::Value) -> Result<Machine, VmmError> {
    let wire: MachineWire = serde_json::from_value(value.clone())
        .map_err(|error| VmmError::Protocol(format!("cannot read a machine smolvm sent: {error}")))?;
    let ports = wire
        .ports
        .iter()
        .map(|port| {
            let host_port = u16::try_from(port.host).ok();
            let guest_port = u16::try_from(port.guest).ok();
            let protocol = protocol_from_smolvm(port.protocol.as_deref());
            match (host_port, guest_port, protocol) {
                (Some(host_port), Some(guest_port), Some(protocol)) => Ok(PortMapping {
                    host_port,
                    guest_port,
                    protocol,
                }),
                _ => Err(VmmError::Protocol(format!(
                    "machine '{}' has a port smolvm reports as {}:{}/{}",
                    wire.name,
                    port.host,
                    port.guest,
                    port.protocol.as_deref().unwrap_or("tcp")
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Machine {
        state: state_from_word(&wire.state),
        name: wire.name,
        cpus: wire.cpus,
        memory_mib: wire.memory_mb,
        storage_gib: wire.storage_gb,
        overlay_gib: wire.overlay_gb,
        image: wire.image,
        ports,
        network: wire.network,
        pid: wire.pid,
        raw: value,
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineWire {
    name: String,
    state: String,
    #[serde(default)]
    cpus: u32,
    #[serde(default)]
    memory_mb: u64,
    #[serde(default)]
    storage_gb: Option<u64>,
    #[serde(default)]
    overlay_gb: Option<u64>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    ports: Vec<PortWireIn>,
    #[serde(default)]
    network: bool,
    #[serde(default)]
    pid: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct PortWireIn {
    host: u64,
    guest: u64,
    #[serde(default)]
    protocol: Option<String>,
}

/// A port protocol as smolvm reports it (absent means TCP); `None` for one it does not name.
fn protocol_from_smolvm(text: Option<&str>) -> Option<Protocol> {
    match text {
        None | Some("tcp") => Some(Protocol::Tcp),
        Some("udp") => Some(Protocol::Udp),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bodies below were observed from smolvm 1.32.2 (see docs/smolvm-api.md).

    #[test]
    fn state_words_are_read_in_one_place() {
        for (word, state) in [
            ("created", MachineState::Created),
            ("running", MachineState::Running),
            ("stopped", MachineState::Stopped),
            ("failed", MachineState::Failed),
            ("Running", MachineState::Running),
            ("error", MachineState::Failed),
            ("pausing", MachineState::Unknown),
        ] {
            assert_eq!(state_from_word(word), state, "{word}");
        }
        for state in [
            MachineState::Created,
            MachineState::Running,
            MachineState::Stopped,
            MachineState::Failed,
        ] {
            assert_eq!(state_from_word(state_word(state)), state);
        }
        // smolvm's own word is kept verbatim, a word this protocol does not know included.
        let raw = serde_json::json!({"name": "m1", "state": "pausing"});
        let machine = machine_from_json(raw).expect("a machine");
        assert_eq!(
            (machine.state, machine.runtime_state()),
            (MachineState::Unknown, "pausing".to_string())
        );
        let mut double = machine.clone();
        double.raw = serde_json::Value::Null;
        double.state = MachineState::Running;
        assert_eq!(double.runtime_state(), "running");
    }

    #[test]
    fn reads_observed_machine() {
        let body = r#"{"diskChainDepth":1,"name":"m4","image":"local-dir:/tmp/x/images/mini","state":"created","cpus":1,"memoryMb":512,"mounts":[],"ports":[{"host":18081,"guest":80},{"host":18095,"guest":53,"protocol":"udp"}],"network":false,"gpu":false,"cuda":false,"storageGb":21,"overlayGb":10,"blockIo":"sync","diskDurability":"full","branchable":false,"forkable":false,"branchpointHeld":false,"forkpointHeld":false,"diskUsedMb":0,"createdAt":1795305169}"#;
        let machine = parse_machine_bytes(body.as_bytes()).expect("machine");
        assert_eq!(machine.name, "m4");
        assert_eq!(machine.state, MachineState::Created);
        assert_eq!((machine.cpus, machine.memory_mib), (1, 512));
        assert_eq!((machine.storage_gib, machine.overlay_gib), (Some(21), Some(10)));
        assert_eq!(machine.image.as_deref(), Some("local-dir:/tmp/x/images/mini"));
        assert_eq!(
            machine.ports,
            vec![
                PortMapping {
                    host_port: 18081,
                    guest_port: 80,
                    protocol: Protocol::Tcp
                },
                PortMapping {
                    host_port: 18095,
                    guest_port: 53,
                    protocol: Protocol::Udp
                }
            ]
        );
        assert_eq!(machine.raw["diskChainDepth"], 1);

        let started = parse_machine_bytes(br#"{"started":"m4"}"#);
        assert!(started.is_err());
        let bad_port = parse_machine_bytes(br#"{"name":"x","state":"running","ports":[{"host":70000,"guest":80}]}"#);
        assert!(matches!(bad_port, Err(VmmError::Protocol(_))));
    }
}
