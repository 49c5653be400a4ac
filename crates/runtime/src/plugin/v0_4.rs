//! Host bindings for `lsgd:policy@0.4.x` (`wit/v0.4.0/`): 0.3's interfaces unchanged but for
//! the schedule's second function, `momentum`, and the codec's state (`bucket-meta.state`,
//! `codec-properties.stateful`, `next-state`). Its `types` interface is the one
//! [`super::types`] generates; the shared parts come from the macros of [`super::binding`].

use lsgd_policy::{Info, Role, State, TensorNorms, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::binding::{codec_calls, layer_rate_calls, momentum_calls, version_bindings};
use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::{Output, train_state};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.4.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.4.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{
    batch_size, codec, label_smoothing, layer_rate, plugin, schedule, state,
};

version_bindings! {
    kinds: [
        Schedule => schedule,
        BatchSize => batch_size,
        LabelSmoothing => label_smoothing,
        Codec => codec,
        LayerRate => layer_rate,
    ],
    state: state,
}
codec_calls!(state);
layer_rate_calls!();
momentum_calls!();
