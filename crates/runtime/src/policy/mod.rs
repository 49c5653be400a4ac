//! Policies at training time: the [`clock`] that produces each step's `train-state`, and the
//! [`set`] of loaded plugins consulted every step with their outputs checked, and how several
//! schedules [`compose`] into one.

pub mod clock;
pub mod compose;
pub mod set;

pub use clock::{Clock, RunShape};
pub use compose::Composition;
pub use set::{
    Bounds, Decision, Held, NativeFn, OnFault, PolicySet, Slot, check_momentum, check_multipliers,
    check_output,
};
