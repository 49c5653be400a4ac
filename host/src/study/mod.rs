//! `lsgd-host study NAME`: the papers' experiments, each one command that trains its jobs
//! (this binary's `run`, under `mpirun` where a study needs ranks), keeps every job's run
//! directory so a second call trains only what is missing, and writes `report.md` with tables
//! and PNG plots computed from those runs alone.
//!
//! - [`goyal`]: test error against the global batch under the linear scaling rule, three
//!   warmups, BatchNorm batch per worker fixed (Goyal et al. 2017, Figure 1, Table 2c, Figure 2);
//! - [`batch_control`]: growing the batch instead of decaying the LR, with and without label
//!   smoothing (Mikami et al. 2018; Smith et al. 2018);
//! - [`compression`]: every codec with and without error feedback on `mpirun` ranks: accuracy
//!   against bytes on the wire (the GRACE paper's figure);
//! - [`layerwise`]: SGD against LARS and LAMB at batches where the goyal study breaks down;
//! - [`network`]: compression on the emulated cluster's links: step time against the α-β
//!   model, and time to accuracy;
//! - [`sync`]: synchronising less on the emulated cluster: local SGD and DiLoCo against
//!   synchronous data parallelism, accuracy against wall-clock time and bytes sent.

pub mod batch_control;
pub mod compression;
pub mod goyal;
pub mod jobs;
pub mod lab;
pub mod layerwise;
pub mod network;
pub mod report;
pub mod sync;

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};

pub use jobs::{Job, Outcome};

use crate::train::data::DatasetKind;

/// What a study trains on and with: Fashion-MNIST (or MNIST) with the `cnn`, the recipe the
/// plans were tuned for, or CIFAR-10/100 with He et al.'s ResNet-20 and CIFAR augmentation,
/// at the preset's LR 0.1 per 128 samples (twice the plans' SGD LR per sample), momentum 0.9,
/// weight decay 10⁻⁴ (both `run`'s defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recipe {
    /// The data set.
    pub dataset: DatasetKind,
}

impl Recipe {
    /// The recipe of `dataset`; the studies take the data sets with a preset.
    pub fn new(dataset: DatasetKind) -> Result<Recipe> {
        use DatasetKind::*;
        if !matches!(dataset, FashionMnist | Mnist | Cifar10 | Cifar100) {
            bail!(
                "the studies have presets for fashion-mnist, mnist, cifar10 and cifar100, not \
                 --dataset {dataset}"
            );
        }
        Ok(Recipe { dataset })
    }

    /// Whether it is the CIFAR preset.
    pub fn cifar(&self) -> bool {
        matches!(self.dataset, DatasetKind::Cifar10 | DatasetKind::Cifar100)
    }

    /// The data set's name in reports.
    pub fn data_name(&self) -> &'static str {
        match self.dataset {
            DatasetKind::Mnist => "MNIST",
            DatasetKind::Cifar10 => "CIFAR-10",
            DatasetKind::Cifar100 => "CIFAR-100",
            _ => "Fashion-MNIST",
        }
    }

    /// The model in reports.
    pub fn model_text(&self) -> &'static str {
        if self.cifar() {
            "ResNet-20 (He et al.'s CIFAR net, option A shortcuts; CIFAR augmentation)"
        } else {
            "the `cnn` (two conv–BN–ReLU–pool stages, two-layer head)"
        }
    }

    /// The `run` flags of the model (and its augmentation).
    pub fn model_args(&self) -> Vec<String> {
        if self.cifar() {
            strings(&["--model", "resnet", "--depth", "20", "--augment", "cifar"])
        } else {
            strings(&["--model", "cnn"])
        }
    }

    /// SGD's LR per sample against the plans' (Goyal's 0.1 per 256): 2 for the CIFAR preset's
    /// 0.1 per 128.
    pub fn lr_factor(&self) -> f64 {
        if self.cifar() { 2.0 } else { 1.0 }
    }
}

/// The studies.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    /// Goyal et al.: linear scaling and warmup across global batches.
    Goyal,
    /// Mikami et al. / Smith et al.: batch ramp instead of LR decay, ± label smoothing.
    BatchControl,
    /// Every codec ± error feedback on mpirun ranks: accuracy against bytes on the wire.
    Compression,
    /// SGD against LARS and LAMB past the batch where plain SGD breaks down.
    Layerwise,
    /// Compression on the emulated cluster at 1 Gbit/s and 100 Mbit/s: step time, model,
    /// time to accuracy (needs root: it brings `scripts/netlab.sh` up itself).
    Network,
    /// Local SGD and DiLoCo (H = 4, 16, 64; DiLoCo with int8 Δ) against synchronous data
    /// parallelism on the emulated cluster, 2 and 4 hosts at 1 Gbit/s and 100 Mbit/s:
    /// accuracy against wall-clock time and bytes sent, time to 80% (needs root: it brings
    /// `scripts/netlab.sh` up itself; about 35 min).
    Sync,
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Name::Goyal => "goyal",
            Name::BatchControl => "batch-control",
            Name::Compression => "compression",
            Name::Layerwise => "layerwise",
            Name::Network => "network",
            Name::Sync => "sync",
        })
    }
}

