//! `lsgd-host compare`.

use anyhow::Result;
use clap::Args;

use super::args::{
    ComposeArgs, InputArgs, LimitArgs, ShapeArgs, compose_schedule, parse_settings, schedule_parts,
    settings_for,
};
use super::trace::Format;
use crate::compare::{
    CodecInputs, CodecReport, Report, Tolerance, compare, compare_codecs, same_kind,
};
use crate::plugin::{PolicyKind, Runtime};
use crate::policy::{Bounds, PolicySet};

/// Arguments of `compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Plugin A (a path or a name); for a composed schedule `A,B@STEP,…` (sequential, as
    /// `--then`) or `A*B*…` (chained, as `--chain`).
    a: String,
    /// Plugin B, of the same kind (composed likewise).
    b: String,
    /// The run whose states step policies see (not needed for codecs).
    #[command(flatten)]
    shape: ShapeArgs,
    /// Codecs: rows of the sample layer's weight (each bucket is a weight and a bias).
    #[arg(long, default_value_t = 512)]
    rows: u32,
    /// Codecs: columns of the sample weight, and the bias length.
    #[arg(long, default_value_t = 256)]
    cols: u32,
    /// Codecs: buckets to compare (steps 0, 1, ...).
    #[arg(long, default_value_t = 8)]
    buckets: u64,
    /// Codecs: seed of the sample gradients and of the codecs' seeds.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    limits: LimitArgs,
    /// Step policies: what training would feed back (metric, loss, tensor norms).
    #[command(flatten)]
    inputs: InputArgs,
    /// A parameter: `a.KEY=VALUE`, `b.KEY=VALUE`, or `both.KEY=VALUE` (`a.N.KEY=VALUE` for part N
    /// of a composed schedule); repeatable.
    #[arg(long = "set", value_name = "a|b|both.KEY=VALUE")]
    set: Vec<String>,
    /// Relative tolerance (0 with --atol 0: bit-identical).
    #[arg(long, default_value_t = 0.0)]
    rtol: f64,
    /// Absolute tolerance.
    #[arg(long, default_value_t = 0.0)]
    atol: f64,
    /// `json` prints the report as JSON (for codecs with each side's per-bucket
    /// `payload_blake3`, the digests another implementation's payloads must match).
    #[arg(long, value_enum)]
    format: Option<Format>,
}

/// Runs `compare`; `Ok(false)` when the plugins differ beyond tolerance.
pub fn run(args: CompareArgs) -> Result<bool> {
    if !(args.rtol >= 0.0 && args.atol >= 0.0) {
        anyhow::bail!("--rtol and --atol must be >= 0");
    }
    let runtime = args.limits.runtime()?;
    let settings = parse_settings(&args.set, &["a", "b", "both"])?;
    let both = settings_for(&settings, "both");
    let with = |side: &str| [both.clone(), settings_for(&settings, side)].concat();
    let bounds = args.limits.bounds();
    let (mut a, a_label) = side(&runtime, &args.a, &with("a"), bounds)?;
    let (mut b, b_label) = side(&runtime, &args.b, &with("b"), bounds)?;
    same_kind(first(&a), first(&b))?;
    let kind = first(&a).kind();
    let tolerance = Tolerance {
        rtol: args.rtol,
        atol: args.atol,
    };
    if let (Some(a), Some(b)) = (a.codec_mut(), b.codec_mut()) {
        anyhow::ensure!(
            args.rows > 0 && args.cols > 0 && args.buckets > 0,
            "--rows, --cols and --buckets must be at least 1"
        );
        let inputs = CodecInputs {
            rows: args.rows,
            cols: args.cols,
            buckets: args.buckets,
            seed: args.seed,
        };
        let report = compare_codecs(a, b, inputs, tolerance)?;
        if args.format == Some(Format::Json) {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_codecs(&report, a.label(), b.label(), tolerance);
        }
        return Ok(report.within_tolerance());
    }
    if !args.shape.given() {
        anyhow::bail!(
            "comparing {kind} plugins needs the run's shape: --epochs, --steps-per-epoch and --global-batch"
        );
    }
    let inputs = args.inputs.inputs()?;
    if kind == PolicyKind::LayerRate && inputs.norms.names().is_empty() {
        anyhow::bail!("comparing layer-rate plugins needs the tensors' norms: --norms-file FILE");
    }
    let report = compare(
        &mut a,
        &mut b,
        kind,
        args.shape.clock()?,
        &inputs,
        &args.inputs.drift()?,
        tolerance,
    )?;
    if args.format == Some(Format::Json) {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report, kind, &a_label, &b_label, tolerance);
    }
    Ok(report.within_tolerance())
}

