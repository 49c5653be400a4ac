//! `lsgd-host bench calibrate`: the α-β-γ model's machine parameters, fitted from
//! measurements, for `simulate --model` and `bench allreduce --model`.
//!
//! Ranks are grouped by host name. Between rank 0 and the first rank on another host (the
//! inter-host link: α, β) and between two ranks on one host (α_intra, β_intra), every message
//! size is timed two ways, each the median of several repetitions:
//!
//! - one way: half a ping-pong's round trip (one direction busy at a time);
//! - exchange: both ranks send the size to each other at once (MPI_Sendrecv).
//!
//! The model charges a step in which a rank sends and receives at once one α + m·β (every step
//! of the ring, halving-doubling and the torus is such a step), so the parameters it is given
//! are the exchange's fit. On a full-duplex link the two fits agree (the printed duplex ratio,
//! exchange β / one-way β, is about 1); where both directions share one resource (a half-duplex
//! link, or shared memory, where both copies go through one memory bus) it is up to 2, and the
//! one-way β would predict the algorithms too fast.
//!
//! With every rank on one host there is no inter-host link: the only link there is (shared
//! memory) is calibrated, reported as intra-host, and also given as α, β, so the model predicts
//! that machine. With one rank per host, α_intra and β_intra are α and β. γ is the median time
//! of the f32 addition every algorithm reduces with, per byte, on rank 0.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::stats::median;
use crate::collective::World;
use crate::collective::calibrate::time_additions;
use crate::collective::cost::CostModel;

/// The model's machine parameters: what `bench calibrate` writes (among more) and
/// `simulate --model` / `bench allreduce --model` read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Seconds per message between hosts.
    pub alpha: f64,
    /// Seconds per byte between hosts.
    pub beta: f64,
    /// Seconds per byte added.
    pub gamma: f64,
    /// Seconds per message inside a host.
    pub alpha_intra: f64,
    /// Seconds per byte inside a host.
    pub beta_intra: f64,
    /// The most ranks on one host.
    pub ranks_per_node: usize,
}

impl Machine {
    /// Reads a model file (`bench calibrate --out`'s JSON; keys other than the six parameters
    /// are ignored, so a hand-written file needs only those).
    pub fn load(path: &Path) -> Result<Machine> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the model file {}", path.display()))?;
        let m: Machine = serde_json::from_str(&text).with_context(|| {
            format!(
                "model file {}: expected JSON with alpha, beta, gamma, alpha_intra, beta_intra \
                 and ranks_per_node (what `lsgd-host bench calibrate --out` writes)",
                path.display()
            )
        })?;
        m.check()
            .with_context(|| format!("model file {}", path.display()))?;
        Ok(m)
    }

    /// Refuses parameters no machine has (negative or infinite times, no ranks per node).
    pub fn check(&self) -> Result<()> {
        for (name, v) in [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("gamma", self.gamma),
            ("alpha_intra", self.alpha_intra),
            ("beta_intra", self.beta_intra),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{name} must be a finite number of seconds ≥ 0, got {v}"
            );
        }
        anyhow::ensure!(
            self.ranks_per_node >= 1,
            "ranks_per_node must be at least 1"
        );
        Ok(())
    }

    /// The cost model of these parameters with a torus grid (`None`: near-square).
    pub fn cost_model(&self, torus_shape: Option<(usize, usize)>) -> CostModel {
        CostModel {
            alpha: self.alpha,
            beta: self.beta,
            gamma: self.gamma,
            alpha_intra: self.alpha_intra,
            beta_intra: self.beta_intra,
            ranks_per_node: self.ranks_per_node,
            torus_shape,
        }
    }

    /// The parameters as `lsgd-host simulate` flags (four significant digits).
    pub fn simulate_flags(&self) -> String {
        format!(
            "--alpha {:.3e} --beta {:.3e} --gamma {:.3e} --alpha-intra {:.3e} --beta-intra {:.3e} \
             --ranks-per-node {}",
            self.alpha,
            self.beta,
            self.gamma,
            self.alpha_intra,
            self.beta_intra,
            self.ranks_per_node
        )
    }
}

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

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// Timed repetitions per size; `None`: from 51 at small sizes down to 5 at 8 MiB and above.
    pub reps: Option<usize>,
    /// Untimed repetitions per size first.
    pub warmup: usize,
    /// Bytes of the vectors added to time γ.
    pub gamma_bytes: usize,
}

/// One message size on one link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Bytes per message.
    pub bytes: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Median one-way seconds (half the round trip).
    pub one_way_s: f64,
    /// Median seconds of a two-way exchange.
    pub exchange_s: f64,
}

