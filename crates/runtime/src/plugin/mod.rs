//! The plugin runtime: loads policy components into a wasmtime sandbox and calls them.
//!
//! - [`runtime`]: the engine, linker, epoch ticker and cache shared by all plugins;
//! - [`contract`]: which world and WIT version a component implements;
//! - [`v0_1`] to [`v0_5`]: host bindings of `lsgd:policy@0.1` to `@0.5`, and
//!   [`binding`], which puts them behind one type (with the macros they share);
//! - [`types`]: what does not change between versions — [`Output`], the generated types of
//!   the latest version's WIT `types` interface (every version's bindings map theirs onto
//!   them) and their conversions to and from `lsgd_policy`'s types, written once;
//! - [`instance`]: one loaded plugin and its live instance;
//! - [`locate`]: plugin names to files, in the folders the caller names;
//! - [`words`]: the caller's names for the settings a message tells the user to change
//!   (lsgd-host's flags, lsgd-torch's keywords);
//! - [`params`]: `--set` values type-checked against `describe()`;
//! - [`sandbox`]: what an instance may touch (nothing) and its limits;
//! - `waits`: the sandbox's clock waits and `wasi:io/poll`, which take no time and never block;
//! - [`cache`]: compiled components on disk;
//! - [`error`]: faults that name the plugin, the call and the step ([`PluginError`]);
//! - [`guest`]: a failed guest's stderr read in its language's terms (exception, panic).
//!
//! Imports run one way: `runtime` → `instance` → `binding` → `v0_*` → `types`, and everything
//! may use `sandbox`, `error`, `contract` and `words`, which use nothing above them.
//!
//! A new contract version `v0_N` gets a module of its own whose bindgen maps its `types` onto
//! [`types`]`::wit` with `with:`; [`types`] then generates from the new version's WIT (the older
//! modules keep mapping onto it), and [`binding`] and [`contract`] gain a variant.

pub mod binding;
pub mod cache;
pub mod contract;
pub mod error;
pub mod guest;
pub mod instance;
pub mod locate;
pub mod params;
pub mod runtime;
pub mod sandbox;
pub mod types;
pub mod v0_1;
pub mod v0_2;
pub mod v0_3;
pub mod v0_4;
pub mod v0_5;
mod waits;
pub mod words;

pub use cache::{Cache, Origin};
pub use contract::{Contract, PolicyKind, Version};
pub use error::{Fault, PluginError, Worded};
pub use guest::GuestReport;
pub use instance::{Plugin, identity};
pub use runtime::{EngineOptions, Runtime};
pub use sandbox::Limits;
pub use types::Output;
pub use words::{Knob, Style, Words};
