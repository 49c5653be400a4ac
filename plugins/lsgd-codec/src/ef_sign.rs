//! `ef-sign`: scaled sign compression, the compressor of EF-SignSGD (Karimireddy et al. 2019)
//! and 1-bit SGD (Seide et al. 2014): per tensor slice, every element becomes ±(mean |x| of the
//! slice). All-gathered. Meant for the host's `--error-feedback`, which carries what the
//! compression dropped into the next step; without it the method is biased.
//!
//! Slices are the bucket's `meta.tensors` (one scale per slice, so a layer with small
//! gradients is not drowned by one with large ones); a bucket without tensor information is
//! one slice. Elements that no slice covers decode to 0.
//!
//! Payload, little-endian: one binary32 scale per slice (in `meta.tensors` order), then the
//! bucket's sign bits exactly as [`sign`](crate::sign) packs them (⌈n/8⌉ bytes, bit set =
//! negative, zero padding). Ratio ≈ 32×.
//!
//! The scale is the L1 norm divided by the slice length, accumulated in eight binary32 lanes
//! per block of 4096 elements and then in binary64, in a fixed order that the wasm SIMD path
//! and the portable path both follow, so both builds give the same bytes.

use core::ops::Range;

use crate::sign::{check_padding, pack, unpack};
use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Info, Meta, Params, Policy, Properties};

/// Sign bits with one mean-magnitude scale per tensor slice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EfSign;

impl Policy for EfSign {
    fn info() -> Info {
        Info::new(
            "ef-sign",
            "EF-SignSGD / 1-bit SGD: sign bits decoded to +-(mean |x| of each tensor slice), all-gathered; use with error feedback",
            vec![],
        )
    }

    fn configure(_: &Params) -> Result<Self, String> {
        Ok(EfSign)
    }
}

impl Codec for EfSign {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        check_len(meta, data)?;
        let slices = slices(meta)?;
        let n = data.len();
        let mut out = vec![0u8; 4 * slices.len() + n.div_ceil(8)];
        let (scales, bits) = out.split_at_mut(4 * slices.len());
        for (s, r) in scales.chunks_exact_mut(4).zip(&slices) {
            s.copy_from_slice(&mean_abs(&data[r.clone()]).to_le_bytes());
        }
        pack(data, bits);
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let slices = slices(meta)?;
        let n = meta.len as usize;
        let mut r = Reader::new(&payloads[0]);
        let scales = r.take(4 * slices.len(), "the scales")?;
        let bits = r.take(n.div_ceil(8), "the sign bits")?;
        r.finish()?;
        check_padding(bits, n)?;
        let mut out = vec![0f32; n];
        for (k, (s, range)) in scales.chunks_exact(4).zip(slices).enumerate() {
            let s = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            // NaN passes: a NaN or infinite input gives a NaN or infinite mean, and decode
            // hands it on rather than hiding it.
            if s < 0.0 || s.to_bits() == 0x8000_0000 {
                return Err(format!("malformed payload: scale {k} is negative ({s})"));
            }
            let first = range.start;
            unpack(bits, first, s, &mut out[range]);
        }
        Ok(out)
    }
}

/// The bucket ranges that get a scale each: `meta.tensors`, or the whole bucket without them.
pub(crate) fn slices(meta: &Meta) -> Result<Vec<Range<usize>>, String> {
    let n = meta.len as usize;
    if meta.tensors.is_empty() {
        // One range, but as the same list type the tensor case returns.
        #[allow(clippy::single_range_in_vec_init)]
        return Ok(vec![0..n]);
    }
    meta.tensors
        .iter()
        .map(|t| {
            let end = u64::from(t.bucket_offset) + u64::from(t.len);
            if end <= n as u64 {
                Ok(t.bucket_offset as usize..end as usize)
            } else {
                Err(format!(
                    "tensor slice '{}' ({} floats at {}) lies outside the bucket of {n}",
                    t.name, t.len, t.bucket_offset
                ))
            }
        })
        .collect()
}

/// Elements summed in binary32 lanes before the running total moves to binary64.
const BLOCK: usize = 4096;

/// mean |x| (0 for an empty slice).
pub fn mean_abs(xs: &[f32]) -> f32 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut total = 0f64;
    for block in xs.chunks(BLOCK) {
        let lanes = lane_sums(block);
        for l in lanes {
            total += f64::from(l);
        }
        for x in &block[block.len() / 8 * 8..] {
            total += f64::from(x.abs());
        }
    }
    (total / xs.len() as f64) as f32
}

/// Lane l holds the sum of |x[8i + l]| over the whole groups of 8, added in order of i.
#[cfg(not(target_arch = "wasm32"))]
fn lane_sums(xs: &[f32]) -> [f32; 8] {
    let mut lanes = [0f32; 8];
    for g in xs.chunks_exact(8) {
        for (l, x) in lanes.iter_mut().zip(g) {
            *l += x.abs();
        }
    }
    lanes
}

