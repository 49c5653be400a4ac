//! `natural`: natural compression (Horváth et al. 2019), every value rounded stochastically to
//! one of the two powers of two around it, unbiasedly, in one byte.
//!
//! For 2^e ≤ |x| < 2^(e+1), x becomes sign(x)·2^(e+1) with probability |x|/2^e − 1 and
//! sign(x)·2^e otherwise (uniforms from `meta.rank_seed`), so E = x. Byte: bit 7 the sign,
//! bits 0–6 a code c: c = 0 is zero (0x80: a non-finite input, decoded as NaN), c in 1..=127
//! is 2^(c − 111), i.e. exponents −110..=16. Below 2^-110 (subnormals included) a value
//! rounds to 0 or ±2^-110, still unbiased; from 2^16 up it saturates to ±2^16 (biased; a
//! gradient that large has diverged anyway). Payload: `meta.len` bytes. Gathered.

use crate::rng::Rng;
use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Info, Meta, Params, Policy, Properties};

/// Smallest and largest exponent a code represents.
const E_MIN: i32 = -110;
const E_MAX: i32 = 16;

/// The byte for a non-finite input ("negative zero").
const NON_FINITE: u8 = 0x80;

/// Stochastic rounding to powers of two, one byte per element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Natural;

impl Policy for Natural {
    fn info() -> Info {
        Info::new(
            "natural",
            "Natural compression: unbiased stochastic rounding to powers of two, 1 byte per element, all-gathered",
            vec![],
        )
    }

    fn configure(_: &Params) -> Result<Self, String> {
        Ok(Natural)
    }
}

/// Every byte's value, built at compile time.
const DECODE: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut b = 1;
    while b < 256 {
        let code = (b & 0x7f) as u32;
        t[b] = if code == 0 {
            f32::NAN
        } else {
            f32::from_bits(((b as u32 & 0x80) << 24) | ((code + (127 + E_MIN - 1) as u32) << 23))
        };
        b += 1;
    }
    t
};

/// The byte for `x`, `r` being 64 fresh random bits.
#[inline]
fn encode_one(x: f32, r: u64) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    let code = if a >= 0x7f80_0000 {
        return NON_FINITE;
    } else if a >= ((127 + E_MAX) as u32) << 23 {
        127
    } else if a >= ((127 + E_MIN) as u32) << 23 {
        // Round up with probability mantissa / 2^23, exactly: 23 random bits below it.
        let up = ((r >> 41) as u32) < (a & 0x7f_ffff);
        ((a >> 23) as i32 - 127 - E_MIN + 1) as u8 + u8::from(up)
    } else {
        // |x| / 2^E_MIN is exact (a scaling by a power of two into the normal range).
        let p = f32::from_bits(a) * f32::from_bits(((127 - E_MIN) as u32) << 23);
        let u = (r >> 40) as f32 * (1.0 / (1u32 << 24) as f32);
        u8::from(u < p)
    };
    if code == 0 { 0 } else { sign | code }
}

