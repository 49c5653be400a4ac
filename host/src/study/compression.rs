//! Gradient compression: every codec plugin, with and without error feedback, data-parallel on
//! `mpirun` ranks; final accuracy against what went over the wire, and the time in the
//! collectives. The plot is accuracy against compression ratio, the figure the GRACE paper
//! (Xu et al. 2021) draws for its codecs. Beside those rows: PowerSGD with PyTorch's residual
//! (`--error-feedback mean`), DGC's momentum correction (`--error-feedback momentum`) for the
//! sign and sparsifying codecs, and the evidence on error feedback with heavy-ball momentum
//! (the uncompressed run and ef-sign at SGD momentum 0).

use std::fmt::Write as _;

use anyhow::Result;

use super::report::{self, Table};
use super::{Job, Outcome, Recipe, Settings, Subset, jobs, strings};
use crate::plot::{self, Panel, Series};
use crate::train::exchange::ErrorFeedback;

/// The codecs of the full study: every reference codec plugin but `codec-identity` (the
/// uncompressed baseline is the run without a codec) and `codec-int8-c` (`codec-int8` in C).
pub const CODECS: [&str; 13] = [
    "codec-fp16",
    "codec-bf16",
    "codec-int8",
    "codec-qsgd",
    "codec-natural",
    "codec-terngrad",
    "codec-sign",
    "codec-ef-sign",
    "codec-top-k",
    "codec-random-k",
    "codec-threshold",
    "codec-dgc",
    "codec-powersgd",
];

/// One row of the study: a codec (`None`: uncompressed) with an error-feedback mode, at the
/// run's SGD momentum (0.9) or, for the evidence rows, another.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    /// The codec plugin, or none for the fp32 all-reduce.
    pub codec: Option<&'static str>,
    /// `--error-feedback`.
    pub feedback: ErrorFeedback,
    /// `--momentum`, when not the run's.
    pub momentum: Option<f64>,
}

impl Variant {
    /// The codec with `feedback` at the run's momentum.
    pub fn new(codec: Option<&'static str>, feedback: ErrorFeedback) -> Variant {
        Variant {
            codec,
            feedback,
            momentum: None,
        }
    }

    /// The fp32 all-reduce.
    pub const UNCOMPRESSED: Variant = Variant {
        codec: None,
        feedback: ErrorFeedback::Off,
        momentum: None,
    };

    /// The same at SGD momentum `m`.
    pub fn at_momentum(self, m: f64) -> Variant {
        Variant {
            momentum: Some(m),
            ..self
        }
    }

    /// The report's codec column.
    fn label(&self) -> String {
        let name = match self.codec {
            Some(c) => c.trim_start_matches("codec-").to_string(),
            None => "none (fp32 all-reduce)".into(),
        };
        match self.momentum {
            Some(m) => format!("{name}, SGD momentum {m}"),
            None => name,
        }
    }

    /// The report's error-feedback column.
    fn feedback_label(&self) -> &'static str {
        match (self.codec, self.feedback) {
            (None, _) => "-",
            (_, ErrorFeedback::Off) => "off",
            (_, ErrorFeedback::Residual) => "residual",
            (_, ErrorFeedback::Mean) => "mean (PyTorch's)",
            (_, ErrorFeedback::Momentum) => "momentum (DGC)",
        }
    }
}

/// The study's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The data set and model.
    pub recipe: Recipe,
    /// Data and epochs.
    pub subset: Subset,
    /// Global batch.
    pub batch: u32,
    /// The codecs compared.
    pub codecs: Vec<&'static str>,
    /// Warmup length in epochs.
    pub warmup_epochs: f64,
    /// The rows beside each codec's `off` and `residual` ones.
    pub extras: Vec<Variant>,
}

