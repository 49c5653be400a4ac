//! The restart policy: whether a failed attempt is restarted (ranks were lost, restarts are
//! left, enough ranks remain and can share the global batch), on which hosts and from which
//! checkpoint, and the restart's record in `OUT/metrics.jsonl`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use super::argv::Job;
use super::attempt::Attempt;
use super::engine::Engine;
use super::output::{Loss, describe, lost};
use super::{hostfile, probe};
use crate::train::checkpoint;
use crate::train::config::Mode;
use crate::train::metrics::{self, Record, RestartRecord};

/// What a failed attempt leaves the next one: the ranks and hosts lost, the checkpoint to
/// resume and the ranks left.
pub(super) struct Restart {
    losses: Vec<Loss>,
    /// The ranks and hosts lost, in words.
    pub(super) lost: String,
    /// The newest checkpoint's step.
    pub(super) step: Option<u64>,
    pub(super) left: u32,
    /// The next attempt's hostfile and the slots the dropped hosts had.
    pub(super) dropped: Option<(PathBuf, u32)>,
}

/// How far the launcher goes: `--max-restarts` and `--min-np`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    pub(super) max_restarts: u32,
    pub(super) min_np: u32,
}

impl Restart {
    /// The restart after attempt `a` on `np` ranks, or the launcher's exit with the reason
    /// there is none: no rank lost (the failure is the run's own), `--max-restarts` spent,
    /// fewer than `--min-np` left, or a global batch the ranks left cannot share.
    pub(super) fn decide(
        a: &Attempt,
        bounds: Bounds,
        engine: &Engine,
        job: &Job,
        hosts: &mut hostfile::Hosts,
        np: u32,
        restarts: u32,
    ) -> Restart {
        let Bounds {
            max_restarts,
            min_np,
        } = bounds;
        let (losses, lost_hosts) = lost(&a.seen, np);
        if losses.is_empty() && lost_hosts.is_empty() {
            fail(
                a.status,
                &format!(
                    "the job on {np} rank(s) failed ({}) without losing a rank, so it is not restarted: the failure is the run's own (see its error above)",
                    a.status
                ),
            );
        }
        let mut lost = describe(&losses, &lost_hosts);
        let step = checkpoint_step(&job.out).unwrap_or_else(|e| fail(a.status, &format!("{e:#}")));
        let resume_hint = resume_hint(&job.out, step);
        if restarts >= max_restarts {
            fail(
                a.status,
                &format!(
                    "lost {lost} of {np} ranks, and --max-restarts {} is spent: giving up; {resume_hint}",
                    max_restarts
                ),
            );
        }
        // The next attempt's hostfile is written before anything else can stop the job, so
        // that a `--resume` by hand finds it too.
        let dropped = hosts
            .drop_hosts(&lost_hosts, &job.out, restarts + 1)
            .unwrap_or_else(|e| fail(a.status, &format!("{e:#}")));
        // A host lost with its daemon took ranks Open MPI did not name: as many as its slots.
        let unnamed = match &dropped {
            Some((_, slots)) if losses.is_empty() => *slots,
            _ => 0,
        };
        let (unreachable, slots) =
            drop_unreachable(engine, hosts, &lost_hosts, &job.out, restarts + 1)
                .unwrap_or_else(|e| fail(a.status, &format!("{e:#}")));
        if !unreachable.is_empty() {
            lost = format!("{lost} and unreachable host(s) {}", unreachable.join(", "));
        }
        let left = np.saturating_sub(losses.len() as u32 + unnamed + slots);
        if left < min_np {
            fail(
                a.status,
                &format!(
                    "lost {lost} of {np} ranks: {left} rank(s) left, fewer than --min-np {min_np}, so the job stops (as Horovod elastic does when no host comes back; launch has no host discovery); {resume_hint}"
                ),
            );
        }
        if job.mode == Mode::Sync && !job.global_batch.is_multiple_of(left) {
            fail(
                a.status,
                &format!(
                    "lost {lost} of {np} ranks: cannot restart on the {left} left, the global batch {} is not divisible by the new world size {left}; {resume_hint}",
                    job.global_batch
                ),
            );
        }
        Restart {
            losses,
            lost,
            step,
            left,
            dropped,
        }
    }

