//! Benchmarks that print ratios measured in one run (never timed assertions in tests).
//!
//! - [`allreduce`]: each all-reduce algorithm against MPI_Allreduce under mpirun;
//! - [`policies`]: per-call cost of each policy plugin next to the same formula compiled
//!   natively, plus size, load and instantiation times;
//! - [`languages`]: the same warmup schedule in Rust, C, Python, JavaScript and Go;
//! - [`train`]: `lsgd-host run` against the same job in PyTorch, and the policies' share of a
//!   training step through the sandbox against native;
//! - [`codecs`]: encode+decode GB/s of each codec plugin against the same code compiled
//!   natively, and the compression each achieves.

pub mod allreduce;
pub mod codecs;
pub mod languages;
pub mod policies;
pub mod train;

use std::time::Instant;

/// Median of per-round averages: runs `round` `rounds` times (after one warm-up round) and
/// returns the median nanoseconds per item, where each round processes `items` items.
pub fn median_ns_per_item(rounds: usize, items: usize, mut round: impl FnMut()) -> f64 {
    round();
    let mut per_item: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = Instant::now();
            round();
            start.elapsed().as_nanos() as f64 / items.max(1) as f64
        })
        .collect();
    per_item.sort_by(f64::total_cmp);
    per_item[per_item.len() / 2]
}
