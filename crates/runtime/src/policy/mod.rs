//! Policies at training time: the [`clock`] that produces each step's `train-state` (and, with
//! a sync policy, the synchronisation window), and the [`set`] of loaded plugins consulted every
//! step with their outputs checked, and how several schedules [`compose`] into one.

pub mod clock;
pub mod compose;
pub mod set;

pub use clock::{Clock, RunShape};
pub use compose::Composition;
pub use set::{
    Bounds, Decision, Held, NativeFn, OnFault, PolicySet, Slot, check_momentum, check_multipliers,
    check_outer_step, check_output, check_plan, outer_step_problem, plan_rules,
};
