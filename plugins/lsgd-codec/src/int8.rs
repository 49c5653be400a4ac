//! `int8`: symmetric absmax quantisation to signed bytes, one binary32 scale per chunk.
//!
//! For each chunk of `chunk` elements, scale = max|x| / 127 and q = round_half_even(x · (1 /
//! scale)), so |x − q·scale| ≤ scale/2 (plus binary32 rounding). Payload: every chunk's scale
//! as little-endian binary32 (ceil(len / chunk) of them), then every q as one i8; the last
//! chunk may be short. Not summable (each rank has its own scales), so payloads are gathered.
//! A chunk holding a NaN or an infinity gets scale NaN and q = 0, so it decodes to NaN rather
//! than to plausible numbers; a chunk whose max|x| is 0 or below about 2^-121 (where 1/scale
//! overflows) gets scale 0 and decodes to zeros.
//!
//! The hot loops (max-abs, quantise, dequantise) have an explicit wasm SIMD path and a
//! portable path written for the native auto-vectoriser; both compute the same integers, so
//! the payload is the same bytes in either build. This module also holds the small helpers
//! the other codecs share.

use core::mem::MaybeUninit;

use crate::wire::{Reader, check_len, expect_rounds};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// 8-bit absmax quantisation with one scale per `chunk` elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Int8 {
    /// Elements sharing one scale.
    pub chunk: u32,
}

impl Policy for Int8 {
    fn info() -> Info {
        Info::new(
            "int8",
            "8-bit absmax quantisation: one f32 scale per chunk, one i8 per element, all-gathered",
            vec![ParamSpec::integer(
                "chunk",
                1024,
                "elements sharing one scale (>= 1)",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Int8 {
            chunk: integer_in(p, "chunk", 1, u32::MAX)?,
        })
    }
}

impl Codec for Int8 {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let n = check_len(meta, data)?;
        let c = self.chunk as usize;
        let chunks = n.div_ceil(c);
        let mut out = vec![0u8; 4 * chunks + n];
        let (scales, values) = out.split_at_mut(4 * chunks);
        for ((x, s), q) in data
            .chunks(c)
            .zip(scales.chunks_exact_mut(4))
            .zip(values.chunks_mut(c))
        {
            let (scale, inv) = scale_of(max_abs(x));
            s.copy_from_slice(&scale.to_le_bytes());
            if let Some(inv) = inv {
                quantise(x, inv, q);
            }
        }
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let n = meta.len as usize;
        let c = self.chunk as usize;
        let mut r = Reader::new(&payloads[0]);
        let scales = r.take(scale_bytes(n, c)?, "the scales")?;
        let values = r.take(n, "the values")?;
        r.finish()?;
        // Written once instead of zeroed and then written: decode is half the round trip.
        let mut out = Vec::with_capacity(n);
        for ((o, q), s) in out.spare_capacity_mut()[..n]
            .chunks_mut(c)
            .zip(values.chunks(c))
            .zip(scales.chunks_exact(4))
        {
            dequantise(q, f32_le(s), o);
        }
        debug_assert_eq!(scales.len() / 4, n.div_ceil(c));
        // SAFETY: the chunks of `values` (n bytes) and of the first n spare slots pair up one
        // to one (`scales` has one entry per chunk), and dequantise writes all of each.
        unsafe { out.set_len(n) };
        Ok(out)
    }
}

/// The stored scale of a chunk whose largest |x| is `max`, and 1/scale when the chunk is
/// quantised at all (otherwise its bytes stay 0).
fn scale_of(max: f32) -> (f32, Option<f32>) {
    if !max.is_finite() {
        return (f32::NAN, None);
    }
    let scale = max / 127.0;
    let inv = 1.0 / scale;
    if inv.is_finite() {
        (scale, Some(inv))
    } else {
        (0.0, None)
    }
}

/// 1.5·2^23: adding it rounds |v| < 2^22 to an integer k, ties to even (the binary32
/// rounding mode), and leaves k in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;

/// q = x·inv rounded half to even, as an i8.
///
/// |x·inv| ≤ 127·(1 + 2^-20) < 127.5 because |x| ≤ max|x| and x is finite in a quantised
/// chunk, so k always fits an i8. The same two float operations and one integer subtraction
/// run in the wasm lanes. `f32x4_nearest` + `i32x4_trunc_sat_f32x4` + saturating narrows
/// would give the same bytes but cost more per lane in V8, and `f32::round_ties_even` is a
/// libm call per element on baseline x86-64 (no SSE4.1 `roundps`), which stops the native
/// loop from vectorising.
#[inline(always)]
fn quantise_one(x: f32, inv: f32) -> u8 {
    (x * inv + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits()) as u8
}

#[inline(always)]
fn dequantise_one(q: u8, scale: f32) -> f32 {
    f32::from(q as i8) * scale
}

/// |x| as the integer its bit pattern is: these order like the values, with every NaN above
/// +inf, and an integer max is a reduction both LLVM (without fast-math) and wasm SIMD
/// vectorise, unlike a float one.
#[inline(always)]
fn abs_bits(x: f32) -> i32 {
    (x.to_bits() & 0x7fff_ffff) as i32
}

fn quantise_tail(xs: &[f32], inv: f32, q: &mut [u8]) {
    for (q, &x) in q.iter_mut().zip(xs) {
        *q = quantise_one(x, inv);
    }
}

fn dequantise_tail(q: &[u8], scale: f32, out: &mut [MaybeUninit<f32>]) {
    for (o, &q) in out.iter_mut().zip(q) {
        o.write(dequantise_one(q, scale));
    }
}

/// The largest |x| (0 for an empty slice); any NaN gives a NaN, else an infinity gives +inf.
pub(crate) fn max_abs(xs: &[f32]) -> f32 {
    #[cfg(target_arch = "wasm32")]
    let m = simd::max_abs_bits(xs);
    #[cfg(not(target_arch = "wasm32"))]
    let m = portable::max_abs_bits(xs);
    f32::from_bits(m as u32)
}

/// Quantises finite `xs` into `q` (as long as `xs`).
fn quantise(xs: &[f32], inv: f32, q: &mut [u8]) {
    #[cfg(target_arch = "wasm32")]
    simd::quantise(xs, inv, q);
    #[cfg(not(target_arch = "wasm32"))]
    portable::quantise(xs, inv, q);
}

/// Writes every element of `out` (as long as `q`).
fn dequantise(q: &[u8], scale: f32, out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "wasm32")]
    simd::dequantise(q, scale, out);
    #[cfg(not(target_arch = "wasm32"))]
    portable::dequantise(q, scale, out);
}