impl Codec for Natural {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let n = check_len(meta, data)?;
        let mut rng = Rng::new(meta.rank_seed);
        let mut out = vec![0u8; n];
        for (o, &x) in out.iter_mut().zip(data) {
            *o = encode_one(x, rng.next_u64());
        }
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let mut r = Reader::new(&payloads[0]);
        let bytes = r.take(meta.len as usize, "the values")?;
        r.finish()?;
        Ok(bytes.iter().map(|&b| DECODE[usize::from(b)]).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::testing::gradient;
    use crate::{Value, dynamic, native, round_trip};

    fn pow2(e: i32) -> f32 {
        2f32.powi(e)
    }

    #[test]
    fn code_table() {
        assert_eq!(DECODE[0], 0.0);
        assert!(DECODE[0x80].is_nan());
        assert_eq!(DECODE[1], pow2(-110));
        assert_eq!(DECODE[111], 1.0);
        assert_eq!(DECODE[127], 65536.0);
        assert_eq!(DECODE[0x80 | 111], -1.0);
        assert_eq!(DECODE[0x80 | 112], -2.0);
    }

    #[test]
    fn rounds_to_a_neighbouring_power_of_two() {
        let data = gradient(20_000, 31);
        let meta = Meta::flat("w", 20_000, 0, 3);
        let (payloads, out) = round_trip(dynamic(Natural).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 20_000, "ratio 4");
        let (mut ups, mut downs) = (0, 0);
        for (x, y) in data.iter().zip(&out) {
            if *x == 0.0 {
                assert_eq!(*y, 0.0);
                continue;
            }
            let lo = pow2(x.abs().log2().floor() as i32);
            assert!(
                *y == lo.copysign(*x) || *y == (2.0 * lo).copysign(*x),
                "{x} -> {y}"
            );
            if y.abs() > x.abs() {
                ups += 1;
            } else if y.abs() < x.abs() {
                downs += 1;
            }
        }
        assert!(ups > 5000 && downs > 5000, "{ups} up, {downs} down");
        let exact = [1.0, -0.25, pow2(-110), pow2(16), -pow2(-50), 0.0];
        let meta = Meta::flat("w", 6, 0, 0);
        let (_, out) = round_trip(dynamic(Natural).as_ref(), &meta, &exact).unwrap();
        assert_eq!(out, exact);
    }

    #[test]
    fn out_of_range_values() {
        let data = [1e6, -f32::MAX, f32::INFINITY, f32::NAN, -0.0, 1e-40];
        let meta = Meta::flat("w", 6, 0, 0);
        let (p, out) = round_trip(dynamic(Natural).as_ref(), &meta, &data).unwrap();
        assert_eq!(out[..2], [65536.0, -65536.0]);
        assert!(out[2].is_nan() && out[3].is_nan());
        assert_eq!(p[0][4], 0, "negative zero is zero");
        assert!(out[5] == 0.0 || out[5] == pow2(-110));
    }

    #[test]
    fn unbiased_including_below_the_range() {
        let mut data = gradient(200, 7);
        data.extend([3.0 * pow2(-112), -pow2(-120), 1.5, -1.75, 1.0 + pow2(-20)]);
        let trials = 4000;
        let mut mean = vec![0f64; data.len()];
        for seed in 0..trials {
            let meta = Meta::flat("w", data.len() as u32, 2, seed);
            let (_, out) = round_trip(dynamic(Natural).as_ref(), &meta, &data).unwrap();
            for (m, y) in mean.iter_mut().zip(out) {
                *m += f64::from(y) / trials as f64;
            }
        }
        for (i, (x, m)) in data.iter().zip(&mean).enumerate() {
            // Between 2^e and 2^(e+1): sd ≤ 2^e / 2 ≤ |x| / 2 (|x| itself below the range).
            let x = f64::from(*x);
            let tol = 5.0 * x.abs().max(2f64.powi(-110)) / (2.0 * (trials as f64).sqrt());
            assert!((m - x).abs() <= tol, "{i}: {x} vs mean {m}, tol {tol}");
        }
    }

    #[test]
    fn seeded_by_rank() {
        let data = gradient(5000, 4);
        let a = Meta::flat("w", 5000, 0, 1);
        let mut b = a.clone();
        b.rank_seed = b.rank_seed.wrapping_add(1);
        let pa = Natural.encode(&a, &data, &[]).unwrap();
        assert_eq!(pa, Natural.encode(&a, &data, &[]).unwrap());
        assert_ne!(pa, Natural.encode(&b, &data, &[]).unwrap());
    }

    #[test]
    fn malformed_payloads_and_parameters() {
        let meta = Meta::flat("w", 10, 0, 0);
        for len in [0, 9, 11] {
            let e = Natural.decode(&meta, &[vec![0; len]]).unwrap_err();
            assert!(e.starts_with("malformed payload: "), "{e}");
        }
        assert!(Natural.decode(&meta, &[]).is_err());
        assert!(Natural.encode(&meta, &[1.0; 11], &[]).is_err());
        let e = native("natural", vec![("chunk".into(), Value::Integer(4))]).unwrap();
        assert!(e.is_err());
        assert_eq!(
            native("natural", vec![]).unwrap().unwrap().info().name,
            "natural"
        );
    }
}
