//! {{name}}: a layer-wise rate policy for lsgd-host. Edit `describe`, `configure` and
//! `multipliers`; the host calls describe once, configure once, then multipliers every step with
//! the norms of every parameter tensor, and scales the step's learning rate for tensor i by the
//! i-th multiplier (one per tensor, each finite and >= 0).
//!
//! This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
//! `coefficient x ||w|| / (||g|| + weight_decay x ||w||)`; biases, BatchNorm parameters and
//! tensors with a zero norm keep the schedule's rate (multiplier 1).
{{#stateful}}
//!
//! It keeps state between calls: the best metric seen so far, which lowers the coefficient to
//! `coefficient x (1 - best)` as the metric rises, and which the host saves with `snapshot` and brings back with `restore`.
{{/stateful}}

wit_bindgen::generate!({ path: "wit", world: "{{world}}" });

use std::cell::Cell;

use exports::lsgd::policy::layer_rate::{Guest as LayerRate, Role, TensorNorms};
use exports::lsgd::policy::plugin::Guest as Plugin;
{{#stateful}}
use exports::lsgd::policy::state::Guest as State;
{{/stateful}}
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static COEFFICIENT: Cell<f64> = const { Cell::new(0.001) };
{{#stateful}}
    // The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in
    // the policy calls, starts afresh with new parameters, and travels as its 8 bytes (a
    // little-endian f64) through snapshot and restore.
    static BEST: Cell<f64> = const { Cell::new(0.0) };
{{/stateful}}
}

impl Plugin for Component {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "{{name}}".into(),
            version: "0.1.0".into(),
{{^stateful}}
            summary: "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere"
                .into(),
{{/stateful}}
{{#stateful}}
            summary: "LARS with the coefficient x (1 - the best metric so far) per weight, 1 elsewhere"
                .into(),
{{/stateful}}
            params: vec![ParamSpec {
                name: "coefficient".into(),
                type_: ParamType::Float,
                default: Some(ParamValue::Float(0.001)),
                doc: "LARS trust coefficient (>= 0)".into(),
            }],
        }
    }

    fn configure(params: Vec<Param>) -> Result<(), String> {
        let mut coefficient = 0.001;
        for p in params {
            match (p.name.as_str(), p.value) {
                ("coefficient", ParamValue::Float(v)) => coefficient = v,
                (name, _) => return Err(format!("unknown parameter '{name}'")),
            }
        }
        if !(coefficient.is_finite() && coefficient >= 0.0) {
            return Err(format!("coefficient must be >= 0, got {coefficient}"));
        }
        COEFFICIENT.set(coefficient);
{{#stateful}}
        BEST.set(0.0); // new parameters, a new state
{{/stateful}}
        Ok(())
    }
}

impl LayerRate for Component {
{{^stateful}}
    fn multipliers(_s: TrainState, tensors: Vec<TensorNorms>) -> Vec<f64> {
{{/stateful}}
{{#stateful}}
    fn multipliers(s: TrainState, tensors: Vec<TensorNorms>) -> Vec<f64> {
{{/stateful}}
{{#stateful}}
        // Taking the larger value twice changes nothing: the host may call again at one step.
        if let Some(m) = s.last_metric
            && m > BEST.get()
        {
            BEST.set(m);
        }
{{/stateful}}
        // Exactly one multiplier per tensor, in the order of `tensors`.
        let coefficient = COEFFICIENT.get(){{#stateful}} * (1.0 - BEST.get()){{/stateful}};
        tensors.iter().map(|t| trust_ratio(coefficient, t)).collect()
    }
}

/// LARS's local learning rate of one tensor: finite and >= 0 for any finite norms.
fn trust_ratio(coefficient: f64, t: &TensorNorms) -> f64 {
    let (w, g) = (t.weight_norm, t.grad_norm);
    if !matches!(t.role, Role::Weight) || !(w > 0.0 && g > 0.0) {
        return 1.0;
    }
    coefficient * w / (g + t.weight_decay * w)
}
{{#stateful}}

impl State for Component {
    fn snapshot() -> Vec<u8> {
        BEST.get().to_le_bytes().to_vec()
    }

    fn restore(snapshot: Vec<u8>) -> Result<(), String> {
        let bytes = <[u8; 8]>::try_from(snapshot.as_slice())
            .map_err(|_| format!("a snapshot of {} bytes, expected 8", snapshot.len()))?;
        BEST.set(f64::from_le_bytes(bytes));
        Ok(())
    }
}
{{/stateful}}

export!(Component);
