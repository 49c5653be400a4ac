//! The TensorBoard event files of `lsgd-host run`, read back by the `tensorboard` Python
//! package's own reader (`EventAccumulator`, in the venv scripts/setup.sh makes): every number
//! of every metrics.jsonl record is a scalar at the same step with the same value (float32),
//! after a straight run, after a resume that redoes steps past its checkpoint (with a restart
//! record of `launch` in between), and after a new run in the same directory. They need
//! Debian's `dataset-fashion-mnist`, like tests/all/train.rs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use lsgd_host::train::metrics::{Record, RestartRecord};
use serde_json::Value;

use crate::common::*;

/// Tag -> (step, value) in the order the reader returns them.
type Scalars = BTreeMap<String, Vec<(i64, f32)>>;

/// The venv's Python, which scripts/setup.sh gives the `tensorboard` package.
fn python() -> PathBuf {
    let python = venv_python();
    assert!(
        python.is_file(),
        "{} is missing: run scripts/setup.sh",
        python.display()
    );
    python
}

const READ: &str = r#"
import json, sys
try:
    from tensorboard.backend.event_processing import event_accumulator as ea
except ImportError as e:
    sys.exit(f"cannot import tensorboard ({e}): run scripts/setup.sh, which installs it")
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()[ea.SCALARS]}))
"#;

/// The scalars of the run directory `out` as TensorBoard reads them.
fn tensorboard_scalars(out: &Path) -> Scalars {
    let o = Command::new(python())
        .args(["-c", READ])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "reading {} with tensorboard's EventAccumulator failed:\n{}",
        out.display(),
        stderr(&o)
    );
    let read: BTreeMap<String, Vec<(i64, f64)>> =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    read.into_iter()
        .map(|(tag, v)| (tag, v.into_iter().map(|(s, x)| (s, x as f32)).collect()))
        .collect()
}

/// What metrics.jsonl says TensorBoard should hold: every numeric field of every line, named
/// `train/FIELD` for steps (at their index), `test/loss`, `test/accuracy`, `test/FIELD` for
/// evaluations and `restart/FIELD` (`lost_ranks` counted) for restarts (at their step). Only
/// `unix_s`, the restart's wall time, is no scalar.
fn expected_scalars(out: &Path) -> Scalars {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let mut want = Scalars::new();
    for line in text.lines() {
        let Value::Object(fields) = serde_json::from_str(line).unwrap() else {
            panic!("{line}")
        };
        let (group, x) = match fields["kind"].as_str().unwrap() {
            "step" => ("train", "step"),
            "eval" => ("test", "step"),
            "restart" => ("restart", "resumed_step"),
            k => panic!("kind {k}"),
        };
        let step = fields[x].as_i64().unwrap();
        for (name, value) in &fields {
            let value = match value {
                Value::Number(n) => n.as_f64().unwrap(),
                Value::Array(a) if name == "lost_ranks" => a.len() as f64,
                _ => continue,
            };
            if name == x || name == "unix_s" {
                continue;
            }
            let name = match name.as_str() {
                "test_loss" => "loss",
                "test_acc" => "accuracy",
                n => n,
            };
            want.entry(format!("{group}/{name}"))
                .or_default()
                .push((step, value as f32));
        }
    }
    want
}

fn assert_same(out: &Path, when: &str) -> Scalars {
    let (got, want) = (tensorboard_scalars(out), expected_scalars(out));
    let tags = |s: &Scalars| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(tags(&got), tags(&want), "{when}: the tags differ");
    for (tag, w) in &want {
        let g = &got[tag];
        let steps = |v: &[(i64, f32)]| v.iter().map(|p| p.0).collect::<Vec<_>>();
        assert_eq!(steps(g), steps(w), "{when}: the steps of {tag} differ");
        for ((s, a), (_, b)) in g.iter().zip(w) {
            assert!(
                a.to_bits() == b.to_bits(),
                "{when}: {tag} at step {s} is {a} in TensorBoard, {b} in metrics.jsonl"
            );
        }
    }
    got
}

fn event_files(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("events.out.tfevents."))
        .collect();
    v.sort();
    v
}

/// The tiny MLP job ([`tiny_at`]) with label smoothing: `epochs` of 12 steps, a
/// checkpoint every 4.
fn run(out: &Path, epochs: &str, extra: &[&str]) -> String {
    let smoothing_and_checkpoints = [
        "--label-smoothing",
        "label-smoothing",
        "--set",
        "label_smoothing.epsilon=0.1",
        "--checkpoint-every",
        "4",
        "--keep-checkpoints",
        "10",
    ];
    let args = tiny_at(
        32,
        epochs.parse().unwrap(),
        out,
        &[&smoothing_and_checkpoints[..], extra].concat(),
    );
    let o = lsgd(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let e = stderr(&o);
    assert!(o.status.success(), "lsgd-host {}:\n{e}", args.join(" "));
    e
}

#[test]
fn event_files_hold_the_scalars_of_metrics_jsonl() {
    let out = scratch("tensorboard");
    run(&out, "2", &[]);
    assert_eq!(event_files(&out).len(), 1, "{:?}", event_files(&out));
    let got = assert_same(&out, "a straight run");
    assert_eq!(got["train/loss"].len(), 24);
    assert_eq!(
        got["test/accuracy"].iter().map(|p| p.0).collect::<Vec<_>>(),
        [12, 24]
    );
    assert!(got["train/label_smoothing"].iter().any(|p| p.1 > 0.0));

    // Back to step 12's checkpoint, as if the run had been killed at step 23, and restarted by
    // `launch`: metrics.jsonl drops steps 12-23 and the evaluation at 24, the event files
    // must hide them too, keep the evaluation at 12 and show the restart.
    for entry in std::fs::read_dir(&out).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let step = name
            .strip_prefix("checkpoint-")
            .and_then(|n| n.strip_suffix(".json"))
            .map(|n| n.parse::<u64>().unwrap());
        if name == "checkpoint.json" || step.is_some_and(|s| s > 12) {
            std::fs::remove_file(out.join(name)).unwrap();
        }
    }
    let restart = Record::Restart(RestartRecord {
        attempt: 1,
        lost_ranks: vec![1, 2],
        signal: Some(9),
        world_size_before: 3,
        world_size_after: 1,
        resumed_step: 12,
        unix_s: 1.7e9,
        elapsed_s: 4.5,
    });
    let mut jsonl = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    jsonl.push_str(&serde_json::to_string(&restart).unwrap());
    jsonl.push('\n');
    std::fs::write(out.join("metrics.jsonl"), jsonl).unwrap();
    let e = run(&out, "2", &["--resume", out.to_str().unwrap()]);
    assert!(e.contains("(step 12, periodic)"), "{e}");
    assert_eq!(event_files(&out).len(), 2, "{:?}", event_files(&out));
    let got = assert_same(&out, "a resumed run");
    assert_eq!(got["train/loss"].len(), 24);
    assert_eq!(got["restart/world_size_after"], [(12, 1.0)]);
    assert_eq!(got["restart/lost_ranks"], [(12, 2.0)]);

    // A new run in the same directory (told to replace the old one) starts over.
    run(&out, "1", &["--overwrite"]);
    assert_eq!(event_files(&out).len(), 1, "{:?}", event_files(&out));
    let got = assert_same(&out, "a new run over an old one");
    assert_eq!(got["train/loss"].len(), 12);
    assert!(!got.contains_key("restart/attempt"));
}
