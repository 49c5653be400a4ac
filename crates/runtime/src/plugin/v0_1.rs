//! Host bindings for `lsgd:policy@0.1.x` (frozen: `wit/v0.1.0/`). Bound through the `host-view`
//! world so that one set of generated types serves every policy kind; each interface is looked
//! up on its own, so a plugin only needs the exports of its own world. Its `types` interface is
//! mapped onto the latest version's generated types (see [`super::types`]), so the conversions
//! are shared.

use lsgd_policy::{Info, State, Value};
use wasmtime::component::{Instance, InstancePre};
use wasmtime::{AsContextMut, Result};

use super::binding::version_bindings;
use super::contract::PolicyKind;
use super::sandbox::Sandbox;
use super::types::Output;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit/v0.1.0",
        world: "host-view",
        with: { "lsgd:policy/types@0.1.0": crate::plugin::types::wit },
    });
}

use bindings::exports::lsgd::policy::{batch_size, label_smoothing, plugin, schedule};

version_bindings! {
    kinds: [
        Schedule => schedule,
        BatchSize => batch_size,
        LabelSmoothing => label_smoothing,
    ],
}
