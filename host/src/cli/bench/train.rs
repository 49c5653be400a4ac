//! `lsgd-host bench train`: `lsgd-host run` against the same job in PyTorch, and the
//! policies' share of a step through the sandbox against native.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{emit, threads_or_all};
use crate::bench::train;
use crate::cli::args::LimitArgs;
use crate::cli::trace::Format;
use crate::model::Arch;
use crate::precision::Precision;
use crate::train::DeviceChoice;
use crate::train::augment::Augment;
use crate::train::data::DatasetKind;

/// Arguments of `bench train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Network (the PyTorch script mirrors `cnn`, `mlp` and `resnet`).
    #[arg(long, value_enum, default_value_t = Arch::Cnn)]
    model: Arch,
    /// ResNet depth, 6n + 2 (with --model resnet).
    #[arg(long, default_value_t = 20)]
    depth: u32,
    /// The data set: fashion-mnist, mnist, cifar10 or cifar100 (the PyTorch script reads
    /// those).
    #[arg(long, value_enum, default_value_t = DatasetKind::FashionMnist)]
    dataset: DatasetKind,
    /// Training augmentation on both sides: none or cifar.
    #[arg(long, value_enum, default_value_t = Augment::None)]
    augment: Augment,
    /// Global batch.
    #[arg(long, default_value_t = 256)]
    global_batch: u32,
    /// libtorch threads on both sides (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed steps.
    #[arg(long, default_value_t = 60)]
    steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 5)]
    warmup_steps: u64,
    /// Rounds of (WASM run, native run, PyTorch run), alternated; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The data set's directory (default: Fashion-MNIST's).
    #[arg(long, alias = "data", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Time on N random images written in the data set's format (cifar10, cifar100)
    /// instead of --data-dir: throughput without the download.
    #[arg(long, value_name = "N", conflicts_with = "data_dir")]
    synthetic: Option<usize>,
    /// Python with torch importable (default: the project venv's).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Also time both sides at this precision (bf16, fp16) and print the speed-up over fp32.
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    precision: Precision,
    /// Where both sides train: cpu, cuda (the first GPU), or auto (cuda if libtorch sees one).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Cpu)]
    device: DeviceChoice,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
    #[command(flatten)]
    limits: LimitArgs,
}

impl TrainArgs {
    /// Runs `bench train`, on synthetic records written to a scratch directory with
    /// `--synthetic`.
    pub fn run(self) -> Result<()> {
        let scratch =
            std::env::temp_dir().join(format!("lsgd-bench-synthetic-{}", std::process::id()));
        let data_dir = match self.synthetic {
            Some(n) => {
                train::synthetic_records(self.dataset, n, &scratch)?;
                Some(scratch.clone())
            }
            None => self.data_dir,
        };
        let setup = train::Setup {
            model: self.model,
            depth: self.depth,
            dataset: self.dataset,
            augment: self.augment,
            batch: self.global_batch,
            threads: threads_or_all(self.threads),
            steps: self.steps,
            warmup: self.warmup_steps,
            rounds: self.rounds,
            data: crate::cli::run::data_dir(self.dataset, data_dir.as_deref())?,
            python: self.python.unwrap_or_else(crate::train::venv::python),
            precision: self.precision,
            device: crate::train::device(self.device)?,
        };
        let report = train::run(&setup, &self.limits.runtime()?);
        let _ = std::fs::remove_dir_all(&scratch);
        let report = report?;
        emit(self.format, &report, |out| {
            train::print(&setup, &report, out)
        })
    }
}
