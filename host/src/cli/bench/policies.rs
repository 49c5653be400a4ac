//! `lsgd-host bench policies`: the cost of a policy call through the sandbox against the same
//! formula compiled natively, and the warmup schedule in each guest language.

use anyhow::Result;
use clap::Args;

use super::emit;
use crate::bench::{languages, policies};
use crate::cli::args::LimitArgs;
use crate::cli::trace::Format;

/// Arguments of `bench policies`.
#[derive(Args, Debug)]
pub struct PoliciesArgs {
    /// Plugins to measure (paths or names); default: every reference plugin, then the
    /// warmup schedule in every plugin language (Rust, C, Python, JavaScript, Go).
    plugins: Vec<String>,
    /// Timed rounds over 9,000 states each; the median round is reported.
    #[arg(long, default_value_t = 21)]
    rounds: usize,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
    #[command(flatten)]
    limits: LimitArgs,
}

impl PoliciesArgs {
    /// Runs `bench policies`: the given plugins, or every reference plugin and the warmup
    /// schedule in each guest language.
    pub fn run(self) -> Result<()> {
        let by_language = self.plugins.is_empty();
        let plugins = if by_language {
            policies::REFERENCE_PLUGINS
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            self.plugins
        };
        let runtime = self.limits.runtime()?;
        let mut rows = policies::run(&runtime, &plugins, self.rounds)?;
        let languages = if by_language {
            languages::run(&runtime, &rows, self.rounds)?
        } else {
            Vec::new()
        };
        if self.format == Some(Format::Json) {
            // One list of measurements: the language rows not already in it are appended.
            for m in languages.iter().filter_map(|l| l.measurement.as_ref()) {
                if !rows.iter().any(|r| r.plugin == m.plugin) {
                    rows.push(m.clone());
                }
            }
        }
        emit(self.format, &rows, |mut out| {
            policies::print_table(&rows, &mut out)?;
            if !languages.is_empty() {
                languages::print_table(&languages, &mut out)?;
            }
            std::io::Result::Ok(())
        })
    }
}
