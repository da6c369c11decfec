//! Child processes of the harness: each logs to its own file, is killed when dropped, and dies
//! with the harness (PR_SET_PDEATHSIG), so a crashed test run leaves nothing behind.

use std::{
    ffi::OsStr,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::Context as _;

/// A running child process.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    /// How it was started, so [`Proc::respawn`] can start it again as a kubelet restarts a
    /// container: the same program, arguments and environment.
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: Vec<(String, String)>,
}

impl Proc {
    /// Starts `program` with `args` and extra `env`, logging stdout and stderr to `log`.
    pub fn spawn<I, S>(
        name: &str,
        program: &Path,
        args: I,
        env: &[(String, String)],
        log: &Path,
    ) -> anyhow::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().to_os_string()).collect();
        let child = launch(name, program, &args, env, log)?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            program: program.to_path_buf(),
            args,
            env: env.to_vec(),
        })
    }

    /// Starts it again as it was first started, with `extra` environment on top (an empty
    /// `extra` restores the first environment); SIGKILLs the running one first, if any.
    pub fn respawn(&mut self, extra: &[(String, String)]) -> anyhow::Result<()> {
        self.kill();
        let env: Vec<(String, String)> = self.env.iter().chain(extra).cloned().collect();
        self.child = Some(launch(&self.name, &self.program, &self.args, &env, &self.log)?);
        Ok(())
    }

    /// Whether it runs (was started and not killed by the harness).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether it has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `lines` lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// SIGKILL, as a crash or an OOM kill would: no graceful shutdown.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: the process stays, holds its sockets and answers nothing, as a hung pod would.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`Proc::pause`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok()) {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(3));
    }
}

/// Starts one child of a [`Proc`], logging to `log` (appended), dying with the harness.
fn launch(
    name: &str,
    program: &Path,
    args: &[std::ffi::OsString],
    env: &[(String, String)],
    log: &Path,
) -> anyhow::Result<Child> {
    // Appended: a restarted component keeps the log of its earlier runs above.
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to SIGKILL this child when
    // the thread that spawned it exits. The harness spawns from its long-lived main thread.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {name} ({})", program.display()))
}

/// The last `lines` lines of a file ("" when unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A loopback TCP port for a harness server, free now and outside the ephemeral range (see
/// `smolvm_testkit::node::listen_port`).
pub fn free_port() -> anyhow::Result<u16> {
    smolvm_testkit::node::listen_port().context("finding a free port")
}