/// A link between two ranks, measured and fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// The two ranks (the first starts each ping-pong).
    pub ranks: [usize; 2],
    /// Their hosts.
    pub hosts: [String; 2],
    /// Every size measured.
    pub points: Vec<Point>,
    /// The fit of the one-way times.
    pub one_way: Fit,
    /// The fit of the exchange times: the model's α and β.
    pub exchange: Fit,
    /// exchange β / one-way β: about 1 on a full-duplex link, up to 2 where the directions
    /// share it.
    pub duplex_ratio: f64,
}

/// The f32 additions timed for γ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Addition {
    /// Bytes of each vector.
    pub bytes: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Median seconds of one `a[i] += b[i]` pass.
    pub seconds: f64,
}

/// Everything `bench calibrate` measured; its JSON has the [`Machine`] parameters at the top
/// level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The fitted parameters.
    #[serde(flatten)]
    pub machine: Machine,
    /// Ranks in the world.
    pub ranks: usize,
    /// Each rank's host, in rank order.
    pub hosts: Vec<String>,
    /// Rank 0 and the first rank on another host; `None` with every rank on one host.
    pub inter: Option<Link>,
    /// Two ranks on one host; `None` with one rank per host.
    pub intra: Option<Link>,
    /// The γ measurement.
    pub addition: Addition,
    /// What was assumed where a link was missing.
    pub notes: Vec<String>,
}

fn default_reps(bytes: usize) -> usize {
    ((1usize << 25) / bytes.max(1)).clamp(5, 50) | 1
}

/// The pairs to measure: rank 0 and the first rank on another host; two ranks on one host
/// (rank 0 and its first neighbour, else the first two ranks sharing a host).
pub fn pairs(hosts: &[String]) -> (Option<[usize; 2]>, Option<[usize; 2]>) {
    let inter = (1..hosts.len())
        .find(|&r| hosts[r] != hosts[0])
        .map(|r| [0, r]);
    let intra = (0..hosts.len()).find_map(|a| {
        (a + 1..hosts.len())
            .find(|&b| hosts[b] == hosts[a])
            .map(|b| [a, b])
    });
    (inter, intra)
}

/// The most ranks on one host.
pub fn ranks_per_node(hosts: &[String]) -> usize {
    hosts
        .iter()
        .map(|h| hosts.iter().filter(|g| *g == h).count())
        .max()
        .unwrap_or(1)
}

fn measure_link(world: &World, setup: &Setup, ranks: [usize; 2], hosts: &[String]) -> Result<Link> {
    let pair = (ranks[0], ranks[1]);
    let mut points = Vec::with_capacity(setup.sizes.len());
    for &bytes in &setup.sizes {
        let reps = setup.reps.unwrap_or_else(|| default_reps(bytes)).max(1);
        world.barrier();
        let round_trips = world.ping_pong(pair, bytes, setup.warmup, reps)?;
        world.barrier();
        let exchanges = world.exchange_both_ways(pair, bytes, setup.warmup, reps)?;
        points.push(Point {
            bytes,
            reps,
            one_way_s: median(round_trips) / 2.0,
            exchange_s: median(exchanges),
        });
    }
    let of = |f: fn(&Point) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|p| (p.bytes as f64, f(p))).collect()
    };
    let link = format!(
        "rank {} ({}) ↔ rank {} ({})",
        ranks[0], hosts[ranks[0]], ranks[1], hosts[ranks[1]]
    );
    let one_way = fit(&of(|p| p.one_way_s)).with_context(|| format!("{link}, one way"))?;
    let exchange = fit(&of(|p| p.exchange_s)).with_context(|| format!("{link}, exchange"))?;
    Ok(Link {
        ranks,
        hosts: [hosts[ranks[0]].clone(), hosts[ranks[1]].clone()],
        points,
        one_way,
        exchange,
        duplex_ratio: exchange.beta / one_way.beta,
    })
}

