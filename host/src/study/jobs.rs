//! A study's training jobs: each is this binary's `run` with the job's flags, into
//! `OUT/jobs/<id>/`. A job that ended (finished, or diverged, which is a result too) leaves
//! `study-job.json` naming its flags; a later call with the same flags reads its metrics
//! instead of training again, and any other directory there is cleared and trained afresh.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::Settings;
use crate::train::metrics::{self, EvalRecord, Record, StepRecord};

/// The file that marks a job as done.
const MARKER: &str = "study-job.json";

/// One training run of a study.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Directory name under `jobs/`, unique in the study.
    pub id: String,
    /// `run` flags (the study adds `--out`, `--threads`, `--device`, `--dataset`, `--data-dir`
    /// and `--quiet`).
    pub args: Vec<String>,
    /// Ranks: 1 runs the binary directly, more start it under `mpirun`.
    pub ranks: u32,
}

impl Job {
    /// A single-process job.
    pub fn new(id: impl Into<String>, args: Vec<String>) -> Job {
        Job {
            id: id.into(),
            args,
            ranks: 1,
        }
    }

    /// The job on `ranks` mpirun ranks.
    pub fn on_ranks(self, ranks: u32) -> Job {
        Job { ranks, ..self }
    }

    /// `args` as `run` takes them: a plan writes a change to a preset as the same flag again
    /// (LAMB's `--base-lr` after Goyal's), and `run` refuses a flag given twice, so an earlier
    /// `--flag VALUE` that a later one replaces is left out (`--set` repeats, and stays).
    pub fn run_args(&self) -> Vec<String> {
        let a = &self.args;
        let replaced =
            |i: usize| a[i].starts_with("--") && a[i] != "--set" && a[i + 1..].contains(&a[i]);
        let mut out = Vec::with_capacity(a.len());
        let mut i = 0;
        while i < a.len() {
            if replaced(i) {
                let has_value = a.get(i + 1).is_some_and(|v| !v.starts_with("--"));
                i += 1 + usize::from(has_value);
                continue;
            }
            out.push(a[i].clone());
            i += 1;
        }
        out
    }
}

/// How a job ended.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Status {
    /// It trained every epoch.
    Finished,
    /// The host stopped it: the loss was no longer finite.
    Diverged {
        /// The step whose loss was not finite.
        step: u64,
    },
}

/// What `study-job.json` holds.
#[derive(Serialize, Deserialize, Debug)]
struct Marker {
    args: Vec<String>,
    ranks: u32,
    #[serde(flatten)]
    status: Status,
    /// Seconds the job took to train.
    wall_s: f64,
    /// libtorch threads of each rank.
    threads: usize,
}

/// A job's result: its status and its metrics.jsonl.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The job's id.
    pub id: String,
    /// Finished or diverged.
    pub status: Status,
    /// Every record of its metrics.jsonl.
    pub records: Vec<Record>,
    /// Seconds it took to train (when it was trained, possibly by an earlier call).
    pub wall_s: f64,
    /// Its run directory.
    pub dir: PathBuf,
    /// Whether an earlier call trained it.
    pub reused: bool,
}

impl Outcome {
    /// Its evaluations in order.
    pub fn evals(&self) -> impl Iterator<Item = &EvalRecord> {
        self.records.iter().filter_map(Record::as_eval)
    }

    /// Its optimizer steps in order.
    pub fn steps(&self) -> impl Iterator<Item = &StepRecord> {
        self.records.iter().filter_map(Record::as_step)
    }

    /// Final top-1 test accuracy in %, or `None` when it diverged.
    pub fn accuracy(&self) -> Option<f64> {
        match self.status {
            Status::Finished => self.evals().last().map(|e| 100.0 * e.test_acc),
            Status::Diverged { .. } => None,
        }
    }

    /// Final top-1 test error in %, or `None` when it diverged.
    pub fn error(&self) -> Option<f64> {
        self.accuracy().map(|a| 100.0 - a)
    }

