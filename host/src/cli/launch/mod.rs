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
//!
//! A rank that waits too long in a collective (`run --collective-timeout`) prints a
//! [`Report`] and ends. The ranks on a cut or dead host cannot report (their output cannot
//! reach mpirun), so when reports come, the ranks that did not report within a grace period
//! are the lost ones, and mpirun, which ignores SIGTERM while a daemon is unreachable, is
//! killed if it has not ended by then. Hosts left without a live rank, and hosts whose daemon
//! Open MPI lost, are dropped from the job's hostfile for the restart (`hostfile.rs`), and so
//! are hosts that no longer answer an mpirun from here (`probe.rs`).

mod hostfile;
mod probe;

use std::ffi::OsString;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::collective::watchdog::{self, Report};
use crate::train::checkpoint;
use crate::train::config::Mode;
use crate::train::metrics::{self, Record, RestartRecord};

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
    /// `--collective-timeout` (zero: none).
    collective_timeout: Duration,
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
            collective_timeout: *m
                .get_one::<Duration>("collective_timeout")
                .context("run has --collective-timeout")?,
        })
    }
}

/// A rank Open MPI reported lost, or one that did not report a collective timeout when others
/// did.
#[derive(Debug, Clone, PartialEq)]
struct Loss {
    rank: u32,
    /// The signal number and Open MPI's name for it (`Killed`).
    signal: Option<(i32, String)>,
    /// The host it ran on, when known.
    node: Option<String>,
    /// Lost because it did not report a collective timeout (Open MPI said nothing of it).
    silent: bool,
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
        let node = rest
            .split_once(" on node ")
            .and_then(|(_, n)| n.split_whitespace().next())
            .map(String::from);
        if let Some((_, sig)) = rest.split_once("exited on signal ") {
            let number: String = sig.chars().take_while(char::is_ascii_digit).collect();
            let name = sig
                .split_once('(')
                .and_then(|(_, n)| n.split_once(')'))
                .map_or(String::new(), |(n, _)| n.to_string());
            return Some(Loss {
                rank,
                signal: number.parse().ok().map(|n| (n, name)),
                node,
                silent: false,
            });
        }
        rest.contains("exiting improperly").then_some(Loss {
            rank,
            signal: None,
            node,
            silent: false,
        })
    }
}

/// The host of Open MPI's notice that it lost a daemon, and with it every rank on that host:
/// "  Remote daemon: [[51440,0],1] on node h2".
fn lost_node(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("Remote daemon")?;
    let (_, node) = rest.split_once(" on node ")?;
    node.split_whitespace().next().map(String::from)
}

/// The losses and lost hosts in words: "rank 1 (signal 9, Killed) and host(s) h2".
fn describe(losses: &[Loss], hosts: &[String]) -> String {
    let one = |l: &Loss| match &l.signal {
        _ if l.silent => format!(
            "rank {} (on {}: no collective-timeout report from it)",
            l.rank,
            l.node.as_deref().unwrap_or("an unknown host")
        ),
        Some((n, name)) if !name.is_empty() => format!("rank {} (signal {n}, {name})", l.rank),
        Some((n, _)) => format!("rank {} (signal {n})", l.rank),
        None => format!("rank {} (exited without finalizing MPI)", l.rank),
    };
    let ranks: Vec<String> = losses.iter().map(one).collect();
    let ranks = ranks.join(", ");
    match (ranks.is_empty(), hosts.is_empty()) {
        (_, true) => ranks,
        (true, false) => format!("host(s) {}", hosts.join(", ")),
        (false, false) => format!("{ranks} and host(s) {}", hosts.join(", ")),
    }
}

/// What one attempt's output said about lost ranks.
#[derive(Debug, Default)]
struct Seen {
    /// Open MPI's notices of lost ranks.
    losses: Vec<Loss>,
    /// Collective-timeout reports, one per rank.
    reports: Vec<Report>,
    /// When the first report came.
    first_report: Option<Instant>,
    /// Hosts whose daemon Open MPI lost.
    nodes: Vec<String>,
}

impl Seen {
    fn line(&mut self, line: &str) {
        if let Some(l) = Loss::parse(line) {
            if !self.losses.iter().any(|o| o.rank == l.rank) {
                self.losses.push(l);
            }
        } else if let Some(r) = Report::parse(line) {
            self.first_report.get_or_insert_with(Instant::now);
            if !self.reports.iter().any(|o| o.rank == r.rank) {
                self.reports.push(r);
            }
        } else if let Some(n) = lost_node(line)
            && !self.nodes.contains(&n)
        {
            self.nodes.push(n);
        }
    }
}

