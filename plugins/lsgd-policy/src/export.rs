//! Macros that turn a [`Policy`](crate::Policy) into the exports of a WebAssembly component.
//!
//! They expand inside the guest crate, next to `wit_bindgen::generate!`, because the WIT types
//! they convert to and from only exist there. Paths like `exports::lsgd::policy::plugin` and
//! `lsgd::policy::types` therefore resolve at the call site, which must be the module (normally
//! the crate root) where `generate!` ran.

/// Exports a [`Schedule`](crate::Schedule) from a crate that generated the `schedule-plugin`
/// world. `export_schedule!(T)` fits 0.1 to 0.3, whose schedule has `learning-rate` only;
/// `export_schedule!(T, momentum)` fits 0.4, whose schedule also has `momentum`
/// ([`Schedule::momentum`](crate::Schedule::momentum)). A 0.4 world without `momentum` in the
/// macro, or an older one with it, fails to compile: the generated trait decides.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "schedule-plugin" });
/// lsgd_policy::export_schedule!(lsgd_policy::warmup::Warmup);
/// ```
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.4.0", world: "schedule-plugin" });
/// lsgd_policy::export_schedule!(lsgd_policy::one_cycle::OneCycle, momentum);
/// ```
#[macro_export]
macro_rules! export_schedule {
    ($policy:ty) => {
        $crate::__export_policy!($policy, schedule, Schedule, learning_rate -> f64);
    };
    ($policy:ty, momentum) => {
        $crate::__export_momentum_schedule!($policy);
    };
}

/// Exports a [`BatchSize`](crate::BatchSize) from a crate that generated the `batch-size-plugin` world.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "batch-size-plugin" });
/// lsgd_policy::export_batch_size!(lsgd_policy::batch_ramp::BatchRamp);
/// ```
#[macro_export]
macro_rules! export_batch_size {
    ($policy:ty) => {
        $crate::__export_policy!($policy, batch_size, BatchSize, global_batch -> u32);
    };
}

/// Exports a [`LabelSmoothing`](crate::LabelSmoothing) from a crate that generated the
/// `label-smoothing-plugin` world of 0.1 or 0.3 (0.2's world also demands a `codec` export,
/// which the crate must then implement itself for `__LsgdExport`).
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "label-smoothing-plugin" });
/// lsgd_policy::export_label_smoothing!(lsgd_policy::label_smoothing::Smoothing);
/// ```
#[macro_export]
macro_rules! export_label_smoothing {
    ($policy:ty) => {
        $crate::__export_policy!($policy, label_smoothing, LabelSmoothing, epsilon -> f32);
    };
}

/// Exports a [`LayerRate`](crate::LayerRate) from a crate that generated the
/// `layer-rate-plugin` world of `wit/v0.3.0` or later.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "layer-rate-plugin" });
/// lsgd_policy::export_layer_rate!(lsgd_policy::lars::Lars);
/// ```
#[macro_export]
macro_rules! export_layer_rate {
    ($policy:ty) => {
        $crate::__export_layer_rate!($policy);
    };
}

/// Exports a [`Schedule`](crate::Schedule) that is also [`Stateful`](crate::Stateful) from a
/// crate that generated the `stateful-schedule-plugin` world: every `learning-rate` call runs
/// `observe` first, and the `state` interface exposes `snapshot` and `restore`.
/// `export_stateful_schedule!(T)` fits 0.3; `export_stateful_schedule!(T, momentum)` fits 0.4
/// and adds `momentum`, which does not observe: the host asks it right after `learning-rate`
/// with the same state, so the step has already been observed.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "stateful-schedule-plugin" });
/// lsgd_policy::export_stateful_schedule!(lsgd_policy::plateau::Plateau);
/// ```
#[macro_export]
macro_rules! export_stateful_schedule {
    ($policy:ty) => {
        $crate::__export_policy!($policy, schedule, Schedule, learning_rate -> f64, Stateful);
    };
    ($policy:ty, momentum) => {
        $crate::__export_momentum_schedule!($policy, Stateful);
    };
}

/// Exports a [`Stateful`](crate::Stateful) [`BatchSize`](crate::BatchSize) from a crate that
/// generated the `stateful-batch-size-plugin` world of `wit/v0.3.0` or later.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "stateful-batch-size-plugin" });
/// lsgd_policy::export_stateful_batch_size!(MyController);
/// ```
#[macro_export]
macro_rules! export_stateful_batch_size {
    ($policy:ty) => {
        $crate::__export_policy!($policy, batch_size, BatchSize, global_batch -> u32, Stateful);
    };
}

