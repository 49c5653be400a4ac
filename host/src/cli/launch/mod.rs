//! `lsgd-host launch`: elastic restart around `mpirun -np N lsgd-host run …`, the way Horovod
//! elastic and torchrun do it on a fixed engine: the job runs to its end or fails; when it
//! failed because Open MPI lost ranks (killed by a signal, or gone without finalizing), it is
//! started again on the ranks that are left, from the newest valid checkpoint in its `--out`
//! directory, and the restart is recorded in `OUT/metrics.jsonl`.
//!
//! A job run with `--fault-tolerance` survives lost ranks itself and, with `--grow-back` (which
//! `launch` passes unless told `--no-grow-back`), starts replacements for them; a restart is
//! then the fallback for the job that ends all the same.
//!
//! `--min-np` follows Horovod: it defaults to `-np`, and a job left with fewer ranks does not
//! go on. Horovod would wait for new hosts up to `--elastic-timeout`; `launch` has no host
//! discovery, so it stops at once, saying how to resume. A failure without a lost rank (a
//! plugin fault, a bad flag, missing data) is the run's own and would happen again: it is
//! never restarted, and `launch` exits with mpirun's status.
//!
//! A rank that waits too long in a collective (`run --collective-timeout`) prints a
//! [`Report`](crate::collective::watchdog::Report) and ends. The ranks on a cut or dead host cannot report (their output cannot
//! reach mpirun), so when reports come, the ranks that did not report within a grace period
//! are the lost ones, and mpirun, which ignores SIGTERM while a daemon is unreachable, is
//! killed if it has not ended by then. Hosts left without a live rank, and hosts whose daemon
//! Open MPI lost, are dropped from the job's hostfile for the restart (`hostfile.rs`), and so
//! are hosts that no longer answer an mpirun from here (`probe.rs`).
//!
//! This file holds the flags and the loop over attempts; `argv.rs` reads and rewrites command
//! lines, `attempt.rs` runs and watches one mpirun, `output.rs` reads what mpirun prints, and
//! `restart.rs` decides whether and how the job goes on.

mod argv;
mod attempt;
mod engine;
mod hostfile;
mod output;
mod probe;
mod restart;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;

pub use argv::spell_np;
use argv::{Job, resume_from};
use attempt::{attempt, grace};
use restart::Restart;

/// Arguments of `launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Ranks to start with (`-np N` also works, as with mpirun).
    #[arg(long = "np", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    np: u32,
    /// Fewest ranks the job may go on with after losing some (default: -np, so any loss stops
    /// it, as in Horovod; with `run --fault-tolerance`, 1, and passed on to the run, whose
    /// survivors go on without a restart while a majority of the ranks is left).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..))]
    min_np: Option<u32>,
    /// Restarts after lost ranks before giving up.
    #[arg(long, default_value_t = 3, value_name = "R")]
    max_restarts: u32,
    /// An argument for mpirun, placed before the program (repeat for several:
    /// `--mpirun-arg=--mca --mpirun-arg=btl --mpirun-arg=self,vader`).
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    mpirun_arg: Vec<String>,
    /// With `run --fault-tolerance`: do not pass `--grow-back` to the run, so that its survivors
    /// go on with fewer ranks instead of starting replacements for the lost ones.
    #[arg(long)]
    no_grow_back: bool,
    /// The mpirun to run (default: `mpirun`; for `run --fault-tolerance`, Open MPI 5's, from
    /// `$LSGD_OMPI5`, which `scripts/setup.sh` installs).
    #[arg(long, value_name = "PATH")]
    mpirun: Option<PathBuf>,
    /// `run` and its flags, after `--`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "run …"
    )]
    command: Vec<OsString>,
}

/// Runs `launch`: the job, restarted after lost ranks until it succeeds, too few ranks are
/// left or `--max-restarts` is spent.
pub fn run(args: LaunchArgs) -> Result<bool> {
    let job = Job::parse(&args.command)?;
    let engine = engine::Engine::for_job(args.mpirun.as_deref(), job.fault_tolerance)?;
    let default_min = if job.fault_tolerance { 1 } else { args.np };
    let min_np = args.min_np.unwrap_or(default_min);
    if min_np > args.np {
        bail!("--min-np {min_np} is above -np {}", args.np);
    }
    let started = Instant::now();
    let mut run = job.run.clone();
    if job.fault_tolerance && !job.min_np_given {
        run.extend(["--min-np".into(), min_np.to_string().into()]);
    }
    // Replacements started inside the job instead of a restart: the survivors spawn them at
    // the next step boundary (run --grow-back); a restart stays the fallback for a job that
    // ends anyway (below --min-np, or Open MPI ending it).
    if job.fault_tolerance && !job.grow_back && !args.no_grow_back {
        run.push("--grow-back".into());
    }
    let mut np = args.np;
    let mut restarts = 0;
    let env = std::env::var(engine.hostfile_var).ok();
    let mut hosts = hostfile::Hosts::new(args.mpirun_arg.clone(), env.as_deref());
    let grace = grace(job.collective_timeout);
    loop {
        let a = attempt(
            &engine,
            &hosts.mpirun_args,
            hosts.env_override.as_deref(),
            np,
            &run,
            grace,
        )?;
        if a.killed {
            eprintln!(
                "launch: mpirun had not ended {:.0} s after the first collective-timeout report (a host it cannot reach); killed it",
                grace.as_secs_f64()
            );
        }
        let reached_end = job.fault_tolerance && restart::ended(&job.out);
        if !a.status.success() && reached_end {
            // Open MPI 5 reports at the job's end what ULFM survived in it: a replacement's job
            // that lost a rank, a spawn that found no slot.
            eprintln!(
                "launch: mpirun exited with {} after the run reached its end (its last checkpoint is written); the job is complete",
                a.status
            );
            return Ok(true);
        }
        let unfinished = a.status.success() && job.fault_tolerance && !reached_end;
        if unfinished {
            // PRRTE ends the whole job when a daemon dies while its network lives (its
            // connections close), whatever ULFM could do, and still exits 0.
            eprintln!(
                "launch: mpirun ended with status 0, but the run did not reach its end (its newest checkpoint is not its last): Open MPI 5 ended the job itself, as it does when it loses a daemon whose connections closed; going on as after a lost rank"
            );
        }
        if a.status.success() && !unfinished {
            if restarts > 0 {
                eprintln!(
                    "launch: the job finished on {np} rank(s) after {restarts} restart(s); restarts are recorded in {}",
                    job.out.join("metrics.jsonl").display()
                );
            }
            return Ok(true);
        }
        let bounds = restart::Bounds {
            max_restarts: args.max_restarts,
            min_np,
        };
        let next = Restart::decide(&a, bounds, &engine, &job, &mut hosts, np, restarts);
        restarts += 1;
        let from = resume_from(&mut run, &job, next.step);
        next.record(&job, restarts, np, started)?;
        let on = match &next.dropped {
            Some((file, _)) => format!(" (hostfile {} without the lost hosts)", file.display()),
            None => String::new(),
        };
        eprintln!(
            "launch: lost {} of {np} ranks; restart {restarts} of at most {}: {from} on {} rank(s){on}",
            next.lost, args.max_restarts, next.left
        );
        np = next.left;
    }
}
