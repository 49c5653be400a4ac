//! Contract 0.3 end to end (issue 11): layer-rate plugins (`lars`, `lamb`) and the stateful
//! `plateau` against their native twins, in training (one process and two ranks), their faults,
//! a stateful plugin stopped and resumed bit for bit, and the label-smoothing world fix.

use std::path::{Path, PathBuf};

use lsgd_host::model::Arch;
use lsgd_host::optim::AdamWConfig;
use lsgd_host::plugin::{Plugin, PolicyKind};
use lsgd_host::policy::{Bounds, PolicySet};
use lsgd_host::trace::{Inputs, Norms, parse_series, read_input};
use lsgd_host::train::{self, Reporting, TrainConfig};
use lsgd_policy::Params;

use crate::common::*;

fn golden_input(name: &str) -> PathBuf {
    root().join("tests/golden/inputs").join(name)
}

/// The synthetic cnn norms and the metric and loss series of the golden cases.
fn inputs() -> Inputs {
    Inputs {
        metrics: read_input(&golden_input("metric-90-epochs.txt"), parse_series).unwrap(),
        losses: read_input(&golden_input("loss-900-steps.txt"), parse_series).unwrap(),
        norms: read_input(&golden_input("norms-cnn.csv"), Norms::parse).unwrap(),
    }
}

#[test]
fn lars_and_lamb_return_their_native_twins_multipliers_bit_for_bit() {
    let rt = runtime();
    let inputs = inputs();
    let settings: [(&str, &[(&str, &str)]); 4] = [
        ("lars", &[]),
        (
            "lars",
            &[
                ("clip", "true"),
                ("exclude_bias_and_bn", "false"),
                ("eps", "1e-9"),
            ],
        ),
        ("lamb", &[]),
        ("lamb", &[("min_ratio", "0.5"), ("max_ratio", "2")]),
    ];
    for (name, set) in settings {
        let mut p = load(&rt, name, set).unwrap();
        assert_eq!(p.kind(), PolicyKind::LayerRate);
        let mut twin = lsgd_policy::native_layer_rate(name, &Params(p.params().to_vec()))
            .unwrap()
            .unwrap();
        let mut c = clock(90, 10, 8192);
        while !c.finished() {
            let s = c.state();
            let norms = inputs.norms.at(s.step);
            let (w, n) = (p.multipliers(&s, norms).unwrap(), twin(&s, norms));
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&w), bits(&n), "{name} {set:?} at step {}", s.step);
            c.advance(s.global_batch, None);
        }
    }
}

#[test]
fn plateau_follows_its_native_twin_and_reduces_on_a_plateau() {
    let rt = runtime();
    let inputs = inputs();
    for set in [
        &[("patience", "3"), ("factor", "0.5"), ("cooldown", "1")][..],
        &[
            ("monitor", "loss"),
            ("patience", "20"),
            ("threshold_mode", "abs"),
        ][..],
    ] {
        let mut p = load(&rt, "plateau", set).unwrap();
        assert!(p.stateful());
        let mut twin = lsgd_policy::native("plateau", &Params(p.params().to_vec()))
            .unwrap()
            .unwrap();
        let (mut c, mut epochs) = (clock(90, 10, 8192), 0);
        let mut lrs = Vec::new();
        while !c.finished() {
            let s = c.state();
            let (w, n) = (p.call(&s).unwrap().as_f64(), twin(&s));
            assert_eq!(w.to_bits(), n.to_bits(), "{set:?} at step {}", s.step);
            lrs.push(w);
            inputs.advance(&mut c, s.global_batch, &mut epochs);
        }
        let last = *lrs.last().unwrap();
        assert!(
            last < lrs[50] / 1.9,
            "{set:?}: no reduction ({} → {last})",
            lrs[50]
        );
    }
}

