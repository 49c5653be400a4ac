//! `lsgd-host bench codecs`: encode+decode throughput of each codec plugin against the same
//! code compiled natively, and the compression each achieves.

use anyhow::Result;
use clap::Args;

use super::emit;
use crate::bench::{allreduce, codecs};
use crate::cli::args::LimitArgs;
use crate::cli::trace::Format;

/// Arguments of `bench codecs`.
#[derive(Args, Debug)]
pub struct CodecsArgs {
    /// Codecs by describe() name (plugin file `codec-NAME`); default: every reference codec.
    codecs: Vec<String>,
    /// Floats per bucket: a list such as `1M,16M`, or `4K..64M` (powers of two).
    #[arg(long, default_value = "1M,16M", value_parser = allreduce::parse_sizes)]
    sizes: std::vec::Vec<usize>,
    /// Timed rounds per side (alternated); the median is reported.
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
    #[command(flatten)]
    limits: LimitArgs,
}

impl CodecsArgs {
    /// Runs `bench codecs`: the given codecs, or every reference codec.
    pub fn run(self) -> Result<()> {
        let names: Vec<String> = if self.codecs.is_empty() {
            codecs::REFERENCE_CODECS
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            self.codecs
        };
        // A 16M-float bucket is 64 MiB in and out of the instance, and takes far longer than a
        // training bucket: the default limits are for 1M-float buckets. The other settings
        // (--codec-canonical-nans) are the user's.
        let limits = LimitArgs {
            plugin_memory_mb: self.limits.plugin_memory_mb.max(1024),
            plugin_deadline_ms: self.limits.plugin_deadline_ms.max(1000),
            ..self.limits
        };
        let rows = codecs::run(&limits.runtime()?, &names, &self.sizes, self.rounds)?;
        emit(self.format, &rows, |out| codecs::print_table(&rows, out))
    }
}