    /// Final test error in %, chance level (90% on ten classes) when it diverged, for plots.
    pub fn error_or_chance(&self) -> f64 {
        self.accuracy().map_or(90.0, |a| 100.0 - a)
    }

    /// Optimizer steps it took.
    pub fn step_count(&self) -> usize {
        self.steps().count()
    }

    /// Mean of `f` over its steps (0 without steps).
    pub fn mean_over_steps(&self, f: impl Fn(&StepRecord) -> f64) -> f64 {
        let (sum, n) = self
            .steps()
            .fold((0.0, 0usize), |(s, n), r| (s + f(r), n + 1));
        if n == 0 { 0.0 } else { sum / n as f64 }
    }

    /// "91.23%" or "diverged (step 12)".
    pub fn describe(&self) -> String {
        match (self.status, self.accuracy()) {
            (Status::Diverged { step }, _) => format!("diverged at step {step}"),
            (Status::Finished, Some(a)) => format!("test accuracy {a:.2}%"),
            (Status::Finished, None) => "finished without an evaluation".into(),
        }
    }
}

/// The outcomes of the job `id(seed)` for each of `seeds` (those that exist), in seed order.
pub fn of_seeds<'a>(
    outcomes: &'a [Outcome],
    seeds: &[u64],
    id: impl Fn(u64) -> String,
) -> Vec<&'a Outcome> {
    seeds
        .iter()
        .filter_map(|&s| {
            let id = id(s);
            outcomes.iter().find(|o| o.id == id)
        })
        .collect()
}

/// Runs every job that has not run with the same flags yet, `settings.parallel` at a time
/// (one at a time when any needs ranks: they use every core), and returns all their outcomes
/// in the order of `jobs`. The first job that fails for another reason than divergence stops
/// the study with its log.
pub fn run_all(settings: &Settings, jobs: &[Job]) -> Result<Vec<Outcome>> {
    let root = settings.out.join("jobs");
    fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    for (i, a) in jobs.iter().enumerate() {
        if jobs[..i].iter().any(|b| b.id == a.id) {
            bail!("two jobs of the study are both called {}", a.id);
        }
    }
    let parallel = if jobs.iter().any(|j| j.ranks > 1) {
        1
    } else {
        settings.parallel.max(1)
    };
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<Outcome>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..parallel.min(jobs.len()) {
            scope.spawn(|| {
                while !failed.load(Ordering::SeqCst) {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = jobs.get(i) else { break };
                    let result = outcome(settings, job, &root.join(&job.id));
                    let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                    match &result {
                        Ok(o) => eprintln!(
                            "[{n}/{}] {}: {} ({:.0} s{})",
                            jobs.len(),
                            job.id,
                            o.describe(),
                            o.wall_s,
                            if o.reused { ", trained earlier" } else { "" }
                        ),
                        Err(_) => failed.store(true, Ordering::SeqCst),
                    }
                    results.lock().expect("no job thread panics")[i] = Some(result);
                }
            });
        }
    });
    let results = results.into_inner().expect("no job thread panics");
    if let Some(e) = results.iter().position(|r| matches!(r, Some(Err(_)))) {
        let Some(Some(Err(e))) = results.into_iter().nth(e) else {
            unreachable!("just found")
        };
        return Err(e);
    }
    Ok(results
        .into_iter()
        .map(|r| r.expect("every job ran").expect("no job failed"))
        .collect())
}

/// Whether `job` ended before with the same flags (its outcome would be read back).
pub fn finished(settings: &Settings, job: &Job) -> bool {
    earlier(&settings.out.join("jobs").join(&job.id), job).is_some()
}

fn earlier(dir: &Path, job: &Job) -> Option<Marker> {
    fs::read_to_string(dir.join(MARKER))
        .ok()
        .and_then(|text| serde_json::from_str::<Marker>(&text).ok())
        .filter(|m| m.args == job.args && m.ranks == job.ranks)
}

