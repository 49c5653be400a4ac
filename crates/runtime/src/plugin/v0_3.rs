//! Host bindings for `lsgd:policy@0.3.x` (`wit/v0.3.0/`): 0.2's interfaces unchanged plus
//! `layer-rate` (one LR multiplier per parameter tensor) and the optional `state` interface of
//! stateful plugins. Its `types` interface is the one [`super::types`] generates; the shared
//! parts come from the macros of [`super::binding`].

use lsgd_policy::{Info, Role, State, TensorNorms, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::binding::{codec_calls, version_bindings};
use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::{Output, train_state};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.3.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.3.0": crate::plugin::types::wit },
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
codec_calls!();

impl Bound {
    /// Calls a layer-rate plugin's `multipliers` (unchecked: the caller knows the contract's
    /// rules and reports a violation with the tensor it concerns).
    pub fn multipliers(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        tensors: &[TensorNorms],
    ) -> Result<Vec<f64>> {
        let KindFuncs::LayerRate(f) = &self.kind else {
            wasmtime::bail!("not a layer-rate plugin");
        };
        let records: Vec<layer_rate::TensorNorms> = tensors.iter().map(tensor_norms).collect();
        f.call_multipliers(store, train_state(state), &records)
    }
}

fn tensor_norms(t: &TensorNorms) -> layer_rate::TensorNorms {
    layer_rate::TensorNorms {
        name: t.name.clone(),
        shape: t.shape.clone(),
        role: match t.role {
            Role::Weight => layer_rate::Role::Weight,
            Role::Bias => layer_rate::Role::Bias,
            Role::BatchNorm => layer_rate::Role::Batchnorm,
        },
        weight_norm: t.weight_norm,
        grad_norm: t.grad_norm,
        update_norm: t.update_norm,
        weight_decay: t.weight_decay,
    }
}
