//! Goyal et al. 2017 on Fashion-MNIST: test error against the global batch with the LR set by
//! the linear scaling rule, under no, constant and gradual warmup (their Figure 1 and Table 2c),
//! and the training curves of the three warmups at a large batch (their Figure 2). The
//! BatchNorm batch per worker, their n, stays 32 while the global batch grows: every 32-sample
//! micro-batch is one simulated worker (its own BN statistics, gradients summed), which is what
//! k = B/32 ranks would compute.

use std::fmt::Write as _;

use anyhow::Result;

use super::report::{self, Table};
use super::{Job, Outcome, Recipe, Settings, Subset, jobs, strings, upper_first};
use crate::plot::{self, Panel, Series};

/// ImageNet-1k's training images, for the batch with the same steps per epoch.
const IMAGENET: f64 = 1_281_167.0;

/// The warmups of Goyal et al. §2.2, as the `warmup` plugin names them.
pub const WARMUPS: [&str; 3] = ["gradual", "constant", "none"];

/// The study's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Data and epochs.
    pub subset: Subset,
    /// Global batches, ascending; the first is the reference batch.
    pub batches: Vec<u32>,
    /// BatchNorm batch per worker (Goyal's n), the micro-batch of every job.
    pub worker_batch: u32,
    /// LR at the reference batch.
    pub base_lr: f64,
    /// Warmup length in epochs.
    pub warmup_epochs: f64,
    /// Epochs at which the LR is multiplied by 0.1.
    pub milestones: &'static str,
    /// The data set and model.
    pub recipe: Recipe,
    /// Smallest k = B / reference at which the three warmups are all run (below it only
    /// gradual: with k near 1 they hardly differ).
    pub all_warmups_from_k: u32,
    /// The batch whose training curves are plotted.
    pub curve_batch: u32,
}

impl Plan {
    /// The full study or its quick variant.
    pub fn new(quick: bool) -> Plan {
        let full = Plan {
            subset: Subset::of_cnn_studies(quick),
            batches: vec![32, 128, 256, 512, 1024, 2048],
            worker_batch: 32,
            base_lr: 0.0125,
            warmup_epochs: 1.0,
            milestones: "3,5",
            all_warmups_from_k: 8,
            recipe: Recipe::default(),
            curve_batch: 1024,
        };
        if !quick {
            return full;
        }
        Plan {
            batches: vec![32, 512],
            warmup_epochs: 0.5,
            milestones: "1.5",
            curve_batch: 512,
            ..full
        }
    }

    /// The plan on `recipe`'s data and model, at its LR per sample.
    pub fn with_recipe(self, recipe: Recipe) -> Plan {
        Plan {
            base_lr: self.base_lr * recipe.lr_factor(),
            recipe,
            ..self
        }
    }

    /// The reference batch (k = 1).
    pub fn reference(&self) -> u32 {
        self.batches[0]
    }

