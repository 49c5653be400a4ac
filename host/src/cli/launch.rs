//! `lsgd-host launch`: elastic restart around `mpirun -np N lsgd-host run …`, the way Horovod
//! elastic and torchrun do it on a fixed engine: the job runs to its end or fails; when it
//! failed because Open MPI lost ranks (killed by a signal, or gone without finalizing), it is
//! started again on the ranks that are left, from the newest valid checkpoint in its `--out`
//! directory, and the restart is recorded in `OUT/metrics.jsonl`.
//!
//! `--min-np` follows Horovod: it defaults to `-np`, and a job left with fewer ranks does not
//! go on. Horovod would wait for new hosts up to `--elastic-timeout`; `launch` has no host
//! discovery, so it stops at once, saying how to resume. A failure without a lost rank (a
//! plugin fault, a bad flag, missing data) is the run's own and would happen again: it is
//! never restarted, and `launch` exits with mpirun's status.

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::train::checkpoint;
use crate::train::config::Mode;
use crate::train::metrics::{Record, RestartRecord};

/// Arguments of `launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Ranks to start with (`-np N` also works, as with mpirun).
    #[arg(long = "np", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    np: u32,
    /// Fewest ranks the job may go on with after losing some (default: -np, so any loss stops
    /// it, as in Horovod).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..))]
    min_np: Option<u32>,
    /// Restarts after lost ranks before giving up.
    #[arg(long, default_value_t = 3, value_name = "R")]
    max_restarts: u32,
    /// An argument for mpirun, placed before the program (repeat for several:
    /// `--mpirun-arg=--mca --mpirun-arg=btl --mpirun-arg=self,vader`).
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    mpirun_arg: Vec<String>,
    /// The mpirun to run.
    #[arg(long, default_value = "mpirun", value_name = "PATH")]
    mpirun: PathBuf,
    /// `run` and its flags, after `--`.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "run …"
    )]
    command: Vec<OsString>,
}

