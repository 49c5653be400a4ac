//! `threshold`: keep every element with |x| ≥ τ (Strom 2015; Dryden et al. 2016), sent as a
//! [sparse] payload and all-gathered.
//!
//! Unlike top-k the number of kept elements, and so the payload length, follows the data: it
//! can be anything from 4 bytes (nothing reaches τ) to 4 + 8·n (everything does), and differs
//! between ranks and steps. That is why the payloads are gathered, never summed.
//!
//! The comparison is on magnitude keys ([`sparse::key`]), which order |x| exactly like the
//! float compare for every non-NaN value; a NaN counts as larger than any number, so it is
//! kept and reaches the decoded gradient, as with `top-k`.

use crate::sparse::{self, key};
use crate::wire::expect_rounds;
use crate::{Codec, Info, Meta, ParamSpec, Params, Policy, Properties};

/// Keeps the elements whose magnitude reaches a fixed threshold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// τ as binary32: positive and finite.
    pub tau: f32,
}

impl Policy for Threshold {
    fn info() -> Info {
        Info::new(
            "threshold",
            "Threshold sparsification: every |x| >= threshold as index+value pairs, all-gathered; the payload length varies with the data",
            vec![ParamSpec::float(
                "threshold",
                1e-3,
                "magnitude an element must reach to be sent (> 0)",
            )],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let v = p.float("threshold")?;
        // τ is compared in binary32: it must stay positive and finite after rounding.
        let tau = v as f32;
        if v > 0.0 && tau > 0.0 && tau.is_finite() {
            Ok(Threshold { tau })
        } else {
            Err(format!(
                "threshold must be > 0 and within the finite binary32 range, got {v}"
            ))
        }
    }
}

impl Codec for Threshold {
    fn properties(&self) -> Properties {
        Properties::GATHER
    }

    fn encode(&self, meta: &Meta, data: &[f32], _: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        crate::wire::check_len(meta, data)?;
        let mut idx = Vec::new();
        sparse::collect_at_least(data, key(self.tau), &mut idx);
        Ok(sparse::encode(data, &idx, 1.0))
    }

    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        expect_rounds(payloads, 1)?;
        sparse::decode(&payloads[0], meta.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Value, dynamic, round_trip};

    fn codec(tau: f64) -> Result<Threshold, String> {
        let given = vec![("threshold".into(), Value::Float(tau))];
        Threshold::configure(&Params::resolve(&Threshold::info().params, given)?)
    }

    #[test]
    fn keeps_exactly_the_elements_at_or_above_tau() {
        let mut rng = crate::rng::Rng::new(5);
        let n = 10_001;
        let mut data: Vec<f32> = (0..n).map(|_| rng.normal() * 0.01).collect();
        data[17] = 0.01; // exactly τ: kept
        data[18] = -0.01; // exactly −τ: kept
        data[19] = f32::from_bits(0.01f32.to_bits() - 1); // one ulp below: dropped
        data[20] = f32::NAN; // larger than any number: kept
        let c = codec(0.01).unwrap();
        let meta = Meta::flat("w", n as u32, 0, 1);
        let (payloads, out) = round_trip(dynamic(c).as_ref(), &meta, &data).unwrap();
        let kept: Vec<usize> = (0..n)
            .filter(|&i| data[i].is_nan() || data[i].abs() >= 0.01)
            .collect();
        assert!(kept.len() > 100 && kept.len() < n / 2, "{}", kept.len());
        assert_eq!(payloads[0].len(), sparse::encoded_len(kept.len()));
        for i in 0..n {
            if kept.contains(&i) {
                assert_eq!(out[i].to_bits(), data[i].to_bits(), "{i}");
            } else {
                assert_eq!(out[i], 0.0, "{i}");
            }
        }
        assert!(kept.contains(&17) && kept.contains(&18) && !kept.contains(&19));
        assert!(out[20].is_nan());
    }

    #[test]
    fn payload_length_follows_the_data() {
        let c = codec(1.0).unwrap();
        let meta = Meta::flat("w", 4, 0, 1);
        assert_eq!(c.encode(&meta, &[0.5; 4], &[]).unwrap().len(), 4);
        assert_eq!(c.encode(&meta, &[2.0; 4], &[]).unwrap().len(), 4 + 32);
        let out = c
            .decode(&meta, &[c.encode(&meta, &[0.5; 4], &[]).unwrap()])
            .unwrap();
        assert_eq!(out, vec![0.0; 4]);
    }

    #[test]
    fn rejects_bad_lengths_payloads_and_parameters() {
        let c = codec(1.0).unwrap();
        let meta = Meta::flat("w", 4, 0, 1);
        assert!(
            c.encode(&meta, &[1.0; 5], &[])
                .unwrap_err()
                .contains("5 floats")
        );
        let p = c.encode(&meta, &[2.0, 0.0, 3.0, 0.0], &[]).unwrap();
        assert!(
            c.decode(&meta, &[p[..9].to_vec()])
                .unwrap_err()
                .starts_with("malformed payload")
        );
        let mut swapped = p.clone();
        swapped[4..8].copy_from_slice(&2u32.to_le_bytes());
        swapped[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert!(
            c.decode(&meta, &[swapped])
                .unwrap_err()
                .contains("not above")
        );
        let mut far = p.clone();
        far[8..12].copy_from_slice(&4u32.to_le_bytes());
        assert!(
            c.decode(&meta, &[far])
                .unwrap_err()
                .contains("outside the bucket")
        );
        for bad in [0.0, -1.0, 1e-50, 1e39, f64::INFINITY] {
            assert_eq!(
                codec(bad).unwrap_err(),
                format!("threshold must be > 0 and within the finite binary32 range, got {bad}")
            );
        }
    }
}