/// Lane l holds the sum of |x[8i + l]| over the whole groups of 8, added in order of i (wasm
/// simd128: lanes 0–3 in one vector, 4–7 in the other).
#[cfg(target_arch = "wasm32")]
fn lane_sums(xs: &[f32]) -> [f32; 8] {
    use core::arch::wasm32::*;
    let (mut a, mut b) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for g in xs.chunks_exact(8) {
        let p = g.as_ptr() as *const v128;
        // SAFETY: the group holds 8 floats = 2 v128; wasm loads need no alignment.
        let (x, y) = unsafe { (v128_load(p), v128_load(p.add(1))) };
        a = f32x4_add(a, f32x4_abs(x));
        b = f32x4_add(b, f32x4_abs(y));
    }
    [
        f32x4_extract_lane::<0>(a),
        f32x4_extract_lane::<1>(a),
        f32x4_extract_lane::<2>(a),
        f32x4_extract_lane::<3>(a),
        f32x4_extract_lane::<0>(b),
        f32x4_extract_lane::<1>(b),
        f32x4_extract_lane::<2>(b),
        f32x4_extract_lane::<3>(b),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TensorSlice, dynamic, round_trip};

    fn two_tensors() -> Meta {
        Meta {
            len: 13,
            tensors: vec![
                TensorSlice::whole("w", &[2, 5], 0),
                TensorSlice::whole("b", &[3], 10),
            ],
            ..Meta::flat("x", 13, 0, 1)
        }
    }

    #[test]
    fn each_slice_decodes_to_its_signed_mean_magnitude() {
        let data = [
            1.0f32, -3.0, 2.0, 0.0, -4.0, 1.0, 1.0, 1.0, -1.0, 1.0, // mean |x| 1.5
            -0.5, 0.25, 0.25, // mean |x| 1/3
        ];
        let meta = two_tensors();
        let (payloads, out) = round_trip(dynamic(EfSign).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 2 * 4 + 2);
        assert_eq!(&payloads[0][..4], &1.5f32.to_le_bytes());
        let third = (1.0f64 / 3.0) as f32;
        assert_eq!(&payloads[0][4..8], &third.to_le_bytes());
        let (a, b) = (1.5, third);
        assert_eq!(
            out,
            vec![a, -a, a, a, -a, a, a, a, -a, a, -b, b, b],
            "zeros decode as +scale"
        );
    }

    #[test]
    fn without_tensors_the_bucket_is_one_slice() {
        let n = 10_007usize;
        let data: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 1e-3)
            .collect();
        let meta = Meta {
            tensors: vec![],
            ..Meta::flat("w", n as u32, 0, 1)
        };
        let (payloads, out) = round_trip(dynamic(EfSign).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 4 + n.div_ceil(8));
        let mean = (data.iter().map(|x| f64::from(x.abs())).sum::<f64>() / n as f64) as f32;
        let got = f32::from_le_bytes(payloads[0][..4].try_into().unwrap());
        assert!((got - mean).abs() <= mean * 1e-6, "{got} vs {mean}");
        assert!(
            out.iter()
                .zip(&data)
                .all(|(&o, &x)| o == if x < 0.0 { -got } else { got })
        );
    }

    #[test]
    fn mean_abs_blocks_match_a_plain_sum() {
        let mut rng = crate::rng::Rng::new(4);
        for n in [1usize, 7, 8, 9, 4095, 4096, 4097, 20_000] {
            let xs: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let plain = xs.iter().map(|x| f64::from(x.abs())).sum::<f64>() / n as f64;
            let got = f64::from(mean_abs(&xs));
            assert!(
                (got - plain).abs() <= plain * 1e-6,
                "n {n}: {got} vs {plain}"
            );
        }
        assert_eq!(mean_abs(&[]), 0.0);
    }

    #[test]
    fn rejects_bad_meta_and_payloads() {
        let meta = two_tensors();
        let data = [1.0f32; 13];
        assert!(
            EfSign
                .encode(&meta, &data[..12], &[])
                .unwrap_err()
                .contains("12 floats")
        );
        let good = EfSign.encode(&meta, &data, &[]).unwrap();
        let e = EfSign.decode(&meta, &[good[..9].to_vec()]).unwrap_err();
        assert!(
            e.starts_with("malformed payload") && e.contains("sign bits"),
            "{e}"
        );
        let mut neg = good.clone();
        neg[..4].copy_from_slice(&(-1.0f32).to_le_bytes());
        assert!(
            EfSign
                .decode(&meta, &[neg])
                .unwrap_err()
                .contains("scale 0 is negative")
        );
        let mut pad = good.clone();
        pad[9] |= 0x80;
        assert!(
            EfSign
                .decode(&meta, &[pad])
                .unwrap_err()
                .contains("padding")
        );
        let mut outside = meta.clone();
        outside.tensors[1].len = 4;
        let e = EfSign.encode(&outside, &data, &[]).unwrap_err();
        assert_eq!(
            e,
            "tensor slice 'b' (4 floats at 10) lies outside the bucket of 13"
        );
        assert!(EfSign.decode(&outside, &[good]).is_err());
    }
}
