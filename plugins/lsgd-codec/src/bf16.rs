//! `bf16`: every float as bfloat16 (the upper half of its binary32, rounded to nearest even),
//! little-endian.
//!
//! Summable: the host all-reduces the payloads as bfloat16 vectors. Payload: `meta.len` × 2
//! bytes. Same exponent range as binary32, so no overflow or flush; relative error ≤ 2^-8
//! for normal values.

use crate::fp16::{decode_16, encode_16};
use crate::wire::{bf16_bits, bf16_value};
use crate::{Codec, Element, Info, Meta, Params, Policy, Properties};

/// bfloat16 payloads, all-reduced as they are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bf16;

impl Policy for Bf16 {
    fn info() -> Info {
        Info::new(
            "bf16",
            "bfloat16 payloads (round to nearest even), all-reduced as they are",
            vec![],
        )
    }

    fn configure(_: &Params) -> Result<Self, String> {
        Ok(Bf16)
    }
}

impl Codec for Bf16 {
    fn properties(&self) -> Properties {
        Properties::sum(Element::Bf16)
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        encode_16(meta, data, bf16_bits)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        decode_16(meta, payloads, bf16_value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::testing::gradient;
    use crate::{Value, dynamic, native, round_trip};

    #[test]
    fn half_an_ulp_everywhere_in_the_normal_range() {
        let mut data = gradient(4000, 2);
        data.extend([1e30, -1e-30, 3.0e38, f32::MIN_POSITIVE, 1.0 + 2f32.powi(-8)]);
        data.retain(|&x| x != 0.0);
        let meta = Meta::flat("w", data.len() as u32, 0, 0);
        let (payloads, out) = round_trip(dynamic(Bf16).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 2 * data.len(), "ratio 2");
        for (x, y) in data.iter().zip(&out) {
            assert!((x - y).abs() <= x.abs() * 2f32.powi(-8), "{x} -> {y}");
        }
        assert_eq!(out[out.len() - 1], 1.0, "ties go to even");
        let exact = [0.0, -0.0, 1.0, -0.5, 2f32.powi(-100)];
        let meta = Meta::flat("w", 5, 0, 0);
        let (_, out) = round_trip(dynamic(Bf16).as_ref(), &meta, &exact).unwrap();
        assert_eq!(out, exact);
    }

    #[test]
    fn payload_is_the_upper_half() {
        let meta = Meta::flat("w", 2, 0, 0);
        let p = Bf16.encode(&meta, &[1.0, -2.0], &[]).unwrap();
        assert_eq!(p, [0x80, 0x3f, 0x00, 0xc0]);
        assert_eq!(Bf16.properties(), Properties::sum(Element::Bf16));
        assert!(
            Bf16.decode(&meta, &[vec![0; 3]])
                .unwrap_err()
                .starts_with("malformed payload: ")
        );
        assert!(
            Bf16.decode(&meta, &[vec![0; 5]])
                .unwrap_err()
                .starts_with("malformed payload: ")
        );
        assert!(Bf16.encode(&meta, &[1.0], &[]).is_err());
    }

    #[test]
    fn takes_no_parameters() {
        let e = native("bf16", vec![("levels".into(), Value::Integer(1))]).unwrap();
        assert!(e.is_err());
        assert_eq!(native("bf16", vec![]).unwrap().unwrap().info().name, "bf16");
    }
}
