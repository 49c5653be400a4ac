//! lsgd-train: the trainer of `lsgd-host run`. Each step asks the policies for the global
//! batch, the LR and ε ([`lsgd_runtime::policy::PolicySet`]), takes the next global batch of
//! the sample stream ([`order`]), runs it as micro-batches with gradient accumulation, sums
//! the gradients over the ranks ([`exchange`]) and applies one update ([`optim`]). BatchNorm
//! sees one micro-batch at a time: statistics are per worker and per micro-batch, as in Goyal
//! et al. (§5.1: the BN batch is a hyper-parameter, kept fixed while the global batch grows).
//! An evaluation on the test split follows every completed epoch; metrics and checkpoints go
//! to the run directory. [`Trainer`] holds the phases of a step; `docs/architecture.md` shows
//! where each part of a step lives.
//!
//! - [`trainer`]: the run and the phases of its steps;
//! - [`config`]: the run's settings, split into what defines the run and what only this
//!   invocation;
//! - [`optim`]: the optimizer trait, SGD and AdamW;
//! - [`precision`]: mixed precision (autocast, fp16 loss scaling);
//! - [`exchange`]: the gradient's way through the collective, plain or through a codec;
//! - [`overlap`]: the exchange behind the backward pass (gradient-ready hooks);
//! - [`model`], [`data`]: the networks (built in or TorchScript), the data sets on disk;
//! - [`tensors`], [`augment`], [`loader`]: batches as the model sees them (standardised,
//!   augmented), image files decoded a step ahead;
//! - [`order`]: which samples each step trains on;
//! - [`loss`]: smoothed cross-entropy;
//! - [`eval`]: test loss and accuracy;
//! - [`metrics`]: metrics.jsonl / CSV;
//! - [`tensorboard`]: the same records as TensorBoard event files;
//! - [`parallel`]: this rank's shard and the cross-rank consistency check;
//! - [`checkpoint`]: atomic save and resume;
//! - [`rundir`]: a run directory belongs to one run (`--resume`, `--overwrite`);
//! - [`progress`]: the progress bar or log lines;
//! - [`error`]: the crate's error type.

pub mod augment;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod error;
pub mod eval;
pub mod exchange;
pub mod loader;
pub mod loss;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod order;
pub mod overlap;
pub mod parallel;
pub mod precision;
pub mod progress;
pub mod rundir;
pub mod tensorboard;
pub mod tensors;
pub mod trainer;
pub mod venv;

use std::path::{Path, PathBuf};

use lsgd_collective::World;
use lsgd_runtime::policy::PolicySet;
use tch::nn::VarStore;
use tch::{Device, Tensor};

pub use config::{DeviceChoice, Invocation, RunConfig, TrainConfig};
pub use error::{Error, Result};
use eval::Evaluation;
pub use trainer::Trainer;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Steps taken in total (including those before a resume).
    pub steps: u64,
    /// The last evaluation, if any epoch completed.
    pub last_eval: Option<Evaluation>,
    /// The last training loss.
    pub last_loss: Option<f64>,
    /// blake3 of every model variable in name order: equal iff the weights are bit-identical.
    pub weights_blake3: String,
    /// The final checkpoint.
    pub checkpoint: PathBuf,
    /// fp16's loss scaler at the end (its scale and the steps it skipped).
    pub loss_scaler: Option<precision::ScalerState>,
    /// `--mode async`, on the server: applied gradients per staleness (steps), over the steps
    /// of this process (empty in sync mode and on workers).
    pub staleness: std::collections::BTreeMap<u64, u64>,
    /// Mean samples/s over the steps of this process.
    pub samples_per_s: f64,
}

/// Options that change how a run reports, not what it computes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reporting {
    /// No progress bar or log lines.
    pub quiet: bool,
}

/// Resolves `--device`.
pub fn device(choice: DeviceChoice) -> Result<Device> {
    Ok(match choice {
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Auto => Device::cuda_if_available(),
        DeviceChoice::Cuda if tch::Cuda::is_available() => Device::Cuda(0),
        DeviceChoice::Cuda => {
            return Err(Error::Config(format!(
                "--device cuda: libtorch sees no CUDA device (this binary {} libtorch_cuda; see docs/gpu.md)",
                if env!("LSGD_LINKED_CUDA") == "1" {
                    "links"
                } else {
                    "was built without"
                }
            )));
        }
    })
}

/// Large-block glibc malloc settings: libtorch allocates and frees activation-sized blocks
/// every step, and with the defaults each one is a fresh mmap/munmap pair plus page faults;
/// raised thresholds keep them in the heap for reuse, as PyTorch's allocator does for Python
/// (`bench train` compares the two).
pub fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

/// One malloc arena for every thread. Only the main arena keeps its free memory up to
/// [`tune_malloc`]'s threshold (another thread's arena unmaps a heap once it empties), and the
/// overlapped step's backward pass runs on a thread of its own: with glibc's default arenas
/// the cnn's pass there took 44–50 ms against 37–40 with one arena (two ranks on shared
/// memory). The limit binds only threads that have none yet, so `lsgd-host` calls this before
/// it starts any, and not for `--fault-tolerance` (which does not overlap by default): with
/// one arena the lab's grow-back test saw, under load, a survivor take a live rank for lost.
pub fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator settings; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Trains in this process alone (see [`run_in`]).
pub fn run(
    config: &TrainConfig,
    policies: PolicySet,
    resume: Option<&Path>,
    reporting: Reporting,
) -> Result<Summary> {
    run_in(&mut World::single(), config, policies, resume, reporting)
}

/// Trains as `config` says on this rank of `world`, asking `policies` at every step; resumes
/// from `resume` if given. Every rank runs the same loop on its shard of each global batch
/// and evaluates the whole test split (identical weights give identical results, which the
/// policies read as `last-metric`); rank 0 alone reports, writes metrics and checkpoints.
pub fn run_in(
    world: &mut World,
    config: &TrainConfig,
    policies: PolicySet,
    resume: Option<&Path>,
    reporting: Reporting,
) -> Result<Summary> {
    Trainer::new(world, config, policies, resume, reporting)?.run()
}

/// blake3 over every variable's name and bytes, in name order.
pub fn weights_blake3(vs: &VarStore) -> String {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    parallel::tensors_hash(vars.iter().map(|(n, t)| (n.as_str(), t)))
        .finalize()
        .to_hex()
        .to_string()
}
