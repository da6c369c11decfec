//! Private images on a shared node (SPEC 6, Tenants; as the kubelet's KEP-2535, "ensure secret
//! pulled images").
//!
//! Registry credentials come with each start, but smolvm keeps what it pulled for the whole
//! node: without a check, a tenant with no pull secret could boot another tenant's private image
//! once it is on the node. So the agent remembers, for every image it started with credentials,
//! a keyed digest of those credentials (HMAC-SHA256 under a random key kept on this node; never
//! the credentials), under the image's repository (registry host and path: every tag and every
//! `@sha256:` of it) and the image digests it saw for it. Before a start it decides
//! ([`decide`], pure):
//!
//! - an image never started with credentials here: started as asked;
//! - the same credentials as recorded: started;
//! - other credentials (another tenant's, or the same tenant's rotated secret): started with this
//!   VM's own credentials, which smolvm presents to the registry (smolvm 1.32.2 logs in with each
//!   start's own credentials and fetches the manifest on the host before the boot; it has no
//!   pull-policy switch: `runtime/tests/registry_pull.rs`), and remembered once the start
//!   succeeded;
//! - no credentials: refused with `ImagePullCredentialsRequired`, naming the registry. (smolvm
//!   would otherwise use the registry credentials configured on the node, which are no
//!   tenant's, or whatever it keeps of the image.)
//!
//! smolvm does not report an image's digest on the host (its machine record carries the
//! reference only; `GET /machines/{id}/images` needs a running guest), so records are keyed by
//! the normalized repository, which covers every tag and digest of it; digests named by a
//! reference (`@sha256:`) are kept too, so a pinned digest matches whatever repository recorded
//! it.
//!
//! The record lives in one JSON file in the agent's state directory, written whole to a new
//! file and renamed into place (owner-only), beside the per-node key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use smolvm_api::nodeapi::RegistryAuth;
use smolvm_api::syntax::{ImageRef, normalize_registry_host, parse_image};

/// Most credential digests kept per repository (the newest; an older one then needs the start
/// with it to be verified again, as any other credential).
pub const MAX_CREDENTIALS_PER_IMAGE: usize = 16;
/// Most image digests kept per repository (the newest).
pub const MAX_DIGESTS_PER_IMAGE: usize = 64;

/// An image reference reduced to what records are matched by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageKey {
    /// Registry host, lower case, Docker Hub's aliases as `docker.io`.
    pub registry: String,
    /// `registry/path`, with Docker Hub's `library/` for one-segment names.
    pub repository: String,
    /// The digest the reference pins (`sha256:…`), if any.
    pub digest: Option<String>,
}

/// The key of an OCI reference; `None` for the node's local images (never pulled) and for what
/// does not parse (smolvm refuses it at create).
pub fn image_key(reference: &str) -> Option<ImageKey> {
    if reference.starts_with("local-dir:") {
        return None;
    }
    match parse_image(reference).ok()? {
        ImageRef::Local(_) => None,
        ImageRef::Oci {
            domain, path, digest, ..
        } => {
            let registry = normalize_registry_host(domain.unwrap_or("docker.io"));
            let path = if domain.is_none() && !path.contains('/') {
                format!("library/{path}")
            } else {
                path.to_string()
            };
            Some(ImageKey {
                repository: format!("{registry}/{path}"),
                registry,
                digest: digest.map(str::to_ascii_lowercase),
            })
        }
    }
}

/// What the agent keeps of one repository started with credentials.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// Keyed digests (hex) of the credentials it was started with, oldest first.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Image digests seen for it (`sha256:…`), oldest first.
    #[serde(default)]
    pub digests: Vec<String>,
}

/// Every record, by repository (`registry/path`).
pub type ImageRecords = BTreeMap<String, ImageRecord>;

/// What a start of an image may do, given what the node remembers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullDecision {
    /// Never started with credentials on this node (or a local image): started as asked.
    Start,
    /// Started before with the credentials this start presents: started.
    Verified,
    /// Started before with other credentials: the start goes to smolvm with this VM's own
    /// credentials, for the registry to judge, and they are remembered once it succeeded.
    PullAgain,
    /// Started before with credentials, and this start presents none for `registry`.
    CredentialsRequired {
        /// The image's registry host.
        registry: String,
    },
}

