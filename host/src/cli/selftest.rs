//! `lsgd-host selftest` (hidden): checks run under mpirun by the integration tests.

use anyhow::Result;
use clap::{Args, Subcommand};

use super::run::parse_timeout;
use crate::collective::{Algorithm, World, parse_shape, selftest, survive};

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
    /// Fault tolerance (under `mpirun --with-ft ulfm`): rounds of all-reduces in which one rank
    /// is lost on purpose; the survivors agree, shrink and redo the round, and their sums are
    /// checked; exit 1 on a wrong sum.
    Survive {
        /// `all` or a comma-separated list of algorithms, each run once per round.
        #[arg(long, default_value = "all", value_parser = Algorithm::parse_list)]
        algo: std::vec::Vec<Algorithm>,
        /// Rounds in all.
        #[arg(long, default_value_t = 6)]
        rounds: usize,
        /// The rank that is lost.
        #[arg(long, value_name = "RANK")]
        lose: Option<usize>,
        /// Before which round it is lost.
        #[arg(long, default_value_t = 3)]
        at: usize,
        /// How it is lost.
        #[arg(long, value_enum, default_value_t = survive::Loss::Kill)]
        how: survive::Loss,
        /// Seconds without a heartbeat after which a rank counts as lost.
        #[arg(long, default_value = "3", value_parser = parse_timeout)]
        detector: std::time::Duration,
        /// Floats per all-reduce.
        #[arg(long, default_value_t = 1000)]
        len: usize,
        /// Rank 0 spends this many seconds away from MPI before each round while the others
        /// wait (a long computation that must not count as silence).
        #[arg(long, value_parser = parse_timeout)]
        busy: Option<std::time::Duration>,
    },
}

/// Runs `selftest`; `Ok(false)` when a check failed.
pub fn run(args: SelftestArgs) -> Result<bool> {
    let (algo, torus_shape, ranks_per_node, sizes, seed) = match args.what {
        SelftestCommand::Allreduce {
            algo,
            torus_shape,
            ranks_per_node,
            sizes,
            seed,
        } => (algo, torus_shape, ranks_per_node, sizes, seed),
        SelftestCommand::Survive {
            algo,
            rounds,
            lose,
            at,
            how,
            detector,
            len,
            busy,
        } => {
            let plan = survive::Plan {
                algos: algo,
                rounds,
                lose: lose.map(|r| (r, at, how)),
                len,
                busy: busy.map(|b| (0, b)),
            };
            return run_survive(&plan, detector);
        }
    };
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

/// `selftest survive`: every survivor checks its sums; the lowest survivor prints the rounds.
fn run_survive(plan: &survive::Plan, detector: std::time::Duration) -> Result<bool> {
    let mut world = World::init_tolerant(detector)?;
    let started = world.size();
    let rounds = survive::run(&mut world, plan)?;
    if world.is_root() {
        for r in &rounds {
            let lost = r.lost.as_ref().map_or(String::new(), |(ranks, took)| {
                format!(
                    "  lost rank(s) {ranks:?}, redone {:.0} ms after the first error",
                    took.as_secs_f64() * 1e3
                )
            });
            println!(
                "round {}: {} of {started} ranks, {} tries, sums {}{lost}",
                r.round,
                r.ranks,
                r.tries,
                if r.exact { "exact" } else { "WRONG" }
            );
        }
    }
    Ok(rounds.iter().all(|r| r.exact))
}
