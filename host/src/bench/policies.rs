//! `lsgd-host bench policies`: the median cost of one policy call through the sandbox, next to
//! the same formula (the `lsgd-policy` crate the reference plugins are built from) compiled
//! natively into the host, printed as a ratio from one run. Target: a median of <= 150 ns per
//! call.

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use lsgd_policy::{Params, State};
use serde::Serialize;

use super::{Spread, median_ns_per_item, ns_per_item};
use crate::plugin::{Origin, Plugin, Runtime, locate::locate};
use crate::policy::{Clock, RunShape};

/// The reference plugins, by file name.
pub const REFERENCE_PLUGINS: &[&str] = &lsgd_policy::NAMES;

/// The target the issue sets for the median call.
pub const TARGET_NS: f64 = 150.0;

/// One measured plugin.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// Plugin file.
    pub plugin: String,
    /// Its kind.
    pub kind: String,
    /// Component size in bytes.
    pub size_bytes: usize,
    /// Time to load the compiled component from the cache, ms.
    pub load_cached_ms: f64,
    /// Time to make a fresh configured instance, µs.
    pub instantiate_us: f64,
    /// Median ns per call through the sandbox.
    pub wasm_ns: f64,
    /// Fastest, median and 90th-percentile round, ns per call through the sandbox.
    pub wasm_spread: Spread,
    /// Median ns per call of the native formula, when the host knows it.
    pub native_ns: Option<f64>,
}

/// Measures each plugin over the states of a 90-epoch Goyal-style run.
pub fn run(runtime: &Runtime, plugins: &[String], rounds: usize) -> Result<Vec<Measurement>> {
    let states = states()?;
    plugins
        .iter()
        .map(|name| measure(runtime, name, &states, rounds))
        .collect()
}

fn states() -> Result<Vec<State>> {
    let mut clock = Clock::new(RunShape {
        epochs: 90,
        samples_per_epoch: 100 * 8192,
        initial_batch: 8192,
        world_size: 32,
        base_lr: 0.1,
        reference_batch: 256,
    })?;
    let mut states = Vec::new();
    while !clock.finished() {
        states.push(clock.state());
        clock.advance(8192, Some(2.0));
    }
    Ok(states)
}

fn measure(runtime: &Runtime, name: &str, states: &[State], rounds: usize) -> Result<Measurement> {
    let path = locate(name)?;
    // The first load fills the cache; the second measures a load from it.
    runtime.load(&path, None)?;
    let mut plugin = runtime.load(&path, None)?;
    let load_cached_ms = match plugin.facts().origin {
        Origin::Cached(d) | Origin::Compiled(d) => d.as_secs_f64() * 1e3,
    };
    let start = Instant::now();
    const INSTANCES: u32 = 20;
    for _ in 0..INSTANCES {
        plugin.reset()?;
    }
    let instantiate_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(INSTANCES);
    let mut failure = None;
    let wasm_spread = ns_per_item(rounds, states.len(), || {
        for s in states {
            match plugin.call(black_box(s)) {
                Ok(out) => {
                    black_box(out);
                }
                Err(e) => {
                    failure.get_or_insert(e);
                    return;
                }
            }
        }
    });
    if let Some(e) = failure {
        // On a loaded machine a slow language runtime can miss the wall-clock deadline.
        return Err(anyhow::Error::new(e).context(format!(
            "benchmarking {name} (a longer --plugin-deadline-ms helps on a loaded machine)"
        )));
    }
    let native_ns = native_twin(&plugin)?.map(|mut f| {
        median_ns_per_item(rounds, states.len(), || {
            for s in states {
                black_box(f(black_box(s)));
            }
        })
    });
    Ok(Measurement {
        plugin: name.to_string(),
        kind: plugin.kind().to_string(),
        size_bytes: plugin.facts().size,
        load_cached_ms,
        instantiate_us,
        wasm_ns: wasm_spread.p50,
        wasm_spread,
        native_ns,
    })
}

pub use crate::policy::NativeFn;

/// The native twin of a reference plugin (`lsgd_policy::native`, matched by its describe()
/// name), configured with the plugin's parameters; `None` for plugins the host has no formula
/// for.
pub fn native_twin(plugin: &Plugin) -> Result<Option<NativeFn>> {
    let name = &plugin.info().name;
    lsgd_policy::native(name, &Params(plugin.params().to_vec()))
        .transpose()
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("configuring the native {name}"))
}

/// Prints the table, one row per plugin, with the ratio and the target check.
pub fn print_table(rows: &[Measurement], mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<18} {:<16} {:>9} {:>10} {:>12} {:>8} {:>8} {:>8} {:>10} {:>8}  median <= {TARGET_NS} ns",
        "plugin",
        "kind",
        "size KiB",
        "load ms",
        "instance us",
        "min ns",
        "p50 ns",
        "p90 ns",
        "native ns",
        "ratio"
    )?;
    for m in rows {
        let (native, ratio) = match m.native_ns {
            Some(n) => (
                format!("{n:.1}"),
                format!("{:.0}x", m.wasm_ns / n.max(0.01)),
            ),
            None => ("-".into(), "-".into()),
        };
        writeln!(
            out,
            "{:<18} {:<16} {:>9.1} {:>10.2} {:>12.1} {:>8.1} {:>8.1} {:>8.1} {:>10} {:>8}  {}",
            m.plugin,
            m.kind,
            m.size_bytes as f64 / 1024.0,
            m.load_cached_ms,
            m.instantiate_us,
            m.wasm_spread.min,
            m.wasm_spread.p50,
            m.wasm_spread.p90,
            native,
            ratio,
            if m.wasm_ns <= TARGET_NS { "ok" } else { "OVER" }
        )?;
    }
    Ok(())
}
