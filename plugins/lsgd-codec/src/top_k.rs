//! `top-k`: keep the k = max(1, ⌈density·n⌉) elements of largest magnitude (Aji & Heafield
//! 2017; Stich et al. 2018), sent as a [sparse] payload and all-gathered.
//!
//! Exactly k elements are kept. Magnitudes are compared through their bit patterns
//! ([`sparse::key`]), so ties are exact and broken by the lower index, and a NaN counts as
//! larger than any number: it is always kept and reaches the decoded gradient, as it would
//! with `identity` (the codec neither hides nor rejects it).
//!
//! Selection is O(n) without a sort. A strided sample of the keys gives a floor `lo` a few
//! standard deviations below where the k-th largest key should be; one vectorised pass
//! ([`sparse::collect_at_least`]) collects the indices with key ≥ `lo` (about 2·k of them for
//! smooth data), `select_nth_unstable` finds the exact k-th largest key `t` among those, and a
//! walk over the candidates, already in index order, keeps keys > `t` plus the first ties at
//! `t`. Should the sample's floor be too high (fewer than k candidates: rare, and only on
//! data structured at the sample's stride), the pass is repeated with lower floors down to
//! "every nonzero element"; if even that gives fewer than k, the rest are the first zeros.

use crate::sparse::{self, key};
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// Keys sampled to place the candidate floor.
const SAMPLE: usize = 4096;

/// Keeps the k largest magnitudes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopK {
    /// Fraction of elements kept, in (0, 1].
    pub density: f64,
}

