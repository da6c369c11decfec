//! What the agent sees of each machine's use (SPEC 2.7): bytes through its published ports (the
//! forwarder) and exec, log-follow and copy sessions (the node API), and the wakes that
//! connections to a sleeping machine ask for.
//!
//! Nothing here decides: the agent reports each machine's last activity with its heartbeat
//! ([`Activity::report`], coarse: at most one change per heartbeat, never a write per byte), and
//! a wake at once (the reporter waits on [`Activity::wake_asked`]); the controller suspends and
//! wakes. A machine with a session open counts as active at every report.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// One machine's use: the second of its last activity (Unix time, the agent's clock; 0: none
/// yet) and the sessions open on it.
#[derive(Debug, Default)]
pub struct MachineUse {
    last: AtomicI64,
    sessions: AtomicUsize,
}

impl MachineUse {
    /// Something passed now (a byte, a session opening or closing).
    pub fn touch(&self) {
        self.last.store(now_seconds(), Ordering::Relaxed);
    }

    /// The second of its last activity, as of `now`: `now` while a session is open.
    fn last_active(&self, now: i64) -> Option<i64> {
        if self.sessions.load(Ordering::Relaxed) > 0 {
            return Some(now);
        }
        Some(self.last.load(Ordering::Relaxed)).filter(|&s| s > 0)
    }
}

fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// An open session on a machine (an exec, a followed log, a copy): the machine counts as active
/// until it drops.
#[derive(Debug)]
pub struct Session {
    machine: Arc<MachineUse>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.machine.touch();
        self.machine.sessions.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The agent's record of every machine's use and of the wakes asked for.
#[derive(Debug, Default)]
pub struct Activity {
    machines: Mutex<HashMap<String, Arc<MachineUse>>>,
    wakes: Mutex<BTreeSet<String>>,
    wake_asked: Notify,
}

impl Activity {
    /// An empty record.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The use of `machine`, made on first sight (the forwarder keeps it for each relay).
    pub fn of(&self, machine: &str) -> Arc<MachineUse> {
        let mut machines = self.machines.lock().unwrap_or_else(PoisonError::into_inner);
        machines.entry(machine.to_string()).or_default().clone()
    }

    /// Something passed for `machine` now.
    pub fn touch(&self, machine: &str) {
        self.of(machine).touch();
    }

    /// A session on `machine` opens; it counts as active until the guard drops.
    pub fn session(&self, machine: &str) -> Session {
        let machine = self.of(machine);
        machine.sessions.fetch_add(1, Ordering::Relaxed);
        machine.touch();
        Session { machine }
    }

    /// A connection (or an access session) asks to wake `machine`: the reporter is told at once
    /// when the wake is new.
    pub fn ask_wake(&self, machine: &str) {
        let added = self
            .wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(machine.to_string());
        self.touch(machine);
        if added {
            self.wake_asked.notify_one();
        }
    }

    /// `machine` runs again (or its held connections gave up): its wake is no longer asked for.
    pub fn woke(&self, machine: &str) {
        self.wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(machine);
    }

    /// Resolves when a new wake is asked for (one wake-up for those asked since the last).
    pub async fn wake_asked(&self) {
        self.wake_asked.notified().await;
    }

    /// Forgets the machines not in `machines` (deleted), and their wakes.
    pub fn retain(&self, machines: &[String]) {
        let keep: BTreeSet<&str> = machines.iter().map(String::as_str).collect();
        self.machines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| keep.contains(name.as_str()));
        self.wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name| keep.contains(name.as_str()));
    }

    /// What a heartbeat reports: each machine's last activity (whole seconds, sorted by name;
    /// those with none left out) and the wakes asked for (sorted).
    pub fn report(&self) -> (Vec<(String, i64)>, Vec<String>) {
        let now = now_seconds();
        let mut active: Vec<(String, i64)> = self
            .machines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(name, use_)| use_.last_active(now).map(|at| (name.clone(), at)))
            .collect();
        active.sort();
        let wakes = self
            .wakes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        (active, wakes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_is_active_while_a_session_is_open_and_from_its_last_byte() {
        let activity = Activity::new();
        assert_eq!(activity.report(), (Vec::new(), Vec::new()));
        let session = activity.session("svm-a");
        activity.touch("svm-b");
        let (active, _) = activity.report();
        assert_eq!(
            active.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["svm-a", "svm-b"]
        );
        drop(session);
        let (active, _) = activity.report();
        assert_eq!(active.len(), 2, "a closed session leaves its last activity");
        activity.retain(&["svm-b".to_string()]);
        assert_eq!(activity.report().0.len(), 1, "a deleted machine is forgotten");
    }

    #[tokio::test]
    async fn a_new_wake_tells_the_reporter_once() {
        let activity = Activity::new();
        activity.ask_wake("svm-a");
        activity.ask_wake("svm-a");
        tokio::time::timeout(std::time::Duration::from_secs(1), activity.wake_asked())
            .await
            .expect("told");
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), activity.wake_asked()).await;
        assert!(waited.is_err(), "a wake asked twice tells once");
        assert_eq!(activity.report().1, ["svm-a"]);
        activity.woke("svm-a");
        assert!(activity.report().1.is_empty());
    }
}
