//! The exchange behind the backward pass (issue 46): what tells the step that a parameter's
//! gradient is ready ([`ready`]), the readiness of the pass in flight and the wait for a
//! bucket's ([`gate`]), and the order gradients become ready in, recorded once and the same on
//! every rank ([`order`]), which the bucket layout follows.

pub mod gate;
pub mod order;
pub mod ready;

pub use gate::Gate;
pub use ready::{GradReady, Readiness};