#[test]
fn a_stateful_plugin_restored_from_a_snapshot_continues_bit_for_bit() {
    let rt = runtime();
    let inputs = inputs();
    let set = [("monitor", "loss"), ("patience", "5"), ("factor", "0.5")];
    let run = |p: &mut Plugin, from: u64, to: u64| -> Vec<f64> {
        let (mut c, mut epochs, mut out) = (clock(90, 10, 8192), 0, Vec::new());
        while c.step() < to {
            let s = c.state();
            if s.step >= from {
                out.push(p.call(&s).unwrap().as_f64());
            }
            inputs.advance(&mut c, s.global_batch, &mut epochs);
        }
        out
    };
    let mut straight = load(&rt, "plateau", &set).unwrap();
    let all = run(&mut straight, 0, 600);
    let mut first = load(&rt, "plateau", &set).unwrap();
    run(&mut first, 0, 300);
    let saved = first.state_at(300).unwrap().expect("plateau is stateful");
    let mut second = load(&rt, "plateau", &set).unwrap();
    second.restore(300, saved.clone()).unwrap();
    assert_eq!(run(&mut second, 300, 600), all[300..]);
    // Both paths end in the same state.
    assert_eq!(
        second.state_at(600).unwrap(),
        straight.state_at(600).unwrap()
    );
    let e = second.restore(300, vec![0xff; 3]).unwrap_err();
    assert!(e.to_string().contains("restore"), "{e}");
    // A pure plugin has no state.
    assert_eq!(load(&rt, "warmup", &[]).unwrap().state_at(0).unwrap(), None);
}

#[test]
fn a_label_smoothing_plugin_of_0_3_needs_no_codec_and_one_of_0_2_loads_despite_its_codec() {
    let rt = runtime();
    let v3 = load(&rt, "smoothing-v0-3", &[]).unwrap();
    assert_eq!(v3.kind(), PolicyKind::LabelSmoothing);
    assert_eq!(v3.contract().version.to_string(), "0.3.0");
    let mut v2 = load(&rt, "smoothing-v0-2", &[]).unwrap();
    assert_eq!(v2.kind(), PolicyKind::LabelSmoothing);
    assert_eq!(v2.contract().version.to_string(), "0.2.0");
    let mut reference = load(&rt, "label-smoothing", &[]).unwrap();
    let s = clock(90, 10, 8192).state();
    assert_eq!(v2.call(&s).unwrap(), reference.call(&s).unwrap());
}

/// A small CPU run of the cnn on 640 samples at batch 64, one thread, with SGD or AdamW.
fn config(out: PathBuf, adamw: bool) -> TrainConfig {
    let mut c = crate::train::config(out, Arch::Cnn, 640, 2, 64);
    c.run.adamw = adamw.then(AdamWConfig::default);
    c.run.base_lr = if adamw { 0.002 } else { 0.1 };
    c.run.reference_batch = 64;
    c.run.seed = 5;
    c.run.test_subset = Some(500);
    c
}

fn set(names: &[(&str, &[(&str, &str)])]) -> PolicySet {
    let rt = runtime();
    let plugins = names
        .iter()
        .map(|(n, s)| load(&rt, n, s).unwrap())
        .collect();
    PolicySet::new(plugins, Bounds::default()).unwrap()
}

fn quiet() -> Reporting {
    Reporting { quiet: true }
}

fn meta(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap()
}

#[test]
fn lars_and_lamb_train_and_change_the_update() {
    for (adamw, plugin, set_) in [
        (false, "lars", &[("coefficient", "0.02")][..]),
        (true, "lamb", &[][..]),
    ] {
        let base = config(scratch(&format!("layer-{plugin}-base")), adamw);
        let plain = train::run(&base, set(&[]), None, quiet()).unwrap();
        let with = config(scratch(&format!("layer-{plugin}")), adamw);
        let s = train::run(&with, set(&[(plugin, set_)]), None, quiet()).unwrap();
        assert_eq!(s.steps, 20);
        assert_ne!(
            s.weights_blake3, plain.weights_blake3,
            "{plugin} changed nothing"
        );
        let acc = s.last_eval.unwrap().accuracy;
        assert!(
            acc > 0.5,
            "{plugin}: test accuracy {acc} after 2 epochs of 640 samples"
        );
    }
}

#[test]
fn bad_layer_rate_outputs_stop_training_with_the_plugin_step_and_a_checkpoint() {
    for (fault, says) in [
        ("nan", "multiplier NaN for"),
        ("negative", "multiplier -1 for"),
        ("count", "9 multipliers for 10 parameter tensors"),
    ] {
        let cfg = config(scratch(&format!("layer-bad-{fault}")), false);
        let bad = set(&[("bad-layer-rate", &[("fault", fault), ("at_step", "3")])]);
        let e = train::run(&cfg, bad, None, quiet()).unwrap_err();
        let msg = format!("{e:#}");
        assert!(msg.contains("bad-layer-rate.wasm"), "{msg}");
        assert!(msg.contains("multipliers at step 3"), "{msg}");
        assert!(msg.contains(says), "{fault}: {msg}");
        assert!(msg.contains("state before step 3 saved to"), "{msg}");
        let m = meta(&cfg.invocation.out);
        assert_eq!(
            (m["step"].as_u64(), m["reason"].as_str()),
            (Some(3), Some("plugin fault"))
        );
    }
}

