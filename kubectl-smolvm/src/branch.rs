//! `kubectl smolvm branch` and `kubectl smolvm get-branches` (SPEC 2.6): branches of a running
//! branchable SmolVM, which are SmolVMs naming it in `spec.branchOf`, made and listed.
//!
//! `branch` reads the source and refuses one that is not branchable before it creates anything;
//! then it creates the branches at once (`metadata.generateName`, so each gets a name of its
//! own) and waits until each is Running. It lists the source's branches (the webhook labels each
//! `vm.smolvm.dev/branch-of: SOURCE`) and watches them from that list, so that the moment a
//! branch is seen Running is the moment the API server tells of it; where the server refuses the
//! watch, or a branch is not in the list, it lists again every `--poll-interval` instead. TOOK
//! is measured here, from a branch's create request to that moment. The command never deletes
//! what it created, whatever happens.
//!
//! `get-branches` lists the SmolVMs with that label, as kubectl lists objects.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{DynamicObject, WatchEvent};
use serde_json::{Value, json};
use smolvm_api::Phase;
use smolvm_api::constants::{LABEL_BRANCH_OF, condition};
use tokio::time::Instant;

use crate::cli::{BranchArgs, EnvVar, GetBranchesArgs, GlobalArgs};
use crate::client::{Cluster, smolvm_resource};
use crate::duration;
use crate::error::{Error, clean};
use crate::paths::check_name;
use crate::table::{self, NONE};

/// The longest name of an env variable a SmolVM takes (rule V11).
pub const MAX_ENV_NAME_BYTES: usize = 256;

/// The longest value of an env variable a SmolVM takes (rule V11; a policy may allow less).
pub const MAX_ENV_VALUE_BYTES: usize = smolvm_api::MAX_VALUE_BYTES as usize;

/// The longest `--name` prefix: the API server adds `-` and five characters to it, and a name
/// is at most 253.
pub const MAX_PREFIX_BYTES: usize = 253 - 6;

/// The longest a watch request asks the server to stay open, in seconds (kube's default).
const MAX_WATCH_SECS: u64 = 290;

/// The table `branch` prints; the last two columns only when a branch did not run.
const BRANCH_HEADER: [&str; 5] = ["NAME", "PHASE", "TOOK", "REASON", "MESSAGE"];

/// The table `get-branches` prints.
const GET_BRANCHES_HEADER: [&str; 5] = ["NAME", "PHASE", "NODE", "READY", "AGE"];

/// The label selector of `source`'s branches: `vm.smolvm.dev/branch-of=SOURCE`.
pub fn branch_selector(source: &str) -> String {
    format!("{LABEL_BRANCH_OF}={source}")
}

/// Checks the `--env` variables as admission will (rule V11), so that none is refused after
/// some branches were made: names at most [`MAX_ENV_NAME_BYTES`] and given once, values at most
/// [`MAX_ENV_VALUE_BYTES`]. (Names are not empty and have no `=`: `KEY=VALUE` parses so.)
pub fn check_env(env: &[EnvVar]) -> Result<(), Error> {
    for (i, var) in env.iter().enumerate() {
        if var.name.len() > MAX_ENV_NAME_BYTES {
            return Err(Error::InvalidArgument(format!(
                "--env {:?}: the name is {} bytes, more than the {MAX_ENV_NAME_BYTES} a SmolVM takes",
                clean(&var.name),
                var.name.len()
            )));
        }
        if var.value.len() > MAX_ENV_VALUE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "--env {}: the value is {} bytes, more than the {MAX_ENV_VALUE_BYTES} a SmolVM takes",
                clean(&var.name),
                var.value.len()
            )));
        }
        if env[..i].iter().any(|earlier| earlier.name == var.name) {
            return Err(Error::InvalidArgument(format!(
                "--env {} is given twice: give each name once",
                clean(&var.name)
            )));
        }
    }
    Ok(())
}

