//! `plateau` against `torch.optim.lr_scheduler.ReduceLROnPlateau`: the series and learning
//! rates of `tests/data/plateau-torch.json`, written by `scripts/torch-plateau-reference.py`.
//!
//! The comparison is exact, bit for bit: `plateau` evaluates torch's comparisons with the same
//! expressions and replays each reduction as one multiplication of the previous LR, as torch
//! applies them to its stored LR, so there is no rounding difference to tolerate.

use lsgd_policy::{Params, State, Value};
use serde_json::Value as Json;

/// A fixture float: Python's repr, parsed with Rust's correctly rounded parser.
fn float(v: &Json) -> f64 {
    let text = v.as_str().expect("floats are written as strings");
    text.parse().unwrap_or_else(|e| panic!("'{text}': {e}"))
}

/// The case's torch arguments as `plateau` parameters, with scaling and warmup off.
fn params(case: &Json) -> Params {
    let args = &case["args"];
    let text = |v: &str| Value::Text(v.to_owned());
    let int = |k: &str| Value::Integer(args[k].as_i64().unwrap());
    let flt = |k: &str| Value::Float(float(&args[k]));
    Params(vec![
        ("scaling".into(), text("none")),
        ("warmup".into(), text("none")),
        ("monitor".into(), text(case["monitor"].as_str().unwrap())),
        ("mode".into(), text(args["mode"].as_str().unwrap())),
        ("factor".into(), flt("factor")),
        ("patience".into(), int("patience")),
        ("threshold".into(), flt("threshold")),
        (
            "threshold_mode".into(),
            text(args["threshold_mode"].as_str().unwrap()),
        ),
        ("cooldown".into(), int("cooldown")),
        ("min_lr".into(), flt("min_lr")),
        ("eps".into(), flt("eps")),
    ])
}

/// Observation `i` as the trainer presents it: the first step of epoch i + 1 carries the
/// evaluation of epoch i; step i + 1 carries the loss of step i.
fn state(monitor: &str, i: usize, value: f64, base_lr: f64) -> State {
    let s = State {
        base_lr,
        global_batch: 256,
        reference_batch: 256,
        world_size: 1,
        worker_batch: 256,
        total_epochs: 1000,
        ..State::default()
    };
    match monitor {
        "metric" => State {
            epoch: i as u32 + 1,
            epoch_fraction: (i + 1) as f64,
            step: 10 * (i as u64 + 1),
            last_metric: Some(value),
            ..s
        },
        _ => State {
            step: i as u64 + 1,
            last_loss: Some(value),
            ..s
        },
    }
}

#[test]
fn every_learning_rate_matches_torch_bit_for_bit() {
    let fixture: Json =
        serde_json::from_str(include_str!("data/plateau-torch.json")).expect("valid JSON");
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let monitor = case["monitor"].as_str().unwrap();
        let base_lr = float(&case["initial_lr"]);
        let mut plateau = lsgd_policy::native("plateau", &params(case))
            .unwrap()
            .unwrap();
        let (series, lrs) = (
            case["series"].as_array().unwrap(),
            case["lr"].as_array().unwrap(),
        );
        assert_eq!(series.len(), lrs.len());
        for (i, (x, want)) in series.iter().zip(lrs).enumerate() {
            let s = state(monitor, i, float(x), base_lr);
            let got = plateau(&s);
            // A second call at the same step must not count the observation again.
            assert_eq!(
                plateau(&s).to_bits(),
                got.to_bits(),
                "{name}: repeated call {i}"
            );
            let want = float(want);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{name}: observation {i}: plateau {got}, torch {want}"
            );
        }
    }
}
