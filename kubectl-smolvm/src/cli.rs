//! The command line: kubectl's global flags, and one subcommand per thing a user does to a
//! SmolVM. Parsing only; the commands live in their own modules.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::paths::LogSource;
use smolvm_kit::cli::parse_duration;

const ABOUT: &str = "Work with SmolVMs (microVMs run by the smolvm operator) from kubectl";

const LONG_ABOUT: &str = "Work with SmolVMs (microVMs run by the smolvm operator) from kubectl. \
Read a machine's console or workload log, run a command in it (one-shot, or an interactive shell with -it), \
copy single files in and out, \
start, stop, suspend, resume or restart it, \
and branch a running branchable one into copy-on-write clones and list its branches (branch, get-branches). \
Every request goes through the cluster's API server with your kubeconfig's \
credentials (and --as impersonation), so Kubernetes RBAC decides who may do what: logs, exec and cp use the \
aggregated API subresources.vm.smolvm.dev, start, stop, suspend, resume and restart patch the SmolVM in \
vm.smolvm.dev, branch creates SmolVMs there and get-branches lists them.";

const EXAMPLES: &str = "\
Examples:
  # Follow the workload log of SmolVM web in namespace shop
  kubectl smolvm logs web -n shop -f --source workload

  # Run a command and get its exit code
  kubectl smolvm exec web -- cat /etc/os-release

  # Open a shell in the machine (exit or Ctrl-D to leave)
  kubectl smolvm exec -it web -- sh

  # Copy a file out of the machine, and one into it
  kubectl smolvm cp web:/var/log/app.log ./app.log
  kubectl smolvm cp ./config.toml web:/etc/app/config.toml

  # Stop the machine (keeping its disks), start it again, restart it
  kubectl smolvm stop web
  kubectl smolvm start web
  kubectl smolvm restart web

  # Suspend it (memory and disks saved, CPU and memory given back), then resume it
  kubectl smolvm suspend web
  kubectl smolvm resume web

  # Make 3 copy-on-write branches of the running branchable SmolVM base, wait until they run, list them
  kubectl smolvm branch base --count 3
  kubectl smolvm get-branches base";

const LOGS_EXAMPLES: &str = "\
Examples:
  # Print the console log of SmolVM web so far
  kubectl smolvm logs web

  # Follow the workload's output, starting 50 lines back (Ctrl-C to stop)
  kubectl smolvm logs web -f --tail 50 --source workload";

const EXEC_EXAMPLES: &str = "\
Examples:
  # Run a command; its stdout and stderr come back, and its exit code becomes ours
  kubectl smolvm exec web -- ls -l /data

  # Pass environment, a working directory and a timeout
  kubectl smolvm exec web -e MODE=check -w /srv/app --timeout 2m -- ./healthcheck.sh

  # Feed local stdin (UTF-8 text) to the command
  echo 'SELECT 1;' | kubectl smolvm exec db -i -- psql -U postgres

  # An interactive shell: a terminal, keys as typed, resizes followed
  kubectl smolvm exec -it web -- sh";

const CP_EXAMPLES: &str = "\
Examples:
  # Copy a file out of SmolVM web (into a directory keeps the file's name)
  kubectl smolvm cp web:/etc/hostname ./hostname
  kubectl smolvm cp web:/etc/hostname ./backups/

  # Print a file in the machine on stdout
  kubectl smolvm cp web:/etc/os-release -

  # Copy a local file in (mode from the local file unless --mode is given)
  kubectl smolvm cp ./app.conf web:/etc/app/app.conf
  kubectl smolvm cp ./run.sh web:/usr/local/bin/ --mode 0755

  # Copy stdin in
  tar -czf - ./site | kubectl smolvm cp - web:/tmp/site.tar.gz";

const START_EXAMPLES: &str = "\
Examples:
  # Start SmolVM web (sets spec.running to true)
  kubectl smolvm start web -n shop";

const STOP_EXAMPLES: &str = "\
Examples:
  # Stop SmolVM web, keeping its disks (sets spec.running to false)
  kubectl smolvm stop web -n shop";

const SUSPEND_EXAMPLES: &str = "\
Examples:
  # Suspend SmolVM web: its memory and disks are saved on its node and its CPU and memory
  # given back (sets spec.suspended to true)
  kubectl smolvm suspend web -n shop

  # See it suspended, and since when
  kubectl get smolvm web -n shop";

