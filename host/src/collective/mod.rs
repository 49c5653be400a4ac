//! Collectives for data-parallel training: the gradient all-reduce in five algorithms, in
//! binary32 or in a 16-bit format ([`Half`], for summable compressed gradients), the all-gather
//! of variable-length payloads (for the other codecs), and the small collectives the trainer
//! needs (hash check, broadcast, barrier).
//!
//! A [`World`] is either an MPI world (the process was started by `mpirun`) or a single process
//! that never touches MPI, so `lsgd-host run` without `mpirun` needs no MPI daemon.
//!
//! Every algorithm gives every rank the same bytes: each chunk of the vector is fully reduced
//! by exactly one rank and then copied to the others, never reduced in a different order on
//! different ranks. That is what keeps the weights of all ranks bit-identical step after step.
//!
//! - [`ring`]: reduce-scatter then all-gather around a ring (bandwidth-optimal, 2(p−1) steps);
//! - [`halving_doubling`]: Rabenseifner's recursive halving then doubling (2·log₂p steps);
//! - [`torus`]: Sony's 2D torus, ring along rows and columns of an X×Y grid;
//! - [`hierarchical`]: reduce inside a node over shared memory, ring among node leaders;
//! - [`baseline`]: MPI_Allreduce, the yardstick;
//! - [`cost`]: α-β predictions of each algorithm at scales we cannot run;
//! - [`chunks`]: chunking, the pairwise exchange, and the element formats summed in;
//! - [`selftest`]: every algorithm against MPI_Allreduce and the exact sum, for the mpirun tests.

pub mod baseline;
pub mod chunks;
pub mod cost;
pub mod halving_doubling;
pub mod hierarchical;
pub mod ring;
pub mod selftest;
pub mod torus;
mod world;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use world::World;

/// An all-reduce algorithm (`--allreduce`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    clap::ValueEnum,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// MPI_Allreduce as the MPI library implements it (the baseline); 16-bit sums use a
    /// user-defined MPI operation, since MPI has no 16-bit float sum.
    Mpi,
    /// Ring reduce-scatter, then ring all-gather.
    Ring,
    /// Recursive halving (reduce-scatter), then recursive doubling (all-gather).
    HalvingDoubling,
    /// 2D torus: reduce-scatter along rows, all-reduce along columns, all-gather along rows.
    Torus2d,
    /// Reduce inside each node, ring among node leaders, broadcast inside each node.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, the baseline first.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Mpi,
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::Torus2d,
        Algorithm::Hierarchical,
    ];

    /// The command-line name (`halving-doubling`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Mpi => "mpi",
            Algorithm::Ring => "ring",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::Torus2d => "torus2d",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(s: &str) -> anyhow::Result<Vec<Algorithm>> {
        if s.trim() == "all" {
            return Ok(Algorithm::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let algo = Algorithm::ALL
                .into_iter()
                .find(|a| a.name() == name)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown all-reduce algorithm {name:?} (expected all or a list of mpi, \
                         ring, halving-doubling, torus2d, hierarchical)"
                    )
                })?;
            if !out.contains(&algo) {
                out.push(algo);
            }
        }
        anyhow::ensure!(!out.is_empty(), "no all-reduce algorithm named in {s:?}");
        Ok(out)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A 16-bit float format summed by [`World::all_reduce_sum_half`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Half {
    /// IEEE binary16 (fp16).
    F16,
    /// bfloat16, the upper half of a binary32.
    Bf16,
}

impl Half {
    /// Both formats.
    pub const ALL: [Half; 2] = [Half::F16, Half::Bf16];

    /// `f16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Half::F16 => "f16",
            Half::Bf16 => "bf16",
        }
    }

    /// The nearest value's bits (ties to even), as the all-reduce rounds.
    pub fn bits(self, x: f32) -> u16 {
        match self {
            Half::F16 => lsgd_codec::wire::f16_bits(x),
            Half::Bf16 => lsgd_codec::wire::bf16_bits(x),
        }
    }

    /// The value of `bits` (exact in binary32).
    pub fn value(self, bits: u16) -> f32 {
        match self {
            Half::F16 => lsgd_codec::wire::f16_value(bits),
            Half::Bf16 => lsgd_codec::wire::bf16_value(bits),
        }
    }
}

/// What one collective call did on this rank.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Bytes this rank sent (for MPI's own collectives, their bandwidth lower bound).
    pub bytes_sent: u64,
    /// Wall-clock seconds of the call on this rank.
    pub seconds: f64,
}

/// Parses a grid shape `XxY` (`4x2`: rows of 4 ranks, 2 rows).
pub fn parse_shape(s: &str) -> anyhow::Result<(usize, usize)> {
    let (x, y) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| anyhow::anyhow!("torus shape {s:?} is not XxY (e.g. 4x2)"))?;
    let x: usize = x
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("torus shape {s:?}: bad X"))?;
    let y: usize = y
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("torus shape {s:?}: bad Y"))?;
    anyhow::ensure!(
        x > 0 && y > 0,
        "torus shape {s:?}: X and Y must be positive"
    );
    Ok((x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_names_round_trip_through_clap_serde_and_display() {
        use clap::ValueEnum;
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_str(a.name(), false).unwrap(), a);
            assert_eq!(a.to_string(), a.name());
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(json, format!("\"{}\"", a.name()));
            assert_eq!(serde_json::from_str::<Algorithm>(&json).unwrap(), a);
        }
    }

    #[test]
    fn algorithm_lists_parse() {
        assert_eq!(Algorithm::parse_list("all").unwrap(), Algorithm::ALL);
        assert_eq!(
            Algorithm::parse_list("ring, mpi,ring").unwrap(),
            [Algorithm::Ring, Algorithm::Mpi]
        );
        assert!(Algorithm::parse_list("tree").is_err());
        assert!(Algorithm::parse_list("").is_err());
    }

    #[test]
    fn shapes_parse() {
        assert_eq!(parse_shape("4x2").unwrap(), (4, 2));
        assert_eq!(parse_shape("1X4").unwrap(), (1, 4));
        assert!(parse_shape("4").is_err());
        assert!(parse_shape("0x4").is_err());
        assert!(parse_shape("ax4").is_err());
    }
}
