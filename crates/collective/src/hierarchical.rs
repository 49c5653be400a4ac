//! Hierarchical all-reduce: inside each node over the MPI shared-memory sub-communicator
//! (`MPI_COMM_TYPE_SHARED`), between nodes by a ring among one leader per node.
//!
//! 1. Ring reduce-scatter inside the node, then each rank sends its finished chunk to the node
//!    leader (local rank 0): the leader holds the node's sum, having received (k−1)/k·n floats
//!    instead of the (k−1)·n of a naive gather-and-add.
//! 2. Ring all-reduce among the leaders (one rank per node): only this phase crosses the
//!    network, with m = p/k participants instead of p.
//! 3. MPI_Bcast from the leader inside the node (shared memory).
//!
//! Only leaders compute the inter-node sum and the broadcast copies it, so every rank ends with
//! the same bytes. Nodes need not have equal rank counts. For tests on one machine, a node can
//! be simulated as consecutive blocks of k world ranks ([`Nodes::new`] with `Some(k)`).

use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use super::chunks::{Format, chunk};
use super::{Error, Result, ring, wait, watchdog};

/// The world rank of each rank of `comm`, whose rank in the world is `world_rank` (a
/// collective over `comm`, once per sub-communicator: the watchdog names world ranks).
pub(crate) fn world_ranks(comm: &SimpleCommunicator, world_rank: i32) -> Vec<usize> {
    let mut all = vec![0i32; comm.size() as usize];
    comm.all_gather_into(&world_rank, &mut all[..]);
    all.into_iter().map(|r| r as usize).collect()
}

/// The node and leader sub-communicators.
pub struct Nodes {
    ranks_per_node: Option<usize>,
    node: SimpleCommunicator,
    leaders: Option<SimpleCommunicator>,
}

impl Nodes {
    /// Puts its communicators under fault tolerance's error handler ([`crate::ulfm`]).
    pub(crate) fn watch(&self) {
        use mpi::raw::AsRaw;
        crate::ulfm::watch(self.node.as_raw());
        if let Some(l) = &self.leaders {
            crate::ulfm::watch(l.as_raw());
        }
    }

    /// Splits `world` by shared-memory node, or into blocks of `ranks_per_node` consecutive
    /// ranks when given (collective).
    pub fn new(world: &SimpleCommunicator, ranks_per_node: Option<usize>) -> Result<Nodes> {
        let r = world.rank();
        let node = match ranks_per_node {
            None => world.split_shared(r),
            Some(k) => {
                if k == 0 {
                    return Err(Error::RanksPerNode);
                }
                world
                    .split_by_color_with_key(Color::with_value(r / k as i32), r)
                    .ok_or(Error::CommSplit)?
            }
        };
        let leader = node.rank() == 0;
        let leaders = world.split_by_color_with_key(
            if leader {
                Color::with_value(0)
            } else {
                Color::undefined()
            },
            r,
        );
        watchdog::register(&node, world_ranks(&node, r));
        if let Some(l) = &leaders {
            watchdog::register(l, world_ranks(l, r));
        }
        Ok(Nodes {
            ranks_per_node,
            node,
            leaders,
        })
    }

    /// The simulated node size these communicators were made for (`None`: real nodes).
    pub fn ranks_per_node(&self) -> Option<usize> {
        self.ranks_per_node
    }

    /// Ranks on this rank's node.
    pub fn local_size(&self) -> usize {
        self.node.size() as usize
    }

    /// In-place all-reduce (sum). Returns the bytes sent (the broadcast counted as the
    /// leader sending the vector once).
    pub fn all_reduce<E: Format>(
        &self,
        buf: &mut [E::Stored],
        scratch: &mut Vec<E::Stored>,
    ) -> u64 {
        let (k, lr) = (self.node.size() as usize, self.node.rank() as usize);
        let n = buf.len();
        let bytes = size_of_val(buf) as u64;
        let mut sent = ring::reduce_scatter::<E>(&self.node, buf, scratch);
        if k > 1 {
            if lr == 0 {
                for from in 1..k {
                    let piece = chunk(n, k, ring::owned_chunk(from, k));
                    watchdog::progress(&self.node, from);
                    wait::receive(&self.node, from, &mut buf[piece]);
                }
            } else {
                let piece = chunk(n, k, ring::owned_chunk(lr, k));
                watchdog::progress(&self.node, 0);
                wait::send(&self.node, 0, &buf[piece.clone()]);
                sent += size_of_val(&buf[piece]) as u64;
            }
        }
        if let Some(leaders) = &self.leaders {
            sent += ring::all_reduce::<E>(leaders, buf, scratch);
        }
        if k > 1 {
            watchdog::progress(&self.node, 0);
            self.node.process_at_rank(0).broadcast_into(buf);
            if lr == 0 {
                sent += bytes;
            }
        }
        sent
    }
}
