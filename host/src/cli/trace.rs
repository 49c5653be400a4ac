//! `lsgd-host trace`.

use std::io::stdout;
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};

use super::args::{InputArgs, LimitArgs, PolicyArgs, ShapeArgs};
use crate::plugin::PolicyKind;
use crate::{plot, trace};

/// Output format of rows.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated values with a header.
    Csv,
    /// JSON.
    Json,
}

/// Arguments of `trace`.
#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    shape: ShapeArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    inputs: InputArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    format: Format,
    /// Also draw the trace into this file (.png or .svg).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write the rows here instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `trace`.
pub fn run(args: TraceArgs) -> Result<()> {
    let runtime = args.limits.runtime()?;
    let mut set = args.policies.load(&runtime, args.limits.bounds())?;
    let inputs = args.inputs.inputs()?;
    if trace::needs_norms(&set) && inputs.norms.names().is_empty() {
        anyhow::bail!("tracing a --layer-rate plugin needs the tensors' norms: --norms-file FILE");
    }
    let drift = args.inputs.drift()?;
    let rows = trace::trace_with_drift(&mut set, args.shape.clock()?, &inputs, &drift)?;
    let out: Box<dyn std::io::Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p)?)),
        None => Box::new(std::io::BufWriter::new(stdout().lock())),
    };
    match args.format {
        Format::Csv => trace::write_csv(&rows, &inputs.norms.names(), &drift.names(), out)?,
        Format::Json => trace::write_json(&rows, out)?,
    }
    if let Some(path) = &args.plot {
        // The sync policy's name too: the lr panel is a window's inner rate.
        let names: Vec<String> = PolicyKind::ALL
            .iter()
            .chain([&PolicyKind::Sync])
            .filter_map(|k| set.get(*k))
            .map(|p| p.info().name.clone())
            .collect();
        let title = format!(
            "{} — {} epochs, global batch {}, k = {}",
            if names.is_empty() {
                "constant".to_string()
            } else {
                names.join(" + ")
            },
            args.shape.epochs.unwrap_or_default(),
            args.shape.global_batch.unwrap_or_default(),
            args.shape.world_size()
        );
        plot::draw(&plot::trace_panels(&rows), &title, "epoch", path)?;
        eprintln!("plotted {} steps to {}", rows.len(), path.display());
    }
    Ok(())
}
