//! The bindings of every supported contract version behind one type: [`Plugin`] holds a
//! [`Indices`] and a [`Bound`] and never needs to know which version it is talking to.
//!
//! The version modules share their code through macros expanded inside them (where the
//! generated interface modules of that version are in scope): [`version_bindings!`] for
//! what every version has, [`codec_calls!`] for the codec interface of 0.2 and later,
//! [`layer_rate_calls!`] for 0.3 and later, [`momentum_calls!`] for the schedule's momentum of
//! 0.4 and later. A call that only the latest version has (0.5's `sync`) lives in that
//! version's module until a later version repeats it.
//!
//! [`Plugin`]: super::Plugin

use lsgd_codec::{Meta, Properties};
use lsgd_policy::{Info, OuterStep, State, StepKind, TensorDrift, TensorNorms, Value, Window};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::contract::{Binding, PolicyKind};
use super::sandbox::Sandbox;
use super::types::Output;
use super::{v0_1, v0_2, v0_3, v0_4, v0_5};

/// Everything a version's bindings share, expanded in the version's module (where its
/// generated interface modules are in scope): `Indices` and `Bound` over the `plugin`
/// interface, the kinds listed as `Variant => generated_module` and, when given, the `state`
/// interface of stateful plugins; `describe`, `configure`, the per-step `call` and, with
/// `state`, `snapshot` and `restore`.
macro_rules! version_bindings {
    (kinds: [$($kind:ident => $iface:ident),+ $(,)?] $(, state: $state:ident)? $(,)?) => {
        /// Export indices resolved once per component, before any instance exists.
        pub struct Indices {
            plugin: plugin::GuestIndices,
            kind: KindIndices,
            $(state: Option<$state::GuestIndices>,)?
        }

        /// The typed functions of one live instance.
        pub struct Bound {
            plugin: plugin::Guest,
            kind: KindFuncs,
            $(state: Option<$state::Guest>,)?
        }

        enum KindIndices {
            $($kind($iface::GuestIndices),)+
        }

        enum KindFuncs {
            $($kind($iface::Guest),)+
        }

        impl Indices {
            /// Resolves the `plugin` interface, the interface of `kind` and, for a `stateful`
            /// plugin, `state`.
            pub fn new(pre: &InstancePre<Sandbox>, kind: PolicyKind, stateful: bool) -> Result<Self> {
                let kind = match kind {
                    $(PolicyKind::$kind => KindIndices::$kind($iface::GuestIndices::new(pre)?),)+
                    #[allow(unreachable_patterns)]
                    other => wasmtime::bail!("this contract version has no {other} interface"),
                };
                $(let state = match stateful {
                    true => Some($state::GuestIndices::new(pre)?),
                    false => None,
                };)?
                let has_state = version_bindings!(@has_state $($state)?);
                if stateful && !has_state {
                    wasmtime::bail!("this contract version has no state interface");
                }
                Ok(Indices {
                    plugin: plugin::GuestIndices::new(pre)?,
                    kind,
                    $($state: state,)?
                })
            }

            /// Type-checks and binds the functions of a fresh instance.
            pub fn bind(&self, mut store: impl AsContextMut, instance: &Instance) -> Result<Bound> {
                let kind = match &self.kind {
                    $(KindIndices::$kind(i) => KindFuncs::$kind(i.load(&mut store, instance)?),)+
                };
                Ok(Bound {
                    plugin: self.plugin.load(&mut store, instance)?,
                    kind,
                    $($state: self.$state.as_ref().map(|i| i.load(&mut store, instance)).transpose()?,)?
                })
            }
        }

        impl Bound {
            /// Calls `describe`.
            pub fn describe(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Info> {
                Ok(super::types::info(self.plugin.call_describe(store)?))
            }

            /// Calls `configure`; the inner error is the plugin's own message.
            pub fn configure(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                params: &[(String, Value)],
            ) -> Result<std::result::Result<(), String>> {
                self.plugin.call_configure(store, &super::types::wit_params(params))
            }

            /// Calls the per-step function of a schedule, batch-size or label-smoothing plugin.
            pub fn call(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                state: &State,
            ) -> Result<Output> {
                let s = super::types::train_state(state);
                Ok(match &self.kind {
                    KindFuncs::Schedule(f) => Output::LearningRate(f.call_learning_rate(store, s)?),
                    KindFuncs::BatchSize(f) => Output::GlobalBatch(f.call_global_batch(store, s)?),
                    KindFuncs::LabelSmoothing(f) => Output::Epsilon(f.call_epsilon(store, s)?),
                    #[allow(unreachable_patterns)]
                    _ => wasmtime::bail!("this plugin kind has no per-step value"),
                })
            }

            $(
            fn $state(&self) -> Result<&$state::Guest> {
                match &self.$state {
                    Some(s) => Ok(s),
                    None => wasmtime::bail!("not a stateful plugin"),
                }
            }

            /// Calls `snapshot`.
            pub fn snapshot(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Vec<u8>> {
                self.$state()?.call_snapshot(store)
            }

            /// Calls `restore`; the inner error is the plugin's own message.
            pub fn restore(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                snapshot: &[u8],
            ) -> Result<std::result::Result<(), String>> {
                self.$state()?.call_restore(store, snapshot)
            }
            )?
        }
    };
    (@has_state $state:ident) => { true };
    (@has_state) => { false };
}

/// `properties`, `encode` and `decode` on a version's `Bound`, through its generated `codec`
/// module, and the conversion of `lsgd_codec::Meta` to its `bucket-meta`; with `state` (0.4
/// and later) also the codec state: `bucket-meta.state`, `codec-properties.stateful` and
/// `next-state`.
macro_rules! codec_calls {
    () => {
        codec_calls!(@calls m p, [], [false]);
    };
    (state) => {
        codec_calls!(@calls m p, [state: m.state.clone(),], [p.stateful]);

        impl Bound {
            /// Calls `next-state`; the inner error is the codec's own message.
            pub fn next_state(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                meta: &lsgd_codec::Meta,
                agreed: &[Vec<u8>],
            ) -> Result<std::result::Result<Vec<u8>, String>> {
                self.codec()?
                    .call_next_state(store, &bucket_meta(meta), agreed)
            }
        }
    };
    // `$m` and `$p` name the meta and the properties in the tokens the arms above pass in.
    (@calls $m:ident $p:ident, [$($meta_state:tt)*], [$($stateful:tt)*]) => {
        impl Bound {
            /// The codec's functions, or an error for other kinds.
            fn codec(&self) -> Result<&codec::Guest> {
                match &self.kind {
                    KindFuncs::Codec(c) => Ok(c),
                    #[allow(unreachable_patterns)]
                    _ => wasmtime::bail!("not a codec plugin"),
                }
            }

            /// Calls `properties`.
            pub fn properties(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
            ) -> Result<lsgd_codec::Properties> {
                use lsgd_codec::{Combine, Element};
                let $p = self.codec()?.call_properties(store)?;
                let element = |e: codec::Element| match e {
                    codec::Element::F32 => Element::F32,
                    codec::Element::F16 => Element::F16,
                    codec::Element::Bf16 => Element::Bf16,
                };
                Ok(lsgd_codec::Properties {
                    combine: match $p.combine {
                        codec::Combine::Gather => Combine::Gather,
                        codec::Combine::Sum(e) => Combine::Sum(element(e)),
                    },
                    rounds: $p.rounds,
                    stateful: $($stateful)*,
                })
            }

            /// Calls `encode`; the inner error is the codec's own message.
            pub fn encode(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                meta: &lsgd_codec::Meta,
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
                meta: &lsgd_codec::Meta,
                payloads: &[Vec<u8>],
            ) -> Result<std::result::Result<Vec<f32>, String>> {
                self.codec()?
                    .call_decode(store, &bucket_meta(meta), payloads)
            }
        }

        fn bucket_meta($m: &lsgd_codec::Meta) -> codec::BucketMeta {
            codec::BucketMeta {
                bucket: $m.bucket,
                step: $m.step,
                round: $m.round,
                len: $m.len,
                tensors: $m
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
                shared_seed: $m.shared_seed,
                rank_seed: $m.rank_seed,
                $($meta_state)*
            }
        }
    };
}

/// `multipliers` on a version's `Bound`, through its generated `layer_rate` module (0.3 and
/// later), and the conversion of the host's tensor norms to its records.
macro_rules! layer_rate_calls {
    () => {
        impl Bound {
            /// Calls a layer-rate plugin's `multipliers` (unchecked: the caller knows the
            /// contract's rules and reports a violation with the tensor it concerns).
            pub fn multipliers(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                state: &State,
                tensors: &[TensorNorms],
            ) -> Result<Vec<f64>> {
                let KindFuncs::LayerRate(f) = &self.kind else {
                    wasmtime::bail!("not a layer-rate plugin");
                };
                let records: Vec<layer_rate::TensorNorms> =
                    tensors.iter().map(tensor_norms).collect();
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
    };
}

/// `momentum` on a version's `Bound`, through its generated `schedule` module (0.4 and later).
macro_rules! momentum_calls {
    () => {
        impl Bound {
            /// Calls a schedule's `momentum` (unchecked: the caller applies the contract's
            /// range).
            pub fn momentum(
                &self,
                store: impl AsContextMut<Data = Sandbox>,
                state: &State,
            ) -> Result<Option<f64>> {
                let KindFuncs::Schedule(f) = &self.kind else {
                    wasmtime::bail!("not a schedule plugin");
                };
                f.call_momentum(store, train_state(state))
            }
        }
    };
}

pub(super) use {codec_calls, layer_rate_calls, momentum_calls, version_bindings};

/// Export indices of one component, in the bindings of its version.
pub enum Indices {
    /// `lsgd:policy@0.1.x`.
    V0_1(v0_1::Indices),
    /// `lsgd:policy@0.2.x`.
    V0_2(v0_2::Indices),
    /// `lsgd:policy@0.3.x`.
    V0_3(v0_3::Indices),
    /// `lsgd:policy@0.4.x`.
    V0_4(v0_4::Indices),
    /// `lsgd:policy@0.5.x`.
    V0_5(v0_5::Indices),
}

/// The typed functions of one live instance, in the bindings of its version.
pub enum Bound {
    /// `lsgd:policy@0.1.x`.
    V0_1(v0_1::Bound),
    /// `lsgd:policy@0.2.x`.
    V0_2(v0_2::Bound),
    /// `lsgd:policy@0.3.x`.
    V0_3(v0_3::Bound),
    /// `lsgd:policy@0.4.x`.
    V0_4(v0_4::Bound),
    /// `lsgd:policy@0.5.x`.
    V0_5(v0_5::Bound),
}

/// Runs the same expression on the bound functions of whichever version `$bound` holds.
macro_rules! each_version {
    ($bound:expr, $b:ident => $e:expr) => {
        match $bound {
            Bound::V0_1($b) => $e,
            Bound::V0_2($b) => $e,
            Bound::V0_3($b) => $e,
            Bound::V0_4($b) => $e,
            Bound::V0_5($b) => $e,
        }
    };
}

/// Like [`each_version!`] over the versions with a codec interface (0.2 and later).
macro_rules! codec_versions {
    ($bound:expr, $b:ident => $e:expr) => {
        match $bound {
            Bound::V0_1(_) => wasmtime::bail!("contract 0.1 has no codec interface"),
            Bound::V0_2($b) => $e,
            Bound::V0_3($b) => $e,
            Bound::V0_4($b) => $e,
            Bound::V0_5($b) => $e,
        }
    };
}

/// Like [`each_version!`] over the versions with the `layer-rate` and `state` interfaces (0.3
/// and later); `$what` names the interface in the error for older ones.
macro_rules! since_0_3 {
    ($bound:expr, $what:expr, $b:ident => $e:expr) => {
        match $bound {
            Bound::V0_3($b) => $e,
            Bound::V0_4($b) => $e,
            Bound::V0_5($b) => $e,
            Bound::V0_1(_) | Bound::V0_2(_) => {
                wasmtime::bail!("contracts before 0.3 have no {} interface", $what)
            }
        }
    };
}

impl Indices {
    /// Resolves the exports of a `kind` plugin built against `binding`'s version; `stateful`
    /// adds the `state` interface (0.3 and later).
    pub fn new(
        pre: &InstancePre<Sandbox>,
        binding: Binding,
        kind: PolicyKind,
        stateful: bool,
    ) -> Result<Self> {
        Ok(match binding {
            Binding::V0_1 => Indices::V0_1(v0_1::Indices::new(pre, kind, stateful)?),
            Binding::V0_2 => Indices::V0_2(v0_2::Indices::new(pre, kind, stateful)?),
            Binding::V0_3 => Indices::V0_3(v0_3::Indices::new(pre, kind, stateful)?),
            Binding::V0_4 => Indices::V0_4(v0_4::Indices::new(pre, kind, stateful)?),
            Binding::V0_5 => Indices::V0_5(v0_5::Indices::new(pre, kind, stateful)?),
        })
    }

    /// Type-checks and binds the functions of a fresh instance.
    pub fn bind(&self, store: impl AsContextMut, instance: &Instance) -> Result<Bound> {
        Ok(match self {
            Indices::V0_1(i) => Bound::V0_1(i.bind(store, instance)?),
            Indices::V0_2(i) => Bound::V0_2(i.bind(store, instance)?),
            Indices::V0_3(i) => Bound::V0_3(i.bind(store, instance)?),
            Indices::V0_4(i) => Bound::V0_4(i.bind(store, instance)?),
            Indices::V0_5(i) => Bound::V0_5(i.bind(store, instance)?),
        })
    }
}

impl Bound {
    /// Calls `describe`.
    pub fn describe(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Info> {
        each_version!(self, b => b.describe(store))
    }

    /// Calls `configure`; the inner error is the plugin's own message.
    pub fn configure(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        params: &[(String, Value)],
    ) -> Result<std::result::Result<(), String>> {
        each_version!(self, b => b.configure(store, params))
    }

    /// Calls the per-step function of a schedule, batch-size or label-smoothing plugin.
    pub fn call(&self, store: impl AsContextMut<Data = Sandbox>, state: &State) -> Result<Output> {
        each_version!(self, b => b.call(store, state))
    }

    /// Calls a schedule's `momentum` (0.4 and later); older schedules have none to give.
    pub fn momentum(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
    ) -> Result<Option<f64>> {
        match self {
            Bound::V0_4(b) => b.momentum(store, state),
            Bound::V0_5(b) => b.momentum(store, state),
            _ => Ok(None),
        }
    }

    /// Calls a codec's `properties`.
    pub fn properties(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Properties> {
        codec_versions!(self, b => b.properties(store))
    }

    /// Calls a codec's `encode`.
    pub fn encode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        data: &[f32],
        agreed: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        codec_versions!(self, b => b.encode(store, meta, data, agreed))
    }

    /// Calls a codec's `decode`.
    pub fn decode(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        payloads: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<f32>, String>> {
        codec_versions!(self, b => b.decode(store, meta, payloads))
    }

    /// Calls a codec's `next-state` (0.4 and later; older codecs are never stateful).
    pub fn next_state(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        meta: &Meta,
        agreed: &[Vec<u8>],
    ) -> Result<std::result::Result<Vec<u8>, String>> {
        match self {
            Bound::V0_4(b) => b.next_state(store, meta, agreed),
            Bound::V0_5(b) => b.next_state(store, meta, agreed),
            _ => wasmtime::bail!("contracts before 0.4 have no codec state"),
        }
    }

    /// Calls a layer-rate plugin's `multipliers`.
    pub fn multipliers(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        tensors: &[TensorNorms],
    ) -> Result<Vec<f64>> {
        since_0_3!(self, "layer-rate", b => b.multipliers(store, state, tensors))
    }

    /// Calls a stateful plugin's `snapshot`.
    pub fn snapshot(&self, store: impl AsContextMut<Data = Sandbox>) -> Result<Vec<u8>> {
        since_0_3!(self, "state", b => b.snapshot(store))
    }

    /// Calls a stateful plugin's `restore`; the inner error is the plugin's own message.
    pub fn restore(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        snapshot: &[u8],
    ) -> Result<std::result::Result<(), String>> {
        since_0_3!(self, "state", b => b.restore(store, snapshot))
    }

    /// Calls a sync plugin's `plan` (0.5 and later).
    pub fn plan(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        window: &Window,
    ) -> Result<StepKind> {
        match self {
            Bound::V0_5(b) => b.plan(store, state, window),
            _ => wasmtime::bail!("contracts before 0.5 have no sync interface"),
        }
    }

    /// Calls a sync plugin's `outer-step` (0.5 and later).
    pub fn outer_step(
        &self,
        store: impl AsContextMut<Data = Sandbox>,
        state: &State,
        window: &Window,
        tensors: &[TensorDrift],
    ) -> Result<OuterStep> {
        match self {
            Bound::V0_5(b) => b.outer_step(store, state, window, tensors),
            _ => wasmtime::bail!("contracts before 0.5 have no sync interface"),
        }
    }
}
