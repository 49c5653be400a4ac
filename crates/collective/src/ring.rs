//! Ring all-reduce: reduce-scatter then all-gather, each p−1 steps to the next rank.
//!
//! Cost 2(p−1)α + 2((p−1)/p)·n·β: bandwidth-optimal, latency linear in p. After the
//! reduce-scatter, rank r holds the finished sum of chunk (r+1) mod p, computed by r alone;
//! the all-gather only copies, so every rank ends with the same bytes. The torus and the
//! hierarchical algorithm reuse these two halves on their sub-communicators.

use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::{Format, add_into, chunk, exchange, split_pair};

/// The chunk rank `rank` of a `p`-ring owns after [`reduce_scatter`].
pub fn owned_chunk(rank: usize, p: usize) -> usize {
    (rank + 1) % p
}

/// Ring reduce-scatter over `comm`: afterwards this rank's [`owned_chunk`] of `buf` holds the
/// sum over all ranks (other chunks hold partial sums). Returns the bytes sent.
pub fn reduce_scatter<E: Format>(
    comm: &SimpleCommunicator,
    buf: &mut [E::Stored],
    scratch: &mut Vec<E::Stored>,
) -> u64 {
    let (p, r) = (comm.size() as usize, comm.rank() as usize);
    let n = buf.len();
    if p == 1 {
        return 0;
    }
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    scratch.resize(n.div_ceil(p), E::Stored::default());
    let mut sent = 0;
    for step in 0..p - 1 {
        let send = chunk(n, p, (r + p - step) % p);
        let recv = chunk(n, p, (r + 2 * p - step - 1) % p);
        let incoming = &mut scratch[..recv.len()];
        sent += exchange(comm, next, &buf[send], prev, incoming);
        add_into::<E>(&mut buf[recv], incoming);
    }
    sent
}

/// Ring all-gather over `comm` after [`reduce_scatter`]: copies every rank's owned chunk into
/// every other rank's `buf`. Returns the bytes sent.
pub fn all_gather<T: Equivalence>(comm: &SimpleCommunicator, buf: &mut [T]) -> u64 {
    let (p, r) = (comm.size() as usize, comm.rank() as usize);
    let n = buf.len();
    if p == 1 {
        return 0;
    }
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let mut sent = 0;
    for step in 0..p - 1 {
        let send = chunk(n, p, (owned_chunk(r, p) + p - step) % p);
        let recv = chunk(n, p, (r + p - step) % p);
        let (out, into) = split_pair(buf, send, recv);
        sent += exchange(comm, next, out, prev, into);
    }
    sent
}

/// In-place ring all-reduce (sum) over `comm`. Returns the bytes sent.
pub fn all_reduce<E: Format>(
    comm: &SimpleCommunicator,
    buf: &mut [E::Stored],
    scratch: &mut Vec<E::Stored>,
) -> u64 {
    reduce_scatter::<E>(comm, buf, scratch) + all_gather(comm, buf)
}