/// Plain whole-slice loops, which LLVM's loop vectoriser turns into SSE2/AVX code. (Fixed
/// 16-lane blocks get fully unrolled before vectorisation and then stay scalar.)
#[cfg(not(target_arch = "wasm32"))]
mod portable {
    use super::*;

    pub(super) fn max_abs_bits(xs: &[f32]) -> i32 {
        xs.iter().fold(0, |m, &x| m.max(abs_bits(x)))
    }

    pub(super) fn quantise(xs: &[f32], inv: f32, q: &mut [u8]) {
        quantise_tail(xs, inv, q);
    }

    pub(super) fn dequantise(q: &[u8], scale: f32, out: &mut [MaybeUninit<f32>]) {
        dequantise_tail(q, scale, out);
    }
}

/// wasm simd128, 16 elements per iteration (one i8x16 of payload).
#[cfg(target_arch = "wasm32")]
mod simd {
    use super::*;
    use core::arch::wasm32::*;

    /// The f32x4 at float `4 * k` of a 16-float block.
    #[inline(always)]
    fn load(b: &[f32], k: usize) -> v128 {
        debug_assert!(b.len() >= 4 * k + 4);
        // SAFETY: callers pass 16-float blocks and k < 4; v128_load is an unaligned load.
        unsafe { v128_load(b.as_ptr().add(4 * k).cast()) }
    }

    pub(super) fn max_abs_bits(xs: &[f32]) -> i32 {
        let mask = i32x4_splat(0x7fff_ffff);
        let mut m = [i32x4_splat(0); 4];
        let mut blocks = xs.chunks_exact(16);
        for b in &mut blocks {
            for (k, m) in m.iter_mut().enumerate() {
                *m = i32x4_max(*m, v128_and(load(b, k), mask));
            }
        }
        let v = i32x4_max(i32x4_max(m[0], m[1]), i32x4_max(m[2], m[3]));
        let lanes = [
            i32x4_extract_lane::<0>(v),
            i32x4_extract_lane::<1>(v),
            i32x4_extract_lane::<2>(v),
            i32x4_extract_lane::<3>(v),
        ];
        let m = lanes.into_iter().fold(0, i32::max);
        blocks
            .remainder()
            .iter()
            .fold(m, |m, &x| m.max(abs_bits(x)))
    }

