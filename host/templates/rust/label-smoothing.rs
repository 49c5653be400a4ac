//! {{name}}: a label-smoothing policy for lsgd-host. Edit `describe`, `configure` and
//! `epsilon`; the host calls describe once, configure once, then epsilon every step.
{{#stateful}}
//!
//! It keeps state between calls: the best metric seen so far, which lowers epsilon as the metric rises, and which the host saves with `snapshot` and brings back with `restore`.
{{/stateful}}

wit_bindgen::generate!({ path: "wit", world: "{{world}}" });

use std::cell::Cell;

use exports::lsgd::policy::label_smoothing::Guest as LabelSmoothing;
use exports::lsgd::policy::plugin::Guest as Plugin;
{{#stateful}}
use exports::lsgd::policy::state::Guest as State;
{{/stateful}}
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static EPSILON: Cell<f32> = const { Cell::new(0.1) };
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
            summary: "A constant label-smoothing epsilon".into(),
{{/stateful}}
{{#stateful}}
            summary: "epsilon x (1 - the best metric so far)".into(),
{{/stateful}}
            params: vec![ParamSpec {
                name: "epsilon".into(),
                type_: ParamType::Float,
                default: Some(ParamValue::Float(0.1)),
                doc: "label-smoothing epsilon, in [0, 1)".into(),
            }],
        }
    }

    fn configure(params: Vec<Param>) -> Result<(), String> {
        let mut epsilon = 0.1;
        for p in params {
            match (p.name.as_str(), p.value) {
                ("epsilon", ParamValue::Float(v)) => epsilon = v,
                (name, _) => return Err(format!("unknown parameter '{name}'")),
            }
        }
        // Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1.
        if !(epsilon >= 0.0 && (epsilon as f32) < 1.0) {
            return Err(format!("epsilon must be in [0, 1), got {epsilon}"));
        }
        EPSILON.set(epsilon as f32);
{{#stateful}}
        BEST.set(0.0); // new parameters, a new state
{{/stateful}}
        Ok(())
    }
}

impl LabelSmoothing for Component {
{{^stateful}}
    fn epsilon(_s: TrainState) -> f32 {
        EPSILON.get()
{{/stateful}}
{{#stateful}}
    fn epsilon(s: TrainState) -> f32 {
        // Taking the larger value twice changes nothing: the host may call again at one step.
        if let Some(m) = s.last_metric
            && m > BEST.get()
        {
            BEST.set(m);
        }
        // Computed in f64 and rounded to f32 once, as in every language.
        (f64::from(EPSILON.get()) * (1.0 - BEST.get())) as f32
{{/stateful}}
    }
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
