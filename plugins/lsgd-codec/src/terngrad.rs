//! `terngrad`: TernGrad (Wen et al. 2017), unbiased stochastic ternarisation per chunk.
//!
//! Per chunk of `chunk` elements with s = max|x|: each element becomes s·sign(x)·b with b ~
//! Bernoulli(|x|/s) (uniforms from `meta.rank_seed`), so E = x. Payload: every chunk's s as
//! little-endian binary32, then the ternary values of the whole bucket at 2 bits each (0b00 =
//! 0, 0b01 = +1, 0b10 = −1), four per byte, element i in bits 2·(i mod 4) of byte i/4, unused
//! bits of the last byte zero. Gathered. A chunk holding a NaN or an infinity has a
//! non-finite s and every value 0, so it decodes to NaN.

use crate::int8::{f32_le, integer_in, max_abs, scale_bytes};
use crate::rng::Rng;
use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// TernGrad with one scale per `chunk` elements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TernGrad {
    /// Elements sharing one scale.
    pub chunk: u32,
}

impl Policy for TernGrad {
    fn info() -> Info {
        Info::new(
            "terngrad",
            "TernGrad: unbiased stochastic {-s, 0, s} per chunk, 2 bits per element, all-gathered",
            vec![ParamSpec::integer(
                "chunk",
                1024,
                "elements sharing one scale s = max|x| (>= 1)",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(TernGrad {
            chunk: integer_in(p, "chunk", 1, u32::MAX)?,
        })
    }
}

/// Decoded value of each 2-bit code, in units of the chunk's scale (0b11 is never written).
const TERNARY: [f32; 4] = [0.0, 1.0, -1.0, 0.0];

impl Codec for TernGrad {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let n = check_len(meta, data)?;
        let c = self.chunk as usize;
        let chunks = n.div_ceil(c);
        let mut rng = Rng::new(meta.rank_seed);
        let mut out = vec![0u8; 4 * chunks + n.div_ceil(4)];
        let (scales, packed) = out.split_at_mut(4 * chunks);
        for (k, (x, b)) in data.chunks(c).zip(scales.chunks_exact_mut(4)).enumerate() {
            let s = max_abs(x);
            b.copy_from_slice(&s.to_le_bytes());
            for (j, &v) in x.iter().enumerate() {
                // b = 1 with probability |x|/s; never for s = 0 or a non-finite s.
                let keep = rng.next_f32() * s < v.abs();
                let code = u8::from(keep) << u8::from(v < 0.0);
                let i = k * c + j;
                packed[i / 4] |= code << (2 * (i % 4));
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
        let packed = r.take(n.div_ceil(4), "the ternary values")?;
        r.finish()?;
        if let Some(i) = packed.iter().position(|&b| b & (b >> 1) & 0x55 != 0) {
            return Err(format!(
                "malformed payload: byte {i} of the ternary values holds the unused code 0b11"
            ));
        }
        if !n.is_multiple_of(4) && packed[n / 4] >> (2 * (n % 4)) != 0 {
            return Err("malformed payload: the padding bits of the last byte are not zero".into());
        }
        let mut out = vec![0f32; n];
        for (k, (o, b)) in out.chunks_mut(c).zip(scales.chunks_exact(4)).enumerate() {
            let s = f32_le(b);
            for (j, o) in o.iter_mut().enumerate() {
                let i = k * c + j;
                // s·t rather than a select, so an infinite scale decodes to NaN, not to 0.
                *o = s * TERNARY[usize::from(packed[i / 4] >> (2 * (i % 4)) & 3)];
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::testing::{configured, gradient};
    use crate::{Value, dynamic, round_trip};

    fn terngrad(chunk: i64) -> TernGrad {
        configured(&[("chunk", Value::Integer(chunk))]).unwrap()
    }

    #[test]
    fn values_are_zero_or_the_signed_scale() {
        for (n, chunk) in [(10_000, 1024), (101, 7), (9, 1), (3, 1024)] {
            let data = gradient(n, 21);
            let codec = terngrad(chunk);
            let meta = Meta::flat("w", n as u32, 0, 8);
            let (payloads, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
            let c = chunk as usize;
            let chunks = n.div_ceil(c);
            assert_eq!(payloads[0].len(), 4 * chunks + n.div_ceil(4));
            for (k, (x, y)) in data.chunks(c).zip(out.chunks(c)).enumerate() {
                let s = f32_le(&payloads[0][4 * k..]);
                assert_eq!(s, x.iter().fold(0f32, |m, v| m.max(v.abs())));
                for (a, b) in x.iter().zip(y) {
                    assert!(*b == 0.0 || *b == s.copysign(*a), "{a} -> {b}, s {s}");
                    if a.abs() == s && s > 0.0 {
                        assert_eq!(a, b, "the largest element is always kept");
                    }
                    if *a == 0.0 {
                        assert_eq!(*b, 0.0);
                    }
                }
            }
        }
    }

    #[test]
    fn non_finite_chunks_decode_to_nan() {
        let mut data = gradient(12, 3);
        data[1] = f32::NAN;
        data[6] = f32::NEG_INFINITY;
        let meta = Meta::flat("w", 12, 0, 0);
        let (payloads, out) = round_trip(dynamic(terngrad(4)).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0][12..14], [0, 0]);
        assert!(out[..8].iter().all(|v| v.is_nan()));
        assert!(out[8..].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn packing_layout() {
        let codec = terngrad(8);
        let data = [1.0, -1.0, 0.0, 1.0, -1.0];
        let meta = Meta::flat("w", 5, 0, 0);
        let p = codec.encode(&meta, &data, &[]).unwrap();
        assert_eq!(p, [0, 0, 0x80, 0x3f, 0b01_00_10_01, 0b10]);
    }

    #[test]
    fn ratio_is_about_sixteen() {
        let n = 1 << 20;
        let data = gradient(n, 1);
        let meta = Meta::flat("w", n as u32, 0, 0);
        let p = TernGrad::from_defaults()
            .unwrap()
            .encode(&meta, &data, &[])
            .unwrap();
        let ratio = (4 * n) as f64 / p.len() as f64;
        assert!((15.7..16.0).contains(&ratio), "{ratio}");
    }

    #[test]
    fn unbiased() {
        let data = gradient(200, 5);
        let codec = terngrad(50);
        let trials = 4000;
        let mut mean = vec![0f64; data.len()];
        for seed in 0..trials {
            let meta = Meta::flat("w", 200, 1, seed);
            let (_, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
            for (m, y) in mean.iter_mut().zip(out) {
                *m += f64::from(y) / trials as f64;
            }
        }
        for (i, (x, m)) in data.iter().zip(&mean).enumerate() {
            let s = f64::from(
                data[i / 50 * 50..][..50]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs())),
            );
            let tol = 5.0 * s / (2.0 * (trials as f64).sqrt());
            assert!(
                (m - f64::from(*x)).abs() <= tol,
                "{i}: {x} vs mean {m}, tol {tol}"
            );
        }
    }

    #[test]
    fn seeded_by_rank() {
        let data = gradient(5000, 4);
        let codec = TernGrad::from_defaults().unwrap();
        let a = Meta::flat("w", 5000, 0, 1);
        let mut b = a.clone();
        b.rank_seed = b.rank_seed.wrapping_add(1);
        let pa = codec.encode(&a, &data, &[]).unwrap();
        assert_eq!(pa, codec.encode(&a, &data, &[]).unwrap());
        assert_ne!(pa, codec.encode(&b, &data, &[]).unwrap());
    }

    #[test]
    fn malformed_payloads_and_parameters() {
        let codec = terngrad(4);
        let meta = Meta::flat("w", 6, 0, 0);
        let good = codec
            .encode(&meta, &[1.0, -2.0, 0.5, 0.0, 3.0, -3.0], &[])
            .unwrap();
        assert_eq!(good.len(), 8 + 2);
        assert!(codec.decode(&meta, std::slice::from_ref(&good)).is_ok());
        for bad in [&good[..9], &good[..3], &[][..]] {
            let e = codec.decode(&meta, &[bad.to_vec()]).unwrap_err();
            assert!(e.starts_with("malformed payload: "), "{e}");
        }
        let mut three = good.clone();
        three[8] |= 0b11 << 4;
        assert_eq!(
            codec.decode(&meta, &[three]).unwrap_err(),
            "malformed payload: byte 0 of the ternary values holds the unused code 0b11"
        );
        let mut padding = good.clone();
        padding[9] |= 0b01 << 6;
        assert!(
            codec
                .decode(&meta, &[padding])
                .unwrap_err()
                .contains("padding")
        );
        assert!(codec.encode(&meta, &[0.0; 7], &[]).is_err());
        assert!(codec.decode(&meta, &[]).is_err());

        let err = |v| configured::<TernGrad>(&[("chunk", Value::Integer(v))]).unwrap_err();
        assert_eq!(err(0), "chunk must be in [1, 4294967295], got 0");
        assert_eq!(TernGrad::from_defaults().unwrap().chunk, 1024);
        assert_eq!(TernGrad::info().name, "terngrad");
    }
}
