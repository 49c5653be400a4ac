//! `lsgd-host bench ddp`: data-parallel training throughput of `mpirun -np N lsgd-host run`
//! against the same job as PyTorch's `DistributedDataParallel` over gloo under
//! `torchrun --nproc_per_node N`: same model, data, global batch and its split across ranks,
//! threads per rank, SGD (momentum 0.9, weight decay 1e-4, label smoothing 0.1, LR 0.1) and
//! gradient bucket cap. Both sides also report their communication time per step, and
//! lsgd-host also runs with `--no-overlap`, so that what the overlapped exchange costs or buys
//! on shared memory is a ratio from the same invocation.
//!
//! Both sides run in this one invocation, alternating, so the printed ratio compares like with
//! like on whatever machine runs it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::stats::median;
use super::{TimedSteps, timed_steps};
use crate::collective::Algorithm;
use crate::model::Arch;

/// The PyTorch script, embedded so the benchmark works from an installed binary.
const DDP_SCRIPT: &str = include_str!("../../bench/pytorch_ddp.py");

/// `bench train`'s PyTorch script, which the DDP script imports its model and data from.
const TRAIN_SCRIPT: &str = include_str!("../../bench/pytorch_train.py");

/// Learning rate of both sides (lsgd-host: `--base-lr` at `--reference-batch` = the global
/// batch, so the linear scaling rule leaves it as is).
const LR: f64 = 0.1;

/// Label-smoothing ε of both sides.
const EPSILON: f64 = 0.1;

/// Weight decay of both sides: `lsgd-host run`'s default `--weight-decay`.
const WEIGHT_DECAY: f64 = 1e-4;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Network (`cnn` or `mlp`: the script mirrors those two).
    pub model: Arch,
    /// Global batch, split evenly across the ranks.
    pub batch: u32,
    /// libtorch threads per rank on both sides.
    pub threads: usize,
    /// Ranks (processes) on both sides.
    pub np: usize,
    /// Timed steps.
    pub steps: u64,
    /// Untimed steps before them.
    pub warmup: u64,
    /// Rounds of (lsgd-host, PyTorch); medians are reported.
    pub rounds: usize,
    /// IDX directory.
    pub data: PathBuf,
    /// Python with torch importable.
    pub python: PathBuf,
    /// lsgd-host's all-reduce algorithm.
    pub allreduce: Algorithm,
    /// Gradient bucket cap of both sides, MiB (lsgd-host's `--bucket-mb`, DDP's
    /// `bucket_cap_mb`).
    pub bucket_mb: f64,
}

/// The measurements; every figure is the median over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// mpirun lsgd-host run --overlap, samples/s over the timed steps.
    pub lsgd_samples_per_s: f64,
    /// torchrun DDP, samples/s over the timed steps.
    pub pytorch_samples_per_s: f64,
    /// lsgd / PyTorch.
    pub ratio: f64,
    /// lsgd-host's all-reduce algorithm.
    pub allreduce: Algorithm,
    /// Mean wall time of an lsgd-host step (rank 0), ms.
    pub lsgd_step_ms: f64,
    /// Mean time of an lsgd-host step in forward, backward and update (rank 0), ms.
    pub lsgd_compute_ms: f64,
    /// Mean time of an lsgd-host step in its collectives (rank 0), ms: the gradient buckets
    /// and the loss agreement.
    pub lsgd_communication_ms: f64,
    /// Of that, what the step waited for (rank 0), ms: the rest ran behind the backward pass
    /// (`--overlap`).
    pub lsgd_exposed_communication_ms: f64,
    /// Mean wall time of a DDP step, ms.
    pub pytorch_step_ms: f64,
    /// Mean time per DDP step that bucket all-reduces were in flight (rank 0), ms: overlapped
    /// with backward, so not time added to the step.
    pub pytorch_communication_ms: f64,
    /// Gradient buckets DDP all-reduced per step.
    pub pytorch_buckets_per_step: f64,
    /// torch.__version__ of the Python side.
    pub pytorch_version: String,
    /// The process group's backend as the Python side reports it.
    pub pytorch_backend: String,
    /// World size as the Python side reports it.
    pub pytorch_world_size: usize,
    /// Threads per rank as the Python side reports them.
    pub pytorch_threads: usize,
    /// samples/s of each round: [lsgd-host, PyTorch].
    pub rounds: Vec<[f64; 2]>,
    /// lsgd-host with `--no-overlap` (the exchange after the backward pass), samples/s.
    pub lsgd_sequential_samples_per_s: f64,
    /// lsgd-host overlapped / sequential.
    pub overlap_ratio: f64,
    /// samples/s of each round with `--no-overlap`.
    pub sequential_rounds: Vec<f64>,
}