#[test]
fn a_run_with_plateau_stops_and_resumes_bit_for_bit() {
    let plateau: &[(&str, &str)] = &[
        ("monitor", "loss"),
        ("patience", "2"),
        ("factor", "0.5"),
        ("threshold", "0.2"),
    ];
    let policies = || set(&[("plateau", plateau), ("lars", &[("coefficient", "0.02")])]);
    let straight = config(scratch("layer-plateau-straight"), false);
    let a = train::run(&straight, policies(), None, quiet()).unwrap();
    let lrs: Vec<f64> = steps(&straight.invocation.out)
        .iter()
        .map(|s| s.lr)
        .collect();
    assert!(lrs[19] < lrs[0], "plateau never reduced the LR: {lrs:?}");

    let mut first = straight.clone();
    first.invocation.out = scratch("layer-plateau-split");
    first.invocation.stop_after_steps = Some(9);
    train::run(&first, policies(), None, quiet()).unwrap();
    let m = meta(&first.invocation.out);
    assert!(
        m["policy_state"]["schedule"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{m}"
    );
    let mut second = first.clone();
    second.invocation.stop_after_steps = None;
    let out = first.invocation.out.clone();
    let b = train::run(&second, policies(), Some(&out), quiet()).unwrap();
    assert_eq!(b.weights_blake3, a.weights_blake3, "resumed weights differ");
    let resumed: Vec<f64> = steps(&out).iter().map(|s| s.lr).collect();
    assert_eq!(resumed, lrs);
}

#[test]
fn lars_and_lamb_keep_two_ranks_bit_identical() {
    for (name, extra) in [
        (
            "lars",
            &[
                "--layer-rate",
                "lars",
                "--set",
                "layer_rate.coefficient=0.02",
            ][..],
        ),
        (
            "lamb",
            &[
                "--optimizer",
                "adamw",
                "--base-lr",
                "0.002",
                "--layer-rate",
                "lamb",
            ][..],
        ),
    ] {
        let out = scratch(&format!("mpi-{name}"));
        let mut args = extra.to_vec();
        args.extend(["--stop-after-steps", "6"]);
        let o = mpirun(&[ranks(2, &out, &args)]);
        assert!(o.status.success(), "{name}: {}\n{}", stdout(&o), stderr(&o));
        assert!(
            stderr(&o).contains("bit-identical on all 2 ranks at step 6"),
            "{name}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn inspect_trace_and_compare_handle_the_new_kinds() {
    let o = lsgd(&["inspect", plugin_path("plateau").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("stateful-schedule-plugin (lsgd:policy@0.3.0)"),
        "{}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains("state:       kept between calls"),
        "{}",
        stdout(&o)
    );
    let norms = golden_input("norms-cnn.csv");
    let shape = [
        "--epochs",
        "2",
        "--steps-per-epoch",
        "3",
        "--global-batch",
        "256",
    ];
    let o = lsgd(&[&["trace", "--layer-rate", "lars"][..], &shape].concat());
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--norms-file"), "{}", stderr(&o));
    let mut args = vec![
        "trace",
        "--layer-rate",
        "lars",
        "--norms-file",
        norms.to_str().unwrap(),
    ];
    args.extend(shape);
    let o = lsgd(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let header = stdout(&o).lines().next().unwrap().to_string();
    assert!(
        header.ends_with(",scale:fc2.bias,scale:fc2.weight"),
        "{header}"
    );
    assert_eq!(stdout(&o).lines().count(), 7);
    let mut args = vec![
        "compare",
        "lars",
        "lamb",
        "--norms-file",
        norms.to_str().unwrap(),
    ];
    args.extend(shape);
    let o = lsgd(&args);
    assert_eq!(o.status.code(), Some(1), "{}\n{}", stdout(&o), stderr(&o));
}
