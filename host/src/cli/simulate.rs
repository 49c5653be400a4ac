//! `lsgd-host simulate`: α-β predicted all-reduce times at scales we cannot run.

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use super::trace::Format;
use crate::bench::allreduce::parse_sizes;
use crate::collective::cost::CostModel;
use crate::collective::{Algorithm, parse_shape, torus};

/// Arguments of `simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 1024)]
    ranks: usize,
    /// Seconds per message between nodes (latency).
    #[arg(long, default_value_t = 5e-6)]
    alpha: f64,
    /// Seconds per byte between nodes (1 / bandwidth; 1e-10 is 10 GB/s).
    #[arg(long, default_value_t = 1e-10)]
    beta: f64,
    /// Seconds per byte reduced (the additions).
    #[arg(long, default_value_t = 0.0)]
    gamma: f64,
    /// Bytes to all-reduce, with K/M/G suffixes (powers of 1024); default 100M (ResNet-50's
    /// 25M fp32 gradients). Ignored with --sizes.
    #[arg(long, default_value = "100M")]
    bytes: String,
    /// Several message sizes in bytes: `4K..1G` (powers of two) or a list `1M,100M`.
    #[arg(long)]
    sizes: Option<String>,
    /// Ranks per node, for `hierarchical`.
    #[arg(long, default_value_t = 8)]
    ranks_per_node: usize,
    /// Seconds per message inside a node (default: --alpha).
    #[arg(long)]
    alpha_intra: Option<f64>,
    /// Seconds per byte inside a node (default: --beta).
    #[arg(long)]
    beta_intra: Option<f64>,
    /// Torus grid XxY (default: near-square).
    #[arg(long, value_parser = parse_shape)]
    torus_shape: Option<(usize, usize)>,
    /// `json` prints the predictions as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

#[derive(Serialize)]
struct Prediction {
    bytes: usize,
    algorithm: Algorithm,
    seconds: f64,
    busbw: f64,
    vs_best: f64,
}

/// Runs `simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
    let p = args.ranks;
    anyhow::ensure!(p >= 1, "--ranks must be at least 1");
    anyhow::ensure!(
        args.ranks_per_node >= 1,
        "--ranks-per-node must be at least 1"
    );
    if let Some(shape) = args.torus_shape {
        torus::check_shape(shape, p)?;
    }
    let model = CostModel {
        alpha: args.alpha,
        beta: args.beta,
        gamma: args.gamma,
        alpha_intra: args.alpha_intra.unwrap_or(args.alpha),
        beta_intra: args.beta_intra.unwrap_or(args.beta),
        ranks_per_node: args.ranks_per_node,
        torus_shape: args.torus_shape,
    };
    let sizes = match &args.sizes {
        Some(s) => parse_sizes(s)?,
        None => parse_sizes(&args.bytes)?,
    };
    let mut predictions = Vec::new();
    for &n in &sizes {
        let times: Vec<f64> = Algorithm::ALL
            .iter()
            .map(|&a| model.predict(a, p, n as f64))
            .collect();
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        for (&algorithm, &seconds) in Algorithm::ALL.iter().zip(&times) {
            predictions.push(Prediction {
                bytes: n,
                algorithm,
                seconds,
                busbw: n as f64 / seconds * 2.0 * (p as f64 - 1.0) / p as f64,
                vs_best: seconds / best,
            });
        }
    }
    if args.format == Some(Format::Json) {
        println!("{}", serde_json::to_string_pretty(&predictions)?);
        return Ok(());
    }
    let (x, y) = args.torus_shape.unwrap_or_else(|| torus::default_shape(p));
    println!(
        "# α-β model: {p} ranks, α = {:e} s, β = {:e} s/B, γ = {:e} s/B; {} ranks/node \
         (α_intra = {:e}, β_intra = {:e}); torus {x}x{y}",
        model.alpha,
        model.beta,
        model.gamma,
        model.ranks_per_node,
        model.alpha_intra,
        model.beta_intra
    );
    println!(
        "# mpi = the best of ring, halving-doubling and recursive doubling (what a tuned MPI can pick)"
    );
    println!(
        "{:>13}  {:<17} {:>13} {:>12} {:>8}",
        "bytes", "algorithm", "time(us)", "busbw(GB/s)", "vs best"
    );
    let mut last = None;
    for r in &predictions {
        let bytes = if last == Some(r.bytes) {
            String::new()
        } else {
            r.bytes.to_string()
        };
        last = Some(r.bytes);
        println!(
            "{bytes:>13}  {:<17} {:>13.1} {:>12.3} {:>7.2}x",
            r.algorithm.name(),
            r.seconds * 1e6,
            r.busbw / 1e9,
            r.vs_best
        );
    }
    Ok(())
}
