//! The reference plugins against closed forms, through the sandbox, and against the same
//! formulas compiled natively (bit for bit over whole runs).

use lsgd_host::plugin::Output;
use lsgd_host::policy::{Bounds, PolicySet};
use lsgd_host::trace::trace;
use lsgd_policy::{Params, State};

use crate::common::*;

fn lr_at(p: &mut lsgd_host::plugin::Plugin, s: &State) -> f64 {
    match p.call(s).unwrap() {
        Output::LearningRate(lr) => lr,
        o => panic!("{o:?}"),
    }
}

/// States of a run at the given steps (constant batch).
fn states_at(epochs: u32, steps: u64, batch: u32, at: &[u64]) -> Vec<State> {
    let mut c = clock(epochs, steps, batch);
    let mut out = Vec::new();
    while !c.finished() {
        if at.contains(&c.step()) {
            out.push(c.state());
        }
        c.advance(batch, None);
    }
    out
}

#[test]
fn goyal_warmup_closed_forms() {
    let rt = runtime();
    let mut p = load(&rt, "warmup", &[]).unwrap();
    // Batch 8192 = 32 × 256: η = 0.1 × 32 = 3.2, warmup from η/32 = 0.1 over 5 epochs.
    let s = states_at(
        90,
        100,
        8192,
        &[0, 250, 499, 500, 2999, 3000, 6000, 8000, 8999],
    );
    let lr: Vec<f64> = s.iter().map(|s| lr_at(&mut p, s)).collect();
    assert_eq!(lr[0], 3.2 / 32.0, "step 0 uses η/k");
    assert!(
        (lr[1] - (0.1 + (3.2 - 0.1) * 0.5)).abs() < 1e-12,
        "halfway: {}",
        lr[1]
    );
    assert!(lr[2] < 3.2);
    assert_eq!(lr[3], 3.2, "η exactly at the end of warmup");
    assert_eq!(lr[4], 3.2);
    assert_eq!(lr[5], 3.2 * 0.1, "×γ at epoch 30");
    assert_eq!(lr[6], 3.2 * 0.1 * 0.1, "×γ² at epoch 60");
    assert_eq!(lr[7], 3.2 * 0.1 * 0.1 * 0.1, "×γ³ at epoch 80");
    assert_eq!(lr[8], lr[7]);
}

#[test]
fn constant_warmup_jumps_and_sqrt_scaling() {
    let rt = runtime();
    let s = states_at(10, 10, 8192, &[0, 49, 50]);
    let mut p = load(&rt, "warmup", &[("warmup", "constant")]).unwrap();
    assert_eq!(lr_at(&mut p, &s[0]), 3.2 / 32.0);
    assert_eq!(lr_at(&mut p, &s[1]), 3.2 / 32.0);
    assert_eq!(lr_at(&mut p, &s[2]), 3.2);
    let mut p = load(&rt, "warmup", &[("scaling", "sqrt"), ("warmup", "none")]).unwrap();
    assert_eq!(lr_at(&mut p, &s[0]), 0.1 * 32f64.sqrt());
}

#[test]
fn batch_ramp_grows_at_milestones_up_to_the_cap_and_the_schedule_sees_it() {
    let rt = runtime();
    let ramp = load(
        &rt,
        "batch-ramp",
        &[("milestones", "2,4,6"), ("max_batch", "2048")],
    )
    .unwrap();
    let lr = load(&rt, "constant", &[]).unwrap();
    let mut set = PolicySet::new(vec![ramp, lr], Bounds::default()).unwrap();
    let rows = trace(&mut set, clock(8, 10, 512), &Default::default()).unwrap();
    let at = |e: f64| rows.iter().find(|r| r.epoch >= e).unwrap();
    assert_eq!(at(0.0).global_batch, 512);
    assert_eq!(at(2.0).global_batch, 1024);
    assert_eq!(at(4.0).global_batch, 2048);
    assert_eq!(at(6.0).global_batch, 2048, "capped");
    // Linear scaling on the batch the ramp returned: 0.1 × 1024/256.
    assert_eq!(at(2.0).lr, 0.4);
    // Samples, not steps, define epochs: 8 epochs of 5120 samples.
    assert_eq!(
        rows.iter().map(|r| u64::from(r.global_batch)).sum::<u64>(),
        8 * 5120
    );
}

#[test]
fn label_smoothing_ramps_linearly_and_holds() {
    let rt = runtime();
    let mut p = load(
        &rt,
        "label-smoothing",
        &[
            ("epsilon", "0.0"),
            ("final_epsilon", "0.2"),
            ("ramp_end_epoch", "4"),
        ],
    )
    .unwrap();
    let s = states_at(8, 10, 256, &[0, 20, 40, 70]);
    let eps: Vec<f64> = s.iter().map(|s| p.call(s).unwrap().as_f64()).collect();
    assert_eq!(eps[0], 0.0);
    assert_eq!(eps[1], f64::from(0.1f32));
    assert_eq!(eps[2], f64::from(0.2f32));
    assert_eq!(eps[3], f64::from(0.2f32));
}

/// Every reference plugin returns exactly what the native formula returns, at every step.
#[test]
fn wasm_matches_native_bit_for_bit() {
    let rt = runtime();
    for name in lsgd_policy::NAMES {
        let mut p = load(&rt, name, &[]).unwrap();
        let mut native = lsgd_policy::native(&p.info().name, &Params(p.params().to_vec()))
            .unwrap_or_else(|| panic!("{name} has no native twin"))
            .unwrap();
        let params = Params(p.params().to_vec());
        let mut native_momentum = lsgd_policy::native_momentum(&p.info().name, &params)
            .transpose()
            .unwrap();
        let mut c = clock(90, 20, 8192);
        let mut n = 0;
        while !c.finished() {
            let s = c.state();
            let (w, nat) = (p.call(&s).unwrap().as_f64(), native(&s));
            assert_eq!(
                w.to_bits(),
                nat.to_bits(),
                "{name} at step {}: wasm {w} native {nat}",
                s.step
            );
            // Contract 0.4: the schedule's momentum too, asked after the LR as the host does.
            let (w, nat) = (
                p.momentum(&s).unwrap(),
                native_momentum.as_mut().and_then(|m| m(&s)),
            );
            assert_eq!(
                w.map(f64::to_bits),
                nat.map(f64::to_bits),
                "{name} momentum at step {}: wasm {w:?} native {nat:?}",
                s.step
            );
            c.advance(s.global_batch, Some(1.0));
            n += 1;
        }
        assert_eq!(n, 1800);
    }
}
