//! The medians and spreads the benchmarks report of repeated timings, defined once so every
//! table means the same by "median".

use std::time::Instant;

/// The median of `values`: the middle of the sorted values, the upper of the two middle ones
/// for an even count. Panics on no values.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median of per-round averages: runs `round` `rounds` times (after one warm-up round) and
/// returns the median nanoseconds per item, where each round processes `items` items.
pub fn median_ns_per_item(rounds: usize, items: usize, round: impl FnMut()) -> f64 {
    ns_per_item(rounds, items, round).p50
}

/// The spread of per-round averages in nanoseconds per item.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// The fastest round.
    pub min: f64,
    /// The median round.
    pub p50: f64,
    /// The round 90% of the rounds are at most as slow as.
    pub p90: f64,
}

impl Spread {
    /// The fastest, median and 90th-percentile of per-round figures (sorted in place).
    /// Panics on none.
    pub fn of(per_item: &mut [f64]) -> Spread {
        per_item.sort_by(f64::total_cmp);
        let at = |q: f64| per_item[((per_item.len() - 1) as f64 * q).round() as usize];
        Spread {
            min: per_item[0],
            p50: median(per_item.iter().copied()),
            p90: at(0.9),
        }
    }
}

/// Like [`median_ns_per_item`], with the fastest round and the 90th percentile: a single call
/// is too short to time on its own (`Instant::now` costs about as much), so each figure is a
/// round's mean.
pub fn ns_per_item(rounds: usize, items: usize, mut round: impl FnMut()) -> Spread {
    round();
    let mut per_item: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = Instant::now();
            round();
            start.elapsed().as_nanos() as f64 / items.max(1) as f64
        })
        .collect();
    Spread::of(&mut per_item)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_and_the_upper_middle_of_an_even_count() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        let s = Spread::of(&mut [5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!((s.min, s.p50, s.p90), (1.0, 3.0, 5.0));
    }
}