/// Checks a `--name` prefix: a SmolVM name itself, short enough for the five characters the
/// server adds.
pub fn check_prefix(prefix: &str) -> Result<(), Error> {
    check_name(prefix).map_err(|_| {
        Error::InvalidArgument(format!(
            "invalid --name {prefix:?}: the branches' names start with it, so it is lower-case letters, digits, '-' and '.' \
             (a DNS-1123 subdomain)"
        ))
    })?;
    if prefix.len() > MAX_PREFIX_BYTES {
        return Err(Error::InvalidArgument(format!(
            "--name is {} characters: at most {MAX_PREFIX_BYTES}, so that the name with the five characters the server adds \
             stays within 253",
            prefix.len()
        )));
    }
    Ok(())
}

/// The SmolVM `branch` creates: named `PREFIX-xxxxx` by the server, a branch of `source` with
/// `env` (left out when empty); the webhook fills the rest from the source.
pub fn branch_object(source: &str, prefix: &str, env: &[EnvVar]) -> DynamicObject {
    let mut spec = json!({ "branchOf": { "name": source } });
    if !env.is_empty() {
        spec["env"] = json!(env);
    }
    let mut smolvm = DynamicObject::new("", &smolvm_resource()).data(json!({ "spec": spec }));
    smolvm.metadata.name = None;
    smolvm.metadata.generate_name = Some(format!("{prefix}-"));
    smolvm
}

/// Whether a SmolVM is a branch source: `spec.branchable` is `true`.
pub fn is_branchable(smolvm: &DynamicObject) -> bool {
    smolvm.data.pointer("/spec/branchable").and_then(Value::as_bool) == Some(true)
}

/// What a SmolVM's status says of it: its phase and its Ready condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.nodeName`.
    pub node: Option<String>,
    /// The Ready condition's reason.
    pub reason: Option<String>,
    /// The Ready condition's message.
    pub message: Option<String>,
}

impl Seen {
    /// Reads the status of `smolvm`; a part that is absent or not text is `None`.
    pub fn of(smolvm: &DynamicObject) -> Self {
        let status = smolvm.data.get("status");
        let text = |value: Option<&Value>| {
            value
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let ready = status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|all| {
                all.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(condition::READY))
            });
        Seen {
            phase: text(status.and_then(|s| s.get("phase"))),
            node: text(status.and_then(|s| s.get("nodeName"))),
            reason: text(ready.and_then(|c| c.get("reason"))),
            message: text(ready.and_then(|c| c.get("message"))),
        }
    }
}

/// Where a branch the command created stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Not Running yet, as last seen.
    Waiting(Seen),
    /// Seen Running, this long after its create request was sent.
    Running(Duration),
    /// Seen with phase Failed.
    Failed(Seen),
    /// Deleted (or being deleted) before it was seen Running.
    Deleted,
}

/// A branch the command created, and what it has seen of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracked {
    /// Its name, as the server generated it.
    pub name: String,
    /// When its create request was sent.
    pub sent: Instant,
    /// Where it stands.
    pub state: State,
}

impl Tracked {
    /// A branch just created, not yet seen.
    pub fn new(name: String, sent: Instant) -> Self {
        Tracked {
            name,
            sent,
            state: State::Waiting(Seen::default()),
        }
    }

    /// Whether nothing more is waited for: it runs, failed or is gone.
    pub fn settled(&self) -> bool {
        !matches!(self.state, State::Waiting(_))
    }

    /// Takes in the SmolVM as seen `at`; nothing changes once it is settled.
    pub fn observe(&mut self, smolvm: &DynamicObject, at: Instant) {
        if self.settled() {
            return;
        }
        if smolvm.metadata.deletion_timestamp.is_some() {
            self.state = State::Deleted;
            return;
        }
        let seen = Seen::of(smolvm);
        self.state = match seen.phase.as_deref() {
            Some(phase) if phase == Phase::Running.as_str() => State::Running(at.saturating_duration_since(self.sent)),
            Some(phase) if phase == Phase::Failed.as_str() => State::Failed(seen),
            _ => State::Waiting(seen),
        };
    }