/// The job's outcome: read back when it ended before with the same flags, else trained.
fn outcome(settings: &Settings, job: &Job, dir: &Path) -> Result<Outcome> {
    let marker = dir.join(MARKER);
    let earlier = earlier(dir, job);
    let reused = earlier.is_some();
    let (status, wall_s) = match earlier {
        Some(m) => (m.status, m.wall_s),
        None => {
            let (status, wall_s) = train(settings, job, dir)?;
            let m = Marker {
                args: job.args.clone(),
                ranks: job.ranks,
                status,
                wall_s,
                threads: settings.threads,
            };
            fs::write(&marker, serde_json::to_string_pretty(&m)?)
                .with_context(|| format!("cannot write {}", marker.display()))?;
            (status, wall_s)
        }
    };
    let records = metrics::read(&dir.join("metrics.jsonl"))
        .with_context(|| format!("job {} in {}", job.id, dir.display()))?;
    Ok(Outcome {
        id: job.id.clone(),
        status,
        records,
        wall_s,
        dir: dir.to_path_buf(),
        reused,
    })
}

/// Trains the job into a fresh `dir`, its output in `dir/run.log`.
fn train(settings: &Settings, job: &Job, dir: &Path) -> Result<(Status, f64)> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log_path = dir.join("run.log");
    let log =
        File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
    let mut cmd = if job.ranks > 1 {
        let mut c = match &settings.netlab {
            Some(lab) => {
                let mut c = Command::new("bash");
                c.arg(lab).args(["run", "--"]).arg(&settings.mpirun);
                c
            }
            None => Command::new(&settings.mpirun),
        };
        // Ranks × threads may exceed the cores; binding would pin ranks to too few of them.
        c.args(["--oversubscribe", "--bind-to", "none", "-np"])
            .arg(job.ranks.to_string())
            .arg(&exe)
            // Open MPI refuses to start as root without these; they change nothing for others.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        // The ranks of a study share one machine: shared memory, no network probing.
        if std::env::var_os("OMPI_MCA_btl").is_none() {
            c.env("OMPI_MCA_btl", "self,vader");
        }
        c
    } else {
        Command::new(&exe)
    };
    cmd.arg("run")
        .args(job.run_args())
        .arg("--out")
        .arg(dir)
        .args(["--quiet", "--device", "cpu", "--threads"])
        .arg(settings.threads.to_string())
        .arg("--dataset")
        .arg(settings.recipe.dataset.to_string())
        .arg("--data-dir")
        .arg(&settings.data)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let started = Instant::now();
    let status = cmd.status().with_context(|| {
        if job.ranks > 1 {
            format!(
                "job {}: cannot run {} (Open MPI; `scripts/setup.sh` installs it)",
                job.id,
                settings.mpirun.display()
            )
        } else {
            format!("job {}: cannot run {}", job.id, exe.display())
        }
    })?;
    let wall_s = started.elapsed().as_secs_f64();
    if status.success() {
        return Ok((Status::Finished, wall_s));
    }
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    if let Some(step) = diverged_at(&text) {
        return Ok((Status::Diverged { step }, wall_s));
    }
    let tail: Vec<&str> = text.lines().rev().take(20).collect();
    bail!(
        "job {} failed ({status}); its log {} ends:\n{}",
        job.id,
        log_path.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}

/// The step of the host's "training diverged at step N" message, if the log has it.
fn diverged_at(log: &str) -> Option<u64> {
    let (_, rest) = log.split_once("training diverged at step ")?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divergence_is_read_from_the_hosts_message() {
        let log = "error: rank 0: training diverged at step 17: loss NaN (lr 3.2, batch 4096)";
        assert_eq!(diverged_at(log), Some(17));
        assert_eq!(diverged_at("error: job failed"), None);
    }

    #[test]
    fn markers_round_trip_both_statuses() {
        for status in [Status::Finished, Status::Diverged { step: 3 }] {
            let m = Marker {
                args: vec!["--epochs".into(), "2".into()],
                ranks: 2,
                status,
                wall_s: 1.5,
                threads: 1,
            };
            let back: Marker = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
            assert_eq!(back.status, status);
            assert_eq!(back.args, m.args);
        }
    }
}
