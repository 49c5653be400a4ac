//! lsgd-runtime: the training policies of lsgd-host as sandboxed WebAssembly components, and
//! everything that uses them without training. It depends on wasmtime and the contract crates
//! only (no libtorch, no MPI), so it builds and tests on any machine.
//!
//! - [`plugin`]: loading and calling policy and codec components (the sandbox, the contract
//!   versions);
//! - [`policy`]: the training clock that produces each step's `train-state`, and the set of
//!   policies consulted at every step, with output checks;
//! - [`exchange`]: one bucket's exchange through a codec over any ranks' collectives (the
//!   trainer's, PyTorch's, or a single rank's);
//! - [`codec`]: codec plugins outside training: round trips and sample buckets;
//! - [`trace`]: policy outputs over a whole run without training (`lsgd-host trace`);
//! - [`compare`]: two plugins over the same states (`lsgd-host compare`), or two codecs over
//!   the same buckets;
//! - [`error`]: the crate's [`Error`]; a fault of one plugin is a [`plugin::PluginError`],
//!   which converts into it.

pub mod codec;
pub mod compare;
pub mod error;
pub mod exchange;
pub mod plugin;
pub mod policy;
pub mod trace;

pub use error::{Error, Result};
