//! {{name}}: a learning-rate schedule for lsgd-host. Edit `describe`, `configure` and
//! `learning_rate`; the host calls describe once, configure once, then learning_rate every step.

wit_bindgen::generate!({ path: "wit", world: "schedule-plugin" });

use std::cell::Cell;

use exports::lsgd::policy::plugin::Guest as Plugin;
use exports::lsgd::policy::schedule::Guest as Schedule;
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static SCALE: Cell<f64> = const { Cell::new(1.0) };
}

impl Plugin for Component {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "{{name}}".into(),
            version: "0.1.0".into(),
            summary: "A constant learning rate: base_lr x B/B_ref x scale".into(),
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
        Ok(())
    }
}

impl Schedule for Component {
    fn learning_rate(s: TrainState) -> f64 {
        let ratio = if s.reference_batch == 0 {
            1.0
        } else {
            f64::from(s.global_batch) / f64::from(s.reference_batch)
        };
        s.base_lr * ratio * SCALE.get()
    }
}

export!(Component);
