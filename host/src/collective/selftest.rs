//! Every algorithm against MPI_Allreduce on the same random data (`lsgd-host selftest
//! allreduce`, run by the mpirun tests).
//!
//! Different algorithms add in different orders, so they are compared with a tolerance: two
//! summation orders of p terms differ by at most (p−1)·ε·Σ|xᵢ| per element. Across ranks there
//! is no tolerance: each algorithm must give every rank the same bytes (a hash per rank).

use std::io::Write;

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{Algorithm, World};

/// What to test.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Vector lengths (floats); [`default_sizes`] covers the edge cases.
    pub sizes: Vec<usize>,
    /// Torus grid for `torus2d`; `None`: the default shape.
    pub torus_shape: Option<(usize, usize)>,
    /// Simulated node sizes for `hierarchical`, tested in addition to the real nodes.
    pub ranks_per_node: Vec<usize>,
    /// Base seed; each rank draws its data from a seed derived from it, its rank and the size.
    pub seed: u64,
}

/// One algorithm (and variant) over every size.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `ring`, `torus2d 2x2`, `hierarchical (2 ranks/node)` …
    pub name: String,
    /// Largest |result − MPI| / Σ|xᵢ| over every element and size, on any rank.
    pub max_error: f64,
    /// Sizes where some rank exceeded the tolerance.
    pub wrong_sizes: Vec<usize>,
    /// Sizes where ranks got different bytes.
    pub divergent_sizes: Vec<usize>,
}

impl Outcome {
    /// Whether this algorithm passed.
    pub fn passed(&self) -> bool {
        self.wrong_sizes.is_empty() && self.divergent_sizes.is_empty()
    }
}

/// Sizes that hit the edge cases of chunking for `p` ranks: empty, fewer floats than ranks,
/// around p, not divisible by p, and large enough for several MPI protocols.
pub fn default_sizes(p: usize) -> Vec<usize> {
    let mut sizes = vec![
        0,
        1,
        2,
        3,
        p.saturating_sub(1),
        p,
        p + 1,
        2 * p + 1,
        7,
        1000,
        4099,
        (1 << 16) + 7,
    ];
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Runs the plan on every rank (collective); every rank returns the same outcomes (errors are
/// maxed and hashes gathered across ranks).
pub fn run(world: &mut World, plan: &Plan) -> Result<Vec<Outcome>> {
    let p = world.size();
    let mut cases: Vec<(String, Algorithm, Option<usize>)> = Vec::new();
    for algo in Algorithm::ALL {
        let name = match algo {
            Algorithm::Torus2d => {
                let (x, y) = plan
                    .torus_shape
                    .unwrap_or_else(|| super::torus::default_shape(p));
                format!("torus2d {x}x{y}")
            }
            Algorithm::Hierarchical => "hierarchical (shared-memory nodes)".to_string(),
            _ => algo.to_string(),
        };
        cases.push((name, algo, None));
    }
    for &k in &plan.ranks_per_node {
        cases.push((
            format!("hierarchical ({k} ranks/node)"),
            Algorithm::Hierarchical,
            Some(k),
        ));
    }
    world.set_torus_shape(plan.torus_shape)?;

    let mut outcomes: Vec<Outcome> = cases
        .iter()
        .map(|(name, ..)| Outcome {
            name: name.clone(),
            max_error: 0.0,
            wrong_sizes: Vec::new(),
            divergent_sizes: Vec::new(),
        })
        .collect();
    for &n in &plan.sizes {
        let mut rng = StdRng::seed_from_u64(
            plan.seed ^ (world.rank() as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n as u64,
        );
        // Spread over 2^±12 so that partial sums round, and summation order shows.
        let data: Vec<f32> = (0..n)
            .map(|_| rng.random_range(-1.0f32..1.0) * (rng.random_range(-12..=12) as f32).exp2())
            .collect();
        let mut reference = data.clone();
        world.all_reduce_sum(Algorithm::Mpi, &mut reference)?;
        let mut magnitude: Vec<f32> = data.iter().map(|x| x.abs()).collect();
        world.all_reduce_sum(Algorithm::Mpi, &mut magnitude)?;
        let tolerance = p as f64 * f32::EPSILON as f64;

        for ((_, algo, ranks_per_node), outcome) in cases.iter().zip(&mut outcomes) {
            world.set_ranks_per_node(*ranks_per_node)?;
            let mut got = data.clone();
            world.all_reduce_sum(*algo, &mut got)?;
            let error = got
                .iter()
                .zip(&reference)
                .zip(&magnitude)
                .map(|((g, r), m)| {
                    let e = (*g as f64 - *r as f64).abs() / (*m as f64).max(f64::MIN_POSITIVE);
                    if e.is_nan() { f64::INFINITY } else { e }
                })
                .fold(0.0, f64::max);
            let mut errors = [error];
            world.all_reduce_max_f64(&mut errors)?;
            outcome.max_error = outcome.max_error.max(errors[0]);
            if errors[0] > tolerance {
                outcome.wrong_sizes.push(n);
            }
            let hash = hash_floats(&got);
            if world.all_gather_u64(hash)?.iter().any(|&h| h != hash) {
                outcome.divergent_sizes.push(n);
            }
        }
    }
    world.set_ranks_per_node(None)?;
    Ok(outcomes)
}

/// The rank-0 summary.
pub fn print(world: &World, plan: &Plan, outcomes: &[Outcome], mut out: impl Write) -> Result<()> {
    writeln!(
        out,
        "all-reduce selftest: {} ranks, sizes {:?}, tolerance {:.2e} x sum|x|",
        world.size(),
        plan.sizes,
        world.size() as f64 * f32::EPSILON as f64
    )?;
    writeln!(
        out,
        "{:<36} {:>12}  {:<14} result",
        "algorithm", "max error", "ranks agree"
    )?;
    for o in outcomes {
        writeln!(
            out,
            "{:<36} {:>12.3e}  {:<14} {}",
            o.name,
            o.max_error,
            if o.divergent_sizes.is_empty() {
                "bit-identical"
            } else {
                "DIFFER"
            },
            if o.passed() {
                "ok".to_string()
            } else {
                format!(
                    "FAILED (wrong at {:?}, ranks differ at {:?})",
                    o.wrong_sizes, o.divergent_sizes
                )
            }
        )?;
    }
    Ok(())
}

fn hash_floats(v: &[f32]) -> u64 {
    let mut h = blake3::Hasher::new();
    for x in v {
        h.update(&x.to_le_bytes());
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_world_passes_its_own_selftest() {
        let mut world = World::single();
        let plan = Plan {
            sizes: default_sizes(1),
            torus_shape: None,
            ranks_per_node: vec![1],
            seed: 3,
        };
        let outcomes = run(&mut world, &plan).unwrap();
        assert_eq!(outcomes.len(), 6);
        assert!(
            outcomes.iter().all(|o| o.passed() && o.max_error == 0.0),
            "{outcomes:?}"
        );
    }

    #[test]
    fn default_sizes_include_the_edge_cases() {
        let s = default_sizes(4);
        for n in [0, 1, 3, 4, 5, 9, 1000, 65543] {
            assert!(s.contains(&n), "{n} missing from {s:?}");
        }
    }
}
