//! Batch-size control (Mikami et al. 2018; Smith et al. 2018, "Don't decay the learning rate,
//! increase the batch size"): the SGD noise scale goes as η·N/B, so multiplying the batch by a
//! factor at the milestones, LR held, should train like dividing the LR by it, in fewer
//! optimizer steps. Against step decay at a fixed batch, and a fixed batch twice as large
//! (about as few steps as the ramp, the plain way), each with and without label smoothing.

use std::fmt::Write as _;

use anyhow::Result;

use super::report::{self, Table};
use super::{Job, Outcome, Recipe, Settings, Subset, jobs, strings, upper_first};
use crate::plot::{self, Panel};

/// The study's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The data set and model.
    pub recipe: Recipe,
    /// Data and epochs.
    pub subset: Subset,
    /// Global batch at step 0 (the ramp's start, the decay's throughout).
    pub batch: u32,
    /// BatchNorm batch per worker, the micro-batch of every job.
    pub worker_batch: u32,
    /// LR at `batch`.
    pub lr: f64,
    /// Epochs at which the LR is divided by `factor`, or the batch multiplied by it.
    pub milestones: &'static str,
    /// The batch growth per milestone, and the LR decay's inverse.
    pub factor: u32,
    /// Label-smoothing ε of the smoothed variants.
    pub epsilon: f64,
    /// Whether the third variant (fixed batch 2·`batch`) runs.
    pub double_batch: bool,
}

/// One variant of the training: how the noise is reduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// LR ÷ factor at each milestone, batch fixed.
    Decay,
    /// Batch × factor at each milestone, LR fixed.
    Ramp,
    /// LR ÷ factor at each milestone at twice the batch (LR scaled ×2).
    DoubleBatchDecay,
}

impl Variant {
    fn id(self) -> &'static str {
        match self {
            Variant::Decay => "decay",
            Variant::Ramp => "ramp",
            Variant::DoubleBatchDecay => "decay-2b",
        }
    }
}

impl Plan {
    /// The full study or its quick variant.
    pub fn new(quick: bool) -> Plan {
        Plan {
            recipe: Recipe::default(),
            subset: Subset::of_cnn_studies(quick),
            batch: 128,
            worker_batch: 32,
            lr: 0.05,
            milestones: if quick { "1" } else { "3,5" },
            factor: 4,
            epsilon: 0.1,
            double_batch: !quick,
        }
    }

    /// The variants run.
    pub fn variants(&self) -> Vec<Variant> {
        let mut v = vec![Variant::Decay, Variant::Ramp];
        if self.double_batch {
            v.push(Variant::DoubleBatchDecay);
        }
        v
    }

    /// What a variant is, in words.
    pub fn describe(&self, v: Variant) -> String {
        match v {
            Variant::Decay => format!(
                "batch {} fixed, LR {} ÷{} at epochs {}",
                self.batch, self.lr, self.factor, self.milestones
            ),
            Variant::Ramp => format!(
                "batch {} ×{} at epochs {}, LR {} fixed",
                self.batch, self.factor, self.milestones, self.lr
            ),
            Variant::DoubleBatchDecay => format!(
                "batch {} fixed, LR {} ÷{} at epochs {}",
                2 * self.batch,
                2.0 * self.lr,
                self.factor,
                self.milestones
            ),
        }
    }

    /// The plan on `recipe`'s data and model, at its LR per sample.
    pub fn with_recipe(self, recipe: Recipe) -> Plan {
        Plan {
            lr: self.lr * recipe.lr_factor(),
            recipe,
            ..self
        }
    }