/// One side of the comparison: its plugin, or the parts of a composed schedule (`A,B@S` or
/// `A*B`), configured with `settings` (`N.KEY` for part N); and how to name it.
fn side(
    runtime: &Runtime,
    spec: &str,
    settings: &[(String, String)],
    bounds: Bounds,
) -> Result<(PolicySet, String)> {
    let chained = spec.contains('*');
    let mut parts = spec
        .split(if chained { '*' } else { ',' })
        .map(str::to_string);
    let first = parts.next().expect("split yields one part");
    let compose = match chained {
        true => ComposeArgs {
            then: Vec::new(),
            chain: parts.collect(),
        },
        false => ComposeArgs {
            then: parts.collect(),
            chain: Vec::new(),
        },
    };
    let (composition, later) = compose.composition()?;
    let mut settings = schedule_parts(settings, later.len())?;
    let plugin = runtime.load_configured(&first, None, &std::mem::take(&mut settings[0]))?;
    let label = match later.is_empty() {
        true => plugin.label().to_string(),
        false => format!("{spec} ({composition})"),
    };
    let mut set = PolicySet::new(vec![plugin], bounds)?;
    compose_schedule(runtime, &mut set, composition, &later, settings)?;
    Ok((set, label))
}

/// A side's plugin (a composed schedule's first part).
fn first(set: &PolicySet) -> &crate::plugin::Plugin {
    set.plugins()[0].1
}

fn rule(t: Tolerance) -> String {
    if t.rtol == 0.0 && t.atol == 0.0 {
        "bit-identical".to_string()
    } else {
        format!("rtol {:e}, atol {:e}", t.rtol, t.atol)
    }
}

fn print_codecs(r: &CodecReport, a: &str, b: &str, t: Tolerance) {
    println!("A: {a}\nB: {b}");
    println!(
        "compared decode(encode(x)) over {} buckets of {} floats",
        r.buckets, r.floats
    );
    for (tag, s) in [("A", &r.a), ("B", &r.b)] {
        println!(
            "{tag} {}: {} payload bytes, compression {:.2}x, max |error| {:e}, relative L2 error {:e}",
            s.name, s.payload_bytes, s.compression_ratio, s.max_abs_error, s.rel_l2_error
        );
    }
    println!(
        "payloads: {}",
        if r.payloads_identical {
            "identical bytes"
        } else {
            "differ"
        }
    );
    println!("max abs diff: {:e}", r.max_abs_diff);
    println!("max rel diff: {:e}", r.max_rel_diff);
    match &r.first_difference {
        None => println!("result: SAME ({})", rule(t)),
        Some(d) => println!(
            "result: DIFFERENT ({}): {} elements differ; first in bucket {} at element {}: A = {}, B = {}",
            rule(t),
            r.differing_elements,
            d.bucket,
            d.index,
            d.a,
            d.b
        ),
    }
}

fn print_text(r: &Report, kind: PolicyKind, a: &str, b: &str, t: Tolerance) {
    println!("A: {a}\nB: {b}");
    match kind {
        PolicyKind::Sync => println!(
            "compared {} and, where both end a window, outer-step over {} steps",
            r.call, r.steps
        ),
        _ => println!("compared {} over {} steps", r.call, r.steps),
    }
    if let Some(d) = r.first_difference.filter(|d| d.output != r.call) {
        println!("first difference in: {}", d.output);
    }
    println!("max abs diff: {:e}", r.max_abs_diff);
    println!("max rel diff: {:e}", r.max_rel_diff);
    match &r.first_difference {
        None => println!("result: SAME ({})", rule(t)),
        Some(d) => {
            let (va, vb) = match d.words {
                Some([wa, wb]) => (wa.to_string(), wb.to_string()),
                None => (d.a.to_string(), d.b.to_string()),
            };
            println!(
                "result: DIFFERENT ({}): {} of {} steps differ; first at step {}: A = {va}, B = {vb}",
                rule(t),
                r.differing_steps,
                r.steps,
                d.step,
            )
        }
    }
}
