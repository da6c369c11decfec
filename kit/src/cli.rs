//! The flag vocabulary the three binaries share.
//!
//! - The same thing has the same flag in every binary: `--ops-address` (the plain-HTTP ops
//!   port), `--log-format json|text`, `--policy`, `--token-file`.
//! - Every environment variable of a binary carries its prefix (`SMOLVM_WEBHOOK_`,
//!   `SMOLVM_CONTROLLER_`, `SMOLVM_RUNTIME_`), apart from the names the downward API and
//!   smolvm's own install layout give (`NODE_NAME`, `NODE_IP`, `POD_IP`, `POD_NAME`,
//!   `POD_NAMESPACE`, `SMOLVM_BIN`).
//! - A duration is written as Kubernetes writes them: `500ms`, `10s`, `5m`, `1h30m`, and `90d`
//!   for certificate lifetimes. [`parse_duration`] reads them all.
//! - A flag or variable that was renamed keeps working for one release: [`upgrade_args`]
//!   rewrites the old spelling into the new one before clap parses, and says so in a warning the
//!   binary logs once its logging is up.

use std::ffi::OsString;
use std::time::Duration;

/// The log line format, `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    #[default]
    Json,
    /// Human-readable lines (for a terminal).
    Text,
}

/// Parses a duration: one or more `<number><unit>` parts with the units `ms`, `s`, `m`, `h` and
/// `d` (`500ms`, `10s`, `1h30m`, `90d`). A bare number counts seconds, which is what the retired
/// `--…-seconds` flags took.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration (write it as 10s, 5m, 1h30m or 90d)".into());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("duration {text:?} is too large"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "invalid duration {text:?}: expected a number at {rest:?} (write it as 10s, 5m, 1h30m or 90d)"
            ));
        }
        let (number, tail) = rest.split_at(digits);
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let n: u64 = number.parse().map_err(|_| format!("duration {text:?} is too large"))?;
        let part = match unit {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3_600).map(Duration::from_secs),
            "d" => n.checked_mul(86_400).map(Duration::from_secs),
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: {number} has no unit (use ms, s, m, h or d)"
                ));
            }
            other => {
                return Err(format!(
                    "invalid duration {text:?}: unknown unit {other:?} (use ms, s, m, h or d)"
                ));
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| format!("duration {text:?} is too large"))?;
        rest = tail;
    }
    Ok(total)
}

/// A flag or environment variable that was renamed; the old spelling still works, with a
/// warning, for one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The old flag, without the leading `--` (`ops-listen`), if the flag was renamed.
    pub old_flag: Option<&'static str>,
    /// The old environment variable, if it was renamed.
    pub old_env: Option<&'static str>,
    /// The flag now, without the leading `--` (`ops-address`).
    pub flag: &'static str,
    /// The environment variable now (an old variable never overrides it).
    pub env: &'static str,
    /// Appended to a bare number given under the old spelling, when the old flag counted in
    /// another unit than seconds (`--ca-days 3650` becomes `--ca-lifetime 3650d`).
    pub unit: Option<&'static str>,
}

impl Renamed {
    /// `--flag` / `env` as they are now; say what they were with [`was_flag`](Self::was_flag)
    /// and [`was_env`](Self::was_env).
    pub const fn new(flag: &'static str, env: &'static str) -> Self {
        Renamed {
            old_flag: None,
            old_env: None,
            flag,
            env,
            unit: None,
        }
    }

    /// The flag used to be `--old_flag`.
    pub const fn was_flag(self, old_flag: &'static str) -> Self {
        Renamed {
            old_flag: Some(old_flag),
            ..self
        }
    }

    /// The environment variable used to be `old_env`.
    pub const fn was_env(self, old_env: &'static str) -> Self {
        Renamed {
            old_env: Some(old_env),
            ..self
        }
    }

    /// The old spelling counted bare numbers in `unit` (`d` for a flag that took days).
    pub const fn counting(self, unit: &'static str) -> Self {
        Renamed {
            unit: Some(unit),
            ..self
        }
    }

    fn value(&self, value: &str) -> String {
        match self.unit {
            Some(unit) if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => format!("{value}{unit}"),
            _ => value.to_string(),
        }
    }
}

/// The command line after [`upgrade_args`], and what to warn about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    /// The arguments, old spellings rewritten.
    pub args: Vec<OsString>,
    /// One line per old spelling that was used.
    pub warnings: Vec<String>,
}

