//! `lsgd-host bench train`: training throughput of `lsgd-host run` against the same job in
//! PyTorch's Python API (the venv's torch: same libtorch, model, data, batch, optimiser, label
//! smoothing and thread count), and the cost of asking the policies through the sandbox
//! against the same formulas compiled natively, as a share of a training step.
//!
//! Both sides run in this one invocation, so the printed ratios compare like with like on
//! whatever machine runs it.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::policies::native_twin;
use crate::model::{Arch, ModelSpec};
use crate::optim::SgdConfig;
use crate::plugin::locate::locate;
use crate::plugin::{PolicyKind, Runtime};
use crate::policy::{Bounds, Clock, PolicySet, RunShape};
use crate::train::metrics::{self, Record};
use crate::train::{self, DeviceChoice, Reporting, TrainConfig};

/// The PyTorch script, embedded so the benchmark works from an installed binary.
const PYTORCH_SCRIPT: &str = include_str!("../../bench/pytorch_train.py");

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Network (`cnn` or `mlp`: the script mirrors those two).
    pub model: Arch,
    /// Global batch.
    pub batch: u32,
    /// libtorch threads on both sides.
    pub threads: usize,
    /// Timed steps.
    pub steps: u64,
    /// Untimed steps before them.
    pub warmup: u64,
    /// IDX directory.
    pub data: PathBuf,
    /// Python with torch importable.
    pub python: PathBuf,
}

/// The measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// lsgd-host run, samples/s over the timed steps.
    pub lsgd_samples_per_s: f64,
    /// PyTorch, samples/s over the timed steps.
    pub pytorch_samples_per_s: f64,
    /// lsgd / PyTorch.
    pub ratio: f64,
    /// torch.__version__ of the Python side.
    pub pytorch_version: String,
    /// Mean wall time of an lsgd-host step, ms.
    pub step_ms: f64,
    /// Mean time per step asking the WASM policies, µs.
    pub policy_wasm_us: f64,
    /// Mean time per step computing the same decisions natively, µs.
    pub policy_native_us: f64,
    /// (WASM − native) policy time as a percentage of the step.
    pub policy_overhead_pct: f64,
}

