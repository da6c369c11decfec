//! The fault tier (SPEC section 7, issue 62): a seeded fault-injection soak that checks the
//! product's promises (SPEC section 4) while it runs.
//!
//! What the tier runs (`make soak`): the whole product on a real kube-apiserver and etcd, two
//! webhook and two controller replicas, a real agent over the real `smolvm serve`, one over the
//! smolvm double and simulated nodes; a mixed workload of SmolVM operations while faults fall on
//! a seeded schedule; an invariant checker fed the history the runner records, continuously and
//! at the end; then the report. The live runner (the processes, the faults made real, the
//! recording) is the `soak` test of `smolvm-tests` (`tests/tests/soak`), which `make soak` runs
//! after this crate's tests; without kube-apiserver it prints `skipped: no kube-apiserver …`.
//!
//! What this crate is: the tier's pure core, every part a function of its inputs and tested on
//! its own, which CI runs on every build (`cargo test -p smolvm-soak`, part of `make test`):
//! - [`rng`]: the seeded PRNG (SplitMix64), the same numbers on every machine;
//! - [`schedule`]: the injector's schedule of faults, a pure function of the seed and the length;
//! - [`workload`]: the generator's bounded stream of operations, each with the outcome its
//!   client waits for;
//! - [`history`]: what the runner records (timestamped observations), as JSON lines;
//! - [`check`]: the invariants over a history, fed one observation at a time or all at once;
//! - [`clock`]: what a clock fault must leave behind (the agent naming its clock, the
//!   controller's HeartbeatLost);
//! - [`report`]: the lines the run ends with.
//!
//! A run is named by its [`Config`]: `SOAK_MINUTES` (default 3) and `SOAK_SEED` (default 62).
//! The same two values give the same schedule and the same workload, so a violation's seed
//! reproduces the run that found it.

use std::time::Duration;

pub mod check;
pub mod clock;
pub mod history;
pub mod report;
pub mod rng;
pub mod schedule;
pub mod workload;

/// The default length of a run, in minutes: short enough for every push, long enough that every
/// kind of fault falls at least once.
pub const DEFAULT_MINUTES: u32 = 3;
/// The shortest run: every kind of fault needs the default run's room.
pub const MIN_MINUTES: u32 = 3;
/// The longest run (a day).
pub const MAX_MINUTES: u32 = 24 * 60;
/// The default seed (the issue's number): fixed, so two default runs are the same run.
pub const DEFAULT_SEED: u64 = 62;

/// The soak's error. Every variant has a stable [`Error::reason`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// An environment variable whose value cannot be used.
    #[error("{var}={value:?}: expected {expected}")]
    Env {
        /// The variable's name.
        var: &'static str,
        /// The value it has.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A run too short for what it must hold.
    #[error("a run of {length:?} is too short: {why}")]
    TooShort {
        /// The length asked for.
        length: Duration,
        /// What does not fit.
        why: String,
    },
    /// A fault kind that no process or node of the topology can take.
    #[error("no target for {kind} faults: {why}")]
    NoTarget {
        /// The fault kind's name.
        kind: &'static str,
        /// What the topology lacks.
        why: &'static str,
    },
    /// Workload parameters that cannot give a valid stream.
    #[error("workload: {0}")]
    Workload(String),
    /// A history line that is not an observation.
    #[error("history line {line}: {message}")]
    History {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
}

impl Error {
    /// A stable, machine-readable name of the error kind.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Env { .. } => "InvalidEnv",
            Error::TooShort { .. } => "TooShort",
            Error::NoTarget { .. } => "NoTarget",
            Error::Workload(_) => "InvalidWorkload",
            Error::History { .. } => "InvalidHistory",
        }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What names a run: its length and its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The run's length in minutes.
    pub minutes: u32,
    /// The seed of its schedule and its workload.
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            minutes: DEFAULT_MINUTES,
            seed: DEFAULT_SEED,
        }
    }
}

impl Config {
    /// The run's length.
    pub fn length(&self) -> Duration {
        Duration::from_secs(u64::from(self.minutes) * 60)
    }

    /// How to run this again, as a shell would take it.
    pub fn reproduce(&self) -> String {
        format!("SOAK_MINUTES={} SOAK_SEED={} make soak", self.minutes, self.seed)
    }

    /// The run named by `SOAK_MINUTES` and `SOAK_SEED` (each unset or empty: its default).
    /// Minutes are a whole number from [`MIN_MINUTES`] to [`MAX_MINUTES`]; a seed is any
    /// unsigned 64-bit number, in decimal or as `0x` hex.
    pub fn from_env_values(minutes: Option<&str>, seed: Option<&str>) -> Result<Config> {
        let minutes = match given(minutes) {
            None => DEFAULT_MINUTES,
            Some(value) => value
                .parse::<u32>()
                .ok()
                .filter(|m| (MIN_MINUTES..=MAX_MINUTES).contains(m))
                .ok_or_else(|| Error::Env {
                    var: "SOAK_MINUTES",
                    value: value.to_string(),
                    expected: "a whole number of minutes from 3 to 1440",
                })?,
        };
        let seed = match given(seed) {
            None => DEFAULT_SEED,
            Some(value) => parse_seed(value).ok_or_else(|| Error::Env {
                var: "SOAK_SEED",
                value: value.to_string(),
                expected: "an unsigned 64-bit number (decimal, or hex with 0x)",
            })?,
        };
        Ok(Config { minutes, seed })
    }

