//! PLACEHOLDER: to be replaced by the real codec.

use crate::{Codec, Info, Meta, Params, Policy, Properties};

/// Placeholder.
pub struct TopK;

impl Policy for TopK {
    fn info() -> Info {
        Info::new("top_k", "placeholder", vec![])
    }
    fn configure(_: &Params) -> Result<Self, String> {
        Ok(TopK)
    }
}

impl Codec for TopK {
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
