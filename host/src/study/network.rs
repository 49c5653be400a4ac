//! Compression on a network: the codecs that matter in practice, trained on two hosts of the
//! emulated cluster (`scripts/netlab.sh`) at each link speed, with the step split into compute
//! and communication, the communication set against the α-β model calibrated on the same link
//! (`bench calibrate`), and the wall-clock time to a fixed test accuracy; the plot is accuracy
//! against wall-clock time. The study brings the lab up at each speed itself, so it needs what
//! the lab needs (root, network namespaces).

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use super::lab::{Lab, default_netlab};
use super::report::{self, Table};
use super::{Job, Outcome, Recipe, Settings, Subset, jobs, strings};
use crate::plot::{self, Panel, Series};
use crate::train::exchange::ErrorFeedback;

/// One row: a codec (none: the fp32 all-reduce), its error feedback, and whether the
/// exchange overlaps the backward pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Variant {
    /// The report's label.
    pub label: &'static str,
    /// The codec plugin.
    pub codec: Option<&'static str>,
    /// `--error-feedback`.
    pub feedback: ErrorFeedback,
    /// `--overlap` or `--no-overlap`.
    pub overlap: bool,
}

/// The rows: what a practitioner would try on a slow network. The first, the overlapped fp32
/// exchange, is what the others are measured against; the last is the exchange after the
/// backward pass, as every row ran before the overlap.
pub const VARIANTS: [Variant; 6] = [
    Variant {
        label: "uncompressed (fp32 ring)",
        codec: None,
        feedback: ErrorFeedback::Off,
        overlap: true,
    },
    Variant {
        label: "fp16",
        codec: Some("codec-fp16"),
        feedback: ErrorFeedback::Off,
        overlap: true,
    },
    Variant {
        label: "top-k 1% + error feedback",
        codec: Some("codec-top-k"),
        feedback: ErrorFeedback::Residual,
        overlap: true,
    },
    Variant {
        label: "PowerSGD rank 2 + error feedback",
        codec: Some("codec-powersgd"),
        feedback: ErrorFeedback::Residual,
        overlap: true,
    },
    Variant {
        label: "DGC 99.9% + momentum correction",
        codec: Some("codec-dgc"),
        feedback: ErrorFeedback::Momentum,
        overlap: true,
    },
    Variant {
        label: "uncompressed, not overlapped (--no-overlap)",
        codec: None,
        feedback: ErrorFeedback::Off,
        overlap: false,
    },
];

/// The study's shape.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Link rates, as `tc` spells them.
    pub links: Vec<&'static str>,
    /// The rows.
    pub variants: Vec<Variant>,
    /// Data and epochs.
    pub subset: Subset,
    /// Global batch.
    pub batch: u32,
    /// The test accuracy (%) whose wall-clock time is compared.
    pub target: f64,
}

impl Plan {
    /// The full study or its quick variant (1 Gbit/s only, three rows, a few steps).
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                links: vec!["1gbit"],
                variants: VARIANTS[..3].to_vec(),
                subset: Subset {
                    train: 1024,
                    test: 500,
                    epochs: 2,
                },
                batch: 256,
                target: 50.0,
            }
        } else {
            Plan {
                links: vec!["1gbit", "100mbit"],
                variants: VARIANTS.to_vec(),
                subset: Subset {
                    train: 6000,
                    test: 2000,
                    epochs: 4,
                },
                batch: 256,
                target: 75.0,
            }
        }
    }

    /// The job of one row, one link, one seed.
    pub fn job(&self, link: &str, v: &Variant, seed: u64, ranks: u32) -> Job {
        let mut args = Recipe::default().model_args();
        args.extend(strings(&["--schedule", "warmup", "--allreduce", "ring"]));
        args.extend(self.subset.args());
        args.extend([
            "--global-batch".into(),
            self.batch.to_string(),
            "--base-lr".into(),
            "0.1".into(),
            "--seed".into(),
            seed.to_string(),
            "--set".into(),
            "schedule.warmup_epochs=0.5".into(),
            "--set".into(),
            "schedule.milestones=".into(),
        ]);
        args.push(
            if v.overlap {
                "--overlap"
            } else {
                "--no-overlap"
            }
            .into(),
        );
        let name = match v.codec {
            Some(c) => {
                args.extend(["--codec".into(), c.into()]);
                if c == "codec-dgc" {
                    // Stages of 5 steps: the ramp to 99.9% ends within the first epoch.
                    args.extend(["--set".into(), "codec.warmup_steps=5".into()]);
                }
                let mode = match v.feedback {
                    ErrorFeedback::Off => None,
                    ErrorFeedback::Residual => Some("residual"),
                    ErrorFeedback::Mean => Some("mean"),
                    ErrorFeedback::Momentum => Some("momentum"),
                };
                if let Some(mode) = mode {
                    args.extend(["--error-feedback".into(), mode.into()]);
                }
                c.trim_start_matches("codec-").to_string()
            }
            None => "uncompressed".into(),
        };
        let name = if v.overlap {
            name
        } else {
            name + "-sequential"
        };
        Job::new(format!("{link}-{name}-np{ranks}-s{seed}"), args).on_ranks(ranks)
    }

    /// The jobs of one link.
    pub fn jobs(&self, link: &str, seeds: &[u64], ranks: u32) -> Vec<Job> {
        self.variants
            .iter()
            .flat_map(|v| seeds.iter().map(move |&s| self.job(link, v, s, ranks)))
            .collect()
    }
}