    /// [`Config::from_env_values`] of this process's environment.
    pub fn from_env() -> Result<Config> {
        let minutes = std::env::var("SOAK_MINUTES").ok();
        let seed = std::env::var("SOAK_SEED").ok();
        Config::from_env_values(minutes.as_deref(), seed.as_deref())
    }
}

/// The value, trimmed, unless it is missing or blank (as `make soak SOAK_SEED=` passes it).
fn given(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

fn parse_seed(value: &str) -> Option<u64> {
    match value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => value.parse().ok(),
    }
}

/// A run's plan: its faults and its operations, both from its config alone (and the
/// parameters, whose defaults are the tier's).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// What names the run.
    pub config: Config,
    /// When which fault falls.
    pub schedule: schedule::Schedule,
    /// What the generator does, in order.
    pub operations: Vec<workload::Operation>,
}

/// The plan of a run: the faults over the run's fault window, the operations issued from the
/// start until the cool-down (so every fault falls while operations are in flight, and the last
/// operations have the cool-down to settle before the end).
pub fn plan(
    config: Config,
    schedule_params: &schedule::ScheduleParams,
    workload_params: &workload::WorkloadParams,
) -> Result<Plan> {
    let length = config.length();
    let schedule = schedule::schedule(config.seed, length, schedule_params)?;
    let issue_until = length.saturating_sub(schedule_params.cooldown);
    let operations = workload::workload(config.seed, issue_until, workload_params)?;
    Ok(Plan {
        config,
        schedule,
        operations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_env_values() {
        let cases: [(Option<&str>, Option<&str>, Result<Config>); 12] = [
            (None, None, Ok(Config { minutes: 3, seed: 62 })),
            (Some(""), Some("  "), Ok(Config { minutes: 3, seed: 62 })),
            (Some("15"), Some("7"), Ok(Config { minutes: 15, seed: 7 })),
            (Some(" 4 "), Some("0x2A"), Ok(Config { minutes: 4, seed: 42 })),
            (
                None,
                Some("18446744073709551615"),
                Ok(Config {
                    minutes: 3,
                    seed: u64::MAX,
                }),
            ),
            (
                Some("1440"),
                None,
                Ok(Config {
                    minutes: 1440,
                    seed: 62,
                }),
            ),
            (Some("2"), None, Err(minutes_error("2"))),
            (Some("1441"), None, Err(minutes_error("1441"))),
            (Some("3m"), None, Err(minutes_error("3m"))),
            (Some("-5"), None, Err(minutes_error("-5"))),
            (
                None,
                Some("18446744073709551616"),
                Err(seed_error("18446744073709551616")),
            ),
            (None, Some("0xZZ"), Err(seed_error("0xZZ"))),
        ];
        for (minutes, seed, expected) in cases {
            assert_eq!(Config::from_env_values(minutes, seed), expected, "{minutes:?} {seed:?}");
        }
    }

    fn minutes_error(value: &str) -> Error {
        Error::Env {
            var: "SOAK_MINUTES",
            value: value.into(),
            expected: "a whole number of minutes from 3 to 1440",
        }
    }

    fn seed_error(value: &str) -> Error {
        Error::Env {
            var: "SOAK_SEED",
            value: value.into(),
            expected: "an unsigned 64-bit number (decimal, or hex with 0x)",
        }
    }

    #[test]
    fn errors_name_the_variable_and_the_value() {
        let error = Config::from_env_values(Some("soon"), None).expect_err("bad minutes");
        assert_eq!(
            error.to_string(),
            "SOAK_MINUTES=\"soon\": expected a whole number of minutes from 3 to 1440"
        );
        assert_eq!(error.reason(), "InvalidEnv");
        let error = Config::from_env_values(None, Some("-1")).expect_err("bad seed");
        assert_eq!(
            error.to_string(),
            "SOAK_SEED=\"-1\": expected an unsigned 64-bit number (decimal, or hex with 0x)"
        );
    }

    #[test]
    fn config_length_and_reproduction() {
        let config = Config { minutes: 15, seed: 9 };
        assert_eq!(config.length(), Duration::from_secs(900));
        assert_eq!(config.reproduce(), "SOAK_MINUTES=15 SOAK_SEED=9 make soak");
        assert_eq!(
            Config::default(),
            Config {
                minutes: DEFAULT_MINUTES,
                seed: DEFAULT_SEED
            }
        );
    }

    #[test]
    fn the_default_plan_is_the_same_plan_every_time() {
        let plan_of = |config| {
            plan(
                config,
                &schedule::ScheduleParams::default(),
                &workload::WorkloadParams::default(),
            )
            .expect("plan")
        };
        let first = plan_of(Config::default());
        assert_eq!(first, plan_of(Config::default()));
        assert_ne!(
            first,
            plan_of(Config {
                seed: 63,
                ..Config::default()
            })
        );
        let end = Config::default().length() - schedule::ScheduleParams::default().cooldown;
        assert!(first.operations.iter().all(|op| op.at < end));
        assert!(first.schedule.faults.iter().all(|f| f.end() <= end));
    }
}