const RESUME_EXAMPLES: &str = "\
Examples:
  # Resume SmolVM web on its node with its processes as they were (sets spec.suspended to
  # false); it waits, with the Suspended condition saying why, while the node lacks room
  kubectl smolvm resume web -n shop";

const RESTART_EXAMPLES: &str = "\
Examples:
  # Ask the controller to restart the running SmolVM web once
  kubectl smolvm restart web -n shop";

const BRANCH_LONG_ABOUT: &str = "Create branches (copy-on-write clones) of a branchable SmolVM and wait until they run.

A branch is a SmolVM whose spec.branchOf names SOURCE: it takes its spec from SOURCE when it is created, except \
its own env (--env), and once SOURCE runs, its machine is made on SOURCE's node as a copy-on-write clone of the \
running machine (memory and disks), in milliseconds instead of a boot. SOURCE must have been created with \
spec.branchable: true; any other SOURCE is refused before anything is created.

The --count branches are created at once, named PREFIX-xxxxx (--name; the API server picks the rest), and \
watched until each is Running. For each one the table shows how long it took (TOOK), measured here from its \
create request to the moment the API server reported it Running. A branch that is Failed, or not Running within \
--timeout, is shown with its Ready condition's reason and message, and the command exits 1.

The SmolVMs this command creates are never deleted by it, also not when it fails, times out or is \
interrupted: kubectl smolvm get-branches SOURCE lists them, kubectl delete smolvm NAME deletes one.";

const BRANCH_EXAMPLES: &str = "\
Examples:
  # Branch the running branchable SmolVM base in namespace shop once, and wait for the branch to run
  kubectl smolvm branch base -n shop

  # Make 10 branches named worker-xxxxx with ROLE=worker in their env, waiting at most 30s
  kubectl smolvm branch base --count 10 --name worker --env ROLE=worker --timeout 30s

  # Delete one of them (branch never deletes what it made)
  kubectl delete smolvm worker-x7k2p";

const GET_BRANCHES_EXAMPLES: &str = "\
Examples:
  # List the branches of SmolVM base in namespace shop: NAME, PHASE, NODE, READY, AGE
  kubectl smolvm get-branches base -n shop

  # The same SmolVMs with kubectl itself (the webhook labels every branch with its source)
  kubectl get smolvms -n shop -l vm.smolvm.dev/branch-of=base";

/// `kubectl smolvm`: the parsed command line.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-smolvm",
    bin_name = "kubectl smolvm",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXAMPLES,
    propagate_version = true
)]
pub struct Cli {
    /// How to reach the cluster (kubectl's flags).
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// kubectl's flags for choosing the cluster, the identity and the namespace.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// The namespace of the SmolVM (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// The user to impersonate for the request (a user or a service account).
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// A group to impersonate; repeat it for several groups.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// The UID to impersonate.
    #[arg(long = "as-uid", global = true, value_name = "UID")]
    pub as_uid: Option<String>,
    /// How long to wait for the server's answer (`30s`, `2m`; 0 waits forever). For logs, the
    /// wait for the stream to start.
    #[arg(long, global = true, value_name = "DURATION", value_parser = parse_duration)]
    pub request_timeout: Option<Duration>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the console or workload log of a SmolVM.
    #[command(after_help = LOGS_EXAMPLES)]
    Logs(LogsArgs),
    /// Run a command in a running SmolVM: one-shot, or interactive with -it.
    #[command(after_help = EXEC_EXAMPLES)]
    Exec(ExecArgs),
    /// Copy a single file into or out of a running SmolVM.
    #[command(after_help = CP_EXAMPLES)]
    Cp(CpArgs),
    /// Start a SmolVM (set spec.running to true).
    #[command(after_help = START_EXAMPLES)]
    Start(NameArgs),
    /// Stop a SmolVM, keeping its disks (set spec.running to false).
    #[command(after_help = STOP_EXAMPLES)]
    Stop(NameArgs),
    /// Restart a running SmolVM once.
    #[command(after_help = RESTART_EXAMPLES)]
    Restart(NameArgs),
    /// Suspend a SmolVM: memory and disks saved on its node, CPU and memory given back (set spec.suspended to true).
    #[command(after_help = SUSPEND_EXAMPLES)]
    Suspend(NameArgs),
    /// Resume a suspended SmolVM on its node, its processes as they were (set spec.suspended to false).
    #[command(after_help = RESUME_EXAMPLES)]
    Resume(NameArgs),
    /// Create branches (copy-on-write clones) of a branchable SmolVM and wait until they run.
    #[command(long_about = BRANCH_LONG_ABOUT, after_help = BRANCH_EXAMPLES)]
    Branch(BranchArgs),
    /// List the branches of a SmolVM: NAME, PHASE, NODE, READY (the Ready condition's reason), AGE.
    #[command(after_help = GET_BRANCHES_EXAMPLES)]
    GetBranches(GetBranchesArgs),
}

