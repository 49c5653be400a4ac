//! Synchronising less on a network: synchronous data parallelism (the overlapped fp32
//! all-reduce every step) against local SGD and DiLoCo (`--sync local-sgd|diloco`, contract
//! 0.5) at windows of H ∈ {4, 16, 64} steps, and DiLoCo with a codec on its pseudo-gradient,
//! trained on the emulated cluster (`scripts/netlab.sh`) with 2 and 4 hosts at 1 Gbit/s and
//! 100 Mbit/s. The report sets test accuracy against wall-clock time and against the bytes a
//! rank sent, with the time to a fixed accuracy, and places the result beside Goyal et al.'s
//! remark (as this project's brief puts it) on Federated Averaging and DiLoCo's 500× figure. Like the network study it brings
//! the lab up for each condition itself, so it needs what the lab needs (root, network
//! namespaces).

use std::fmt::Write as _;

use anyhow::Result;

use super::lab::{Lab, default_netlab};
use super::report::{self, Table};
use super::{Job, Outcome, Settings, Subset, jobs, network, strings};
use crate::plot::{self, Panel, Series};
use crate::train::metrics::EvalRecord;

/// How the ranks synchronise in a windowed row: the sync plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `local-sgd`: average the weights every H steps (Federated Averaging with every client).
    LocalSgd,
    /// `diloco`: every H steps an outer Nesterov step (η 0.7, μ 0.9) on the averaged Δ.
    Diloco,
}

impl Policy {
    /// The plugin's name.
    pub fn plugin(self) -> &'static str {
        match self {
            Policy::LocalSgd => "local-sgd",
            Policy::Diloco => "diloco",
        }
    }

    /// Its name in the report.
    fn label(self) -> &'static str {
        match self {
            Policy::LocalSgd => "local SGD",
            Policy::Diloco => "DiLoCo",
        }
    }
}

/// One row: synchronous data parallelism, or a sync plugin at a window of `period` steps,
/// optionally with a codec (and residual error feedback) on the averaged pseudo-gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    /// The sync plugin; `None` is synchronous data parallelism.
    pub policy: Option<Policy>,
    /// H, the window's steps (`sync.period`); 1 for synchronous rows.
    pub period: u32,
    /// A codec on Δ at the window's end (`--codec`, with `--error-feedback residual`).
    pub codec: Option<&'static str>,
}

impl Variant {
    /// Synchronous data parallelism: the fp32 gradients all-reduced every step, each bucket
    /// while the backward pass computes the rest (`--overlap`).
    pub const SYNCHRONOUS: Variant = Variant {
        policy: None,
        period: 1,
        codec: None,
    };

    /// `policy` with windows of `period` steps, Δ averaged in fp32.
    pub const fn windowed(policy: Policy, period: u32) -> Variant {
        Variant {
            policy: Some(policy),
            period,
            codec: None,
        }
    }

    /// The same with `codec` on Δ.
    pub const fn with_codec(self, codec: &'static str) -> Variant {
        Variant {
            codec: Some(codec),
            ..self
        }
    }

    /// The report's row label.
    pub fn label(&self) -> String {
        let Some(policy) = self.policy else {
            return "synchronous (fp32 ring, overlapped)".into();
        };
        let mut label = format!("{} H={}", policy.label(), self.period);
        if let Some(codec) = self.codec {
            let _ = write!(
                label,
                ", {} Δ + error feedback",
                codec.trim_start_matches("codec-")
            );
        }
        label
    }

    /// Its part of a job id.
    fn name(&self) -> String {
        let Some(policy) = self.policy else {
            return "synchronous".into();
        };
        let mut name = format!("{}-h{}", policy.plugin(), self.period);
        if let Some(codec) = self.codec {
            name = format!("{name}-{}", codec.trim_start_matches("codec-"));
        }
        name
    }
}

/// One condition of the lab: hosts (one rank each) and the rate of every link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Condition {
    /// Hosts, one rank on each.
    pub hosts: u32,
    /// Every link's rate, as `tc` spells it.
    pub link: &'static str,
}

impl Condition {
    /// "2 hosts, 100 Mbit/s".
    pub fn text(&self) -> String {
        format!("{} hosts, {}", self.hosts, rate_text(self.link))
    }
}

/// `100mbit` as "100 Mbit/s" (a rate `tc` spells otherwise is shown as it is).
fn rate_text(link: &str) -> String {
    for (unit, shown) in [("gbit", "Gbit/s"), ("mbit", "Mbit/s"), ("kbit", "kbit/s")] {
        if let Some(number) = link.strip_suffix(unit)
            && number.parse::<f64>().is_ok()
        {
            return format!("{number} {shown}");
        }
    }
    link.to_string()
}

