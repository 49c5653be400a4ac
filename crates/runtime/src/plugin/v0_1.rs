//! Host bindings for `lsgd:policy@0.1.x` (frozen: `wit/v0.1.0/`). Bound through the `host-view`
//! world so that one set of generated types serves every policy kind; each interface is looked
//! up on its own, so a plugin only needs the exports of its own world.

use lsgd_policy::{Info, ParamSpec, ParamType, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::contract::PolicyKind;
use super::sandbox::Sandbox;

pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "host-view",
    });
}

use bindings::exports::lsgd::policy::{batch_size, label_smoothing, plugin, schedule};
/// The generated `types` interface; 0.2 reuses it (the interface is unchanged), so the
/// conversions below serve both versions.
pub use bindings::lsgd::policy::types as wit;

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

/// A policy output before the host's range checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Output {
    /// From `learning-rate`.
    LearningRate(f64),
    /// From `global-batch`.
    GlobalBatch(u32),
    /// From `epsilon`.
    Epsilon(f32),
}

impl Output {
    /// The value widened to f64 (exact for every variant), for comparisons and traces.
    pub fn as_f64(self) -> f64 {
        match self {
            Output::LearningRate(v) => v,
            Output::GlobalBatch(v) => f64::from(v),
            Output::Epsilon(v) => f64::from(v),
        }
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

/// `describe()`'s record as the host's type.
pub(super) fn info(info: wit::PluginInfo) -> Info {
    Info {
        name: info.name,
        version: info.version,
        summary: info.summary,
        params: info.params.into_iter().map(param_spec).collect(),
    }
}

/// Resolved parameters as `configure()`'s argument.
pub(super) fn wit_params(params: &[(String, Value)]) -> Vec<wit::Param> {
    params
        .iter()
        .map(|(name, value)| wit::Param {
            name: name.clone(),
            value: param_value(value),
        })
        .collect()
}

pub(super) fn train_state(s: &State) -> wit::TrainState {
    lsgd_policy::copy_train_state!(s => wit::TrainState)
}

fn param_spec(p: wit::ParamSpec) -> ParamSpec {
    ParamSpec {
        name: p.name,
        ty: match p.type_ {
            wit::ParamType::Boolean => ParamType::Boolean,
            wit::ParamType::Integer => ParamType::Integer,
            wit::ParamType::Float => ParamType::Float,
            wit::ParamType::Text => ParamType::Text,
            wit::ParamType::FloatList => ParamType::FloatList,
            wit::ParamType::Choice(c) => ParamType::Choice(c),
        },
        default: p.default.map(|v| match v {
            wit::ParamValue::Boolean(b) => Value::Boolean(b),
            wit::ParamValue::Integer(i) => Value::Integer(i),
            wit::ParamValue::Float(f) => Value::Float(f),
            wit::ParamValue::Text(t) => Value::Text(t),
            wit::ParamValue::FloatList(l) => Value::FloatList(l),
        }),
        doc: p.doc,
    }
}

fn param_value(v: &Value) -> wit::ParamValue {
    match v {
        Value::Boolean(b) => wit::ParamValue::Boolean(*b),
        Value::Integer(i) => wit::ParamValue::Integer(*i),
        Value::Float(f) => wit::ParamValue::Float(*f),
        Value::Text(t) => wit::ParamValue::Text(t.clone()),
        Value::FloatList(l) => wit::ParamValue::FloatList(l.clone()),
    }
}
