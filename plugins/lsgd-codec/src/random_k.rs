//! `random-k`: keep k = max(1, ⌈density·n⌉) elements at indices drawn without replacement from
//! a seed (Stich et al. 2018; Wangni et al. 2018).
//!
//! With `seed = shared` (the default) every rank draws the same indices from
//! `meta.shared_seed`, so the payload is just the k values, in ascending index order, and the
//! element-wise sum of two payloads encodes the sum of the two sparse vectors: the codec is
//! summable and the host all-reduces it. Decode draws the indices again from the same meta.
//! With `seed = rank` each rank draws its own indices from `meta.rank_seed`; the payload is
//! the [sparse] index+value format and is all-gathered.
//!
//! `scale = unbiased` multiplies the kept values by n/k at encode time, so that the decoded
//! vector is an unbiased estimate of the input (E\[decode\] = x); `none` keeps them as they are,
//! the usual choice with error feedback.
//!
//! Indices come from Floyd's algorithm (Bentley & Floyd 1987): k draws, O(k) expected, over a
//! bitmap of n bits, which also yields them in ascending order with one O(n/64) scan.

use crate::rng::Rng;
use crate::sparse;
use crate::wire::{Reader, expect_rounds};
use crate::{Codec, Element, Info, Meta, ParamSpec, Params, Policy, Properties};

/// Which seed the indices come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    /// `meta.shared_seed`: the same indices on every rank, payloads summable.
    Shared,
    /// `meta.rank_seed`: indices of each rank's own, payloads all-gathered.
    Rank,
}

/// Keeps k elements at seeded random indices.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomK {
    /// Fraction of elements kept, in (0, 1].
    pub density: f64,
    /// Where the indices come from.
    pub seed: Seed,
    /// Multiply kept values by n/k (unbiased estimate) instead of sending them as they are.
    pub unbiased: bool,
}

impl Policy for RandomK {
    fn info() -> Info {
        Info::new(
            "random-k",
            "Random-k sparsification: k = max(1, ceil(density*n)) seeded random elements; summable with a shared seed",
            vec![
                ParamSpec::float("density", 0.01, "fraction of elements kept, in (0, 1]"),
                ParamSpec::choice(
                    "seed",
                    &["shared", "rank"],
                    "shared: same indices on every rank, values all-reduced; rank: own indices, index+value pairs all-gathered",
                ),
                ParamSpec::choice(
                    "scale",
                    &["none", "unbiased"],
                    "none: send values as they are; unbiased: multiply them by n/k",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let seed = match p.text("seed")? {
            "shared" => Seed::Shared,
            "rank" => Seed::Rank,
            other => return Err(format!("seed must be shared or rank, got '{other}'")),
        };
        let unbiased = match p.text("scale")? {
            "none" => false,
            "unbiased" => true,
            other => return Err(format!("scale must be none or unbiased, got '{other}'")),
        };
        Ok(RandomK {
            density: sparse::density_param(p, "density")?,
            seed,
            unbiased,
        })
    }
}

impl RandomK {
    /// The sorted indices this configuration keeps for `meta`.
    pub fn indices(&self, meta: &Meta) -> Vec<u32> {
        let seed = match self.seed {
            Seed::Shared => meta.shared_seed,
            Seed::Rank => meta.rank_seed,
        };
        let k = sparse::count_for(self.density, meta.len as usize);
        sample(meta.len, k, seed)
    }

    fn scale(&self, n: usize, k: usize) -> f32 {
        if self.unbiased && k > 0 {
            (n as f64 / k as f64) as f32
        } else {
            1.0
        }
    }
}

impl Codec for RandomK {
    fn properties(&self) -> Properties {
        match self.seed {
            Seed::Shared => Properties::sum(Element::F32),
            Seed::Rank => Properties::GATHER,
        }
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        crate::wire::check_len(meta, data)?;
        let idx = self.indices(meta);
        let scale = self.scale(data.len(), idx.len());
        Ok(match self.seed {
            Seed::Rank => sparse::encode(data, &idx, scale),
            Seed::Shared => {
                let mut out = vec![0u8; 4 * idx.len()];
                for (b, &i) in out.chunks_exact_mut(4).zip(&idx) {
                    let v = if scale == 1.0 {
                        data[i as usize]
                    } else {
                        data[i as usize] * scale
                    };
                    b.copy_from_slice(&v.to_le_bytes());
                }
                out
            }
        })
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        match self.seed {
            // Indices in a per-rank payload are checked, not trusted to match the seed: a
            // gathered payload was drawn from another rank's seed, which this rank never sees.
            Seed::Rank => sparse::decode(&payloads[0], meta.len),
            Seed::Shared => {
                let idx = self.indices(meta);
                let mut r = Reader::new(&payloads[0]);
                let values = r.take(4 * idx.len(), "the values")?;
                r.finish()?;
                let mut out = vec![0.0f32; meta.len as usize];
                for (&i, v) in idx.iter().zip(values.chunks_exact(4)) {
                    out[i as usize] = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
                }
                Ok(out)
            }
        }
    }
}

/// `k` distinct indices of `0..n` drawn from `seed` (Floyd's algorithm), ascending.
pub fn sample(n: u32, k: usize, seed: u64) -> Vec<u32> {
    let k = k.min(n as usize) as u32;
    let mut bits = vec![0u64; (n as usize).div_ceil(64)];
    let mut rng = Rng::new(seed);
    // Floyd: for j = n−k .. n−1 draw t uniform in 0..=j; take t unless taken, else j (which
    // no earlier draw can have reached). Each k-subset comes out with equal probability.
    for j in n - k..n {
        let t = rng.below(j + 1);
        let pick = if (bits[(t / 64) as usize] >> (t % 64)) & 1 == 1 {
            j
        } else {
            t
        };
        bits[(pick / 64) as usize] |= 1 << (pick % 64);
    }
    let mut out = vec![0u32; k as usize];
    let mut m = 0;
    for (w, &word) in bits.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            out[m] = w as u32 * 64 + word.trailing_zeros();
            m += 1;
            word &= word - 1;
        }
    }
    debug_assert_eq!(m, k as usize);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Combine, Value, dynamic, round_trip};