/// How a study runs: where, how big, on how many threads.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Which study.
    pub name: Name,
    /// The few-minute variant (`scripts/test.sh` runs it): smaller subsets, fewer jobs.
    pub quick: bool,
    /// Output directory: `report.md`, the PNGs and `jobs/<id>/` for every run.
    pub out: PathBuf,
    /// Seeds of every job.
    pub seeds: Vec<u64>,
    /// libtorch threads of each job (of each rank under mpirun).
    pub threads: usize,
    /// Single-process jobs trained at once.
    pub parallel: usize,
    /// Ranks of the studies that need several (`compression`).
    pub ranks: u32,
    /// The `mpirun` to start ranks with.
    pub mpirun: PathBuf,
    /// `scripts/netlab.sh`, when ranked jobs run across the emulated cluster's hosts (the
    /// network study sets it; its `run` starts the mpirun inside the lab).
    pub netlab: Option<PathBuf>,
    /// What the jobs train on and with.
    pub recipe: Recipe,
    /// The data set's directory.
    pub data: PathBuf,
    /// The command line, quoted in the report.
    pub command: String,
}

impl Settings {
    /// Whether the study's jobs run on several ranks, one job at a time.
    pub fn ranks_jobs(&self) -> bool {
        matches!(self.name, Name::Compression | Name::Network | Name::Sync)
    }
}

