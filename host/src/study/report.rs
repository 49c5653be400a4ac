//! The parts every `report.md` shares: the header that says how its numbers were made,
//! Markdown tables and the mean-and-spread of a result over seeds.

use std::fmt::Write as _;
use std::process::Command;

use anyhow::Result;

use super::{Outcome, Settings};
use crate::plot::{self, Panel, Series};

/// The report's title and the facts that make its numbers reproducible: the command, seeds,
/// commit, threads and machine, and how long the jobs trained.
pub fn header(settings: &Settings, title: &str, outcomes: &[&Outcome]) -> String {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let train_s: f64 = outcomes.iter().map(|o| o.wall_s).sum();
    let seeds: Vec<String> = settings.seeds.iter().map(u64::to_string).collect();
    let mut s = format!("# {title}\n\n");
    let _ = writeln!(s, "- command: `{}`", settings.command);
    let _ = writeln!(s, "- seeds: {}", seeds.join(", "));
    let _ = writeln!(s, "- commit: {}", commit());
    let _ = writeln!(
        s,
        "- machine: {} hardware threads ({}); {} libtorch thread(s) per job{}, {} job(s) at once",
        cores,
        cpu_model(),
        settings.threads,
        if settings.ranks_jobs() {
            " and rank"
        } else {
            ""
        },
        if settings.ranks_jobs() {
            1
        } else {
            settings.parallel
        },
    );
    let _ = writeln!(
        s,
        "- {} training jobs, {:.1} min of training in all (the jobs' own wall times; a re-run \
         trains only jobs whose flags changed); every job's flags, log and metrics.jsonl are \
         under `jobs/`",
        outcomes.len(),
        train_s / 60.0
    );
    s.push('\n');
    s
}

/// The commit of the working tree the study runs in, `+ changes` when it differs from it.
fn commit() -> String {
    let git = |args: &[&str]| Command::new("git").args(args).output().ok();
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(o) if o.status.success() => {
            let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let clean =
                git(&["diff", "--quiet", "HEAD", "--", "."]).is_some_and(|o| o.status.success());
            if clean {
                format!("`{hash}`")
            } else {
                format!("`{hash}` with uncommitted changes")
            }
        }
        _ => format!(
            "unknown (not run in a git checkout; lsgd-host {})",
            env!("CARGO_PKG_VERSION")
        ),
    }
}

/// The CPU's model name from /proc/cpuinfo.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "CPU model unknown".into())
}

/// A Markdown table.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as columns).
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.head.len(), "cells of {:?}", self.head);
        self.rows.push(cells);
    }

    /// The table in Markdown, followed by a blank line.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut s = line(&self.head);
        s += &format!("|{}\n", "---|".repeat(self.head.len()));
        for r in &self.rows {
            s += &line(r);
        }
        s.push('\n');
        s
    }
}

/// The mean of `values`.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// A final result in % over seeds (`value` is [`Outcome::accuracy`] or [`Outcome::error`]):
/// "91.23" for one seed, "91.23 (90.90–91.56)" (mean, then the range) for several; jobs that
/// diverged are counted instead.
pub fn over_seeds(outcomes: &[&Outcome], value: fn(&Outcome) -> Option<f64>) -> String {
    let accs: Vec<f64> = outcomes.iter().filter_map(|o| value(o)).collect();
    let diverged = outcomes.len() - accs.len();
    let mut s = match accs.len() {
        0 => String::new(),
        1 => format!("{:.2}", accs[0]),
        _ => {
            let lo = accs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = accs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} ({lo:.2}–{hi:.2})", mean(&accs))
        }
    };
    if diverged > 0 {
        if !s.is_empty() {
            s += "; ";
        }
        s += &format!("diverged ({diverged} of {})", outcomes.len());
    }
    s
}

/// Mean of `value` (%) over the seeds that did not diverge, `None` when all did.
pub fn mean_of(outcomes: &[&Outcome], value: fn(&Outcome) -> Option<f64>) -> Option<f64> {
    let accs: Vec<f64> = outcomes.iter().filter_map(|o| value(o)).collect();
    (!accs.is_empty()).then(|| mean(&accs))
}