/// Exports a [`Stateful`](crate::Stateful) [`LabelSmoothing`](crate::LabelSmoothing) from a
/// crate that generated the `stateful-label-smoothing-plugin` world of `wit/v0.3.0` or later.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "stateful-label-smoothing-plugin" });
/// lsgd_policy::export_stateful_label_smoothing!(MySmoothing);
/// ```
#[macro_export]
macro_rules! export_stateful_label_smoothing {
    ($policy:ty) => {
        $crate::__export_policy!($policy, label_smoothing, LabelSmoothing, epsilon -> f32, Stateful);
    };
}

/// Exports a [`Stateful`](crate::Stateful) [`LayerRate`](crate::LayerRate) from a crate that
/// generated the `stateful-layer-rate-plugin` world of `wit/v0.3.0` or later.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.3.0", world: "stateful-layer-rate-plugin" });
/// lsgd_policy::export_stateful_layer_rate!(MyLayerRate);
/// ```
#[macro_export]
macro_rules! export_stateful_layer_rate {
    ($policy:ty) => {
        $crate::__export_layer_rate!($policy, Stateful);
    };
}

/// Exports a [`SyncPolicy`](crate::SyncPolicy) from a crate that generated the `sync-plugin`
/// world of `wit/v0.5.0` or later: `plan` and `outer-step`, the latter on the policy mutably
/// (a stateless policy must still answer from its parameters and inputs alone).
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.5.0", world: "sync-plugin" });
/// lsgd_policy::export_sync!(lsgd_policy::local_sgd::LocalSgd);
/// ```
#[macro_export]
macro_rules! export_sync {
    ($policy:ty) => {
        $crate::__export_sync!($policy);
    };
}

/// Exports a [`Stateful`](crate::Stateful) [`SyncPolicy`](crate::SyncPolicy) from a crate that
/// generated the `stateful-sync-plugin` world of `wit/v0.5.0` or later: every `plan` call
/// runs `observe` first; `outer-step` does not observe (the host calls it after `plan` at the
/// same step) but may change the state from the window's drift, as
/// [`adaptive_period`](crate::adaptive_period) does; `state` exposes `snapshot` and `restore`.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.5.0", world: "stateful-sync-plugin" });
/// lsgd_policy::export_stateful_sync!(lsgd_policy::adaptive_period::AdaptivePeriod);
/// ```
#[macro_export]
macro_rules! export_stateful_sync {
    ($policy:ty) => {
        $crate::__export_sync!($policy, Stateful);
    };
}

/// The body shared by the per-step export macros: `$iface` is the generated export module,
/// `$kind` our trait and `$func` the method both of them name identically. With a trailing
/// `Stateful`, each call observes first and the `state` interface is exported too.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_policy {
    ($policy:ty, $iface:ident, $kind:ident, $func:ident -> $ret:ty $(, $stateful:ident)?) => {
        $crate::__export_plugin!($policy);

        #[inline(always)]
        fn __lsgd_state(s: lsgd::policy::types::TrainState) -> $crate::State {
            $crate::copy_train_state!(s => $crate::State)
        }

        impl exports::lsgd::policy::$iface::Guest for __LsgdExport {
            fn $func(state: lsgd::policy::types::TrainState) -> $ret {
                let s = __lsgd_state(state);
                __lsgd_with(|p| {
                    $(<$policy as $crate::$stateful>::observe(p, &s);)?
                    <$policy as $crate::$kind>::$func(p, &s)
                })
            }
        }

        $($crate::__export_state!($policy, $stateful);)?
        export!(__LsgdExport);
    };
}

/// The body of the 0.4 schedule export macros: `__export_policy` with both of the schedule's
/// functions; with a trailing `Stateful`, `learning_rate` observes first and `momentum` never.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_momentum_schedule {
    ($policy:ty $(, $stateful:ident)?) => {
        $crate::__export_plugin!($policy);

        impl exports::lsgd::policy::schedule::Guest for __LsgdExport {
            fn learning_rate(state: lsgd::policy::types::TrainState) -> f64 {
                let s = $crate::copy_train_state!(state => $crate::State);
                __lsgd_with(|p| {
                    $(<$policy as $crate::$stateful>::observe(p, &s);)?
                    <$policy as $crate::Schedule>::learning_rate(p, &s)
                })
            }

            fn momentum(
                state: lsgd::policy::types::TrainState,
            ) -> ::core::option::Option<f64> {
                let s = $crate::copy_train_state!(state => $crate::State);
                __lsgd_with(|p| <$policy as $crate::Schedule>::momentum(p, &s))
            }
        }

        $($crate::__export_state!($policy, $stateful);)?
        export!(__LsgdExport);
    };
}

