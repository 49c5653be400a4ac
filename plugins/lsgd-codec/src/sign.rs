//! `sign`: signSGD (Bernstein et al. 2018): one bit per element, decoded to ±`scale`,
//! all-gathered.
//!
//! Payload: ⌈n/8⌉ bytes; bit j (least significant first) of byte i is element 8i+j, set when
//! the element is negative (x < 0). Zeros, −0.0 and NaN encode as positive. Padding bits after
//! element n−1 are zero, and decode rejects a payload whose padding is not. Ratio: 32×.
//!
//! Why a `scale` and not ±1: the host sums every rank's decoded signs and the optimiser
//! multiplies the sum by the learning rate, so ±1 would move every weight by lr·(number of
//! ranks) per step whatever the gradient's size. A small `scale` (default 1e-3) puts the step
//! in the range a gradient pre-divided by the world size normally has; `ef-sign` sets the scale
//! from the data instead.
//!
//! The packing loops are shared with `ef-sign`; they have an explicit wasm SIMD path and a
//! portable one, which produce the same bytes.

use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// One bit per element, decoded to ±scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sign {
    /// Magnitude every decoded element gets: positive and finite.
    pub scale: f32,
}

impl Policy for Sign {
    fn info() -> Info {
        Info::new(
            "sign",
            "signSGD: one bit per element (set = negative), decoded to +-scale, all-gathered",
            vec![ParamSpec::float(
                "scale",
                1e-3,
                "magnitude of every decoded element (> 0); the host sums ranks and applies the LR",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let v = p.float("scale")?;
        let scale = v as f32;
        if v > 0.0 && scale > 0.0 && scale.is_finite() {
            Ok(Sign { scale })
        } else {
            Err(format!(
                "scale must be > 0 and within the finite binary32 range, got {v}"
            ))
        }
    }
}

impl Codec for Sign {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        check_len(meta, data)?;
        let mut out = vec![0u8; data.len().div_ceil(8)];
        pack(data, &mut out);
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let n = meta.len as usize;
        let mut r = Reader::new(&payloads[0]);
        let bits = r.take(n.div_ceil(8), "the sign bits")?;
        r.finish()?;
        check_padding(bits, n)?;
        let mut out = vec![0f32; n];
        unpack(bits, 0, self.scale, &mut out);
        Ok(out)
    }
}

/// Errors unless the bits after element `n − 1` in the last byte of `bits` are zero.
pub(crate) fn check_padding(bits: &[u8], n: usize) -> Result<(), String> {
    match (n % 8, bits.last()) {
        (used @ 1.., Some(&last)) if last >> used != 0 => Err(format!(
            "malformed payload: padding bits after element {} are set ({last:#04x})",
            n - 1
        )),
        _ => Ok(()),
    }
}

/// Writes bit i of `out` (least significant first) as `data[i] < 0`; `out` has ⌈n/8⌉ bytes.
pub(crate) fn pack(data: &[f32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), data.len().div_ceil(8));
    let whole = data.len() / 16;
    let (xs, x_tail) = data.split_at(16 * whole);
    let (bs, b_tail) = out.split_at_mut(2 * whole);
    for (x, b) in xs.chunks_exact(16).zip(bs.chunks_exact_mut(2)) {
        b.copy_from_slice(&pack16(x).to_le_bytes());
    }
    for (x, b) in x_tail.chunks(8).zip(b_tail) {
        *b = x
            .iter()
            .enumerate()
            .fold(0, |b, (j, &v)| b | (u8::from(v < 0.0) << j));
    }
}

/// Sets `out[i]` to −scale where bit `first + i` of `bits` is set and to +scale elsewhere
/// (`scale` is taken without its sign; a NaN scale gives NaNs of either sign).
pub(crate) fn unpack(bits: &[u8], first: usize, scale: f32, out: &mut [f32]) {
    let s = scale.to_bits() & 0x7fff_ffff;
    let one = |i: usize| f32::from_bits(s | u32::from((bits[i / 8] >> (i % 8)) & 1) << 31);
    // Element by element until the bit position is byte-aligned, then whole bytes.
    let head = ((8 - first % 8) % 8).min(out.len());
    let (h, rest) = out.split_at_mut(head);
    for (i, o) in h.iter_mut().enumerate() {
        *o = one(first + i);
    }
    let whole = rest.len() / 8;
    let (body, tail) = rest.split_at_mut(8 * whole);
    let at = (first + head) / 8;
    unpack_bytes(&bits[at..at + whole], s, body);
    let tail_first = first + head + 8 * whole;
    for (i, o) in tail.iter_mut().enumerate() {
        *o = one(tail_first + i);
    }
}

/// 16 sign bits: bit j is `x[j] < 0`.
#[cfg(not(target_arch = "wasm32"))]
#[inline(always)]
fn pack16(x: &[f32]) -> u16 {
    x.iter()
        .take(16)
        .enumerate()
        .fold(0, |b, (j, &v)| b | (u16::from(v < 0.0) << j))
}

/// 16 sign bits: bit j is `x[j] < 0` (wasm simd128).
#[cfg(target_arch = "wasm32")]
#[inline(always)]
fn pack16(x: &[f32]) -> u16 {
    use core::arch::wasm32::*;
    assert!(x.len() >= 16);
    let p = x.as_ptr() as *const v128;
    let z = f32x4_splat(0.0);
    // SAFETY: 16 floats = 4 v128 are in bounds; wasm loads need no alignment.
    let lt = |k: usize| i32x4_bitmask(f32x4_lt(unsafe { v128_load(p.add(k)) }, z));
    u16::from(lt(0)) | u16::from(lt(1)) << 4 | u16::from(lt(2)) << 8 | u16::from(lt(3)) << 12
}

/// `out[8i + j]` = ±f32::from_bits(s), negative where bit j of `bits[i]` is set.
#[cfg(not(target_arch = "wasm32"))]
fn unpack_bytes(bits: &[u8], s: u32, out: &mut [f32]) {
    for (o, &b) in out.chunks_exact_mut(8).zip(bits) {
        for (j, o) in o.iter_mut().enumerate() {
            *o = f32::from_bits(s | (u32::from(b >> j) & 1) << 31);
        }
    }
}

/// `out[8i + j]` = ±f32::from_bits(s), negative where bit j of `bits[i]` is set (wasm simd128).
#[cfg(target_arch = "wasm32")]
fn unpack_bytes(bits: &[u8], s: u32, out: &mut [f32]) {
    use core::arch::wasm32::*;
    let lo = u32x4(1, 2, 4, 8);
    let hi = u32x4(16, 32, 64, 128);
    let sv = u32x4_splat(s);
    let sign = u32x4_splat(0x8000_0000);
    let z = u32x4_splat(0);
    for (o, &b) in out.chunks_exact_mut(8).zip(bits) {
        let v = u32x4_splat(u32::from(b));
        let f = |m: v128| v128_or(sv, v128_andnot(sign, i32x4_eq(v128_and(v, m), z)));
        let p = o.as_mut_ptr() as *mut v128;
        // SAFETY: the chunk holds 8 floats = 2 v128; wasm stores need no alignment.
        unsafe {
            v128_store(p, f(lo));
            v128_store(p.add(1), f(hi));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Value, dynamic, round_trip};

    fn codec(scale: f64) -> Result<Sign, String> {
        let given = vec![("scale".into(), Value::Float(scale))];
        Sign::configure(&Params::resolve(&Sign::info().params, given)?)
    }

    #[test]
    fn decodes_to_plus_minus_scale_with_zeros_positive() {
        let data = [
            1.5f32,
            -2.0,
            0.0,
            -0.0,
            f32::NAN,
            -1e-30,
            f32::NEG_INFINITY,
            3.0,
            -4.0,
        ];
        let meta = Meta::flat("w", 9, 0, 1);
        let c = codec(0.25).unwrap();
        let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0], vec![0b0110_0010, 0b0000_0001]);
        assert_eq!(
            out,
            vec![0.25, -0.25, 0.25, 0.25, 0.25, -0.25, -0.25, 0.25, -0.25]
        );
    }