/// " (outside the seeds' ranges)" when every run of `a` is above every run of `b` or below,
/// " (within the seeds' ranges)" when the ranges overlap, nothing with one seed each.
pub fn separation(
    a: &[&Outcome],
    b: &[&Outcome],
    value: fn(&Outcome) -> Option<f64>,
) -> &'static str {
    let range = |runs: &[&Outcome]| {
        let v: Vec<f64> = runs.iter().filter_map(|o| value(o)).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (v.len(), lo, hi)
    };
    let ((na, alo, ahi), (nb, blo, bhi)) = (range(a), range(b));
    if na < 2 && nb < 2 || na == 0 || nb == 0 {
        ""
    } else if ahi < blo || bhi < alo {
        " (outside the seeds' ranges)"
    } else {
        " (within the seeds' ranges)"
    }
}

/// One series per labelled run, its points `f` of the run.
pub fn series_of(
    runs: &[(String, &Outcome)],
    f: &dyn Fn(&Outcome) -> Vec<(f64, f64)>,
) -> Vec<Series> {
    runs.iter()
        .map(|(label, o)| Series {
            label: label.clone(),
            points: f(o),
        })
        .collect()
}

/// The point (batch, mean final test error over the seeds) of a batch's runs, diverged runs
/// counted at chance.
pub fn error_point(batch: u32, runs: &[&Outcome]) -> (f64, f64) {
    let errs: Vec<f64> = runs.iter().map(|o| o.error_or_chance()).collect();
    (f64::from(batch), mean(&errs))
}

/// Draws test error against the global batch (log scale), one series each, into `OUT/file`.
pub fn draw_error_vs_batch(
    settings: &Settings,
    file: &str,
    title: &str,
    series: Vec<Series>,
) -> Result<()> {
    plot::draw(
        &[
            Panel::new("test error (%), diverged runs at chance (90%)", series)
                .log_x()
                .with_markers(),
        ],
        title,
        "global batch (log scale)",
        &settings.out.join(file),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::jobs::Status;
    use crate::train::metrics::{EvalRecord, Record};

    fn outcome(acc: Option<f64>) -> Outcome {
        Outcome {
            id: "x".into(),
            status: if acc.is_some() {
                Status::Finished
            } else {
                Status::Diverged { step: 4 }
            },
            records: acc
                .map(|a| {
                    Record::Eval(EvalRecord {
                        step: 10,
                        epoch: 1,
                        test_loss: 0.5,
                        test_acc: a,
                        elapsed_s: 1.0,
                    })
                })
                .into_iter()
                .collect(),
            wall_s: 1.0,
            dir: "x".into(),
            reused: false,
        }
    }

    #[test]
    fn seeds_show_mean_and_range_and_divergence() {
        let (a, b, c) = (outcome(Some(0.9)), outcome(Some(0.8)), outcome(None));
        let acc = Outcome::accuracy;
        assert_eq!(over_seeds(&[&a], acc), "90.00");
        assert_eq!(over_seeds(&[&a, &b], acc), "85.00 (80.00–90.00)");
        assert_eq!(over_seeds(&[&a, &b], Outcome::error), "15.00 (10.00–20.00)");
        assert_eq!(over_seeds(&[&a, &c], acc), "90.00; diverged (1 of 2)");
        assert_eq!(over_seeds(&[&c], acc), "diverged (1 of 1)");
        assert_eq!(mean_of(&[&c], acc), None);
        assert_eq!(mean_of(&[&a, &b, &c], Outcome::error), Some(15.0));
    }

    #[test]
    fn separation_compares_the_ranges() {
        let (a, b, c, d) = (
            outcome(Some(0.9)),
            outcome(Some(0.8)),
            outcome(Some(0.85)),
            outcome(Some(0.7)),
        );
        let acc = Outcome::accuracy;
        assert_eq!(separation(&[&a], &[&b], acc), "");
        assert_eq!(
            separation(&[&a, &c], &[&b, &d], acc),
            " (outside the seeds' ranges)"
        );
        assert_eq!(
            separation(&[&a, &b], &[&c, &d], acc),
            " (within the seeds' ranges)"
        );
    }

    #[test]
    fn tables_are_markdown() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "2".into()]);
        assert_eq!(t.markdown(), "| a | b |\n|---|---|\n| 1 | 2 |\n\n");
    }
}