/// Copies a child's output to ours as it comes, and collects what it says of lost ranks.
fn pump(mut from: impl Read, mut to: impl Write, seen: Arc<Mutex<Seen>>) {
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    let flush = |line: &mut Vec<u8>| {
        seen.lock()
            .expect("no pump panics holding the lock")
            .line(&String::from_utf8_lossy(line));
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
                b'\n' | b'\r' => flush(&mut line),
                // Open MPI's notices are short and a timeout report lists hosts, not ranks; a
                // longer line is something else.
                _ if line.len() < 1 << 16 => line.push(b),
                _ => {}
            }
        }
    }
    flush(&mut line);
}

/// How one `mpirun` ended.
struct Attempt {
    status: std::process::ExitStatus,
    seen: Seen,
    /// Whether launch killed mpirun, which had not ended after the reports' grace period.
    killed: bool,
}

/// How long after the first collective-timeout report the other ranks have to report, and
/// mpirun to end: the reporting ranks' [`watchdog::linger`] and a margin.
fn grace(timeout: Duration) -> Duration {
    watchdog::linger(timeout) + Duration::from_secs(5)
}

/// Runs `mpirun -np N lsgd-host <run>` with our output streamed through; `hostfile_env`
/// replaces the hostfile that reached mpirun through the environment.
fn attempt(
    args: &LaunchArgs,
    mpirun_args: &[String],
    hostfile_env: Option<&Path>,
    np: u32,
    run: &[OsString],
    grace: Duration,
) -> Result<Attempt> {
    let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
    let mut command = Command::new(&args.mpirun);
    // Ranks × threads may exceed the cores; binding would pin ranks to too few of them.
    command
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
        command.env(hostfile::DEFAULT_HOSTFILE_VAR, h);
    }
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot run {} (Open MPI; `scripts/setup.sh` installs it)",
            args.mpirun.display()
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
    let wait_error = || format!("cannot wait for {}", args.mpirun.display());
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