/// The study's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The conditions, in the order the lab is brought up.
    pub conditions: Vec<Condition>,
    /// The rows; the first is synchronous, what the others are measured against.
    pub variants: Vec<Variant>,
    /// Data and epochs.
    pub subset: Subset,
    /// Global batch (split over the hosts).
    pub batch: u32,
    /// The test accuracy (%) whose wall-clock time is compared.
    pub target: f64,
}

impl Plan {
    /// The full study, or its quick variant (2 hosts at 1 Gbit/s, three rows at H = 4, a few
    /// steps).
    pub fn new(quick: bool) -> Plan {
        use Policy::{Diloco, LocalSgd};
        if quick {
            return Plan {
                conditions: vec![Condition {
                    hosts: 2,
                    link: "1gbit",
                }],
                variants: vec![
                    Variant::SYNCHRONOUS,
                    Variant::windowed(LocalSgd, 4),
                    Variant::windowed(Diloco, 4).with_codec("codec-int8"),
                ],
                subset: Subset {
                    train: 1024,
                    test: 500,
                    epochs: 2,
                },
                batch: 256,
                // 8 steps, 4 an epoch: synchronous passes 40% at its first evaluation.
                target: 40.0,
            };
        }
        let mut variants = vec![Variant::SYNCHRONOUS];
        for policy in [LocalSgd, Diloco] {
            variants.extend([4, 16, 64].map(|h| Variant::windowed(policy, h)));
        }
        variants.push(Variant::windowed(Diloco, 16).with_codec("codec-int8"));
        let conditions = [2, 4]
            .into_iter()
            .flat_map(|hosts| ["1gbit", "100mbit"].map(|link| Condition { hosts, link }))
            .collect();
        Plan {
            conditions,
            variants,
            // The network study's job (model, batch, LR, warmup, 4 epochs) on 16,000 images
            // instead of 6,000: 62.5 steps an epoch, so that H = 64 is one window an epoch
            // (three outer steps and the final one) rather than one and a half in the run.
            subset: Subset {
                train: 16_000,
                test: 2000,
                epochs: 4,
            },
            batch: 256,
            target: 80.0,
        }
    }

    /// The job of one row, one condition, one seed: the network study's job of its first row
    /// (the fp32 ring all-reduce, overlapped) on this plan's data, with the row's sync plugin
    /// and codec.
    pub fn job(&self, c: &Condition, v: &Variant, seed: u64) -> Job {
        let network = network::Plan {
            subset: self.subset,
            batch: self.batch,
            ..network::Plan::new(false)
        };
        let mut args = network
            .job(c.link, &network::VARIANTS[0], seed, c.hosts)
            .args;
        if let Some(policy) = v.policy {
            // A sync plugin's window ends after the update, with no backward pass to hide
            // behind: `run` refuses --overlap beside --sync.
            args.retain(|a| a != "--overlap");
            args.extend([
                "--sync".into(),
                policy.plugin().into(),
                "--set".into(),
                format!("sync.period={}", v.period),
            ]);
        }
        if let Some(codec) = v.codec {
            args.extend(strings(&["--codec", codec, "--error-feedback", "residual"]));
        }
        Job::new(
            format!("{}-np{}-{}-s{seed}", c.link, c.hosts, v.name()),
            args,
        )
        .on_ranks(c.hosts)
    }

    /// Steps in a run.
    pub fn steps(&self) -> u64 {
        (self.subset.steps_per_epoch(self.batch) * f64::from(self.subset.epochs)).ceil() as u64
    }

    /// Windows (outer steps) in a run at windows of `period` steps, the last one cut short by
    /// the final-step rule.
    pub fn windows(&self, period: u32) -> u64 {
        self.steps().div_ceil(u64::from(period.max(1)))
    }

    /// The jobs of one condition.
    pub fn jobs(&self, c: &Condition, seeds: &[u64]) -> Vec<Job> {
        self.variants
            .iter()
            .flat_map(|v| seeds.iter().map(move |&s| self.job(c, v, s)))
            .collect()
    }
}

/// One run's figures, rank 0's.
struct Run {
    /// Bytes sent over the run.
    sent: f64,
    /// Samples over the seconds of its steps (evaluations left out).
    samples_per_s: f64,
    /// Seconds from the start of the run to its last evaluation.
    wall_s: f64,
}

impl Run {
    fn of(o: &Outcome) -> Run {
        let (mut sent, mut samples, mut seconds) = (0.0, 0.0, 0.0);
        for s in o.steps().filter(|s| s.samples_per_s > 0.0) {
            sent += s.bytes_sent as f64;
            samples += f64::from(s.global_batch);
            seconds += f64::from(s.global_batch) / s.samples_per_s;
        }
        Run {
            sent,
            samples_per_s: if seconds > 0.0 {
                samples / seconds
            } else {
                0.0
            },
            wall_s: o.evals().last().map_or(0.0, |e| e.elapsed_s),
        }
    }
}