    #[test]
    fn block_and_tail_paths_agree_with_the_rule() {
        let mut rng = crate::rng::Rng::new(8);
        for n in [0usize, 1, 7, 8, 15, 16, 17, 33, 1000, 4099] {
            let data: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let meta = Meta::flat("w", n as u32, 0, 1);
            let c = codec(1e-3).unwrap();
            let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
            assert_eq!(payloads[0].len(), n.div_ceil(8), "32x: one bit per element");
            for (i, (&x, &y)) in data.iter().zip(&out).enumerate() {
                let bit = payloads[0][i / 8] >> (i % 8) & 1;
                assert_eq!(bit == 1, x < 0.0, "{i}");
                assert_eq!(y, if x < 0.0 { -1e-3 } else { 1e-3 }, "{i}");
            }
        }
    }

    #[test]
    fn unpack_at_any_bit_offset() {
        let bits = [0b1010_0110u8, 0b0101_1001, 0b1111_0000, 0b0000_1111];
        for first in 0..12 {
            for len in 0..(32 - first) {
                let mut out = vec![0f32; len];
                unpack(&bits, first, 2.0, &mut out);
                for (i, &o) in out.iter().enumerate() {
                    let b = bits[(first + i) / 8] >> ((first + i) % 8) & 1;
                    assert_eq!(
                        o,
                        if b == 1 { -2.0 } else { 2.0 },
                        "first {first} len {len} i {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn rejects_bad_lengths_payloads_and_parameters() {
        let c = codec(1.0).unwrap();
        let meta = Meta::flat("w", 10, 0, 1);
        assert!(
            c.encode(&meta, &[1.0; 9], &[])
                .unwrap_err()
                .contains("9 floats")
        );
        let e = c.decode(&meta, &[vec![0]]).unwrap_err();
        assert!(
            e.starts_with("malformed payload") && e.contains("sign bits"),
            "{e}"
        );
        assert!(
            c.decode(&meta, &[vec![0; 3]])
                .unwrap_err()
                .contains("trailing")
        );
        let e = c.decode(&meta, &[vec![0, 0b100]]).unwrap_err();
        assert!(e.contains("padding bits after element 9"), "{e}");
        assert!(c.decode(&meta, &[vec![0xff, 0b11]]).is_ok());
        for bad in [0.0, -1.0, 1e-50, 1e39, f64::NAN] {
            assert_eq!(
                codec(bad).unwrap_err(),
                format!("scale must be > 0 and within the finite binary32 range, got {bad}")
            );
        }
    }
}
