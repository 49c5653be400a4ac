//! `lsgd-host bench`: one module per subcommand, each owning its flags (an `Args` struct) and
//! its `run`, as wasmtime's `src/commands/` do; this file dispatches and holds what they share.
//!
//! A new subcommand is a file here with its `Args` struct and `fn run(self) -> Result<()>`, a
//! variant of `BenchCommand` whose doc comment is its help, and its line in [`run`].

mod allreduce;
mod calibrate;
mod codecs;
mod ddp;
mod loader;
mod policies;
mod train;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::trace::Format;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Median ns per policy call through the sandbox vs the same formula compiled natively.
    Policies(policies::PoliciesArgs),
    /// `lsgd-host run` vs the same job in PyTorch (samples/s ratio), and the policies' share
    /// of a step through the sandbox vs native.
    Train(train::TrainArgs),
    /// Image decoding against training: the loader alone (images/s) and `lsgd-host run` on
    /// the same image folder (samples/s); without --data-dir, on synthetic 500×375 JPEGs.
    Loader(loader::LoaderArgs),
    /// `mpirun -np N lsgd-host run` vs the same job in PyTorch DistributedDataParallel (gloo)
    /// under torchrun (samples/s ratio), and each side's communication time per step.
    Ddp(ddp::DdpArgs),
    /// Encode+decode GB/s of each codec plugin vs the same code compiled natively, and the
    /// compression ratio, on 1M- and 16M-float buckets.
    Codecs(codecs::CodecsArgs),
    /// Each all-reduce algorithm against MPI_Allreduce, nccl-tests style; run under mpirun
    /// (`mpirun -np 4 lsgd-host bench allreduce --algo all --sizes 4K..64M`).
    Allreduce(allreduce::AllreduceArgs),
    /// The α-β-γ model's machine parameters fitted from measurements, under mpirun with 2 or
    /// more ranks: ping-pongs and two-way exchanges between hosts and inside one, and the f32
    /// addition (`mpirun -np 2 lsgd-host bench calibrate --out model.json`).
    Calibrate(calibrate::CalibrateArgs),
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchCommand::Policies(a) => a.run(),
        BenchCommand::Train(a) => a.run(),
        BenchCommand::Loader(a) => a.run(),
        BenchCommand::Ddp(a) => a.run(),
        BenchCommand::Codecs(a) => a.run(),
        BenchCommand::Allreduce(a) => a.run(),
        BenchCommand::Calibrate(a) => a.run(),
    }
}

/// Prints `value` as JSON with `--format json`, else as `table` prints it.
fn emit<T: serde::Serialize, E: Into<anyhow::Error>>(
    format: Option<Format>,
    value: &T,
    table: impl FnOnce(std::io::StdoutLock<'static>) -> std::result::Result<(), E>,
) -> Result<()> {
    if format == Some(Format::Json) {
        println!("{}", serde_json::to_string_pretty(value)?);
        Ok(())
    } else {
        table(std::io::stdout().lock()).map_err(Into::into)
    }
}

/// `--threads` when given, else every core this process may use.
fn threads_or_all(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
