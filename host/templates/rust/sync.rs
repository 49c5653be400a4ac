//! {{name}}: a synchronisation policy for lsgd-host. Edit `describe`, `configure`, `plan` and
//! `outer_step`; the host calls describe once, configure once, then plan before every step,
//! and outer_step after each step that plan made `Average`, with the drift of every parameter
//! tensor over the window.
//!
//! This one is local SGD (Lin et al. 2018; Federated Averaging with every client): each rank
//! takes `period` steps on its own shard, the last of which ends the window (`Average`), and
//! the outer step is plain averaging, which makes the agreed weights the ranks' mean.
{{#stateful}}
//!
//! It keeps state between calls: the best metric seen so far, which doubles the period once it reaches 0.5, and which the host saves with `snapshot` and brings back with `restore`.
{{/stateful}}

wit_bindgen::generate!({ path: "wit", world: "{{world}}" });

use std::cell::Cell;

use exports::lsgd::policy::plugin::Guest as Plugin;
{{#stateful}}
use exports::lsgd::policy::state::Guest as State;
{{/stateful}}
use exports::lsgd::policy::sync::{
    Guest as SyncPolicy, OuterUpdate, StepKind, TensorDrift, Window,
};
use lsgd::policy::types::{Param, ParamSpec, ParamType, ParamValue, PluginInfo, TrainState};

struct Component;

thread_local! {
    // Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
    static PERIOD: Cell<u32> = const { Cell::new(8) };
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
            summary: "Local SGD: average the ranks' weights every period steps".into(),
{{/stateful}}
{{#stateful}}
            summary: "Local SGD: average every period steps, twice as long once the best metric reaches 0.5"
                .into(),
{{/stateful}}
            params: vec![ParamSpec {
                name: "period".into(),
                type_: ParamType::Integer,
                default: Some(ParamValue::Integer(8)),
                doc: "steps per window; the ranks average at a window's last step (>= 1)".into(),
            }],
        }
    }

    fn configure(params: Vec<Param>) -> Result<(), String> {
        let mut period = 8;
        for p in params {
            match (p.name.as_str(), p.value) {
                ("period", ParamValue::Integer(v)) => period = v,
                (name, _) => return Err(format!("unknown parameter '{name}'")),
            }
        }
        match u32::try_from(period) {
            Ok(p) if p >= 1 => {
                PERIOD.set(p);
{{#stateful}}
                BEST.set(0.0); // new parameters, a new state
{{/stateful}}
                Ok(())
            }
            _ => Err(format!("period must be in [1, {}], got {period}", u32::MAX)),
        }
    }
}

impl SyncPolicy for Component {
    /// How step `s.step` moves: `Local` (each rank on its own), `Average` (a local step that
    /// ends the window) or `Synchronous` (the gradients summed over the ranks, as without a
    /// sync policy; only at a window's start, `w.local_steps == 0`). Every rank must decide
    /// alike: only `s`, `w` and the plugin's state may count.
{{^stateful}}
    fn plan(_s: TrainState, w: Window) -> StepKind {
        // `w.local_steps` local steps are behind this one in the window.
        if w.local_steps >= PERIOD.get() - 1 {
{{/stateful}}
{{#stateful}}
    fn plan(s: TrainState, w: Window) -> StepKind {
        // Taking the larger value twice changes nothing: the host may call again at one step.
        if let Some(m) = s.last_metric
            && m > BEST.get()
        {
            BEST.set(m);
        }
        let doubled = if BEST.get() >= 0.5 { 2 } else { 1 };
        // `w.local_steps` local steps are behind this one in the window.
        if u64::from(w.local_steps) >= u64::from(PERIOD.get()) * doubled - 1 {
{{/stateful}}
            StepKind::Average
        } else {
            StepKind::Local
        }
    }

    /// The outer step on delta, the pseudo-gradient theta_global - theta_k averaged over the
    /// ranks: m = momentum x m + delta; d = delta + momentum x m with Nesterov, else m;
    /// theta_global -= lr x lr_scale[i] x d. Plain averaging is lr 1 and no momentum; DiLoCo's
    /// outer Nesterov step would be lr 0.7, momentum 0.9, nesterov true. `lr_scale` is empty
    /// (1 for every tensor) or one multiplier per tensor, in the order of `tensors`, whose
    /// norms (`weight_norm`, `delta_norm`, `rank_delta_norm` ...) describe the window's drift.
    fn outer_step(_s: TrainState, _w: Window, _tensors: Vec<TensorDrift>) -> OuterUpdate {
        OuterUpdate {
            lr: 1.0,
            momentum: 0.0,
            nesterov: false,
            lr_scale: Vec::new(),
        }
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
