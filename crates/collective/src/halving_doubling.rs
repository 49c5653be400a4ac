//! Rabenseifner's all-reduce: recursive halving (reduce-scatter), then recursive doubling
//! (all-gather). Cost 2·log₂p·α + 2((p−1)/p)·n·β: ring bandwidth with logarithmic latency.
//!
//! # Worlds that are not a power of two
//!
//! We use the standard fold (MPICH's, Open MPI's): with q the largest power of two ≤ p and
//! r = p − q, each of the first r even ranks hands its whole vector to the odd rank after it and
//! sits out; the q remaining ranks run the power-of-two algorithm; the odd ranks hand the result
//! back. It costs one extra α + n·β before and after, on 2r ranks only.
//!
//! Binary blocks (Rabenseifner–Träff 2004: 600 = 512+64+16+8, each block reduce-scatters, then
//! the blocks cascade their partial vectors into the next larger one) avoid idle ranks, but
//! their cascade moves n/2^k-sized pieces between blocks of unequal sizes, and on the small
//! worlds we can run (3, 5, 6, 7 ranks) the fold's extra n·β is the same order as the cascade's.
//! The fold keeps one code path that is easy to verify; [`super::cost`] prices it exactly.
//!
//! Every element is finally summed by one rank (the owner of its chunk after the halving) and
//! only copied afterwards, so all ranks receive identical bytes.

use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::{Format, add_into, chunks, exchange, split_pair};

/// Largest power of two ≤ `p` (`p` ≥ 1).
pub fn fold_target(p: usize) -> usize {
    1 << (usize::BITS - 1 - p.leading_zeros())
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
        let me = if rank < 2 * extra {
            rank / 2
        } else {
            rank - extra
        };
        let world_rank = |v: usize| if v < extra { 2 * v + 1 } else { v + extra };

        // Recursive halving: keep the half of the current range that the partner does not.
        let (mut lo, mut hi) = (0, q);
        let mut mask = q / 2;
        while mask > 0 {
            let partner = world_rank(me ^ mask);
            let mid = (lo + hi) / 2;
            let (keep, give) = if me & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let keep_r = chunks(n, q, keep.0, keep.1);
            let give_r = chunks(n, q, give.0, give.1);
            scratch.resize(scratch.len().max(keep_r.len()), E::Stored::default());
            let incoming = &mut scratch[..keep_r.len()];
            sent += exchange(comm, partner, &buf[give_r], partner, incoming);
            add_into::<E>(&mut buf[keep_r], incoming);
            (lo, hi) = keep;
            mask /= 2;
        }
        debug_assert_eq!((lo, hi), (me, me + 1));

        // Recursive doubling: swap finished ranges with the partner, doubling them each time.
        let mut mask = 1;
        while mask < q {
            let partner = world_rank(me ^ mask);
            let size = hi - lo;
            let theirs = if me & mask == 0 {
                (hi, hi + size)
            } else {
                (lo - size, lo)
            };
            let (out, into) =
                split_pair(buf, chunks(n, q, lo, hi), chunks(n, q, theirs.0, theirs.1));
            sent += exchange(comm, partner, out, partner, into);
            (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
            mask *= 2;
        }
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

fn send<T: Equivalence>(comm: &SimpleCommunicator, to: usize, buf: &[T]) -> u64 {
    comm.process_at_rank(to as i32).send(buf);
    size_of_val(buf) as u64
}

fn receive<T: Equivalence>(comm: &SimpleCommunicator, from: usize, buf: &mut [T]) {
    comm.process_at_rank(from as i32).receive_into(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_target_is_the_largest_power_of_two_not_above_p() {
        let got: Vec<usize> = (1..=9).map(fold_target).collect();
        assert_eq!(got, [1, 2, 2, 4, 4, 4, 4, 8, 8]);
    }
}