    /// Takes in that it was deleted; nothing changes once it runs or failed.
    pub fn deleted(&mut self) {
        if !self.settled() {
            self.state = State::Deleted;
        }
    }

    /// Its row of the `branch` table: NAME, PHASE, TOOK, REASON, MESSAGE.
    pub fn row(&self) -> Vec<String> {
        let name = clean(&self.name);
        let cell = |value: &Option<String>| value.as_deref().map(clean).unwrap_or_else(|| NONE.to_string());
        match &self.state {
            State::Running(took) => vec![name, Phase::Running.as_str().into(), took_cell(*took)],
            State::Failed(seen) => vec![
                name,
                cell(&seen.phase),
                "-".into(),
                cell(&seen.reason),
                cell(&seen.message),
            ],
            State::Waiting(seen) if *seen == Seen::default() => vec![
                name,
                NONE.into(),
                "-".into(),
                NONE.into(),
                "no status yet: the controller has not taken it up".into(),
            ],
            State::Waiting(seen) => vec![
                name,
                cell(&seen.phase),
                "-".into(),
                cell(&seen.reason),
                cell(&seen.message),
            ],
            State::Deleted => vec![
                name,
                "Deleted".into(),
                "-".into(),
                "Deleted".into(),
                "deleted before it was seen Running".into(),
            ],
        }
    }
}

/// TOOK: whole milliseconds, `412 ms`.
pub fn took_cell(took: Duration) -> String {
    format!("{} ms", took.as_millis())
}

/// The `branch` table of `branches` in the order they were created; REASON and MESSAGE only
/// when one of them did not run.
pub fn branch_table(branches: &[Tracked]) -> String {
    let rows: Vec<Vec<String>> = branches.iter().map(Tracked::row).collect();
    let all_run = branches.iter().all(|b| matches!(b.state, State::Running(_)));
    let columns = if all_run { 3 } else { BRANCH_HEADER.len() };
    table::render(&BRANCH_HEADER[..columns], &rows)
}

/// A row of the `get-branches` table for `smolvm` at `now`: NAME, PHASE, NODE, READY, AGE.
pub fn get_branches_row(smolvm: &DynamicObject, now: jiff::Timestamp) -> Vec<String> {
    let seen = Seen::of(smolvm);
    let cell = |value: Option<&str>| value.map(clean).unwrap_or_else(|| NONE.to_string());
    let created = smolvm.metadata.creation_timestamp.as_ref().map(|t| t.0);
    vec![
        cell(smolvm.metadata.name.as_deref()),
        cell(seen.phase.as_deref()),
        cell(seen.node.as_deref()),
        cell(seen.reason.as_deref()),
        table::age(created, now),
    ]
}

/// The `get-branches` table of `smolvms`, sorted by name.
pub fn get_branches_table(smolvms: &[DynamicObject], now: jiff::Timestamp) -> String {
    let mut rows: Vec<Vec<String>> = smolvms.iter().map(|s| get_branches_row(s, now)).collect();
    rows.sort();
    table::render(&GET_BRANCHES_HEADER, &rows)
}

