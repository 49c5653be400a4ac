//! PLACEHOLDER: to be replaced by the real codec.

use crate::{Codec, Info, Meta, Params, Policy, Properties};

/// Placeholder.
pub struct PowerSgd;

impl Policy for PowerSgd {
    fn info() -> Info {
        Info::new("powersgd", "placeholder", vec![])
    }
    fn configure(_: &Params) -> Result<Self, String> {
        Ok(PowerSgd)
    }
}

impl Codec for PowerSgd {
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
