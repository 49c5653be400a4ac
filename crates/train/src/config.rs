//! Everything a training run is, as one serialisable value: written into every checkpoint so a
//! resumed run can be checked against the run it continues.

use std::path::PathBuf;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::collective::Algorithm;
use crate::model::ModelSpec;
use crate::optim::SgdConfig;

/// Where tensors live.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// The first CUDA GPU if libtorch sees one, else the CPU.
    Auto,
    /// The CPU (deterministic given --seed).
    Cpu,
    /// The first CUDA GPU; an error if there is none.
    Cuda,
}

/// The settings of a training run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// The network.
    pub model: ModelSpec,
    /// The optimiser.
    pub sgd: SgdConfig,
    /// Epochs to train.
    pub epochs: u32,
    /// Global batch at step 0 (what a batch-size policy sees as configured).
    pub global_batch: u32,
    /// Largest micro-batch one forward/backward pass may take; larger per-worker batches are
    /// accumulated over several passes.
    pub max_micro_batch: u32,
    /// Learning rate at `reference_batch`.
    pub base_lr: f64,
    /// The batch `base_lr` applies to (linear scaling rule).
    pub reference_batch: u32,
    /// Largest global batch a batch-size policy may return.
    pub max_batch: u32,
    /// Seed of initialisation and data order.
    pub seed: u64,
    /// Intra-op threads of libtorch.
    pub threads: usize,
    /// Directory of IDX files.
    pub data: PathBuf,
    /// Train on the first N training samples only.
    pub train_subset: Option<usize>,
    /// Evaluate on the first N test samples only.
    pub test_subset: Option<usize>,
    /// Where tensors live.
    pub device: DeviceChoice,
    /// Run directory (metrics, checkpoints).
    pub out: PathBuf,
    /// Write a checkpoint every N steps (0: only at the end and on a fault).
    pub checkpoint_every: u64,
    /// Stop (with a checkpoint) once this many steps have been taken in total.
    pub stop_after_steps: Option<u64>,
    /// Also write metrics.csv and eval.csv.
    pub csv: bool,
    /// The gradient all-reduce algorithm (with more than one rank).
    pub allreduce: Algorithm,
    /// Gradient bucket size, MiB.
    pub bucket_mb: f64,
    /// Compare weights and policy outputs across ranks every N steps (0: only at the end).
    pub consistency_every: u64,
    /// Keep the codec's compression error per bucket and add it to the next step's gradient.
    #[serde(default)]
    pub error_feedback: bool,
}

impl TrainConfig {
    /// Refuses settings that cannot train.
    pub fn validate(&self) -> Result<(), String> {
        self.model.validate()?;
        self.sgd.validate()?;
        if self.max_micro_batch == 0 {
            return Err("--max-micro-batch must be at least 1".into());
        }
        if !(self.bucket_mb.is_finite() && self.bucket_mb > 0.0) {
            return Err(format!("--bucket-mb {} must be above 0", self.bucket_mb));
        }
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        Ok(())
    }

    /// The settings a resumed run must share with the checkpoint for the continuation to be
    /// the same run; each difference is described with its flag.
    pub fn resume_mismatches(&self, saved: &TrainConfig) -> Vec<String> {
        let mut out = Vec::new();
        let mut check = |flag: &str, now: String, then: String| {
            if now != then {
                out.push(format!("{flag}: checkpoint has {then}, this run has {now}"));
            }
        };
        check(
            "--model/--depth/--zero-init-residual",
            format!("{:?}", self.model),
            format!("{:?}", saved.model),
        );
        check(
            "optimiser flags",
            format!("{:?}", self.sgd),
            format!("{:?}", saved.sgd),
        );
        check(
            "--epochs",
            self.epochs.to_string(),
            saved.epochs.to_string(),
        );
        check(
            "--global-batch",
            self.global_batch.to_string(),
            saved.global_batch.to_string(),
        );
        check(
            "--base-lr",
            self.base_lr.to_string(),
            saved.base_lr.to_string(),
        );
        check(
            "--reference-batch",
            self.reference_batch.to_string(),
            saved.reference_batch.to_string(),
        );
        check("--seed", self.seed.to_string(), saved.seed.to_string());
        check(
            "--error-feedback",
            self.error_feedback.to_string(),
            saved.error_feedback.to_string(),
        );
        check(
            "--train-subset",
            format!("{:?}", self.train_subset),
            format!("{:?}", saved.train_subset),
        );
        out
    }
}
