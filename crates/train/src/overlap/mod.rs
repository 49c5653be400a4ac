//! The exchange behind the backward pass (issue 46): what tells the step that a parameter's
//! gradient is ready ([`ready`]), so that a bucket can move while autograd computes the rest,
//! and the order they become ready in, the same on every rank ([`order`]).

pub mod order;
pub mod ready;

pub use ready::{GradReady, Readiness};
