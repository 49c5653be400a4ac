//! `run --resume DIR --allow-policy-change`: a run continues from its checkpoint with other
//! policy plugins, other parameters or more epochs. A swap at resume trains bit for bit as the
//! sequential composition that swaps at the same step; a run stopped by a plugin fault goes on
//! with the fixed parameters; a finished run trains further epochs; without the flag each is
//! refused with a message that names it; and metrics.jsonl records the change, also across a
//! later resume. They need Debian's `dataset-fashion-mnist`, like tests/all/train.rs, and the
//! `linear` and `multistep` plugins built.

use std::path::Path;
use std::process::Output;

use lsgd_host::train::metrics::{self, PolicyChangeRecord, Record};

use crate::common::*;

/// The flag under test.
const FLAG: &str = "--allow-policy-change";

/// `run` flags of a tiny deterministic CPU job, without policies: an MLP on 384 samples in
/// batches of 32 (12 steps an epoch) for `epochs` epochs, into `out`, then `extra`.
fn job(out: &Path, epochs: u32, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "run",
        "--model",
        "mlp",
        "--train-subset",
        "384",
        "--test-subset",
        "100",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "5",
        "--global-batch",
        "32",
        "--quiet",
        "--epochs",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(epochs.to_string());
    v.push("--out".into());
    v.push(out.display().to_string());
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lsgd(&args)
}

/// Runs `args`, which must succeed.
fn ok(args: &[String]) -> Output {
    let o = run(args);
    assert!(
        o.status.success(),
        "lsgd-host {}\n{}",
        args.join(" "),
        stderr(&o)
    );
    o
}

/// Runs `args`, which must fail; returns its stderr.
fn refused(args: &[String]) -> String {
    let o = run(args);
    assert!(
        !o.status.success(),
        "lsgd-host {} succeeded",
        args.join(" ")
    );
    stderr(&o)
}

/// The learning rate of each step in a run directory's metrics.jsonl.
fn lrs(out: &Path) -> Vec<f64> {
    steps(out).iter().map(|s| s.lr).collect()
}

/// The policy-change records of a run directory's metrics.jsonl.
fn changes(out: &Path) -> Vec<PolicyChangeRecord> {
    metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter_map(Record::as_policy_change)
        .cloned()
        .collect()
}

/// A schedule swapped at a resume trains exactly as the sequential composition swapping at
/// that step. Which pair makes that exact: with `--then B@k` the later part B sees the run as
/// if it started at k (its step is the real step − k, its total steps shortened by k), while
/// after a resume B sees the real step. So B must be a schedule whose output at real step s
/// under one parameter setting equals its output at s − k under another: `multistep`, whose LR
/// depends on the step only through the milestones, with every milestone moved by k
/// (milestone 3 counted from k = 5 is step 8). A milestone inside the resumed segment makes
/// the shift matter: a B ignoring it (milestones off by k) would drop the LR at the wrong step.
/// A = `linear` still warming up at k shows the first part is A's in both runs.
#[test]
fn a_schedule_swapped_at_resume_equals_the_sequential_composition() {
    let k = 5;
    let a = ["--schedule", "linear", "--set", "schedule.total_iters=8"];
    let composed = scratch("policy-change-composed");
    let o = ok(&job(
        &composed,
        1,
        &[
            &a[..],
            &[
                "--then",
                "multistep@5",
                "--set",
                "schedule.1.milestones=3",
                "--set",
                "schedule.1.gamma=0.5",
            ],
        ]
        .concat(),
    ));
    let composed_weights = weights(&o);

    let out = scratch("policy-change-swapped");
    let dir = out.to_str().unwrap();
    ok(&job(
        &out,
        1,
        &[&a[..], &["--stop-after-steps", "5"]].concat(),
    ));
    let b = [
        "--schedule",
        "multistep",
        "--set",
        "schedule.milestones=8",
        "--set",
        "schedule.gamma=0.5",
        "--resume",
        dir,
    ];
    let e = refused(&job(&out, 1, &b));
    assert!(
        e.contains("belongs to a different run") && e.contains(&format!("pass {FLAG}")),
        "{e}"
    );
    let o = ok(&job(&out, 1, &[&b[..], &[FLAG]].concat()));
    assert_eq!(weights(&o), composed_weights);

    let (swapped, composed) = (lrs(&out), lrs(&composed));
    assert_eq!(swapped.len(), 12);
    assert_eq!(swapped, composed, "the LR of each step");
    // The comparison covers A's warmup, B's first rate and B's drop at step 8.
    assert!(swapped[k - 2] < swapped[k - 1] && swapped[k - 1] != swapped[k]);
    assert_eq!(swapped[7], swapped[k]);
    assert_eq!(swapped[8], swapped[k] * 0.5);

    let recorded = changes(&out);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let c = &recorded[0];
    assert_eq!(c.step, k as u64);
    assert_eq!((c.epochs_from, c.epochs_to), (None, None));
    assert!(!c.codec_state_dropped);
    assert_eq!(c.changes.len(), 1, "{c:?}");
    let change = &c.changes[0];
    assert_eq!(change.slot, "schedule");
    assert!(
        change
            .from
            .as_deref()
            .is_some_and(|f| f.starts_with("schedule linear ")),
        "{change:?}"
    );
    assert!(
        change.to.as_deref().is_some_and(
            |t| t.starts_with("schedule multistep ") && t.contains("(\"milestones\", \"8\")")
        ),
        "{change:?}"
    );
    // The record sits between step 4 and step 5.
    let kinds: Vec<String> = metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|r| match r {
            Record::Step(s) => format!("step {}", s.step),
            Record::PolicyChange(c) => format!("change {}", c.step),
            Record::Eval(e) => format!("eval {}", e.step),
            _ => "other".into(),
        })
        .collect();
    let at = kinds.iter().position(|k| k == "change 5").unwrap();
    assert_eq!(kinds[at - 1..at + 2], ["step 4", "change 5", "step 5"]);
}

