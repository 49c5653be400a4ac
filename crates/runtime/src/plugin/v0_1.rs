//! Host bindings for `lsgd:policy@0.1.x` (frozen: `wit/v0.1.0/`). Bound through the `host-view`
//! world so that one set of generated types serves every policy kind; each interface is looked
//! up on its own, so a plugin only needs the exports of its own world. Its `types` interface is
//! mapped onto the latest version's generated types (see [`super::types`]), so the conversions
//! are shared.

use lsgd_policy::{Info, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::{Output, info, train_state, wit_params};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.1.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.1.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{batch_size, label_smoothing, plugin, schedule};

/// Export indices resolved once per component, before any instance exists.
pub struct Indices {
    plugin: plugin::GuestIndices,
    policy: PolicyIndices,
}

enum PolicyIndices {
    Schedule(schedule::GuestIndices),
    BatchSize(batch_size::GuestIndices),
    LabelSmoothing(label_smoothing::GuestIndices),
}

/// The typed functions of one live instance.
pub struct Bound {
    plugin: plugin::Guest,
    policy: PolicyFuncs,
}

enum PolicyFuncs {
    Schedule(schedule::Guest),
    BatchSize(batch_size::Guest),
    LabelSmoothing(label_smoothing::Guest),
}

impl Indices {
    /// Resolves the `plugin` interface and the policy interface of `kind`.
    pub fn new(pre: &InstancePre<Sandbox>, kind: PolicyKind) -> Result<Self> {
        let policy = match kind {
            PolicyKind::Schedule => PolicyIndices::Schedule(schedule::GuestIndices::new(pre)?),
            PolicyKind::BatchSize => PolicyIndices::BatchSize(batch_size::GuestIndices::new(pre)?),
            PolicyKind::LabelSmoothing => {
                PolicyIndices::LabelSmoothing(label_smoothing::GuestIndices::new(pre)?)
            }
            PolicyKind::Codec => wasmtime::bail!("contract 0.1 has no codec interface"),
        };
        Ok(Indices {
            plugin: plugin::GuestIndices::new(pre)?,
            policy,
        })
    }

    /// Type-checks and binds the functions of a fresh instance.
    pub fn bind(&self, mut store: impl AsContextMut, instance: &Instance) -> Result<Bound> {
        let policy = match &self.policy {
            PolicyIndices::Schedule(i) => PolicyFuncs::Schedule(i.load(&mut store, instance)?),
            PolicyIndices::BatchSize(i) => PolicyFuncs::BatchSize(i.load(&mut store, instance)?),
            PolicyIndices::LabelSmoothing(i) => {
                PolicyFuncs::LabelSmoothing(i.load(&mut store, instance)?)
            }
        };
        Ok(Bound {
            plugin: self.plugin.load(&mut store, instance)?,
            policy,
        })
    }
}

impl Bound {
    /// Calls `describe`.
    pub fn describe(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Info> {
        Ok(info(self.plugin.call_describe(store)?))
    }

    /// Calls `configure`; the inner error is the plugin's own message.
    pub fn configure(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        params: &[(String, Value)],
    ) -> Result<std::result::Result<(), String>> {
        self.plugin.call_configure(store, &wit_params(params))
    }

    /// Calls the policy function of this plugin's kind.
    pub fn call(&self, store: impl AsContextMut<Data = Sandbox>, state: &State) -> Result<Output> {
        let s = train_state(state);
        Ok(match &self.policy {
            PolicyFuncs::Schedule(f) => Output::LearningRate(f.call_learning_rate(store, s)?),
            PolicyFuncs::BatchSize(f) => Output::GlobalBatch(f.call_global_batch(store, s)?),
            PolicyFuncs::LabelSmoothing(f) => Output::Epsilon(f.call_epsilon(store, s)?),
        })
    }
}