/// The body of the layer-rate export macros: `__export_policy` plus the tensors to convert.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_layer_rate {
    ($policy:ty $(, $stateful:ident)?) => {
        $crate::__export_plugin!($policy);

        fn __lsgd_tensor(t: exports::lsgd::policy::layer_rate::TensorNorms) -> $crate::TensorNorms {
            use exports::lsgd::policy::layer_rate::Role as W;
            $crate::TensorNorms {
                name: t.name,
                shape: t.shape,
                role: match t.role {
                    W::Weight => $crate::Role::Weight,
                    W::Bias => $crate::Role::Bias,
                    W::Batchnorm => $crate::Role::BatchNorm,
                },
                weight_norm: t.weight_norm,
                grad_norm: t.grad_norm,
                update_norm: t.update_norm,
                weight_decay: t.weight_decay,
            }
        }

        impl exports::lsgd::policy::layer_rate::Guest for __LsgdExport {
            fn multipliers(
                state: lsgd::policy::types::TrainState,
                tensors: ::std::vec::Vec<exports::lsgd::policy::layer_rate::TensorNorms>,
            ) -> ::std::vec::Vec<f64> {
                let s = $crate::copy_train_state!(state => $crate::State);
                let tensors: ::std::vec::Vec<$crate::TensorNorms> =
                    tensors.into_iter().map(__lsgd_tensor).collect();
                __lsgd_with(|p| {
                    $(<$policy as $crate::$stateful>::observe(p, &s);)?
                    <$policy as $crate::LayerRate>::multipliers(p, &s, &tensors)
                })
            }
        }

        $($crate::__export_state!($policy, $stateful);)?
        export!(__LsgdExport);
    };
}

/// The body of the sync export macros: `__export_policy` with a window, tensors and a step
/// kind to convert; with a trailing `Stateful`, `plan` observes first and `outer_step` never.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_sync {
    ($policy:ty $(, $stateful:ident)?) => {
        $crate::__export_plugin!($policy);

        fn __lsgd_window(w: exports::lsgd::policy::sync::Window) -> $crate::Window {
            $crate::Window {
                local_steps: w.local_steps,
                windows: w.windows,
            }
        }

        fn __lsgd_drift(t: exports::lsgd::policy::sync::TensorDrift) -> $crate::TensorDrift {
            use exports::lsgd::policy::sync::Role as W;
            $crate::TensorDrift {
                name: t.name,
                shape: t.shape,
                role: match t.role {
                    W::Weight => $crate::Role::Weight,
                    W::Bias => $crate::Role::Bias,
                    W::Batchnorm => $crate::Role::BatchNorm,
                },
                weight_norm: t.weight_norm,
                delta_norm: t.delta_norm,
                rank_delta_norm: t.rank_delta_norm,
                momentum_norm: t.momentum_norm,
                delta_dot_momentum: t.delta_dot_momentum,
            }
        }

        impl exports::lsgd::policy::sync::Guest for __LsgdExport {
            fn plan(
                state: lsgd::policy::types::TrainState,
                window: exports::lsgd::policy::sync::Window,
            ) -> exports::lsgd::policy::sync::StepKind {
                use exports::lsgd::policy::sync::StepKind as W;
                let s = $crate::copy_train_state!(state => $crate::State);
                let w = __lsgd_window(window);
                let kind = __lsgd_with(|p| {
                    $(<$policy as $crate::$stateful>::observe(p, &s);)?
                    <$policy as $crate::SyncPolicy>::plan(p, &s, &w)
                });
                match kind {
                    $crate::StepKind::Synchronous => W::Synchronous,
                    $crate::StepKind::Local => W::Local,
                    $crate::StepKind::Average => W::Average,
                }
            }

            fn outer_step(
                state: lsgd::policy::types::TrainState,
                window: exports::lsgd::policy::sync::Window,
                tensors: ::std::vec::Vec<exports::lsgd::policy::sync::TensorDrift>,
            ) -> exports::lsgd::policy::sync::OuterUpdate {
                let s = $crate::copy_train_state!(state => $crate::State);
                let w = __lsgd_window(window);
                let tensors: ::std::vec::Vec<$crate::TensorDrift> =
                    tensors.into_iter().map(__lsgd_drift).collect();
                let o = __lsgd_with(|p| {
                    <$policy as $crate::SyncPolicy>::outer_step(p, &s, &w, &tensors)
                });
                exports::lsgd::policy::sync::OuterUpdate {
                    lr: o.lr,
                    momentum: o.momentum,
                    nesterov: o.nesterov,
                    lr_scale: o.lr_scale,
                }
            }
        }

        $($crate::__export_state!($policy, $stateful);)?
        export!(__LsgdExport);
    };
}

