//! `lsgd-host bench policies`: the median cost of one policy call through the sandbox, next to
//! the same formula (the `lsgd-policy` crate the reference plugins are built from) compiled
//! natively into the host, printed as a ratio from one run. Target: a median of <= 150 ns per
//! call.
//!
//! What bounding a call costs comes from the same rounds, which alternate between the plugin
//! as training runs it (fuel and epoch checks), compiled with epoch checks only, and compiled
//! with neither; next to them, the most fuel one call and one setup call of the plugin used,
//! which the default budgets are chosen from.

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use lsgd_policy::{Params, State};
use serde::Serialize;

use super::stats::{Spread, median_ns_per_item};
use crate::plugin::runtime::Metering;
use crate::plugin::{EngineOptions, Origin, Plugin, Runtime, locate::locate};
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
    /// Median ns per call compiled with epoch checks only (a wall-clock deadline, no fuel).
    pub epoch_only_ns: f64,
    /// Median ns per call compiled with neither fuel nor epoch checks.
    pub unmetered_ns: f64,
    /// The most fuel one call used over the run's states; `None` when the runtime's policies
    /// are not compiled with fuel.
    pub fuel_per_call: Option<u64>,
    /// The most fuel one setup call (instantiation, describe, configure) used.
    pub setup_fuel: Option<u64>,
}

/// Measures each plugin over the states of a 90-epoch Goyal-style run.
pub fn run(runtime: &Runtime, plugins: &[String], rounds: usize) -> Result<Vec<Measurement>> {
    let states = states()?;
    let variant = |policy_metering| {
        let options = EngineOptions {
            policy_metering,
            ..runtime.options()
        };
        Runtime::with_options(runtime.cache().clone(), runtime.limits(), options)
    };
    let variants = [variant(Metering::Deadline)?, variant(Metering::Unmetered)?];
    plugins
        .iter()
        .map(|name| measure(runtime, &variants, name, &states, rounds))
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

/// Calls `plugin` on every state; the first error ends the pass.
fn pass(plugin: &mut Plugin, states: &[State], failure: &mut Option<crate::plugin::PluginError>) {
    if failure.is_some() {
        return;
    }
    for s in states {
        match plugin.call(black_box(s)) {
            Ok(out) => {
                black_box(out);
            }
            Err(e) => {
                *failure = Some(e);
                return;
            }
        }
    }
}

fn measure(
    runtime: &Runtime,
    variants: &[Runtime; 2],
    name: &str,
    states: &[State],
    rounds: usize,
) -> Result<Measurement> {
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
    let setup_fuel = plugin.setup_fuel();
    let mut fuel_per_call = None;
    for s in states {
        plugin.call(s)?;
        fuel_per_call = fuel_per_call.max(plugin.last_fuel());
    }
    let mut others = variants
        .iter()
        .map(|rt| rt.load(&path, None))
        .collect::<Result<Vec<_>, _>>()?;
    // One round is a pass of each build in turn, so that a machine's slow spell hits all
    // three; the first round warms up and is not counted, as in `ns_per_item`.
    let mut failure = None;
    let mut times = vec![Vec::new(); others.len() + 1];
    let items = states.len().max(1) as f64;
    for _ in 0..=rounds.max(1) {
        let builds = std::iter::once(&mut plugin).chain(others.iter_mut());
        for (build, times) in builds.zip(&mut times) {
            let start = Instant::now();
            pass(build, states, &mut failure);
            times.push(start.elapsed().as_nanos() as f64 / items);
        }
    }
    if let Some(e) = failure {
        return Err(anyhow::Error::new(e).context(format!("benchmarking {name}")));
    }
    let wasm_spread = Spread::of(&mut times[0][1..]);
    let [epoch_only_ns, unmetered_ns] = [1, 2].map(|i| Spread::of(&mut times[i][1..]).p50);
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
        epoch_only_ns,
        unmetered_ns,
        fuel_per_call,
        setup_fuel,
    })
}

/// A fuel figure, `-` when not counted.
fn fuel(units: Option<u64>) -> String {
    units.map_or_else(|| "-".into(), |u| u.to_string())
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

/// Prints the table, one row per plugin, with the ratio and the target check. `p50 ns` is the
/// plugin as training runs it (fuel and epoch checks); `epoch ns` and `none ns` the medians of
/// the same rounds compiled with epoch checks only and with neither.
pub fn print_table(rows: &[Measurement], mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<18} {:<16} {:>9} {:>10} {:>12} {:>8} {:>8} {:>8} {:>10} {:>8} {:>9} {:>9} {:>10} {:>12}  median <= {TARGET_NS} ns",
        "plugin",
        "kind",
        "size KiB",
        "load ms",
        "instance us",
        "min ns",
        "p50 ns",
        "p90 ns",
        "native ns",
        "ratio",
        "epoch ns",
        "none ns",
        "fuel/call",
        "setup fuel"
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
            "{:<18} {:<16} {:>9.1} {:>10.2} {:>12.1} {:>8.1} {:>8.1} {:>8.1} {:>10} {:>8} {:>9.1} {:>9.1} {:>10} {:>12}  {}",
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
            m.epoch_only_ns,
            m.unmetered_ns,
            fuel(m.fuel_per_call),
            fuel(m.setup_fuel),
            if m.wasm_ns <= TARGET_NS { "ok" } else { "OVER" }
        )?;
    }
    Ok(())
}