/// One torchrun DDP run, as rank 0 printed it.
struct DdpTimed {
    samples_per_s: f64,
    step_s: f64,
    communication_s: f64,
    buckets: f64,
    version: String,
    backend: String,
    world_size: usize,
    threads: usize,
}

/// The scratch directory of one invocation, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs both sides, alternating, `setup.rounds` times.
pub fn run(setup: &Setup) -> Result<Report> {
    if !matches!(setup.model, Arch::Cnn | Arch::Mlp) {
        bail!(
            "bench ddp compares `cnn` or `mlp`; the PyTorch script has no {}",
            setup.model
        );
    }
    if setup.np == 0 || !(setup.batch as usize).is_multiple_of(setup.np) {
        bail!(
            "--global-batch {} must split evenly across --np {} ranks",
            setup.batch,
            setup.np
        );
    }
    let scratch =
        Scratch(std::env::temp_dir().join(format!("lsgd-bench-ddp-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    std::fs::create_dir_all(&scratch.0)
        .with_context(|| format!("cannot create {}", scratch.0.display()))?;
    let script = scratch.0.join("pytorch_ddp.py");
    for (path, text) in [
        (&script, DDP_SCRIPT),
        (&scratch.0.join("pytorch_train.py"), TRAIN_SCRIPT),
    ] {
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let out = scratch.0.join("run");
    // Rounds alternate the two sides, so a load that drifts over minutes (a shared machine)
    // touches each alike; the medians are reported.
    let (mut ours, mut theirs, mut sequential) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = setup.rounds.max(1);
    for round in 1..=rounds {
        eprintln!(
            "round {round}/{rounds}: mpirun -np {} lsgd-host run, with --no-overlap, torchrun \
             DDP …",
            setup.np
        );
        ours.push(lsgd(setup, &out, true)?);
        sequential.push(lsgd(setup, &out, false)?.samples_per_s);
        theirs.push(pytorch(setup, &script)?);
    }
    let sequential_sps = median(sequential.iter().copied());
    let last = theirs.last().expect("at least one round");
    let (ours_sps, theirs_sps) = (
        median(ours.iter().map(|t| t.samples_per_s)),
        median(theirs.iter().map(|t| t.samples_per_s)),
    );
    Ok(Report {
        lsgd_samples_per_s: ours_sps,
        pytorch_samples_per_s: theirs_sps,
        ratio: ours_sps / theirs_sps,
        allreduce: setup.allreduce,
        lsgd_step_ms: 1e3 * median(ours.iter().map(|t| t.step_s)),
        lsgd_compute_ms: 1e3 * median(ours.iter().map(|t| t.compute_s)),
        lsgd_communication_ms: 1e3 * median(ours.iter().map(|t| t.communication_s)),
        lsgd_exposed_communication_ms: 1e3 * median(ours.iter().map(|t| t.exposed_communication_s)),
        pytorch_step_ms: 1e3 * median(theirs.iter().map(|t| t.step_s)),
        pytorch_communication_ms: 1e3 * median(theirs.iter().map(|t| t.communication_s)),
        pytorch_buckets_per_step: median(theirs.iter().map(|t| t.buckets)),
        pytorch_version: last.version.clone(),
        pytorch_backend: last.backend.clone(),
        pytorch_world_size: last.world_size,
        pytorch_threads: last.threads,
        rounds: ours
            .iter()
            .zip(&theirs)
            .map(|(o, t)| [o.samples_per_s, t.samples_per_s])
            .collect(),
        lsgd_sequential_samples_per_s: sequential_sps,
        overlap_ratio: ours_sps / sequential_sps,
        sequential_rounds: sequential,
    })
}

/// The `run` flags every rank gets: the bench's job with `bench train`'s policies through the
/// sandbox (constant batch, label smoothing ε), the schedule without warmup so the LR is the
/// PyTorch side's constant one; one evaluation sample; stopped after the warm-up and timed
/// steps.
fn run_flags(setup: &Setup, out: &Path) -> Vec<String> {
    let batch = setup.batch.to_string();
    let mut flags: Vec<String> = [
        "--model",
        &setup.model.to_string(),
        "--global-batch",
        &batch,
        "--max-micro-batch",
        &batch,
        "--max-batch",
        &batch,
        "--reference-batch",
        &batch,
        "--base-lr",
        &LR.to_string(),
        "--momentum",
        "0.9",
        "--weight-decay",
        &WEIGHT_DECAY.to_string(),
        "--threads",
        &setup.threads.to_string(),
        "--device",
        "cpu",
        "--seed",
        "0",
        "--epochs",
        "1000",
        "--test-subset",
        "1",
        "--stop-after-steps",
        &(setup.warmup + setup.steps).to_string(),
        "--allreduce",
        setup.allreduce.name(),
        "--bucket-mb",
        &setup.bucket_mb.to_string(),
        "--batch-size",
        "constant-batch",
        "--schedule",
        "warmup",
        "--set",
        "schedule.warmup=none",
        "--label-smoothing",
        "label-smoothing",
        "--set",
        &format!("label_smoothing.epsilon={EPSILON}"),
        "--quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    flags.extend(["--data".into(), setup.data.display().to_string()]);
    flags.extend(["--out".into(), out.display().to_string()]);
    flags
}

/// `mpirun -np N lsgd-host run …`, with `--overlap` or `--no-overlap`, and rank 0's timed
/// steps.
fn lsgd(setup: &Setup, out: &Path, overlap: bool) -> Result<TimedSteps> {
    let _ = std::fs::remove_dir_all(out);
    let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
    let output = Command::new("mpirun")
        // Ranks × threads may exceed the cores; binding would pin ranks to too few of them.
        .args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(setup.np.to_string())
        .arg(&exe)
        .arg("run")
        .args(run_flags(setup, out))
        .arg(if overlap { "--overlap" } else { "--no-overlap" })
        // Open MPI refuses to start as root without these; they change nothing for others.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .context("cannot run mpirun (Open MPI; `scripts/setup.sh` installs it)")?;
    check(&output, "mpirun lsgd-host run")?;
    timed_steps(&out.join("metrics.jsonl"), setup.warmup)
}

/// `python -m torch.distributed.run --standalone --nproc_per_node N pytorch_ddp.py …` and what
/// rank 0 printed.
fn pytorch(setup: &Setup, script: &Path) -> Result<DdpTimed> {
    let output = Command::new(&setup.python)
        .args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
        ])
        .arg(format!("--nproc_per_node={}", setup.np))
        .arg(script)
        .args(["--data", &setup.data.display().to_string()])
        .args(["--model", &setup.model.to_string()])
        .args(["--global-batch", &setup.batch.to_string()])
        .args(["--threads", &setup.threads.to_string()])
        .args(["--steps", &setup.steps.to_string()])
        .args(["--warmup", &setup.warmup.to_string()])
        .args(["--lr", &LR.to_string()])
        .args(["--weight-decay", &WEIGHT_DECAY.to_string()])
        .args(["--epsilon", &EPSILON.to_string()])
        .args(["--bucket-mb", &setup.bucket_mb.to_string()])
        // torch warns at import when numpy is absent; the script does not need numpy.
        .env("PYTHONWARNINGS", "ignore::UserWarning")
        // torchrun sets 1 (and warns) when it is unset; the script sets its threads itself.
        .env("OMP_NUM_THREADS", setup.threads.to_string())
        .output()
        .with_context(|| format!("cannot run {}", setup.python.display()))?;
    check(
        &output,
        "the PyTorch side (is torch importable? `scripts/setup.sh --python-torch` installs it)",
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let v: serde_json::Value = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("the DDP script printed no JSON line: {stdout}"))?;
    let number = |key: &str| {
        v[key]
            .as_f64()
            .with_context(|| format!("the DDP script's JSON has no number `{key}`: {v}"))
    };
    let text = |key: &str| v[key].as_str().unwrap_or("?").to_string();
    Ok(DdpTimed {
        samples_per_s: number("samples_per_s")?,
        step_s: number("step_s")?,
        communication_s: number("comm_s_per_step")?,
        buckets: number("buckets_per_step")?,
        version: text("torch"),
        backend: text("backend"),
        world_size: number("world_size")? as usize,
        threads: number("threads")? as usize,
    })
}

/// An error naming `what` with its standard error when it exited unsuccessfully.
fn check(output: &Output, what: &str) -> Result<()> {
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Prints the report.
pub fn print(setup: &Setup, r: &Report, mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "bench ddp: {} on {}, global batch {} over {} ranks ({} each), {} thread(s) per rank, \
         {} MiB buckets, {} timed steps after {}, median of {} rounds",
        setup.model,
        setup.data.display(),
        setup.batch,
        setup.np,
        setup.batch as usize / setup.np.max(1),
        setup.threads,
        setup.bucket_mb,
        setup.steps,
        setup.warmup,
        r.rounds.len()
    )?;
    for (i, ([ours, theirs], sequential)) in r.rounds.iter().zip(&r.sequential_rounds).enumerate() {
        writeln!(
            out,
            "  round {}: lsgd-host {ours:.1} (--no-overlap {sequential:.1}), PyTorch DDP \
             {theirs:.1} samples/s",
            i + 1
        )?;
    }
    let ours = format!(
        "mpirun -np {} lsgd-host run (--overlap, --allreduce {})",
        setup.np, r.allreduce
    );
    let theirs = format!(
        "torchrun DDP ({}, PyTorch {})",
        r.pytorch_backend, r.pytorch_version
    );
    let w = ours.len().max(theirs.len());
    writeln!(out, "  {ours:<w$} {:>9.1} samples/s", r.lsgd_samples_per_s)?;
    writeln!(
        out,
        "  {theirs:<w$} {:>9.1} samples/s",
        r.pytorch_samples_per_s
    )?;
    writeln!(out, "  {:<w$} {:>9.3}×   (goal >= 1.0×)", "ratio", r.ratio)?;
    writeln!(
        out,
        "  lsgd-host --no-overlap {:.1} samples/s: overlapped / not {:.3}× (goal >= 0.97×)",
        r.lsgd_sequential_samples_per_s, r.overlap_ratio
    )?;
    writeln!(
        out,
        "  lsgd-host per step: {:.1} ms, compute {:.1} ms, communication {:.2} ms of which \
         {:.2} ms exposed (the rest behind the backward pass)",
        r.lsgd_step_ms, r.lsgd_compute_ms, r.lsgd_communication_ms, r.lsgd_exposed_communication_ms
    )?;
    writeln!(
        out,
        "  PyTorch DDP per step: {:.1} ms, communication {:.2} ms in flight over {:.1} bucket(s) \
         (overlapped with backward)",
        r.pytorch_step_ms, r.pytorch_communication_ms, r.pytorch_buckets_per_step
    )
}