/// A plugin that returns NaN stops the run with a checkpoint and advice that leads somewhere:
/// the same plugin with fixed parameters is refused without the flag and continues with it; the
/// record of the change survives a later resume (which changes nothing).
#[test]
fn a_run_stopped_by_a_faulty_plugin_goes_on_with_the_fixed_one() {
    let out = scratch("policy-change-fix");
    let dir = out.to_str().unwrap();
    let bad = [
        "--schedule",
        "bad-schedule",
        "--set",
        "schedule.from_step=3",
    ];
    let nan = [&bad[..], &["--set", "schedule.mode=nan"]].concat();
    let fixed = [&bad[..], &["--set", "schedule.mode=ok"]].concat();
    let e = refused(&job(&out, 1, &nan));
    assert!(
        e.contains("state before step 3 saved") && e.contains(&format!("--resume {dir} {FLAG}")),
        "{e}"
    );

    let resume = ["--resume", dir];
    let e = refused(&job(&out, 1, &[&fixed[..], &resume].concat()));
    assert!(
        e.contains("policy plugins: checkpoint has") && e.contains(&format!("pass {FLAG}")),
        "{e}"
    );
    // The fixed run stops again at step 7, and a resume without the flag (nothing changes)
    // finishes it: the record of the change at step 3 is kept, once.
    ok(&job(
        &out,
        1,
        &[&fixed[..], &resume, &[FLAG, "--stop-after-steps", "7"]].concat(),
    ));
    let o = ok(&job(&out, 1, &[&fixed[..], &resume].concat()));
    assert!(stdout(&o).contains("after 12 steps"), "{}", stdout(&o));
    let lrs = lrs(&out);
    assert_eq!(lrs.len(), 12);
    assert!(lrs.iter().all(|&lr| lr == 0.1), "{lrs:?}");

    let recorded = changes(&out);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let c = &recorded[0];
    assert_eq!(c.step, 3);
    assert_eq!(c.changes.len(), 1);
    let change = &c.changes[0];
    let (from, to) = (
        change.from.as_deref().unwrap(),
        change.to.as_deref().unwrap(),
    );
    assert!(from.contains("\"mode\", \"nan\""), "{from}");
    assert!(to.contains("\"mode\", \"ok\""), "{to}");
}

