//! Test guest: the reference label-smoothing policy built against 0.2.0's
//! `label-smoothing-plugin` world, so the host's loading of such plugins stays tested after 0.3
//! fixed the world.
//!
//! That world exports `codec` too, by mistake (0.3.0 dropped it), so a plugin of it cannot be
//! built without one: this crate implements the smallest honest codec by hand, identity over
//! f32 with `sum` combining, which the host never needs to call on a label-smoothing plugin.

wit_bindgen::generate!({ path: "../../../wit/v0.2.0", world: "label-smoothing-plugin" });
lsgd_policy::export_label_smoothing!(lsgd_policy::label_smoothing::Smoothing);

use exports::lsgd::policy::codec::{BucketMeta, CodecProperties, Combine, Element, Guest};

impl Guest for __LsgdExport {
    fn properties() -> CodecProperties {
        CodecProperties {
            combine: Combine::Sum(Element::F32),
            rounds: 1,
        }
    }

    fn encode(meta: BucketMeta, data: Vec<f32>, agreed: Vec<Vec<u8>>) -> Result<Vec<u8>, String> {
        if data.len() != meta.len as usize || !agreed.is_empty() {
            return Err(format!(
                "identity codec: expected {} floats and no agreed payloads, got {} and {}",
                meta.len,
                data.len(),
                agreed.len()
            ));
        }
        Ok(data.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    fn decode(meta: BucketMeta, payloads: Vec<Vec<u8>>) -> Result<Vec<f32>, String> {
        let [payload] = payloads.as_slice() else {
            return Err(format!(
                "identity codec: expected 1 payload, got {}",
                payloads.len()
            ));
        };
        if payload.len() != 4 * meta.len as usize {
            return Err(format!(
                "identity codec: expected {} bytes, got {}",
                4 * meta.len as usize,
                payload.len()
            ));
        }
        Ok(payload
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
