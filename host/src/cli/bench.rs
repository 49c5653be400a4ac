//! `lsgd-host bench`.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};

use super::args::LimitArgs;
use super::trace::Format;
use crate::bench::{policies, train};
use crate::model::Arch;

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
    /// `lsgd-host run` vs the same job in PyTorch (samples/s ratio), and the policies' share
    /// of a step through the sandbox vs native.
    Train {
        /// Network (the PyTorch script mirrors `cnn` and `mlp`).
        #[arg(long, value_enum, default_value_t = Arch::Cnn)]
        model: Arch,
        /// Global batch.
        #[arg(long, default_value_t = 256)]
        global_batch: u32,
        /// libtorch threads on both sides (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed steps.
        #[arg(long, default_value_t = 60)]
        steps: u64,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup_steps: u64,
        /// IDX directory.
        #[arg(long, default_value = crate::data::DEFAULT_DIR)]
        data: PathBuf,
        /// Python with torch importable (default: the project venv's).
        #[arg(long)]
        python: Option<PathBuf>,
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
        BenchCommand::Train {
            model,
            global_batch,
            threads,
            steps,
            warmup_steps,
            data,
            python,
            format,
            limits,
        } => {
            let setup = train::Setup {
                model,
                batch: global_batch,
                threads: threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                steps,
                warmup: warmup_steps,
                data,
                python: python.unwrap_or_else(default_python),
            };
            let report = train::run(&setup, &limits.runtime()?)?;
            if format == Some(Format::Json) {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                train::print(&setup, &report, std::io::stdout().lock())?;
            }
        }
    }
    Ok(())
}

/// `$LSGD_VENV/bin/python`, else the venv `scripts/setup.sh` creates.
fn default_python() -> PathBuf {
    let venv = std::env::var_os("LSGD_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/lsgd-host/venv")
        });
    venv.join("bin/python")
}
