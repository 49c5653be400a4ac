//! The plugin runtime: loads policy components into a wasmtime sandbox and calls them.
//!
//! - [`runtime`]: the engine, linker, epoch ticker and cache shared by all plugins;
//! - [`contract`]: which world and WIT version a component implements;
//! - [`v0_1`], [`v0_2`]: host bindings of `lsgd:policy@0.1` and `@0.2`, and [`binding`],
//!   which puts them behind one type;
//! - [`instance`]: one loaded plugin and its live instance;
//! - [`locate`]: plugin names to files;
//! - [`params`]: `--set` values type-checked against `describe()`;
//! - [`sandbox`]: what an instance may touch (nothing) and its limits;
//! - [`cache`]: compiled components on disk;
//! - [`error`]: faults that name the plugin, the call and the step.

pub mod binding;
pub mod cache;
pub mod contract;
pub mod error;
pub mod instance;
pub mod locate;
pub mod params;
pub mod runtime;
pub mod sandbox;
pub mod v0_1;
pub mod v0_2;

pub use cache::{Cache, Origin};
pub use contract::{Contract, PolicyKind, Version};
pub use error::{Fault, PluginError};
pub use instance::Plugin;
pub use runtime::Runtime;
pub use sandbox::Limits;
pub use v0_1::Output;