/// A plugin of the benchmark: its kind, name and settings.
type PolicyChoice = (
    PolicyKind,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The policies of the benchmark: every kind the contract has, with the reference plugins.
const POLICIES: &[PolicyChoice] = &[
    (PolicyKind::BatchSize, "constant-batch", &[]),
    (PolicyKind::Schedule, "warmup", &[]),
    (
        PolicyKind::LabelSmoothing,
        "label-smoothing",
        &[("epsilon", "0.1")],
    ),
];

fn load_policies(runtime: &Runtime, bounds: Bounds) -> Result<PolicySet> {
    let mut plugins = Vec::new();
    for (kind, name, settings) in POLICIES {
        let settings: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let path = locate(name).map_err(anyhow::Error::msg)?;
        let mut plugin = runtime.load(&path, Some(*kind))?;
        plugin.configure(&settings)?;
        plugins.push(plugin);
    }
    PolicySet::new(plugins, bounds).map_err(anyhow::Error::msg)
}

/// Runs both sides and the policy comparison.
pub fn run(setup: &Setup, runtime: &Runtime) -> Result<Report> {
    if !matches!(setup.model, Arch::Cnn | Arch::Mlp) {
        bail!(
            "bench train compares `cnn` or `mlp`; the PyTorch script has no {}",
            setup.model
        );
    }
    let out = std::env::temp_dir().join(format!("lsgd-bench-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let config = TrainConfig {
        model: ModelSpec {
            arch: setup.model,
            depth: 20,
            zero_init_residual: false,
        },
        sgd: SgdConfig::default(),
        epochs: 1000,
        global_batch: setup.batch,
        max_micro_batch: setup.batch,
        base_lr: 0.1,
        reference_batch: setup.batch,
        max_batch: setup.batch,
        seed: 0,
        threads: setup.threads,
        data: setup.data.clone(),
        train_subset: None,
        test_subset: Some(1),
        device: DeviceChoice::Cpu,
        out: out.clone(),
        checkpoint_every: 0,
        stop_after_steps: Some(setup.warmup + setup.steps),
        csv: false,
    };
    let bounds = Bounds {
        max_batch: setup.batch,
    };
    eprintln!(
        "lsgd-host run: {} steps of {} …",
        config.stop_after_steps.unwrap(),
        setup.batch
    );
    let summary = train::run(
        &config,
        load_policies(runtime, bounds)?,
        None,
        Reporting { quiet: true },
    )?;
    let steps: Vec<_> = metrics::read(&out.join("metrics.jsonl"))?
        .into_iter()
        .filter_map(|r| match r {
            Record::Step(s) if s.step >= setup.warmup => Some(s),
            _ => None,
        })
        .collect();
    let _ = std::fs::remove_dir_all(&out);
    let wall: f64 = steps
        .iter()
        .map(|s| f64::from(s.global_batch) / s.samples_per_s)
        .sum();
    let samples: f64 = steps.iter().map(|s| f64::from(s.global_batch)).sum();
    let lsgd_sps = samples / wall;
    let step_s = wall / steps.len() as f64;
    let policy_wasm = steps.iter().map(|s| s.policy_s).sum::<f64>() / steps.len() as f64;
    let policy_native = native_decisions(runtime, bounds, &config, summary.steps)?;

    eprintln!("PyTorch ({}): the same job …", setup.python.display());
    let (torch_sps, version) = pytorch(setup)?;
    Ok(Report {
        lsgd_samples_per_s: lsgd_sps,
        pytorch_samples_per_s: torch_sps,
        ratio: lsgd_sps / torch_sps,
        pytorch_version: version,
        step_ms: step_s * 1e3,
        policy_wasm_us: policy_wasm * 1e6,
        policy_native_us: policy_native * 1e6,
        policy_overhead_pct: 100.0 * (policy_wasm - policy_native) / step_s,
    })
}

/// Mean seconds per step to make the run's decisions with the native twins of its plugins,
/// timed the way the trainer times `PolicySet::decide` (one clock read around all three).
fn native_decisions(
    runtime: &Runtime,
    bounds: Bounds,
    config: &TrainConfig,
    steps: u64,
) -> Result<f64> {
    let set = load_policies(runtime, bounds)?;
    let twin = |k| -> Result<super::policies::NativeFn> {
        native_twin(set.get(k).expect("loaded"))?.context("no native twin")
    };
    let (mut batch, mut lr, mut eps) = (
        twin(PolicyKind::BatchSize)?,
        twin(PolicyKind::Schedule)?,
        twin(PolicyKind::LabelSmoothing)?,
    );
    let mut clock = Clock::new(RunShape {
        epochs: config.epochs,
        samples_per_epoch: 60_000,
        initial_batch: config.global_batch,
        world_size: 1,
        base_lr: config.base_lr,
        reference_batch: config.reference_batch,
    })
    .map_err(anyhow::Error::msg)?;
    let mut total = 0.0;
    for _ in 0..steps {
        let t = Instant::now();
        let b = batch(&clock.state()) as u32;
        let s = clock.state_with_batch(b);
        std::hint::black_box((lr(&s), eps(&s)));
        total += t.elapsed().as_secs_f64();
        clock.advance(b, Some(1.0));
    }
    Ok(total / steps.max(1) as f64)
}

fn pytorch(setup: &Setup) -> Result<(f64, String)> {
    let script = std::env::temp_dir().join(format!("lsgd-bench-{}.py", std::process::id()));
    std::fs::write(&script, PYTORCH_SCRIPT)?;
    let out = Command::new(&setup.python)
        .arg(&script)
        .args(["--data", &setup.data.display().to_string()])
        .args(["--model", &setup.model.to_string()])
        .args(["--batch", &setup.batch.to_string()])
        .args(["--threads", &setup.threads.to_string()])
        .args(["--steps", &setup.steps.to_string()])
        .args(["--warmup", &setup.warmup.to_string()])
        .output()
        .with_context(|| format!("cannot run {}", setup.python.display()))?;
    let _ = std::fs::remove_file(&script);
    if !out.status.success() {
        bail!(
            "the PyTorch side failed (is torch importable? `scripts/setup.sh --python-torch` installs it):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "PyTorch script printed: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    Ok((
        v["samples_per_s"].as_f64().context("no samples_per_s")?,
        v["torch"].as_str().unwrap_or("?").to_string(),
    ))
}

/// Prints the report.
pub fn print(setup: &Setup, r: &Report, mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "bench train: {} on {}, batch {}, {} thread(s), {} timed steps after {}",
        setup.model,
        setup.data.display(),
        setup.batch,
        setup.threads,
        setup.steps,
        setup.warmup
    )?;
    writeln!(
        out,
        "  lsgd-host run         {:>9.1} samples/s",
        r.lsgd_samples_per_s
    )?;
    writeln!(
        out,
        "  PyTorch {:<13} {:>9.1} samples/s",
        r.pytorch_version, r.pytorch_samples_per_s
    )?;
    writeln!(
        out,
        "  ratio                 {:>9.3}×   (goal >= 1.0×)",
        r.ratio
    )?;
    writeln!(
        out,
        "  policies per step: wasm {:.2} µs, native {:.2} µs, step {:.1} ms: overhead {:.4}% of a step (goal <= 0.5%)",
        r.policy_wasm_us, r.policy_native_us, r.step_ms, r.policy_overhead_pct
    )
}
