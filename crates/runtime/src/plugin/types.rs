//! The plugin types that do not change between contract versions, and their conversions to
//! and from `lsgd_policy`'s plain Rust types, written once.
//!
//! This module generates the Rust types of the WIT `types` interface of the latest contract
//! version ([`wit`]); the bindings of every version (`v0_1` to `v0_5`) map their own `types`
//! interface onto them with bindgen's `with:` (the records are structurally identical, which
//! wasmtime checks when it binds a component), so every version's `describe`, `configure` and
//! policy calls go through the one set of conversions below, and imports run one way, from the
//! versions to here. Adding `v0_6` means pointing the bindgen below at `wit/v0.6.0` and mapping
//! each version's `types` onto it, as Zed's extension host
//! (`crates/extension_host/src/wasm_host/wit/`) maps each version onto the latest. An
//! interface that changes in a new version is converted in that version's module instead.

use lsgd_policy::{Info, ParamSpec, ParamType, State, Value};

mod bindings {
    // Only the `types` interface of the latest version, through a world that imports nothing
    // else.
    wasmtime::component::bindgen!({
        path: "../../wit/v0.5.0",
        inline: "package lsgd:host; world types { import lsgd:policy/types@0.5.0; }",
    });
}

/// The generated `types` interface of the latest contract version, shared by all versions.
pub use bindings::lsgd::policy::types as wit;

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

/// A train-state as the policy calls' argument.
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