impl Policy for TopK {
    fn info() -> Info {
        Info::new(
            "top-k",
            "Top-k sparsification: the k = max(1, ceil(density*n)) largest |x| as index+value pairs, all-gathered",
            vec![ParamSpec::float(
                "density",
                0.01,
                "fraction of elements kept, in (0, 1]",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        Ok(TopK {
            density: sparse::density_param(p, "density")?,
        })
    }
}

impl Codec for TopK {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        crate::wire::check_len(meta, data)?;
        let k = sparse::count_for(self.density, data.len());
        Ok(sparse::encode(data, &select(data, k), 1.0))
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        crate::wire::expect_rounds(payloads, 1)?;
        sparse::decode(&payloads[0], meta.len)
    }
}

/// The indices of the `k` largest keys of `data`, ascending; ties go to the lower index.
pub fn select(data: &[f32], k: usize) -> Vec<u32> {
    let n = data.len();
    if k >= n {
        return (0..n as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let mut floors = Floors::new(data, k);
    let mut cand = Vec::with_capacity(4 * k);
    loop {
        let lo = floors.next();
        cand.clear();
        sparse::collect_at_least(data, lo, &mut cand);
        if cand.len() >= k {
            return pick(data, &cand, lo, k);
        }
        if lo == 1 {
            // Fewer than k nonzero elements: all of them, then the first zeros.
            return with_zeros(data, k);
        }
    }
}

/// The `k` largest of `cand` (ascending indices of every key ≥ `lo`, at least `k` of them).
fn pick(data: &[f32], cand: &[u32], lo: u32, k: usize) -> Vec<u32> {
    let mut keys: Vec<u32> = cand.iter().map(|&i| key(data[i as usize])).collect();
    let above_lo = keys.iter().filter(|&&x| x > lo).count();
    // Fewer than k keys above the floor: the floor itself is the k-th largest key. This is
    // what keeps data with a huge tie (a constant bucket) from a select over every element.
    let t = if above_lo < k {
        lo
    } else {
        // The k-th largest is the (c − k)-th smallest; the natural order needs no comparator.
        let c = keys.len();
        *keys.select_nth_unstable(c - k).1
    };
    let greater = if t == lo {
        above_lo
    } else {
        keys.iter().filter(|&&x| x > t).count()
    };
    let mut ties = k - greater;
    let mut out = vec![0u32; k];
    let mut m = 0;
    for &i in cand {
        let x = key(data[i as usize]);
        let take = x > t || (x == t && ties > 0);
        if take {
            ties -= usize::from(x == t);
            out[m] = i;
            m += 1;
            if m == k {
                break;
            }
        }
    }
    debug_assert_eq!(m, k);
    out
}

/// Every nonzero element of `data` (fewer than `k`) and the lowest-indexed zeros up to `k`.
fn with_zeros(data: &[f32], k: usize) -> Vec<u32> {
    let nonzero = data.iter().filter(|&&x| key(x) != 0).count();
    let mut zeros = k - nonzero;
    let mut out = Vec::with_capacity(k);
    for (i, &x) in data.iter().enumerate() {
        if key(x) != 0 {
            out.push(i as u32);
        } else if zeros > 0 {
            zeros -= 1;
            out.push(i as u32);
        }
        if out.len() == k {
            break;
        }
    }
    out
}

/// Candidate floors, highest first: keys that at least `k` elements very probably reach,
/// read off a strided sample, each further down than the last, and finally 1 (every nonzero
/// element; zeros are never candidates, so a mostly-zero gradient costs one pass).
struct Floors {
    sample: Vec<u32>,
    /// Rank in the sample (from the top) of the next floor.
    j: usize,
}

impl Floors {
    fn new(data: &[f32], k: usize) -> Floors {
        let n = data.len();
        if n < 8 * SAMPLE {
            // Small: sampling would not pay.
            return Floors {
                sample: Vec::new(),
                j: 0,
            };
        }
        // The sample holds about e = k·SAMPLE/n of the top k; going 4√e + 4 further down
        // leaves a miss probability far below 1e-6 for data without structure at the
        // sample's stride. A miss only costs another pass.
        let e = k as f64 * SAMPLE as f64 / n as f64;
        Floors {
            sample: (0..SAMPLE).map(|i| key(data[i * n / SAMPLE])).collect(),
            j: (e + 4.0 * e.sqrt() + 4.0).ceil() as usize,
        }
    }

    fn next(&mut self) -> u32 {
        if self.j >= self.sample.len() {
            return 1;
        }
        let j = self.j;
        self.j *= 4;
        let last = self.sample.len() - 1;
        (*self.sample.select_nth_unstable(last - j).1).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::put_u32s;
    use crate::{Value, dynamic, round_trip};

    fn codec(density: f64) -> TopK {
        let p = Params::resolve(
            &TopK::info().params,
            vec![("density".into(), Value::Float(density))],
        )
        .unwrap();
        TopK::configure(&p).unwrap()
    }

    /// The specification by sorting: largest |x| first, lower index first among equals.
    fn reference(data: &[f32], k: usize) -> Vec<u32> {
        let mut order: Vec<u32> = (0..data.len() as u32).collect();
        order.sort_by(|&a, &b| {
            key(data[b as usize])
                .cmp(&key(data[a as usize]))
                .then(a.cmp(&b))
        });
        let mut top = order[..k].to_vec();
        top.sort_unstable();
        top
    }

    fn random(n: usize, seed: u64, levels: u32) -> Vec<f32> {
        let mut rng = crate::rng::Rng::new(seed);
        (0..n)
            .map(|_| {
                if levels > 0 {
                    // Few distinct magnitudes: many ties, both signs.
                    let v = rng.below(levels) as f32 * 0.25;
                    if rng.below(2) == 0 { v } else { -v }
                } else {
                    rng.normal()
                }
            })
            .collect()
    }

    #[test]
    fn keeps_exactly_the_k_largest_magnitudes() {
        for (n, seed, levels) in [
            (10, 1, 0),
            (1000, 2, 0),
            (1000, 3, 5),
            (40_000, 4, 0),   // above the sampling cut-off
            (100_003, 5, 0),  // ragged tail
            (100_000, 6, 40), // ties at the threshold, sampled
            (100_000, 7, 2),  // half zeros: the floor falls to 1
        ] {
            let data = random(n, seed, levels);
            for density in [1e-6, 0.001, 0.01, 0.1, 0.5, 1.0] {
                let k = sparse::count_for(density, n);
                let got = select(&data, k);
                assert_eq!(got.len(), k);
                assert_eq!(
                    got,
                    reference(&data, k),
                    "n {n} seed {seed} density {density}"
                );
            }
        }
    }

    #[test]
    fn zeros_and_huge_ties() {
        let n = 100_000;
        let mut rng = crate::rng::Rng::new(11);
        // 0.2% nonzero (fewer than k at density 0.01): every nonzero, then the first zeros,
        // -0.0 counting as a zero.
        let sparse_grad: Vec<f32> = (0..n)
            .map(|i| match rng.below(1000) {
                0 | 1 => rng.normal(),
                2 if i % 2 == 0 => -0.0,
                _ => 0.0,
            })
            .collect();
        // Constant: the sample's floor is the k-th largest key itself.
        let constant = vec![-0.5f32; n];
        // Two levels, the upper one shorter than k.
        let steps: Vec<f32> = (0..n)
            .map(|i| if i % 211 == 0 { 2.0 } else { 1.0 })
            .collect();
        for data in [&sparse_grad, &constant, &steps] {
            for density in [0.001, 0.01, 0.3] {
                let k = sparse::count_for(density, n);
                assert_eq!(select(data, k), reference(data, k), "density {density}");
            }
        }
        assert_eq!(select(&[0.0; 5], 2), vec![0, 1]);
    }

    #[test]
    fn a_sample_fooled_by_structure_still_gives_the_exact_answer() {
        // Large values exactly at the sampled positions: the sample's floor sits above the
        // true threshold, so the fallback pass must run.
        let n = 8 * SAMPLE * 4;
        let mut data = vec![0.001f32; n];
        for i in 0..SAMPLE {
            data[i * n / SAMPLE] = 10.0;
        }
        for (i, x) in data.iter_mut().enumerate().skip(5).step_by(97) {
            *x = 1.0 + i as f32 * 1e-6;
        }
        let k = 2 * SAMPLE;
        assert_eq!(select(&data, k), reference(&data, k));
    }

    #[test]
    fn round_trip_payload_and_values() {
        let data = [0.1f32, -5.0, 0.3, 4.0, -0.2, 0.0, 4.0, -4.0];
        let meta = Meta::flat("w", 8, 0, 1);
        let c = codec(0.3); // k = ceil(2.4) = 3
        let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), sparse::encoded_len(3));
        // Three of |x| = 4 tie for two places: indices 3 and 6 win over 7.
        assert_eq!(out, vec![0.0, -5.0, 0.0, 4.0, 0.0, 0.0, 4.0, 0.0]);
        let idx = &payloads[0][4..16];
        let mut want = Vec::new();
        put_u32s(&mut want, &[1, 3, 6]);
        assert_eq!(idx, &want[..]);
    }

    #[test]
    fn nan_counts_as_the_largest_magnitude() {
        let data = [1.0f32, f32::NAN, -f32::INFINITY, 2.0];
        let meta = Meta::flat("w", 4, 0, 1);
        let out = round_trip(dynamic(codec(0.5)).as_ref(), &meta, &data)
            .unwrap()
            .1;
        assert!(out[1].is_nan());
        assert_eq!(out[2], f32::NEG_INFINITY);
        assert_eq!((out[0], out[3]), (0.0, 0.0));
    }

    #[test]
    fn rejects_bad_lengths_payloads_and_parameters() {
        let c = codec(0.5);
        let meta = Meta::flat("w", 4, 0, 1);
        let e = c.encode(&meta, &[1.0; 3], &[]).unwrap_err();
        assert_eq!(e, "encode got 3 floats for a bucket of 4");
        let good = c.encode(&meta, &[1.0, 2.0, 3.0, 4.0], &[]).unwrap();
        assert!(
            c.decode(&meta, &[good[..good.len() - 1].to_vec()])
                .unwrap_err()
                .starts_with("malformed payload")
        );
        assert!(c.decode(&meta, &[]).unwrap_err().contains("1 payload"));
        let mut out_of_range = good.clone();
        out_of_range[8..12].copy_from_slice(&4u32.to_le_bytes());
        assert!(
            c.decode(&meta, &[out_of_range])
                .unwrap_err()
                .contains("outside the bucket")
        );
        let mut descending = good.clone();
        descending[4..8].copy_from_slice(&3u32.to_le_bytes());
        assert!(
            c.decode(&meta, &[descending])
                .unwrap_err()
                .contains("not above")
        );
        for bad in [0.0, 1.01, -1.0] {
            let p = Params::resolve(
                &TopK::info().params,
                vec![("density".into(), Value::Float(bad))],
            )
            .unwrap();
            assert_eq!(
                TopK::configure(&p).unwrap_err(),
                format!("density must be in (0, 1], got {bad}")
            );
        }
        assert_eq!(TopK::info().name, "top-k");
    }
}
