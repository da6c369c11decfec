//! The kubectl plugin for SmolVMs: `kubectl smolvm
//! logs|exec|cp|start|stop|suspend|resume|restart|branch|get-branches`.
//!
//! The binary (`src/main.rs`) parses the command line and calls [`run`]. The pure parts (cp
//! specs, paths and queries, `KEY=VALUE`, modes, durations, exit codes, error lines, branch
//! objects and tables) are functions of their modules, table-tested there.
//!
//! Exit codes: 0 when the command did what it was asked, 1 with one line on stderr when it did
//! not (`error: …`, or `Error from server (Reason): …` as kubectl prints an API error), and for
//! `exec` the remote command's own exit code.

pub mod branch;
pub mod cli;
pub mod client;
pub mod cp;
pub mod duration;
pub mod error;
pub mod exec;
pub mod lifecycle;
pub mod logs;
pub mod paths;
pub mod session;
pub mod table;
pub mod terminal;

pub use cli::Cli;
pub use error::Error;

use cli::Command;
use lifecycle::Switch;

/// Runs a parsed command line; the exit code to end with when it ran.
pub async fn run(cli: Cli) -> Result<u8, Error> {
    let global = &cli.global;
    match &cli.command {
        Command::Logs(args) => logs::run(global, args).await.map(|()| 0),
        Command::Exec(args) => exec_or_session(global, args).await,
        Command::Cp(args) => cp::run(global, args).await.map(|()| 0),
        Command::Start(args) => set(global, &args.name, Switch::Running, true).await,
        Command::Stop(args) => set(global, &args.name, Switch::Running, false).await,
        Command::Suspend(args) => set(global, &args.name, Switch::Suspended, true).await,
        Command::Resume(args) => set(global, &args.name, Switch::Suspended, false).await,
        Command::Restart(args) => lifecycle::restart(global, &args.name).await.map(|()| 0),
        Command::Branch(args) => branch::run(global, args).await,
        Command::GetBranches(args) => branch::list(global, args).await.map(|()| 0),
    }
}

/// `start`, `stop`, `suspend`, `resume`: one switch of the spec.
async fn set(global: &cli::GlobalArgs, name: &str, switch: Switch, on: bool) -> Result<u8, Error> {
    lifecycle::set(global, name, switch, on).await.map(|()| 0)
}

/// `exec`: an interactive session with `-t` when there is a terminal to attach (or `-t` without
/// `-i`, which needs none), the one-shot exec otherwise.
async fn exec_or_session(global: &cli::GlobalArgs, args: &cli::ExecArgs) -> Result<u8, Error> {
    if args.tty {
        if terminal::stdin_is_terminal() {
            return session::run(global, args, true).await;
        }
        // kubectl's rule: no terminal to attach, so none. Piped input must reach its end in the
        // command, which only a one-shot exec can give (smolvm's sessions cannot close stdin).
        if args.stdin {
            eprintln!("Unable to use a TTY - input is not a terminal; running the command one-shot with stdin");
        } else {
            eprintln!("Unable to use a TTY - input is not a terminal; running without one");
            return session::run(global, args, false).await;
        }
    }
    exec::run(global, args).await
}
