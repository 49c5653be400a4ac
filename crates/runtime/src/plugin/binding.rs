//! The bindings of every supported contract version behind one type: [`Plugin`] holds a
//! [`Indices`] and a [`Bound`] and never needs to know which version it is talking to.
//!
//! [`Plugin`]: super::Plugin

use lsgd_codec::{Meta, Properties};
use lsgd_policy::{Info, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::contract::{Binding, PolicyKind};
use super::sandbox::Sandbox;
use super::types::Output;
use super::{v0_1, v0_2};

/// Export indices of one component, in the bindings of its version.
pub enum Indices {
    /// `lsgd:policy@0.1.x`.
    V0_1(v0_1::Indices),
    /// `lsgd:policy@0.2.x`.
    V0_2(v0_2::Indices),
}

/// The typed functions of one live instance, in the bindings of its version.
pub enum Bound {
    /// `lsgd:policy@0.1.x`.
    V0_1(v0_1::Bound),
    /// `lsgd:policy@0.2.x`.
    V0_2(v0_2::Bound),
}

impl Indices {
    /// Resolves the exports of a `kind` plugin built against `binding`'s version.
    pub fn new(pre: &InstancePre<Sandbox>, binding: Binding, kind: PolicyKind) -> Result<Self> {
        Ok(match binding {
            Binding::V0_1 => Indices::V0_1(v0_1::Indices::new(pre, kind)?),
            Binding::V0_2 => Indices::V0_2(v0_2::Indices::new(pre, kind)?),
        })
    }

    /// Type-checks and binds the functions of a fresh instance.
    pub fn bind(&self, store: impl AsContextMut, instance: &Instance) -> Result<Bound> {
        Ok(match self {
            Indices::V0_1(i) => Bound::V0_1(i.bind(store, instance)?),
            Indices::V0_2(i) => Bound::V0_2(i.bind(store, instance)?),
        })
    }
}

impl Bound {
    /// Calls `describe`.
    pub fn describe(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Info> {
        match self {
            Bound::V0_1(b) => b.describe(store),
            Bound::V0_2(b) => b.describe(store),
        }
    }

    /// Calls `configure`; the inner error is the plugin's own message.
    pub fn configure(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        params: &[(String, Value)],
    ) -> Result<std::result::Result<(), String>> {
        match self {
            Bound::V0_1(b) => b.configure(store, params),
            Bound::V0_2(b) => b.configure(store, params),
        }
    }

    /// Calls the per-step function of a schedule, batch-size or label-smoothing plugin.
    pub fn call(&self, store: impl AsContextMut<Data = Sandbox>, state: &State) -> Result<Output> {
        match self {
            Bound::V0_1(b) => b.call(store, state),
            Bound::V0_2(b) => b.call(store, state),
        }
    }

    fn codec(&self) -> Result<&v0_2::Bound> {
        match self {
            Bound::V0_2(b) => Ok(b),
            Bound::V0_1(_) => wasmtime::bail!("contract 0.1 has no codec interface"),
        }
    }

    /// Calls a codec's `properties`.
    pub fn properties(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Properties> {
        self.codec()?.properties(store)
    }

    /// Calls a codec's `encode`.
    pub fn encode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        self.codec()?.encode(store, meta, data, agreed)
    }

    /// Calls a codec's `decode`.
    pub fn decode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        payloads: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<f32>, String>> {
        self.codec()?.decode(store, meta, payloads)
    }
}