/// `kubectl smolvm branch`: the exit code is 0 when every branch runs.
pub async fn run(global: &GlobalArgs, args: &BranchArgs) -> Result<u8, Error> {
    check_name(&args.source)?;
    let prefix = args.prefix.as_deref().unwrap_or(&args.source);
    check_prefix(prefix)?;
    check_env(&args.env)?;
    if args.timeout.is_zero() || args.poll_interval.is_zero() {
        return Err(Error::InvalidArgument(
            "--timeout and --poll-interval must be more than zero (for example 2m and 200ms)".into(),
        ));
    }
    let cluster = Cluster::connect(global).await?;
    let namespace = cluster.namespace().to_string();
    let source = cluster.get_smolvm(&args.source).await?;
    if !is_branchable(&source) {
        return Err(Error::NotBranchable {
            namespace,
            name: args.source.clone(),
        });
    }
    let source_phase = Seen::of(&source).phase;
    if source_phase.as_deref() != Some(Phase::Running.as_str()) {
        eprintln!(
            "note: SmolVM {namespace}/{} is not running (phase {}): its branches wait (BranchPending) until it runs",
            args.source,
            source_phase.as_deref().map(clean).unwrap_or_else(|| NONE.to_string())
        );
    }

    let started = Instant::now();
    let deadline = started + args.timeout;
    let object = branch_object(&args.source, prefix, &args.env);
    let creates = (0..args.count).map(|_| async {
        let sent = Instant::now();
        (sent, cluster.create_smolvm(&object).await)
    });
    let mut branches = Vec::new();
    let mut refusals = Vec::new();
    for (sent, created) in futures::future::join_all(creates).await {
        match created.and_then(|smolvm| {
            smolvm
                .metadata
                .name
                .ok_or_else(|| Error::UnexpectedResponse("the created SmolVM has no metadata.name".into()))
        }) {
            Ok(name) => branches.push(Tracked::new(name, sent)),
            Err(err) => refusals.push(err),
        }
    }
    if branches.is_empty() {
        // Every create was refused, most likely for the same reason: that reason, as is.
        return Err(refusals
            .into_iter()
            .next()
            .unwrap_or_else(|| Error::UnexpectedResponse("no branch was created and the server said nothing".into())));
    }

    if let Err(err) = wait(&cluster, &args.source, &mut branches, deadline, args.poll_interval).await {
        let names: Vec<&str> = branches.iter().map(|b| b.name.as_str()).collect();
        eprintln!(
            "note: created {} (left in place), then could not see them run:",
            clean(&names.join(", "))
        );
        return Err(err);
    }
    table::print(&branch_table(&branches))?;

    let failed = branches
        .iter()
        .filter(|b| matches!(b.state, State::Failed(_) | State::Deleted))
        .count();
    let waiting = branches.iter().filter(|b| !b.settled()).count();
    if failed + waiting + refusals.len() == 0 {
        return Ok(0);
    }
    Err(Error::BranchesNotRunning {
        namespace,
        source_name: args.source.clone(),
        asked: usize::try_from(args.count).unwrap_or(usize::MAX),
        failed,
        waiting,
        timeout: args.timeout,
        refused: refusals.len(),
        refusal: refusals.first().map(Error::render),
    })
}

/// `kubectl smolvm get-branches`.
pub async fn list(global: &GlobalArgs, args: &GetBranchesArgs) -> Result<(), Error> {
    check_name(&args.source)?;
    let cluster = Cluster::connect(global).await?;
    let branches = cluster.list_smolvms(&branch_selector(&args.source)).await?;
    if branches.items.is_empty() {
        // As kubectl's "No resources found": on stderr, so that stdout stays a table or nothing.
        eprintln!("No branches of {} in namespace {}.", args.source, cluster.namespace());
        return Ok(());
    }
    table::print(&get_branches_table(&branches.items, jiff::Timestamp::now()))
}

/// Waits until every branch is settled, or `deadline` passes (with one last look then). An
/// error is one that waiting longer would not mend (a refused list, say); the server failing
/// for a moment is waited out.
async fn wait(
    cluster: &Cluster,
    source: &str,
    branches: &mut [Tracked],
    deadline: Instant,
    poll: Duration,
) -> Result<(), Error> {
    let selector = branch_selector(source);
    let mut may_watch = true;
    loop {
        let list = match cluster.list_smolvms(&selector).await {
            Ok(list) => list,
            Err(err) if is_passing(&err) && Instant::now() < deadline => {
                tokio::time::sleep_until(deadline.min(Instant::now() + poll)).await;
                continue;
            }
            Err(err) => return Err(err),
        };
        let at = Instant::now();
        let mut all_listed = true;
        for branch in branches.iter_mut().filter(|b| !b.settled()) {
            match list
                .items
                .iter()
                .find(|s| s.metadata.name.as_deref() == Some(&branch.name))
            {
                Some(smolvm) => branch.observe(smolvm, at),
                None => {
                    // Not labelled as a branch of the source (yet), or deleted: read it itself.
                    all_listed = false;
                    look_up(cluster, branch).await?;
                }
            }
        }
        if branches.iter().all(Tracked::settled) || Instant::now() >= deadline {
            return Ok(());
        }
        let version = list.metadata.resource_version.as_deref().unwrap_or("");
        if may_watch && all_listed && !version.is_empty() {
            may_watch = follow(cluster, &selector, version, branches, deadline).await;
            if branches.iter().all(Tracked::settled) {
                return Ok(());
            }
        }
        tokio::time::sleep_until(deadline.min(Instant::now() + poll)).await;
    }
}

