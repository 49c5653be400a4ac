//! `lsgd-host simulate`: α-β predicted all-reduce times at scales we cannot run.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use super::trace::Format;
use crate::bench::allreduce::parse_sizes;
use crate::bench::calibrate::Machine;
use crate::collective::cost::CostModel;
use crate::collective::{Algorithm, parse_shape, torus};

/// Arguments of `simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 1024)]
    ranks: usize,
    /// A model file (`bench calibrate --out`) giving α, β, γ, the intra-node costs and ranks
    /// per node; the flags below override it.
    #[arg(long, value_name = "FILE")]
    model: Option<PathBuf>,
    /// Seconds per message between nodes (latency) [default: 5e-6].
    #[arg(long)]
    alpha: Option<f64>,
    /// Seconds per byte between nodes (1 / bandwidth; 1e-10 is 10 GB/s) [default: 1e-10].
    #[arg(long)]
    beta: Option<f64>,
    /// Seconds per byte reduced (the additions) [default: 0].
    #[arg(long)]
    gamma: Option<f64>,
    /// Bytes to all-reduce, with K/M/G suffixes (powers of 1024); default 100M (ResNet-50's
    /// 25M fp32 gradients). Ignored with --sizes.
    #[arg(long, default_value = "100M")]
    bytes: String,
    /// Several message sizes in bytes: `4K..1G` (powers of two) or a list `1M,100M`.
    #[arg(long)]
    sizes: Option<String>,
    /// Ranks per node, for `hierarchical` [default: 8].
    #[arg(long)]
    ranks_per_node: Option<usize>,
    /// Seconds per message inside a node (default: the model file's, else --alpha).
    #[arg(long)]
    alpha_intra: Option<f64>,
    /// Seconds per byte inside a node (default: the model file's, else --beta).
    #[arg(long)]
    beta_intra: Option<f64>,
    /// Torus grid XxY (default: near-square).
    #[arg(long, value_parser = parse_shape)]
    torus_shape: Option<(usize, usize)>,
    /// `json` prints the predictions as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

/// The model `simulate` prices with: each flag given, else the model file's value, else the
/// built-in default (the intra-node costs default to the inter-node ones in effect).
fn cost_model(args: &SimulateArgs) -> Result<CostModel> {
    let file = args.model.as_deref().map(Machine::load).transpose()?;
    let pick = |flag: Option<f64>, from_file: fn(&Machine) -> f64, default: f64| {
        flag.or(file.as_ref().map(from_file)).unwrap_or(default)
    };
    let alpha = pick(args.alpha, |m| m.alpha, 5e-6);
    let beta = pick(args.beta, |m| m.beta, 1e-10);
    let model = CostModel {
        alpha,
        beta,
        gamma: pick(args.gamma, |m| m.gamma, 0.0),
        alpha_intra: pick(args.alpha_intra, |m| m.alpha_intra, alpha),
        beta_intra: pick(args.beta_intra, |m| m.beta_intra, beta),
        ranks_per_node: args
            .ranks_per_node
            .or(file.as_ref().map(|m| m.ranks_per_node))
            .unwrap_or(8),
        torus_shape: args.torus_shape,
    };
    anyhow::ensure!(
        model.ranks_per_node >= 1,
        "--ranks-per-node must be at least 1"
    );
    Ok(model)
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
    if let Some(shape) = args.torus_shape {
        torus::check_shape(shape, p)?;
    }
    let model = cost_model(&args)?;
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn model(flags: &[&str]) -> Result<CostModel> {
        let cli = Cli::try_parse_from(std::iter::once("simulate").chain(flags.iter().copied()))?;
        cost_model(&cli.args)
    }

    #[test]
    fn without_a_model_file_the_defaults_and_flags_are_as_before() {
        let m = model(&[]).unwrap();
        assert_eq!((m.alpha, m.beta, m.gamma), (5e-6, 1e-10, 0.0));
        assert_eq!(
            (m.alpha_intra, m.beta_intra, m.ranks_per_node),
            (5e-6, 1e-10, 8)
        );
        let m = model(&["--alpha", "1e-5", "--ranks-per-node", "4"]).unwrap();
        assert_eq!((m.alpha, m.alpha_intra, m.ranks_per_node), (1e-5, 1e-5, 4));
    }

    #[test]
    fn a_model_file_sets_every_parameter_and_flags_override_it() {
        let dir = std::env::temp_dir().join(format!("lsgd-simulate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("model.json");
        let machine = Machine {
            alpha: 2e-5,
            beta: 8e-9,
            gamma: 3e-10,
            alpha_intra: 1e-6,
            beta_intra: 2e-10,
            ranks_per_node: 2,
        };
        // What `bench calibrate --out` writes holds more than the six parameters.
        let mut json = serde_json::to_value(machine).unwrap();
        json["notes"] = serde_json::json!(["measured"]);
        std::fs::write(&file, json.to_string()).unwrap();
        let path = file.to_str().unwrap();
        let m = model(&["--model", path]).unwrap();
        assert_eq!(
            (
                m.alpha,
                m.beta,
                m.gamma,
                m.alpha_intra,
                m.beta_intra,
                m.ranks_per_node
            ),
            (2e-5, 8e-9, 3e-10, 1e-6, 2e-10, 2)
        );
        let m = model(&["--model", path, "--beta", "1e-9", "--ranks-per-node", "8"]).unwrap();
        assert_eq!(
            (m.alpha, m.beta, m.beta_intra, m.ranks_per_node),
            (2e-5, 1e-9, 2e-10, 8)
        );
        std::fs::write(&file, "{}").unwrap();
        let err = format!("{:#}", model(&["--model", path]).unwrap_err());
        assert!(err.contains("bench calibrate"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
