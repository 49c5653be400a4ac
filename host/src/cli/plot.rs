//! `lsgd-host plot`: the curves of a training run.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::plot;
use crate::train::metrics;

/// Arguments of `plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// The run's metrics.jsonl.
    metrics: PathBuf,
    /// The image to write (.png or .svg).
    #[arg(long, short, value_name = "FILE", default_value = "curves.png")]
    output: PathBuf,
    /// Chart title (default: the metrics file's directory).
    #[arg(long)]
    title: Option<String>,
}

/// Runs `plot`.
pub fn run(args: PlotArgs) -> Result<()> {
    let records = metrics::read(&args.metrics)?;
    if records.is_empty() {
        bail!("{} holds no records", args.metrics.display());
    }
    let title = args.title.unwrap_or_else(|| {
        args.metrics
            .parent()
            .map(|p| p.display().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| args.metrics.display().to_string())
    });
    plot::draw(
        &plot::metrics_panels(&records),
        &title,
        "epoch",
        &args.output,
    )?;
    eprintln!(
        "plotted {} records to {}",
        records.len(),
        args.output.display()
    );
    Ok(())
}