/// Bytes rank 0 sent in the run's steps before `step` (the steps an evaluation after `step`
/// steps follows).
fn sent_before(o: &Outcome, step: u64) -> f64 {
    o.steps()
        .filter(|s| s.step < step)
        .map(|s| s.bytes_sent as f64)
        .sum()
}

/// A row's figures over its seeds.
struct Row<'a> {
    runs: Vec<&'a Outcome>,
    /// Mean final accuracy (%) of the seeds that did not diverge.
    accuracy: Option<f64>,
    /// Mean seconds and epochs to the target, when every seed reached it.
    reached: Option<(f64, f64)>,
    wall_s: f64,
    sent: f64,
    samples_per_s: f64,
}

impl<'a> Row<'a> {
    fn of(runs: Vec<&'a Outcome>, target: f64) -> Option<Row<'a>> {
        if runs.is_empty() {
            return None;
        }
        let figures: Vec<Run> = runs.iter().map(|o| Run::of(o)).collect();
        let mean = |f: fn(&Run) -> f64| report::mean(&figures.iter().map(f).collect::<Vec<_>>());
        let firsts: Option<Vec<(f64, f64)>> = runs
            .iter()
            .map(|o| {
                o.evals()
                    .find(|e| 100.0 * e.test_acc >= target)
                    .map(|e| (e.elapsed_s, f64::from(e.epoch)))
            })
            .collect();
        let reached = firsts.map(|f| {
            let (t, e): (Vec<f64>, Vec<f64>) = f.into_iter().unzip();
            (report::mean(&t), report::mean(&e))
        });
        Some(Row {
            accuracy: report::mean_of(&runs, Outcome::accuracy),
            reached,
            wall_s: mean(|r| r.wall_s),
            sent: mean(|r| r.sent),
            samples_per_s: mean(|r| r.samples_per_s),
            runs,
        })
    }

    /// Whether its final accuracy is below `base`'s by more than chance: outside the seeds'
    /// ranges with two seeds or more, by a point or more with one; a row with a diverged seed
    /// always (unless synchronous had one too).
    fn costs_accuracy(&self, base: &Row) -> bool {
        let diverged = |r: &Row| r.runs.iter().any(|o| o.accuracy().is_none());
        if diverged(self) && !diverged(base) {
            return true;
        }
        let (Some(a), Some(b)) = (self.accuracy, base.accuracy) else {
            return false;
        };
        if self.runs.len() >= 2 && base.runs.len() >= 2 {
            a < b
                && report::separation(&self.runs, &base.runs, Outcome::accuracy).contains("outside")
        } else {
            a - b <= -1.0
        }
    }

    /// Synchronous's time to the target over this row's (above 1: sooner), when both got
    /// there.
    fn speedup(&self, base: &Row) -> Option<f64> {
        match (self.reached, base.reached) {
            (Some((a, _)), Some((b, _))) if a > 0.0 => Some(b / a),
            _ => None,
        }
    }
}

/// The mean over the seeds of each evaluation (in order, as far as every seed has it): `x`
/// of the run and that evaluation, against the test accuracy in %.
fn mean_curve(runs: &[&Outcome], x: &dyn Fn(&Outcome, &EvalRecord) -> f64) -> Vec<(f64, f64)> {
    let n = runs.iter().map(|o| o.evals().count()).min().unwrap_or(0);
    (0..n)
        .map(|i| {
            let (xs, ys): (Vec<f64>, Vec<f64>) = runs
                .iter()
                .filter_map(|o| o.evals().nth(i).map(|e| (x(o, e), 100.0 * e.test_acc)))
                .unzip();
            (report::mean(&xs), report::mean(&ys))
        })
        .collect()
}

/// Runs the study and returns its report.
pub fn run(settings: &Settings) -> Result<String> {
    let plan = Plan::new(settings.quick);
    let script = settings.netlab.clone().unwrap_or_else(default_netlab);
    let on_lab = Settings {
        netlab: Some(script.clone()),
        ..settings.clone()
    };
    let mut outcomes = Vec::new();
    for c in &plan.conditions {
        let jobs = plan.jobs(c, &settings.seeds);
        let lab = if jobs.iter().any(|j| !jobs::finished(settings, j)) {
            Some(Lab::up(&script, c.hosts, c.link, "sync")?)
        } else {
            None
        };
        outcomes.push(jobs::run_all(&on_lab, &jobs)?);
        drop(lab);
    }
    let all: Vec<&Outcome> = outcomes.iter().flatten().collect();
    let mut md = report::header(
        settings,
        "Synchronising less on a network: local SGD and DiLoCo against synchronous data \
         parallelism",
        &all,
    );
    md += &setup_text(&plan);
    let rows: Vec<Vec<Option<Row>>> = plan
        .conditions
        .iter()
        .zip(&outcomes)
        .map(|(c, outs)| {
            plan.variants
                .iter()
                .map(|v| {
                    let runs = jobs::of_seeds(outs, &settings.seeds, |s| plan.job(c, v, s).id);
                    Row::of(runs, plan.target)
                })
                .collect()
        })
        .collect();
    let (mut by_time, mut by_bytes) = (Vec::new(), Vec::new());
    for (c, rows) in plan.conditions.iter().zip(&rows) {
        md += &condition_section(&plan, c, rows);
        // A panel per policy, synchronous in each, so that no legend crowds out the curves.
        for policy in [Policy::LocalSgd, Policy::Diloco] {
            let series = |x: &dyn Fn(&Outcome, &EvalRecord) -> f64| {
                plan.variants
                    .iter()
                    .zip(rows)
                    .filter(|(v, _)| v.policy.is_none_or(|p| p == policy))
                    .filter_map(|(v, row)| {
                        Some(Series {
                            label: v.label(),
                            points: mean_curve(&row.as_ref()?.runs, x),
                        })
                    })
                    .collect::<Vec<_>>()
            };
            let title = format!("test accuracy (%), {}: {}", c.text(), policy.label());
            by_time.push(Panel::new(&title, series(&|_, e| e.elapsed_s)).with_markers());
            by_bytes.push(
                Panel::new(title, series(&|o, e| sent_before(o, e.step) / 1e6))
                    .log_x()
                    .with_markers(),
            );
        }
    }
    let seeds = if settings.seeds.len() > 1 {
        format!("mean of {} seeds", settings.seeds.len())
    } else {
        format!("seed {}", settings.seeds[0])
    };
    plot::draw(
        &by_time,
        &format!("Accuracy against wall-clock time ({seeds})"),
        "seconds since the start of the run",
        &settings.out.join("accuracy-vs-time.png"),
    )?;
    plot::draw(
        &by_bytes,
        &format!("Accuracy against bytes sent ({seeds})"),
        "MB rank 0 sent since the start of the run (log scale)",
        &settings.out.join("accuracy-vs-bytes.png"),
    )?;
    md += "![accuracy against wall-clock time](accuracy-vs-time.png)\n\n";
    md += "![accuracy against bytes sent](accuracy-vs-bytes.png)\n\n";
    md += &findings(&plan, &rows);
    md += &literature(&plan, &rows);
    Ok(md)
}

fn setup_text(plan: &Plan) -> String {
    let s = &plan.subset;
    let conditions: Vec<String> = plan.conditions.iter().map(Condition::text).collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = plan.conditions.iter().map(|c| c.hosts).max().unwrap_or(1);
    let longest = plan.variants.iter().map(|v| v.period).max().unwrap_or(1);
    let mut per_rank: Vec<String> = plan
        .conditions
        .iter()
        .map(|c| (plan.batch / c.hosts.max(1)).to_string())
        .collect();
    per_rank.dedup();
    let crowded = if most as usize > cores {
        format!(
            " ({most} ranks oversubscribe its {cores} hardware threads, which slows their \
             compute alike in every row of that condition)"
        )
    } else {
        String::new()
    };
    let mut md = format!(
        "## Set-up\n\n\
         The emulated cluster (`scripts/netlab.sh up N --rate R`: network namespaces, a veth \
         link per host into a bridge, `tc tbf` at R both ways) as {}. One rank per host, all \
         on this machine's cores{crowded}. The network study's job: the `cnn` at global batch \
         {} split over the hosts (so BatchNorm sees {} samples a rank), SGD with momentum \
         0.9, LR 0.1 per 256 with warmup over half an epoch and no decay, {} epochs, evaluated \
         on {} test images; on the first {} training images (the network study trains on {}): \
         {} steps, {:.1} an epoch, so that even the longest window, H = {longest}, leaves {} \
         windows in the run.\n\n",
        conditions.join("; "),
        plan.batch,
        per_rank.join(" or "),
        s.epochs,
        s.test,
        s.train,
        network::Plan::new(false).subset.train,
        plan.steps(),
        s.steps_per_epoch(plan.batch),
        plan.windows(longest),
    );
    md += "- **synchronous**: the fp32 gradients summed by the ring all-reduce every step, each \
           bucket as soon as the backward pass has produced it (`--overlap`): the network \
           study's first row.\n\
           - **local SGD H** (`--sync local-sgd --set sync.period=H`): each rank steps on its \
           own shard with its own momentum; every H steps the ranks average their weights \
           (ring all-reduce). With every rank in every round and i.i.d. shards this is \
           Federated Averaging (McMahan et al. 2017).\n\
           - **DiLoCo H** (`--sync diloco`): the same windows, then an outer Nesterov step on \
           the averaged pseudo-gradient Δ = θ_global − mean θ_k with Douillard et al.'s outer \
           LR 0.7 and momentum 0.9. Once the outer momentum has built up, a steady Δ moves the \
           weights 0.7 · (1 + 0.9/(1 − 0.9)) = 7 times as far as plain averaging would: the \
           outer step extrapolates, as tuned in the paper for H = 500. The inner optimizer is \
           the job's SGD, not the paper's AdamW, so that every row shares the synchronous \
           row's optimizer, LR and schedule and differs from it only in when it synchronises \
           (an AdamW inner variant would need an LR of its own and an AdamW synchronous \
           baseline: twice the jobs).\n";
    if let Some(v) = plan.variants.iter().find(|v| v.codec.is_some()) {
        let _ = writeln!(
            md,
            "- **{}** (`--codec {} --error-feedback residual`): Δ quantised to 8 bits a value \
             with one scale per chunk, the quantisation error kept for the next window. \
             Quantisation rather than sparsification because a window's Δ is sent once: top-k \
             at 1% with error feedback needs about a hundred windows to send each coordinate \
             once, and the run has {} at H = {}, while int8 sends every coordinate every window \
             (Streaming DiLoCo likewise sends its outer gradients at 4 bits). Its payload is \
             gathered, not summed, so its saving over the fp32 ring shrinks with the hosts: \
             with each rank's quarter-size payload going to every other rank against the \
             ring's 2(p − 1)/p of the model, 8/p× (4× on 2 hosts, 2× on 4).",
            v.label(),
            v.codec.unwrap_or_default(),
            plan.windows(v.period),
            v.period
        );
    }
    let _ = write!(
        md,
        "\nA sync plugin's run evaluates at the first window's end after each completed epoch \
         (the ranks hold one model only then), so its evaluations may come a few steps after \
         the synchronous run's. Time to {}% is the wall-clock time from the start of the run \
         to the first evaluation at or above it, the mean over the seeds (\"not reached\" \
         unless every seed reached it); its epoch tells how much of a difference is accuracy \
         rather than speed. Wall time is the run's own clock at its last evaluation (the \
         start-up of mpirun and the plugins left out); bytes are those rank 0 sent in all its \
         steps (the window ends' losses included); samples/s is the global batches over the \
         steps' time. Ratios are against the synchronous row of the same condition. The plots \
         show the mean of the seeds at each evaluation.\n\n",
        plan.target
    );
    md
}

/// "12.3 (epoch 2.0)" or "not reached".
fn reached_text(row: &Row) -> String {
    row.reached.map_or("not reached".into(), |(t, e)| {
        format!("{t:.1} (epoch {e:.1})")
    })
}

fn condition_section(plan: &Plan, c: &Condition, rows: &[Option<Row>]) -> String {
    let mut md = format!("## {}\n\n", c.text());
    let mut t = Table::new(&[
        "row",
        "test accuracy (%)",
        "vs synchronous (points)",
        &format!("time to {}% (s)", plan.target),
        "sooner than synchronous",
        "wall time (s)",
        "MB sent / rank",
        "fewer bytes than synchronous",
        "samples/s",
        "vs synchronous",
    ]);
    let base = rows.first().and_then(Option::as_ref);
    for (v, row) in plan.variants.iter().zip(rows) {
        let Some(row) = row else { continue };
        let [points, sooner, fewer, speed] = against(row, base);
        t.row(vec![
            v.label(),
            report::over_seeds(&row.runs, Outcome::accuracy),
            points,
            reached_text(row),
            sooner,
            format!("{:.1}", row.wall_s),
            format!("{:.1}", row.sent / 1e6),
            fewer,
            format!("{:.0}", row.samples_per_s),
            speed,
        ]);
    }
    md += &t.markdown();
    md
}

/// A row's cells against synchronous (`base`): accuracy in points, speed-up to the target,
/// bytes and samples/s as ratios; "-" where either lacks the figure.
fn against(row: &Row, base: Option<&Row>) -> [String; 4] {
    let cell = |f: &dyn Fn(&Row) -> Option<String>| base.and_then(f).unwrap_or_else(|| "-".into());
    [
        cell(&|b| Some(format!("{:+.2}", row.accuracy? - b.accuracy?))),
        cell(&|b| row.speedup(b).map(|x| format!("{x:.2}×"))),
        cell(&|b| (row.sent > 0.0).then(|| format!("{:.0}×", b.sent / row.sent))),
        cell(&|b| {
            (b.samples_per_s > 0.0).then(|| format!("{:.2}×", row.samples_per_s / b.samples_per_s))
        }),
    ]
}

/// What a row did against synchronous in one condition, in words, and whether it paid.
fn verdict(row: &Row, base: &Row, target: f64) -> (String, bool) {
    let cost = row.costs_accuracy(base);
    let accuracy = match (row.accuracy, base.accuracy) {
        (Some(a), Some(b)) => format!(
            "ends at {a:.2}% ({:+.2} points{})",
            a - b,
            report::separation(&row.runs, &base.runs, Outcome::accuracy)
        ),
        (None, _) => "diverged".into(),
        (Some(a), None) => format!("ends at {a:.2}% where synchronous diverged"),
    };
    let (time, pays) = match (row.reached, base.reached, row.speedup(base)) {
        (Some((_, ea)), Some((_, eb)), Some(x)) => {
            let epochs = if (ea - eb).abs() < 0.25 {
                "in the same epoch".to_string()
            } else {
                format!("in epoch {ea:.1} against {eb:.1}")
            };
            let when = if x >= 1.05 {
                format!("reaches {target}% {x:.2}× as soon")
            } else if x <= 0.95 {
                format!("reaches {target}% later ({x:.2}×)")
            } else {
                format!("reaches {target}% as soon ({x:.2}×)")
            };
            (format!("{when}, {epochs}"), x >= 1.05 && !cost)
        }
        (None, Some(_), _) => (format!("never reaches {target}% in every seed"), false),
        (Some(_), None, _) => (
            format!("reaches {target}%, which synchronous does not in every seed"),
            !cost,
        ),
        _ => (format!("neither reaches {target}% in every seed"), false),
    };
    let sum_up = match (pays, cost) {
        (true, _) => "synchronising less pays",
        (false, true) if row.speedup(base).is_some_and(|x| x >= 1.05) => {
            "sooner, but it costs accuracy"
        }
        (false, true) => "it costs accuracy",
        (false, false) if row.reached.is_none() && base.reached.is_none() => "no time to compare",
        (false, false) => "it does not pay in time",
    };
    let bytes = if row.sent > 0.0 {
        format!("{:.0}× fewer bytes", base.sent / row.sent)
    } else {
        "no bytes".into()
    };
    (
        format!(
            "{time}; {accuracy}; {bytes}, {:.2}× the samples/s: {sum_up}",
            row.samples_per_s / base.samples_per_s
        ),
        pays,
    )
}

/// Where synchronising less paid and where it cost accuracy, condition by condition, then
/// across them.
fn findings(plan: &Plan, rows: &[Vec<Option<Row>>]) -> String {
    let mut md = String::from("## Findings (computed from the tables)\n\n");
    let target = plan.target;
    let mut cells = Vec::new();
    for (c, rows) in plan.conditions.iter().zip(rows) {
        let Some(base) = rows.first().and_then(Option::as_ref) else {
            continue;
        };
        let _ = writeln!(
            md,
            "- **{}.** Synchronous {}, ends at {} after {:.1} s and sends {:.1} MB per rank.",
            c.text(),
            match base.reached {
                Some((t, e)) => format!("reaches {target}% after {t:.1} s (epoch {e:.1})"),
                None => format!("does not reach {target}% in every seed"),
            },
            base.accuracy
                .map_or("diverged".into(), |a| format!("{a:.2}%")),
            base.wall_s,
            base.sent / 1e6
        );
        let (mut paid, mut cost) = (Vec::new(), Vec::new());
        for (v, row) in plan.variants.iter().zip(rows).skip(1) {
            let Some(row) = row else { continue };
            let (text, pays) = verdict(row, base, target);
            let _ = writeln!(md, "  - {}: {text}.", v.label());
            if pays {
                paid.push(v.label());
            }
            if row.costs_accuracy(base) {
                cost.push(v.label());
            }
        }
        let list = |l: &[String]| {
            if l.is_empty() {
                "none".to_string()
            } else {
                l.join("; ")
            }
        };
        let _ = writeln!(
            md,
            "  - Paid (sooner to {target}% without an accuracy cost): {}. Cost accuracy: {}.",
            list(&paid),
            list(&cost)
        );
        cells.push((c, base, rows));
    }
    if cells.len() > 1 {
        md += &across(plan, &cells);
    }
    md.push('\n');
    md
}

/// The geometric mean of `values`, `None` when empty.
fn geometric_mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty())
        .then(|| (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp())
}