/// Pure: the decision for a start of `reference` (whose digest is `resolved` when known),
/// against `records`, presenting credentials whose keyed digest is `presented` (`None`: the
/// start carries no credentials for the image's registry).
pub fn decide(
    reference: &str,
    resolved: Option<&str>,
    records: &ImageRecords,
    presented: Option<&str>,
) -> PullDecision {
    let Some(key) = image_key(reference) else {
        return PullDecision::Start;
    };
    let digests: Vec<String> = key
        .digest
        .iter()
        .cloned()
        .chain(resolved.map(str::to_ascii_lowercase))
        .collect();
    let matching: Vec<&ImageRecord> = records
        .iter()
        .filter(|(repository, record)| {
            **repository == key.repository || record.digests.iter().any(|d| digests.contains(d))
        })
        .map(|(_, record)| record)
        .collect();
    if matching.is_empty() {
        return PullDecision::Start;
    }
    match presented {
        None => PullDecision::CredentialsRequired { registry: key.registry },
        // Verified only when every matching record knows these credentials: a digest pinned by
        // another repository's private pull is that tenant's too.
        Some(presented) if matching.iter().all(|r| r.credentials.iter().any(|c| c == presented)) => {
            PullDecision::Verified
        }
        Some(_) => PullDecision::PullAgain,
    }
}

/// Pure: `records` once `reference` started with credentials whose keyed digest is `presented`
/// (the image's `resolved` digest when known). Returns whether anything changed.
pub fn remember(records: &mut ImageRecords, reference: &str, resolved: Option<&str>, presented: &str) -> bool {
    let Some(key) = image_key(reference) else {
        return false;
    };
    let record = records.entry(key.repository).or_default();
    let mut changed = push_newest(&mut record.credentials, presented, MAX_CREDENTIALS_PER_IMAGE);
    for digest in key.digest.into_iter().chain(resolved.map(str::to_ascii_lowercase)) {
        changed |= push_newest(&mut record.digests, &digest, MAX_DIGESTS_PER_IMAGE);
    }
    changed
}

/// Moves `value` to the end of `list` (adding it when absent), keeping at most `max` entries.
fn push_newest(list: &mut Vec<String>, value: &str, max: usize) -> bool {
    if list.last().is_some_and(|last| last == value) {
        return false;
    }
    list.retain(|v| v != value);
    list.push(value.to_string());
    if list.len() > max {
        let extra = list.len() - max;
        list.drain(..extra);
    }
    true
}

/// The node's image records on disk, and the key that digests credentials.
pub struct ImageGuard {
    dir: PathBuf,
    key: ring::hmac::Key,
    records: Mutex<ImageRecords>,
}

impl std::fmt::Debug for ImageGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageGuard")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

const RECORDS_FILE: &str = "records.json";
const KEY_FILE: &str = "credential-key";

impl ImageGuard {
    /// Opens the records in `dir` (created when missing, with a new random key). A records file
    /// that cannot be read is an error: forgetting it would let any tenant start the images it
    /// protects.
    pub fn open(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        let key_path = dir.join(KEY_FILE);
        let secret = match std::fs::read(&key_path) {
            Ok(bytes) if bytes.len() == 32 => bytes,
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{} is not a 32-byte key", key_path.display()),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = vec![0u8; 32];
                ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
                    .map_err(|_| std::io::Error::other("no random bytes for the credential key"))?;
                crate::state_files::write_private(&key_path, &bytes)?;
                bytes
            }
            Err(e) => return Err(e),
        };
        let records = match std::fs::read(dir.join(RECORDS_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", dir.join(RECORDS_FILE).display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ImageRecords::new(),
            Err(e) => return Err(e),
        };
        Ok(Self {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            dir,
            records: Mutex::new(records),
        })
    }

