//! Host bindings for `lsgd:policy@0.5.x` (`wit/v0.5.0/`): 0.4's interfaces unchanged plus
//! `sync`, the synchronisation policy (`plan` before each step, `outer-step` at a window's
//! end). Its `types` interface is the one [`super::types`] generates; the shared parts come
//! from the macros of [`super::binding`]. The `sync` calls and their conversions live here
//! alone until a later version repeats the interface, when they become a macro as
//! `layer_rate_calls!` did.

use lsgd_policy::{
    Info, OuterStep, Role, State, StepKind, TensorDrift, TensorNorms, Value, Window,
};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::binding::{codec_calls, layer_rate_calls, momentum_calls, version_bindings};
use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::{Output, train_state};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.5.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.5.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{
    batch_size, codec, label_smoothing, layer_rate, plugin, schedule, state, sync,
};

version_bindings! {
    kinds: [
        Schedule => schedule,
        BatchSize => batch_size,
        LabelSmoothing => label_smoothing,
        Codec => codec,
        LayerRate => layer_rate,
        Sync => sync,
    ],
    state: state,
}
codec_calls!(state);
layer_rate_calls!();
momentum_calls!();

impl Bound {
    /// The sync interface's functions, or an error for other kinds.
    fn sync(&self) -> Result<&sync::Guest> {
        match &self.kind {
            KindFuncs::Sync(f) => Ok(f),
            _ => wasmtime::bail!("not a sync plugin"),
        }
    }

    /// Calls a sync plugin's `plan` (unchecked: the caller knows which kinds the window allows).
    pub fn plan(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        window: &Window,
    ) -> Result<StepKind> {
        let kind = self
            .sync()?
            .call_plan(store, train_state(state), window_record(window))?;
        Ok(match kind {
            sync::StepKind::Synchronous => StepKind::Synchronous,
            sync::StepKind::Local => StepKind::Local,
            sync::StepKind::Average => StepKind::Average,
        })
    }

    /// Calls a sync plugin's `outer-step` (unchecked: the caller applies the contract's ranges
    /// and names the tensor a violation concerns).
    pub fn outer_step(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        window: &Window,
        tensors: &[TensorDrift],
    ) -> Result<OuterStep> {
        let records: Vec<sync::TensorDrift> = tensors.iter().map(tensor_drift).collect();
        let o = self.sync()?.call_outer_step(
            store,
            train_state(state),
            window_record(window),
            &records,
        )?;
        Ok(OuterStep {
            lr: o.lr,
            momentum: o.momentum,
            nesterov: o.nesterov,
            lr_scale: o.lr_scale,
        })
    }
}

fn window_record(w: &Window) -> sync::Window {
    sync::Window {
        local_steps: w.local_steps,
        windows: w.windows,
    }
}

fn tensor_drift(t: &TensorDrift) -> sync::TensorDrift {
    sync::TensorDrift {
        name: t.name.clone(),
        shape: t.shape.clone(),
        role: match t.role {
            Role::Weight => sync::Role::Weight,
            Role::Bias => sync::Role::Bias,
            Role::BatchNorm => sync::Role::Batchnorm,
        },
        weight_norm: t.weight_norm,
        delta_norm: t.delta_norm,
        rank_delta_norm: t.rank_delta_norm,
        momentum_norm: t.momentum_norm,
        delta_dot_momentum: t.delta_dot_momentum,
    }
}