impl Plan {
    /// The full study or its quick variant.
    pub fn new(quick: bool) -> Plan {
        use ErrorFeedback::{Mean, Momentum, Off, Residual};
        let (subset, codecs, extras) = if quick {
            let subset = Subset {
                train: 1024,
                test: 500,
                epochs: 1,
            };
            let extras = vec![Variant::new(Some("codec-top-k"), Momentum)];
            (
                subset,
                vec!["codec-fp16", "codec-top-k", "codec-sign"],
                extras,
            )
        } else {
            let subset = Subset {
                train: 12_000,
                test: 10_000,
                epochs: 2,
            };
            let mut extras = vec![Variant::new(Some("codec-powersgd"), Mean)];
            for c in ["codec-sign", "codec-ef-sign", "codec-top-k"] {
                extras.push(Variant::new(Some(c), Momentum));
            }
            // Error feedback with heavy-ball momentum applied after the exchange (the run's
            // 0.9) against none: does the residual hurt, or its replay by momentum?
            extras.push(Variant::UNCOMPRESSED.at_momentum(0.0));
            for fb in [Off, Residual] {
                extras.push(Variant::new(Some("codec-ef-sign"), fb).at_momentum(0.0));
            }
            (subset, CODECS.to_vec(), extras)
        };
        Plan {
            recipe: Recipe::default(),
            subset,
            batch: 256,
            codecs,
            warmup_epochs: 0.5,
            extras,
        }
    }

    /// Every row: the baseline, each codec without and with (residual) error feedback, then
    /// the extras.
    pub fn variants(&self) -> Vec<Variant> {
        let mut v = vec![Variant::UNCOMPRESSED];
        for c in &self.codecs {
            for fb in [ErrorFeedback::Off, ErrorFeedback::Residual] {
                v.push(Variant::new(Some(c), fb));
            }
        }
        v.extend(self.extras.iter().copied());
        v
    }

    /// The job of one row, one seed.
    pub fn job(&self, v: &Variant, seed: u64, ranks: u32) -> Job {
        let mut args = self.recipe.model_args();
        args.extend(strings(&["--schedule", "warmup"]));
        args.extend(self.subset.args());
        args.extend([
            "--global-batch".into(),
            self.batch.to_string(),
            // Goyal's 0.1 per 256 samples, times the recipe's factor (`run`'s default LR and
            // reference batch for the cnn).
            "--base-lr".into(),
            (0.1 * self.recipe.lr_factor()).to_string(),
            "--seed".into(),
            seed.to_string(),
            "--set".into(),
            format!("schedule.warmup_epochs={}", self.warmup_epochs),
            "--set".into(),
            "schedule.milestones=".into(),
        ]);
        let mut name = match v.codec {
            Some(c) => {
                args.extend(["--codec".into(), c.to_string()]);
                if c == "codec-dgc" {
                    // The default stages of 100 steps outlast this run: at 12 steps a stage
                    // the ramp to 99.9% takes the first 48 of its 94 steps (4 stages).
                    args.extend(["--set".into(), "codec.warmup_steps=12".into()]);
                }
                let (flag, tag) = match v.feedback {
                    ErrorFeedback::Off => (None, "noef"),
                    ErrorFeedback::Residual => (Some("residual"), "ef"),
                    ErrorFeedback::Mean => (Some("mean"), "efmean"),
                    ErrorFeedback::Momentum => (Some("momentum"), "efmom"),
                };
                if let Some(mode) = flag {
                    args.extend(["--error-feedback".into(), mode.into()]);
                }
                format!("{}-{tag}", c.trim_start_matches("codec-"))
            }
            None => "uncompressed".into(),
        };
        if let Some(m) = v.momentum {
            args.extend(["--momentum".into(), m.to_string()]);
            name += &format!("-m{m}");
        }
        Job::new(format!("{name}-np{ranks}-s{seed}"), args).on_ranks(ranks)
    }

    /// Every job: each row of [`Plan::variants`] for every seed.
    pub fn jobs(&self, seeds: &[u64], ranks: u32) -> Vec<Job> {
        self.variants()
            .iter()
            .flat_map(|v| seeds.iter().map(move |&s| self.job(v, s, ranks)))
            .collect()
    }
}

