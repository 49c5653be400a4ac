//! Rabenseifner's all-reduce: recursive halving (reduce-scatter), then recursive doubling
//! (all-gather). Cost 2·log₂p·α + 2((p−1)/p)·n·β: ring bandwidth with logarithmic latency.
//!
//! # Worlds that are not a power of two
//!
//! We use the standard fold (MPICH's, Open MPI's): with q the largest power of two ≤ p and
//! r = p − q, each of the first r even ranks hands its whole vector to the odd rank after it and
//! sits out; the q remaining ranks run the power-of-two algorithm; the odd ranks hand the result
//! back. It costs one extra α + n·β before and after, on 2r ranks only, and leaves r ranks idle.
//! [`super::binary_blocks`] is the alternative that keeps every rank busy; both reuse the
//! halving and doubling of a power-of-two group here ([`Cube`]).
//!
//! Every element is finally summed by one rank (the owner of its chunk after the halving) and
//! only copied afterwards, so all ranks receive identical bytes.

use std::ops::Range;

use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::{Format, add_into, chunks, exchange, split_pair};

/// Largest power of two ≤ `p` (`p` ≥ 1).
pub fn fold_target(p: usize) -> usize {
    1 << (usize::BITS - 1 - p.leading_zeros())
}

/// A power-of-two group of ranks that halves and doubles together over a vector cut into
/// `parts` chunks.
pub struct Cube<'a> {
    /// Ranks in the group, a power of two.
    pub size: usize,
    /// This rank's index in the group.
    pub me: usize,
    /// Chunks the vector is cut into: a power of two ≥ `size`, so each index ends with
    /// `parts / size` whole chunks (binary blocks cut every block's vector alike).
    pub parts: usize,
    /// The communicator rank of each index.
    pub rank_of: &'a dyn Fn(usize) -> usize,
}

impl Cube<'_> {
    /// Recursive halving: afterwards this rank's [`share`] of `buf` holds the group's sum
    /// (computed here alone); the rest holds partial sums. Returns the bytes sent.
    pub fn reduce_scatter<E: Format>(
        &self,
        comm: &SimpleCommunicator,
        buf: &mut [E::Stored],
        scratch: &mut Vec<E::Stored>,
    ) -> u64 {
        let n = buf.len();
        let (mut lo, mut hi) = (0, self.parts);
        let mut sent = 0;
        let mut mask = self.size / 2;
        // Keep the half of the current range that the partner does not.
        while mask > 0 {
            let partner = (self.rank_of)(self.me ^ mask);
            let mid = (lo + hi) / 2;
            let (keep, give) = if self.me & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let keep_r = chunks(n, self.parts, keep.0, keep.1);
            let give_r = chunks(n, self.parts, give.0, give.1);
            scratch.resize(scratch.len().max(keep_r.len()), E::Stored::default());
            let incoming = &mut scratch[..keep_r.len()];
            sent += exchange(comm, partner, &buf[give_r], partner, incoming);
            add_into::<E>(&mut buf[keep_r], incoming);
            (lo, hi) = keep;
            mask /= 2;
        }
        debug_assert_eq!(chunks(n, self.parts, lo, hi), self.share(n, self.me));
        sent
    }

    /// Recursive doubling after [`Cube::reduce_scatter`]: swaps finished ranges with the
    /// partner, doubling them each time, until every index holds the whole vector. Only copies.
    /// Returns the bytes sent.
    pub fn all_gather<T: Equivalence>(&self, comm: &SimpleCommunicator, buf: &mut [T]) -> u64 {
        let n = buf.len();
        let width = self.parts / self.size;
        let (mut lo, mut hi) = (self.me * width, (self.me + 1) * width);
        let mut sent = 0;
        let mut mask = 1;
        while mask < self.size {
            let partner = (self.rank_of)(self.me ^ mask);
            let size = hi - lo;
            let theirs = if self.me & mask == 0 {
                (hi, hi + size)
            } else {
                (lo - size, lo)
            };
            let (out, into) = split_pair(
                buf,
                chunks(n, self.parts, lo, hi),
                chunks(n, self.parts, theirs.0, theirs.1),
            );
            sent += exchange(comm, partner, out, partner, into);
            (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
            mask *= 2;
        }
        sent
    }

    /// The elements of `n` that index `v` holds finished after [`Cube::reduce_scatter`].
    pub fn share(&self, n: usize, v: usize) -> Range<usize> {
        share(n, self.parts, self.size, v)
    }
}