/// Removes `flag` and its value (`--flag VALUE` or `--flag=VALUE`) from `argv`.
fn drop_flag(argv: &mut Vec<OsString>, flag: &str) {
    let joined = format!("{flag}=");
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == flag {
            argv.drain(i..(i + 2).min(argv.len()));
        } else if argv[i].to_string_lossy().starts_with(&joined) {
            argv.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Rewrites `launch -np N` (mpirun's spelling, which clap cannot take as a short flag) to
/// `launch --np N`; other command lines pass unchanged, and so does everything after `--`.
pub fn spell_np(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = argv.into_iter().collect();
    if argv.get(1).is_none_or(|a| a != "launch") {
        return argv;
    }
    let mut i = 2;
    while i < argv.len() {
        let a = argv[i].to_string_lossy().into_owned();
        if a == "--" || a == "run" {
            break;
        }
        if a == "--mpirun-arg" || a == "--mpirun" {
            i += 2;
            continue;
        }
        if a == "-np" {
            argv[i] = "--np".into();
        } else if let Some(n) = a.strip_prefix("-np=") {
            argv[i] = format!("--np={n}").into();
        }
        i += 1;
    }
    argv
}

/// What the job's `run` flags say that the launcher needs.
struct Job {
    /// `run` and its flags as given.
    run: Vec<OsString>,
    out: PathBuf,
    /// The `--resume` given, if any.
    resume: Option<PathBuf>,
    global_batch: u32,
    mode: Mode,
}

impl Job {
    /// Parses `run`'s flags with `run`'s own definitions (the `--config` file's too), so the
    /// launcher sees the same `--out` and `--global-batch` the ranks will.
    fn parse(command: &[OsString]) -> Result<Job> {
        use clap::Args as _;
        if command.first().is_none_or(|c| c != "run") {
            bail!(
                "launch runs `lsgd-host run`: write `lsgd-host launch -np N -- run …` (got `{}`)",
                command
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        let parser = || {
            super::run::RunArgs::augment_args(clap::Command::new("run")).args_override_self(true)
        };
        let m = parser()
            .try_get_matches_from(command)
            .map_err(|e| anyhow::anyhow!("the run's flags after `--`: {e}"))?;
        let m = match m.get_one::<PathBuf>("config") {
            Some(path) => {
                let mut argv = command.to_vec();
                let from_file = super::run::config_args(path)?;
                argv.splice(1..1, from_file.into_iter().map(Into::into));
                parser()
                    .try_get_matches_from(argv)
                    .map_err(|e| anyhow::anyhow!("the run's flags after `--`: {e}"))?
            }
            None => m,
        };
        Ok(Job {
            run: command.to_vec(),
            out: m
                .get_one::<PathBuf>("out")
                .cloned()
                .context("run has --out")?,
            resume: m.get_one::<PathBuf>("resume").cloned(),
            global_batch: *m
                .get_one::<u32>("global_batch")
                .context("run has --global-batch")?,
            mode: *m.get_one::<Mode>("mode").context("run has --mode")?,
        })
    }
}

/// A rank Open MPI reported lost.
#[derive(Debug, Clone, PartialEq)]
struct Loss {
    rank: u32,
    /// The signal number and Open MPI's name for it (`Killed`).
    signal: Option<(i32, String)>,
}

impl Loss {
    /// Reads Open MPI's (and PRRTE's) notices of a lost process: "mpirun noticed that process
    /// rank 1 with PID 0 on node vm exited on signal 9 (Killed)." and "… process rank 1 with PID
    /// 0 on node vm exiting improperly". "exited with non-zero status" is no loss: the rank
    /// ended on its own, with its own error.
    fn parse(line: &str) -> Option<Loss> {
        let (_, rest) = line.split_once("process rank ")?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let rank = digits.parse().ok()?;
        if let Some((_, sig)) = rest.split_once("exited on signal ") {
            let number: String = sig.chars().take_while(char::is_ascii_digit).collect();
            let name = sig
                .split_once('(')
                .and_then(|(_, n)| n.split_once(')'))
                .map_or(String::new(), |(n, _)| n.to_string());
            return Some(Loss {
                rank,
                signal: number.parse().ok().map(|n| (n, name)),
            });
        }
        rest.contains("exiting improperly")
            .then_some(Loss { rank, signal: None })
    }
}

/// The losses in words: "rank 1 (signal 9, Killed)".
fn describe(losses: &[Loss]) -> String {
    let one = |l: &Loss| match &l.signal {
        Some((n, name)) if !name.is_empty() => format!("rank {} (signal {n}, {name})", l.rank),
        Some((n, _)) => format!("rank {} (signal {n})", l.rank),
        None => format!("rank {} (exited without finalizing MPI)", l.rank),
    };
    let all: Vec<String> = losses.iter().map(one).collect();
    all.join(", ")
}

/// Copies a child's output to ours as it comes, and collects the lost ranks it reports.
fn pump(mut from: impl Read, mut to: impl Write, losses: Arc<Mutex<Vec<Loss>>>) {
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    let seen = |line: &mut Vec<u8>| {
        if let Some(l) = Loss::parse(&String::from_utf8_lossy(line)) {
            let mut all = losses.lock().expect("no pump panics holding the lock");
            if !all.iter().any(|o| o.rank == l.rank) {
                all.push(l);
            }
        }
        line.clear();
    };
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // A closed terminal must not stall the job: the bytes are still read and parsed.
        let _ = to.write_all(&buf[..n]).and_then(|()| to.flush());
        for &b in &buf[..n] {
            match b {
                b'\n' | b'\r' => seen(&mut line),
                // Open MPI's notices are short; a long line is something else.
                _ if line.len() < 4096 => line.push(b),
                _ => {}
            }
        }
    }
    seen(&mut line);
}

/// How one `mpirun` ended.
struct Attempt {
    status: std::process::ExitStatus,
    losses: Vec<Loss>,
}

/// Runs `mpirun -np N lsgd-host <run>` with our output streamed through.
fn attempt(args: &LaunchArgs, np: u32, run: &[OsString]) -> Result<Attempt> {
    let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
    let mut child = Command::new(&args.mpirun)
        // Ranks × threads may exceed the cores; binding would pin ranks to too few of them.
        .args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(np.to_string())
        .args(&args.mpirun_arg)
        .arg(&exe)
        .args(run)
        // Open MPI refuses to start as root without these; they change nothing for others.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "cannot run {} (Open MPI; `scripts/setup.sh` installs it)",
                args.mpirun.display()
            )
        })?;
    let losses = Arc::new(Mutex::new(Vec::new()));
    let (out, err) = (child.stdout.take(), child.stderr.take());
    let pumps = [
        out.map(|o| {
            let l = Arc::clone(&losses);
            std::thread::spawn(move || pump(o, std::io::stdout(), l))
        }),
        err.map(|e| {
            let l = Arc::clone(&losses);
            std::thread::spawn(move || pump(e, std::io::stderr(), l))
        }),
    ];
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for {}", args.mpirun.display()))?;
    for p in pumps.into_iter().flatten() {
        let _ = p.join();
    }
    let losses = std::mem::take(&mut *losses.lock().expect("the pumps have ended"));
    Ok(Attempt { status, losses })
}

/// The step of the newest valid checkpoint in `out`, or `None` when it holds none yet; an
/// error when it holds checkpoints but none loads (starting over would discard them).
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
    let whole = old.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut text: Vec<u8> = if from_scratch {
        String::from_utf8_lossy(&old[..whole])
            .lines()
            .filter(|l| matches!(serde_json::from_str(l), Ok(Record::Restart(_))))
            .flat_map(|l| format!("{l}\n").into_bytes())
            .collect()
    } else {
        old[..whole].to_vec()
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

/// Runs `launch`: the job, restarted after lost ranks until it succeeds, too few ranks are
/// left or `--max-restarts` is spent.
pub fn run(args: LaunchArgs) -> Result<bool> {
    let job = Job::parse(&args.command)?;
    let min_np = args.min_np.unwrap_or(args.np);
    if min_np > args.np {
        bail!("--min-np {min_np} is above -np {}", args.np);
    }
    let started = Instant::now();
    let mut run = job.run.clone();
    let mut np = args.np;
    let mut restarts = 0;
    loop {
        let a = attempt(&args, np, &run)?;
        if a.status.success() {
            if restarts > 0 {
                eprintln!(
                    "launch: the job finished on {np} rank(s) after {restarts} restart(s); restarts are recorded in {}",
                    job.out.join("metrics.jsonl").display()
                );
            }
            return Ok(true);
        }
        if a.losses.is_empty() {
            fail(
                a.status,
                &format!(
                    "the job on {np} rank(s) failed ({}) without losing a rank, so it is not restarted: the failure is the run's own (see its error above)",
                    a.status
                ),
            );
        }
        let lost = describe(&a.losses);
        let step = checkpoint_step(&job.out).unwrap_or_else(|e| fail(a.status, &format!("{e:#}")));
        let resume_hint = match step {
            Some(s) => format!(
                "the newest checkpoint (step {s}) is in {}; continue with `lsgd-host launch … -- run … --resume {}`",
                job.out.display(),
                job.out.display()
            ),
            None => format!("{} holds no checkpoint yet", job.out.display()),
        };
        if restarts >= args.max_restarts {
            fail(
                a.status,
                &format!(
                    "lost {lost} of {np} ranks, and --max-restarts {} is spent: giving up; {resume_hint}",
                    args.max_restarts
                ),
            );
        }
        let left = np.saturating_sub(a.losses.len() as u32);
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
        restarts += 1;
        let from = match step {
            Some(s) => {
                if job.resume.as_deref() != Some(job.out.as_path()) {
                    // Replaced, not appended: a flag given twice is refused.
                    drop_flag(&mut run, "--resume");
                    run.extend(["--resume".into(), job.out.clone().into_os_string()]);
                }
                format!(
                    "resuming from step {s} (the newest checkpoint in {})",
                    job.out.display()
                )
            }
            None => format!(
                "starting over ({} holds no checkpoint yet)",
                job.out.display()
            ),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        record_restart(
            &job.out,
            RestartRecord {
                attempt: restarts,
                lost_ranks: a.losses.iter().map(|l| l.rank).collect(),
                signal: a.losses.iter().find_map(|l| l.signal.as_ref().map(|s| s.0)),
                world_size_before: np,
                world_size_after: left,
                resumed_step: step.unwrap_or(0),
                unix_s: now,
                elapsed_s: started.elapsed().as_secs_f64(),
            },
            step.is_none() && job.resume.is_none(),
        )?;
        eprintln!(
            "launch: lost {lost} of {np} ranks; restart {restarts} of at most {}: {from} on {left} rank(s)",
            args.max_restarts
        );
        np = left;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mpi_notices_of_lost_ranks_are_read_and_exit_codes_are_not() {
        assert_eq!(
            Loss::parse(
                "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
            ),
            Some(Loss {
                rank: 1,
                signal: Some((9, "Killed".into()))
            })
        );
        assert_eq!(
            Loss::parse(
                "prterun noticed that process rank 12 with PID 4242 on node n3 exited on signal 11 (Segmentation fault)."
            ),
            Some(Loss {
                rank: 12,
                signal: Some((11, "Segmentation fault".into()))
            })
        );
        assert_eq!(
            Loss::parse(
                "mpirun has exited due to process rank 2 with PID 0 on node vm exiting improperly. There are three reasons this could occur:"
            ),
            Some(Loss {
                rank: 2,
                signal: None
            })
        );
        for line in [
            "mpirun detected that one or more processes exited with non-zero status, thus causing",
            "  Process name: [[26368,1],2]",
            "  Exit code:    2",
            "Primary job  terminated normally, but 1 process returned",
        ] {
            assert_eq!(Loss::parse(line), None, "{line}");
        }
    }

    #[test]
    fn single_dash_np_is_spelled_for_clap_before_the_run_only() {
        let argv = |s: &str| s.split(' ').map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            spell_np(argv(
                "lsgd-host launch -np 3 --mpirun-arg -np --min-np 2 -- run -np"
            )),
            argv("lsgd-host launch --np 3 --mpirun-arg -np --min-np 2 -- run -np")
        );
        assert_eq!(
            spell_np(argv("lsgd-host launch -np=3 -- run")),
            argv("lsgd-host launch --np=3 -- run")
        );
        assert_eq!(
            spell_np(argv("lsgd-host run -np 3")),
            argv("lsgd-host run -np 3")
        );
    }
}
