//! lsgd-host: large-batch synchronous SGD with training policies as sandboxed WebAssembly
//! components.
//!
//! - [`plugin`]: loading and calling policy components (the sandbox, the contract versions);
//! - [`policy`]: the training clock that produces each step's `train-state`, and the set of
//!   policies consulted at every step, with output checks;
//! - [`trace`]: policy outputs over a whole run without training (`lsgd-host trace`);
//! - [`compare`]: two plugins over the same states (`lsgd-host compare`), or two codecs over
//!   the same buckets;
//! - [`codec`]: codec plugins outside training: round trips and sample buckets;
//! - [`plot`]: charts of traces;
//! - [`data`]: MNIST-format IDX data sets (plain or gzipped) for the trainer's `--data DIR`;
//! - [`model`]: the networks `run` trains (PyTorch's default initialisation);
//! - [`optim`]: SGD with momentum in PyTorch's and Goyal's forms;
//! - [`train`]: the training loop of `lsgd-host run`, metrics and checkpoints;
//! - [`collective`]: the ranks of an mpirun job and the gradient all-reduce algorithms;
//! - [`bench`]: measurements that print ratios from one run;
//! - [`cli`]: the command line.

pub mod bench;
pub mod cli;
pub mod codec;
pub mod collective;
pub mod compare;
pub mod data;
pub mod model;
pub mod optim;
pub mod plot;
pub mod plugin;
pub mod policy;
pub mod trace;
pub mod train;
