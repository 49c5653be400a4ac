//! The one error type of the collective layer.

use lsgd_codec::Element;

/// What can go wrong in the collective layer; the messages are the user's, word for word.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// [`crate::World::init`] found MPI already initialized (a second world in one process).
    #[error("MPI was already initialized in this process")]
    MpiInitialized,

    /// MPI_Comm_split gave this rank no communicator (a torus or node split).
    #[error("MPI_Comm_split returned no communicator")]
    CommSplit,

    /// A torus grid whose X·Y is not the world size.
    #[error(
        "torus shape {}x{} needs {} ranks, the world has {world}",
        .shape.0,
        .shape.1,
        .shape.0 * .shape.1
    )]
    TorusShape {
        /// The grid asked for, X×Y.
        shape: (usize, usize),
        /// Ranks in the world.
        world: usize,
    },

    /// A torus shape that is not `XxY`.
    #[error("torus shape {shape:?} is not XxY (e.g. 4x2)")]
    ShapeSyntax {
        /// What was given.
        shape: String,
    },

    /// A torus shape whose X or Y is not a number.
    #[error("torus shape {shape:?}: bad {axis}")]
    ShapeAxis {
        /// What was given.
        shape: String,
        /// `X` or `Y`.
        axis: char,
    },

    /// A torus shape with a zero side.
    #[error("torus shape {shape:?}: X and Y must be positive")]
    ShapeEmpty {
        /// What was given.
        shape: String,
    },

    /// Simulated nodes of zero ranks.
    #[error("ranks per node must be positive")]
    RanksPerNode,

    /// A name in an algorithm list that is no algorithm.
    #[error(
        "unknown all-reduce algorithm {name:?} (expected all or a list of mpi, ring, \
         halving-doubling, binary-blocks, torus2d, hierarchical)"
    )]
    UnknownAlgorithm {
        /// The name given.
        name: String,
    },

    /// An algorithm list that names none.
    #[error("no all-reduce algorithm named in {list:?}")]
    NoAlgorithm {
        /// The list given.
        list: String,
    },

    /// Payload lengths whose sum or one of which does not fit MPI's C `int` counts.
    #[error("all-gather of {lengths:?} bytes overflows MPI's int counts")]
    GatherOverflow {
        /// Every rank's payload length, in rank order.
        lengths: Vec<u64>,
    },

    /// A broadcast longer than this process can address.
    #[error("broadcast of {len} bytes does not fit in this process's address space")]
    BroadcastTooLong {
        /// The root's length.
        len: u64,
    },

    /// A 16-bit sum asked for in a format that is not 16-bit.
    #[error("a 16-bit all-reduce sums F16 or Bf16 elements, not {element:?}")]
    NotSixteenBit {
        /// The format asked for.
        element: Element,
    },

    /// A summable payload that does not hold a whole number of elements.
    #[error(
        "a payload of {len} bytes does not hold whole {element:?} elements ({} bytes each)",
        .element.size()
    )]
    PayloadLength {
        /// The payload's length in bytes.
        len: usize,
        /// Its element format.
        element: Element,
    },

    /// A point-to-point message in a world without MPI, or to a rank that does not exist.
    #[error("no rank {rank} to exchange messages with: the world has {size} rank(s)")]
    NoSuchRank {
        /// The rank asked for.
        rank: usize,
        /// Ranks in the world.
        size: usize,
    },

    /// A collective of a fault-tolerant world failed: a rank was lost (or another rank saw a
    /// loss and revoked the world). The survivors agree on it and shrink ([`crate::World::shrink`]).
    #[error("a rank was lost during a collective: {what} (MPI error class {class})")]
    RankLost {
        /// The MPI error class the error handler saw first.
        class: i32,
        /// The class in words.
        what: &'static str,
    },

    /// MPI gave a lower thread level than the run needs.
    #[error("{0}")]
    ThreadLevel(String),

    /// `--fault-tolerance` where MPI cannot provide it.
    #[error("--fault-tolerance: {0}")]
    Unavailable(String),

    /// The survivors could not start or take in replacements (`--grow-back`).
    #[error("growing the world back failed: {0}")]
    Grow(String),

    /// MPIX_Comm_shrink kept failing.
    #[error("the survivors could not shrink the world (MPIX_Comm_shrink failed 8 times)")]
    Shrink,

    /// This rank is on the smaller side of a partition (or all that is left of a world that
    /// lost its majority): it stops without writing, so that the other side goes on alone.
    #[error(
        "cut off: {after} of the last agreed world's {before} ranks can still reach this one \
         (lost ranks {lost:?}), not a majority{tie}; this side stops and writes no checkpoint \
         or metrics, so that the side with the majority goes on alone"
    )]
    CutOff {
        /// Ranks in the world before the loss.
        before: usize,
        /// Ranks this side kept.
        after: usize,
        /// The ranks (of the world before) this side lost.
        lost: Vec<usize>,
        /// Said when exactly half remain: the half without the old rank 0 stops.
        tie: &'static str,
    },

    /// Writing a report (the self-test summary).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The collective layer's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_what_went_wrong() {
        let torus = Error::TorusShape {
            shape: (2, 2),
            world: 2,
        };
        assert_eq!(
            torus.to_string(),
            "torus shape 2x2 needs 4 ranks, the world has 2"
        );
        let payload = Error::PayloadLength {
            len: 3,
            element: Element::F16,
        };
        assert_eq!(
            payload.to_string(),
            "a payload of 3 bytes does not hold whole F16 elements (2 bytes each)"
        );
    }
}