    /// The warmups run at `batch`.
    pub fn warmups(&self, batch: u32) -> &'static [&'static str] {
        if batch >= self.all_warmups_from_k * self.reference() {
            &WARMUPS
        } else {
            &WARMUPS[..1]
        }
    }

    /// The warmup whose runs stand for `warmup` at `batch`: itself where it ran, gradual at the
    /// reference batch (where all three are the same run), none elsewhere.
    pub fn runs_of(&self, batch: u32, warmup: &'static str) -> Option<&'static str> {
        if self.warmups(batch).contains(&warmup) {
            Some(warmup)
        } else if batch == self.reference() {
            Some("gradual")
        } else {
            None
        }
    }

    /// The LR the linear scaling rule gives `batch`.
    pub fn lr(&self, batch: u32) -> f64 {
        self.base_lr * f64::from(batch) / f64::from(self.reference())
    }

    /// The job of one batch, warmup and seed.
    pub fn job(&self, batch: u32, warmup: &str, seed: u64) -> Job {
        let mut args = self.recipe.model_args();
        args.extend(strings(&["--schedule", "warmup"]));
        args.extend(self.subset.args());
        args.extend([
            "--global-batch".into(),
            batch.to_string(),
            "--max-micro-batch".into(),
            self.worker_batch.to_string(),
            "--reference-batch".into(),
            self.reference().to_string(),
            "--base-lr".into(),
            self.base_lr.to_string(),
            "--seed".into(),
            seed.to_string(),
            "--set".into(),
            format!("schedule.warmup={warmup}"),
            "--set".into(),
            format!("schedule.warmup_epochs={}", self.warmup_epochs),
            "--set".into(),
            format!("schedule.milestones={}", self.milestones),
        ]);
        Job::new(format!("b{batch}-{warmup}-s{seed}"), args)
    }

    /// Every job: each batch with its warmups, each seed.
    pub fn jobs(&self, seeds: &[u64]) -> Vec<Job> {
        let mut jobs = Vec::new();
        for &b in &self.batches {
            for w in self.warmups(b) {
                for &s in seeds {
                    jobs.push(self.job(b, w, s));
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
    let find = |batch: u32, warmup: &str| {
        jobs::of_seeds(&outcomes, &settings.seeds, |s| {
            plan.job(batch, warmup, s).id
        })
    };
    let all: Vec<&Outcome> = outcomes.iter().collect();
    let mut md = report::header(
        settings,
        &format!(
            "Goyal et al. 2017 on {}: linear scaling and warmup across global batches",
            settings.recipe.data_name()
        ),
        &all,
    );
    md += &setup(&plan);
    md += &error_vs_batch(settings, &plan, &find)?;
    md += &curves(settings, &plan, &outcomes)?;
    md += &findings(&plan, &find);
    Ok(md)
}

/// Figure 1 / Table 2c: the error against the batch for each warmup, table and plot.
fn error_vs_batch<'a>(
    settings: &Settings,
    plan: &Plan,
    find: &dyn Fn(u32, &str) -> Vec<&'a Outcome>,
) -> Result<String> {
    let mut md = String::from(
        "## Test error against the global batch (Goyal et al. Figure 1, Table 2c)\n\n\
         Final top-1 test error in %, mean over the seeds and (in brackets) their range. At the \
         reference batch k = 1 and the three warmups are the same run.\n\n",
    );
    let mut head = vec!["global batch", "k"];
    head.extend(WARMUPS.iter().map(|w| warmup_label(w)));
    let mut table = Table::new(&head);
    for &b in &plan.batches {
        let mut row = vec![b.to_string(), (b / plan.reference()).to_string()];
        for w in WARMUPS {
            row.push(match plan.runs_of(b, w) {
                Some(w) => report::over_seeds(&find(b, w), Outcome::error),
                None => "not run".into(),
            });
        }
        table.row(row);
    }
    md += &table.markdown();
    let series: Vec<Series> = WARMUPS
        .iter()
        .map(|w| Series {
            label: warmup_label(w).into(),
            points: plan
                .batches
                .iter()
                .filter_map(|&b| {
                    plan.runs_of(b, w)
                        .map(|w| report::error_point(b, &find(b, w)))
                })
                .collect(),
        })
        .collect();
    report::draw_error_vs_batch(
        settings,
        "error-vs-batch.png",
        &format!(
            "Goyal et al. Figure 1 on {}: error vs global batch",
            settings.recipe.data_name()
        ),
        series,
    )?;
    md += "![test error against the global batch](error-vs-batch.png)\n\n";
    Ok(md)
}

/// Figure 2: the training curves of the warmups at a large batch and the reference's, first
/// seed.
fn curves(settings: &Settings, plan: &Plan, outcomes: &[Outcome]) -> Result<String> {
    let seed = settings.seeds[0];
    let pick = |b: u32, w: &str| {
        let id = plan.job(b, w, seed).id;
        outcomes.iter().find(|o| o.id == id)
    };
    let mut curves: Vec<(String, &Outcome)> = Vec::new();
    if let Some(o) = pick(plan.reference(), "gradual") {
        curves.push((format!("batch {} (reference)", plan.reference()), o));
    }
    for w in plan.warmups(plan.curve_batch) {
        if let Some(o) = pick(plan.curve_batch, w) {
            curves.push((
                format!("batch {}, {}", plan.curve_batch, warmup_label(w)),
                o,
            ));
        }
    }
    draw_curves(settings, &curves, plan.curve_batch, seed)?;
    Ok(format!(
        "## Training curves at batch {} (Goyal et al. Figure 2)\n\nSeed {seed}; the reference \
         batch's curve for comparison. Batch {} is k = {} times the reference, as Goyal's 8k is \
         32 times their 256.\n\n![training curves](curves.png)\n\n",
        plan.curve_batch,
        plan.curve_batch,
        plan.curve_batch / plan.reference()
    ))
}

/// "gradual warmup", "constant warmup" or "no warmup".
fn warmup_label(warmup: &str) -> &'static str {
    match warmup {
        "gradual" => "gradual warmup",
        "constant" => "constant warmup",
        _ => "no warmup",
    }
}

/// How the study is set up and why these batches.
fn setup(plan: &Plan) -> String {
    let s = &plan.subset;
    let mut md = String::from("## Set-up\n\n");
    let _ = writeln!(
        md,
        "{} on the first {} {} \
         training images for {} epochs, tested on the first {} test images. SGD with momentum \
         0.9 and weight decay 10⁻⁴ (Goyal's), LR {} at the reference batch {} scaled linearly \
         (η = {}·B/{}), warmup over {} epoch(s) by the `warmup` plugin, then ×0.1 at epochs {}. \
         BatchNorm statistics over n = {} samples per worker at every batch: each {}-sample \
         micro-batch is one worker, so batch B is k = B/{} workers, as in Goyal et al. (n = 32).\n",
        upper_first(plan.recipe.model_text()),
        s.train,
        plan.recipe.data_name(),
        s.epochs,
        s.test,
        plan.base_lr,
        plan.reference(),
        plan.base_lr,
        plan.reference(),
        plan.warmup_epochs,
        plan.milestones,
        plan.worker_batch,
        plan.worker_batch,
        plan.worker_batch
    );
    let _ = writeln!(
        md,
        "**Why these batches.** What makes a batch large is how few steps an epoch takes, not \
         its size: Goyal's 8k is 0.6% of ImageNet, ~156 steps an epoch. The reference batch is \
         one worker of n = {} (k = 1, the smallest batch with Goyal's BN statistics), and the \
         range runs from {:.0} steps an epoch down to {:.1}, past the ~20 of Goyal's largest \
         batch (64k). The last column is the ImageNet batch that takes as many steps an epoch.\n",
        plan.worker_batch,
        s.steps_per_epoch(plan.reference()),
        s.steps_per_epoch(*plan.batches.last().expect("batches"))
    );
    let mut t = Table::new(&[
        "global batch",
        "k workers",
        "steps / epoch",
        "LR after warmup",
        "ImageNet batch, same steps / epoch",
    ]);
    for &b in &plan.batches {
        t.row(vec![
            b.to_string(),
            (b / plan.worker_batch).to_string(),
            format!("{:.1}", s.steps_per_epoch(b)),
            format!("{}", plan.lr(b)),
            format!("{:.0}", f64::from(b) * IMAGENET / s.train as f64),
        ]);
    }
    md += &t.markdown();
    md
}

/// Training loss, LR and test error of the curve runs against epochs.
fn draw_curves(
    settings: &Settings,
    curves: &[(String, &Outcome)],
    batch: u32,
    seed: u64,
) -> Result<()> {
    let series = |f: &dyn Fn(&Outcome) -> Vec<(f64, f64)>| report::series_of(curves, f);
    let panels = [
        Panel::new(
            "training loss",
            series(&|o| o.steps().map(|s| (s.epoch, s.loss)).collect()),
        ),
        Panel::new(
            "test error (%)",
            series(&|o| {
                o.evals()
                    .map(|e| (f64::from(e.epoch), 100.0 * (1.0 - e.test_acc)))
                    .collect()
            }),
        )
        .with_markers(),
        Panel::new(
            "learning rate",
            series(&|o| o.steps().map(|s| (s.epoch, s.lr)).collect()),
        ),
    ];
    plot::draw(
        &panels,
        &format!(
            "Goyal et al. Figure 2 on {}: warmups at batch {batch}, seed {seed}",
            settings.recipe.data_name()
        ),
        "epoch",
        &settings.out.join("curves.png"),
    )
}

/// What the numbers say, in sentences computed from them, and where that differs from the paper.
fn findings<'a>(plan: &Plan, find: &dyn Fn(u32, &str) -> Vec<&'a Outcome>) -> String {
    let mut md = String::from("## Findings (computed from the table)\n\n");
    let err = |b: u32, w: &str| report::mean_of(&find(b, w), Outcome::error);
    let Some(reference) = err(plan.reference(), "gradual") else {
        md += "- The reference batch diverged; nothing below compares against it.\n\n";
        return md;
    };
    let _ = writeln!(
        md,
        "- Reference batch {}: {reference:.2}% test error.",
        plan.reference()
    );
    // Goyal: gradual warmup matches the small-batch error up to 8k, then error rises.
    let within: Vec<u32> = plan
        .batches
        .iter()
        .copied()
        .take_while(|&b| err(b, "gradual").is_some_and(|e| e - reference <= 1.0))
        .collect();
    match within.last() {
        Some(&b) if b == *plan.batches.last().expect("batches") => {
            let _ = writeln!(
                md,
                "- With gradual warmup every batch up to {b} stays within 1 point of the \
                 reference: no breakdown in this range."
            );
        }
        Some(&b) => {
            let next = plan.batches[within.len()];
            let _ = writeln!(
                md,
                "- With gradual warmup the error stays within 1 point of the reference up to \
                 batch {b} ({:.0} steps an epoch) and breaks down at {next} ({}; {:.0} steps an \
                 epoch). Goyal et al. see the same shape, flat to 8k (~156 steps an epoch) and \
                 rising beyond.",
                plan.subset.steps_per_epoch(b),
                match err(next, "gradual") {
                    Some(e) => format!("{e:.2}%, +{:.2} points", e - reference),
                    None => "diverged".into(),
                },
                plan.subset.steps_per_epoch(next),
            );
        }
        None => {}
    }
    // Goyal's Table 2c order at 8k: gradual best, then none, then constant.
    let compared: Vec<u32> = plan
        .batches
        .iter()
        .copied()
        .filter(|&b| plan.warmups(b).len() == 3)
        .collect();
    let mut paper_order = 0;
    for &b in &compared {
        let gradual = find(b, "gradual");
        let cell = |w: &str| match err(b, w) {
            Some(e) => format!(
                "{e:.2}%{}",
                report::separation(&find(b, w), &gradual, Outcome::error)
            ),
            None => "diverged".into(),
        };
        let error = |w: &str| err(b, w).unwrap_or(f64::INFINITY);
        if error("gradual") < error("none") && error("none") < error("constant") {
            paper_order += 1;
        }
        let _ = writeln!(
            md,
            "- Batch {b} (k = {}): gradual {}, constant {}, none {}.",
            b / plan.reference(),
            err(b, "gradual").map_or("diverged".into(), |e| format!("{e:.2}%")),
            cell("constant"),
            cell("none")
        );
    }
    if !compared.is_empty() {
        let _ = writeln!(
            md,
            "- Gradual warmup has the lowest mean error, no warmup the next and constant \
             warmup the highest at {paper_order} of the {} batches where all three ran: the \
             order of Goyal et al.'s Table 2c at 8k (23.74%, 24.84%, 25.88%; reference \
             23.60%). Ranges are the seeds'; \"outside\" means every seed of that warmup is \
             worse (or better) than every seed of gradual warmup.",
            compared.len()
        );
    }
    md += &differences(
        plan,
        reference,
        within.last().copied(),
        err(32 * plan.reference(), "gradual"),
    );
    md
}

/// Where the small scale differs from the paper: `last_flat` is the largest batch within 1
/// point of the `reference` error, `at_k32` the gradual-warmup error at k = 32 (Goyal's 8k).
fn differences(plan: &Plan, reference: f64, last_flat: Option<u32>, at_k32: Option<f64>) -> String {
    let mut md = String::from("\n## Where this differs from the paper\n\n");
    let _ = writeln!(
        md,
        "- Scale: {} training images, a 2-conv net and {} epochs instead of ResNet-50 for 90 \
         epochs on 1.28M images. Warmup lasts {} epoch(s), a larger share of training than \
         Goyal's 5 of 90, because at large batches an epoch here is a handful of steps and a \
         warmup of a few steps warms nothing.",
        plan.subset.train, plan.subset.epochs, plan.warmup_epochs
    );
    if let Some(b) = last_flat {
        let _ = writeln!(
            md,
            "- Where it breaks: the last batch within 1 point here, {b}, takes {:.0} steps an \
             epoch, as many as an ImageNet batch of {:.0}; Goyal et al. hold their error to \
             8k (~156 steps an epoch) and lose it beyond. Counted in k = B/n instead, Goyal's \
             8k is k = 32 (batch {} here), where the error here has risen by {} points.",
            plan.subset.steps_per_epoch(b),
            f64::from(b) * IMAGENET / plan.subset.train as f64,
            32 * plan.reference(),
            at_k32.map_or("more than 1".into(), |e| format!("{:.1}", e - reference)),
        );
    }
    md += "- Test error here is on 10 classes of 28×28 images; absolute numbers are not \
           comparable with ImageNet's, only the shape of the curve is.\n\n";
    md
}
