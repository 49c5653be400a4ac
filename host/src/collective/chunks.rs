//! How a vector is cut into chunks, and the one point-to-point exchange every algorithm is
//! built from.
//!
//! A vector of n floats is cut into p chunks whose sizes differ by at most one (the first
//! n mod p chunks get the extra float), so sizes not divisible by p and vectors shorter than p
//! (some chunks empty) need no special case. Empty chunks are still exchanged as zero-length
//! messages: skipping them on one side only would leave the partner waiting.

use std::ops::Range;

use mpi::point_to_point as p2p;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// Element range of chunk `i` of `n` floats cut into `p` chunks.
pub fn chunk(n: usize, p: usize, i: usize) -> Range<usize> {
    let (base, extra) = (n / p, n % p);
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

/// Element range covering chunks `lo..hi` (consecutive chunks are contiguous).
pub fn chunks(n: usize, p: usize, lo: usize, hi: usize) -> Range<usize> {
    if lo >= hi {
        let at = chunk(n, p, lo.min(p - 1)).start;
        return at..at;
    }
    chunk(n, p, lo).start..chunk(n, p, hi - 1).end
}

/// A shared slice of `send` and a mutable slice of `recv`, two disjoint ranges of `buf`.
pub fn split_pair(buf: &mut [f32], send: Range<usize>, recv: Range<usize>) -> (&[f32], &mut [f32]) {
    if send.is_empty() {
        return (&[], &mut buf[recv]);
    }
    if recv.is_empty() {
        return (&buf[send], &mut []);
    }
    assert!(
        send.end <= recv.start || recv.end <= send.start,
        "overlapping ranges"
    );
    if send.start < recv.start {
        let (a, b) = buf.split_at_mut(recv.start);
        (&a[send], &mut b[..recv.len()])
    } else {
        let (a, b) = buf.split_at_mut(send.start);
        (&b[..send.len()], &mut a[recv])
    }
}

/// Sends `send` to rank `to` while receiving exactly `recv.len()` floats from rank `from` of
/// `comm`; returns the bytes sent.
pub fn exchange(
    comm: &SimpleCommunicator,
    to: usize,
    send: &[f32],
    from: usize,
    recv: &mut [f32],
) -> u64 {
    p2p::send_receive_into(
        send,
        &comm.process_at_rank(to as i32),
        recv,
        &comm.process_at_rank(from as i32),
    );
    size_of_val(send) as u64
}

/// `acc[i] += inc[i]`, in one fixed order so the owner of a chunk always computes the same bytes.
pub fn add_into(acc: &mut [f32], inc: &[f32]) {
    for (a, b) in acc.iter_mut().zip(inc) {
        *a += *b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_vector_without_gaps() {
        for n in [0, 1, 3, 4, 5, 7, 1000, 1003] {
            for p in 1..=9 {
                let mut next = 0;
                for i in 0..p {
                    let r = chunk(n, p, i);
                    assert_eq!(r.start, next, "n={n} p={p} i={i}");
                    assert!(r.len() == n / p || r.len() == n / p + 1);
                    next = r.end;
                }
                assert_eq!(next, n);
                assert_eq!(chunks(n, p, 0, p), 0..n);
                assert!(chunks(n, p, 2.min(p - 1), 2.min(p - 1)).is_empty());
            }
        }
    }

    #[test]
    fn split_pair_gives_the_requested_ranges_in_either_order() {
        let mut v: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let (s, r) = split_pair(&mut v, 0..3, 5..8);
        assert_eq!(s, [0.0, 1.0, 2.0]);
        assert_eq!(r, [5.0, 6.0, 7.0]);
        let (s, r) = split_pair(&mut v, 6..9, 1..3);
        assert_eq!(s, [6.0, 7.0, 8.0]);
        assert_eq!(r, [1.0, 2.0]);
        let (s, r) = split_pair(&mut v, 4..4, 4..6);
        assert!(s.is_empty());
        assert_eq!(r, [4.0, 5.0]);
    }
}
