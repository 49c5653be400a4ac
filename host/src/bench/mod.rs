//! Benchmarks that print ratios measured in one run (never timed assertions in tests).
//!
//! - [`allreduce`]: each all-reduce algorithm against MPI_Allreduce under mpirun;
//! - [`policies`]: per-call cost of each policy plugin next to the same formula compiled
//!   natively, plus size, load and instantiation times;
//! - [`languages`]: the same warmup schedule in Rust, C, Python, JavaScript and Go;
//! - [`train`]: `lsgd-host run` against the same job in PyTorch, and the policies' share of a
//!   training step through the sandbox against native;
//! - [`ddp`]: `mpirun -np N lsgd-host run` against the same job in PyTorch's
//!   DistributedDataParallel under torchrun, with each side's communication time per step;
//! - [`codecs`]: encode+decode GB/s of each codec plugin against the same code compiled
//!   natively, and the compression each achieves.

pub mod allreduce;
pub mod codecs;
pub mod ddp;
pub mod languages;
pub mod policies;
pub mod train;

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::train::metrics::{self, Record};

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
        policy_s: mean(|s| s.policy_s),
    })
}

/// Median of per-round averages: runs `round` `rounds` times (after one warm-up round) and
/// returns the median nanoseconds per item, where each round processes `items` items.
pub fn median_ns_per_item(rounds: usize, items: usize, round: impl FnMut()) -> f64 {
    ns_per_item(rounds, items, round).p50
}

/// The spread of per-round averages in nanoseconds per item.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// The fastest round.
    pub min: f64,
    /// The median round.
    pub p50: f64,
    /// The round 90% of the rounds are at most as slow as.
    pub p90: f64,
}

/// Like [`median_ns_per_item`], with the fastest round and the 90th percentile: a single call
/// is too short to time on its own (`Instant::now` costs about as much), so each figure is a
/// round's mean.
pub fn ns_per_item(rounds: usize, items: usize, mut round: impl FnMut()) -> Spread {
    round();
    let mut per_item: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = Instant::now();
            round();
            start.elapsed().as_nanos() as f64 / items.max(1) as f64
        })
        .collect();
    per_item.sort_by(f64::total_cmp);
    let at = |q: f64| per_item[((per_item.len() - 1) as f64 * q).round() as usize];
    Spread {
        min: per_item[0],
        p50: per_item[per_item.len() / 2],
        p90: at(0.9),
    }
}