    /// The job of one variant, with or without label smoothing, one seed.
    pub fn job(&self, v: Variant, smoothing: bool, seed: u64) -> Job {
        let mut args = self.recipe.model_args();
        args.extend(strings(&["--schedule", "warmup"]));
        args.extend(self.subset.args());
        let batch = if v == Variant::DoubleBatchDecay {
            2 * self.batch
        } else {
            self.batch
        };
        // The LR is given at the starting batch itself (k = 1): no warmup, and with the
        // ramp's `scaling=none` the LR stays put when the batch grows.
        args.extend([
            "--global-batch".into(),
            batch.to_string(),
            "--reference-batch".into(),
            batch.to_string(),
            "--base-lr".into(),
            (self.lr * f64::from(batch) / f64::from(self.batch)).to_string(),
            "--max-micro-batch".into(),
            self.worker_batch.to_string(),
            "--seed".into(),
            seed.to_string(),
            "--set".into(),
            "schedule.warmup_epochs=0".into(),
        ]);
        match v {
            Variant::Decay | Variant::DoubleBatchDecay => args.extend([
                "--set".into(),
                format!("schedule.milestones={}", self.milestones),
                "--set".into(),
                format!("schedule.gamma={}", 1.0 / f64::from(self.factor)),
            ]),
            Variant::Ramp => args.extend([
                "--set".into(),
                "schedule.milestones=".into(),
                "--set".into(),
                "schedule.scaling=none".into(),
                "--batch-size".into(),
                "batch-ramp".into(),
                "--set".into(),
                format!("batch_size.factor={}", self.factor),
                "--set".into(),
                format!("batch_size.milestones={}", self.milestones),
            ]),
        }
        if smoothing {
            args.extend([
                "--label-smoothing".into(),
                "label-smoothing".into(),
                "--set".into(),
                format!("label_smoothing.epsilon={}", self.epsilon),
            ]);
        }
        let ls = if smoothing { "ls" } else { "nols" };
        Job::new(format!("{}-{ls}-s{seed}", v.id()), args)
    }

    /// Every job.
    pub fn jobs(&self, seeds: &[u64]) -> Vec<Job> {
        let mut jobs = Vec::new();
        for v in self.variants() {
            for smoothing in [false, true] {
                for &s in seeds {
                    jobs.push(self.job(v, smoothing, s));
                }
            }
        }
        jobs
    }
}

/// Runs the study and returns its report.
pub fn run(settings: &Settings) -> Result<String> {
    let plan = Plan::new(settings.quick).with_recipe(settings.recipe);
    let outcomes = jobs::run_all(settings, &plan.jobs(&settings.seeds))?;
    let find = |v: Variant, smoothing: bool| {
        jobs::of_seeds(&outcomes, &settings.seeds, |s| plan.job(v, smoothing, s).id)
    };
    let all: Vec<&Outcome> = outcomes.iter().collect();
    let mut md = report::header(
        settings,
        &format!(
            "Batch-size control (Mikami et al. 2018, Smith et al. 2018) on {}",
            settings.recipe.data_name()
        ),
        &all,
    );
    let s = &plan.subset;
    let _ = writeln!(
        md,
        "## Set-up\n\n{} on the first {} {} training images for {} epochs, \
         tested on the first {} test images; SGD, momentum 0.9, weight decay 10⁻⁴, BatchNorm \
         over {} samples per worker. Smith et al.'s argument: the noise of SGD scales as \
         η·N/(B·(1−m)), so ×{f} on the batch does what ÷{f} on the LR does. The ramp is the \
         `batch-ramp` plugin with the `warmup` schedule at `scaling=none` (the LR does not \
         follow the batch); label smoothing is the `label-smoothing` plugin at ε = {}.\n",
        upper_first(plan.recipe.model_text()),
        s.train,
        plan.recipe.data_name(),
        s.epochs,
        s.test,
        plan.worker_batch,
        plan.epsilon,
        f = plan.factor,
    );
    md += "## Results\n\nFinal top-1 test accuracy in %, mean over the seeds and (in brackets) \
           their range; optimizer steps over the whole run.\n\n";
    let mut t = Table::new(&[
        "variant",
        "label smoothing",
        "test accuracy (%)",
        "optimizer steps",
        "final global batch",
        "final LR",
    ]);
    for v in plan.variants() {
        for smoothing in [false, true] {
            let runs = find(v, smoothing);
            let Some(first) = runs.first() else { continue };
            let last = first.steps().last();
            t.row(vec![
                plan.describe(v),
                if smoothing {
                    format!("ε = {}", plan.epsilon)
                } else {
                    "none".into()
                },
                report::over_seeds(&runs, Outcome::accuracy),
                first.step_count().to_string(),
                last.map_or("-".into(), |l| l.global_batch.to_string()),
                last.map_or("-".into(), |l| format!("{:.4}", l.lr)),
            ]);
        }
    }
    md += &t.markdown();

    md += &curves(settings, &plan, &outcomes)?;
    md += &findings(&plan, &find);
    Ok(md)
}