/// `logs NAME [-f] [--tail N] [--source console|workload]`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The SmolVM.
    pub name: String,
    /// Keep printing new lines as they are written, until Ctrl-C or the end of the log.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Start this many lines before the end (default: the whole log the server keeps).
    #[arg(long, value_name = "N")]
    pub tail: Option<u64>,
    /// Which log: the machine's serial console, or the workload's output (default: the server's choice).
    #[arg(long, value_enum, value_name = "SOURCE")]
    pub source: Option<LogSource>,
}

/// `exec NAME [-i] [-t] [--timeout D] [-e KEY=VALUE]... [-w DIR] -- CMD [ARGS...]`.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// The SmolVM.
    pub name: String,
    /// Send local stdin to the command: read to its end (UTF-8 text) for a one-shot command,
    /// as it is typed with -t.
    #[arg(short = 'i', long = "stdin")]
    pub stdin: bool,
    /// Attach a terminal: an interactive session (keys go to the command as typed, its output
    /// comes back as written, resizes follow); with -i, local stdin is sent as it is typed.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// How long the command may run before the server stops it (`30s`, `2m`, or seconds).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// An environment variable for the command, KEY=VALUE; repeat it for several.
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<EnvVar>,
    /// The working directory of the command in the machine.
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    pub workdir: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(value_name = "CMD", required = true, num_args = 1.., trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// `cp SRC DST`: one side is `NAME:/abs/path`, the other a local path or `-`.
#[derive(Debug, Clone, Args)]
pub struct CpArgs {
    /// Where to copy from: `NAME:/abs/path`, a local file, or `-` for stdin.
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Where to copy to: `NAME:/abs/path` (ending in `/` keeps the local file's name), a local
    /// file or directory, or `-` for stdout.
    #[arg(value_name = "DST")]
    pub dst: String,
    /// The mode of a file copied in, in octal (`0644`, `755`); default: the local file's permission bits, 0644 for stdin.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub mode: Option<u32>,
}

/// `branch SOURCE [--name PREFIX] [--count N] [-e KEY=VALUE]... [--timeout D] [--poll-interval D]`.
#[derive(Debug, Clone, Args)]
pub struct BranchArgs {
    /// The SmolVM to branch: one created with spec.branchable: true, in the namespace.
    #[arg(value_name = "SOURCE")]
    pub source: String,
    /// The start of the branches' names: each is named PREFIX-xxxxx, the API server choosing the
    /// five last characters (metadata.generateName). Default: SOURCE.
    #[arg(long = "name", value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// How many branches to create, at once: 1 to 100.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_count)]
    pub count: u32,
    /// An environment variable of every branch (its spec.env), KEY=VALUE; repeat it for several.
    /// The rest of a branch's spec is its source's.
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<EnvVar>,
    /// How long to wait, from the creates, for every branch to be Running (`30s`, `2m`).
    #[arg(long, value_name = "DURATION", default_value = "2m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// How often to list the branches again when the server does not let this command watch
    /// them (it watches them when it may); TOOK is then only as precise as this.
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = parse_duration)]
    pub poll_interval: Duration,
}

/// `get-branches SOURCE`.
#[derive(Debug, Clone, Args)]
pub struct GetBranchesArgs {
    /// The SmolVM whose branches to list (those labelled vm.smolvm.dev/branch-of=SOURCE).
    #[arg(value_name = "SOURCE")]
    pub source: String,
}

/// A subcommand that takes only the SmolVM's name.
#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The SmolVM.
    pub name: String,
}

/// An environment variable for the command, from `-e KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvVar {
    /// The variable's name.
    pub name: String,
    /// Its value (may be empty).
    pub value: String,
}

