//! Codec plugins outside training: a single-rank round trip decode(encode(x)) through the
//! sandbox or a native `lsgd_codec` codec (the one exchange, [`crate::exchange`], over a single
//! rank), and the reproducible buckets that `compare` and `bench codecs` feed both.

use lsgd_codec::rng::{Rng, mix};
use lsgd_codec::{Combine, DynCodec, Meta, Properties, TensorSlice};

use crate::Result;
use crate::exchange::{BucketCodec, Native, Own, Plan, SingleRank, Stop, exchange};
use crate::plugin::{Plugin, PluginError};

/// The payloads (one per round) and the reconstruction of one bucket.
pub type RoundTrip = (Vec<Vec<u8>>, Vec<f32>);

/// One single-rank step of a codec: its exchange over [`SingleRank`] (each round's own payload
/// stands in for the combined one), from `meta.state`. Returns the round trip and, for a
/// stateful codec (contract 0.4), the bucket's next state (empty for a codec that keeps none):
/// what `compare` and `bench codecs` run, so that a stateful codec pays for its state.
pub fn single_rank<C: BucketCodec>(
    codec: &mut C,
    properties: Properties,
    meta: &Meta,
    data: &[f32],
) -> Result<(RoundTrip, Vec<u8>), C::Error> {
    let plan = Plan {
        properties,
        own: Own::Skip,
        failed: false,
    };
    let done = match exchange(codec, &mut SingleRank, meta, data, plan) {
        Ok(done) => done,
        Err(Stop::Codec { here: Some(e), .. }) => return Err(e),
        Err(Stop::Move(never)) => match never {},
        Err(_) => unreachable!("a single rank cannot disagree with itself"),
    };
    let decoded = done.decoded?;
    Ok((
        (done.payloads, decoded.sum),
        decoded.next.unwrap_or_default(),
    ))
}

/// decode(encode(data)) through a codec plugin, as on a single rank ([`single_rank`] without
/// the next state).
pub fn round_trip(codec: &mut Plugin, meta: &Meta, data: &[f32]) -> Result<RoundTrip, PluginError> {
    step(codec, meta, data).map(|(trip, _)| trip)
}

/// [`single_rank`] for a plugin.
pub fn step(
    codec: &mut Plugin,
    meta: &Meta,
    data: &[f32],
) -> Result<(RoundTrip, Vec<u8>), PluginError> {
    let properties = codec.properties()?;
    single_rank(codec, properties, meta, data)
}

/// [`single_rank`] for a native codec; its error ([`crate::Error::Native`]) names the codec.
pub fn native_step(
    codec: &dyn DynCodec,
    meta: &Meta,
    data: &[f32],
) -> Result<(RoundTrip, Vec<u8>)> {
    single_rank(&mut Native(codec), codec.properties(), meta, data)
}

/// [`round_trip`] for a native codec.
pub fn native_round_trip(codec: &dyn DynCodec, meta: &Meta, data: &[f32]) -> Result<RoundTrip> {
    native_step(codec, meta, data).map(|(trip, _)| trip)
}

/// The metadata of bucket `bucket` (of `len` floats, holding `tensors`) at `step` on `rank`, as
/// every exchange builds it: the shared seed differs per run (`seed`), step and bucket, and the
/// rank seed also per rank. The trainer and the PyTorch comm hook (`lsgd-torch`) both call this,
/// so a codec sees the same seeds in either.
pub fn bucket_meta(
    seed: u64,
    step: u64,
    bucket: u32,
    rank: usize,
    len: u32,
    tensors: Vec<TensorSlice>,
) -> Meta {
    let shared = mix(mix(mix(seed) ^ step) ^ u64::from(bucket));
    Meta {
        bucket,
        step,
        round: 0,
        len,
        tensors,
        shared_seed: shared,
        rank_seed: mix(shared ^ mix(rank as u64 + 1)),
        state: Vec::new(),
    }
}

/// Refuses properties no exchange can follow: no round at all, or several rounds of a gathered
/// codec (a gathered payload has no combined form to feed the next round). The message names
/// the codec `label`.
pub fn check_properties(label: &str, properties: Properties) -> Result<(), String> {
    if properties.rounds == 0 {
        return Err(format!(
            "codec {label}: properties declare 0 rounds; a codec runs at least one"
        ));
    }
    if properties.rounds > 1 && properties.combine == Combine::Gather {
        return Err(format!(
            "codec {label}: declares {} rounds with `gather`; only summable codecs can run \
             several rounds (a gathered payload has no combined form)",
            properties.rounds
        ));
    }
    Ok(())
}

/// A bucket like a layer's gradient: a `rows`×`cols` weight and a `cols` bias, normally
/// distributed with a spread that varies by row (as real gradients do), reproducible from
/// (`seed`, `step`).
pub fn sample_bucket(rows: u32, cols: u32, step: u64, seed: u64) -> (Meta, Vec<f32>) {
    let w = rows * cols;
    let len = w + cols;
    let mut rng = Rng::new(mix(seed) ^ mix(step));
    let data: Vec<f32> = (0..len)
        .map(|i| {
            let row = if i < w { i / cols } else { rows };
            let scale = 1e-3 * (1.0 + (row % 7) as f32);
            rng.normal() * scale
        })
        .collect();
    let shared = mix(seed ^ 0x5eed) ^ step;
    let meta = Meta {
        bucket: 0,
        step,
        round: 0,
        len,
        tensors: vec![
            TensorSlice::whole("layer.weight", &[rows, cols], 0),
            TensorSlice::whole("layer.bias", &[cols], w),
        ],
        shared_seed: shared,
        rank_seed: mix(shared ^ 1),
        state: Vec::new(),
    };
    (meta, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_buckets_are_reproducible_and_consistent() {
        let (m, d) = sample_bucket(8, 4, 3, 1);
        assert_eq!(m.len, 36);
        assert_eq!(d.len(), 36);
        assert_eq!(m.tensors[1].range(), 32..36);
        assert_eq!(sample_bucket(8, 4, 3, 1).1, d);
        assert_ne!(sample_bucket(8, 4, 4, 1).1, d);
        let identity = lsgd_codec::native("identity", vec![]).unwrap().unwrap();
        let (_, out) = native_round_trip(identity.as_ref(), &m, &d).unwrap();
        assert_eq!(out, d);
    }
}