    fn codec(set: &[(&str, &str)], density: f64) -> RandomK {
        let mut given: Vec<(String, Value)> = set
            .iter()
            .map(|(n, v)| ((*n).to_owned(), Value::Text((*v).to_owned())))
            .collect();
        given.push(("density".into(), Value::Float(density)));
        RandomK::configure(&Params::resolve(&RandomK::info().params, given).unwrap()).unwrap()
    }

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 + 1.0) * if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect()
    }

    #[test]
    fn samples_are_distinct_sorted_seeded_and_cover_every_index() {
        for (n, k) in [(10, 10), (1000, 10), (1000, 999), (100_000, 1000), (1, 1)] {
            let s = sample(n, k, 42);
            assert_eq!(s.len(), k);
            assert!(s.windows(2).all(|w| w[0] < w[1]));
            assert!(s.iter().all(|&i| i < n));
            assert_eq!(s, sample(n, k, 42));
        }
        assert_ne!(sample(1000, 10, 1), sample(1000, 10, 2));
        // Each index is drawn about equally often: 2000 draws of 10 of 100 → 200 per index.
        let mut hits = [0u32; 100];
        for seed in 0..2000 {
            for i in sample(100, 10, seed) {
                hits[i as usize] += 1;
            }
        }
        assert!(hits.iter().all(|&h| (140..260).contains(&h)), "{hits:?}");
    }

    #[test]
    fn shared_seed_payloads_are_summable_values_only() {
        let c = codec(&[], 0.01);
        assert_eq!(c.properties(), Properties::sum(Element::F32));
        let n = 10_000;
        let meta = Meta::flat("w", n as u32, 5, 11);
        let (a, b) = (data(n), data(n).iter().map(|x| x * 0.5).collect::<Vec<_>>());
        let pa = c.encode(&meta, &a, &[]).unwrap();
        let pb = c.encode(&meta, &b, &[]).unwrap();
        assert_eq!(pa.len(), 100 * 4);
        // Equal seeds: the same indices on both "ranks".
        let idx = c.indices(&meta);
        assert_eq!(idx, c.indices(&Meta::flat("other", n as u32, 9, 11)));
        assert_ne!(idx, c.indices(&Meta::flat("w", n as u32, 5, 12)));
        // The element-wise sum of the payloads decodes to the sum of the kept elements.
        let sum: Vec<u8> = pa
            .chunks_exact(4)
            .zip(pb.chunks_exact(4))
            .flat_map(|(x, y)| {
                let s = f32::from_le_bytes(x.try_into().unwrap())
                    + f32::from_le_bytes(y.try_into().unwrap());
                s.to_le_bytes()
            })
            .collect();
        let out = c.decode(&meta, &[sum]).unwrap();
        for (i, &o) in out.iter().enumerate() {
            let want = if idx.contains(&(i as u32)) {
                a[i] + b[i]
            } else {
                0.0
            };
            assert_eq!(o, want, "index {i}");
        }
    }

    #[test]
    fn rank_seed_payloads_are_sparse_and_differ_between_ranks() {
        let c = codec(&[("seed", "rank")], 0.1);
        assert_eq!(c.properties().combine, Combine::Gather);
        let n = 1000;
        let x = data(n);
        let m0 = Meta::flat("w", n as u32, 0, 1);
        let m1 = Meta {
            rank_seed: 99,
            ..m0.clone()
        };
        let (p0, out) = round_trip(dynamic(c).as_ref(), &m0, &x).unwrap();
        assert_eq!(p0[0].len(), sparse::encoded_len(100));
        let kept: Vec<usize> = (0..n).filter(|&i| out[i] != 0.0).collect();
        assert_eq!(kept.len(), 100);
        assert!(kept.iter().all(|&i| out[i] == x[i]));
        assert_eq!(
            kept,
            c.indices(&m0)
                .iter()
                .map(|&i| i as usize)
                .collect::<Vec<_>>()
        );
        assert_ne!(c.indices(&m0), c.indices(&m1));
        assert_eq!(
            c.indices(&m0),
            sample(n as u32, 100, m0.rank_seed),
            "rank seed, not shared seed"
        );
    }

    #[test]
    fn unbiased_scale_multiplies_by_n_over_k() {
        let n = 1000;
        let x = data(n);
        let meta = Meta::flat("w", n as u32, 0, 3);
        for seed in ["shared", "rank"] {
            let c = codec(&[("seed", seed), ("scale", "unbiased")], 0.01);
            let out = round_trip(dynamic(c).as_ref(), &meta, &x).unwrap().1;
            for i in c.indices(&meta) {
                assert_eq!(out[i as usize], x[i as usize] * 100.0);
            }
            assert_eq!(out.iter().filter(|v| **v != 0.0).count(), 10);
        }
    }

    #[test]
    fn rejects_bad_lengths_payloads_and_parameters() {
        let meta = Meta::flat("w", 100, 0, 3);
        let shared = codec(&[], 0.1);
        assert!(
            shared
                .encode(&meta, &[0.0; 99], &[])
                .unwrap_err()
                .contains("99 floats")
        );
        let e = shared.decode(&meta, &[vec![0; 39]]).unwrap_err();
        assert!(e.starts_with("malformed payload"), "{e}");
        assert!(
            shared
                .decode(&meta, &[vec![0; 44]])
                .unwrap_err()
                .contains("trailing")
        );
        let rank = codec(&[("seed", "rank")], 0.1);
        let mut p = rank.encode(&meta, &data(100), &[]).unwrap();
        p[4..8].copy_from_slice(&100u32.to_le_bytes());
        assert!(
            rank.decode(&meta, &[p])
                .unwrap_err()
                .contains("outside the bucket")
        );
        let bad = |v: f64| {
            let given = vec![("density".into(), Value::Float(v))];
            RandomK::configure(&Params::resolve(&RandomK::info().params, given).unwrap())
                .unwrap_err()
        };
        assert_eq!(bad(0.0), "density must be in (0, 1], got 0");
        assert_eq!(bad(2.0), "density must be in (0, 1], got 2");
        let word = Params(vec![
            ("density".into(), Value::Float(0.1)),
            ("seed".into(), Value::Text("both".into())),
            ("scale".into(), Value::Text("none".into())),
        ]);
        assert_eq!(
            RandomK::configure(&word).unwrap_err(),
            "seed must be shared or rank, got 'both'"
        );
    }
}