/// The elements of `n`, cut into `parts` chunks, that index `v` of a `size`-rank [`Cube`]
/// holds after the halving: chunks v·parts/size up to (v+1)·parts/size.
pub fn share(n: usize, parts: usize, size: usize, v: usize) -> Range<usize> {
    let width = parts / size;
    chunks(n, parts, v * width, (v + 1) * width)
}

/// In-place all-reduce (sum) over `comm`. Returns the bytes sent.
pub fn all_reduce<E: Format>(
    comm: &SimpleCommunicator,
    buf: &mut [E::Stored],
    scratch: &mut Vec<E::Stored>,
) -> u64 {
    let (p, rank) = (comm.size() as usize, comm.rank() as usize);
    let n = buf.len();
    if p == 1 {
        return 0;
    }
    let q = fold_target(p);
    let extra = p - q;
    let mut sent = 0;

    // The fold: ranks 2i and 2i+1 (i < extra) become one participant, 2i+1.
    let folded_out = rank < 2 * extra && rank % 2 == 0;
    if rank < 2 * extra {
        if folded_out {
            sent += send(comm, rank + 1, buf);
        } else {
            scratch.resize(n, E::Stored::default());
            receive(comm, rank - 1, scratch);
            add_into::<E>(buf, scratch);
        }
    }
    if !folded_out {
        let world_rank = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };
        let cube = Cube {
            size: q,
            me: if rank < 2 * extra {
                rank / 2
            } else {
                rank - extra
            },
            parts: q,
            rank_of: &world_rank,
        };
        sent += cube.reduce_scatter::<E>(comm, buf, scratch);
        sent += cube.all_gather(comm, buf);
    }

    // Unfold: the odd rank of each folded pair returns the result.
    if rank < 2 * extra {
        if folded_out {
            receive(comm, rank + 1, buf);
        } else {
            sent += send(comm, rank - 1, buf);
        }
    }
    sent
}

/// Sends all of `buf` to rank `to` of `comm` (blocking); returns the bytes sent.
pub fn send<T: Equivalence>(comm: &SimpleCommunicator, to: usize, buf: &[T]) -> u64 {
    crate::watchdog::progress(comm, to);
    crate::wait::send(comm, to, buf);
    size_of_val(buf) as u64
}

/// Receives exactly `buf.len()` elements from rank `from` of `comm` into `buf` (blocking).
pub fn receive<T: Equivalence>(comm: &SimpleCommunicator, from: usize, buf: &mut [T]) {
    crate::watchdog::progress(comm, from);
    crate::wait::receive(comm, from, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_target_is_the_largest_power_of_two_not_above_p() {
        let got: Vec<usize> = (1..=9).map(fold_target).collect();
        assert_eq!(got, [1, 2, 2, 4, 4, 4, 4, 8, 8]);
    }

    #[test]
    fn the_shares_of_a_cube_tile_the_vector_in_index_order() {
        for (n, parts, size) in [(1003, 8, 8), (1003, 8, 2), (5, 16, 4), (0, 4, 1)] {
            let mut next = 0;
            for v in 0..size {
                let r = share(n, parts, size, v);
                assert_eq!(r.start, next, "n={n} parts={parts} size={size} v={v}");
                next = r.end;
            }
            assert_eq!(next, n);
        }
        // A smaller cube's share is exactly the shares of the indices it stands for above it.
        assert_eq!(share(1003, 8, 2, 1), 503..1003);
        assert_eq!(share(1003, 8, 8, 4).start, 503);
    }
}
