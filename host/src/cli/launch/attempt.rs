//! One try of the job: `mpirun -np N lsgd-host run …` started, its output pumped through
//! [`output`](super::output), and mpirun killed when it outlives the grace period after the
//! first collective-timeout report.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::engine::Engine;
use super::output::{Seen, pump};
use crate::collective::watchdog;

/// How one `mpirun` ended.
pub(super) struct Attempt {
    pub(super) status: std::process::ExitStatus,
    pub(super) seen: Seen,
    /// Whether launch killed mpirun, which had not ended after the reports' grace period.
    pub(super) killed: bool,
}

/// How long after the first collective-timeout report the other ranks have to report, and
/// mpirun to end: the reporting ranks' [`watchdog::linger`] and a margin.
pub(super) fn grace(timeout: Duration) -> Duration {
    watchdog::linger(timeout) + Duration::from_secs(5)
}

/// Runs `mpirun -np N lsgd-host <run>` with our output streamed through; `hostfile_env`
/// replaces the hostfile that reached mpirun through the environment.
pub(super) fn attempt(
    engine: &Engine,
    mpirun_args: &[String],
    hostfile_env: Option<&Path>,
    np: u32,
    run: &[OsString],
    grace: Duration,
) -> Result<Attempt> {
    let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
    let mut command = Command::new(&engine.mpirun);
    // Ranks × threads may exceed the cores; binding would pin ranks to too few of them.
    command
        .args(&engine.args)
        .envs(engine.env.iter().map(|(k, v)| (k, v)))
        .args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(np.to_string())
        .args(mpirun_args)
        .arg(&exe)
        .args(run)
        // Open MPI refuses to start as root without these; they change nothing for others.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(h) = hostfile_env {
        command.env(engine.hostfile_var, h);
    }
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot run {} (Open MPI; `scripts/setup.sh` installs it)",
            engine.mpirun.display()
        )
    })?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let pumps = [
        out.map(|o| {
            let s = Arc::clone(&seen);
            std::thread::spawn(move || pump(o, std::io::stdout(), s))
        }),
        err.map(|e| {
            let s = Arc::clone(&seen);
            std::thread::spawn(move || pump(e, std::io::stderr(), s))
        }),
    ];
    let wait_error = || format!("cannot wait for {}", engine.mpirun.display());
    let mut killed = false;
    let status = loop {
        if let Some(s) = child.try_wait().with_context(wait_error)? {
            break s;
        }
        let first = seen.lock().expect("no pump panics").first_report;
        if first.is_some_and(|t| t.elapsed() > grace) {
            // SIGKILL: with a daemon unreachable, mpirun ignores SIGTERM.
            let _ = child.kill();
            killed = true;
            break child.wait().with_context(wait_error)?;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // A killed mpirun's helpers (its ssh to a cut host) may hold the pipes open: their
    // readers are left behind after a short wait rather than waited for.
    let until = Instant::now() + Duration::from_secs(if killed { 2 } else { 3600 });
    for p in pumps.into_iter().flatten() {
        while !p.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if p.is_finished() {
            let _ = p.join();
        }
    }
    let seen = std::mem::take(&mut *seen.lock().expect("no pump panics"));
    Ok(Attempt {
        status,
        seen,
        killed,
    })
}