/// Across the conditions: a table of each row's speed-up and accuracy change, and how the
/// speed-up moves with the link's rate at each host count.
fn across(plan: &Plan, cells: &[(&Condition, &Row, &Vec<Option<Row>>)]) -> String {
    let target = plan.target;
    let mut head = vec!["row".to_string()];
    head.extend(cells.iter().map(|(c, _, _)| c.text()));
    let mut t = Table::new(&head.iter().map(String::as_str).collect::<Vec<_>>());
    for (i, v) in plan.variants.iter().enumerate().skip(1) {
        let mut line = vec![v.label()];
        for (_, base, rows) in cells {
            line.push(match &rows[i] {
                Some(row) => format!(
                    "{} / {}",
                    row.speedup(base)
                        .map_or("not reached".into(), |x| format!("{x:.2}×")),
                    match (row.accuracy, base.accuracy) {
                        (Some(a), Some(b)) => format!("{:+.2}", a - b),
                        _ => "diverged".into(),
                    }
                ),
                None => "-".into(),
            });
        }
        t.row(line);
    }
    let mut md = format!(
        "\nAcross the conditions: time to {target}% against synchronous (above 1× sooner) / \
         final accuracy against synchronous (points), means over the seeds:\n\n"
    );
    md += &t.markdown();
    let mean_speedup = |c: &Condition| {
        let (_, base, rows) = cells.iter().find(|(d, _, _)| *d == c)?;
        let ups: Vec<f64> = rows
            .iter()
            .skip(1)
            .flatten()
            .filter_map(|r| r.speedup(base))
            .collect();
        geometric_mean(&ups).map(|g| (g, ups.len()))
    };
    let mut hosts: Vec<u32> = plan.conditions.iter().map(|c| c.hosts).collect();
    hosts.dedup();
    for h in hosts {
        let at: Vec<String> = plan
            .conditions
            .iter()
            .filter(|c| c.hosts == h)
            .filter_map(|c| {
                let (g, n) = mean_speedup(c)?;
                Some(format!(
                    "{g:.2}× at {} ({n} rows reached it)",
                    rate_text(c.link)
                ))
            })
            .collect();
        if !at.is_empty() {
            let _ = writeln!(
                md,
                "- On {h} hosts the rows that synchronise less reach {target}% on average \
                 (geometric mean over the rows that reach it) {}.",
                at.join(", ")
            );
        }
    }
    md
}