/// Mean wire figures of a job's steps (rank 0's view).
struct Wire {
    /// Gradient bytes as binary32 over payload bytes.
    ratio: f64,
    /// Payload bytes per step.
    payload: f64,
    /// Bytes the rank sent per step.
    sent: f64,
    /// Milliseconds in the collectives per step.
    collective_ms: f64,
    /// Milliseconds per step in all.
    step_ms: f64,
}

impl Wire {
    fn of(o: &Outcome) -> Wire {
        Wire {
            ratio: o.mean_over_steps(|s| s.compression_ratio),
            payload: o.mean_over_steps(|s| s.payload_bytes as f64),
            sent: o.mean_over_steps(|s| s.bytes_sent as f64),
            collective_ms: 1e3 * o.mean_over_steps(|s| s.communication_s),
            step_ms: 1e3 * o.mean_over_steps(|s| f64::from(s.global_batch) / s.samples_per_s),
        }
    }
}

/// Runs the study and returns its report.
pub fn run(settings: &Settings) -> Result<String> {
    let plan = Plan {
        recipe: settings.recipe,
        ..Plan::new(settings.quick)
    };
    let ranks = settings.ranks;
    anyhow::ensure!(
        ranks >= 2,
        "the compression study needs at least 2 ranks (--np), got {ranks}"
    );
    let outcomes = jobs::run_all(settings, &plan.jobs(&settings.seeds, ranks))?;
    let find =
        |v: &Variant| jobs::of_seeds(&outcomes, &settings.seeds, |s| plan.job(v, s, ranks).id);
    let all: Vec<&Outcome> = outcomes.iter().collect();
    let mut md = report::header(
        settings,
        &format!(
            "Gradient compression on {}: accuracy against bytes on the wire",
            settings.recipe.data_name()
        ),
        &all,
    );
    let s = &plan.subset;
    let _ = writeln!(
        md,
        "## Set-up\n\n{ranks} ranks under `mpirun` on this machine (shared memory), {} \
         on the first {} {} training images for {} epochs at global batch {} \
         (LR {} per 256, warmup over {} epoch, no decay), tested on the first {} test \
         images, SGD with momentum 0.9. Every codec runs with its default parameters \
         (`lsgd-host inspect CODEC` lists them; PowerSGD at rank 2 with warm start) but `dgc`, \
         whose warm-up stages are shortened to 12 steps so that it reaches its 99.9% sparsity \
         halfway through the run, once without error feedback and once with \
         `--error-feedback residual` (EF-SGD: what the codec dropped is added to the next \
         step's gradient). Further rows: PowerSGD with `--error-feedback mean` (PyTorch \
         `powerSGD_hook`'s residual: the rank's input minus the ranks' mean reconstruction), \
         `--error-feedback momentum` (Deep Gradient Compression's momentum correction, which \
         keeps the momentum inside the exchange) and, at SGD momentum 0, the uncompressed run \
         and ef-sign. Wire figures are rank \
         0's means over the steps: the compression ratio is gradient bytes as binary32 over \
         payload bytes; bytes sent count every message of the collective (a sparse or \
         quantized payload is all-gathered, so a rank sends it to each peer); collective time \
         is the time inside MPI calls, waiting for the slower rank included; step time is the \
         whole step.\n",
        plan.recipe.model_text(),
        s.train,
        plan.recipe.data_name(),
        s.epochs,
        plan.batch,
        0.1 * plan.recipe.lr_factor(),
        plan.warmup_epochs,
        s.test,
    );
    md += "## Results\n\nFinal top-1 test accuracy in %, mean over the seeds and (in brackets) \
           their range.\n\n";
    let mut t = Table::new(&[
        "codec",
        "error feedback",
        "test accuracy (%)",
        "vs uncompressed",
        "compression ratio",
        "payload bytes / step",
        "bytes sent / step",
        "collective ms / step",
        "step ms",
    ]);
    let base = report::mean_of(&find(&Variant::UNCOMPRESSED), Outcome::accuracy);
    let mut row = |label: &str, fb: &str, runs: &[&Outcome]| {
        let Some(first) = runs.first() else { return };
        let w = Wire::of(first);
        let delta = match (report::mean_of(runs, Outcome::accuracy), base) {
            (Some(a), Some(b)) => format!("{:+.2}", a - b),
            _ => "-".into(),
        };
        t.row(vec![
            label.into(),
            fb.into(),
            report::over_seeds(runs, Outcome::accuracy),
            delta,
            format!("{:.1}×", w.ratio),
            format!("{:.0}", w.payload),
            format!("{:.0}", w.sent),
            format!("{:.2}", w.collective_ms),
            format!("{:.1}", w.step_ms),
        ]);
    };
    for v in plan.variants() {
        row(&v.label(), v.feedback_label(), &find(&v));
    }
    md += &t.markdown();

    draw_figure(settings, &plan, &find)?;
    md += "![accuracy against compression ratio](accuracy-vs-compression.png)\n\n";
    md += &findings(&plan, base, &find);
    Ok(md)
}

