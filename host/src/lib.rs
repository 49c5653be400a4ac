//! lsgd-host: large-batch synchronous SGD with training policies as sandboxed WebAssembly
//! components. This crate is the `lsgd-host` binary's command line, benchmarks and plots; the
//! work is done by three library crates, re-exported here under their module names:
//!
//! - [`lsgd_runtime`] ([`plugin`], [`policy`], [`codec`], [`trace`], [`compare`]): the plugin
//!   sandbox and everything that calls plugins without training (wasmtime only);
//! - [`lsgd_collective`] ([`collective`]): the ranks of an mpirun job and the gradient
//!   collectives (MPI only);
//! - [`lsgd_train`] ([`train`], [`model`], [`optim`], [`data`]): the trainer (libtorch);
//!
//! and in this crate:
//!
//! - [`plot`]: charts of traces and runs;
//! - [`study`]: the papers' experiments, each one command that writes a report;
//! - [`bench`]: measurements that print ratios from one run;
//! - [`cli`]: the command line.

pub use lsgd_collective as collective;
pub use lsgd_runtime::{codec, compare, exchange, plugin, policy, trace};
pub use lsgd_train as train;
pub use lsgd_train::{data, model, optim, precision};

pub mod bench;
pub mod cli;
pub mod plot;
pub mod study;
