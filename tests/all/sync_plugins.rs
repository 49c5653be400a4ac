//! Contract 0.5's sync kind on the runtime's side (issue 45): the reference sync plugins
//! (`local-sgd`, `post-local-sgd`, `diloco`, `adaptive-period`) through `trace`, `compare` and
//! `inspect`, against their native twins through the policy set, the host's rules on a plan
//! (final step, `synchronous` inside a window), `bad-sync`'s invalid outputs refused, faults
//! held with `--on-plugin-fault hold-last`, a stateful sync plugin's snapshot, and older
//! plugins beside a sync plugin. Training with a sync plugin is `sync.rs`'s.

use std::path::PathBuf;

use lsgd_host::plugin::{Fault, PolicyKind};
use lsgd_host::policy::{Bounds, OnFault, PolicySet, plan_rules};
use lsgd_host::trace::{Drift, Inputs, read_input};
use lsgd_policy::{OuterStep, Params, StepKind};

use crate::common::*;

/// The golden drift file: the ranks agree, disagree, half agree, agree again.
fn drift_file() -> PathBuf {
    root().join("tests/golden/inputs/drift-cnn.csv")
}

/// `trace --sync NAME` over one epoch of `steps` steps at batch 256, with `extra`
/// flags; the CSV's rows as fields, after the header, which is checked to end with the sync
/// columns.
fn trace_rows(name: &str, steps: u64, extra: &[&str]) -> Vec<Vec<String>> {
    let steps = steps.to_string();
    let mut args = vec![
        "trace",
        "--sync",
        name,
        "--epochs",
        "1",
        "--steps-per-epoch",
        &steps,
        "--global-batch",
        "256",
    ];
    args.extend(extra);
    let o = lsgd(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    let header = lines.next().unwrap();
    assert!(
        header.contains(",plan,local_steps,windows,outer_lr,outer_momentum,nesterov"),
        "{header}"
    );
    lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// The plan column of trace rows (column 5: after step, epoch, lr, batch, smoothing).
fn plans(rows: &[Vec<String>]) -> Vec<&str> {
    rows.iter().map(|r| r[5].as_str()).collect()
}

/// A plan sequence written one letter a step: `s`ynchronous, `l`ocal, `a`verage.
fn letters(seq: &str) -> Vec<&'static str> {
    seq.chars()
        .map(|c| match c {
            's' => "synchronous",
            'l' => "local",
            'a' => "average",
            _ => panic!("{c}"),
        })
        .collect()
}

#[test]
fn local_sgd_averages_every_period_and_at_the_last_step() {
    let rows = trace_rows("local-sgd", 10, &["--set", "sync.period=4"]);
    assert_eq!(plans(&rows), letters("lllalllala"));
    // The window each plan saw: local steps since the last average, windows ended.
    let windows: Vec<(&str, &str)> = rows.iter().map(|r| (&*r[6], &*r[7])).collect();
    assert_eq!(
        windows[..5],
        [("0", "0"), ("1", "0"), ("2", "0"), ("3", "0"), ("0", "1")]
    );
    assert_eq!(windows[9], ("1", "2"));
    for r in &rows {
        let outer = &r[8..11];
        match r[5].as_str() {
            "average" => assert_eq!(outer, ["1", "0", "false"], "plain averaging: {r:?}"),
            _ => assert_eq!(outer, ["", "", ""], "{r:?}"),
        }
    }
}

#[test]
fn post_local_sgd_is_synchronous_for_its_warmup_then_averages_every_period() {
    let rows = trace_rows(
        "post-local-sgd",
        12,
        &["--set", "sync.warmup_steps=3", "--set", "sync.period=3"],
    );
    // torch's PeriodicModelAverager(period=3, warmup_steps=3): averages after steps 3, 6, 9.
    assert_eq!(plans(&rows), letters("sssallallala"));
    assert_eq!(rows[3][6..8], ["0", "0"]);
    assert_eq!(rows[5][6..8], ["1", "1"]);
}

#[test]
fn diloco_ends_each_window_with_an_outer_nesterov_step() {
    let rows = trace_rows("diloco", 8, &["--set", "sync.period=3"]);
    assert_eq!(plans(&rows), letters("llallala"));
    for r in rows.iter().filter(|r| r[5] == "average") {
        assert_eq!(r[8..11], ["0.7", "0.9", "true"], "{r:?}");
    }
    let o = lsgd(&[
        "trace",
        "--sync",
        "diloco",
        "--set",
        "sync.outer_lr=0.5",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "16",
        "--global-batch",
        "256",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let last = &rows[15];
    assert_eq!(last["plan"], "average");
    assert_eq!(last["window"]["local_steps"], 15);
    assert_eq!(last["outer_step"]["lr"], 0.5);
    assert_eq!(last["outer_step"]["nesterov"], true);
    assert!(rows[0].get("outer_step").is_none(), "{}", rows[0]);
}

#[test]
fn adaptive_period_lengthens_its_window_while_the_ranks_agree() {
    // The default drift: every rank drifted alike, so each window doubles the next (2, 4, 8,
    // 16), and the run's last step ends its last window early.
    let rows = trace_rows(
        "adaptive-period",
        20,
        &["--set", "sync.period=2", "--world-size", "4"],
    );
    assert_eq!(
        plans(&rows),
        letters(&["la", "llla", "llllllla", "llllla"].concat())
    );
    // The golden drift on 32 ranks: the ranks agree until step 199 (H doubles to its maximum,
    // 64), then disagree (the window ending after step 247 is the first to see it: H halves
    // down to its minimum, 1, every step averaging).
    let file = drift_file();
    let rows = trace_rows(
        "adaptive-period",
        400,
        &["--world-size", "32", "--drift-file", file.to_str().unwrap()],
    );
    let mut lengths = Vec::new();
    let mut start = 0;
    for (i, r) in rows.iter().enumerate() {
        if r[5] == "average" {
            lengths.push(i + 1 - start);
            start = i + 1;
        }
    }
    let halving = [8, 16, 32, 64, 64, 64, 32, 16, 8, 4, 2, 1];
    assert_eq!(lengths[..halving.len()], halving, "{lengths:?}");
    assert!(
        lengths[halving.len()..].iter().all(|&l| l == 1),
        "{lengths:?}"
    );
    assert_eq!(lengths.iter().sum::<usize>(), 400);
}

#[test]
fn compare_reports_the_first_step_whose_plans_differ() {
    let shape = [
        "--epochs",
        "2",
        "--steps-per-epoch",
        "10",
        "--global-batch",
        "256",
    ];
    let o = lsgd(
        &[
            &["compare", "local-sgd", "local-sgd"][..],
            &["--set", "a.period=4", "--set", "b.period=8"],
            &shape,
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    // Period 4 averages after steps 3, 7, 11, 15, 19; period 8 after 7, 15 and the last, 19.
    assert!(
        out.contains("compared plan and, where both end a window, outer-step over 20 steps")
            && out.contains("2 of 20 steps differ; first at step 3: A = average, B = local"),
        "{out}"
    );
    // Same plans, different outer steps: the first outer step is the difference.
    let o = lsgd(
        &[
            &["compare", "local-sgd", "diloco", "--set", "both.period=4"][..],
            &shape,
            &["--format", "json"],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = &r["first_difference"];
    assert_eq!(
        (d["step"].as_u64(), d["output"].as_str()),
        (Some(3), Some("outer-step.lr"))
    );
    assert_eq!((d["a"].as_f64(), d["b"].as_f64()), (Some(1.0), Some(0.7)));
    let o = lsgd(&[&["compare", "diloco", "diloco"][..], &shape].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn inspect_describes_a_sync_plugin_and_its_parameters() {
    let o = lsgd(&["inspect", "diloco"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("world:       sync-plugin (lsgd:policy@0.5.0)")
            && out.contains("parameters:  (set with --set sync.NAME=VALUE)")
            && out.contains("outer_momentum")
            && out.contains("nesterov"),
        "{out}"
    );
    let o = lsgd(&["inspect", "adaptive-period", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["kind"], "sync");
    assert_eq!(j["world"], "stateful-sync-plugin");
    assert_eq!(j["wit_version"], "0.5.0");
    let names: Vec<&str> = j["params"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"period") && names.contains(&"max_period"),
        "{names:?}"
    );
}

#[test]
fn bad_sync_outputs_are_refused_naming_plugin_call_step_and_tensor() {
    let file = drift_file();
    let cases = [
        (
            "synchronous",
            "plan at step 2: returned an invalid value: synchronous after 2 local steps; end \
             the window with average first",
        ),
        (
            "negative-lr",
            "outer-step at step 3: returned an invalid value: outer lr -1",
        ),
        (
            "nan-lr",
            "outer-step at step 3: returned an invalid value: outer lr NaN",
        ),
        (
            "momentum-one",
            "outer-step at step 3: returned an invalid value: outer momentum 1: must be finite \
             and in [0, 1)",
        ),
        ("negative-momentum", "outer momentum -0.5"),
        (
            "nan-scale",
            "outer-step at step 3: returned an invalid value: lr-scale NaN for conv1.weight",
        ),
        (
            "negative-scale",
            "lr-scale -1 for conv1.weight: must be finite and >= 0",
        ),
        (
            "scale-count",
            "5 lr-scale entries for 4 parameter tensors (empty, or one per tensor)",
        ),
    ];
    for (fault, want) in cases {
        let setting = format!("sync.fault={fault}");
        let o = lsgd(&[
            "trace",
            "--sync",
            "bad-sync",
            "--set",
            &setting,
            "--set",
            "sync.at_step=2",
            "--drift-file",
            file.to_str().unwrap(),
            "--epochs",
            "1",
            "--steps-per-epoch",
            "10",
            "--global-batch",
            "256",
        ]);
        assert_eq!(o.status.code(), Some(2), "{fault}: {}", stdout(&o));
        let err = stderr(&o);
        assert!(
            err.contains("plugin ") && err.contains("bad-sync.wasm: ") && err.contains(want),
            "{fault}: {err}"
        );
    }
}

#[test]
fn hold_last_holds_a_refused_plan_and_a_bad_outer_step() {
    let hold = OnFault::HoldLast { max_in_a_row: 10 };
    let rt = runtime();
    // From step 1 every plan inside a window is a refused `synchronous`: the held `local`
    // carries the window on, and the last step still ends it.
    let bad = load(
        &rt,
        "bad-sync",
        &[("fault", "synchronous"), ("at_step", "1")],
    )
    .unwrap();
    let mut set = PolicySet::new(vec![bad], Bounds::default()).unwrap();
    set.set_on_fault(hold);
    let (inputs, drift) = (Inputs::default(), Drift::default());
    let mut clock = clock(1, 8, 256);
    let (mut seen, mut held) = (Vec::new(), Vec::new());
    while !clock.finished() {
        let d = set.decide(&clock).unwrap();
        seen.push(d.plan.unwrap().name());
        for h in set.take_held() {
            assert!(
                h.fault.to_string().contains("synchronous after"),
                "{}",
                h.fault
            );
            held.push(h.fault.step.unwrap());
        }
        inputs.end_step(&mut clock, 256, d.plan, &mut 0);
    }
    assert_eq!(seen, letters("llllllla"));
    assert_eq!(held, [1, 2, 3, 4, 5, 6, 7]);

    // The outer step of step 7 is invalid: the one of step 3 is held.
    let bad = load(
        &rt,
        "bad-sync",
        &[("fault", "negative-lr"), ("at_step", "4")],
    )
    .unwrap();
    let mut set = PolicySet::new(vec![bad], Bounds::default()).unwrap();
    set.set_on_fault(hold);
    let mut clock = clock_of(8);
    let mut outer = Vec::new();
    while !clock.finished() {
        let d = set.decide(&clock).unwrap();
        if d.plan == Some(StepKind::Average) {
            let o = set.outer_step(&d.state, &d.window, drift.at(d.state.step));
            outer.push((d.state.step, o.unwrap().unwrap()));
        }
        inputs.end_step(&mut clock, 256, d.plan, &mut 0);
    }
    assert_eq!(
        outer,
        [(3, OuterStep::average()), (7, OuterStep::average())]
    );
    let held = set.take_held();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].fault.call, "outer-step");
    assert_eq!(held[0].fault.step, Some(7));

    // Without hold-last the same fault stops at once.
    let bad = load(
        &rt,
        "bad-sync",
        &[("fault", "negative-lr"), ("at_step", "0")],
    )
    .unwrap();
    let mut set = PolicySet::new(vec![bad], Bounds::default()).unwrap();
    let c = clock_of(8);
    let d = set.decide(&c).unwrap();
    let e = set
        .outer_step(&d.state, &d.window, drift.at(0))
        .unwrap_err();
    assert!(matches!(e.fault, Fault::BadOutput(_)), "{e}");
}

/// One epoch of `steps` steps at batch 256 on 32 ranks.
fn clock_of(steps: u64) -> lsgd_host::policy::Clock {
    clock(1, steps, 256)
}

#[test]
fn every_reference_sync_plugin_answers_as_its_native_twin_bit_for_bit() {
    let rt = runtime();
    let drift = read_input(&drift_file(), Drift::parse).unwrap();
    let inputs = Inputs::default();
    let settings: [(&str, &[(&str, &str)]); 5] = [
        ("local-sgd", &[("period", "6")]),
        ("post-local-sgd", &[("warmup_steps", "50"), ("period", "5")]),
        ("diloco", &[]),
        ("adaptive-period", &[]),
        (
            "adaptive-period",
            &[
                ("outer_momentum", "0.9"),
                ("nesterov", "true"),
                ("max_period", "32"),
            ],
        ),
    ];
    for (name, set) in settings {
        let p = load(&rt, name, set).unwrap();
        let label = p.label().to_string();
        let mut twin = lsgd_policy::native_sync(name, &Params(p.params().to_vec()))
            .unwrap()
            .unwrap();
        let mut set = PolicySet::new(vec![p], Bounds::default()).unwrap();
        let mut c = clock(90, 10, 8192);
        let mut epochs = 0;
        let mut averages = 0;
        while !c.finished() {
            let d = set.decide(&c).unwrap();
            let (s, w) = (d.state, d.window);
            let native = plan_rules(&label, &s, &w, twin.plan(&s, &w), false).unwrap();
            assert_eq!(d.plan, Some(native), "{name} plan at step {}", s.step);
            if native == StepKind::Average {
                averages += 1;
                let tensors = drift.at(s.step);
                let o = set.outer_step(&s, &w, tensors).unwrap().unwrap();
                let n = twin.outer_step(&s, &w, tensors);
                let bits = |o: &OuterStep| {
                    let mut v = vec![o.lr.to_bits(), o.momentum.to_bits(), u64::from(o.nesterov)];
                    v.extend(o.lr_scale.iter().map(|x| x.to_bits()));
                    v
                };
                assert_eq!(bits(&o), bits(&n), "{name} outer step at step {}", s.step);
            }
            inputs.end_step(&mut c, s.global_batch, d.plan, &mut epochs);
        }
        assert!(averages > 1, "{name}: {averages} windows");
        // The whole run's window count is the clock's.
        assert_eq!(c.window().windows, averages, "{name}");
    }
}

#[test]
fn a_stateful_sync_plugin_resumed_from_its_snapshot_answers_as_if_never_stopped() {
    let rt = runtime();
    let drift = read_input(&drift_file(), Drift::parse).unwrap();
    let inputs = Inputs::default();
    let fresh = || {
        let p = load(&rt, "adaptive-period", &[]).unwrap();
        PolicySet::new(vec![p], Bounds::default()).unwrap()
    };
    // One step of a set: its plan and, at a window's end, its outer step.
    let step = |set: &mut PolicySet, c: &mut lsgd_host::policy::Clock| {
        let d = set.decide(c).unwrap();
        let o = match d.plan {
            Some(StepKind::Average) => set
                .outer_step(&d.state, &d.window, drift.at(d.state.step))
                .unwrap(),
            _ => None,
        };
        inputs.end_step(c, d.state.global_batch, d.plan, &mut 0);
        (d.plan, o)
    };
    let (mut whole, mut c) = (fresh(), clock(90, 10, 8192));
    let mut first = Vec::new();
    for _ in 0..250 {
        first.push(step(&mut whole, &mut c));
    }
    // Stopped after step 249: the checkpoint holds the sync plugin's state at step 250 and the
    // clock's window.
    let states = whole.states_at(c.step()).unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].0.kind, PolicyKind::Sync);
    let mut resumed = fresh();
    for (slot, p) in resumed.plugins_mut() {
        assert_eq!(slot.kind, PolicyKind::Sync);
        p.restore(c.step(), states[0].1.clone()).unwrap();
    }
    let mut c2 = c.clone();
    for _ in 250..600 {
        let a = step(&mut whole, &mut c);
        let b = step(&mut resumed, &mut c2);
        assert_eq!(a, b, "at step {}", c.step() - 1);
    }
    assert!(first.iter().any(|(p, _)| *p == Some(StepKind::Average)));
}

#[test]
fn older_plugins_run_beside_a_sync_plugin() {
    // one-cycle is a 0.4 schedule (with momentum), lars a 0.3 layer-rate plugin.
    let norms = root().join("tests/golden/inputs/norms-cnn.csv");
    let o = lsgd(&[
        "trace",
        "--schedule",
        "one-cycle",
        "--layer-rate",
        "lars",
        "--norms-file",
        norms.to_str().unwrap(),
        "--sync",
        "local-sgd",
        "--set",
        "sync.period=2",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "4",
        "--global-batch",
        "256",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out.lines().next().unwrap();
    assert!(
        header.starts_with("step,epoch,lr,global_batch,label_smoothing,momentum,scale:")
            && header.ends_with(",plan,local_steps,windows,outer_lr,outer_momentum,nesterov"),
        "{header}"
    );
    assert_eq!(out.lines().count(), 5);
    let rt = runtime();
    let c = load_as(&rt, "one-cycle", PolicyKind::Schedule).unwrap();
    assert_eq!(c.contract().version.to_string(), "0.4.0");
    let v2 = load_as(&rt, "smoothing-v0-2", PolicyKind::LabelSmoothing).unwrap();
    assert_eq!(v2.contract().version.to_string(), "0.2.0");
    // A sync plugin where another kind is expected is refused with both worlds named.
    let Err(e) = load_as(&rt, "local-sgd", PolicyKind::Schedule) else {
        panic!("a sync plugin loaded as a schedule");
    };
    assert!(e.to_string().contains("sync-plugin"), "{e}");
}

#[test]
fn sync_settings_need_a_sync_plugin() {
    let o = lsgd(&[
        "trace",
        "--schedule",
        "warmup",
        "--set",
        "sync.period=4",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "4",
        "--global-batch",
        "256",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--set sync.period=… given, but no --sync plugin"),
        "{}",
        stderr(&o)
    );
}
