//! Benchmarks that print ratios measured in one run (never timed assertions in tests).
//!
//! - [`allreduce`]: each all-reduce algorithm against MPI_Allreduce under mpirun;
//! - [`calibrate`]: the α-β-γ model's machine parameters fitted from ping-pongs, exchanges and
//!   additions under mpirun, for `simulate --model` and `bench allreduce --model`;
//! - [`policies`]: per-call cost of each policy plugin next to the same formula compiled
//!   natively, plus size, load and instantiation times;
//! - [`languages`]: the same warmup schedule in Rust, C, Python, JavaScript and Go;
//! - [`train`]: `lsgd-host run` against the same job in PyTorch, and the policies' share of a
//!   training step through the sandbox against native;
//! - [`ddp`]: `mpirun -np N lsgd-host run` against the same job in PyTorch's
//!   DistributedDataParallel under torchrun, with each side's communication time per step;
//! - [`loader`]: image decoding and augmentation (images/s) against training (samples/s) on
//!   the same image folder;
//! - [`codecs`]: encode+decode GB/s of each codec plugin against the same code compiled
//!   natively, and the compression each achieves;
//!
//! and what they share: [`TimedJob`] and [`timed_steps`] for the training benchmarks,
//! [`stats`] for the median and spread of repeated timings.

pub mod allreduce;
pub mod calibrate;
pub mod codecs;
pub mod ddp;
pub mod languages;
pub mod loader;
pub mod policies;
pub mod stats;
pub mod train;

use std::path::Path;

use anyhow::{Result, bail};

use crate::collective::Algorithm;
use crate::model::ModelSpec;
use crate::optim::SgdConfig;
use crate::precision::{MixedPrecision, Precision};
use crate::train::augment::Augment;
use crate::train::config::Mode;
use crate::train::data::DatasetKind;
use crate::train::metrics::{self, Record};
use crate::train::{DeviceChoice, Invocation, RunConfig, TrainConfig};

/// A training job a benchmark times: one evaluation sample, every step the same batch (also
/// its micro-batch and the LR's reference), stopped after `steps` steps, no checkpoints kept
/// but the last.
pub struct TimedJob<'a> {
    /// The network.
    pub model: ModelSpec,
    /// The data set and where it is.
    pub dataset: DatasetKind,
    /// Its directory.
    pub data: &'a Path,
    /// Training augmentation.
    pub augment: Augment,
    /// Side of images made from files.
    pub image_size: u32,
    /// Threads decoding image files.
    pub loader_threads: usize,
    /// Global batch.
    pub batch: u32,
    /// libtorch threads.
    pub threads: usize,
    /// Precision of the forward pass.
    pub precision: Precision,
    /// Where it trains.
    pub device: DeviceChoice,
    /// Steps to run.
    pub steps: u64,
    /// Run directory.
    pub out: &'a Path,
}

impl TimedJob<'_> {
    /// The job as `lsgd-host run` settings.
    pub fn config(&self) -> TrainConfig {
        TrainConfig {
            run: RunConfig {
                model: self.model.clone(),
                sgd: SgdConfig::default(),
                adamw: None,
                epochs: 1000,
                global_batch: self.batch,
                max_micro_batch: self.batch,
                base_lr: 0.1,
                reference_batch: self.batch,
                max_batch: self.batch,
                seed: 0,
                train_subset: None,
                test_subset: Some(1),
                bucket_mb: 25.0,
                error_feedback: Default::default(),
                local_clip_norm: None,
                mixed_precision: MixedPrecision {
                    precision: self.precision,
                    ..MixedPrecision::default()
                },
                mode: Mode::Sync,
                dataset: self.dataset,
                augment: self.augment,
                image_size: self.image_size,
            },
            invocation: Invocation {
                threads: self.threads,
                data: self.data.to_path_buf(),
                device: self.device,
                out: self.out.to_path_buf(),
                checkpoint_every: 0,
                stop_after_steps: Some(self.steps),
                csv: false,
                allreduce: Algorithm::Mpi,
                consistency_every: 100,
                slow: None,
                tolerance: None,
                lose: None,
                keep_checkpoints: 1,
                overwrite: true,
                loader_threads: self.loader_threads,
                save_model: None,
                overlap: None,
            },
        }
    }
}

/// What `lsgd-host run` recorded over its timed steps: the means of a step.
pub struct TimedSteps {
    /// Total samples over the summed step wall times.
    pub samples_per_s: f64,
    /// Wall time.
    pub step_s: f64,
    /// Forward, backward and update.
    pub compute_s: f64,
    /// Collectives.
    pub communication_s: f64,
    /// Of the collectives, what the step waited for (the rest ran behind the backward pass).
    pub exposed_communication_s: f64,
    /// Of the compute, the last micro-batch's backward pass (what an exchange can hide behind).
    pub backward_s: f64,
    /// Asking the policies.
    pub policy_s: f64,
}

/// Reads the steps from `warmup` on of the `metrics.jsonl` at `metrics` (rank 0's).
pub fn timed_steps(metrics: &Path, warmup: u64) -> Result<TimedSteps> {
    let steps: Vec<_> = metrics::read(metrics)?
        .into_iter()
        .filter_map(|r| match r {
            Record::Step(s) if s.step >= warmup => Some(s),
            _ => None,
        })
        .collect();
    if steps.is_empty() {
        bail!("no timed steps in {}: raise --steps", metrics.display());
    }
    let n = steps.len() as f64;
    let wall: f64 = steps
        .iter()
        .map(|s| f64::from(s.global_batch) / s.samples_per_s)
        .sum();
    let samples: f64 = steps.iter().map(|s| f64::from(s.global_batch)).sum();
    let mean = |f: fn(&metrics::StepRecord) -> f64| steps.iter().map(f).sum::<f64>() / n;
    Ok(TimedSteps {
        samples_per_s: samples / wall,
        step_s: wall / n,
        compute_s: mean(|s| s.compute_s),
        communication_s: mean(|s| s.communication_s),
        exposed_communication_s: mean(|s| s.exposed_communication_s),
        backward_s: mean(|s| s.backward_s),
        policy_s: mean(|s| s.policy_s),
    })
}
