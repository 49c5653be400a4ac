//! `lsgd-host bench allreduce`: each all-reduce algorithm against MPI_Allreduce under mpirun,
//! with the α-β model's prediction beside it given `--model`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::emit;
use crate::bench::{allreduce, calibrate};
use crate::cli::trace::Format;
use crate::collective::{Algorithm, World, parse_shape};

/// Arguments of `bench allreduce`.
#[derive(Args, Debug)]
pub struct AllreduceArgs {
    /// `all` or a comma-separated list: mpi, ring, halving-doubling, binary-blocks, torus2d,
    /// hierarchical.
    #[arg(long, default_value = "all", value_parser = Algorithm::parse_list)]
    algo: std::vec::Vec<Algorithm>,
    /// Floats per vector: `4K..64M` (powers of two between the bounds) or a list `4K,1M`.
    #[arg(long, default_value = "4K..64M", value_parser = allreduce::parse_sizes)]
    sizes: std::vec::Vec<usize>,
    /// Timed iterations per size (default: 50 at small sizes down to 9 at 64 MB).
    #[arg(long)]
    iters: Option<usize>,
    /// Untimed iterations per size first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Torus grid XxY for torus2d (default: near-square).
    #[arg(long, value_parser = parse_shape)]
    torus_shape: Option<(usize, usize)>,
    /// A model file (`bench calibrate --out`): adds each row's α-β prediction on this
    /// world (its size, torus grid and ranks per host) and measured/predicted.
    #[arg(long, visible_alias = "predict", value_name = "FILE")]
    model: Option<PathBuf>,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

impl AllreduceArgs {
    /// Runs `bench allreduce` on this rank; rank 0 prints.
    pub fn run(self) -> Result<()> {
        // Read before measuring, so a bad file fails at once, on every rank alike.
        let machine = self
            .model
            .as_deref()
            .map(calibrate::Machine::load)
            .transpose()?;
        let mut world = World::init()?;
        world.set_torus_shape(self.torus_shape)?;
        let setup = allreduce::Setup {
            algos: self.algo,
            sizes: self.sizes,
            iters: self.iters,
            warmup: self.warmup,
        };
        let mut rows = allreduce::run(&mut world, &setup)?;
        let mut header = None;
        if let (Some(machine), Some(path)) = (machine, &self.model) {
            // This world's layout, not the calibration run's: `hierarchical` runs on the
            // hosts this run has.
            let hosts = world.hostnames()?;
            let local = calibrate::Machine {
                ranks_per_node: calibrate::ranks_per_node(&hosts),
                ..machine
            };
            let cost = local.cost_model(Some(world.torus_shape()));
            allreduce::predict(&mut rows, &cost, world.size());
            header = Some(format!(
                "# predicted: α-β model of {} on this world ({} rank(s) per host): {}",
                path.display(),
                local.ranks_per_node,
                local.simulate_flags()
            ));
        }
        // Every rank holds the same rows; rank 0 alone prints them.
        if !world.is_root() {
            return Ok(());
        }
        emit(self.format, &rows, |mut out| {
            if let Some(h) = &header {
                writeln!(out, "{h}")?;
            }
            allreduce::print_table(&world, &rows, out)
        })
    }
}
