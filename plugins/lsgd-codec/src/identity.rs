//! `identity`: the gradient as little-endian binary32, summable. The baseline every codec is
//! measured against (compression ratio 1), and exact: decode(encode(x)) == x bit for bit.

use crate::wire::{Reader, check_len, expect_rounds, put_f32s};
use crate::{Codec, Element, Info, Meta, Params, Policy, Properties};

/// No compression.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Identity;

impl Policy for Identity {
    fn info() -> Info {
        Info::new(
            "identity",
            "No compression: binary32 payloads, all-reduced as they are",
            vec![],
        )
    }

    fn configure(_: &Params) -> Result<Self, String> {
        Ok(Identity)
    }
}

impl Codec for Identity {
    fn properties(&self) -> Properties {
        Properties::sum(Element::F32)
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        check_len(meta, data)?;
        let mut out = Vec::new();
        put_f32s(&mut out, data);
        Ok(out)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        let mut r = Reader::new(&payloads[0]);
        let out = r.f32s(meta.len as usize, "the values")?;
        r.finish()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dynamic, round_trip};

    #[test]
    fn exact_and_uncompressed() {
        let data: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 1e-3).collect();
        let meta = Meta::flat("w", 1000, 0, 1);
        let (payloads, out) = round_trip(dynamic(Identity).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 4000);
        assert_eq!(out, data);
        let short = Identity.decode(&meta, &[vec![0; 3999]]).unwrap_err();
        assert!(short.contains("malformed payload"), "{short}");
    }
}
