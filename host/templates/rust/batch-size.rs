//! {{name}}: a batch-size controller for lsgd-host. Edit `describe`, `configure` and
//! `global_batch`; the host calls describe once, configure once, then global_batch every step.

wit_bindgen::generate!({ path: "wit", world: "batch-size-plugin" });

use std::cell::Cell;

use exports::lsgd::policy::batch_size::Guest as BatchSize;
use exports::lsgd::policy::plugin::Guest as Plugin;
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static FACTOR: Cell<u32> = const { Cell::new(1) };
}

impl Plugin for Component {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "{{name}}".into(),
            version: "0.1.0".into(),
            summary: "A constant global batch: the configured one x factor".into(),
            params: vec![ParamSpec {
                name: "factor".into(),
                type_: ParamType::Integer,
                default: Some(ParamValue::Integer(1)),
                doc: "multiplier on the configured global batch (>= 1)".into(),
            }],
        }
    }

    fn configure(params: Vec<Param>) -> Result<(), String> {
        let mut factor = 1;
        for p in params {
            match (p.name.as_str(), p.value) {
                ("factor", ParamValue::Integer(v)) => factor = v,
                (name, _) => return Err(format!("unknown parameter '{name}'")),
            }
        }
        match u32::try_from(factor) {
            Ok(f) if f >= 1 => {
                FACTOR.set(f);
                Ok(())
            }
            _ => Err(format!("factor must be in [1, {}], got {factor}", u32::MAX)),
        }
    }
}

impl BatchSize for Component {
    fn global_batch(s: TrainState) -> u32 {
        // A multiple of the configured batch stays divisible by the world size.
        s.global_batch.saturating_mul(FACTOR.get())
    }
}

export!(Component);