/// The `state` interface of a [`Stateful`](crate::Stateful) policy (`$stateful` is always
/// `Stateful`; it is passed in so the callers' optional repetition has something to repeat on).
#[doc(hidden)]
#[macro_export]
macro_rules! __export_state {
    ($policy:ty, $stateful:ident) => {
        impl exports::lsgd::policy::state::Guest for __LsgdExport {
            fn snapshot() -> ::std::vec::Vec<u8> {
                __lsgd_with(|p| <$policy as $crate::$stateful>::snapshot(p))
            }

            fn restore(
                snapshot: ::std::vec::Vec<u8>,
            ) -> ::core::result::Result<(), ::std::string::String> {
                __lsgd_with(|p| <$policy as $crate::$stateful>::restore(p, &snapshot))
            }
        }
    };
}

/// The `plugin` interface (describe, configure) of any [`Policy`](crate::Policy), and
/// `__lsgd_with`, which runs a closure on the configured value (mutably, for stateful
/// policies); every export macro (the codec one in `lsgd-codec` too) starts with this and adds
/// its own interface.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_plugin {
    ($policy:ty) => {
        struct __LsgdExport;

        // Wasm components are single-threaded, so this is a plain static there; the RefCell
        // costs one flag check per call and no allocation.
        ::std::thread_local! {
            static __LSGD_POLICY: ::core::cell::RefCell<::core::option::Option<$policy>> =
                const { ::core::cell::RefCell::new(::core::option::Option::None) };
        }

        /// Runs `f` on the configured policy, configuring it from its defaults if the host
        /// never called `configure` (e.g. on a fresh instance after a trap).
        fn __lsgd_with<R>(f: impl ::core::ops::FnOnce(&mut $policy) -> R) -> R {
            __LSGD_POLICY.with(|cell| {
                let mut slot = cell.borrow_mut();
                let policy = slot.get_or_insert_with(|| {
                    <$policy as $crate::Policy>::from_defaults().unwrap_or_else(|e| {
                        ::core::panic!("policy cannot run on its defaults: {e}")
                    })
                });
                f(policy)
            })
        }

        fn __lsgd_to_wit(v: $crate::Value) -> lsgd::policy::types::ParamValue {
            use lsgd::policy::types::ParamValue as W;
            match v {
                $crate::Value::Boolean(b) => W::Boolean(b),
                $crate::Value::Integer(i) => W::Integer(i),
                $crate::Value::Float(f) => W::Float(f),
                $crate::Value::Text(t) => W::Text(t),
                $crate::Value::FloatList(l) => W::FloatList(l),
            }
        }

        fn __lsgd_from_wit(v: lsgd::policy::types::ParamValue) -> $crate::Value {
            use lsgd::policy::types::ParamValue as W;
            match v {
                W::Boolean(b) => $crate::Value::Boolean(b),
                W::Integer(i) => $crate::Value::Integer(i),
                W::Float(f) => $crate::Value::Float(f),
                W::Text(t) => $crate::Value::Text(t),
                W::FloatList(l) => $crate::Value::FloatList(l),
            }
        }

        fn __lsgd_type_to_wit(t: $crate::ParamType) -> lsgd::policy::types::ParamType {
            use lsgd::policy::types::ParamType as W;
            match t {
                $crate::ParamType::Boolean => W::Boolean,
                $crate::ParamType::Integer => W::Integer,
                $crate::ParamType::Float => W::Float,
                $crate::ParamType::Text => W::Text,
                $crate::ParamType::FloatList => W::FloatList,
                $crate::ParamType::Choice(words) => W::Choice(words),
            }
        }

        impl exports::lsgd::policy::plugin::Guest for __LsgdExport {
            fn describe() -> lsgd::policy::types::PluginInfo {
                let info = <$policy as $crate::Policy>::info();
                lsgd::policy::types::PluginInfo {
                    name: info.name,
                    version: info.version,
                    summary: info.summary,
                    params: info
                        .params
                        .into_iter()
                        .map(|p| lsgd::policy::types::ParamSpec {
                            name: p.name,
                            type_: __lsgd_type_to_wit(p.ty),
                            default: p.default.map(__lsgd_to_wit),
                            doc: p.doc,
                        })
                        .collect(),
                }
            }

            fn configure(
                params: ::std::vec::Vec<lsgd::policy::types::Param>,
            ) -> ::core::result::Result<(), ::std::string::String> {
                let given = params
                    .into_iter()
                    .map(|p| (p.name, __lsgd_from_wit(p.value)))
                    .collect();
                let params =
                    $crate::Params::resolve(&<$policy as $crate::Policy>::info().params, given)?;
                let policy = <$policy as $crate::Policy>::configure(&params)?;
                __LSGD_POLICY
                    .with(|cell| *cell.borrow_mut() = ::core::option::Option::Some(policy));
                ::core::result::Result::Ok(())
            }
        }
    };
}