/// Reads one branch by name: `404` means it was deleted; a passing failure is left to the next
/// look.
async fn look_up(cluster: &Cluster, branch: &mut Tracked) -> Result<(), Error> {
    match cluster.get_smolvm(&branch.name).await {
        Ok(smolvm) => branch.observe(&smolvm, Instant::now()),
        Err(Error::Api(status)) if status.code == 404 => branch.deleted(),
        Err(err) if is_passing(&err) => {}
        Err(err) => return Err(err),
    }
    Ok(())
}

/// Follows the branches' changes from the list at `version` until all are settled, `deadline`
/// passes, or the watch ends (the server closes it, it breaks, or its version expired: the
/// caller lists again). Returns whether the server lets this command watch at all.
async fn follow(cluster: &Cluster, selector: &str, version: &str, branches: &mut [Tracked], deadline: Instant) -> bool {
    let left = duration::whole_seconds_up(deadline.saturating_duration_since(Instant::now()));
    let timeout_secs = u32::try_from(left.clamp(1, MAX_WATCH_SECS)).unwrap_or(1);
    let events = match cluster.watch_smolvms(selector, version, timeout_secs).await {
        Ok(events) => events,
        // No `watch` permission (or no watch here): lists from now on.
        Err(Error::Api(status)) if matches!(status.code, 403 | 405) => return false,
        Err(_) => return true,
    };
    let mut events = std::pin::pin!(events);
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, events.next()).await {
        let at = Instant::now();
        let (smolvm, gone) = match event {
            Ok(WatchEvent::Added(smolvm) | WatchEvent::Modified(smolvm)) => (smolvm, false),
            Ok(WatchEvent::Deleted(smolvm)) => (smolvm, true),
            Ok(WatchEvent::Bookmark(_)) => continue,
            // An expired version (410) or a broken stream: the caller lists again.
            Ok(WatchEvent::Error(_)) | Err(_) => return true,
        };
        if let Some(branch) = branches
            .iter_mut()
            .find(|b| smolvm.metadata.name.as_deref() == Some(&b.name))
        {
            if gone {
                branch.deleted();
            } else {
                branch.observe(&smolvm, at);
            }
        }
        if branches.iter().all(Tracked::settled) {
            break;
        }
    }
    true
}

