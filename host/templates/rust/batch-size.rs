//! {{name}}: a batch-size controller for lsgd-host. Edit `describe`, `configure` and
//! `global_batch`; the host calls describe once, configure once, then global_batch every step.
{{#stateful}}
//!
//! It keeps state between calls: the best metric seen so far, which doubles the batch once it reaches 0.5, and which the host saves with `snapshot` and brings back with `restore`.
{{/stateful}}

wit_bindgen::generate!({ path: "wit", world: "{{world}}" });

use std::cell::Cell;

use exports::lsgd::policy::batch_size::Guest as BatchSize;
use exports::lsgd::policy::plugin::Guest as Plugin;
{{#stateful}}
use exports::lsgd::policy::state::Guest as State;
{{/stateful}}
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static FACTOR: Cell<u32> = const { Cell::new(1) };
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
            summary: "A constant global batch: the configured one x factor".into(),
{{/stateful}}
{{#stateful}}
            summary: "The configured global batch x factor, doubled once the best metric reaches 0.5".into(),
{{/stateful}}
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
{{#stateful}}
                BEST.set(0.0); // new parameters, a new state
{{/stateful}}
                Ok(())
            }
            _ => Err(format!("factor must be in [1, {}], got {factor}", u32::MAX)),
        }
    }
}

impl BatchSize for Component {
    fn global_batch(s: TrainState) -> u32 {
{{#stateful}}
        // Taking the larger value twice changes nothing: the host may call again at one step.
        if let Some(m) = s.last_metric
            && m > BEST.get()
        {
            BEST.set(m);
        }
{{/stateful}}
        // A multiple of the configured batch stays divisible by the world size.
{{^stateful}}
        s.global_batch.saturating_mul(FACTOR.get())
{{/stateful}}
{{#stateful}}
        let doubled = if BEST.get() >= 0.5 { 2 } else { 1 };
        s.global_batch.saturating_mul(FACTOR.get()).saturating_mul(doubled)
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
