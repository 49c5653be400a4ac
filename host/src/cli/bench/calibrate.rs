//! `lsgd-host bench calibrate`: the α-β-γ model's machine parameters fitted from timings
//! under mpirun, printed and, with `--out`, written as the model file.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use super::emit;
use crate::bench::{allreduce, calibrate};
use crate::cli::trace::Format;
use crate::collective::World;

/// Arguments of `bench calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Message sizes in bytes: a list `0,8,4K,1M` or `8..16M` (powers of two).
    #[arg(
        long,
        default_value = "0,8,64,512,4K,32K,256K,1M,4M,16M",
        value_parser = allreduce::parse_sizes
    )]
    sizes: std::vec::Vec<usize>,
    /// Timed repetitions per size (default: 51 at small sizes down to 5 at 8 MiB and up);
    /// the median is taken.
    #[arg(long)]
    reps: Option<usize>,
    /// Untimed repetitions per size first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Bytes of each vector in the timed f32 addition (γ), with K/M/G suffixes.
    #[arg(long, default_value = "16M", value_parser = allreduce::parse_count)]
    gamma_bytes: usize,
    /// Also write the calibration as JSON here (the model file of `simulate --model`).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// `json` prints the calibration as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

impl CalibrateArgs {
    /// Runs `bench calibrate` on this rank; rank 0 prints and writes `--out`.
    pub fn run(self) -> Result<()> {
        let world = World::init()?;
        let setup = calibrate::Setup {
            sizes: self.sizes,
            reps: self.reps,
            warmup: self.warmup,
            gamma_bytes: self.gamma_bytes,
        };
        let cal = calibrate::run(&world, &setup)?;
        if !world.is_root() {
            return Ok(());
        }
        if let Some(path) = &self.out {
            let json = serde_json::to_string_pretty(&cal)?;
            std::fs::write(path, json + "\n")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        emit(self.format, &cal, |out| calibrate::print(&cal, out))
    }
}