/// The α-β parameters `bench calibrate` fitted on a link.
#[derive(Debug, Clone, Copy)]
struct Calibration {
    alpha: f64,
    beta: f64,
}

impl Lab<'_> {
    /// `bench calibrate` across the lab's first two hosts, into `file` (kept: a re-run reads it).
    fn calibrate(&self, file: &Path) -> Result<()> {
        let exe = std::env::current_exe().context("cannot locate the lsgd-host binary")?;
        let out = Command::new("bash")
            .arg(self.script)
            .args(["run", "-np", "2", "--"])
            .arg(exe)
            .args(["bench", "calibrate", "--out"])
            .arg(file)
            .output()
            .with_context(|| format!("cannot run {}", self.script.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "bench calibrate on the lab failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

/// The link's α and β from `bench calibrate`'s file, read as `simulate --model` reads it.
fn read_calibration(file: &Path) -> Option<Calibration> {
    let m = crate::bench::calibrate::Machine::load(file).ok()?;
    Some(Calibration {
        alpha: m.alpha,
        beta: m.beta,
    })
}

/// A `tc` rate such as `1gbit` or `100mbit` in bits per second.
fn link_bits_per_s(link: &str) -> Option<f64> {
    let digits = link.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let (number, unit) = link.split_at(digits);
    let scale = match unit {
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// The calibration's sentence: the rate it measured, and against the link's when they part.
fn calibration_text(link: &str, c: Calibration) -> String {
    let measured = 8.0 / c.beta;
    let mut text = format!(
        "Calibrated: α = {:.1} µs, β = {:.3} ns/B ({:.0} Mbit/s",
        c.alpha * 1e6,
        c.beta * 1e9,
        measured / 1e6
    );
    match link_bits_per_s(link) {
        Some(nominal) => {
            let share = measured / nominal;
            let _ = write!(text, ", {:.0}% of the link's rate).", 100.0 * share);
            // TCP/IP headers and tbf's bursts keep a link that sets the pace near 90-95%.
            if share < 0.75 {
                text += " The ranks' CPUs, not the emulated link, set this rate: the lab \
                         shared the machine's cores with other work, so its figures are \
                         those of a slower link; rerun on a quiet machine.";
            }
        }
        None => text += ").",
    }
    text + "\n"
}

/// A job's figures, rank 0's means over its steps.
struct Timing {
    step_ms: f64,
    compute_ms: f64,
    communication_ms: f64,
    exposed_ms: f64,
    sent: f64,
    samples_per_s: f64,
}

impl Timing {
    fn of(o: &Outcome) -> Timing {
        let step_s = o.mean_over_steps(|s| f64::from(s.global_batch) / s.samples_per_s);
        Timing {
            step_ms: 1e3 * step_s,
            compute_ms: 1e3 * o.mean_over_steps(|s| s.compute_s),
            communication_ms: 1e3 * o.mean_over_steps(|s| s.communication_s),
            exposed_ms: 1e3 * o.mean_over_steps(|s| s.exposed_communication_s),
            sent: o.mean_over_steps(|s| s.bytes_sent as f64),
            samples_per_s: o.mean_over_steps(|s| f64::from(s.global_batch)) / step_s,
        }
    }

    /// The model's communication time: α per message, β per byte this rank sent (a ring step
    /// sends and receives at once over a full-duplex link, so the bytes sent are the bytes on
    /// its wire). Messages: 2(p−1) per collective, two collectives a step (the loss's and the
    /// gradient bucket's), three for PowerSGD (P and Q).
    fn predicted_ms(&self, v: &Variant, c: Calibration, ranks: u32) -> f64 {
        let collectives = if v.codec == Some("codec-powersgd") {
            3.0
        } else {
            2.0
        };
        let messages = 2.0 * f64::from(ranks - 1) * collectives;
        1e3 * (c.alpha * messages + c.beta * self.sent)
    }
}

/// The first evaluation at `target` % or above: its epoch and the seconds from the start of
/// the run.
fn reached(o: &Outcome, target: f64) -> Option<(u32, f64)> {
    o.evals()
        .find(|e| 100.0 * e.test_acc >= target)
        .map(|e| (e.epoch, e.elapsed_s))
}

/// Mean seconds to `target` % over the seeds, `None` unless every seed reached it.
fn time_to(runs: &[&Outcome], target: f64) -> Option<f64> {
    let times: Option<Vec<f64>> = runs
        .iter()
        .map(|o| reached(o, target).map(|r| r.1))
        .collect();
    times.filter(|t| !t.is_empty()).map(|t| report::mean(&t))
}

/// Mean epochs to `target` % over the seeds, `None` unless every seed reached it.
fn epochs_to(runs: &[&Outcome], target: f64) -> Option<f64> {
    let epochs: Option<Vec<f64>> = runs
        .iter()
        .map(|o| reached(o, target).map(|r| f64::from(r.0)))
        .collect();
    epochs.filter(|e| !e.is_empty()).map(|e| report::mean(&e))
}

/// Runs the study and returns its report.
pub fn run(settings: &Settings) -> Result<String> {
    let plan = Plan::new(settings.quick);
    let ranks = settings.ranks;
    anyhow::ensure!(
        ranks >= 2,
        "the network study needs at least 2 ranks (--np), got {ranks}"
    );
    let script = settings.netlab.clone().unwrap_or_else(default_netlab);
    let mut outcomes = Vec::new();
    let mut calibrations = Vec::new();
    for &link in &plan.links {
        let jobs = plan.jobs(link, &settings.seeds, ranks);
        let calibration = settings.out.join(format!("calibration-{link}.json"));
        let pending = !calibration.exists() || jobs.iter().any(|j| !jobs::finished(settings, j));
        let lab = if pending {
            Some(Lab::up(&script, ranks, link, "network")?)
        } else {
            None
        };
        if let Some(lab) = &lab
            && !calibration.exists()
        {
            lab.calibrate(&calibration)?;
        }
        calibrations.push(read_calibration(&calibration));
        let on_lab = Settings {
            netlab: Some(script.clone()),
            ..settings.clone()
        };
        outcomes.push(jobs::run_all(&on_lab, &jobs)?);
        drop(lab);
    }
    let all: Vec<&Outcome> = outcomes.iter().flatten().collect();
    let mut md = report::header(
        settings,
        "Gradient compression on a network: step time and time to accuracy",
        &all,
    );
    md += &setup_text(&plan, ranks);
    let mut panels = Vec::new();
    for ((&link, outs), cal) in plan.links.iter().zip(&outcomes).zip(&calibrations) {
        let find =
            |v: &Variant| jobs::of_seeds(outs, &settings.seeds, |s| plan.job(link, v, s, ranks).id);
        md += &link_section(&plan, link, *cal, ranks, &find);
        panels.push(
            Panel::new(
                format!("test accuracy (%) at {link}"),
                plan.variants
                    .iter()
                    .filter_map(|v| {
                        let o = find(v).into_iter().next()?;
                        Some(Series {
                            label: v.label.into(),
                            points: o
                                .evals()
                                .map(|e| (e.elapsed_s, 100.0 * e.test_acc))
                                .collect(),
                        })
                    })
                    .collect(),
            )
            .with_markers(),
        );
    }
    plot::draw(
        &panels,
        &format!(
            "Accuracy against wall-clock time, {ranks} hosts (seed {})",
            settings.seeds[0]
        ),
        "seconds since the start of the run",
        &settings.out.join("accuracy-vs-time.png"),
    )?;
    md += "![accuracy against wall-clock time](accuracy-vs-time.png)\n\n";
    md += &findings(&plan, &outcomes, settings, ranks);
    Ok(md)
}

fn setup_text(plan: &Plan, ranks: u32) -> String {
    let s = &plan.subset;
    format!(
        "## Set-up\n\n{ranks} hosts of the emulated cluster (`scripts/netlab.sh up {ranks} \
         --rate R`: network namespaces, a veth link per host into a bridge, `tc tbf` at R both \
         ways), one rank per host, 1 libtorch thread each, so the ranks talk TCP over the \
         emulated links; both share this machine's cores. The `cnn` on the first {} \
         Fashion-MNIST training images for {} epochs at global batch {} (LR 0.1 per 256, \
         warmup over half an epoch, no decay), evaluated on {} test images after every epoch; \
         the fp32 rows use the ring all-reduce. Every row but the last exchanges each bucket \
         as soon as the backward pass has produced it (`--overlap`); the last \
         exchanges after the backward pass. Step time is rank 0's mean; compute is its \
         forward and backward passes and the update, communication the time inside MPI \
         calls (waiting for the other rank included), and of that the exposed part what the \
         step waited for after its backward pass. The model's communication is α per \
         message plus β per byte rank 0 sent, with α and β fitted by `lsgd-host bench \
         calibrate` across the same two hosts at the same rate (2(p−1) messages per \
         collective, two collectives a step, three for PowerSGD). Time to {}% is the \
         wall-clock time from the start of the run to the first evaluation at or above it \
         (evaluations are per epoch, so it is rounded up to an epoch's end), the mean over \
         the seeds; the epoch of that evaluation says how much of a difference is accuracy \
         rather than speed.\n\n",
        s.train, s.epochs, plan.batch, s.test, plan.target
    )
}

fn link_section<'a>(
    plan: &Plan,
    link: &str,
    cal: Option<Calibration>,
    ranks: u32,
    find: &dyn Fn(&Variant) -> Vec<&'a Outcome>,
) -> String {
    let mut md = format!("## {link}\n\n");
    match cal {
        Some(c) => {
            let _ = writeln!(md, "{}", calibration_text(link, c));
        }
        None => md += "No calibration could be read; the model's column is empty.\n\n",
    }
    let mut t = Table::new(&[
        "codec",
        "test accuracy (%)",
        "samples/s",
        "step ms",
        "compute ms",
        "communication ms",
        "of which exposed ms",
        "model ms",
        "measured / model",
        "bytes sent / step",
        &format!("time to {}% (s)", plan.target),
    ]);
    for v in &plan.variants {
        let runs = find(v);
        let Some(first) = runs.first() else { continue };
        let w = Timing::of(first);
        let predicted = cal.map(|c| w.predicted_ms(v, c, ranks));
        t.row(vec![
            v.label.into(),
            report::over_seeds(&runs, Outcome::accuracy),
            format!("{:.0}", w.samples_per_s),
            format!("{:.1}", w.step_ms),
            format!("{:.1}", w.compute_ms),
            format!("{:.1}", w.communication_ms),
            format!("{:.1}", w.exposed_ms),
            predicted.map_or("-".into(), |p| format!("{p:.1}")),
            predicted.map_or("-".into(), |p| format!("{:.2}", w.communication_ms / p)),
            format!("{:.0}", w.sent),
            match (time_to(&runs, plan.target), epochs_to(&runs, plan.target)) {
                (Some(t), Some(e)) => format!("{t:.1} (epoch {e:.1})"),
                _ => "not reached".into(),
            },
        ]);
    }
    md += &t.markdown();
    md
}

/// Where compression paid, link by link, in time to accuracy and in step time.
fn findings(plan: &Plan, outcomes: &[Vec<Outcome>], settings: &Settings, ranks: u32) -> String {
    let mut md = String::from("## Findings (computed from the tables)\n\n");
    let target = plan.target;
    for (&link, outs) in plan.links.iter().zip(outcomes) {
        let runs =
            |v: &Variant| jobs::of_seeds(outs, &settings.seeds, |s| plan.job(link, v, s, ranks).id);
        let base_runs = runs(&plan.variants[0]);
        let Some(base) = base_runs.first() else {
            continue;
        };
        let base_t = Timing::of(base);
        let (base_time, base_epochs) = (time_to(&base_runs, target), epochs_to(&base_runs, target));
        let _ = writeln!(
            md,
            "- At {link} the uncompressed step waits on communication for {:.0}% of its time \
             ({:.1} of {:.1} ms; {:.1} ms more ran behind the backward pass).",
            100.0 * base_t.exposed_ms / base_t.step_ms,
            base_t.exposed_ms,
            base_t.step_ms,
            (base_t.communication_ms - base_t.exposed_ms).max(0.0)
        );
        for v in &plan.variants[1..] {
            let vr = runs(v);
            let Some(o) = vr.first() else { continue };
            let t = Timing::of(o);
            let speed = base_t.step_ms / t.step_ms;
            let step = if speed >= 1.05 {
                format!("its step is {speed:.2}× as fast")
            } else if speed > 0.95 {
                format!("its step is as fast ({speed:.2}×)")
            } else {
                format!("its step is slower ({speed:.2}×)")
            };
            let reach = match (time_to(&vr, target), base_time) {
                (Some(a), Some(b)) => {
                    let (ea, eb) = (
                        epochs_to(&vr, target).unwrap_or(0.0),
                        base_epochs.unwrap_or(0.0),
                    );
                    let why = if (ea - eb).abs() < 0.25 {
                        "in the same epoch, so the difference is the step time".to_string()
                    } else if ea < eb {
                        format!(
                            "in epoch {ea:.1} against {eb:.1}: its accuracy, not its speed, \
                             decides most of the difference"
                        )
                    } else {
                        format!("in epoch {ea:.1} against {eb:.1}: it needs more epochs")
                    };
                    let verdict = if a < 0.95 * b {
                        "pays"
                    } else if a > 1.05 * b {
                        "does not pay"
                    } else {
                        "makes no difference"
                    };
                    format!("{target}% after {a:.1} s against {b:.1} s, {why}: it {verdict}")
                }
                (None, Some(_)) => {
                    format!("it never reaches {target}% in every seed: it does not pay")
                }
                (Some(a), None) => format!(
                    "{target}% after {a:.1} s, which the uncompressed run does not reach in every seed"
                ),
                (None, None) => format!("neither reaches {target}% in every seed"),
            };
            let _ = writeln!(
                md,
                "  - {}: {step} (communication {:.1} ms, {:.1} of it exposed, compute {:.1} \
                 ms); {reach}.",
                v.label, t.communication_ms, t.exposed_ms, t.compute_ms
            );
        }
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tc_rates_read_in_bits_per_second() {
        assert_eq!(link_bits_per_s("1gbit"), Some(1e9));
        assert_eq!(link_bits_per_s("100mbit"), Some(1e8));
        assert_eq!(link_bits_per_s("2.5gbit"), Some(2.5e9));
        assert_eq!(link_bits_per_s("512kbit"), Some(512e3));
        assert_eq!(link_bits_per_s("fast"), None);
        assert_eq!(link_bits_per_s("100mbps"), None);
    }

    #[test]
    fn a_calibration_well_below_the_link_is_said_to_be_the_cpus() {
        let at = |beta| calibration_text("1gbit", Calibration { alpha: 14e-6, beta });
        let link_paced = at(8.4e-9);
        assert!(
            link_paced.contains("(952 Mbit/s, 95% of the link's rate)."),
            "{link_paced}"
        );
        assert!(!link_paced.contains("CPUs"), "{link_paced}");
        let cpu_paced = at(12.05e-9);
        assert!(cpu_paced.contains("66% of the link's rate"), "{cpu_paced}");
        assert!(
            cpu_paced.ends_with(
                "(664 Mbit/s, 66% of the link's rate). The ranks' CPUs, not the emulated link, \
                 set this rate: the lab shared the machine's cores with other work, so its \
                 figures are those of a slower link; rerun on a quiet machine.\n"
            ),
            "{cpu_paced}"
        );
        let unknown = calibration_text(
            "fast",
            Calibration {
                alpha: 14e-6,
                beta: 8e-9,
            },
        );
        assert!(unknown.ends_with("(1000 Mbit/s).\n"), "{unknown}");
    }
}
