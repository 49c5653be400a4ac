//! How a vector is cut into chunks, the one point-to-point exchange every algorithm is built
//! from, and the element formats the algorithms sum in.
//!
//! A vector of n elements is cut into p chunks whose sizes differ by at most one (the first
//! n mod p chunks get the extra element), so sizes not divisible by p and vectors shorter than p
//! (some chunks empty) need no special case. Empty chunks are still exchanged as zero-length
//! messages: skipping them on one side only would leave the partner waiting.
//!
//! The algorithms are generic over a [`Format`] (how one element format is stored and added;
//! the formats themselves are named by [`lsgd_codec::Element`]), so 16-bit sums travel as 2
//! bytes per element through exactly the code, and the one-rank-per-chunk order, of the
//! binary32 sums.

use std::ops::Range;

use lsgd_codec::{Element, wire};
use mpi::datatype::Equivalence;
use mpi::topology::SimpleCommunicator;

/// A number format the algorithms sum in: what a buffer stores and how two elements add.
pub trait Format {
    /// What buffers hold and the wire carries (the raw bits for the 16-bit formats).
    type Stored: Equivalence + Copy + Default;
    /// Whether MPI's built-in MPI_SUM on `Stored` computes [`Format::add`]; when it does not,
    /// MPI_Allreduce needs a user-defined operation.
    const MPI_SUM: bool;
    /// `a + b` rounded to this format; commutative bit for bit, as MPI may swap the operands.
    fn add(a: Self::Stored, b: Self::Stored) -> Self::Stored;
    /// This format's buffer among `scratch`'s.
    fn scratch(scratch: &mut Scratch) -> &mut Vec<Self::Stored>;
}

/// A 16-bit float format, stored as its bits and added in binary32.
pub trait Half {
    /// The format's name in the codec interface.
    const ELEMENT: Element;
    /// The unit roundoff of the format (half its machine epsilon).
    const UNIT_ROUNDOFF: f64;
    /// The nearest value's bits (ties to even), as the all-reduce rounds.
    fn bits(x: f32) -> u16;
    /// The value of `bits` (exact in binary32).
    fn value(bits: u16) -> f32;
}

/// IEEE binary32, added natively.
pub enum F32 {}

/// IEEE binary16 bits, added in binary32 and rounded back (to nearest, ties to even).
pub enum F16 {}

/// bfloat16 bits, added in binary32 and rounded back (to nearest, ties to even).
pub enum Bf16 {}

impl Format for F32 {
    type Stored = f32;
    const MPI_SUM: bool = true;
    fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    fn scratch(scratch: &mut Scratch) -> &mut Vec<f32> {
        &mut scratch.f32
    }
}

impl Half for F16 {
    const ELEMENT: Element = Element::F16;
    const UNIT_ROUNDOFF: f64 = 1.0 / 2048.0;
    fn bits(x: f32) -> u16 {
        wire::f16_bits(x)
    }
    fn value(bits: u16) -> f32 {
        wire::f16_value(bits)
    }
}

impl Half for Bf16 {
    const ELEMENT: Element = Element::Bf16;
    const UNIT_ROUNDOFF: f64 = 1.0 / 256.0;
    fn bits(x: f32) -> u16 {
        wire::bf16_bits(x)
    }
    fn value(bits: u16) -> f32 {
        wire::bf16_value(bits)
    }
}

/// Every 16-bit format sums the same way: both operands to binary32, add, round back.
impl<H: Half> Format for H {
    type Stored = u16;
    const MPI_SUM: bool = false;
    fn add(a: u16, b: u16) -> u16 {
        H::bits(H::value(a) + H::value(b))
    }
    fn scratch(scratch: &mut Scratch) -> &mut Vec<u16> {
        &mut scratch.u16
    }
}

/// Receive buffers kept from call to call so a training step allocates nothing; one per stored
/// type (binary16 and bfloat16 share theirs).
#[derive(Debug, Default)]
pub struct Scratch {
    f32: Vec<f32>,
    u16: Vec<u16>,
}

/// Element range of chunk `i` of `n` elements cut into `p` chunks.
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
pub fn split_pair<T>(buf: &mut [T], send: Range<usize>, recv: Range<usize>) -> (&[T], &mut [T]) {
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

/// Sends `send` to rank `to` while receiving exactly `recv.len()` elements from rank `from` of
/// `comm`; returns the bytes sent.
pub fn exchange<T: Equivalence>(
    comm: &SimpleCommunicator,
    to: usize,
    send: &[T],
    from: usize,
    recv: &mut [T],
) -> u64 {
    crate::watchdog::progress(comm, from);
    crate::wait::send_receive(comm, to, send, from, recv);
    size_of_val(send) as u64
}

/// `acc[i] += inc[i]`, in one fixed order so the owner of a chunk always computes the same bytes.
pub fn add_into<E: Format>(acc: &mut [E::Stored], inc: &[E::Stored]) {
    for (a, b) in acc.iter_mut().zip(inc) {
        *a = E::add(*a, *b);
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

    #[test]
    fn sixteen_bit_sums_add_in_f32_and_round_to_nearest_even() {
        let f16 = |x: f32| wire::f16_bits(x);
        let mut acc = [f16(1.0), f16(1.0), f16(65504.0), f16(-2.5)];
        add_into::<F16>(
            &mut acc,
            &[
                f16(2.0f32.powi(-11)),
                f16(3.0 * 2.0f32.powi(-11)),
                f16(16.0),
                f16(2.5),
            ],
        );
        let got: Vec<f32> = acc.iter().map(|&h| wire::f16_value(h)).collect();
        // 1 + 2^-11 is a tie (down to even 1.0); 1 + 3·2^-11 rounds up; 65520 overflows.
        assert_eq!(got, [1.0, 1.0 + 2.0f32.powi(-9), f32::INFINITY, 0.0]);

        let bf16 = |x: f32| wire::bf16_bits(x);
        let mut acc = [bf16(1.0), bf16(256.0)];
        add_into::<Bf16>(&mut acc, &[bf16(2.0f32.powi(-8)), bf16(1.0)]);
        let got: Vec<f32> = acc.iter().map(|&h| wire::bf16_value(h)).collect();
        assert_eq!(got, [1.0, 256.0]);

        let mut acc = [0.1f32, 1e8];
        add_into::<F32>(&mut acc, &[0.2, 1.0]);
        assert_eq!(acc, [0.1f32 + 0.2, 1e8]);
    }
}
