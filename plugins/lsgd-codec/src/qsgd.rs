//! `qsgd`: QSGD (Alistarh et al. 2017), unbiased stochastic quantisation to `levels` levels of
//! each chunk's L2 norm.
//!
//! Per chunk of `chunk` elements with norm ‖x‖ and s = `levels`: l = floor(|x|/‖x‖·s + u), u
//! uniform in [0, 1) from `meta.rank_seed`, so E[l] = |x|/‖x‖·s and decode ‖x‖/s·sign(x)·l
//! is unbiased. Payload: every chunk's norm as little-endian binary32, then sign(x)·l as one
//! i8 per element (|l| ≤ s ≤ 127). Gathered.

use crate::int8::{f32_le, integer_in, scale_bytes};
use crate::rng::Rng;
use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// QSGD with `levels` levels per chunk norm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Qsgd {
    /// Quantisation levels s: each element becomes an integer in [-s, s].
    pub levels: u32,
    /// Elements sharing one norm.
    pub chunk: u32,
}

impl Policy for Qsgd {
    fn info() -> Info {
        Info::new(
            "qsgd",
            "QSGD: unbiased stochastic quantisation to levels of each chunk's L2 norm, all-gathered",
            vec![
                ParamSpec::integer("levels", 16, "quantisation levels s (1..=127)"),
                ParamSpec::integer("chunk", 4096, "elements sharing one norm (>= 1)"),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(Qsgd {
            levels: integer_in(p, "levels", 1, 127)?,
            chunk: integer_in(p, "chunk", 1, u32::MAX)?,
        })
    }
}

impl Codec for Qsgd {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let n = check_len(meta, data)?;
        let c = self.chunk as usize;
        let chunks = n.div_ceil(c);
        let s = f64::from(self.levels);
        let mut rng = Rng::new(meta.rank_seed);
        let mut out = vec![0u8; 4 * chunks + n];
        let (norms, levels) = out.split_at_mut(4 * chunks);
        for ((x, b), q) in data
            .chunks(c)
            .zip(norms.chunks_exact_mut(4))
            .zip(levels.chunks_mut(c))
        {
            let norm = norm_of(x);
            b.copy_from_slice(&norm.to_le_bytes());
            // A zero or non-finite norm (a NaN or ±inf in the chunk, or an overflow) leaves
            // every level 0: decode then gives 0 for a zero norm and NaN otherwise.
            if !(norm > 0.0 && norm.is_finite()) {
                continue;
            }
            let per = s / f64::from(norm);
            for (q, &v) in q.iter_mut().zip(x) {
                let u = f64::from(rng.next_f32());
                let l = (f64::from(v.abs()) * per + u).floor().min(s) as i8;
                *q = if v < 0.0 { -l } else { l } as u8;
            }
        }
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let n = meta.len as usize;
        let c = self.chunk as usize;
        let mut r = Reader::new(&payloads[0]);
        let norms = r.take(scale_bytes(n, c)?, "the norms")?;
        let levels = r.take(n, "the levels")?;
        r.finish()?;
        let s = self.levels as i8;
        if let Some(i) = levels
            .iter()
            .position(|&l| (l as i8).unsigned_abs() > s as u8)
        {
            return Err(format!(
                "malformed payload: level {} of element {i} is outside [-{s}, {s}]",
                levels[i] as i8
            ));
        }
        let mut out = vec![0f32; n];
        for ((o, q), b) in out
            .chunks_mut(c)
            .zip(levels.chunks(c))
            .zip(norms.chunks_exact(4))
        {
            let step = f32_le(b) / f32::from(s);
            for (o, &l) in o.iter_mut().zip(q) {
                *o = f32::from(l as i8) * step;
            }
        }
        Ok(out)
    }
}

/// The chunk's L2 norm, accumulated in f64 (no overflow or underflow for any finite binary32)
/// and rounded up to binary32 so that |x| ≤ norm holds for every element.
fn norm_of(x: &[f32]) -> f32 {
    let norm = x
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt();
    let rounded = norm as f32;
    if f64::from(rounded) < norm {
        rounded.next_up()
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::testing::{configured, gradient};
    use crate::{Value, dynamic, round_trip};

    fn qsgd(levels: i64, chunk: i64) -> Qsgd {
        configured(&[
            ("levels", Value::Integer(levels)),
            ("chunk", Value::Integer(chunk)),
        ])
        .unwrap()
    }

    #[test]
    fn within_one_level_and_layout() {
        for (n, levels, chunk) in [(10_000, 16, 4096), (100, 1, 7), (300, 127, 1), (5, 4, 4096)] {
            let data = gradient(n, 11);
            let codec = qsgd(levels, chunk);
            let meta = Meta::flat("w", n as u32, 0, 4);
            let (payloads, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
            let c = chunk as usize;
            let chunks = n.div_ceil(c);
            assert_eq!(payloads[0].len(), 4 * chunks + n);
            for (k, (x, y)) in data.chunks(c).zip(out.chunks(c)).enumerate() {
                let norm = f32_le(&payloads[0][4 * k..]);
                let exact = x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>().sqrt();
                assert!((f64::from(norm) - exact).abs() <= exact * 1e-7, "chunk {k}");
                let step = norm / levels as f32;
                for (a, b) in x.iter().zip(y) {
                    assert!((a - b).abs() <= step * 1.000_001, "{a} -> {b}, step {step}");
                    assert!(*b == 0.0 || a.signum() == b.signum(), "{a} -> {b}");
                    let l = if step > 0.0 { b / step } else { *b };
                    assert!((l - l.round()).abs() < 1e-3, "{b} is a multiple of {step}");
                }
            }
        }
    }

    #[test]
    fn unbiased() {
        let data = gradient(256, 3);
        let codec = qsgd(4, 64);
        let trials = 4000;
        let mut mean = vec![0f64; data.len()];
        for seed in 0..trials {
            let meta = Meta::flat("w", 256, 0, seed);
            let (_, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
            for (m, y) in mean.iter_mut().zip(out) {
                *m += f64::from(y) / trials as f64;
            }
        }
        let payload = codec
            .encode(&Meta::flat("w", 256, 0, 0), &data, &[])
            .unwrap();
        for (i, (x, m)) in data.iter().zip(&mean).enumerate() {
            // Each decode is x ± one step; the mean of `trials` has sd ≤ step/(2√trials).
            let step = f64::from(f32_le(&payload[4 * (i / 64)..])) / 4.0;
            let tol = 5.0 * step / (2.0 * (trials as f64).sqrt());
            assert!(
                (m - f64::from(*x)).abs() <= tol,
                "{i}: {x} vs mean {m}, tol {tol}"
            );
        }
    }

    #[test]
    fn seeded_by_rank() {
        let data = gradient(5000, 4);
        let codec = Qsgd::from_defaults().unwrap();
        let a = Meta::flat("w", 5000, 0, 1);
        let mut b = a.clone();
        b.rank_seed ^= 1;
        let mut c = a.clone();
        c.shared_seed ^= 1;
        let pa = codec.encode(&a, &data, &[]).unwrap();
        assert_eq!(pa, codec.encode(&a, &data, &[]).unwrap());
        assert_eq!(
            pa,
            codec.encode(&c, &data, &[]).unwrap(),
            "only rank_seed matters"
        );
        assert_ne!(pa, codec.encode(&b, &data, &[]).unwrap());
    }

    #[test]
    fn edge_values() {
        let codec = qsgd(8, 4);
        let data = [0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, -1e-30];
        let meta = Meta::flat("w", 9, 0, 0);
        let (_, out) = round_trip(dynamic(codec).as_ref(), &meta, &data).unwrap();
        assert_eq!(out[..8], [0.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0]);
        assert_eq!(out[8], -1e-30, "a lone element is its own norm");
        let big = [3e38f32, -3e38];
        let (_, out) =
            round_trip(dynamic(codec).as_ref(), &Meta::flat("w", 2, 0, 0), &big).unwrap();
        assert!(
            out.iter().all(|v| v.is_nan()),
            "a norm beyond binary32 decodes to NaN"
        );
        let odd = [
            1.0,
            f32::NAN,
            2.0,
            3.0,
            f32::NEG_INFINITY,
            1.0,
            1.0,
            1.0,
            0.5,
        ];
        let meta = Meta::flat("w", 9, 0, 0);
        let (p, out) = round_trip(dynamic(codec).as_ref(), &meta, &odd).unwrap();
        assert!(
            p[0][12..20].iter().all(|&l| l == 0),
            "non-finite chunks send level 0"
        );
        assert!(out[..8].iter().all(|v| v.is_nan()));
        assert_eq!(out[8], 0.5);
    }

    #[test]
    fn malformed_payloads_and_parameters() {
        let codec = qsgd(16, 100);
        let meta = Meta::flat("w", 250, 0, 0);
        let data = gradient(250, 6);
        let good = codec.encode(&meta, &data, &[]).unwrap();
        assert_eq!(good.len(), 12 + 250);
        for bad in [&good[..good.len() - 1], &good[..11], &[][..]] {
            let e = codec.decode(&meta, &[bad.to_vec()]).unwrap_err();
            assert!(e.starts_with("malformed payload: "), "{e}");
        }
        let mut wild = good.clone();
        wild[12 + 7] = (-17i8) as u8;
        assert_eq!(
            codec.decode(&meta, &[wild]).unwrap_err(),
            "malformed payload: level -17 of element 7 is outside [-16, 16]"
        );
        assert!(codec.decode(&meta, &[good.clone(), good]).is_err());
        assert!(codec.encode(&meta, &data[1..], &[]).is_err());

        let err = |k: &str, v| configured::<Qsgd>(&[(k, Value::Integer(v))]).unwrap_err();
        assert_eq!(err("levels", 0), "levels must be in [1, 127], got 0");
        assert_eq!(err("levels", 128), "levels must be in [1, 127], got 128");
        assert_eq!(err("chunk", 0), "chunk must be in [1, 4294967295], got 0");
        assert_eq!(Qsgd::from_defaults().unwrap(), qsgd(16, 4096));
        assert_eq!(Qsgd::info().name, "qsgd");
    }
}
