//! The per-language table of `lsgd-host bench policies`: the same Goyal warmup schedule written
//! in Rust, C, Python, JavaScript and Go (`plugins/warmup*`, bit-identical to one another),
//! measured like every other plugin, so the rows differ only by the language's runtime: size,
//! load from the compiled-component cache, instantiation, and the median cost of a call.

use std::io::Write;

use anyhow::Result;
use serde::Serialize;

use super::policies::{self, Measurement};
use crate::plugin::Runtime;
use crate::plugin::locate::locate;

/// Each language and its build of the warmup schedule.
pub const WARMUP_BY_LANGUAGE: &[(&str, &str)] = &[
    ("Rust", "warmup"),
    ("C", "warmup-c"),
    ("Python", "warmup-python"),
    ("JavaScript", "warmup-js"),
    ("Go", "warmup-go"),
];

/// One language's row; no measurement when its plugin is not built.
#[derive(Debug, Clone, Serialize)]
pub struct LanguageRow {
    /// The language.
    pub language: &'static str,
    /// The plugin measured.
    pub plugin: &'static str,
    /// The measurement, when the plugin was found.
    pub measurement: Option<Measurement>,
}

/// Measures every language's warmup, reusing a row of `done` measured under the same name.
pub fn run(runtime: &Runtime, done: &[Measurement], rounds: usize) -> Result<Vec<LanguageRow>> {
    WARMUP_BY_LANGUAGE
        .iter()
        .map(|&(language, plugin)| {
            let measurement = match done.iter().find(|m| m.plugin == plugin) {
                Some(m) => Some(m.clone()),
                None if locate(plugin).is_err() => None,
                None => policies::run(runtime, &[plugin.to_string()], rounds)?.pop(),
            };
            Ok(LanguageRow {
                language,
                plugin,
                measurement,
            })
        })
        .collect()
}

/// Prints the table, one row per language.
pub fn print_table(rows: &[LanguageRow], mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "\nthe warmup schedule by language (bit-identical plugins):\n{:<12} {:<15} {:>10} {:>10} {:>12} {:>10}",
        "language", "plugin", "size KiB", "load ms", "instance us", "ns/call"
    )?;
    for r in rows {
        match &r.measurement {
            Some(m) => writeln!(
                out,
                "{:<12} {:<15} {:>10.1} {:>10.2} {:>12.1} {:>10.1}",
                r.language,
                r.plugin,
                m.size_bytes as f64 / 1024.0,
                m.load_cached_ms,
                m.instantiate_us,
                m.wasm_ns
            )?,
            None => writeln!(
                out,
                "{:<12} {:<15} not built: scripts/build-guests.sh builds it",
                r.language, r.plugin
            )?,
        }
    }
    Ok(())
}
