//! The agent's record of a machine's volumes: which holder Pod serves them, the digest of that
//! holder's release token, each volume's directory, guest path and read-only flag, and whether
//! the holder released them. One small file per machine in the state directory
//! ([`crate::state_files::Records`]), so that an agent that restarted (and lost its mount
//! namespace, and with it every bind) binds them again before a start, and the release hook
//! finds the machines a token holds.

use serde::{Deserialize, Serialize};
use smolvm_api::nodeapi::VolumeMounts;

/// What the agent records of one machine's volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRecord {
    /// The holder Pod whose volumes the machine's stable mount points show.
    pub holder_uid: String,
    /// The SmolVM's namespace, which the holder's identity names.
    pub namespace: String,
    /// SHA-256 (hex) of the holder's release token; the token itself is never kept.
    pub token_sha256: String,
    /// Each volume, in the order smolvm was given them.
    pub mounts: Vec<RecordedMount>,
    /// The holder's release hook ran: the machine was stopped and its binds undone; no start
    /// until a BindVolumes (to the next holder) binds them again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

/// One volume of a [`VolumeRecord`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedMount {
    /// The volume's name (its stable mount point's name).
    pub name: String,
    /// The kubelet's directory of the volume in the holder.
    pub directory: String,
    /// Where the guest sees it.
    pub target: String,
    /// Read-only for the guest (and bound read-only on the host).
    pub read_only: bool,
}

impl VolumeRecord {
    /// The record of a request (its token digested), not released.
    pub fn of(request: &VolumeMounts) -> Self {
        Self {
            holder_uid: request.holder_uid.clone(),
            namespace: request.namespace.clone(),
            token_sha256: token_digest(request.release_token.expose().as_bytes()),
            mounts: request
                .mounts
                .iter()
                .map(|m| RecordedMount {
                    name: m.name.clone(),
                    directory: m.directory.clone(),
                    target: m.target.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            released: false,
        }
    }
}

/// The SHA-256 of a release token, hex: all the agent keeps of it.
pub fn token_digest(token: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `presented` is the token whose digest is `recorded`, compared in constant time.
pub fn token_matches(recorded: &str, presented: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    let presented = token_digest(presented);
    recorded.len() == presented.len() && bool::from(recorded.as_bytes().ct_eq(presented.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_files::Records;
    use smolvm_api::nodeapi::{Sensitive, VolumeMount};

    #[test]
    fn the_record_keeps_a_digest_never_the_token() {
        let token = "f".repeat(64);
        let request = VolumeMounts {
            holder_uid: "u1".into(),
            namespace: "ns".into(),
            release_token: Sensitive(token.clone()),
            mounts: vec![VolumeMount {
                name: "data".into(),
                directory: "pv-1".into(),
                target: "/data".into(),
                read_only: true,
            }],
        };
        let record = VolumeRecord::of(&request);
        let dir = tempfile::tempdir().expect("tempdir");
        let records: Records<VolumeRecord> = Records::in_dir(dir.path());
        records.write("svm-a", &record).expect("write");
        let text = std::fs::read_to_string(dir.path().join("svm-a.json")).expect("read");
        assert!(!text.contains(&token), "{text}");
        assert!(
            !text.contains("released"),
            "a record not released says nothing of it: {text}"
        );
        assert_eq!(records.read("svm-a"), Some(record.clone()));
        let released = VolumeRecord {
            released: true,
            ..record
        };
        records.write("svm-a", &released).expect("write");
        assert_eq!(records.read("svm-a"), Some(released));
    }
}
