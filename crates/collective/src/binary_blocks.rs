//! Rabenseifner & Träff's binary blocks (2004): halving-doubling for any number of ranks with
//! no rank idle.
//!
//! p is split into power-of-two blocks by its binary digits, largest first on the lowest ranks
//! (600 = 512 + 64 + 16 + 8, 7 = 4 + 2 + 1). Every block cuts the vector into the same s₀
//! chunks (s₀ the largest block), so index v of a block of s ranks owns chunks v·s₀/s up to
//! (v+1)·s₀/s after its halving: exactly what indices v·r … v·r + r − 1 of a block r times
//! larger own.
//!
//! 1. **Halving** inside each block ([`Cube::reduce_scatter`]).
//! 2. **Up**, smallest block first: each rank adds the partial sums of the next smaller block's
//!    rank that covers its share (one message), then hands its share to the r ranks of the next
//!    larger block that split it (r messages). The largest block ends with the whole sum
//!    reduce-scattered.
//! 3. **Down**, largest block first: each rank receives its finished share from the r ranks
//!    above it, passes its own on to the rank below without waiting (an immediate send that
//!    overlaps the next step), and
//! 4. **doubles** inside its block ([`Cube::all_gather`]).
//!
//! An element is added on one rank at each stage, in an order fixed by the layout (a block's
//! own sum, then the sum handed up from every smaller block), and only copied once finished,
//! so all ranks receive identical bytes.
//!
//! # Cost
//!
//! Blocks s₀ > s₁ > … > s_m, r_b = s_b / s_{b+1} the imbalance between consecutive blocks; each
//! stage takes its slowest rank's time; α, β, γ as in [`super::cost`] (a rank can send and
//! receive at once, but sends one message at a time):
//!
//! - halving in block b: H_b = log₂s_b·α + (1 − 1/s_b)·n·(β + γ);
//! - up: U_m = H_m, then U_b = max(H_b, U_{b+1}) + r_b·α + (n/s_{b+1})·β + (n/s_b)·γ (block b+1's
//!   ranks send their n/s_{b+1} as r_b messages; block b adds n/s_b);
//! - down, from U₀: D₀ = 0, D_{b+1} = D_b + r_b·α + (n/s_{b+1})·β (r_b messages into each rank);
//! - block b finishes at E_b = D_b + log₂s_b·α + (1 − 1/s_b)·n·β, plus α + (n/s_b)·β for its
//!   message down (b < m), which shares its sending with the doubling;
//! - the all-reduce takes U₀ + max_b E_b.
//!
//! With one block (p a power of two) that is halving-doubling's 2·log₂p·α + 2(1 − 1/p)·n·β +
//! (1 − 1/p)·n·γ. The bandwidth term stays near 2n·β when the blocks below the largest are
//! large, against the fold's 4n·β: at p = 600, U₀ + max E ≈ 35α + 2.22n·β, the fold
//! 20α + 4n·β, the ring 1198α + 2n·β. The latency grows with Σr_b, the imbalance: p = 2^k + 1
//! sends the one extra rank's vector in 2^k messages up and again down, worse than the ring.

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::{Format, add_into};
use super::halving_doubling::{Cube, receive, send, share};

/// One binary block: ranks `start..start + size`, `size` a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Its first rank.
    pub start: usize,
    /// Its number of ranks.
    pub size: usize,
}

/// The blocks of `p` ranks, one per binary digit of p, the largest first and on the lowest
/// ranks (`blocks(7)`: 0..4, 4..6, 6..7).
pub fn blocks(p: usize) -> Vec<Block> {
    let mut out = Vec::new();
    let mut start = 0;
    for bit in (0..usize::BITS).rev() {
        let size = 1usize << bit;
        if p & size != 0 {
            out.push(Block { start, size });
            start += size;
        }
    }
    out
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
    let blocks = blocks(p);
    let b = blocks
        .iter()
        .position(|k| rank < k.start + k.size)
        .expect("the blocks cover every rank");
    let block = blocks[b];
    let rank_of = |v: usize| block.start + v;
    let cube = Cube {
        size: block.size,
        me: rank - block.start,
        parts: blocks[0].size,
        rank_of: &rank_of,
    };
    let (larger, smaller) = (b.checked_sub(1).map(|i| blocks[i]), blocks.get(b + 1));
    let mine = cube.share(n, cube.me);

    let mut sent = cube.reduce_scatter::<E>(comm, buf, scratch);
    if let Some(s) = smaller {
        // Up: the smaller block's rank covering our share adds in everything below us.
        let from = s.start + cube.me / (block.size / s.size);
        scratch.resize(scratch.len().max(mine.len()), E::Stored::default());
        let incoming = &mut scratch[..mine.len()];
        receive(comm, from, incoming);
        add_into::<E>(&mut buf[mine.clone()], incoming);
    }
    if let Some(l) = larger {
        // Up, then down: the r ranks above split our share, then return it finished.
        let above = |t: usize| cube.me * (l.size / block.size) + t;
        let piece = |t: usize| share(n, cube.parts, l.size, above(t));
        for t in 0..l.size / block.size {
            sent += send(comm, l.start + above(t), &buf[piece(t)]);
        }
        for t in 0..l.size / block.size {
            receive(comm, l.start + above(t), &mut buf[piece(t)]);
        }
    }
    let Some(s) = smaller else {
        return sent + cube.all_gather(comm, buf);
    };
    // Down: hand our finished share to the rank below while doubling. The doubling only reads
    // our share, but it borrows all of `buf`, so the message goes from a copy.
    let to = s.start + cube.me / (block.size / s.size);
    let outgoing = &mut scratch[..mine.len()];
    outgoing.copy_from_slice(&buf[mine]);
    let outgoing = &*outgoing;
    crate::watchdog::progress(comm, to);
    mpi::request::scope(|scope| {
        let request = comm
            .process_at_rank(to as i32)
            .immediate_send(scope, outgoing);
        sent += size_of_val(outgoing) as u64 + cube.all_gather(comm, buf);
        crate::wait::finish(request);
    });
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_follow_the_binary_digits_largest_first() {
        let sizes = |p| blocks(p).iter().map(|k| k.size).collect::<Vec<_>>();
        assert_eq!(sizes(600), [512, 64, 16, 8]);
        assert_eq!(sizes(1000), [512, 256, 128, 64, 32, 8]);
        assert_eq!(sizes(8), [8]);
        assert_eq!(
            blocks(7),
            [
                Block { start: 0, size: 4 },
                Block { start: 4, size: 2 },
                Block { start: 6, size: 1 }
            ]
        );
        for p in 1..=100 {
            let bs = blocks(p);
            assert_eq!(bs[0].start, 0);
            for w in bs.windows(2) {
                assert_eq!(w[1].start, w[0].start + w[0].size);
                assert!(w[1].size < w[0].size);
            }
            let last = bs.last().unwrap();
            assert_eq!(last.start + last.size, p);
        }
    }
}
