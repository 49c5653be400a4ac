//! `lsgd-host compare`.

use anyhow::Result;
use clap::Args;

use super::args::{LimitArgs, ShapeArgs, parse_settings, settings_for};
use super::trace::Format;
use crate::compare::{Report, Tolerance, compare};

/// Arguments of `compare`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Plugin A (a path or a name).
    a: String,
    /// Plugin B, of the same kind.
    b: String,
    #[command(flatten)]
    shape: ShapeArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// A parameter: `a.KEY=VALUE`, `b.KEY=VALUE`, or `both.KEY=VALUE`; repeatable.
    #[arg(long = "set", value_name = "a|b|both.KEY=VALUE")]
    set: Vec<String>,
    /// Relative tolerance (0 with --atol 0: bit-identical).
    #[arg(long, default_value_t = 0.0)]
    rtol: f64,
    /// Absolute tolerance.
    #[arg(long, default_value_t = 0.0)]
    atol: f64,
    /// `json` prints the report as JSON.
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
    let report = compare(
        &mut a,
        &mut b,
        args.shape.clock()?,
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

fn print_text(r: &Report, a: &str, b: &str, t: Tolerance) {
    println!("A: {a}\nB: {b}");
    println!("compared {} over {} steps", r.call, r.steps);
    println!("max abs diff: {:e}", r.max_abs_diff);
    println!("max rel diff: {:e}", r.max_rel_diff);
    let rule = if t.rtol == 0.0 && t.atol == 0.0 {
        "bit-identical".to_string()
    } else {
        format!("rtol {:e}, atol {:e}", t.rtol, t.atol)
    };
    match &r.first_difference {
        None => println!("result: SAME ({rule})"),
        Some(d) => println!(
            "result: DIFFERENT ({rule}): {} of {} steps differ; first at step {}: A = {}, B = {}",
            r.differing_steps, r.steps, d.step, d.a, d.b
        ),
    }
}