/// Measures and fits (collective; at least 2 ranks); every rank returns the same calibration
/// (γ timed on rank 0).
pub fn run(world: &World, setup: &Setup) -> Result<Calibration> {
    anyhow::ensure!(
        world.size() >= 2,
        "bench calibrate measures links between ranks: run it under mpirun with 2 or more \
         (mpirun -np 2 lsgd-host bench calibrate)"
    );
    anyhow::ensure!(!setup.sizes.is_empty(), "--sizes names no message size");
    let hosts = world.hostnames()?;
    let (inter_pair, intra_pair) = pairs(&hosts);
    let inter = inter_pair
        .map(|p| measure_link(world, setup, p, &hosts))
        .transpose()?;
    let intra = intra_pair
        .map(|p| measure_link(world, setup, p, &hosts))
        .transpose()?;
    let mut notes = Vec::new();
    let (alpha, beta) = match (&inter, &intra) {
        (Some(l), _) => (l.exchange.alpha, l.exchange.beta),
        (None, Some(l)) => {
            notes.push(format!(
                "all {} ranks are on one host ({}): there is no inter-host link, so α and β \
                 are the intra-host link's",
                hosts.len(),
                hosts[0]
            ));
            (l.exchange.alpha, l.exchange.beta)
        }
        (None, None) => unreachable!("two or more ranks share a host or are on two"),
    };
    let (alpha_intra, beta_intra) = match &intra {
        Some(l) => (l.exchange.alpha, l.exchange.beta),
        None => {
            notes.push("no two ranks share a host: α_intra and β_intra are α and β".to_string());
            (alpha, beta)
        }
    };
    world.barrier();
    let floats = (setup.gamma_bytes / size_of::<f32>()).max(1);
    let add_reps = 7;
    let mut add = vec![0.0; add_reps];
    if world.is_root() {
        add = time_additions(floats, add_reps);
    }
    // Rank 0's times to every rank (the others contributed zeros).
    world.all_reduce_max_f64(&mut add)?;
    let addition = Addition {
        bytes: floats * size_of::<f32>(),
        reps: add_reps,
        seconds: median(add),
    };
    let machine = Machine {
        alpha,
        beta,
        gamma: addition.seconds / addition.bytes as f64,
        alpha_intra,
        beta_intra,
        ranks_per_node: ranks_per_node(&hosts),
    };
    Ok(Calibration {
        machine,
        ranks: hosts.len(),
        hosts,
        inter,
        intra,
        addition,
        notes,
    })
}

/// The measurements and fits as tables, and the parameters as `simulate` flags.
pub fn print(cal: &Calibration, mut out: impl Write) -> Result<()> {
    let (hosts, layout) = layout(&cal.hosts);
    writeln!(
        out,
        "# calibrate: {} ranks on {hosts} host(s) ({layout}); ranks per node {}",
        cal.ranks, cal.machine.ranks_per_node
    )?;
    writeln!(
        out,
        "# one-way = half a ping-pong round trip; exchange = both ranks send at once \
         (MPI_Sendrecv); medians; fit = α + n·β, β the least-squares slope (set by the large \
         sizes), α from the latency-bound sizes"
    )?;
    for (name, link) in [("inter-host", &cal.inter), ("intra-host", &cal.intra)] {
        if let Some(l) = link {
            print_link(name, l, &mut out)?;
        }
    }
    writeln!(
        out,
        "\n# γ: f32 a[i] += b[i] over {} B in {:.1} us (median of {}, rank 0): {:.3e} s/B ({:.2} GB/s)",
        cal.addition.bytes,
        cal.addition.seconds * 1e6,
        cal.addition.reps,
        cal.machine.gamma,
        1e-9 / cal.machine.gamma
    )?;
    for note in &cal.notes {
        writeln!(out, "# note: {note}")?;
    }
    writeln!(
        out,
        "# as simulate flags (or --model FILE with --out FILE):"
    )?;
    writeln!(out, "{}", cal.machine.simulate_flags())?;
    Ok(())
}

/// How many hosts the ranks are on, and which ranks each holds (`vm: 0,1; h2: 2`).
fn layout(hosts: &[String]) -> (usize, String) {
    let mut by_host: Vec<(&str, Vec<usize>)> = Vec::new();
    for (r, h) in hosts.iter().enumerate() {
        match by_host.iter_mut().find(|(name, _)| name == h) {
            Some((_, ranks)) => ranks.push(r),
            None => by_host.push((h, vec![r])),
        }
    }
    let layout: Vec<String> = by_host
        .iter()
        .map(|(h, rs)| {
            let rs: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
            format!("{h}: {}", rs.join(","))
        })
        .collect();
    (by_host.len(), layout.join("; "))
}