/// Rewrites old flag spellings in `args` (the first is the program name) into the current ones,
/// and turns a set old environment variable into the current flag when neither the flag nor its
/// current variable is given. `env` reads the environment (a parameter, for tests).
pub fn upgrade_args(
    args: impl IntoIterator<Item = OsString>,
    renamed: &[Renamed],
    env: impl Fn(&str) -> Option<String>,
) -> Upgraded {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut args = args.into_iter();
    let mut positional = false;
    if let Some(program) = args.next() {
        out.push(program);
    }
    while let Some(arg) = args.next() {
        let text = match arg.to_str() {
            Some(text) if !positional => text.to_string(),
            _ => {
                out.push(arg);
                continue;
            }
        };
        if text == "--" {
            positional = true;
            out.push(arg);
            continue;
        }
        let Some(body) = text.strip_prefix("--") else {
            out.push(arg);
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (body, None),
        };
        let Some(rule) = renamed.iter().find(|r| r.old_flag == Some(name)) else {
            out.push(arg);
            continue;
        };
        warnings.push(format!(
            "the flag --{name} is deprecated and will be removed; use --{}",
            rule.flag
        ));
        match inline.or_else(|| args.next().and_then(|v| v.into_string().ok())) {
            Some(value) => out.push(format!("--{}={}", rule.flag, rule.value(&value)).into()),
            // No value: let clap say what is missing, under the new name.
            None => out.push(format!("--{}", rule.flag).into()),
        }
    }
    for rule in renamed {
        let Some(old_env) = rule.old_env else { continue };
        let Some(value) = env(old_env).filter(|v| !v.is_empty()) else {
            continue;
        };
        let given = out.iter().any(|a| {
            a.to_str().is_some_and(|a| {
                a.strip_prefix("--")
                    .is_some_and(|a| a == rule.flag || a.starts_with(&format!("{}=", rule.flag)))
            })
        });
        if given || env(rule.env).is_some() {
            warnings.push(format!(
                "the environment variable {old_env} is deprecated and ignored here: --{} or {} is set",
                rule.flag, rule.env
            ));
            continue;
        }
        warnings.push(format!(
            "the environment variable {old_env} is deprecated and will be removed; use {}",
            rule.env
        ));
        out.push(format!("--{}={}", rule.flag, rule.value(&value)).into());
    }
    Upgraded { args: out, warnings }
}

/// Parses the process's command line and environment into `F`, old spellings included; the
/// warnings are for the log, once it is set up. Exits with clap's message on bad flags, as
/// `F::parse()` does.
pub fn parse<F: clap::Parser>(renamed: &[Renamed]) -> (F, Vec<String>) {
    let upgraded = upgrade_args(std::env::args_os(), renamed, |name| std::env::var(name).ok());
    (F::parse_from(upgraded.args), upgraded.warnings)
}

/// Logs the warnings [`parse`] returned.
pub fn warn_deprecated(warnings: &[String]) {
    for warning in warnings {
        tracing::warn!(reason = "DeprecatedFlag", "{warning}");
    }
}

/// The flags every binary has, under these names.
pub const SHARED_FLAGS: &[&str] = &["--ops-address", "--log-format"];

/// Environment variables a binary reads under names it does not choose: the downward API's and
/// smolvm's install layout's.
pub const FOREIGN_ENV: &[&str] = &[
    "NODE_NAME",
    "NODE_IP",
    "POD_IP",
    "POD_NAME",
    "POD_NAMESPACE",
    "SMOLVM_BIN",
];

