//! `fp16`: every float as IEEE binary16 (round to nearest, ties to even), little-endian.
//!
//! Summable: the host all-reduces the payloads as binary16 vectors and decodes the sum once.
//! Payload: `meta.len` × 2 bytes. Relative error ≤ 2^-11 for |x| in the normal binary16 range
//! [2^-14, 65504]; smaller values lose precision (subnormals, then 0), larger ones become ±∞.

use crate::wire::check_len;
use crate::wire::{Reader, expect_rounds, f16_bits, f16_value};
use crate::{Codec, Element, Info, Meta, Params, Policy, Properties};

/// binary16 payloads, all-reduced as they are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp16;

impl Policy for Fp16 {
    fn info() -> Info {
        Info::new(
            "fp16",
            "IEEE binary16 payloads (round to nearest even), all-reduced as they are",
            vec![],
        )
    }

    fn configure(_: &Params) -> Result<Self, String> {
        Ok(Fp16)
    }
}

impl Codec for Fp16 {
    fn properties(&self) -> Properties {
        Properties::sum(Element::F16)
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        encode_16(meta, data, f16_bits)
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        decode_16(meta, payloads, f16_value)
    }
}

/// `data` as little-endian 16-bit words `to(x)`; shared with `bf16`.
/// Generic rather than a function pointer: monomorphised, the loop inlines `to` and vectorises.
pub(crate) fn encode_16(
    meta: &Meta,
    data: &[f32],
    to: impl Fn(f32) -> u16,
) -> Result<Vec<u8>, String> {
    let n = check_len(meta, data)?;
    let mut out = vec![0u8; 2 * n];
    for (o, &x) in out.chunks_exact_mut(2).zip(data) {
        o.copy_from_slice(&to(x).to_le_bytes());
    }
    Ok(out)
}

/// The `meta.len` little-endian 16-bit words of the one payload, through `from`.
pub(crate) fn decode_16(
    meta: &Meta,
    payloads: &[Vec<u8>],
    from: impl Fn(u16) -> f32,
) -> Result<Vec<f32>, String> {
    expect_rounds(payloads, 1)?;
    let n = meta.len as usize;
    let mut r = Reader::new(&payloads[0]);
    let words = r.take(n.checked_mul(2).ok_or("length overflow")?, "the values")?;
    r.finish()?;
    Ok(words
        .chunks_exact(2)
        .map(|w| from(u16::from_le_bytes([w[0], w[1]])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::testing::gradient;
    use crate::{Value, dynamic, native, round_trip};

    #[test]
    fn half_an_ulp_in_the_normal_range() {
        let mut data = gradient(4000, 1);
        data.extend([
            1.0,
            -1.0,
            65504.0,
            6.2e-5,
            -6.2e-5,
            1.0 + 1.0 / 2048.0,
            1234.567,
        ]);
        data.retain(|x| x.abs() >= 2f32.powi(-14));
        let meta = Meta::flat("w", data.len() as u32, 0, 0);
        let (payloads, out) = round_trip(dynamic(Fp16).as_ref(), &meta, &data).unwrap();
        assert_eq!(payloads[0].len(), 2 * data.len(), "ratio 2");
        for (x, y) in data.iter().zip(&out) {
            assert!((x - y).abs() <= x.abs() * 2f32.powi(-11), "{x} -> {y}");
        }
        assert_eq!(out[out.len() - 2], 1.0, "ties go to even");
    }

    #[test]
    fn out_of_range_values() {
        let data = [0.0, -0.0, 1e5, -1e5, 2f32.powi(-24), 1e-9, f32::NAN];
        let meta = Meta::flat("w", data.len() as u32, 0, 0);
        let (_, out) = round_trip(dynamic(Fp16).as_ref(), &meta, &data).unwrap();
        assert_eq!(
            out[..6],
            [
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                2f32.powi(-24),
                0.0
            ]
        );
        assert!(out[6].is_nan());
    }

    #[test]
    fn payloads_sum_as_binary16() {
        let meta = Meta::flat("w", 3, 0, 0);
        let a = Fp16.encode(&meta, &[1.0, 0.5, -2.0], &[]).unwrap();
        assert_eq!(
            a,
            [0x00, 0x3c, 0x00, 0x38, 0x00, 0xc0],
            "little-endian binary16"
        );
        assert_eq!(Fp16.properties(), Properties::sum(Element::F16));
        let decoded = Fp16.decode(&meta, &[a]).unwrap();
        assert_eq!(decoded, [1.0, 0.5, -2.0]);
    }

    #[test]
    fn malformed_payloads_and_lengths_are_rejected() {
        let meta = Meta::flat("w", 10, 0, 0);
        for len in [0, 19, 21] {
            let e = Fp16.decode(&meta, &[vec![0; len]]).unwrap_err();
            assert!(e.starts_with("malformed payload: "), "{e}");
        }
        assert!(Fp16.decode(&meta, &[]).is_err());
        assert!(Fp16.encode(&meta, &[0.0; 9], &[]).is_err());
        assert_eq!(Fp16.decode(&meta, &[vec![0; 20]]).unwrap(), [0.0; 10]);
    }

    #[test]
    fn takes_no_parameters() {
        let e = native("fp16", vec![("chunk".into(), Value::Integer(1))]).unwrap();
        assert_eq!(
            e.err().unwrap(),
            "unknown parameter 'chunk' (accepted: none)"
        );
        assert_eq!(native("fp16", vec![]).unwrap().unwrap().info().name, "fp16");
    }
}
