//! Macros that turn a [`Policy`](crate::Policy) into the exports of a WebAssembly component.
//!
//! They expand inside the guest crate, next to `wit_bindgen::generate!`, because the WIT types
//! they convert to and from only exist there. Paths like `exports::lsgd::policy::plugin` and
//! `lsgd::policy::types` therefore resolve at the call site, which must be the module (normally
//! the crate root) where `generate!` ran.

/// Exports a [`Schedule`](crate::Schedule) from a crate that generated the `schedule-plugin` world.
///
/// ```ignore
/// wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "schedule-plugin" });
/// lsgd_policy::export_schedule!(lsgd_policy::warmup::Warmup);
/// ```
#[macro_export]
macro_rules! export_schedule {
    ($policy:ty) => {
        $crate::__export_policy!($policy, schedule, Schedule, learning_rate -> f64);
    };
}

/// Exports a [`BatchSize`](crate::BatchSize) from a crate that generated the `batch-size-plugin` world.
#[macro_export]
macro_rules! export_batch_size {
    ($policy:ty) => {
        $crate::__export_policy!($policy, batch_size, BatchSize, global_batch -> u32);
    };
}

/// Exports a [`LabelSmoothing`](crate::LabelSmoothing) from a crate that generated the
/// `label-smoothing-plugin` world.
#[macro_export]
macro_rules! export_label_smoothing {
    ($policy:ty) => {
        $crate::__export_policy!($policy, label_smoothing, LabelSmoothing, epsilon -> f32);
    };
}

/// The body shared by the three export macros: `$iface` is the generated export module,
/// `$kind` our trait and `$func` the method both of them name identically.
#[doc(hidden)]
#[macro_export]
macro_rules! __export_policy {
    ($policy:ty, $iface:ident, $kind:ident, $func:ident -> $ret:ty) => {
        $crate::__export_plugin!($policy);

        #[inline(always)]
        fn __lsgd_state(s: lsgd::policy::types::TrainState) -> $crate::State {
            $crate::copy_train_state!(s => $crate::State)
        }

        impl exports::lsgd::policy::$iface::Guest for __LsgdExport {
            fn $func(state: lsgd::policy::types::TrainState) -> $ret {
                __lsgd_with(|p| <$policy as $crate::$kind>::$func(p, &__lsgd_state(state)))
            }
        }

        export!(__LsgdExport);
    };
}

/// The `plugin` interface (describe, configure) of any [`Policy`](crate::Policy), and
/// `__lsgd_with`, which runs a closure on the configured value; every export macro (the codec
/// one in `lsgd-codec` too) starts with this and adds its own interface.
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
        fn __lsgd_with<R>(f: impl ::core::ops::FnOnce(&$policy) -> R) -> R {
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
