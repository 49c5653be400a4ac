//! `lsgd-host bench allreduce`: every all-reduce algorithm against MPI_Allreduce in one run,
//! printed like nccl-tests (time, algbw, busbw) with each algorithm's time as a ratio to MPI's.
//!
//! Algorithms are interleaved inside each iteration, so drift in the machine's load hits them
//! alike. An iteration's time is the slowest rank's (a collective is done when the last rank
//! is); the median over iterations is reported. The input is restored before every call,
//! outside the timed region, so values stay finite.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::collective::cost::CostModel;
use crate::collective::{Algorithm, World};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Algorithms, in table order.
    pub algos: Vec<Algorithm>,
    /// Vector lengths in floats.
    pub sizes: Vec<usize>,
    /// Timed iterations per size; `None`: from 50 at small sizes down to 9 at 64 MB and above.
    pub iters: Option<usize>,
    /// Untimed iterations first.
    pub warmup: usize,
}

/// One algorithm at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Floats reduced.
    pub floats: usize,
    /// Bytes reduced.
    pub bytes: usize,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Median seconds (slowest rank per iteration).
    pub seconds: f64,
    /// bytes / seconds.
    pub algbw: f64,
    /// algbw · 2(p−1)/p.
    pub busbw: f64,
    /// seconds / MPI_Allreduce's seconds at this size (`None` without `mpi` in the run).
    pub vs_mpi: Option<f64>,
    /// Bytes this rank sent per call.
    pub bytes_sent: u64,
    /// The α-β model's seconds (`--model`); absent without a model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_s: Option<f64>,
    /// seconds / predicted_s; absent without a model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// Parses `4K..64M` (every power of two between the bounds) or a list `4K,1M,3000`: counts
/// with optional K, M, G suffixes (powers of 1024).
pub fn parse_sizes(s: &str) -> Result<Vec<usize>> {
    if let Some((lo, hi)) = s.split_once("..") {
        let (lo, hi) = (parse_count(lo)?, parse_count(hi)?);
        anyhow::ensure!(
            lo >= 1 && lo <= hi,
            "size range {s:?} must be increasing and start at 1 or more"
        );
        let mut sizes = Vec::new();
        let mut n = lo;
        while n <= hi {
            sizes.push(n);
            n = n
                .checked_mul(2)
                .ok_or_else(|| anyhow::anyhow!("size range {s:?} overflows"))?;
        }
        return Ok(sizes);
    }
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(parse_count)
        .collect()
}

/// Parses `4096`, `4K`, `16M`, `1G` (powers of 1024; fractional values such as `1.5M` allowed).
pub fn parse_count(s: &str) -> Result<usize> {
    let t = s.trim();
    let (digits, scale) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let value: f64 = digits
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size {s:?} (e.g. 4096, 4K, 16M)"))?;
    anyhow::ensure!(value >= 0.0 && value.is_finite(), "bad size {s:?}");
    Ok((value * scale as f64).round() as usize)
}

fn default_iters(bytes: usize) -> usize {
    (((1usize << 29) / bytes.max(1)).clamp(9, 50)) | 1
}

/// Measures every algorithm at every size (collective); every rank returns the same rows.
pub fn run(world: &mut World, setup: &Setup) -> Result<Vec<Row>> {
    let p = world.size() as f64;
    let mut rows = Vec::new();
    for &n in &setup.sizes {
        let bytes = n * size_of::<f32>();
        let iters = setup.iters.unwrap_or_else(|| default_iters(bytes)).max(1);
        let source: Vec<f32> = (0..n)
            .map(|i| ((i + world.rank()) % 17) as f32 * 0.125)
            .collect();
        let mut buf = source.clone();
        let mut times = vec![vec![0.0f64; iters]; setup.algos.len()];
        let mut sent = vec![0u64; setup.algos.len()];
        for it in 0..setup.warmup + iters {
            for (a, &algo) in setup.algos.iter().enumerate() {
                buf.copy_from_slice(&source);
                world.barrier()?;
                let start = Instant::now();
                let traffic = world.all_reduce_sum(algo, &mut buf)?;
                let elapsed = start.elapsed().as_secs_f64();
                if it >= setup.warmup {
                    times[a][it - setup.warmup] = elapsed;
                }
                sent[a] = traffic.bytes_sent;
            }
        }
        let mut medians = Vec::with_capacity(setup.algos.len());
        for t in &mut times {
            world.all_reduce_max_f64(t)?;
            t.sort_by(f64::total_cmp);
            medians.push(t[t.len() / 2]);
        }
        let mpi = setup
            .algos
            .iter()
            .position(|&a| a == Algorithm::Mpi)
            .map(|i| medians[i]);
        for (a, &algo) in setup.algos.iter().enumerate() {
            let seconds = medians[a];
            let algbw = bytes as f64 / seconds;
            rows.push(Row {
                floats: n,
                bytes,
                algorithm: algo,
                seconds,
                algbw,
                busbw: algbw * 2.0 * (p - 1.0) / p,
                vs_mpi: mpi.map(|m| seconds / m),
                bytes_sent: sent[a],
                predicted_s: None,
                ratio: None,
            });
        }
    }
    Ok(rows)
}