/// Runs the study: trains what is missing, then writes the report; returns its path.
pub fn run(settings: &Settings) -> Result<PathBuf> {
    std::fs::create_dir_all(&settings.out)
        .with_context(|| format!("cannot create {}", settings.out.display()))?;
    let started = Instant::now();
    let report = match settings.name {
        Name::Goyal => goyal::run(settings)?,
        Name::BatchControl => batch_control::run(settings)?,
        Name::Compression => compression::run(settings)?,
        Name::Layerwise => layerwise::run(settings)?,
        Name::Network => network::run(settings)?,
        Name::Sync => sync::run(settings)?,
    };
    let path = settings.out.join("report.md");
    std::fs::write(&path, report).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!(
        "study {}: report in {} ({:.0} s)",
        settings.name,
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}

/// The data every study but compression trains on: a prefix of Fashion-MNIST's training split
/// and its test split.
#[derive(Debug, Clone, Copy)]
pub struct Subset {
    /// Training samples (a prefix of the 60,000).
    pub train: usize,
    /// Test samples (a prefix of the 10,000).
    pub test: usize,
    /// Epochs of every job.
    pub epochs: u32,
}

impl Subset {
    /// The data of the goyal, batch-control and layerwise studies: 15,000 training images for
    /// 6 epochs, all 10,000 test images (quick: 2,000 for 2 epochs, 1,000 test images).
    pub fn of_cnn_studies(quick: bool) -> Subset {
        if quick {
            Subset {
                train: 2000,
                test: 1000,
                epochs: 2,
            }
        } else {
            Subset {
                train: 15_000,
                test: 10_000,
                epochs: 6,
            }
        }
    }

    /// The `run` flags that select it.
    pub fn args(&self) -> Vec<String> {
        strings(&[
            "--train-subset",
            &self.train.to_string(),
            "--test-subset",
            &self.test.to_string(),
            "--epochs",
            &self.epochs.to_string(),
        ])
    }

    /// Optimizer steps per epoch at global batch `batch` (batches straddle epochs, so it need
    /// not be whole).
    pub fn steps_per_epoch(&self, batch: u32) -> f64 {
        self.train as f64 / f64::from(batch)
    }
}

/// `text` with its first letter upper-case, to open a sentence.
pub fn upper_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Owned copies of string literals, for building argument lists.
pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(jobs: &[Job]) -> Vec<String> {
        let mut ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
        ids.sort();
        let n = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), n, "job ids are unique");
        ids
    }

    #[test]
    fn full_plans_have_the_jobs_the_reports_describe() {
        let seeds = [1, 2];
        // Goyal: 6 batches, all three warmups from k = 8 (batch 256) on.
        let g = goyal::Plan::new(false);
        assert_eq!(ids(&g.jobs(&seeds)).len(), 2 * (2 + 4 * 3));
        assert_eq!(g.warmups(128), &["gradual"]);
        assert_eq!(g.warmups(256).len(), 3);
        assert_eq!(g.lr(2048), 0.8);
        // Batch control: 3 variants × label smoothing on and off.
        let b = batch_control::Plan::new(false);
        assert_eq!(ids(&b.jobs(&seeds)).len(), 2 * 3 * 2);
        // Compression: the baseline and 13 codecs × error feedback on and off, all on ranks;
        // PowerSGD's mean residual, momentum correction for 3 codecs, 3 rows at momentum 0.
        let c = compression::Plan::new(false);
        let jobs = c.jobs(&seeds, 4);
        assert_eq!(ids(&jobs).len(), 2 * (1 + 13 * 2 + 1 + 3 + 3));
        assert!(jobs.iter().all(|j| j.ranks == 4));
        let m0 = jobs
            .iter()
            .find(|j| j.id == "ef-sign-ef-m0-np4-s1")
            .unwrap();
        let args = m0.args.join(" ");
        assert!(
            args.ends_with("--error-feedback residual --momentum 0"),
            "{args}"
        );
        assert!(ids(&jobs).contains(&"powersgd-efmean-np4-s2".to_string()));
        // Layer-wise: the reference and 3 rules × 2 batches.
        let l = layerwise::Plan::new(false);
        assert_eq!(ids(&l.jobs(&seeds)).len(), 2 * (1 + 3 * 2));
    }

    #[test]
    fn the_ramp_holds_the_lr_and_decay_does_not_ramp() {
        let b = batch_control::Plan::new(false);
        let ramp = b.job(batch_control::Variant::Ramp, true, 1).args.join(" ");
        assert!(ramp.contains("--batch-size batch-ramp"), "{ramp}");
        assert!(ramp.contains("schedule.scaling=none"), "{ramp}");
        assert!(ramp.contains("schedule.milestones= "), "{ramp}");
        assert!(ramp.contains("label_smoothing.epsilon=0.1"), "{ramp}");
        let decay = b
            .job(batch_control::Variant::Decay, false, 1)
            .args
            .join(" ");
        assert!(!decay.contains("batch-ramp") && !decay.contains("label-smoothing"));
        assert!(decay.contains("schedule.gamma=0.25"), "{decay}");
    }

    #[test]
    fn lamb_overrides_the_lr_and_scaling_of_the_goyal_job() {
        let l = layerwise::Plan::new(false);
        let args = l.job(layerwise::Rule::Lamb, 1024, 1).args;
        let last_lr = args.iter().rposition(|a| a == "--base-lr").unwrap();
        assert_eq!(args[last_lr + 1], "0.00177");
        assert!(args.join(" ").contains("--optimizer adamw"));
        // What `run` is given: the one --base-lr, LAMB's; repeatable --set kept.
        let run = l.job(layerwise::Rule::Lamb, 1024, 1).run_args();
        let lrs: Vec<_> = run.iter().filter(|a| *a == "--base-lr").collect();
        assert_eq!(lrs.len(), 1, "{run:?}");
        let at = run.iter().position(|a| a == "--base-lr").unwrap();
        assert_eq!(run[at + 1], "0.00177");
        let sets = |v: &[String]| v.iter().filter(|a| *a == "--set").count();
        assert_eq!(sets(&run), sets(&args));
    }

    #[test]
    fn the_cifar_preset_trains_resnet_20_at_twice_the_lr_per_sample() {
        let cifar = Recipe::new(DatasetKind::Cifar10).unwrap();
        let value = |args: &[String], flag: &str| {
            let i = args.iter().rposition(|a| a == flag).unwrap();
            args[i + 1].clone()
        };
        let g = goyal::Plan::new(false).with_recipe(cifar);
        let job = g.job(128, "gradual", 1).args;
        assert!(
            job.join(" ")
                .starts_with("--model resnet --depth 20 --augment cifar --schedule warmup"),
            "{job:?}"
        );
        // 0.1 per 128 samples: 0.025 at the reference batch 32.
        assert_eq!(value(&job, "--base-lr"), "0.025");
        assert_eq!(value(&job, "--reference-batch"), "32");
        let c = compression::Plan {
            recipe: cifar,
            ..compression::Plan::new(true)
        };
        let plain = c.job(&compression::Variant::UNCOMPRESSED, 1, 2);
        assert_eq!(value(&plain.args, "--base-lr"), "0.2");
        // LAMB's LR is AdamW's and does not follow SGD's.
        let l = layerwise::Plan::new(false).with_recipe(cifar);
        assert_eq!(
            value(&l.job(layerwise::Rule::Lamb, 1024, 1).args, "--base-lr"),
            "0.00177"
        );
        let b = batch_control::Plan::new(false).with_recipe(cifar);
        let decay = b.job(batch_control::Variant::Decay, false, 1).args;
        // The plan's 0.05 at batch 128, doubled.
        assert_eq!(value(&decay, "--base-lr"), "0.1");
        // The default recipe keeps every job as it was.
        let fashion = goyal::Plan::new(false);
        assert!(
            fashion
                .job(128, "gradual", 1)
                .args
                .join(" ")
                .starts_with("--model cnn --schedule warmup")
        );
        assert!(Recipe::new(DatasetKind::Npz).is_err());
    }
}
