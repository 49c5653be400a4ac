//! {{name}}: a label-smoothing policy for lsgd-host. Edit `describe`, `configure` and
//! `epsilon`; the host calls describe once, configure once, then epsilon every step.

wit_bindgen::generate!({ path: "wit", world: "label-smoothing-plugin" });

use std::cell::Cell;

use exports::lsgd::policy::label_smoothing::Guest as LabelSmoothing;
use exports::lsgd::policy::plugin::Guest as Plugin;
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static EPSILON: Cell<f32> = const { Cell::new(0.1) };
}

impl Plugin for Component {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "{{name}}".into(),
            version: "0.1.0".into(),
            summary: "A constant label-smoothing epsilon".into(),
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
        Ok(())
    }
}

impl LabelSmoothing for Component {
    fn epsilon(_s: TrainState) -> f32 {
        EPSILON.get()
    }
}

export!(Component);