    pub(super) fn quantise(xs: &[f32], inv: f32, q: &mut [u8]) {
        let vinv = f32x4_splat(inv);
        let magic = f32x4_splat(MAGIC);
        let magic_bits = i32x4_splat(MAGIC.to_bits() as i32);
        let mut src = xs.chunks_exact(16);
        let mut dst = q.chunks_exact_mut(16);
        for (s, d) in (&mut src).zip(&mut dst) {
            let lane = |k| i32x4_sub(f32x4_add(f32x4_mul(load(s, k), vinv), magic), magic_bits);
            // k is within [-127, 127], so the saturating narrows are exact.
            let r = i8x16_narrow_i16x8(
                i16x8_narrow_i32x4(lane(0), lane(1)),
                i16x8_narrow_i32x4(lane(2), lane(3)),
            );
            // SAFETY: d is 16 bytes; v128_store is an unaligned store.
            unsafe { v128_store(d.as_mut_ptr().cast(), r) };
        }
        quantise_tail(src.remainder(), inv, dst.into_remainder());
    }

    pub(super) fn dequantise(q: &[u8], scale: f32, out: &mut [MaybeUninit<f32>]) {
        let vs = f32x4_splat(scale);
        let mut src = q.chunks_exact(16);
        let mut dst = out.chunks_exact_mut(16);
        for (s, d) in (&mut src).zip(&mut dst) {
            // SAFETY: s is 16 bytes; unaligned load.
            let v = unsafe { v128_load(s.as_ptr().cast()) };
            let (lo, hi) = (i16x8_extend_low_i8x16(v), i16x8_extend_high_i8x16(v));
            let parts = [
                i32x4_extend_low_i16x8(lo),
                i32x4_extend_high_i16x8(lo),
                i32x4_extend_low_i16x8(hi),
                i32x4_extend_high_i16x8(hi),
            ];
            for (k, p) in parts.into_iter().enumerate() {
                let f = f32x4_mul(f32x4_convert_i32x4(p), vs);
                // SAFETY: d is 16 floats and k < 4; unaligned store into uninitialised memory.
                unsafe { v128_store(d.as_mut_ptr().add(4 * k).cast(), f) };
            }
        }
        dequantise_tail(src.remainder(), scale, dst.into_remainder());
    }
}

/// An integer parameter in `[lo, hi]`, as `u32`.
pub(crate) fn integer_in(p: &Params, name: &str, lo: u32, hi: u32) -> Result<u32, String> {
    let v = p.integer(name)?;
    u32::try_from(v)
        .ok()
        .filter(|v| (lo..=hi).contains(v))
        .ok_or_else(|| format!("{name} must be in [{lo}, {hi}], got {v}"))
}

/// Bytes of the binary32 per-chunk header of `n` elements in chunks of `c`; checked because
/// `meta.len` in decode comes from the host, not from a payload this build wrote.
pub(crate) fn scale_bytes(n: usize, c: usize) -> Result<usize, String> {
    n.div_ceil(c)
        .checked_mul(4)
        .ok_or_else(|| format!("malformed payload: {n} elements need too many scales"))
}

