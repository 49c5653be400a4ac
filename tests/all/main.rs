//! Integration tests of lsgd-host, one binary (as wasmtime does) to keep link time down. They
//! need the reference plugins and test guests built: `scripts/build-plugins.sh` (the README's
//! test command does it).

mod asynchronous;
mod bench_ddp;
mod cache;
mod calibrate;
mod checkpoints;
mod cli;
mod codec_state;
mod codecs;
mod collective_timeout;
mod common;
mod data;
mod dgc;
mod docs;
mod env_sh;
mod faults;
mod formulas;
mod fuzz;
mod golden;
mod guest_errors;
mod hold_last;
mod languages;
mod launch;
mod layerwise;
mod mpi;
mod netlab;
mod pinned;
mod plot;
mod policy_change;
mod powersgd_torch;
mod precision;
mod rank_faults;
mod run_dir;
mod scaffold;
mod schedules_torch;
mod shared_build;
mod soak;
mod studies;
mod tensorboard;
mod tolerance;
mod torchscript;
mod train;
mod waits;
mod wit_frozen;
mod worlds;