/// Federated Averaging as the brief on Goyal et al. holds it up, and DiLoCo's figure, each
/// with what our runs say in its terms.
fn literature(plan: &Plan, rows: &[Vec<Option<Row>>]) -> String {
    let mut md = String::from("## Beside the literature\n\n");
    md += &federated_averaging(plan, rows);
    md += &diloco(plan, rows);
    md += "\n\n";
    md
}

/// Federated Averaging, and the H at which our local SGD kept synchronous's accuracy.
fn federated_averaging(plan: &Plan, rows: &[Vec<Option<Row>>]) -> String {
    let mut md = String::new();
    md += "- **Federated Averaging** (McMahan et al. 2017, \"Communication-Efficient Learning of \
           Deep Networks from Decentralized Data\"), which this project's brief on Goyal et al. \
           2017 holds up as a large-batch method that communicates less (the remark is the \
           brief's; we did not find it in Goyal et al.'s paper): each worker takes several \
           local steps, then the workers average their models. With every worker in every round \
           and i.i.d. shards that is our `local-sgd`.";
    let local: Vec<String> = plan
        .conditions
        .iter()
        .zip(rows)
        .filter_map(|(c, rows)| {
            let base = rows.first()?.as_ref()?;
            let kept: Vec<u32> = plan
                .variants
                .iter()
                .zip(rows)
                .filter(|(v, _)| v.policy == Some(Policy::LocalSgd) && v.codec.is_none())
                .filter_map(|(v, r)| {
                    let r = r.as_ref()?;
                    (!r.costs_accuracy(base)).then_some(v.period)
                })
                .collect();
            let kept: Vec<String> = kept.iter().map(u32::to_string).collect();
            Some(if kept.is_empty() {
                format!("at no H at {}", c.text())
            } else {
                format!("at H = {} at {}", kept.join(", "), c.text())
            })
        })
        .collect();
    if !local.is_empty() {
        let _ = write!(
            md,
            " Here local SGD kept synchronous's final accuracy (no loss beyond the seeds' \
             spread) {}.",
            local.join("; ")
        );
    }
    md
}

