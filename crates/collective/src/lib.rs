//! Collectives for data-parallel training: the gradient all-reduce in six algorithms, in
//! binary32 or in a 16-bit format ([`Element::F16`], [`Element::Bf16`]), the exchange of codec
//! payloads (summed as [`Element`]s, or all-gathered with their lengths agreed first), the
//! agreement of all ranks on which rank failed, and the small collectives the trainer needs
//! (hash check, broadcast, barrier).
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
//! - [`binary_blocks`]: Rabenseifner & Träff's halving-doubling in power-of-two blocks, for
//!   worlds that are not a power of two;
//! - [`torus`]: Sony's 2D torus, ring along rows and columns of an X×Y grid;
//! - [`hierarchical`]: reduce inside a node over shared memory, ring among node leaders;
//! - [`baseline`]: MPI_Allreduce, the yardstick;
//! - [`cost`]: α-β predictions of each algorithm at scales we cannot run;
//! - [`calibrate`]: the measurements `bench calibrate` fits the cost model's α, β, γ to (ping-pong,
//!   two-way exchange, the addition) and the ranks' host names;
//! - [`chunks`]: chunking, the pairwise exchange, and how each element format is stored and
//!   added ([`chunks::Format`]);
//! - [`selftest`]: every algorithm against MPI_Allreduce and the exact sum, for the mpirun tests;
//! - [`survive`]: a rank lost on purpose mid-run and the survivors' sums checked (fault tolerance);
//! - [`watchdog`]: ends a rank stuck in one collective past `--collective-timeout`, naming the
//!   rank and host it waits on, instead of hanging the job;
//! - `wait`: how a rank waits for its messages, spinning only while no thread of it computes
//!   ([`Computing`], the overlapped backward pass);
//! - [`ulfm`]: `--fault-tolerance`, MPI's ULFM: a collective that loses a rank reports it, and
//!   the survivors agree, shrink and go on ([`World::init_tolerant`], [`World::agree`],
//!   [`World::shrink`]).
//!
//! Errors are one [`Error`] enum; the `lsgd-host` binary turns them into `anyhow` errors.

pub mod baseline;
pub mod binary_blocks;
pub mod calibrate;
pub mod chunks;
pub mod cost;
mod error;
pub mod halving_doubling;
pub mod hierarchical;
mod p2p;
pub mod ring;
pub mod selftest;
pub mod survive;
pub mod torus;
pub mod ulfm;
mod wait;
pub mod watchdog;
mod world;

use std::fmt;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

pub use error::{Error, Result};
/// The element formats of summed payloads and 16-bit all-reduces (binary32, binary16, bfloat16).
pub use lsgd_codec::Element;
pub use wait::Computing;
pub use world::{Agreement, LostRank, Shrunk, World};

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
    /// Recursive halving (reduce-scatter), then recursive doubling (all-gather); other than
    /// powers of two, the extra ranks fold into partners and wait.
    HalvingDoubling,
    /// Halving-doubling inside power-of-two blocks (600 = 512+64+16+8) whose partial sums
    /// cascade up to the largest and back (Rabenseifner & Träff); no rank waits.
    BinaryBlocks,
    /// 2D torus: reduce-scatter along rows, all-reduce along columns, all-gather along rows.
    Torus2d,
    /// Reduce inside each node, ring among node leaders, broadcast inside each node.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, the baseline first.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Mpi,
        Algorithm::Ring,
        Algorithm::HalvingDoubling,
        Algorithm::BinaryBlocks,
        Algorithm::Torus2d,
        Algorithm::Hierarchical,
    ];

    /// The command-line name (`halving-doubling`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Mpi => "mpi",
            Algorithm::Ring => "ring",
            Algorithm::HalvingDoubling => "halving-doubling",
            Algorithm::BinaryBlocks => "binary-blocks",
            Algorithm::Torus2d => "torus2d",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(s: &str) -> Result<Vec<Algorithm>> {
        if s.trim() == "all" {
            return Ok(Algorithm::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let algo = Algorithm::ALL
                .into_iter()
                .find(|a| a.name() == name)
                .ok_or_else(|| Error::UnknownAlgorithm {
                    name: name.to_string(),
                })?;
            if !out.contains(&algo) {
                out.push(algo);
            }
        }
        if out.is_empty() {
            return Err(Error::NoAlgorithm {
                list: s.to_string(),
            });
        }
        Ok(out)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one collective call did on this rank. The traffic of several calls adds up with `+`,
/// `+=` and [`Iterator::sum`]: bytes and seconds each summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    /// Bytes this rank sent (for MPI's own collectives, their bandwidth lower bound).
    pub bytes_sent: u64,
    /// Wall-clock seconds of the call on this rank.
    pub seconds: f64,
}

impl AddAssign for Traffic {
    fn add_assign(&mut self, other: Traffic) {
        self.bytes_sent += other.bytes_sent;
        self.seconds += other.seconds;
    }
}

impl Add for Traffic {
    type Output = Traffic;

    fn add(mut self, other: Traffic) -> Traffic {
        self += other;
        self
    }
}

impl Sum for Traffic {
    fn sum<I: Iterator<Item = Traffic>>(iter: I) -> Traffic {
        iter.fold(Traffic::default(), Add::add)
    }
}

/// Parses a grid shape `XxY` (`4x2`: rows of 4 ranks, 2 rows).
pub fn parse_shape(s: &str) -> Result<(usize, usize)> {
    let shape = || s.to_string();
    let (x, y) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| Error::ShapeSyntax { shape: shape() })?;
    let side = |v: &str, axis| {
        v.trim().parse::<usize>().map_err(|_| Error::ShapeAxis {
            shape: shape(),
            axis,
        })
    };
    let (x, y) = (side(x, 'X')?, side(y, 'Y')?);
    if x == 0 || y == 0 {
        return Err(Error::ShapeEmpty { shape: shape() });
    }
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
        assert_eq!(
            parse_shape("4xb").unwrap_err().to_string(),
            "torus shape \"4xb\": bad Y"
        );
    }

    #[test]
    fn traffic_adds_up() {
        let a = Traffic {
            bytes_sent: 3,
            seconds: 0.5,
        };
        let b = Traffic {
            bytes_sent: 4,
            seconds: 0.25,
        };
        let mut total = Traffic::default();
        total += a;
        total += b;
        let want = Traffic {
            bytes_sent: 7,
            seconds: 0.75,
        };
        assert_eq!(total, want);
        assert_eq!(a + b, want);
        assert_eq!([a, b].into_iter().sum::<Traffic>(), want);
        assert_eq!(
            std::iter::empty::<Traffic>().sum::<Traffic>(),
            Traffic::default()
        );
    }
}