/// Parses `KEY=VALUE`: the key is what comes before the first `=` and must not be empty; the
/// value is the rest, `=` and all.
pub fn parse_env(text: &str) -> Result<EnvVar, String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok(EnvVar {
            name: name.to_string(),
            value: value.to_string(),
        }),
        Some(_) => Err(format!(
            "invalid environment variable {text:?}: the name before '=' is empty (write KEY=VALUE)"
        )),
        None => Err(format!(
            "invalid environment variable {text:?}: no '=' (write KEY=VALUE)"
        )),
    }
}

/// The most branches one `branch` command creates.
pub const MAX_BRANCHES: u32 = 100;

/// Parses `--count`: a whole number from 1 to [`MAX_BRANCHES`].
pub fn parse_count(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(n) if (1..=MAX_BRANCHES).contains(&n) => Ok(n),
        _ => Err(format!(
            "invalid count {text:?}: write a whole number from 1 to {MAX_BRANCHES} (the most branches one command creates)"
        )),
    }
}

/// Parses `--mode`: octal permission bits, at most `7777` (`644`, `0755`, `0o600`).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(format!("invalid mode {text:?}: write it in octal, like 0644 or 755"));
    }
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 => Ok(mode),
        _ => Err(format!("invalid mode {text:?}: at most 7777")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kubectl-smolvm").chain(args.iter().copied()))
    }

    #[test]
    fn command_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_teaches_with_examples() {
        let mut top = Cli::command();
        let help = top.render_long_help().to_string();
        assert!(help.contains("Examples:"), "{help}");
        assert!(help.contains("kubectl smolvm exec web --"), "{help}");
        for sub in [
            "logs",
            "exec",
            "cp",
            "start",
            "stop",
            "restart",
            "suspend",
            "resume",
            "branch",
            "get-branches",
        ] {
            let mut cmd = Cli::command();
            // Building propagates the global flags and the bin name into the subcommands.
            cmd.build();
            let sub_cmd = cmd
                .find_subcommand_mut(sub)
                .unwrap_or_else(|| panic!("no subcommand {sub}"));
            let help = sub_cmd.render_long_help().to_string();
            assert!(help.contains("Examples:"), "{sub}: {help}");
            assert!(help.contains(&format!("kubectl smolvm {sub} ")), "{sub}: {help}");
            assert!(
                help.contains("--namespace"),
                "{sub} help lacks the global flags: {help}"
            );
        }
    }

    #[test]
    fn branch_help_says_what_is_left_behind() {
        let mut cmd = Cli::command();
        cmd.build();
        let branch = cmd
            .find_subcommand_mut("branch")
            .map(|sub| sub.render_long_help().to_string())
            .unwrap_or_default();
        for part in [
            "spec.branchable: true",
            "never deleted by it",
            "--count <N>",
            "--timeout <DURATION>",
            "[default: 2m]",
        ] {
            assert!(branch.contains(part), "{part}: {branch}");
        }
        let top = Cli::command().render_long_help().to_string();
        assert!(top.contains("kubectl smolvm branch base --count 3"), "{top}");
        assert!(top.contains("kubectl smolvm get-branches base"), "{top}");
    }

    #[test]
    fn branch_takes_its_flags() {
        let cli = parse(&[
            "branch",
            "base",
            "--count",
            "3",
            "--name",
            "worker",
            "-e",
            "A=1",
            "--env",
            "B=",
            "--timeout",
            "30s",
            "-n",
            "shop",
        ])
        .expect("parses");
        let Command::Branch(args) = cli.command else {
            panic!("not branch")
        };
        assert_eq!(args.source, "base");
        assert_eq!(args.count, 3);
        assert_eq!(args.prefix.as_deref(), Some("worker"));
        assert_eq!(args.env.len(), 2);
        assert_eq!(args.timeout, Duration::from_secs(30));
        assert_eq!(args.poll_interval, Duration::from_millis(200));
        assert_eq!(cli.global.namespace.as_deref(), Some("shop"));

        let cli = parse(&["branch", "base"]).expect("parses");
        let Command::Branch(args) = cli.command else {
            panic!("not branch")
        };
        assert_eq!(
            (args.count, args.prefix, args.timeout),
            (1, None, Duration::from_secs(120))
        );

        let cli = parse(&["get-branches", "base"]).expect("parses");
        assert!(matches!(cli.command, Command::GetBranches(ref a) if a.source == "base"));
    }

    #[test]
    fn counts() {
        for (text, want) in [("1", 1), ("100", 100), ("07", 7)] {
            assert_eq!(parse_count(text), Ok(want), "{text:?}");
        }
        for bad in ["0", "101", "-1", "", "three", "1.5"] {
            let err = parse_count(bad).expect_err("refused");
            assert!(err.contains("from 1 to 100"), "{err}");
        }
    }

    #[test]
    fn exec_takes_the_command_after_dashes() {
        let cli = parse(&[
            "exec", "web", "-it", "-e", "A=b", "-e", "C=", "-w", "/x", "--", "ls", "-l", "-n", "x",
        ])
        .expect("parses");
        let Command::Exec(args) = cli.command else {
            panic!("not exec")
        };
        assert!(args.stdin && args.tty);
        assert_eq!(args.command, ["ls", "-l", "-n", "x"]);
        assert_eq!(args.env.len(), 2);
        assert_eq!(args.workdir.as_deref(), Some("/x"));
        assert!(cli.global.namespace.is_none());

        let cli = parse(&["-n", "shop", "exec", "web", "--timeout", "2m", "uname", "-a"]).expect("parses");
        let Command::Exec(args) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(args.command, ["uname", "-a"]);
        assert_eq!(args.timeout, Some(Duration::from_secs(120)));
        assert_eq!(cli.global.namespace.as_deref(), Some("shop"));
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = parse(&[
            "logs",
            "web",
            "-f",
            "--tail",
            "10",
            "--source",
            "workload",
            "-n",
            "shop",
            "--context",
            "prod",
            "--as",
            "jane",
            "--as-group",
            "a",
            "--as-group",
            "b",
            "--request-timeout",
            "5s",
        ])
        .expect("parses");
        assert_eq!(cli.global.namespace.as_deref(), Some("shop"));
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
        assert_eq!(cli.global.as_user.as_deref(), Some("jane"));
        assert_eq!(cli.global.as_group, ["a", "b"]);
        assert_eq!(cli.global.request_timeout, Some(Duration::from_secs(5)));
        let Command::Logs(args) = cli.command else {
            panic!("not logs")
        };
        assert!(args.follow);
        assert_eq!(args.tail, Some(10));
        assert_eq!(args.source, Some(LogSource::Workload));
    }

    #[test]
    fn bad_input_is_a_parse_error() {
        let bad: &[&[&str]] = &[
            &["exec", "web"],
            &["exec", "web", "-e", "NOEQUALS", "--", "ls"],
            &["exec", "web", "--timeout", "soon", "--", "ls"],
            &["logs", "web", "--source", "kernel"],
            &["logs", "web", "--tail", "-1"],
            &["cp", "a"],
            &["cp", "a", "web:/b", "--mode", "999"],
            &["start"],
            &["reboot", "web"],
            &["branch"],
            &["branch", "base", "--count", "0"],
            &["branch", "base", "--count", "101"],
            &["branch", "base", "--env", "=x"],
            &["branch", "base", "--env", "NOEQUALS"],
            &["branch", "base", "--timeout", "soon"],
            &["get-branches"],
        ];
        for args in bad {
            assert!(parse(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn env_pairs() {
        let ok = [
            ("A=b", "A", "b"),
            ("A=", "A", ""),
            ("A=b=c", "A", "b=c"),
            ("PATH=/bin:/usr/bin", "PATH", "/bin:/usr/bin"),
        ];
        for (text, name, value) in ok {
            assert_eq!(
                parse_env(text),
                Ok(EnvVar {
                    name: name.into(),
                    value: value.into()
                }),
                "{text:?}"
            );
        }
        for bad in ["", "A", "=b", "="] {
            assert!(parse_env(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn modes() {
        let ok = [
            ("644", 0o644),
            ("0644", 0o644),
            ("0o755", 0o755),
            ("7777", 0o7777),
            ("0", 0),
            ("00600", 0o600),
        ];
        for (text, want) in ok {
            assert_eq!(parse_mode(text), Ok(want), "{text:?}");
        }
        for bad in ["", "8", "999", "0x644", "17777", "rw-r--r--", "-644", "0o", "000644"] {
            assert!(parse_mode(bad).is_err(), "{bad:?}");
        }
    }
}