/// DiLoCo's figure, and our DiLoCo rows in its terms.
fn diloco(plan: &Plan, rows: &[Vec<Option<Row>>]) -> String {
    let mut md = String::new();
    md += "\n- **DiLoCo** (Douillard et al. 2023, \"DiLoCo: Distributed Low-Communication \
           Training of Language Models\"): 8 workers taking H = 500 inner AdamW steps between \
           outer Nesterov steps (η 0.7, μ 0.9) matched fully synchronous data parallelism on \
           C4 while communicating about 500× less.";
    let windows: Vec<String> = plan
        .variants
        .iter()
        .filter(|v| v.policy == Some(Policy::Diloco) && v.codec.is_none())
        .map(|v| format!("{} at H = {}", plan.windows(v.period), v.period))
        .collect();
    if !windows.is_empty() {
        let _ = write!(
            md,
            " Their H is a small fraction of a run of tens of thousands of steps, so it takes \
             on the order of a hundred outer steps; ours takes {}.",
            windows.join(", ")
        );
    }
    for (c, rows) in plan.conditions.iter().zip(rows) {
        let Some(base) = rows.first().and_then(Option::as_ref) else {
            continue;
        };
        let parts: Vec<String> = plan
            .variants
            .iter()
            .zip(rows)
            .filter(|(v, _)| v.policy == Some(Policy::Diloco))
            .filter_map(|(v, r)| {
                let r = r.as_ref()?;
                let d = match (r.accuracy, base.accuracy) {
                    (Some(a), Some(b)) => format!("{:+.2} points", a - b),
                    _ => "diverged".into(),
                };
                let bytes = if r.sent > 0.0 {
                    format!("{:.0}× fewer bytes", base.sent / r.sent)
                } else {
                    "no bytes".into()
                };
                let cost = if r.costs_accuracy(base) {
                    ", an accuracy cost"
                } else {
                    ""
                };
                Some(format!("{} {bytes}, {d}{cost}", v.label()))
            })
            .collect();
        if !parts.is_empty() {
            let _ = write!(
                md,
                "\n  - Ours at {}, against synchronous: {}.",
                c.text(),
                parts.join("; ")
            );
        }
    }
    // The most DiLoCo saved here without an accuracy cost, in DiLoCo's own terms.
    let best = plan
        .conditions
        .iter()
        .zip(rows)
        .flat_map(|(c, rows)| {
            let base = rows.first().and_then(Option::as_ref);
            plan.variants.iter().zip(rows).filter_map(move |(v, r)| {
                let (base, r) = (base?, r.as_ref()?);
                (v.policy == Some(Policy::Diloco) && r.sent > 0.0 && !r.costs_accuracy(base))
                    .then(|| (base.sent / r.sent, v.label(), c.text()))
            })
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    md += &match best {
        Some((ratio, label, at)) => format!(
            "\n  - The most DiLoCo saved here without an accuracy cost: {ratio:.0}× fewer bytes \
             ({label} at {at}), against the paper's 500× at H = 500."
        ),
        None => "\n  - No DiLoCo row here kept synchronous's accuracy.".into(),
    };
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_plan_has_eight_rows_on_four_conditions() {
        let plan = Plan::new(false);
        assert_eq!(plan.conditions.len(), 4);
        assert_eq!(plan.variants.len(), 8);
        let jobs: Vec<Job> = plan
            .conditions
            .iter()
            .flat_map(|c| plan.jobs(c, &[1, 2]))
            .collect();
        assert_eq!(jobs.len(), 64);
        let mut ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 64, "job ids are unique");
        let four = Condition {
            hosts: 4,
            link: "100mbit",
        };
        let sync = plan.job(&four, &Variant::SYNCHRONOUS, 1);
        assert_eq!(sync.ranks, 4);
        assert_eq!(sync.id, "100mbit-np4-synchronous-s1");
        let args = sync.args.join(" ");
        assert!(
            args.contains("--overlap") && !args.contains("--sync"),
            "{args}"
        );
        // The network study's job of its fp32 overlapped row, on 16,000 images.
        let mut network = network::Plan::new(false)
            .job("100mbit", &network::VARIANTS[0], 1, 4)
            .args;
        let at = network.iter().position(|a| a == "--train-subset").unwrap();
        network[at + 1] = "16000".into();
        assert_eq!(sync.args, network);
        let coded = plan.job(&four, &plan.variants[7], 2);
        assert_eq!(coded.id, "100mbit-np4-diloco-h16-int8-s2");
        let args = coded.args.join(" ");
        assert!(
            args.ends_with(
                "--sync diloco --set sync.period=16 --codec codec-int8 --error-feedback residual"
            ),
            "{args}"
        );
        assert!(!args.contains("--overlap"), "{args}");
        assert_eq!(
            plan.variants[7].label(),
            "DiLoCo H=16, int8 Δ + error feedback"
        );
    }

    #[test]
    fn rates_read_as_people_write_them() {
        assert_eq!(rate_text("1gbit"), "1 Gbit/s");
        assert_eq!(rate_text("100mbit"), "100 Mbit/s");
        assert_eq!(rate_text("fast"), "fast");
    }

    #[test]
    fn geometric_means_of_speedups() {
        assert_eq!(geometric_mean(&[]), None);
        let g = geometric_mean(&[2.0, 0.5]).unwrap();
        assert!((g - 1.0).abs() < 1e-12);
    }
}