/// Sets each row's `predicted_s` (the model's seconds for its algorithm at its size on `p`
/// ranks; `mpi` is what cost.rs prices it at, the best a tuned MPI can pick) and `ratio`
/// (measured / predicted; none where the model predicts no time, as on one rank).
pub fn predict(rows: &mut [Row], model: &CostModel, p: usize) {
    for r in rows {
        let predicted = model.predict(r.algorithm, p, r.bytes as f64);
        r.predicted_s = Some(predicted);
        r.ratio = (predicted > 0.0).then(|| r.seconds / predicted);
    }
}

/// The nccl-tests style table, with the model's columns where rows have predictions.
pub fn print_table(world: &World, rows: &[Row], mut out: impl Write) -> Result<()> {
    writeln!(
        out,
        "# all-reduce (sum, f32), {} ranks, torus {}x{}; time = median over iterations of the slowest rank",
        world.size(),
        world.torus_shape().0,
        world.torus_shape().1
    )?;
    let model = rows.iter().any(|r| r.predicted_s.is_some());
    write!(
        out,
        "{:>10} {:>11}  {:<17} {:>11} {:>12} {:>12} {:>7}",
        "floats", "bytes", "algorithm", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "vs mpi"
    )?;
    if model {
        write!(out, " {:>14} {:>20}", "predicted(us)", "measured/predicted")?;
    }
    writeln!(out)?;
    let mut last = None;
    for r in rows {
        let (floats, bytes) = if last == Some(r.floats) {
            (String::new(), String::new())
        } else {
            (r.floats.to_string(), r.bytes.to_string())
        };
        last = Some(r.floats);
        write!(
            out,
            "{floats:>10} {bytes:>11}  {:<17} {:>11.1} {:>12.3} {:>12.3} {:>7}",
            r.algorithm.name(),
            r.seconds * 1e6,
            r.algbw / 1e9,
            r.busbw / 1e9,
            r.vs_mpi.map_or("-".to_string(), |v| format!("{v:.2}x")),
        )?;
        if model {
            write!(
                out,
                " {:>14} {:>20}",
                r.predicted_s
                    .map_or("-".to_string(), |p| format!("{:.1}", p * 1e6)),
                r.ratio.map_or("-".to_string(), |v| format!("{v:.2}x")),
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_ranges_of_powers_of_two_or_lists() {
        assert_eq!(parse_sizes("4K..32K").unwrap(), [4096, 8192, 16384, 32768]);
        assert_eq!(parse_sizes("16M..16M").unwrap(), [16 << 20]);
        assert_eq!(parse_sizes("1,3K, 1.5M").unwrap(), [1, 3072, 1572864]);
        assert_eq!(parse_count("1G").unwrap(), 1 << 30);
        assert!(parse_sizes("8K..4K").is_err());
        assert!(parse_sizes("4Q").is_err());
    }

    #[test]
    fn a_single_process_bench_reports_every_algorithm() {
        let mut world = World::single();
        let setup = Setup {
            algos: Algorithm::ALL.to_vec(),
            sizes: vec![1000],
            iters: Some(3),
            warmup: 1,
        };
        let rows = run(&mut world, &setup).unwrap();
        assert_eq!(rows.len(), Algorithm::ALL.len());
        assert!(rows.iter().all(|r| r.vs_mpi.is_some()));
        let mut text = Vec::new();
        print_table(&world, &rows, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for name in ["halving-doubling", "binary-blocks"] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
        assert!(!text.contains("predicted"), "{text}");
        let json = serde_json::to_string(&rows).unwrap();
        assert!(!json.contains("predicted_s"), "{json}");
    }

    #[test]
    fn a_model_adds_predictions_and_ratios() {
        let world = World::single();
        let row = |algorithm, seconds| Row {
            floats: 1 << 20,
            bytes: 4 << 20,
            algorithm,
            seconds,
            algbw: 0.0,
            busbw: 0.0,
            vs_mpi: None,
            bytes_sent: 0,
            predicted_s: None,
            ratio: None,
        };
        let mut rows = vec![row(Algorithm::Mpi, 2e-3), row(Algorithm::Ring, 1e-3)];
        let model = CostModel {
            alpha: 1e-6,
            beta: 1e-10,
            gamma: 1e-11,
            alpha_intra: 1e-6,
            beta_intra: 1e-10,
            ranks_per_node: 1,
            torus_shape: None,
        };
        predict(&mut rows, &model, 4);
        let n = (4 << 20) as f64;
        let ring = model.predict(Algorithm::Ring, 4, n);
        assert_eq!(rows[1].predicted_s, Some(ring));
        assert_eq!(rows[1].ratio, Some(1e-3 / ring));
        assert_eq!(
            rows[0].predicted_s,
            Some(model.predict(Algorithm::Mpi, 4, n))
        );
        let mut text = Vec::new();
        print_table(&world, &rows, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("predicted(us)") && text.contains("measured/predicted"),
            "{text}"
        );
        let v: serde_json::Value = serde_json::to_value(&rows).unwrap();
        assert_eq!(v[1]["predicted_s"], ring);
        // One rank: nothing to predict a ratio against.
        predict(&mut rows, &model, 1);
        assert_eq!(rows[1].ratio, None);
    }
}
