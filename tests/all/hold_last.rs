//! `--on-plugin-fault hold-last`: a faulting policy's last good output carries the step, its
//! instance is recreated, and the run stops anyway after `--max-plugin-faults` in a row.

use lsgd_host::plugin::Fault;
use lsgd_host::policy::{Bounds, OnFault, PolicySet};

use crate::common::*;

/// A set of one bad-schedule configured with `settings`, under `on_fault`.
fn schedule(settings: &[(&str, &str)], on_fault: OnFault) -> PolicySet {
    let plugin = load(&runtime(), "bad-schedule", settings).unwrap();
    let mut set = PolicySet::new(vec![plugin], Bounds::default()).unwrap();
    set.set_on_fault(on_fault);
    set
}

const HOLD3: OnFault = OnFault::HoldLast { max_in_a_row: 3 };

#[test]
fn a_burst_of_faults_shorter_than_the_limit_is_held_and_the_plugin_recovers() {
    // NaN from step 3 to 4: two invalid outputs in a row, then good ones again.
    let mut set = schedule(
        &[("mode", "nan"), ("from_step", "3"), ("until_step", "5")],
        HOLD3,
    );
    let mut clock = clock(1, 8, 256);
    let mut held_at = Vec::new();
    while !clock.finished() {
        let d = set.decide(&clock).expect("held, not stopped");
        assert_eq!(d.lr, 0.1, "step {}", d.state.step);
        for h in set.take_held() {
            assert!(
                h.fault.to_string().contains("learning-rate at step")
                    && h.fault.to_string().contains("NaN"),
                "{}",
                h.fault
            );
            held_at.push((h.fault.step, h.in_a_row));
        }
        clock.advance(256, Some(1.0));
    }
    assert_eq!(held_at, [(Some(3), 1), (Some(4), 2)]);
}

#[test]
fn a_trapping_plugin_is_recreated_and_gives_up_at_the_limit() {
    let mut set = schedule(&[("mode", "trap"), ("from_step", "2")], HOLD3);
    let mut clock = clock(1, 10, 256);
    let err = loop {
        match set.decide(&clock) {
            Ok(d) => assert_eq!(d.lr, 0.1),
            Err(e) => break e,
        }
        clock.advance(256, Some(1.0));
    };
    // Steps 2 and 3 held; the third trap in a row, at step 4, stops the run.
    assert_eq!(set.take_held().len(), 2);
    assert_eq!(err.step, Some(4));
    assert!(
        matches!(&err.fault, Fault::GaveUp { faults: 3, last } if matches!(**last, Fault::Trap(_))),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("learning-rate at step 4: trapped")
            && text.contains("3 faults in a row: --on-plugin-fault hold-last gave up"),
        "{text}"
    );
}

#[test]
fn a_fault_before_any_good_output_stops_even_with_hold_last() {
    let mut set = schedule(&[("mode", "trap")], HOLD3);
    let e = set.decide(&clock(1, 10, 256)).unwrap_err();
    assert!(matches!(e.fault, Fault::Trap(_)), "nothing to hold: {e}");
}

#[test]
fn abort_stops_at_the_first_fault() {
    let mut set = schedule(&[("mode", "trap"), ("from_step", "2")], OnFault::Abort);
    let mut clock = clock(1, 10, 256);
    for _ in 0..2 {
        set.decide(&clock).unwrap();
        clock.advance(256, Some(1.0));
    }
    let e = set.decide(&clock).unwrap_err();
    assert!(
        matches!(e.fault, Fault::Trap(_)) && e.step == Some(2),
        "{e}"
    );
    assert!(set.take_held().is_empty());
}

/// A tiny mlp run with bad-schedule NaN from step 2 on (until `until`, when given).
fn train(
    name: &str,
    until: Option<&str>,
    extra: &[&str],
) -> (std::process::Output, std::path::PathBuf) {
    let out = scratch(name);
    let mut args = vec![
        "run",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--global-batch",
        "50",
        "--train-subset",
        "400",
        "--test-subset",
        "100",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--schedule",
        "bad-schedule",
        "--set",
        "schedule.mode=nan",
        "--set",
        "schedule.from_step=2",
        "--quiet",
        "--out",
    ];
    args.push(out.to_str().unwrap());
    let until = until.map(|u| format!("schedule.until_step={u}"));
    if let Some(u) = &until {
        args.extend(["--set", u.as_str()]);
    }
    args.extend(extra);
    (lsgd(&args), out)
}

#[test]
fn a_run_with_hold_last_warns_for_each_held_step_and_finishes() {
    let (o, out) = train(
        "hold-last-run",
        Some("4"),
        &["--on-plugin-fault", "hold-last"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(
        err.matches("hold-last kept its last good output").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains("learning-rate at step 3: returned an invalid value: learning rate NaN"),
        "{err}"
    );
    assert_eq!(steps(&out).len(), 8);
    assert!(steps(&out).iter().all(|s| s.lr == 0.1));
}

#[test]
fn a_run_with_hold_last_gives_up_with_a_checkpoint_and_abort_stops_at_once() {
    let (o, out) = train(
        "hold-last-gives-up",
        None,
        &["--on-plugin-fault", "hold-last", "--max-plugin-faults", "3"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("learning-rate at step 4")
            && err.contains("3 faults in a row: --on-plugin-fault hold-last gave up")
            && err.contains("state before step 4 saved"),
        "{err}"
    );
    assert!(out.join("checkpoint.json").exists());
    let (o, _) = train("hold-last-abort", None, &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("learning-rate at step 2: returned an invalid value"),
        "{}",
        stderr(&o)
    );
}
