//! `lsgd-host bench`.

use anyhow::Result;
use clap::{Args, Subcommand};

use super::args::LimitArgs;
use super::trace::Format;
use crate::bench::policies;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Median ns per policy call through the sandbox vs the same formula compiled natively.
    Policies {
        /// Plugins to measure (paths or names); default: every reference plugin.
        plugins: Vec<String>,
        /// Timed rounds over 9,000 states each; the median round is reported.
        #[arg(long, default_value_t = 21)]
        rounds: usize,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchCommand::Policies {
            plugins,
            rounds,
            format,
            limits,
        } => {
            let plugins = if plugins.is_empty() {
                policies::REFERENCE_PLUGINS
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
            } else {
                plugins
            };
            let rows = policies::run(&limits.runtime()?, &plugins, rounds)?;
            if format == Some(Format::Json) {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                policies::print_table(&rows, std::io::stdout().lock())?;
            }
        }
    }
    Ok(())
}
