//! `lsgd-host compare`.

use anyhow::Result;
use clap::Args;

use super::args::{InputArgs, LimitArgs, ShapeArgs, parse_settings, settings_for};
use super::trace::Format;
use crate::compare::{
    CodecInputs, CodecReport, Report, Tolerance, compare, compare_codecs, same_kind,
};
use crate::plugin::PolicyKind;

/// Arguments of `compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Plugin A (a path or a name).
    a: String,
    /// Plugin B, of the same kind.
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
    /// A parameter: `a.KEY=VALUE`, `b.KEY=VALUE`, or `both.KEY=VALUE`; repeatable.
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
    let mut a = runtime.load_configured(&args.a, None, &with("a"))?;
    let mut b = runtime.load_configured(&args.b, None, &with("b"))?;
    let tolerance = Tolerance {
        rtol: args.rtol,
        atol: args.atol,
    };
    if a.kind() == PolicyKind::Codec || b.kind() == PolicyKind::Codec {
        same_kind(&a, &b)?;
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
        let report = compare_codecs(&mut a, &mut b, inputs, tolerance)?;
        if args.format == Some(Format::Json) {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_codecs(&report, a.label(), b.label(), tolerance);
        }
        return Ok(report.within_tolerance());
    }
    if !args.shape.given() {
        anyhow::bail!(
            "comparing {} plugins needs the run's shape: --epochs, --steps-per-epoch and --global-batch",
            a.kind()
        );
    }
    let inputs = args.inputs.inputs()?;
    if a.kind() == PolicyKind::LayerRate && inputs.norms.names().is_empty() {
        anyhow::bail!("comparing layer-rate plugins needs the tensors' norms: --norms-file FILE");
    }
    let report = compare(
        &mut a,
        &mut b,
        args.shape.clock()?,
        &inputs,
        tolerance,
        args.limits.bounds(),
    )?;
    if args.format == Some(Format::Json) {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report, a.label(), b.label(), tolerance);
    }
    Ok(report.within_tolerance())
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

fn print_text(r: &Report, a: &str, b: &str, t: Tolerance) {
    println!("A: {a}\nB: {b}");
    println!("compared {} over {} steps", r.call, r.steps);
    println!("max abs diff: {:e}", r.max_abs_diff);
    println!("max rel diff: {:e}", r.max_rel_diff);
    match &r.first_difference {
        None => println!("result: SAME ({})", rule(t)),
        Some(d) => println!(
            "result: DIFFERENT ({}): {} of {} steps differ; first at step {}: A = {}, B = {}",
            rule(t),
            r.differing_steps,
            r.steps,
            d.step,
            d.a,
            d.b
        ),
    }
}