/// The ranks lost in an attempt of `np` ranks and the hosts lost with them: Open MPI's lost
/// ranks; when ranks reported a collective timeout, also every rank that did not; the hosts
/// whose daemon Open MPI lost, and those on which no rank is left (known from the reports'
/// host lists).
fn lost(seen: &Seen, np: u32) -> (Vec<Loss>, Vec<String>) {
    let hosts = seen.reports.first().map(|r| r.hosts.as_slice());
    let host = |rank: u32| hosts.and_then(|h| h.get(rank as usize)).cloned();
    let mut losses: Vec<Loss> = seen.losses.clone();
    if !seen.reports.is_empty() {
        for rank in 0..np {
            let reported = seen.reports.iter().any(|r| r.rank == rank as usize);
            if !reported && !losses.iter().any(|l| l.rank == rank) {
                losses.push(Loss {
                    rank,
                    signal: None,
                    node: host(rank),
                    silent: true,
                });
            }
        }
        losses.sort_by_key(|l| l.rank);
    }
    let mut nodes = seen.nodes.clone();
    if let Some(hosts) = hosts {
        let alive = |h: &String| {
            (0..np).any(|r| hosts.get(r as usize) == Some(h) && !losses.iter().any(|l| l.rank == r))
        };
        for h in losses.iter().filter_map(|l| host(l.rank)) {
            if !alive(&h) && !nodes.contains(&h) {
                nodes.push(h);
            }
        }
    }
    (losses, nodes)
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
    let env = std::env::var(hostfile::DEFAULT_HOSTFILE_VAR).ok();
    let mut hosts = hostfile::Hosts::new(args.mpirun_arg.clone(), env.as_deref());
    let grace = grace(job.collective_timeout);
    loop {
        let a = attempt(
            &args,
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
        if a.status.success() {
            if restarts > 0 {
                eprintln!(
                    "launch: the job finished on {np} rank(s) after {restarts} restart(s); restarts are recorded in {}",
                    job.out.join("metrics.jsonl").display()
                );
            }
            return Ok(true);
        }
        let next = Restart::decide(&a, &args, &job, &mut hosts, np, min_np, restarts);
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

/// What a failed attempt leaves the next one: the ranks and hosts lost, the checkpoint to
/// resume and the ranks left.
struct Restart {
    losses: Vec<Loss>,
    /// The ranks and hosts lost, in words.
    lost: String,
    /// The newest checkpoint's step.
    step: Option<u64>,
    left: u32,
    /// The next attempt's hostfile and the slots the dropped hosts had.
    dropped: Option<(PathBuf, u32)>,
}

impl Restart {
    /// The restart after attempt `a` on `np` ranks, or the launcher's exit with the reason
    /// there is none: no rank lost (the failure is the run's own), `--max-restarts` spent,
    /// fewer than `--min-np` left, or a global batch the ranks left cannot share.
    fn decide(
        a: &Attempt,
        args: &LaunchArgs,
        job: &Job,
        hosts: &mut hostfile::Hosts,
        np: u32,
        min_np: u32,
        restarts: u32,
    ) -> Restart {
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
            drop_unreachable(args, hosts, &lost_hosts, &job.out, restarts + 1)
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
    fn record(&self, job: &Job, attempt: u32, np: u32, started: Instant) -> Result<()> {
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

/// After hosts were lost (`lost`), asks the hosts the restart would run on whether an mpirun
/// from here still reaches them, and drops those that do not from the hostfile
/// (`OUT/hostfile.restart-N` again); the hosts dropped and their slots.
fn drop_unreachable(
    args: &LaunchArgs,
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
    let gone = probe::unreachable(
        &args.mpirun,
        &hosts.mpirun_args,
        env,
        &all,
        probe::PROBE_TIMEOUT,
    );
    if gone.is_empty() {
        return Ok((gone, 0));
    }
    let local = crate::collective::calibrate::local_hostname();
    eprintln!("{}", probe::why(&gone, &all, &local));
    let slots = hosts.drop_hosts(&gone, out, restart)?.map_or(0, |(_, s)| s);
    Ok((gone, slots))
}

/// Points the next attempt's `run` at the newest checkpoint, if there is one; the words that
/// say where it starts.
fn resume_from(run: &mut Vec<OsString>, job: &Job, step: Option<u64>) -> String {
    match step {
        Some(s) => {
            if job.resume.as_deref() != Some(job.out.as_path()) {
                // Replaced, not appended: a flag given twice is refused.
                drop_flag(run, "--resume");
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
                signal: Some((9, "Killed".into())),
                node: Some("vm".into()),
                silent: false,
            })
        );
        assert_eq!(
            Loss::parse(
                "prterun noticed that process rank 12 with PID 4242 on node n3 exited on signal 11 (Segmentation fault)."
            ),
            Some(Loss {
                rank: 12,
                signal: Some((11, "Segmentation fault".into())),
                node: Some("n3".into()),
                silent: false,
            })
        );
        assert_eq!(
            Loss::parse(
                "mpirun has exited due to process rank 2 with PID 0 on node vm exiting improperly. There are three reasons this could occur:"
            ),
            Some(Loss {
                rank: 2,
                signal: None,
                node: Some("vm".into()),
                silent: false,
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

    fn seen(lines: &[&str]) -> Seen {
        let mut s = Seen::default();
        for l in lines {
            s.line(l);
        }
        s
    }

    const RANKS: &str = "ranks: 0-1=h1,2-3=h2,4=h3; no checkpoint yet";

    #[test]
    fn ranks_that_did_not_report_a_collective_timeout_are_lost_with_hosts_left_empty() {
        let report = |rank: u32, host: &str, peer: u32| {
            format!(
                "error: collective timeout: rank {rank} (host {host}) made no progress for 3.0 s in ring all-reduce, waiting on rank {peer} (host h2); {RANKS}"
            )
        };
        // h2 was cut: its ranks 2 and 3 cannot report; rank 1 is killed by mpirun first.
        let lines = [report(0, "h1", 3), report(4, "h3", 3), report(0, "h1", 3)];
        let s = seen(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(s.reports.len(), 2, "one report per rank");
        assert!(s.first_report.is_some());
        let (losses, hosts) = lost(&s, 5);
        let ranks: Vec<u32> = losses.iter().map(|l| l.rank).collect();
        assert_eq!(ranks, [1, 2, 3]);
        assert!(losses.iter().all(|l| l.silent && l.signal.is_none()));
        // h1 keeps rank 0, so only h2 goes.
        assert_eq!(hosts, ["h2"]);
        assert_eq!(
            describe(&losses[1..2], &[]),
            "rank 2 (on h2: no collective-timeout report from it)"
        );
    }

    #[test]
    fn open_mpi_losses_and_lost_daemons_count_without_reports() {
        let s = seen(&[
            "mpirun noticed that process rank 1 with PID 0 on node h2 exited on signal 9 (Killed).",
            "ORTE has lost communication with a remote daemon.",
            "  HNP daemon   : [[51440,0],0] on node h1",
            "  Remote daemon: [[51440,0],1] on node h3",
        ]);
        let (losses, hosts) = lost(&s, 3);
        assert_eq!(losses.len(), 1);
        assert_eq!((losses[0].rank, losses[0].silent), (1, false));
        // Without reports nothing says whether rank 1 was h2's only rank: h2 stays.
        assert_eq!(hosts, ["h3"]);
        let (losses, hosts) = lost(&seen(&["Primary job  terminated normally"]), 3);
        assert!(losses.is_empty() && hosts.is_empty());
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