    /// Appends restart number `attempt` to the run's metrics.jsonl.
    pub(super) fn record(&self, job: &Job, attempt: u32, np: u32, started: Instant) -> Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        record_restart(
            &job.out,
            RestartRecord {
                attempt,
                lost_ranks: self.losses.iter().map(|l| l.rank).collect(),
                signal: self
                    .losses
                    .iter()
                    .find_map(|l| l.signal.as_ref().map(|s| s.0)),
                world_size_before: np,
                world_size_after: self.left,
                resumed_step: self.step.unwrap_or(0),
                unix_s: now,
                elapsed_s: started.elapsed().as_secs_f64(),
            },
            self.step.is_none() && job.resume.is_none(),
        )
    }
}

/// How to go on by hand from `out`, whose newest checkpoint is at `step`, after the launcher
/// gave up.
fn resume_hint(out: &Path, step: Option<u64>) -> String {
    match step {
        Some(s) => format!(
            "the newest checkpoint (step {s}) is in {}; continue with `lsgd-host launch … -- run … --resume {}`",
            out.display(),
            out.display()
        ),
        None => format!("{} holds no checkpoint yet", out.display()),
    }
}

/// After hosts were lost (`lost`), asks the hosts the restart would run on whether an mpirun
/// from here still reaches them, and drops those that do not from the hostfile
/// (`OUT/hostfile.restart-N` again); the hosts dropped and their slots.
fn drop_unreachable(
    engine: &Engine,
    hosts: &mut hostfile::Hosts,
    lost: &[String],
    out: &Path,
    restart: u32,
) -> Result<(Vec<String>, u32)> {
    let all = hosts.current()?;
    if lost.is_empty() || all.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let env = hosts.env_override.as_deref();
    let gone = probe::unreachable(engine, &hosts.mpirun_args, env, &all, probe::PROBE_TIMEOUT);
    if gone.is_empty() {
        return Ok((gone, 0));
    }
    let local = crate::collective::calibrate::local_hostname();
    eprintln!("{}", probe::why(&gone, &all, &local));
    let slots = hosts.drop_hosts(&gone, out, restart)?.map_or(0, |(_, s)| s);
    Ok((gone, slots))
}

/// The step of the newest valid checkpoint in `out`, or `None` when it holds none yet; an
/// error when it holds checkpoints but none loads (starting over would discard them).
/// Whether the run in `out` reached its end: its newest checkpoint is the one a run writes
/// last (after its last step, or at `--stop-after-steps`).
pub(super) fn ended(out: &Path) -> bool {
    checkpoint::load(out).is_ok_and(|(meta, _)| meta.reason == "final" || meta.reason == "stopped")
}

fn checkpoint_step(out: &Path) -> Result<Option<u64>> {
    let any = fs::read_dir(out).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("checkpoint") && name.ends_with(".json")
        })
    });
    if !any {
        return Ok(None);
    }
    let (meta, _) = checkpoint::load(out).with_context(|| {
        format!(
            "{} holds checkpoints but none can be resumed; not starting over, which would discard them",
            out.display()
        )
    })?;
    Ok(Some(meta.step))
}

/// Appends `record` to `OUT/metrics.jsonl`, replacing the file atomically. A line the lost
/// ranks left half-written is dropped (it was past the checkpoint), and when the job starts
/// over without one, so are the failed attempt's records other than restarts (the new run
/// keeps the file only when restarts are all it holds).
fn record_restart(out: &Path, record: RestartRecord, from_scratch: bool) -> Result<()> {
    let path = out.join("metrics.jsonl");
    fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let old = fs::read(&path).unwrap_or_default();
    let whole = metrics::whole_lines(&old);
    let mut text: Vec<u8> = if from_scratch {
        String::from_utf8_lossy(whole)
            .lines()
            .filter(|l| matches!(serde_json::from_str(l), Ok(Record::Restart(_))))
            .flat_map(|l| format!("{l}\n").into_bytes())
            .collect()
    } else {
        whole.to_vec()
    };
    serde_json::to_writer(&mut text, &Record::Restart(record)).context("restart record")?;
    text.push(b'\n');
    let tmp = out.join("metrics.jsonl.launch.tmp");
    fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
    fs::rename(&tmp, &path).with_context(|| format!("cannot replace {}", path.display()))
}

/// Prints `message` as an error and exits with mpirun's status (2 when it has none).
fn fail(status: std::process::ExitStatus, message: &str) -> ! {
    eprintln!("error: launch: {message}");
    let code = status.code().filter(|c| *c != 0).unwrap_or(2);
    std::process::exit(code)
}