/// What in a binary's `--help` breaks the shared vocabulary: a shared flag missing, an old
/// spelling shown, a variable without the binary's `prefix` (`SMOLVM_WEBHOOK_`). Empty when
/// all is well.
pub fn help_problems(help: &str, prefix: &str, renamed: &[Renamed]) -> Vec<String> {
    let mut problems = Vec::new();
    let shows_flag = |flag: &str| {
        help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
            .any(|word| word == flag)
    };
    for flag in SHARED_FLAGS {
        if !shows_flag(flag) {
            problems.push(format!("{flag} is missing"));
        }
    }
    for rule in renamed {
        if !shows_flag(&format!("--{}", rule.flag)) {
            problems.push(format!("--{} is missing", rule.flag));
        }
        if let Some(old) = rule.old_flag.filter(|old| shows_flag(&format!("--{old}"))) {
            problems.push(format!("the old spelling --{old} is shown"));
        }
    }
    for (_, rest) in help.match_indices("[env: ").map(|(i, _)| help.split_at(i + 6)) {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.starts_with(prefix) && !FOREIGN_ENV.contains(&name.as_str()) {
            problems.push(format!("the variable {name} lacks the prefix {prefix}"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let table: &[(&str, Option<Duration>)] = &[
            ("500ms", Some(Duration::from_millis(500))),
            ("10s", Some(Duration::from_secs(10))),
            ("10", Some(Duration::from_secs(10))),
            (" 10s ", Some(Duration::from_secs(10))),
            ("2m", Some(Duration::from_secs(120))),
            ("1h", Some(Duration::from_secs(3_600))),
            ("1h30m", Some(Duration::from_secs(5_400))),
            ("1m500ms", Some(Duration::from_millis(60_500))),
            ("90d", Some(Duration::from_secs(90 * 86_400))),
            ("0s", Some(Duration::ZERO)),
            ("", None),
            ("s", None),
            ("x", None),
            ("5w", None),
            ("1h30", None),
            ("-1s", None),
            ("1.5s", None),
            ("99999999999999999999", None),
            ("999999999999999999d", None),
        ];
        for (text, expected) in table {
            assert_eq!(parse_duration(text).ok(), *expected, "{text:?}");
        }
    }

    #[test]
    fn a_bad_duration_says_how_to_write_one() {
        let error = parse_duration("5w").expect_err("5w");
        assert!(error.contains("\"w\"") && error.contains("ms, s, m, h or d"), "{error}");
    }

    const RENAMED: &[Renamed] = &[
        Renamed::new("ops-address", "W_OPS_ADDRESS")
            .was_flag("ops-listen")
            .was_env("W_OPS_LISTEN"),
        Renamed::new("ca-lifetime", "W_CA_LIFETIME")
            .was_flag("ca-days")
            .was_env("W_CA_DAYS")
            .counting("d"),
        Renamed::new("token-file", "W_TOKEN_FILE").was_env("TOKEN_FILE"),
    ];

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn help_vocabulary() {
        let good = "  --ops-address <ADDR>  ops [env: W_OPS_ADDRESS=]\n  --log-format <F> [env: W_LOG_FORMAT=] \
                    --ca-lifetime <D> --token-file <P> [env: NODE_NAME=]";
        let renamed = &RENAMED.iter().map(|r| Renamed { env: "W_X", ..*r }).collect::<Vec<_>>();
        assert_eq!(help_problems(good, "W_", renamed), Vec::<String>::new());
        let bad = "  --ops-listen <ADDR> [env: OPS_ADDR=] --ca-lifetime <D> --token-file <P>";
        assert_eq!(
            help_problems(bad, "W_", renamed),
            [
                "--ops-address is missing",
                "--log-format is missing",
                "--ops-address is missing",
                "the old spelling --ops-listen is shown",
                "the variable OPS_ADDR lacks the prefix W_",
            ]
        );
    }

    #[test]
    fn old_spellings_are_rewritten_and_warned() {
        type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str], usize);
        let table: &[Case] = &[
            // Current spellings pass untouched, with no warning.
            (&["w", "--ops-address", "a:1"], &[], &["w", "--ops-address", "a:1"], 0),
            (&["w", "--ops-listen", "a:1"], &[], &["w", "--ops-address=a:1"], 1),
            (&["w", "--ops-listen=a:1"], &[], &["w", "--ops-address=a:1"], 1),
            (&["w", "--ca-days", "30"], &[], &["w", "--ca-lifetime=30d"], 1),
            (&["w", "--ca-days=30d"], &[], &["w", "--ca-lifetime=30d"], 1),
            // A flag missing its value stays for clap to report.
            (&["w", "--ops-listen"], &[], &["w", "--ops-address"], 1),
            // After `--`, nothing is rewritten.
            (&["w", "--", "--ops-listen"], &[], &["w", "--", "--ops-listen"], 0),
            // An old variable becomes the flag when nothing newer says otherwise.
            (&["w"], &[("W_OPS_LISTEN", "a:2")], &["w", "--ops-address=a:2"], 1),
            (&["w"], &[("W_CA_DAYS", "7")], &["w", "--ca-lifetime=7d"], 1),
            (&["w"], &[("TOKEN_FILE", "/t")], &["w", "--token-file=/t"], 1),
            (&["w"], &[("TOKEN_FILE", "")], &["w"], 0),
            (
                &["w", "--ops-address=a:1"],
                &[("W_OPS_LISTEN", "a:2")],
                &["w", "--ops-address=a:1"],
                1,
            ),
            (&["w"], &[("W_OPS_LISTEN", "a:2"), ("W_OPS_ADDRESS", "a:3")], &["w"], 1),
            (&["w", "--unknown", "x"], &[], &["w", "--unknown", "x"], 0),
        ];
        for (args, vars, expected, warnings) in table {
            let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let upgraded = upgrade_args(os(args), RENAMED, |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            });
            assert_eq!(upgraded.args, os(expected), "{args:?} {vars:?}");
            assert_eq!(
                upgraded.warnings.len(),
                *warnings,
                "{args:?} {vars:?}: {:?}",
                upgraded.warnings
            );
            for warning in &upgraded.warnings {
                assert!(warning.contains("deprecated"), "{warning}");
            }
        }
    }
}
