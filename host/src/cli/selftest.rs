//! `lsgd-host selftest` (hidden): checks run under mpirun by the integration tests.

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::collective::{Algorithm, World, parse_shape, selftest};

/// Arguments of `selftest`.
#[derive(Args, Debug)]
pub struct SelftestArgs {
    #[command(subcommand)]
    what: SelftestCommand,
}

#[derive(Subcommand, Debug)]
enum SelftestCommand {
    /// Every all-reduce algorithm against MPI_Allreduce on random data; exit 1 on a mismatch.
    Allreduce {
        /// `all` or a comma-separated list: mpi, ring, halving-doubling, binary-blocks, torus2d,
        /// hierarchical (MPI_Allreduce is the f32 reference either way).
        #[arg(long, default_value = "all", value_parser = Algorithm::parse_list)]
        algo: std::vec::Vec<Algorithm>,
        /// Torus grid XxY (default: near-square).
        #[arg(long, value_parser = parse_shape)]
        torus_shape: Option<(usize, usize)>,
        /// Also test `hierarchical` with nodes simulated as blocks of this many ranks
        /// (default: 2 when the world has more than 2 ranks).
        #[arg(long, value_delimiter = ',')]
        ranks_per_node: Vec<usize>,
        /// Vector lengths in floats, comma-separated (default: edge cases for the world size).
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Base seed of the random data.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Runs `selftest`; `Ok(false)` when a check failed.
pub fn run(args: SelftestArgs) -> Result<bool> {
    let SelftestCommand::Allreduce {
        algo,
        torus_shape,
        ranks_per_node,
        sizes,
        seed,
    } = args.what;
    let mut world = World::init()?;
    let p = world.size();
    let plan = selftest::Plan {
        algos: algo,
        sizes: if sizes.is_empty() {
            selftest::default_sizes(p)
        } else {
            sizes
        },
        torus_shape,
        ranks_per_node: if ranks_per_node.is_empty() && p > 2 {
            vec![2]
        } else {
            ranks_per_node
        },
        seed,
    };
    let outcomes = selftest::run(&mut world, &plan)?;
    if world.is_root() {
        selftest::print(&world, &plan, &outcomes, std::io::stdout().lock())?;
    }
    Ok(outcomes.iter().all(selftest::Outcome::passed))
}