/// Whether an error is the server or the network failing for a moment (no answer, a timeout,
/// 429, 5xx), which waiting may mend.
fn is_passing(err: &Error) -> bool {
    match err {
        Error::Request(_) | Error::Timeout(_) => true,
        Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<EnvVar> {
        pairs
            .iter()
            .map(|(name, value)| EnvVar {
                name: name.to_string(),
                value: value.to_string(),
            })
            .collect()
    }

    fn smolvm(name: &str, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "vm.smolvm.dev/v1alpha1",
            "kind": "SmolVM",
            "metadata": { "name": name, "namespace": "shop", "creationTimestamp": "2025-06-01T12:00:00Z" },
            "spec": { "branchOf": { "name": "base" } },
            "status": status
        }))
        .expect("a SmolVM")
    }

    fn ready(phase: &str, reason: &str, message: &str) -> Value {
        json!({
            "phase": phase,
            "nodeName": "node-a",
            "conditions": [
                { "type": "Scheduled", "status": "True", "reason": "Bound", "message": "on node-a" },
                { "type": "Ready", "status": if phase == "Running" { "True" } else { "False" }, "reason": reason, "message": message }
            ]
        })
    }

    #[test]
    fn the_object_names_the_source_and_carries_the_env() {
        let object = branch_object("base", "worker", &env(&[("ROLE", "worker"), ("EMPTY", "")]));
        assert_eq!(
            serde_json::to_value(&object).expect("JSON"),
            json!({
                "apiVersion": "vm.smolvm.dev/v1alpha1",
                "kind": "SmolVM",
                "metadata": { "generateName": "worker-" },
                "spec": {
                    "branchOf": { "name": "base" },
                    "env": [{ "name": "ROLE", "value": "worker" }, { "name": "EMPTY", "value": "" }]
                }
            })
        );
        let object = branch_object("base", "base", &[]);
        assert_eq!(
            serde_json::to_value(&object).expect("JSON")["spec"],
            json!({ "branchOf": { "name": "base" } }),
            "no env, no env field"
        );
        assert_eq!(branch_selector("base"), "vm.smolvm.dev/branch-of=base");
    }

    #[test]
    fn env_is_checked_as_admission_checks_it() {
        assert!(check_env(&env(&[("A", "1"), ("B", "")])).is_ok());
        assert!(check_env(&[]).is_ok());
        let long_name = "N".repeat(MAX_ENV_NAME_BYTES + 1);
        let long_value = "v".repeat(MAX_ENV_VALUE_BYTES + 1);
        let cases = [
            (
                env(&[("A", "1"), ("A", "2")]),
                "--env A is given twice: give each name once",
            ),
            (env(&[(long_name.as_str(), "")]), "the name is 257 bytes"),
            (env(&[("BIG", long_value.as_str())]), "the value is 32769 bytes"),
        ];
        for (vars, want) in cases {
            let err = check_env(&vars).expect_err("refused");
            assert!(err.to_string().contains(want), "{err}");
            assert_eq!(err.reason(), "InvalidArgument");
        }
    }

    #[test]
    fn prefixes_make_valid_names() {
        for ok in ["base", "worker", "a.b", "x1", &"a".repeat(MAX_PREFIX_BYTES)] {
            assert!(check_prefix(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Worker", "w_1", "-w", "w-", "w.", &"a".repeat(MAX_PREFIX_BYTES + 1)] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_branchable_true_is_a_source() {
        let cases = [
            (json!({ "branchable": true }), true),
            (json!({ "branchable": false }), false),
            (json!({}), false),
            (json!({ "branchable": "true" }), false),
        ];
        for (spec, want) in cases {
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "vm.smolvm.dev/v1alpha1", "kind": "SmolVM",
                "metadata": { "name": "base" }, "spec": spec
            }))
            .expect("a SmolVM");
            assert_eq!(is_branchable(&object), want, "{spec}");
        }
    }

    #[test]
    fn a_branch_settles_once() {
        let sent = Instant::now();
        let mut branch = Tracked::new("base-x7k2p".into(), sent);
        assert!(!branch.settled());
        branch.observe(
            &smolvm("base-x7k2p", ready("Pending", "BranchPending", "waiting for base")),
            sent + Duration::from_millis(100),
        );
        assert_eq!(
            branch.state,
            State::Waiting(Seen {
                phase: Some("Pending".into()),
                node: Some("node-a".into()),
                reason: Some("BranchPending".into()),
                message: Some("waiting for base".into()),
            })
        );
        branch.observe(
            &smolvm("base-x7k2p", ready("Running", "Running", "")),
            sent + Duration::from_millis(412),
        );
        assert_eq!(branch.state, State::Running(Duration::from_millis(412)));
        // Settled: a later Failed, or its deletion, does not change what was seen.
        branch.observe(
            &smolvm("base-x7k2p", ready("Failed", "X", "y")),
            sent + Duration::from_secs(1),
        );
        branch.deleted();
        assert_eq!(branch.state, State::Running(Duration::from_millis(412)));

        let mut failed = Tracked::new("base-9fq3d".into(), sent);
        failed.observe(&smolvm("base-9fq3d", ready("Failed", "CreateFailed", "boom")), sent);
        assert!(matches!(failed.state, State::Failed(_)), "{:?}", failed.state);

        let mut deleting = Tracked::new("base-mm2ta".into(), sent);
        let mut object = smolvm("base-mm2ta", ready("Deleting", "Deleting", ""));
        object.metadata.deletion_timestamp = object.metadata.creation_timestamp.clone();
        deleting.observe(&object, sent);
        assert_eq!(deleting.state, State::Deleted);
    }

    #[test]
    fn the_branch_table_says_why_only_when_needed() {
        let sent = Instant::now();
        let running = |name: &str, millis: u64| Tracked {
            name: name.into(),
            sent,
            state: State::Running(Duration::from_millis(millis)),
        };
        let text = branch_table(&[running("base-x7k2p", 412), running("base-9fq3d", 1_520)]);
        assert_eq!(
            text,
            "NAME         PHASE     TOOK\n\
             base-x7k2p   Running   412 ms\n\
             base-9fq3d   Running   1520 ms\n"
        );

        let mut failed = Tracked::new("base-b2c4d".into(), sent);
        failed.observe(
            &smolvm(
                "base-b2c4d",
                ready("Failed", "CreateFailed", "smolvm: \x1b[31mno\nroom"),
            ),
            sent,
        );
        let mut pending = Tracked::new("base-f5g6h".into(), sent);
        pending.observe(
            &smolvm(
                "base-f5g6h",
                ready("Pending", "BranchPending", "source base is not running"),
            ),
            sent,
        );
        let unseen = Tracked::new("base-j7k8l".into(), sent);
        let mut gone = Tracked::new("base-m9n2p".into(), sent);
        gone.deleted();
        let text = branch_table(&[running("base-x7k2p", 412), failed, pending, unseen, gone]);
        assert_eq!(
            text,
            "NAME         PHASE     TOOK     REASON          MESSAGE\n\
             base-x7k2p   Running   412 ms\n\
             base-b2c4d   Failed    -        CreateFailed    smolvm: no room\n\
             base-f5g6h   Pending   -        BranchPending   source base is not running\n\
             base-j7k8l   <none>    -        <none>          no status yet: the controller has not taken it up\n\
             base-m9n2p   Deleted   -        Deleted         deleted before it was seen Running\n"
        );
    }

    #[test]
    fn the_get_branches_table_is_sorted_by_name() {
        let now: jiff::Timestamp = "2025-06-01T12:05:00Z".parse().expect("a time");
        let mut bare = smolvm("base-aaaaa", json!({}));
        bare.metadata.creation_timestamp = None;
        let items = [
            smolvm("base-zzzzz", ready("Running", "Running", "")),
            bare,
            smolvm("base-mmmmm", ready("Pending", "BranchPending", "waiting")),
        ];
        assert_eq!(
            get_branches_table(&items, now),
            "NAME         PHASE     NODE     READY           AGE\n\
             base-aaaaa   <none>    <none>   <none>          <unknown>\n\
             base-mmmmm   Pending   node-a   BranchPending   5m\n\
             base-zzzzz   Running   node-a   Running         5m\n"
        );
    }

    #[test]
    fn passing_failures_are_waited_out() {
        let status = |code: u16| Error::Api(kube::core::Status::failure("x", "").with_code(code).boxed());
        assert!(is_passing(&Error::Request("connection refused".into())));
        assert!(is_passing(&Error::Timeout(Duration::from_secs(1))));
        assert!(is_passing(&status(503)));
        assert!(is_passing(&status(429)));
        assert!(!is_passing(&status(403)));
        assert!(!is_passing(&status(404)));
        assert!(!is_passing(&Error::InvalidArgument("x".into())));
    }
}
