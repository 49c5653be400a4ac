//! `lsgd-host inspect`: what a plugin is, before anyone trains with it.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use wasmtime::component::Component;

use super::args::{ComposeArgs, LimitArgs};
use super::trace::Format;
use crate::plugin::params::{render, type_name};
use crate::plugin::{Origin, PolicyKind, Runtime, locate::locate};
use crate::policy::{Composition, Slot};

/// Arguments of `inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The plugin (a path, or a name such as `warmup`).
    plugin: String,
    /// With `--then` or `--chain`, the plugin is a composed schedule's first part: each part
    /// is described, with its place in the composition.
    #[command(flatten)]
    compose: ComposeArgs,
    /// `json` for scripts; anything else prints text.
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Time a fresh compilation even when the compile cache holds the plugin (seconds for a
    /// Python plugin).
    #[arg(long)]
    recompile: bool,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Serialize)]
struct Report {
    /// For a part of a composed schedule: `schedule.1 (from step 50)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    part: Option<String>,
    file: String,
    size_bytes: usize,
    kind: String,
    world: String,
    wit_version: String,
    stateful: bool,
    name: String,
    version: String,
    summary: String,
    params: Vec<Param>,
    imports: Vec<String>,
    /// How long compiling took: now, or when the cache entry was written (`None` when the
    /// cache holds it without the time).
    compile_ms: Option<f64>,
    /// Whether `compile_ms` was measured by this call.
    compiled_now: bool,
    cached_load_ms: Option<f64>,
    canonical_nans: bool,
}

#[derive(Serialize)]
struct Param {
    name: String,
    #[serde(rename = "type")]
    ty: String,
    default: Option<String>,
    doc: String,
}

/// Runs `inspect`: one report, or one per part of a composed schedule.
pub fn run(args: InspectArgs) -> Result<()> {
    let runtime = args.limits.runtime()?;
    let (composition, later) = args.compose.composition()?;
    let mut reports = vec![report(&runtime, &args.plugin, args.recompile)?];
    if composition != Composition::Single {
        composition
            .check(later.len() + 1)
            .map_err(|m| anyhow::anyhow!("{}: {m}", args.plugin))?;
        for p in &later {
            reports.push(report(&runtime, p, args.recompile)?);
        }
        for (part, r) in reports.iter_mut().enumerate() {
            if r.kind != PolicyKind::Schedule.to_string() {
                anyhow::bail!(
                    "{} is a {} plugin; every part of a composed schedule is a schedule",
                    r.file,
                    r.kind
                );
            }
            let slot = Slot {
                kind: PolicyKind::Schedule,
                part,
            };
            r.part = Some(match part {
                0 => format!("{} ({composition})", slot.key()),
                n => composition.part_label(slot.key(), n),
            });
        }
    }
    match (args.format, reports.as_slice()) {
        (Some(Format::Json), [one]) => println!("{}", serde_json::to_string_pretty(one)?),
        (Some(Format::Json), parts) => println!("{}", serde_json::to_string_pretty(parts)?),
        (_, parts) => {
            for (i, r) in parts.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print_text(r);
            }
        }
    }
    Ok(())
}