/// A finished run given more epochs trains them (as a run that had them from the start, with a
/// schedule that does not look at the total), only with the flag; a run cannot be shortened to
/// an end it has passed.
#[test]
fn a_finished_run_trains_more_epochs_with_the_flag() {
    let schedule = [
        "--schedule",
        "warmup",
        "--set",
        "schedule.warmup_epochs=0.5",
    ];
    let straight = scratch("policy-change-epochs-straight");
    let o = ok(&job(&straight, 2, &schedule));
    let straight_weights = weights(&o);

    let out = scratch("policy-change-epochs");
    let dir = out.to_str().unwrap();
    ok(&job(&out, 1, &schedule));
    let resume = [&schedule[..], &["--resume", dir]].concat();
    let e = refused(&job(&out, 2, &resume));
    assert!(
        e.contains("--epochs: checkpoint has 1, this run has 2")
            && e.contains(&format!("pass {FLAG}")),
        "{e}"
    );
    let o = ok(&job(&out, 2, &[&resume[..], &[FLAG]].concat()));
    assert_eq!(weights(&o), straight_weights);
    assert_eq!(steps(&out).len(), 24);
    assert_eq!(lrs(&out), lrs(&straight));
    let recorded = changes(&out);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let c = &recorded[0];
    assert_eq!((c.step, c.epochs_from, c.epochs_to), (12, Some(1), Some(2)));
    assert!(c.changes.is_empty(), "{c:?}");

    // Back to one epoch: step 24 is past its end.
    let e = refused(&job(&out, 1, &[&resume[..], &[FLAG]].concat()));
    assert!(e.contains("past the end of 1 epoch(s)"), "{e}");
    // Other settings still must match, and say so.
    let e = refused(&job(
        &out,
        3,
        &[&resume[..], &[FLAG, "--weight-decay", "0.001"]].concat(),
    ));
    assert!(
        e.contains("--weight-decay: checkpoint has 0.0001, this run has 0.001")
            && !e.contains("--epochs:"),
        "{e}"
    );
}

/// A codec's error-feedback residuals carry over while the codec stays (more epochs train as a
/// run that had them from the start) and are dropped, and recorded as such, when it changes.
#[test]
fn codec_residuals_carry_over_only_to_the_same_codec() {
    let codec = ["--codec", "codec-top-k", "--error-feedback"];
    let straight = scratch("policy-change-codec-straight");
    let o = ok(&job(&straight, 2, &codec));
    let straight_weights = weights(&o);

    let out = scratch("policy-change-codec-epochs");
    let dir = out.to_str().unwrap();
    ok(&job(&out, 1, &codec));
    let o = ok(&job(
        &out,
        2,
        &[&codec[..], &["--resume", dir, FLAG]].concat(),
    ));
    assert_eq!(weights(&o), straight_weights, "the residuals were kept");
    assert!(!changes(&out)[0].codec_state_dropped);

    let out = scratch("policy-change-codec-swap");
    let dir = out.to_str().unwrap();
    ok(&job(
        &out,
        1,
        &[&codec[..], &["--stop-after-steps", "4"]].concat(),
    ));
    let denser = ["--set", "codec.density=0.05", "--resume", dir, FLAG];
    ok(&job(&out, 1, &[&codec[..], &denser].concat()));
    let recorded = changes(&out);
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].codec_state_dropped, "{recorded:?}");
    assert_eq!(recorded[0].changes[0].slot, "codec");
}

/// A stateful plugin keeps its snapshot across a change elsewhere and starts fresh when it is
/// itself changed.
#[test]
fn a_stateful_plugin_starts_fresh_only_when_it_changes() {
    let plateau = |patience: &'static str| {
        [
            "--schedule",
            "plateau",
            "--set",
            "schedule.monitor=loss",
            "--set",
            patience,
        ]
    };
    let (one, three) = (
        plateau("schedule.patience=1"),
        plateau("schedule.patience=3"),
    );
    let out = scratch("policy-change-stateful");
    let dir = out.to_str().unwrap();
    ok(&job(
        &out,
        1,
        &[&one[..], &["--stop-after-steps", "4"]].concat(),
    ));
    let more = ["--resume", dir, FLAG, "--stop-after-steps", "8"];
    ok(&job(&out, 2, &[&one[..], &more].concat()));
    ok(&job(
        &out,
        2,
        &[&three[..], &["--resume", dir, FLAG]].concat(),
    ));
    let recorded = changes(&out);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert_eq!((recorded[0].step, recorded[1].step), (4, 8));
    assert!(recorded[0].fresh_state.is_empty(), "{recorded:?}");
    assert_eq!(recorded[1].fresh_state, ["schedule"], "{recorded:?}");
}
