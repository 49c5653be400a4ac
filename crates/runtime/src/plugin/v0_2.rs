//! Host bindings for `lsgd:policy@0.2.x` (`wit/v0.2.0/`): 0.1's interfaces unchanged plus
//! `codec`. Its `types` interface maps onto the shared generated types of [`super::types`],
//! where their conversions live; what is new here is the codec's calls and the conversion
//! between its WIT records and `lsgd_codec`'s types.

use lsgd_codec::{Combine, Element, Meta, Properties};
use lsgd_policy::{Info, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::{Output, info, train_state, wit_params};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.2.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.2.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{batch_size, codec, label_smoothing, plugin, schedule};

/// Export indices resolved once per component, before any instance exists.
pub struct Indices {
    plugin: plugin::GuestIndices,
    kind: KindIndices,
}

enum KindIndices {
    Schedule(schedule::GuestIndices),
    BatchSize(batch_size::GuestIndices),
    LabelSmoothing(label_smoothing::GuestIndices),
    Codec(codec::GuestIndices),
}

/// The typed functions of one live instance.
pub struct Bound {
    plugin: plugin::Guest,
    kind: KindFuncs,
}

enum KindFuncs {
    Schedule(schedule::Guest),
    BatchSize(batch_size::Guest),
    LabelSmoothing(label_smoothing::Guest),
    Codec(codec::Guest),
}

impl Indices {
    /// Resolves the `plugin` interface and the interface of `kind`.
    pub fn new(pre: &InstancePre<Sandbox>, kind: PolicyKind) -> Result<Self> {
        let kind = match kind {
            PolicyKind::Schedule => KindIndices::Schedule(schedule::GuestIndices::new(pre)?),
            PolicyKind::BatchSize => KindIndices::BatchSize(batch_size::GuestIndices::new(pre)?),
            PolicyKind::LabelSmoothing => {
                KindIndices::LabelSmoothing(label_smoothing::GuestIndices::new(pre)?)
            }
            PolicyKind::Codec => KindIndices::Codec(codec::GuestIndices::new(pre)?),
        };
        Ok(Indices {
            plugin: plugin::GuestIndices::new(pre)?,
            kind,
        })
    }

    /// Type-checks and binds the functions of a fresh instance.
    pub fn bind(&self, mut store: impl AsContextMut, instance: &Instance) -> Result<Bound> {
        let kind = match &self.kind {
            KindIndices::Schedule(i) => KindFuncs::Schedule(i.load(&mut store, instance)?),
            KindIndices::BatchSize(i) => KindFuncs::BatchSize(i.load(&mut store, instance)?),
            KindIndices::LabelSmoothing(i) => {
                KindFuncs::LabelSmoothing(i.load(&mut store, instance)?)
            }
            KindIndices::Codec(i) => KindFuncs::Codec(i.load(&mut store, instance)?),
        };
        Ok(Bound {
            plugin: self.plugin.load(&mut store, instance)?,
            kind,
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

    /// Calls the per-step function of a schedule, batch-size or label-smoothing plugin.
    pub fn call(&self, store: impl AsContextMut<Data = Sandbox>, state: &State) -> Result<Output> {
        let s = train_state(state);
        Ok(match &self.kind {
            KindFuncs::Schedule(f) => Output::LearningRate(f.call_learning_rate(store, s)?),
            KindFuncs::BatchSize(f) => Output::GlobalBatch(f.call_global_batch(store, s)?),
            KindFuncs::LabelSmoothing(f) => Output::Epsilon(f.call_epsilon(store, s)?),
            KindFuncs::Codec(_) => wasmtime::bail!("a codec has no per-step policy function"),
        })
    }

    /// The codec's functions, or an error for other kinds.
    fn codec(&self) -> Result<&codec::Guest> {
        match &self.kind {
            KindFuncs::Codec(c) => Ok(c),
            _ => wasmtime::bail!("not a codec plugin"),
        }
    }

    /// Calls `properties`.
    pub fn properties(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Properties> {
        let p = self.codec()?.call_properties(store)?;
        let element = |e: codec::Element| match e {
            codec::Element::F32 => Element::F32,
            codec::Element::F16 => Element::F16,
            codec::Element::Bf16 => Element::Bf16,
        };
        Ok(Properties {
            combine: match p.combine {
                codec::Combine::Gather => Combine::Gather,
                codec::Combine::Sum(e) => Combine::Sum(element(e)),
            },
            rounds: p.rounds,
        })
    }

    /// Calls `encode`; the inner error is the codec's own message.
    pub fn encode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        self.codec()?
            .call_encode(store, &bucket_meta(meta), data, agreed)
    }

    /// Calls `decode`; the inner error is the codec's own message.
    pub fn decode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        payloads: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<f32>, String>> {
        self.codec()?
            .call_decode(store, &bucket_meta(meta), payloads)
    }
}

fn bucket_meta(m: &Meta) -> codec::BucketMeta {
    codec::BucketMeta {
        bucket: m.bucket,
        step: m.step,
        round: m.round,
        len: m.len,
        tensors: m
            .tensors
            .iter()
            .map(|t| codec::TensorSlice {
                name: t.name.clone(),
                shape: t.shape.clone(),
                tensor_offset: t.tensor_offset,
                bucket_offset: t.bucket_offset,
                len: t.len,
            })
            .collect(),
        shared_seed: m.shared_seed,
        rank_seed: m.rank_seed,
    }
}