/// What `inspect` says of the plugin `arg`.
fn report(runtime: &Runtime, arg: &str, recompile: bool) -> Result<Report> {
    let path = locate(arg)?;
    let plugin = runtime.load(&path, None)?;
    let engine = runtime.engine_of(plugin.kind());
    let bytes = std::fs::read(&path)?;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let (compile_ms, compiled_now, cached_load_ms) = match plugin.facts().origin {
        Origin::Cached(load) if !recompile => (
            runtime.cache().compile_time(engine, &bytes).map(ms),
            false,
            Some(ms(load)),
        ),
        origin => {
            let took = match origin {
                Origin::Compiled(took) if !recompile => took,
                _ => {
                    let start = Instant::now();
                    Component::new(engine, &bytes).map_err(lsgd_runtime::Error::from)?;
                    start.elapsed()
                }
            };
            // Compiled now: loaded once more to time the cache.
            let again = runtime.load(&path, None)?.facts().origin;
            (Some(ms(took)), true, cached_ms(again))
        }
    };
    let info = plugin.info();
    Ok(Report {
        part: None,
        file: plugin.label().to_string(),
        size_bytes: plugin.facts().size,
        kind: plugin.kind().to_string(),
        world: if plugin.stateful() {
            format!("stateful-{}", plugin.kind().world())
        } else {
            plugin.kind().world().to_string()
        },
        wit_version: plugin.contract().version.to_string(),
        stateful: plugin.stateful(),
        name: info.name.clone(),
        version: info.version.clone(),
        summary: info.summary.clone(),
        params: info
            .params
            .iter()
            .map(|p| Param {
                name: p.name.clone(),
                ty: type_name(&p.ty),
                default: p.default.as_ref().map(render),
                doc: p.doc.clone(),
            })
            .collect(),
        imports: plugin.facts().imports.clone(),
        compile_ms,
        compiled_now,
        cached_load_ms,
        canonical_nans: plugin.facts().canonical_nans,
    })
}

fn print_text(r: &Report) {
    if let Some(part) = &r.part {
        println!("part:        {part}");
    }
    println!(
        "file:        {} ({:.1} KiB)",
        r.file,
        r.size_bytes as f64 / 1024.0
    );
    println!("world:       {} (lsgd:policy@{})", r.world, r.wit_version);
    println!("plugin:      {} {}: {}", r.name, r.version, r.summary);
    if r.stateful {
        println!(
            "state:       kept between calls (snapshot/restore): saved in every checkpoint, \
             compared across ranks, restored on resume"
        );
    } else {
        println!("state:       none (outputs depend on parameters and train-state only)");
    }
    let nans = if r.canonical_nans {
        "canonical NaNs"
    } else {
        "native NaNs (--codec-canonical-nans for canonical)"
    };
    let compiled = match (r.compile_ms, r.compiled_now) {
        (Some(c), true) => format!("{c:.1} ms"),
        (Some(c), false) => format!("{c:.1} ms when first compiled"),
        (None, _) => "time not recorded (--recompile measures it)".into(),
    };
    match r.cached_load_ms {
        Some(c) => println!("compile:     {compiled}; from cache {c:.2} ms; {nans}"),
        None => println!("compile:     {compiled} (cache disabled); {nans}"),
    }
    if r.imports.is_empty() {
        println!("imports:     none");
    } else {
        println!(
            "imports:     {} (WASI is served by an empty sandbox)",
            r.imports.len()
        );
        for i in &r.imports {
            println!("  {i}");
        }
    }
    if r.params.is_empty() {
        println!("parameters:  none");
        return;
    }
    println!(
        "parameters:  (set with --set {}.NAME=VALUE)",
        kind_prefix(
            r.part
                .as_deref()
                .and_then(|p| p.split(' ').next())
                .unwrap_or(&r.kind)
        )
    );
    let w = r
        .params
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let tw = r
        .params
        .iter()
        .map(|p| p.ty.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let dw = r
        .params
        .iter()
        .map(|p| p.default.as_deref().map_or(10, str::len))
        .max()
        .unwrap_or(7)
        .max(7);
    println!("  {:<w$}  {:<tw$}  {:<dw$}  doc", "name", "type", "default");
    for p in &r.params {
        let default = p.default.as_deref().unwrap_or("(required)");
        println!(
            "  {:<w$}  {:<tw$}  {:<dw$}  {}",
            p.name, p.ty, default, p.doc
        );
    }
}

/// The load time of `origin` when it came from the cache.
fn cached_ms(origin: Origin) -> Option<f64> {
    match origin {
        Origin::Cached(d) => Some(d.as_secs_f64() * 1e3),
        Origin::Compiled(_) => None,
    }
}

fn kind_prefix(kind: &str) -> String {
    kind.replace('-', "_")
}
