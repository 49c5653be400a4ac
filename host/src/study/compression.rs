//! Gradient compression: every codec plugin, with and without error feedback, data-parallel on
//! `mpirun` ranks; final accuracy against what went over the wire, and the time in the
//! collectives. The plot is accuracy against compression ratio, the figure the GRACE paper
//! (Xu et al. 2021) draws for its codecs.

use std::fmt::Write as _;

use anyhow::Result;

use super::report::{self, Table};
use super::{Job, Outcome, Recipe, Settings, Subset, jobs, strings};
use crate::plot::{self, Panel, Series};

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
}

impl Plan {
    /// The full study or its quick variant.
    pub fn new(quick: bool) -> Plan {
        let (subset, codecs) = if quick {
            let subset = Subset {
                train: 1024,
                test: 500,
                epochs: 1,
            };
            (subset, vec!["codec-fp16", "codec-top-k", "codec-sign"])
        } else {
            let subset = Subset {
                train: 12_000,
                test: 10_000,
                epochs: 2,
            };
            (subset, CODECS.to_vec())
        };
        Plan {
            recipe: Recipe::default(),
            subset,
            batch: 256,
            codecs,
            warmup_epochs: 0.5,
        }
    }

    /// The job of one codec (`None`: uncompressed) with or without error feedback, one seed.
    pub fn job(&self, codec: Option<&str>, feedback: bool, seed: u64, ranks: u32) -> Job {
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
        let name = match codec {
            Some(c) => {
                args.extend(["--codec".into(), c.to_string()]);
                if c == "codec-dgc" {
                    // The default stages of 100 steps outlast this run: at 12 steps a stage
                    // the ramp to 99.9% takes the first 48 of its 94 steps (4 stages).
                    args.extend(["--set".into(), "codec.warmup_steps=12".into()]);
                }
                if feedback {
                    args.extend(["--error-feedback".into(), "residual".into()]);
                }
                format!(
                    "{}-{}",
                    c.trim_start_matches("codec-"),
                    if feedback { "ef" } else { "noef" }
                )
            }
            None => "uncompressed".into(),
        };
        Job::new(format!("{name}-np{ranks}-s{seed}"), args).on_ranks(ranks)
    }

    /// Every job: the uncompressed baseline, then each codec without and with feedback.
    pub fn jobs(&self, seeds: &[u64], ranks: u32) -> Vec<Job> {
        let mut jobs: Vec<Job> = seeds
            .iter()
            .map(|&s| self.job(None, false, s, ranks))
            .collect();
        for c in &self.codecs {
            for feedback in [false, true] {
                for &s in seeds {
                    jobs.push(self.job(Some(c), feedback, s, ranks));
                }
            }
        }
        jobs
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
    let find = |codec: Option<&str>, feedback: bool| {
        jobs::of_seeds(&outcomes, &settings.seeds, |s| {
            plan.job(codec, feedback, s, ranks).id
        })
    };
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
         images. Every codec runs with its default parameters (`lsgd-host inspect CODEC` lists \
         them) but `dgc`, whose warm-up stages are shortened to 12 steps so that it reaches \
         its 99.9% sparsity halfway through the run, once without error feedback and once \
         with `--error-feedback residual` (EF-SGD: what the codec dropped is added to the \
         next step's gradient). Wire figures are rank \
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
    let base = report::mean_of(&find(None, false), Outcome::accuracy);
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
    row("none (fp32 all-reduce)", "-", &find(None, false));
    for c in &plan.codecs {
        for fb in [false, true] {
            row(
                c.trim_start_matches("codec-"),
                if fb { "residual" } else { "off" },
                &find(Some(c), fb),
            );
        }
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
    find: &dyn Fn(Option<&str>, bool) -> Vec<&'a Outcome>,
) -> Result<()> {
    let panel = |fb: bool| {
        let point = |runs: &[&Outcome]| {
            runs.first()
                .map(|o| (Wire::of(o).ratio, mean_or_chance(runs)))
        };
        let mut series = vec![Series {
            label: "uncompressed".into(),
            points: point(&find(None, false)).into_iter().collect(),
        }];
        series.extend(plan.codecs.iter().map(|c| Series {
            label: c.trim_start_matches("codec-").into(),
            points: point(&find(Some(c), fb)).into_iter().collect(),
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

/// Sentences computed from the results.
fn findings<'a>(
    plan: &Plan,
    base: Option<f64>,
    find: &dyn Fn(Option<&str>, bool) -> Vec<&'a Outcome>,
) -> String {
    let mut md = String::from("## Findings (computed from the table)\n\n");
    let Some(base) = base else {
        md += "- The uncompressed run diverged; nothing is compared.\n\n";
        return md;
    };
    let acc = |c: &str, fb| report::mean_of(&find(Some(c), fb), Outcome::accuracy);
    let (mut helped, mut close) = (Vec::new(), Vec::new());
    for c in &plan.codecs {
        let name = c.trim_start_matches("codec-");
        match (acc(c, false), acc(c, true)) {
            (Some(off), Some(on)) if on - off > 1.0 => {
                helped.push(format!("{name} ({off:.2} → {on:.2})"))
            }
            (None, Some(on)) => helped.push(format!("{name} (diverged → {on:.2})")),
            _ => {}
        }
        if acc(c, true).is_some_and(|a| (a - base).abs() <= 1.0) {
            let ratio = find(Some(c), true)
                .first()
                .map_or(1.0, |o| Wire::of(o).ratio);
            close.push(format!("{name} ({ratio:.0}×)"));
        }
    }
    let _ = writeln!(md, "- Uncompressed: {base:.2}%.");
    if !helped.is_empty() {
        let _ = writeln!(
            md,
            "- Error feedback gains more than 1 point for: {}.",
            helped.join(", ")
        );
    }
    if !close.is_empty() {
        let _ = writeln!(
            md,
            "- With error feedback within 1 point of uncompressed: {}.",
            close.join(", ")
        );
    }
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