/// GRACE's figure: accuracy against compression ratio, a point per codec, one panel without
/// error feedback and one with it.
fn draw_figure<'a>(
    settings: &Settings,
    plan: &Plan,
    find: &dyn Fn(&Variant) -> Vec<&'a Outcome>,
) -> Result<()> {
    let panel = |fb: bool| {
        let feedback = match fb {
            true => ErrorFeedback::Residual,
            false => ErrorFeedback::Off,
        };
        let point = |runs: &[&Outcome]| {
            runs.first()
                .map(|o| (Wire::of(o).ratio, mean_or_chance(runs)))
        };
        let mut series = vec![Series {
            label: "uncompressed".into(),
            points: point(&find(&Variant::UNCOMPRESSED)).into_iter().collect(),
        }];
        series.extend(plan.codecs.iter().map(|c| {
            Series {
                label: c.trim_start_matches("codec-").into(),
                points: point(&find(&Variant::new(Some(c), feedback)))
                    .into_iter()
                    .collect(),
            }
        }));
        let title = if fb {
            "test accuracy (%), error feedback (residual)"
        } else {
            "test accuracy (%), no error feedback"
        };
        Panel::new(title, series).log_x().with_markers()
    };
    plot::draw(
        &[panel(false), panel(true)],
        &format!(
            "Accuracy vs compression ratio, {} ranks (GRACE's figure)",
            settings.ranks
        ),
        "compression ratio (gradient bytes as binary32 / payload bytes, log scale)",
        &settings.out.join("accuracy-vs-compression.png"),
    )
}

/// Mean accuracy over seeds, chance (10%) when all diverged, for plots.
fn mean_or_chance(runs: &[&Outcome]) -> f64 {
    report::mean_of(runs, Outcome::accuracy).unwrap_or(10.0)
}

/// A mean accuracy as the findings print it.
fn shown(a: Option<f64>) -> String {
    a.map_or("diverged".to_string(), |a| format!("{a:.2}"))
}

