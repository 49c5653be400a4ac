//! Hostile codec inputs shared by `plugins/lsgd-codec/tests/fuzz.rs` (native decode) and
//! `tests/all/fuzz.rs` (decode through the sandbox): bucket metas, valid encodings and their
//! mutations.

#![allow(dead_code)]

use lsgd_codec::{DynCodec, Meta, TensorSlice};
use proptest::prelude::*;
use proptest::sample::Index;

/// Bucket layouts: one flat tensor, none, a weight matrix and its bias (what training sends),
/// or arbitrary slices that may overlap, leave gaps, lie outside the bucket or claim shapes
/// whose products overflow; with a codec state (contract 0.4) that is mostly empty, else
/// arbitrary bytes.
pub fn meta() -> impl Strategy<Value = Meta> {
    let len = prop_oneof![3 => 0u32..64, 2 => 64u32..2048, 1 => 2048u32..20_000];
    let slice = (
        prop::collection::vec(prop_oneof![4 => 0u32..300, 1 => any::<u32>()], 0..4),
        prop_oneof![3 => 0u32..2048, 1 => any::<u32>()],
        prop_oneof![3 => 0u32..2048, 1 => any::<u32>()],
        prop_oneof![3 => 0u32..2048, 1 => any::<u32>()],
    )
        .prop_map(|(shape, tensor_offset, bucket_offset, len)| TensorSlice {
            name: "t".into(),
            shape,
            tensor_offset,
            bucket_offset,
            len,
        });
    (
        len,
        0u8..4,
        1u32..64,
        prop::collection::vec(slice, 0..5),
        any::<(u32, u64, u32, u64, u64)>(),
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(any::<u8>(), 0..600)],
    )
        .prop_map(
            |(len, layout, rows, slices, (bucket, step, round, shared_seed, rank_seed), state)| {
                let tensors = match layout {
                    0 => vec![TensorSlice::whole("w", &[len], 0)],
                    1 => Vec::new(),
                    2 => {
                        let rows = rows.min(len.max(1));
                        let cols = len / rows;
                        let mut t = vec![TensorSlice::whole("w", &[rows, cols], 0)];
                        if len > rows * cols {
                            t.push(TensorSlice::whole("b", &[len - rows * cols], rows * cols));
                        }
                        t
                    }
                    _ => slices,
                };
                Meta {
                    bucket,
                    step,
                    round: round % 4,
                    len,
                    tensors,
                    shared_seed,
                    rank_seed,
                    state,
                }
            },
        )
}

/// One change to a valid encoding.
#[derive(Clone, Debug)]
pub enum Mutation {
    Truncate(Index),
    FlipBit(Index, u8),
    Append(Vec<u8>),
    /// Overwrites four bytes with a little-endian u32: counts, lengths and indices live there.
    SetU32(Index, u32),
    DropRound(Index),
    AddRound(Vec<u8>),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let big = prop_oneof![
        Just(u32::MAX),
        Just(1 << 31),
        Just(1 << 30),
        Just(0),
        any::<u32>()
    ];
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        prop::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
        (any::<Index>(), big).prop_map(|(i, v)| Mutation::SetU32(i, v)),
        any::<Index>().prop_map(Mutation::DropRound),
        prop::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::AddRound),
    ]
}

pub fn apply(payloads: &mut Vec<Vec<u8>>, m: &Mutation) {
    let last = payloads.len().checked_sub(1);
    match (m, last) {
        (Mutation::Truncate(i), Some(r)) => {
            let p = &mut payloads[r];
            p.truncate(i.index(p.len() + 1));
        }
        (Mutation::FlipBit(i, b), Some(r)) if !payloads[r].is_empty() => {
            let p = &mut payloads[r];
            let at = i.index(p.len());
            p[at] ^= 1 << b;
        }
        (Mutation::Append(bytes), Some(r)) => payloads[r].extend_from_slice(bytes),
        (Mutation::SetU32(i, v), Some(r)) if payloads[r].len() >= 4 => {
            let p = &mut payloads[r];
            let at = i.index(p.len() - 3);
            p[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        (Mutation::DropRound(i), Some(_)) => {
            payloads.remove(i.index(payloads.len()));
        }
        (Mutation::AddRound(bytes), _) => payloads.push(bytes.clone()),
        _ => {}
    }
}

/// Where the payloads of a case come from.
#[derive(Clone, Debug)]
pub enum Payloads {
    /// Arbitrary bytes, one payload per entry.
    Random(Vec<Vec<u8>>),
    /// A valid encoding of `data` (of `meta.len` floats, drawn from `seed`), then `mutations`.
    Mutated {
        seed: u64,
        special: u8,
        mutations: Vec<Mutation>,
    },
}

impl Payloads {
    /// The payloads `codec` is to decode under `meta`; `None` when `codec` refuses to encode
    /// the data of a `Mutated` plan (the case then has nothing to decode).
    pub fn build(&self, codec: &dyn DynCodec, meta: &Meta) -> Option<Vec<Vec<u8>>> {
        match self {
            Payloads::Random(p) => Some(p.clone()),
            Payloads::Mutated {
                seed,
                special,
                mutations,
            } => {
                let x = data(meta.len, *seed, *special);
                let mut p = encoding(codec, meta, &x)?;
                for m in mutations {
                    apply(&mut p, m);
                }
                Some(p)
            }
        }
    }
}

pub fn payloads() -> impl Strategy<Value = Payloads> {
    prop_oneof![
        1 => prop::collection::vec(prop::collection::vec(any::<u8>(), 0..256), 0..3).prop_map(Payloads::Random),
        3 => (any::<u64>(), any::<u8>(), prop::collection::vec(mutation(), 0..4))
            .prop_map(|(seed, special, mutations)| Payloads::Mutated { seed, special, mutations }),
    ]
}

/// Gradient-like floats with an occasional NaN, infinity, zero or subnormal.
pub fn data(len: u32, seed: u64, special: u8) -> Vec<f32> {
    let mut rng = lsgd_codec::rng::Rng::new(seed);
    (0..len)
        .map(|i| {
            let x = rng.normal() * 1e-2;
            match (i.wrapping_mul(2_654_435_761) ^ u32::from(special)) % 251 {
                0 if special & 1 == 1 => f32::NAN,
                1 if special & 2 == 2 => f32::INFINITY,
                2 => 0.0,
                3 if special & 4 == 4 => 1e-40,
                _ => x,
            }
        })
        .collect()
}

/// Every round's payload of `data`, as `lsgd_codec::round_trip` makes them; `None` when
/// `encode` refuses the meta (an inconsistent layout, say).
pub fn encoding(codec: &dyn DynCodec, meta: &Meta, data: &[f32]) -> Option<Vec<Vec<u8>>> {
    let rounds = codec.properties().rounds.max(1);
    let mut m = meta.clone();
    let mut out = Vec::new();
    for r in 0..rounds {
        m.round = r;
        out.push(codec.encode(&m, data, &out).ok()?);
    }
    Some(out)
}
