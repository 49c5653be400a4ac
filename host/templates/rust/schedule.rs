//! {{name}}: a learning-rate schedule for lsgd-host. Edit `describe`, `configure`,
//! `learning_rate` and `momentum`; the host calls describe once, configure once, then
//! learning_rate and momentum every step.
{{#stateful}}
//!
//! It keeps state between calls: the best metric seen so far, which lowers the rate as the
//! metric rises, and which the host saves with `snapshot` and brings back with `restore`.
{{/stateful}}

wit_bindgen::generate!({ path: "wit", world: "{{world}}" });

use std::cell::Cell;

use exports::lsgd::policy::plugin::Guest as Plugin;
use exports::lsgd::policy::schedule::Guest as Schedule;
{{#stateful}}
use exports::lsgd::policy::state::Guest as State;
{{/stateful}}
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static SCALE: Cell<f64> = const { Cell::new(1.0) };
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
            summary: "A constant learning rate: base_lr x B/B_ref x scale".into(),
{{/stateful}}
{{#stateful}}
            summary: "base_lr x B/B_ref x scale x (1 - the best metric so far)".into(),
{{/stateful}}
            params: vec![ParamSpec {
                name: "scale".into(),
                type_: ParamType::Float,
                default: Some(ParamValue::Float(1.0)),
                doc: "multiplier on the linearly scaled learning rate (>= 0)".into(),
            }],
        }
    }

    fn configure(params: Vec<Param>) -> Result<(), String> {
        let mut scale = 1.0;
        for p in params {
            match (p.name.as_str(), p.value) {
                ("scale", ParamValue::Float(v)) => scale = v,
                (name, _) => return Err(format!("unknown parameter '{name}'")),
            }
        }
        if !(scale.is_finite() && scale >= 0.0) {
            return Err(format!("scale must be >= 0, got {scale}"));
        }
        SCALE.set(scale);
{{#stateful}}
        BEST.set(0.0); // new parameters, a new state
{{/stateful}}
        Ok(())
    }
}

impl Schedule for Component {
    fn learning_rate(s: TrainState) -> f64 {
{{#stateful}}
        // Taking the larger value twice changes nothing: the host may call again at one step.
        if let Some(m) = s.last_metric
            && m > BEST.get()
        {
            BEST.set(m);
        }
{{/stateful}}
        let ratio = if s.reference_batch == 0 {
            1.0
        } else {
            f64::from(s.global_batch) / f64::from(s.reference_batch)
        };
        s.base_lr * ratio * SCALE.get(){{#stateful}} * (1.0 - BEST.get()){{/stateful}}
    }

    // The momentum of the step, asked right after learning_rate with the same state: a value in
    // [0, 1) sets SGD's momentum (AdamW's beta1) for the step, e.g. `Some(0.9)`; `None` keeps
    // the configured one (--momentum, --adam-beta1).
    fn momentum(_s: TrainState) -> Option<f64> {
        None
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