/// The little-endian binary32 in the first four bytes of `b` (a `chunks_exact(4)` item).
pub(crate) fn f32_le(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::{Codec, Params, Value};

    /// `C` configured with its defaults overridden by `set`, or the error message.
    pub fn configured<C: Codec>(set: &[(&str, Value)]) -> Result<C, String> {
        let given = set
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.clone()))
            .collect();
        C::configure(&Params::resolve(&C::info().params, given)?)
    }

    /// Smooth, signed data with a few outliers and exact zeros, deterministic in `seed`.
    pub fn gradient(n: usize, seed: u64) -> Vec<f32> {
        let mut r = crate::rng::Rng::new(seed);
        (0..n)
            .map(|i| match i % 97 {
                0 => 0.0,
                1 => r.normal() * 0.5,
                _ => r.normal() * 1e-3,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{configured, gradient};
    use super::*;
    use crate::{Value, dynamic, round_trip};

    fn int8(chunk: i64) -> Int8 {
        configured(&[("chunk", Value::Integer(chunk))]).unwrap()
    }

    #[test]
    fn error_is_at_most_half_a_step_of_each_chunk() {
        for (n, chunk) in [(10_000, 1024), (1000, 1), (1000, 7), (17, 1024), (4096, 16)] {
            let data = gradient(n, n as u64);
            let codec = int8(chunk);
            let meta = Meta::flat("w", n as u32, 3, 9);
            let (payloads, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
            let c = chunk as usize;
            let chunks = n.div_ceil(c);
            assert_eq!(payloads[0].len(), 4 * chunks + n);
            for (k, (x, y)) in data.chunks(c).zip(out.chunks(c)).enumerate() {
                let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = f32_le(&payloads[0][4 * k..]);
                assert_eq!(scale, max / 127.0, "chunk {k}");
                for (a, b) in x.iter().zip(y) {
                    // Half a step, plus the binary32 rounding of x·inv and of q·scale.
                    assert!(
                        (a - b).abs() <= scale * (0.5 + 1e-5),
                        "chunk {k}: {a} -> {b}, scale {scale}"
                    );
                }
                let at_max = x.iter().position(|v| v.abs() == max).unwrap();
                if max == 0.0 {
                    continue;
                }
                assert_eq!(
                    payloads[0][4 * chunks + k * c + at_max] as i8,
                    if x[at_max] < 0.0 { -127 } else { 127 }
                );
            }
        }
    }

    #[test]
    fn rounds_half_to_even_like_the_wasm_lanes() {
        // Every |v| < 127.5 that quantise can see, around each integer and each tie.
        for k in -127..=127 {
            for frac in [
                0.0,
                0.25,
                0.5,
                -0.5,
                0.499_999_97,
                0.500_000_06,
                -0.499_999_97,
            ] {
                let v = k as f32 + frac;
                if v.abs() < 127.5 {
                    let want = v.round_ties_even() as i8;
                    assert_eq!(quantise_one(v, 1.0) as i8, want, "{v}");
                    assert_eq!(quantise_one(v * 4.0, 0.25) as i8, want, "{v}");
                }
            }
        }
        assert_eq!(quantise_one(2.5, 1.0), 2);
        assert_eq!(quantise_one(-3.5, 1.0) as i8, -4);
        assert_eq!(quantise_one(127.49, 1.0) as i8, 127);
        assert_eq!(quantise_one(-0.0, 1.0), 0);
    }

    #[test]
    fn the_block_paths_match_the_scalar_rule() {
        let data = gradient(1003, 5);
        let max = max_abs(&data);
        assert_eq!(max, data.iter().fold(0f32, |m, v| m.max(v.abs())));
        let (scale, inv) = scale_of(max);
        let inv = inv.unwrap();
        let mut q = vec![0u8; data.len()];
        quantise(&data, inv, &mut q);
        let mut back = vec![MaybeUninit::new(f32::NAN); data.len()];
        dequantise(&q, scale, &mut back);
        for i in 0..data.len() {
            assert_eq!(q[i], quantise_one(data[i], inv), "{i}");
            // SAFETY: every slot was initialised by `MaybeUninit::new` above.
            let back = unsafe { back[i].assume_init() };
            assert_eq!(back, dequantise_one(q[i], scale));
        }
    }

    #[test]
    fn max_abs_orders_by_bit_pattern() {
        let odd = [-0.0, 1e-45, -3e-39, 2.0, -2.5, 0.0];
        assert_eq!(max_abs(&odd), 2.5);
        assert_eq!(max_abs(&odd[..3]), 3e-39, "subnormals compare like values");
        assert_eq!(max_abs(&[]), 0.0);
        assert_eq!(max_abs(&[-0.0; 20]).to_bits(), 0);
        let mut data = gradient(1000, 6);
        data[500] = f32::NEG_INFINITY;
        assert_eq!(max_abs(&data), f32::INFINITY);
        data[900] = -f32::NAN;
        assert!(
            max_abs(&data).is_nan(),
            "a NaN wins, in either lane or tail"
        );
        assert!(max_abs(&data[900..]).is_nan());
    }

    #[test]
    fn non_finite_chunks_decode_to_nan() {
        let mut data = gradient(96, 8);
        data[5] = f32::NAN;
        data[40] = f32::INFINITY;
        let meta = Meta::flat("w", 96, 0, 0);
        let (payloads, out) = round_trip(dynamic(int8(32)).as_ref(), &meta, &data).unwrap();
        assert!(f32_le(&payloads[0][0..]).is_nan() && f32_le(&payloads[0][4..]).is_nan());
        assert!(payloads[0][12..12 + 64].iter().all(|&q| q == 0));
        assert!(out[..64].iter().all(|v| v.is_nan()));
        assert!(out[64..].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn zero_and_tiny_chunks_decode_to_zero() {
        let mut data = vec![0.0f32; 96];
        data[10] = -1e-38; // max/127 is subnormal and 1/scale overflows
        data[50] = 3.0;
        data[51] = 1e-38;
        let meta = Meta::flat("w", 96, 0, 0);
        let (payloads, out) = round_trip(dynamic(int8(32)).as_ref(), &meta, &data).unwrap();
        assert_eq!(&payloads[0][..4], &[0; 4]);
        assert_eq!(&payloads[0][8..12], &[0; 4]);
        assert!(payloads[0][12..12 + 32].iter().all(|&q| q == 0));
        assert!(out[..32].iter().all(|&v| v == 0.0));
        assert_eq!(out[50], 3.0);
        assert_eq!(out[51], 0.0);
        assert!(out[64..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn ratio_is_about_four() {
        let n = 1 << 20;
        let data = gradient(n, 1);
        let meta = Meta::flat("w", n as u32, 0, 0);
        let p = Int8::from_defaults()
            .unwrap()
            .encode(&meta, &data, &[])
            .unwrap();
        let ratio = (4 * n) as f64 / p.len() as f64;
        assert!((3.98..4.0).contains(&ratio), "{ratio}");
    }

    #[test]
    fn deterministic() {
        let data = gradient(5000, 2);
        let a = Meta::flat("w", 5000, 0, 1);
        let b = Meta::flat("w", 5000, 7, 2);
        let codec = Int8::from_defaults().unwrap();
        assert_eq!(
            codec.encode(&a, &data, &[]).unwrap(),
            codec.encode(&b, &data, &[]).unwrap(),
            "int8 uses no randomness"
        );
    }

    #[test]
    fn malformed_payloads_and_lengths_are_rejected() {
        let codec = Int8::from_defaults().unwrap();
        let meta = Meta::flat("w", 2000, 0, 0);
        let data = gradient(2000, 3);
        let good = codec.encode(&meta, &data, &[]).unwrap();
        assert_eq!(good.len(), 8 + 2000);
        for bad in [&good[..good.len() - 1], &good[..7], &[][..]] {
            let e = codec.decode(&meta, &[bad.to_vec()]).unwrap_err();
            assert!(e.starts_with("malformed payload: "), "{e}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(
            codec
                .decode(&meta, &[long])
                .unwrap_err()
                .contains("1 trailing bytes")
        );
        assert!(codec.decode(&meta, &[]).is_err());
        assert!(codec.decode(&meta, &[good.clone(), good]).is_err());
        let huge = Meta::flat("w", u32::MAX, 0, 0);
        assert!(codec.decode(&huge, &[vec![0; 12]]).is_err());
        let e = codec.encode(&meta, &data[..1999], &[]).unwrap_err();
        assert_eq!(e, "encode got 1999 floats for a bucket of 2000");
    }

    #[test]
    fn parameters_are_range_checked() {
        let err = |v| configured::<Int8>(&[("chunk", Value::Integer(v))]).unwrap_err();
        assert_eq!(err(0), "chunk must be in [1, 4294967295], got 0");
        assert_eq!(err(-5), "chunk must be in [1, 4294967295], got -5");
        assert_eq!(
            err(1 << 33),
            "chunk must be in [1, 4294967295], got 8589934592"
        );
        assert_eq!(Int8::from_defaults().unwrap().chunk, 1024);
        assert_eq!(Int8::info().name, "int8");
    }
}
