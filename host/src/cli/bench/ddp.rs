//! `lsgd-host bench ddp`: `mpirun -np N lsgd-host run` against the same job in PyTorch's
//! DistributedDataParallel under torchrun.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::emit;
use crate::bench::ddp;
use crate::cli::trace::Format;
use crate::collective::Algorithm;
use crate::model::Arch;

/// Arguments of `bench ddp`.
#[derive(Args, Debug)]
pub struct DdpArgs {
    /// Network (the PyTorch script mirrors `cnn` and `mlp`).
    #[arg(long, value_enum, default_value_t = Arch::Cnn)]
    model: Arch,
    /// Global batch, split evenly across the ranks.
    #[arg(long, default_value_t = 256)]
    global_batch: u32,
    /// libtorch threads per rank on both sides.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Ranks on both sides.
    #[arg(long, default_value_t = 2)]
    np: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 40)]
    steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 5)]
    warmup_steps: u64,
    /// Rounds of (lsgd-host, PyTorch), alternated; medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// IDX directory.
    #[arg(long, default_value = crate::data::DEFAULT_DIR)]
    data: PathBuf,
    /// Python with torch importable (default: the project venv's).
    #[arg(long)]
    python: Option<PathBuf>,
    /// lsgd-host's gradient all-reduce algorithm.
    #[arg(long, value_enum, default_value_t = Algorithm::Mpi)]
    allreduce: Algorithm,
    /// Gradient bucket cap of both sides, MiB (`run --bucket-mb`'s default; DDP's
    /// bucket_cap_mb).
    #[arg(long, default_value_t = 25.0, value_name = "MIB")]
    bucket_mb: f64,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

impl DdpArgs {
    /// Runs `bench ddp`.
    pub fn run(self) -> Result<()> {
        let setup = ddp::Setup {
            model: self.model,
            batch: self.global_batch,
            threads: self.threads,
            np: self.np,
            steps: self.steps,
            warmup: self.warmup_steps,
            rounds: self.rounds,
            data: self.data,
            python: self.python.unwrap_or_else(crate::train::venv::python),
            allreduce: self.allreduce,
            bucket_mb: self.bucket_mb,
        };
        let report = ddp::run(&setup)?;
        emit(self.format, &report, |out| ddp::print(&setup, &report, out))
    }
}
