//! The straight line t(n) = α + n·β through timings of message sizes: pure arithmetic, with
//! no MPI, so it is tested on made-up points.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

/// A straight line t(n) = α + n·β fitted to (bytes, seconds) points, and how well it fits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// Intercept: seconds per message.
    pub alpha: f64,
    /// Slope: seconds per byte.
    pub beta: f64,
    /// 1 − Σ(t − fit)² / Σ(t − mean t)², on the seconds as measured.
    pub r_squared: f64,
    /// Root mean square of measured/fitted − 1 over the points.
    pub rms_relative_residual: f64,
    /// Largest |measured/fitted − 1| over the points.
    pub max_relative_residual: f64,
    /// Whether α came out negative and was held at 0.
    pub alpha_clamped: bool,
}

impl Fit {
    /// The fitted seconds at `bytes`.
    pub fn at(&self, bytes: f64) -> f64 {
        self.alpha + bytes * self.beta
    }
}

/// Fits t(n) = α + n·β to `(bytes, seconds)` points in two stages.
///
/// Sizes span 0 B to megabytes, times four or more decades, and no one straight line runs
/// through every regime (eager and rendezvous protocols, caches, a token bucket's burst). What
/// the model needs is the latency of small messages and the sustained bandwidth of large ones:
///
/// 1. β is the slope of ordinary least squares over all points, which the largest sizes
///    dominate: the per-byte cost a large all-reduce pays.
/// 2. α is then fitted on the latency-bound sizes (n·β at most a tenth of t; every size if
///    none is) by least squares on relative residuals, min Σ((t − α − nβ)/t)², i.e. the mean of
///    t − n·β weighted by 1/t². Timing noise grows with the time, so in one least-squares line
///    a 1% wobble of a 16 MiB transfer (milliseconds) swamps a microsecond α, whose intercept
///    comes out as noise, often negative; here only the sizes whose time is mostly α set it.
///
/// A negative α all the same is held at 0 (flagged in the fit). Refuses fewer than two
/// distinct sizes, times that are not positive and finite, and times that do not grow with
/// size (β ≤ 0).
pub fn fit(points: &[(f64, f64)]) -> Result<Fit> {
    for &(n, t) in points {
        anyhow::ensure!(
            n.is_finite() && n >= 0.0,
            "cannot fit α, β: message size {n} is not a byte count"
        );
        anyhow::ensure!(
            t.is_finite() && t > 0.0,
            "cannot fit α, β: time {t} s at {n} bytes is not a positive duration"
        );
    }
    let mut sizes: Vec<f64> = points.iter().map(|p| p.0).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    if sizes.len() < 2 {
        bail!(
            "cannot fit α, β: need times at two or more distinct message sizes, got {} point(s) at {} size(s)",
            points.len(),
            sizes.len()
        );
    }
    let k = points.len() as f64;
    let mean_n = points.iter().map(|p| p.0).sum::<f64>() / k;
    let mean_t = points.iter().map(|p| p.1).sum::<f64>() / k;
    let beta = points
        .iter()
        .map(|&(n, t)| (n - mean_n) * (t - mean_t))
        .sum::<f64>()
        / points
            .iter()
            .map(|&(n, _)| (n - mean_n).powi(2))
            .sum::<f64>();
    if !(beta.is_finite() && beta > 0.0) {
        bail!(
            "cannot fit α, β: the times do not grow with message size (slope {beta:e} s/B); \
             measure larger sizes (--sizes) with more repetitions (--reps), or on a machine \
             whose cores the ranks do not share with other work"
        );
    }
    let latency_bound: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|&(n, t)| n * beta <= 0.1 * t)
        .collect();
    let basis = if latency_bound.is_empty() {
        points
    } else {
        &latency_bound[..]
    };
    let w = |t: f64| 1.0 / (t * t);
    let alpha = basis
        .iter()
        .map(|&(n, t)| w(t) * (t - n * beta))
        .sum::<f64>()
        / basis.iter().map(|&(_, t)| w(t)).sum::<f64>();
    let alpha_clamped = alpha < 0.0;
    let alpha = alpha.max(0.0);
    let fit = Fit {
        alpha,
        beta,
        r_squared: 0.0,
        rms_relative_residual: 0.0,
        max_relative_residual: 0.0,
        alpha_clamped,
    };
    let ss_res: f64 = points.iter().map(|&(n, t)| (t - fit.at(n)).powi(2)).sum();
    let ss_tot: f64 = points.iter().map(|&(_, t)| (t - mean_t).powi(2)).sum();
    let rel: Vec<f64> = points.iter().map(|&(n, t)| t / fit.at(n) - 1.0).collect();
    Ok(Fit {
        r_squared: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            1.0
        },
        rms_relative_residual: (rel.iter().map(|r| r * r).sum::<f64>() / rel.len() as f64).sqrt(),
        max_relative_residual: rel.iter().fold(0.0f64, |m, r| m.max(r.abs())),
        ..fit
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: [f64; 9] = [
        0.0, 8.0, 512.0, 4096.0, 32768.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    ];

    fn line(alpha: f64, beta: f64, noise: impl Fn(usize) -> f64) -> Vec<(f64, f64)> {
        SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| (n, (alpha + n * beta) * (1.0 + noise(i))))
            .collect()
    }

    #[test]
    fn exact_points_give_back_alpha_and_beta() {
        let f = fit(&line(3e-6, 8e-9, |_| 0.0)).unwrap();
        assert!((f.alpha / 3e-6 - 1.0).abs() < 1e-9, "{f:?}");
        assert!((f.beta / 8e-9 - 1.0).abs() < 1e-9, "{f:?}");
        assert!(f.r_squared > 1.0 - 1e-12 && f.max_relative_residual < 1e-9);
        assert!(!f.alpha_clamped);
    }

    #[test]
    fn alpha_comes_from_the_small_sizes_where_plain_least_squares_loses_it() {
        // ±2% noise, alternating: at 16 MiB that is 2.7 ms against α = 3 µs.
        let noisy = line(3e-6, 8e-9, |i| if i % 2 == 0 { 0.02 } else { -0.02 });
        let f = fit(&noisy).unwrap();
        assert!((f.alpha / 3e-6 - 1.0).abs() < 0.05, "{f:?}");
        assert!((f.beta / 8e-9 - 1.0).abs() < 0.05, "{f:?}");
        assert!((f.rms_relative_residual - 0.02).abs() < 0.01, "{f:?}");
        // Ordinary least squares on the same points: α is off by orders of magnitude.
        let k = noisy.len() as f64;
        let (mn, mt) = (
            noisy.iter().map(|p| p.0).sum::<f64>() / k,
            noisy.iter().map(|p| p.1).sum::<f64>() / k,
        );
        let b = noisy.iter().map(|p| (p.0 - mn) * (p.1 - mt)).sum::<f64>()
            / noisy.iter().map(|p| (p.0 - mn).powi(2)).sum::<f64>();
        let ols_alpha = mt - b * mn;
        assert!((ols_alpha / 3e-6 - 1.0).abs() > 10.0, "{ols_alpha:e}");
    }

    #[test]
    fn a_negative_intercept_is_held_at_zero() {
        // t = n·β exactly, then the smallest sizes measured a little fast.
        let mut pts = line(0.0, 1e-9, |_| 0.0);
        pts.retain(|p| p.0 > 0.0);
        pts[0].1 *= 0.5;
        let f = fit(&pts).unwrap();
        assert!(f.alpha_clamped && f.alpha == 0.0 && f.beta > 0.0, "{f:?}");
    }

    #[test]
    fn a_burst_at_middle_sizes_bends_neither_alpha_nor_beta() {
        // One way across a 1 Gbit/s token bucket (8 ns/B) with a 128 KB burst, as measured on
        // the emulated cluster: 4 KiB to 256 KiB go faster than the sustained rate.
        let pts = [
            (0.0, 18.39e-6),
            (8.0, 18.31e-6),
            (512.0, 18.61e-6),
            (4096.0, 24.93e-6),
            (32768.0, 136.96e-6),
            (262144.0, 1217.52e-6),
            (1048576.0, 7817.00e-6),
            (4194304.0, 34164.60e-6),
        ];
        let f = fit(&pts).unwrap();
        assert!((f.alpha / 18.35e-6 - 1.0).abs() < 0.02, "{f:?}");
        assert!((f.beta / 8e-9 - 1.0).abs() < 0.05, "{f:?}");
        assert!((f.at(4194304.0) / 34164.60e-6 - 1.0).abs() < 0.01, "{f:?}");
    }

    #[test]
    fn degenerate_inputs_are_refused_with_the_reason() {
        let one_size = fit(&[(1024.0, 1e-6), (1024.0, 1.1e-6)]).unwrap_err();
        assert!(
            one_size
                .to_string()
                .contains("two or more distinct message sizes"),
            "{one_size}"
        );
        assert!(fit(&[]).is_err());
        let flat = fit(&[(8.0, 1e-6), (1e6, 1e-6)]).unwrap_err();
        assert!(flat.to_string().contains("do not grow"), "{flat}");
        let zero = fit(&[(8.0, 0.0), (1e6, 1e-3)]).unwrap_err();
        assert!(zero.to_string().contains("positive duration"), "{zero}");
        assert!(fit(&[(f64::NAN, 1e-6), (1e6, 1e-3)]).is_err());
    }
}
