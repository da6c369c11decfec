//! `smolvm-runtime hold`: the one container of a SmolVM's holder Pod (SPEC 2.5). It only has
//! to exist, so that the kubelet keeps the Pod's volumes mounted: it sleeps until SIGTERM or
//! SIGINT and exits 0. No async runtime, no threads, no allocation after start: it fits the
//! holder's 16 MiB limit many times over.
//!
//! Chosen before the agent's flags are parsed (`hold` as the first argument), so the agent's
//! own command line is unchanged.

use std::ffi::OsString;
use std::process::ExitCode;

/// The subcommand's name.
pub const SUBCOMMAND: &str = "hold";

/// What `hold --help` prints.
pub const USAGE: &str = "Usage: smolvm-runtime hold\n\n\
The container of a SmolVM's holder Pod: sleeps until SIGTERM or SIGINT, then exits 0. \
The kubelet keeps a Pod's volumes mounted while a container of it runs; the agent passes them \
on to the SmolVM.\n";

/// Whether `args` (the whole command line, program first) asks for `hold`.
pub fn requested(args: &[OsString]) -> bool {
    args.get(1).is_some_and(|a| a == SUBCOMMAND)
}

/// Runs `hold` with the arguments after it: none (or `--help`, `-h`).
pub fn run(rest: &[OsString]) -> ExitCode {
    match rest {
        [] => {}
        [help] if help == "--help" || help == "-h" => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprint!("smolvm-runtime hold takes no arguments\n\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let stopped = block_stop_signals().and_then(|set| {
        // Said once the signals are blocked: from here none is lost.
        eprintln!("smolvm-runtime hold: holding until SIGTERM");
        wait_for(&set)
    });
    match stopped {
        Ok(signal) => {
            eprintln!("smolvm-runtime hold: signal {signal}: exiting");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("smolvm-runtime hold: cannot wait for signals: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Blocks SIGTERM and SIGINT: they stay pending for [`wait_for`], which also works as PID 1
/// (where a signal without a handler would be ignored). Answers the set.
fn block_stop_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: the set lives on this stack and is initialised by sigemptyset before use; these
    // calls only read or write it and the thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        match libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) {
            0 => Ok(set),
            error => Err(std::io::Error::from_raw_os_error(error)),
        }
    }
}

/// Waits until a signal of `set` (blocked) is pending; answers which.
fn wait_for(set: &libc::sigset_t) -> std::io::Result<libc::c_int> {
    let mut signal: libc::c_int = 0;
    loop {
        // SAFETY: `set` is an initialised signal set and `signal` is valid for writes.
        match unsafe { libc::sigwait(set, &mut signal) } {
            0 => return Ok(signal),
            libc::EINTR => continue,
            error => return Err(std::io::Error::from_raw_os_error(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hold_is_the_first_argument_only() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(requested(&args(&["smolvm-runtime", "hold"])));
        assert!(!requested(&args(&["smolvm-runtime"])));
        assert!(!requested(&args(&["smolvm-runtime", "--node-name", "hold"])));
        assert!(!requested(&args(&["smolvm-runtime", "--node-name=n1", "hold"])));
    }
}
