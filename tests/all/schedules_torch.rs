//! Contract 0.4's torch-compatible schedules and the two compositions, traced through the host
//! (wasm plugins, `--then`, `--chain`) against `torch.optim.lr_scheduler` in the venv: every
//! step's LR, and one-cycle's momentum, to 1e-9 relative.

use serde_json::Value;

use crate::common::{lsgd, root, stderr, stdout, venv_python};

/// 3 epochs of 100 steps at the reference batch: η = --base-lr = 0.1 for every plugin.
const SHAPE: [&str; 6] = [
    "--epochs",
    "3",
    "--steps-per-epoch",
    "100",
    "--global-batch",
    "256",
];
const STEPS: usize = 300;

/// torch's LR and momentum per step for `spec` (scripts/torch-schedule-reference.py).
fn torch(spec: &[&str]) -> (Vec<f64>, Vec<f64>) {
    let steps = STEPS.to_string();
    let o = std::process::Command::new(venv_python())
        .arg(root().join("scripts/torch-schedule-reference.py"))
        .args(["--lr", "0.1", "--steps", &steps])
        .args(spec)
        .output()
        .expect("the venv's python runs (scripts/setup.sh --python-torch)");
    assert!(o.status.success(), "torch reference failed: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let floats = |key: &str| -> Vec<f64> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().parse().unwrap())
            .collect()
    };
    (floats("lr"), floats("momentum"))
}

/// The host's LR and momentum per step for `policy` flags (`trace --format json`).
fn host(policy: &[&str]) -> (Vec<f64>, Vec<Option<f64>>) {
    let mut args = vec!["trace", "--format", "json"];
    args.extend(SHAPE);
    args.extend(policy);
    let o = lsgd(&args);
    assert!(o.status.success(), "trace failed: {}", stderr(&o));
    let rows: Vec<Value> = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(rows.len(), STEPS);
    let lr = rows.iter().map(|r| r["lr"].as_f64().unwrap()).collect();
    let m = rows.iter().map(|r| r["momentum"].as_f64()).collect();
    (lr, m)
}

fn assert_close(what: &str, ours: &[f64], theirs: &[f64]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let rel = (a - b).abs() / b.abs().max(f64::MIN_POSITIVE);
        assert!(
            rel <= 1e-9,
            "{what} at step {step}: host {a}, torch {b} (rel {rel:e})"
        );
    }
}

#[test]
fn one_cycle_gives_torchs_lr_and_momentum() {
    for (ours, theirs) in [
        (vec![], vec![]),
        (
            vec![
                "--set",
                "schedule.three_phase=true",
                "--set",
                "schedule.anneal_strategy=linear",
                "--set",
                "schedule.pct_start=0.25",
            ],
            vec![
                "three_phase=true",
                "anneal_strategy=linear",
                "pct_start=0.25",
            ],
        ),
        (
            vec![
                "--set",
                "schedule.div_factor=10",
                "--set",
                "schedule.max_momentum=0.98",
            ],
            vec!["div_factor=10", "max_momentum=0.98"],
        ),
    ] {
        let mut flags = vec!["--schedule", "one-cycle"];
        flags.extend(&ours);
        let (lr, momentum) = host(&flags);
        let mut spec = vec!["one-cycle"];
        spec.extend(&theirs);
        let (torch_lr, torch_m) = torch(&spec);
        let what = format!("one-cycle {theirs:?}");
        assert_close(&format!("{what} lr"), &lr, &torch_lr);
        let momentum: Vec<f64> = momentum
            .iter()
            .map(|m| m.expect("one-cycle drives momentum"))
            .collect();
        assert_close(&format!("{what} momentum"), &momentum, &torch_m);
    }
}

#[test]
fn then_is_torchs_sequential_lr() {
    let (lr, momentum) = host(&[
        "--schedule",
        "linear",
        "--set",
        "schedule.start_factor=0.01",
        "--set",
        "schedule.total_iters=50",
        "--then",
        "cosine-annealing@50",
        "--set",
        "schedule.1.t_max=250",
        "--set",
        "schedule.1.eta_min=0.001",
    ]);
    let (torch_lr, _) = torch(&[
        "sequential",
        "milestone=50",
        "linear",
        "start_factor=0.01",
        "total_iters=50",
        "cosine-annealing",
        "t_max=250",
        "eta_min=0.001",
    ]);
    assert_close("SequentialLR(LinearLR, CosineAnnealingLR)", &lr, &torch_lr);
    assert!(
        momentum.iter().all(Option::is_none),
        "neither part drives momentum"
    );
}

#[test]
fn chain_is_torchs_chained_scheduler() {
    let (lr, _) = host(&[
        "--schedule",
        "linear",
        "--set",
        "schedule.total_iters=20",
        "--chain",
        "multistep",
        "--set",
        "schedule.1.milestones=100,200",
    ]);
    let (torch_lr, _) = torch(&[
        "chained",
        "linear",
        "total_iters=20",
        "multistep",
        "milestones=100,200",
    ]);
    assert_close("ChainedScheduler(LinearLR, MultiStepLR)", &lr, &torch_lr);
}

#[test]
fn composition_errors_name_the_flag() {
    let mut args = vec!["trace"];
    args.extend(SHAPE);
    let run = |extra: &[&str]| {
        let mut a = args.clone();
        a.extend(extra);
        let o = lsgd(&a);
        assert!(!o.status.success());
        stderr(&o)
    };
    let e = run(&["--schedule", "linear", "--schedule", "cosine-annealing"]);
    assert!(
        e.contains("'--schedule <PLUGIN>' cannot be used multiple times"),
        "{e}"
    );
    let e = run(&["--then", "cosine-annealing@5"]);
    assert!(e.contains("needs --schedule"), "{e}");
    let e = run(&["--schedule", "linear", "--then", "cosine-annealing"]);
    assert!(e.contains("expected PLUGIN@STEP"), "{e}");
    let e = run(&["--schedule", "linear", "--then", "a@5", "--chain", "b"]);
    assert!(e.contains("cannot be used with"), "{e}");
    let e = run(&["--schedule", "linear", "--then", "cosine-annealing@0"]);
    assert!(e.contains("milestone must be a step after 0"), "{e}");
    let e = run(&[
        "--schedule",
        "linear",
        "--set",
        "schedule.2.t_max=3",
        "--then",
        "linear@9",
    ]);
    assert!(e.contains("has no part 2"), "{e}");
    let e = run(&[
        "--schedule",
        "linear",
        "--then",
        "cosine-annealing@10",
        "--batch-size",
        "batch-ramp",
    ]);
    assert!(e.contains("cannot run beside the batch-size policy"), "{e}");
}
