//! Policies at training time: the [`clock`] that produces each step's `train-state`, and the
//! [`set`] of loaded plugins consulted every step with their outputs checked.

pub mod clock;
pub mod set;

pub use clock::{Clock, RunShape};
pub use set::{
    Bounds, Decision, Held, NativeFn, OnFault, PolicySet, check_multipliers, check_output,
};
