//! PLACEHOLDER: to be replaced by the real codec.

use crate::{Codec, Info, Meta, Params, Policy, Properties};

/// Placeholder.
pub struct Qsgd;

impl Policy for Qsgd {
    fn info() -> Info {
        Info::new("qsgd", "placeholder", vec![])
    }
    fn configure(_: &Params) -> Result<Self, String> {
        Ok(Qsgd)
    }
}

impl Codec for Qsgd {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }
    fn encode(&self, _: &Meta, _: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        Err("placeholder".into())
    }
    fn decode(&self, _: &Meta, _: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        Err("placeholder".into())
    }
}