/// The first seed's curves of every variant without smoothing: accuracy, loss, batch and LR.
fn curves(settings: &Settings, plan: &Plan, outcomes: &[Outcome]) -> Result<String> {
    let seed = settings.seeds[0];
    let curves: Vec<(String, &Outcome)> = plan
        .variants()
        .into_iter()
        .filter_map(|v| {
            let id = plan.job(v, false, seed).id;
            outcomes
                .iter()
                .find(|o| o.id == id)
                .map(|o| (plan.describe(v), o))
        })
        .collect();
    let series = |f: &dyn Fn(&Outcome) -> Vec<(f64, f64)>| report::series_of(&curves, f);
    plot::draw(
        &[
            Panel::new(
                "test accuracy (%)",
                series(&|o| {
                    o.evals()
                        .map(|e| (f64::from(e.epoch), 100.0 * e.test_acc))
                        .collect()
                }),
            )
            .with_markers(),
            Panel::new(
                "training loss",
                series(&|o| o.steps().map(|s| (s.epoch, s.loss)).collect()),
            ),
            Panel::new(
                "global batch",
                series(&|o| {
                    o.steps()
                        .map(|s| (s.epoch, f64::from(s.global_batch)))
                        .collect()
                }),
            ),
            Panel::new(
                "learning rate",
                series(&|o| o.steps().map(|s| (s.epoch, s.lr)).collect()),
            ),
        ],
        &format!(
            "Batch ramp vs LR decay on {}, no label smoothing, seed {seed}",
            settings.recipe.data_name()
        ),
        "epoch",
        &settings.out.join("curves.png"),
    )?;
    Ok("![test accuracy, loss, batch and LR against epochs](curves.png)\n\n".into())
}

/// Sentences computed from the results, and where they differ from the papers.
fn findings<'a>(plan: &Plan, find: &dyn Fn(Variant, bool) -> Vec<&'a Outcome>) -> String {
    let mut md = String::from("## Findings (computed from the table)\n\n");
    let acc = |v, ls| report::mean_of(&find(v, ls), Outcome::accuracy);
    let steps = |v, ls| find(v, ls).first().map(|o| o.step_count());
    for ls in [false, true] {
        let label = if ls {
            "with label smoothing"
        } else {
            "without label smoothing"
        };
        if let (Some(d), Some(r), Some(sd), Some(sr)) = (
            acc(Variant::Decay, ls),
            acc(Variant::Ramp, ls),
            steps(Variant::Decay, ls),
            steps(Variant::Ramp, ls),
        ) {
            let _ = writeln!(
                md,
                "- {label}: the ramp reaches {r:.2}% against {d:.2}% for LR decay, {:+.2} \
                 points{}, in {sr} optimizer steps instead of {sd} ({:.0}% fewer).",
                r - d,
                report::separation(
                    &find(Variant::Ramp, ls),
                    &find(Variant::Decay, ls),
                    Outcome::accuracy
                ),
                100.0 * (1.0 - sr as f64 / sd as f64)
            );
        }
        if let (Some(r), Some(b), Some(sb)) = (
            acc(Variant::Ramp, ls),
            acc(Variant::DoubleBatchDecay, ls),
            steps(Variant::DoubleBatchDecay, ls),
        ) {
            let _ = writeln!(
                md,
                "- {label}: the fixed batch {} with decay takes {sb} steps and reaches {b:.2}%, \
                 {:+.2} points against the ramp{}.",
                2 * plan.batch,
                b - r,
                report::separation(
                    &find(Variant::DoubleBatchDecay, ls),
                    &find(Variant::Ramp, ls),
                    Outcome::accuracy
                )
            );
        }
    }
    for v in plan.variants() {
        if let (Some(a), Some(b)) = (acc(v, false), acc(v, true)) {
            let _ = writeln!(
                md,
                "- Label smoothing ε = {} on \"{}\": {:+.2} points{}.",
                plan.epsilon,
                plan.describe(v),
                b - a,
                report::separation(&find(v, true), &find(v, false), Outcome::accuracy)
            );
        }
    }
    md += "\n## Where this differs from the papers\n\n\
           - Smith et al. and Mikami et al. train ResNets on ImageNet/CIFAR for tens of epochs \
           with batches in the tens of thousands; here the whole run is a few hundred steps, \
           so the last, largest-batch phase is only a handful of steps. Their claim is that the \
           ramp matches decay's accuracy with fewer updates; a small gap either way within the \
           seeds' range agrees with it, a gap beyond the range does not.\n\
           - Mikami et al. use label smoothing to help at 34K–68K batches on ImageNet's 1000 \
           classes; with 10 classes its regularisation effect is smaller and test accuracy can \
           move either way by a few tenths.\n\n";
    md
}
