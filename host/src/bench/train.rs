//! `lsgd-host bench train`: training throughput of `lsgd-host run` against the same job in
//! PyTorch's Python API (the venv's torch: same libtorch, model, data, batch, optimiser, label
//! smoothing and thread count), and the cost of asking the policies through the sandbox
//! against the same formulas compiled natively, as a share of a training step.
//!
//! With `--precision bf16|fp16` every round also trains both sides at that precision
//! (lsgd-host's autocast, PyTorch's `torch.autocast`), so the speed-up over fp32 is measured in
//! the same run as fp32 itself.
//!
//! Both sides run in this one invocation, so the printed ratios compare like with like on
//! whatever machine runs it.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::policies::native_twin;
use super::stats::median;
use super::{TimedJob, TimedSteps as Timed, timed_steps};
use crate::model::{Arch, ModelSpec, Shortcut};
use crate::plugin::{PolicyKind, Runtime};
use crate::policy::{Bounds, PolicySet};
use crate::precision::Precision;
use crate::train::augment::Augment;
use crate::train::data::DatasetKind;
use crate::train::{self, DeviceChoice, Reporting, TrainConfig};
use tch::Device;

/// The PyTorch script, embedded so the benchmark works from an installed binary.
const PYTORCH_SCRIPT: &str = include_str!("../../bench/pytorch_train.py");

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Network (`cnn`, `mlp` or `resnet`: the script mirrors those).
    pub model: Arch,
    /// ResNet depth.
    pub depth: u32,
    /// The data set (IDX or CIFAR: the script reads those).
    pub dataset: DatasetKind,
    /// Training augmentation on both sides.
    pub augment: Augment,
    /// Global batch.
    pub batch: u32,
    /// libtorch threads on both sides.
    pub threads: usize,
    /// Timed steps.
    pub steps: u64,
    /// Untimed steps before them.
    pub warmup: u64,
    /// Rounds of (WASM run, native run, PyTorch run); medians are reported.
    pub rounds: usize,
    /// The data set's directory.
    pub data: PathBuf,
    /// Python with torch importable.
    pub python: PathBuf,
    /// A precision to time beside fp32 (`Fp32`: none).
    pub precision: Precision,
    /// Where both sides train: the CPU, or the first CUDA GPU.
    pub device: Device,
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
    /// lsgd-host run with the policies compiled natively, samples/s.
    pub native_samples_per_s: f64,
    /// Mean wall time of an lsgd-host step, ms.
    pub step_ms: f64,
    /// Mean time per step asking the WASM policies, µs.
    pub policy_wasm_us: f64,
    /// Mean time per step computing the same decisions natively, µs.
    pub policy_native_us: f64,
    /// (WASM − native) policy time as a percentage of the step.
    pub policy_overhead_pct: f64,
    /// samples/s of each round: [WASM policies, native policies, PyTorch].
    pub rounds: Vec<[f64; 3]>,
    /// Both sides at `--precision`, when it is not fp32.
    pub precision: Option<PrecisionReport>,
}

/// Both sides at a lower precision, against their fp32 figures of the same rounds.
#[derive(Debug, Clone, Serialize)]
pub struct PrecisionReport {
    /// `bf16` or `fp16`.
    pub precision: Precision,
    /// lsgd-host run at that precision, samples/s (median).
    pub lsgd_samples_per_s: f64,
    /// PyTorch under torch.autocast, samples/s (median).
    pub pytorch_samples_per_s: f64,
    /// lsgd-host at that precision / lsgd-host in fp32.
    pub lsgd_speedup: f64,
    /// PyTorch at that precision / PyTorch in fp32.
    pub pytorch_speedup: f64,
    /// lsgd-host / PyTorch at that precision.
    pub ratio: f64,
    /// samples/s of each round: [lsgd-host, PyTorch].
    pub rounds: Vec<[f64; 2]>,
    /// The CPU's 16-bit float instructions among `avx512_bf16`, `amx_bf16`, `avx512_fp16`,
    /// `amx_fp16` (`/proc/cpuinfo` flags): without them libtorch converts in software.
    pub cpu_flags: Vec<String>,
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
        plugins.push(runtime.load_configured(name, Some(*kind), &settings)?);
    }
    Ok(PolicySet::new(plugins, bounds)?)
}