/// One link's measurements against its fits, the fits and its duplex ratio.
fn print_link(name: &str, l: &Link, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "\n## {name} link: rank {} ({}) ↔ rank {} ({})",
        l.ranks[0], l.hosts[0], l.ranks[1], l.hosts[1]
    )?;
    writeln!(
        out,
        "{:>10} {:>5} {:>12} {:>12} {:>7} {:>13} {:>12} {:>7}",
        "bytes", "reps", "one-way(us)", "fit(us)", "ratio", "exchange(us)", "fit(us)", "ratio"
    )?;
    for p in &l.points {
        let (fo, fe) = (l.one_way.at(p.bytes as f64), l.exchange.at(p.bytes as f64));
        writeln!(
            out,
            "{:>10} {:>5} {:>12.2} {:>12.2} {:>7.3} {:>13.2} {:>12.2} {:>7.3}",
            p.bytes,
            p.reps,
            p.one_way_s * 1e6,
            fo * 1e6,
            p.one_way_s / fo,
            p.exchange_s * 1e6,
            fe * 1e6,
            p.exchange_s / fe
        )?;
    }
    for (what, f) in [("one-way ", &l.one_way), ("exchange", &l.exchange)] {
        writeln!(
            out,
            "# {what}: α = {:.3e} s, β = {:.3e} s/B ({:.3} GB/s); R² = {:.6}, relative \
             residuals rms {:.1}%, max {:.1}%{}",
            f.alpha,
            f.beta,
            1e-9 / f.beta,
            f.r_squared,
            100.0 * f.rms_relative_residual,
            100.0 * f.max_relative_residual,
            if f.alpha_clamped {
                " (negative intercept held at α = 0)"
            } else {
                ""
            }
        )?;
    }
    writeln!(
        out,
        "# duplex: exchange β / one-way β = {:.2} (about 1: full duplex; up to 2: both \
         directions share the link); the model takes the exchange fit (a step that sends \
         and receives at once costs α + m·β)",
        l.duplex_ratio
    )?;
    Ok(())
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

    #[test]
    fn pairs_and_ranks_per_node_follow_the_hosts() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pairs(&h(&["a", "a"])), (None, Some([0, 1])));
        assert_eq!(pairs(&h(&["a", "b"])), (Some([0, 1]), None));
        assert_eq!(
            pairs(&h(&["a", "a", "b", "b"])),
            (Some([0, 2]), Some([0, 1]))
        );
        assert_eq!(
            pairs(&h(&["a", "b", "c", "b"])),
            (Some([0, 1]), Some([1, 3]))
        );
        assert_eq!(ranks_per_node(&h(&["a", "b", "b", "b", "a"])), 3);
    }

    fn sample() -> Calibration {
        let f = fit(&line(2e-6, 1e-9, |_| 0.0)).unwrap();
        let link = Link {
            ranks: [0, 1],
            hosts: ["h1".into(), "h1".into()],
            points: vec![Point {
                bytes: 8,
                reps: 51,
                one_way_s: 2e-6,
                exchange_s: 2.1e-6,
            }],
            one_way: f,
            exchange: f,
            duplex_ratio: 1.0,
        };
        Calibration {
            machine: Machine {
                alpha: 2e-6,
                beta: 1e-9,
                gamma: 1e-10,
                alpha_intra: 2e-6,
                beta_intra: 1e-9,
                ranks_per_node: 2,
            },
            ranks: 2,
            hosts: vec!["h1".into(), "h1".into()],
            inter: None,
            intra: Some(link),
            addition: Addition {
                bytes: 1 << 20,
                reps: 7,
                seconds: 1e-4,
            },
            notes: vec!["all 2 ranks are on one host".into()],
        }
    }

    #[test]
    fn the_json_round_trips_and_loads_as_a_model() {
        let cal = sample();
        let json = serde_json::to_string_pretty(&cal).unwrap();
        assert_eq!(serde_json::from_str::<Calibration>(&json).unwrap(), cal);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["alpha"], 2e-6);
        assert_eq!(v["ranks_per_node"], 2);
        let dir = std::env::temp_dir().join(format!("lsgd-calibrate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("model.json");
        std::fs::write(&file, &json).unwrap();
        assert_eq!(Machine::load(&file).unwrap(), cal.machine);
        std::fs::write(&file, r#"{"alpha": 1e-6, "beta": 1e-9}"#).unwrap();
        let err = format!("{:#}", Machine::load(&file).unwrap_err());
        assert!(err.contains("gamma"), "{err}");
        let mut bad = cal.machine;
        bad.beta = -1.0;
        std::fs::write(&file, serde_json::to_string(&bad).unwrap()).unwrap();
        let err = format!("{:#}", Machine::load(&file).unwrap_err());
        assert!(err.contains("beta must be"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        let mut text = Vec::new();
        print(&cal, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("--alpha 2.000e-6 --beta 1.000e-9"), "{text}");
        assert!(text.contains("intra-host link") && !text.contains("inter-host link"));
    }
}