/// Sentences computed from the results.
fn findings<'a>(
    plan: &Plan,
    base: Option<f64>,
    find: &dyn Fn(&Variant) -> Vec<&'a Outcome>,
) -> String {
    use ErrorFeedback::{Off, Residual};
    let mut md = String::from("## Findings (computed from the table)\n\n");
    let Some(base) = base else {
        md += "- The uncompressed run diverged; nothing is compared.\n\n";
        return md;
    };
    let acc = |v: Variant| report::mean_of(&find(&v), Outcome::accuracy);
    let (mut helped, mut hurt, mut close) = (Vec::new(), Vec::new(), Vec::new());
    for &c in &plan.codecs {
        let name = c.trim_start_matches("codec-");
        let (off, on) = (
            acc(Variant::new(Some(c), Off)),
            acc(Variant::new(Some(c), Residual)),
        );
        match (off, on) {
            (Some(a), Some(b)) if b - a > 1.0 => helped.push(format!("{name} ({a:.2} → {b:.2})")),
            (None, Some(b)) => helped.push(format!("{name} (diverged → {b:.2})")),
            (Some(a), b) if b.is_none_or(|b| a - b > 1.0) => {
                hurt.push(format!("{name} ({a:.2} → {})", shown(b)))
            }
            _ => {}
        }
        if on.is_some_and(|a| (a - base).abs() <= 1.0) {
            let ratio = find(&Variant::new(Some(c), Residual))
                .first()
                .map_or(1.0, |o| Wire::of(o).ratio);
            close.push(format!("{name} ({ratio:.0}×)"));
        }
    }
    let _ = writeln!(md, "- Uncompressed: {base:.2}%.");
    for (what, list) in [
        (
            "Error feedback (residual) gains more than 1 point for",
            &helped,
        ),
        (
            "Error feedback (residual) loses more than 1 point for",
            &hurt,
        ),
        ("With error feedback within 1 point of uncompressed", &close),
    ] {
        if !list.is_empty() {
            let _ = writeln!(md, "- {what}: {}.", list.join(", "));
        }
    }
    md += &extra_findings(plan, &acc);
    md += "\n## Where this differs from GRACE\n\n\
           - GRACE trains ResNets and LSTMs for full schedules on up to 8 GPUs over a network; \
           here two ranks share one machine's memory, so the collective takes microseconds to \
           milliseconds and compression saves bytes, not time: the step-time column shows the \
           codecs' own cost instead. Bytes sent are what a network would carry.\n\
           - Runs are short (a few hundred steps at most), which favours codecs whose error \
           averages out quickly; GRACE's finding that error feedback rescues biased codecs \
           (sign, top-k) is visible when the two rows of such a codec differ by more than the \
           seeds' range.\n\n";
    md
}

/// The findings of the rows beside each codec's `off` and `residual`: PowerSGD's residuals,
/// DGC's momentum correction, and error feedback at SGD momentum 0 against 0.9.
fn extra_findings(plan: &Plan, acc: &dyn Fn(Variant) -> Option<f64>) -> String {
    use ErrorFeedback::{Mean, Momentum, Off, Residual};
    let mut md = String::new();
    for v in &plan.extras {
        let Some(c) = v.codec else { continue };
        let at = |fb| acc(Variant { feedback: fb, ..*v });
        let name = v.label();
        match v.feedback {
            Mean => {
                let _ = writeln!(
                    md,
                    "- {name}: {} without error feedback, {} with our residual, {} with \
                     PyTorch's (`mean`).",
                    shown(at(Off)),
                    shown(at(Residual)),
                    shown(at(Mean))
                );
            }
            Momentum => {
                let _ = writeln!(
                    md,
                    "- {name} with DGC's momentum correction: {} (off {}, residual {}).",
                    shown(at(Momentum)),
                    shown(at(Off)),
                    shown(at(Residual))
                );
            }
            Off if v.momentum.is_some() && c == "codec-ef-sign" => {
                let run = Variant::new(Some(c), Off);
                let _ = writeln!(
                    md,
                    "- ef-sign, off → residual: {} → {} at SGD momentum 0.9, {} → {} at \
                     momentum 0 (uncompressed at momentum 0: {}).",
                    shown(acc(run)),
                    shown(acc(Variant {
                        feedback: Residual,
                        ..run
                    })),
                    shown(at(Off)),
                    shown(at(Residual)),
                    shown(acc(
                        Variant::UNCOMPRESSED.at_momentum(v.momentum.unwrap_or(0.0))
                    ))
                );
            }
            _ => {}
        }
    }
    md
}