/// The run both lsgd-host sides time: the bench's model and batch, one evaluation sample,
/// stopped after the warm-up and timed steps.
fn train_config(setup: &Setup, out: &std::path::Path, precision: Precision) -> TrainConfig {
    TimedJob {
        model: ModelSpec {
            arch: setup.model,
            depth: setup.depth,
            zero_init_residual: false,
            shortcut: Shortcut::A,
            script: None,
        },
        dataset: setup.dataset,
        data: &setup.data,
        augment: setup.augment,
        image_size: crate::train::config::default_image_size(),
        loader_threads: crate::train::config::default_loader_threads(),
        batch: setup.batch,
        threads: setup.threads,
        precision,
        device: match setup.device {
            Device::Cpu => DeviceChoice::Cpu,
            _ => DeviceChoice::Cuda,
        },
        steps: setup.warmup + setup.steps,
        out,
    }
    .config()
}

/// Writes `n` random training images (and 100 test images) in `dataset`'s record format into
/// `dir`: CIFAR-10's five batches or CIFAR-100's `train.bin`, for timing without the download.
pub fn synthetic_records(dataset: DatasetKind, n: usize, dir: &std::path::Path) -> Result<()> {
    let (files, record): (Vec<(String, usize)>, usize) = match dataset {
        DatasetKind::Cifar10 => {
            let mut f: Vec<_> = (1..=5)
                .map(|b| {
                    (
                        format!("data_batch_{b}.bin"),
                        n / 5 + usize::from(b <= n % 5),
                    )
                })
                .collect();
            f.push(("test_batch.bin".into(), 100));
            (f, 3073)
        }
        DatasetKind::Cifar100 => (
            vec![("train.bin".into(), n), ("test.bin".into(), 100)],
            3074,
        ),
        other => bail!("--synthetic writes cifar10 or cifar100 records, not {other}"),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for (name, count) in files {
        let mut bytes = vec![0u8; count * record];
        for (i, chunk) in bytes.chunks_exact_mut(record).enumerate() {
            for b in chunk.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = (state >> 56) as u8;
            }
            // Labels in range: the fine label last before the pixels.
            chunk[record - 3073] = (i % 10) as u8;
            chunk[0] = (i % 10) as u8;
        }
        let path = dir.join(&name);
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Refuses a setup the PyTorch script cannot mirror (its models, data formats and
/// augmentations).
fn mirrored(setup: &Setup) -> Result<()> {
    if !matches!(setup.model, Arch::Cnn | Arch::Mlp | Arch::Resnet) {
        bail!(
            "bench train compares `cnn`, `mlp` or `resnet`; the PyTorch script has no {}",
            setup.model
        );
    }
    use DatasetKind::*;
    if !matches!(setup.dataset, FashionMnist | Mnist | Cifar10 | Cifar100) {
        bail!(
            "bench train reads IDX and CIFAR files on the PyTorch side; --dataset {} is timed \
             by `bench loader`",
            setup.dataset
        );
    }
    if setup.augment == Augment::Imagenet {
        bail!("bench train augments with `cifar` or none; `imagenet` is timed by `bench loader`");
    }
    Ok(())
}

/// Runs both sides and the policy comparison.
pub fn run(setup: &Setup, runtime: &Runtime) -> Result<Report> {
    mirrored(setup)?;
    let out = std::env::temp_dir().join(format!("lsgd-bench-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let config = train_config(setup, &out, Precision::Fp32);
    let lower =
        (setup.precision != Precision::Fp32).then(|| train_config(setup, &out, setup.precision));
    let bounds = Bounds {
        max_batch: setup.batch,
    };
    // Rounds alternate the three runs, so a load that drifts over minutes (a shared machine)
    // touches each side alike; the medians are reported.
    let (mut wasm, mut native, mut torch, mut version) =
        (Vec::new(), Vec::new(), Vec::new(), String::new());
    let mut lower_rounds = Vec::new();
    for round in 1..=setup.rounds.max(1) {
        eprintln!(
            "round {round}/{}: lsgd-host run with WASM policies, with native policies, PyTorch …",
            setup.rounds.max(1)
        );
        wasm.push(timed_run(
            &config,
            load_policies(runtime, bounds)?,
            setup.warmup,
        )?);
        let mut native_set = load_policies(runtime, bounds)?;
        for (kind, _, _) in POLICIES {
            let twin = native_twin(native_set.get(*kind).expect("loaded"))?
                .context("a reference plugin without a native twin")?;
            native_set.use_native(*kind, twin);
        }
        native.push(timed_run(&config, native_set, setup.warmup)?);
        let (sps, v) = pytorch(setup, Precision::Fp32)?;
        torch.push(sps);
        version = v;
        if let Some(lower) = &lower {
            let ours = timed_run(lower, load_policies(runtime, bounds)?, setup.warmup)?;
            let (theirs, _) = pytorch(setup, setup.precision)?;
            lower_rounds.push([ours.samples_per_s, theirs]);
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    let field = |runs: &[Timed], f: fn(&Timed) -> f64| median(runs.iter().map(f));
    let lsgd_sps = field(&wasm, |t| t.samples_per_s);
    let torch_sps = median(torch.iter().copied());
    let step_s = field(&wasm, |t| t.step_s);
    let (policy_wasm, policy_native) =
        (field(&wasm, |t| t.policy_s), field(&native, |t| t.policy_s));
    let precision =
        lower.map(|_| PrecisionReport::new(setup.precision, lower_rounds, lsgd_sps, torch_sps));
    Ok(Report {
        lsgd_samples_per_s: lsgd_sps,
        pytorch_samples_per_s: torch_sps,
        ratio: lsgd_sps / torch_sps,
        pytorch_version: version,
        native_samples_per_s: field(&native, |t| t.samples_per_s),
        step_ms: step_s * 1e3,
        policy_wasm_us: policy_wasm * 1e6,
        policy_native_us: policy_native * 1e6,
        policy_overhead_pct: 100.0 * (policy_wasm - policy_native) / step_s,
        rounds: wasm
            .iter()
            .zip(&native)
            .zip(&torch)
            .map(|((w, n), t)| [w.samples_per_s, n.samples_per_s, *t])
            .collect(),
        precision,
    })
}

impl PrecisionReport {
    /// The medians of `rounds` ([lsgd-host, PyTorch] at `precision`) against both sides'
    /// fp32 medians of the same rounds.
    fn new(precision: Precision, rounds: Vec<[f64; 2]>, lsgd_fp32: f64, torch_fp32: f64) -> Self {
        let ours = median(rounds.iter().map(|r| r[0]));
        let theirs = median(rounds.iter().map(|r| r[1]));
        PrecisionReport {
            precision,
            lsgd_samples_per_s: ours,
            pytorch_samples_per_s: theirs,
            lsgd_speedup: ours / lsgd_fp32,
            pytorch_speedup: theirs / torch_fp32,
            ratio: ours / theirs,
            rounds,
            cpu_flags: half_precision_flags(),
        }
    }

    /// The lines of the precision's rounds, its speed-ups and the CPU's 16-bit instructions.
    fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        for (i, [ours, theirs]) in self.rounds.iter().enumerate() {
            writeln!(
                out,
                "  round {} at {}: lsgd-host {ours:.1}, PyTorch {theirs:.1} samples/s",
                i + 1,
                self.precision
            )?;
        }
        writeln!(
            out,
            "  --precision {}: lsgd-host run {:.1} samples/s ({:.2}× its fp32), PyTorch {:.1} samples/s ({:.2}× its fp32), ratio {:.3}×",
            self.precision,
            self.lsgd_samples_per_s,
            self.lsgd_speedup,
            self.pytorch_samples_per_s,
            self.pytorch_speedup,
            self.ratio
        )?;
        writeln!(
            out,
            "  CPU 16-bit float instructions: {}",
            if self.cpu_flags.is_empty() {
                "none of avx512_bf16, amx_bf16, avx512_fp16, amx_fp16 (libtorch converts in software)".to_string()
            } else {
                self.cpu_flags.join(", ")
            }
        )?;
        Ok(())
    }
}

/// The 16-bit float instruction sets this CPU reports.
fn half_precision_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find_map(|l| l.strip_prefix("flags"))
        .map(|l| {
            l.trim_start_matches([' ', '\t', ':'])
                .split_whitespace()
                .collect()
        })
        .unwrap_or_default();
    ["avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"]
        .into_iter()
        .filter(|f| flags.contains(f))
        .map(String::from)
        .collect()
}

/// Trains as `config` says and reads back the timed steps (those from `warmup` on).
fn timed_run(config: &TrainConfig, policies: PolicySet, warmup: u64) -> Result<Timed> {
    let _ = std::fs::remove_dir_all(&config.invocation.out);
    train::run(config, policies, None, Reporting { quiet: true })?;
    timed_steps(&config.invocation.out.join("metrics.jsonl"), warmup)
}

fn pytorch(setup: &Setup, precision: Precision) -> Result<(f64, String)> {
    let script = std::env::temp_dir().join(format!("lsgd-bench-{}.py", std::process::id()));
    std::fs::write(&script, PYTORCH_SCRIPT)?;
    let out = Command::new(&setup.python)
        // torch warns at import when numpy is absent; the script does not need numpy.
        .args(["-W", "ignore::UserWarning"])
        .arg(&script)
        .args(["--data", &setup.data.display().to_string()])
        .args(["--model", &setup.model.to_string()])
        .args(["--depth", &setup.depth.to_string()])
        .args(["--dataset", &setup.dataset.to_string()])
        .args(["--augment", &setup.augment.to_string()])
        .args(["--batch", &setup.batch.to_string()])
        .args(["--threads", &setup.threads.to_string()])
        .args(["--steps", &setup.steps.to_string()])
        .args(["--warmup", &setup.warmup.to_string()])
        .args(["--precision", &precision.to_string()])
        .args([
            "--device",
            if setup.device.is_cuda() {
                "cuda"
            } else {
                "cpu"
            },
        ])
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
        "bench train: {}{} on {} ({}, augment {}), batch {}, {} thread(s), device {:?}, {} timed steps after {}, median of {} rounds",
        setup.model,
        if setup.model == Arch::Resnet {
            format!("-{}", setup.depth)
        } else {
            String::new()
        },
        setup.dataset,
        setup.data.display(),
        setup.augment,
        setup.batch,
        setup.threads,
        setup.device,
        setup.steps,
        setup.warmup,
        r.rounds.len()
    )?;
    for (i, [w, n, t]) in r.rounds.iter().enumerate() {
        writeln!(
            out,
            "  round {}: WASM {w:.1}, native {n:.1}, PyTorch {t:.1} samples/s",
            i + 1
        )?;
    }
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
        "  same run, policies compiled natively {:>9.1} samples/s",
        r.native_samples_per_s
    )?;
    if let Some(p) = &r.precision {
        p.print(&mut out)?;
    }
    writeln!(
        out,
        "  policies per step: wasm {:.2} µs, native {:.2} µs, step {:.1} ms: overhead {:.4}% of a step (goal <= 0.5%)",
        r.policy_wasm_us, r.policy_native_us, r.step_ms, r.policy_overhead_pct
    )
}
