//! Host bindings for `lsgd:policy@0.2.x` (frozen: `wit/v0.2.0/`): 0.1's interfaces unchanged
//! plus `codec`. Its `types` interface maps onto the shared generated types of
//! [`super::types`], where their conversions live; the kind enums and the codec calls come
//! from the macros of [`super::binding`], shared with later versions.
//!
//! 0.2.0's `label-smoothing-plugin` world also exports `codec` (a mistake fixed in 0.3.0); the
//! contract detection reads such a component as a label-smoothing plugin and its codec is
//! never resolved here.

use lsgd_policy::{Info, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::binding::{codec_calls, version_bindings};
use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::Output;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.2.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.2.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{batch_size, codec, label_smoothing, plugin, schedule};

version_bindings! {
    kinds: [
        Schedule => schedule,
        BatchSize => batch_size,
        LabelSmoothing => label_smoothing,
        Codec => codec,
    ],
}
codec_calls!();