    /// The keyed digest (hex) of `auth` for the registry of `reference`: equal for the same
    /// registry, user and password on this node, and nothing else; it never reveals them.
    pub fn credential_digest(&self, reference: &str, auth: &RegistryAuth) -> String {
        let registry = image_key(reference).map(|k| k.registry).unwrap_or_default();
        let mut context = ring::hmac::Context::with_key(&self.key);
        for part in [registry.as_str(), auth.username.expose(), auth.password.expose()] {
            context.update(&(part.len() as u64).to_be_bytes());
            context.update(part.as_bytes());
        }
        context.sign().as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The decision for a start of `reference` with `auth` ([`decide`]).
    pub fn check(&self, reference: &str, auth: Option<&RegistryAuth>) -> PullDecision {
        let presented = auth.map(|a| self.credential_digest(reference, a));
        let records = self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        decide(reference, None, &records, presented.as_deref())
    }

    /// Remembers that `reference` started with `auth`, and writes the records when they changed.
    pub fn remember(&self, reference: &str, auth: &RegistryAuth) -> std::io::Result<()> {
        let presented = self.credential_digest(reference, auth);
        let mut records = self.records.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if remember(&mut records, reference, None, &presented) {
            let bytes = serde_json::to_vec_pretty(&*records).map_err(std::io::Error::other)?;
            crate::state_files::write_private(&self.dir.join(RECORDS_FILE), &bytes)?;
        }
        Ok(())
    }

    /// The records now (for tests and diagnostics: digests only).
    pub fn records(&self) -> ImageRecords {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use smolvm_api::nodeapi::Sensitive;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    #[test]
    fn references_reduce_to_their_repository() {
        let check = |reference: &str, expected: Option<(&str, &str, Option<&str>)>| {
            let got = image_key(reference);
            let got = got
                .as_ref()
                .map(|k| (k.registry.as_str(), k.repository.as_str(), k.digest.as_deref()));
            assert_eq!(got, expected, "{reference}");
        };
        check("alpine", Some(("docker.io", "docker.io/library/alpine", None)));
        check("alpine:3", Some(("docker.io", "docker.io/library/alpine", None)));
        check(
            "docker.io/library/alpine:3",
            Some(("docker.io", "docker.io/library/alpine", None)),
        );
        check(
            "index.docker.io/library/alpine",
            Some(("docker.io", "docker.io/library/alpine", None)),
        );
        check(
            "Registry.Example.com/team/app:v1",
            Some(("registry.example.com", "registry.example.com/team/app", None)),
        );
        check(
            &format!("registry.example.com/team/app:v1@{D1}"),
            Some(("registry.example.com", "registry.example.com/team/app", Some(D1))),
        );
        check("local:tiny", None);
        check("local-dir:/var/lib/smolvm/images/tiny", None);
        check("", None);
    }

    fn records() -> ImageRecords {
        [
            (
                "registry.example.com/team-a/app".to_string(),
                ImageRecord {
                    credentials: vec!["cred-a".into(), "cred-a-rotated".into()],
                    digests: vec![D1.into()],
                },
            ),
            (
                "docker.io/team-b/tool".to_string(),
                ImageRecord {
                    credentials: vec!["cred-b".into()],
                    digests: vec![],
                },
            ),
        ]
        .into()
    }

    /// The decision table: (reference, resolved digest, presented credential digest) against
    /// the records above.
    #[test]
    fn the_decision_table() {
        use PullDecision::*;
        let required = |registry: &str| CredentialsRequired {
            registry: registry.to_string(),
        };
        let pinned_a = format!("registry.example.com/team-a/app@{D1}");
        let mirror_of_a = format!("mirror.example.net/copy/app@{D1}");
        let cases: Vec<(&str, Option<&str>, Option<&str>, PullDecision)> = vec![
            // Never started with credentials here: as asked, with or without credentials.
            ("alpine:3", None, None, Start),
            ("alpine:3", None, Some("cred-x"), Start),
            ("registry.example.com/team-c/app:1", None, None, Start),
            ("local:tiny", None, None, Start),
            ("local-dir:/images/tiny", None, None, Start),
            // The credentials it was started with (either recorded one): verified.
            ("registry.example.com/team-a/app:1", None, Some("cred-a"), Verified),
            (
                "registry.example.com/team-a/app:1",
                None,
                Some("cred-a-rotated"),
                Verified,
            ),
            // Every tag and digest of the repository is covered, whatever the spelling.
            (
                "registry.example.com/team-a/app:other-tag",
                None,
                Some("cred-a"),
                Verified,
            ),
            (
                "REGISTRY.example.com/team-a/app",
                None,
                None,
                required("registry.example.com"),
            ),
            (pinned_a.as_str(), None, None, required("registry.example.com")),
            ("team-b/tool:latest", None, None, required("docker.io")),
            ("index.docker.io/team-b/tool", None, Some("cred-b"), Verified),
            // Other credentials (another tenant's, a rotated secret): pulled again with them.
            ("registry.example.com/team-a/app:1", None, Some("cred-b"), PullAgain),
            ("docker.io/team-b/tool", None, Some("cred-a"), PullAgain),
            // No credentials: refused, naming the registry.
            (
                "registry.example.com/team-a/app:1",
                None,
                None,
                required("registry.example.com"),
            ),
            // A digest a private pull recorded, reached through another repository's name.
            (mirror_of_a.as_str(), None, None, required("mirror.example.net")),
            (mirror_of_a.as_str(), None, Some("cred-a"), Verified),
            (mirror_of_a.as_str(), None, Some("cred-m"), PullAgain),
            // A digest the runtime resolved the reference to.
            (
                "mirror.example.net/copy/app:1",
                Some(D1),
                None,
                required("mirror.example.net"),
            ),
            ("mirror.example.net/copy/app:1", Some(D2), None, Start),
        ];
        let records = records();
        for (reference, resolved, presented, expected) in cases {
            assert_eq!(
                decide(reference, resolved, &records, presented),
                expected,
                "{reference} resolved {resolved:?} presenting {presented:?}"
            );
        }
    }

    #[test]
    fn remembering_keeps_the_newest_and_reports_changes() {
        let mut records = ImageRecords::new();
        assert!(remember(&mut records, "registry.example.com/t/app:1", None, "c1"));
        assert!(!remember(&mut records, "registry.example.com/t/app:2", None, "c1"));
        assert!(remember(
            &mut records,
            &format!("registry.example.com/t/app@{D1}"),
            None,
            "c1"
        ));
        assert!(!remember(&mut records, "local:tiny", None, "c1"));
        assert_eq!(
            records["registry.example.com/t/app"],
            ImageRecord {
                credentials: vec!["c1".into()],
                digests: vec![D1.into()],
            }
        );
        for i in 0..(MAX_CREDENTIALS_PER_IMAGE + 3) {
            remember(&mut records, "registry.example.com/t/app", None, &format!("r{i}"));
        }
        let kept = &records["registry.example.com/t/app"].credentials;
        assert_eq!(kept.len(), MAX_CREDENTIALS_PER_IMAGE);
        assert_eq!(kept.last().map(String::as_str), Some("r18"));
        // Used again, an old credential becomes the newest rather than a duplicate.
        assert!(remember(&mut records, "registry.example.com/t/app", None, "r5"));
        let kept = &records["registry.example.com/t/app"].credentials;
        assert_eq!(kept.iter().filter(|c| *c == "r5").count(), 1);
        assert_eq!(kept.last().map(String::as_str), Some("r5"));
    }

    fn auth(user: &str, password: &str) -> RegistryAuth {
        RegistryAuth {
            username: Sensitive(user.into()),
            password: Sensitive(password.into()),
        }
    }

    #[test]
    fn records_persist_as_keyed_digests_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("images");
        let guard = ImageGuard::open(&path).expect("opens");
        let image = "registry.example.com/t/app:1";
        let alice = auth("alice", "pa55-alice-Q7");
        assert_eq!(guard.check(image, Some(&alice)), PullDecision::Start);
        guard.remember(image, &alice).expect("remembers");
        assert_eq!(guard.check(image, Some(&alice)), PullDecision::Verified);
        assert_eq!(
            guard.check(image, Some(&auth("alice", "other"))),
            PullDecision::PullAgain
        );
        assert_eq!(
            guard.check(image, None),
            PullDecision::CredentialsRequired {
                registry: "registry.example.com".into()
            }
        );
        // The same credentials for another registry are other credentials.
        assert_ne!(
            guard.credential_digest(image, &alice),
            guard.credential_digest("other.example.com/t/app:1", &alice)
        );
        // Kept across restarts, with the same key; another node's key digests differently.
        let again = ImageGuard::open(&path).expect("reopens");
        assert_eq!(again.records(), guard.records());
        assert_eq!(again.check(image, Some(&alice)), PullDecision::Verified);
        let elsewhere = ImageGuard::open(dir.path().join("other-node")).expect("opens");
        assert_ne!(
            elsewhere.credential_digest(image, &alice),
            guard.credential_digest(image, &alice)
        );
        // Owner-only files, and no credential in them.
        for name in [RECORDS_FILE, KEY_FILE] {
            let file = path.join(name);
            let mode = std::fs::metadata(&file)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
                .expect("metadata");
            assert_eq!(mode, 0o600, "{name}");
            let bytes = std::fs::read(&file).expect("read");
            assert!(memchr_find(&bytes, b"pa55-alice-Q7").is_none(), "{name}");
            assert!(memchr_find(&bytes, b"alice").is_none(), "{name}");
        }
        // A records file that cannot be read is an error, never an empty record.
        std::fs::write(path.join(RECORDS_FILE), b"{not json").expect("write");
        assert!(ImageGuard::open(&path).is_err());
    }

    fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }
}
