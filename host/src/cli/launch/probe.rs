//! Which hosts an mpirun started where `launch` runs still reaches. A restart after lost hosts
//! must not include a host whose daemon cannot call back: mpirun would wait for it forever,
//! silently. When the link of the launching host itself is cut, Open MPI names only the first
//! daemon it lost, so every other host has to be asked.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::engine::Engine;

/// How long a host has to run `true` under an mpirun from here: a daemon started and called
/// back, on a loaded machine.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The hosts of `hosts` on which `mpirun mpirun_args --host H -np 1 true` did not finish
/// within `timeout` (all asked at once), in the order given.
pub fn unreachable(
    engine: &Engine,
    mpirun_args: &[String],
    hostfile_env: Option<&Path>,
    hosts: &[String],
    timeout: Duration,
) -> Vec<String> {
    let mut probes: Vec<(&String, Option<std::process::Child>)> = hosts
        .iter()
        .map(|h| {
            let mut c = Command::new(&engine.mpirun);
            c.args(&engine.args)
                .envs(engine.env.iter().map(|(k, v)| (k, v)))
                .args(["--oversubscribe", "--bind-to", "none", "-np", "1"])
                .args(mpirun_args)
                .args(["--host", h, "true"])
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(f) = hostfile_env {
                c.env(engine.hostfile_var, f);
            }
            (h, c.spawn().ok())
        })
        .collect();
    let until = Instant::now() + timeout;
    let mut answered = Vec::new();
    loop {
        for (host, child) in &mut probes {
            if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                if status.success() {
                    answered.push(host.to_string());
                }
                // A probe that failed at once is as unreachable as one that hangs.
                child.take();
            }
        }
        if probes.iter().all(|(_, c)| c.is_none()) || Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (_, child) in &mut probes {
        if let Some(c) = child {
            // SIGKILL: with a daemon unreachable, mpirun ignores SIGTERM.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    hosts
        .iter()
        .filter(|h| !answered.contains(h))
        .cloned()
        .collect()
}

/// The sentence that names the `unreachable` hosts. When the launching host `local` is the
/// only one of `all` that answered, the likelier fault is its own link, which no host can tell
/// from theirs.
pub fn why(unreachable: &[String], all: &[String], local: &str) -> String {
    let answered: Vec<&String> = all.iter().filter(|h| !unreachable.contains(h)).collect();
    let own = if answered == [local] {
        format!(": no host but {local} answers, so {local}'s own link is likely down")
    } else {
        String::new()
    };
    format!(
        "launch: {} did not answer an mpirun from {local}, where launch runs, within {} s{own}; the restart goes on without them",
        unreachable.join(", "),
        PROBE_TIMEOUT.as_secs()
    )
}
