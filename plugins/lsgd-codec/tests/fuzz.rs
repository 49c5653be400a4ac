//! Every reference codec's `decode` (native build) against hostile input: random payloads and
//! mutations of valid encodings (truncated, bits flipped, bytes appended, a length field
//! overwritten, rounds dropped or added), under random bucket metas and random parameters.
//! Decode must return an error or exactly `meta.len` floats, and never panic, hang, or make an
//! allocation larger than the input justifies. `configure` and `encode` are exercised on the
//! way (random parameters, inconsistent metas) and must not panic either.
//!
//! Quick by default; `scripts/fuzz.sh` runs the same properties for a set time (see
//! `fuzz/harness.rs`).

#[path = "fuzz/harness.rs"]
mod harness;
#[path = "fuzz/inputs.rs"]
mod inputs;

use lsgd_codec::{DynCodec, Meta, NAMES, ParamType, Value, native};
use proptest::prelude::*;
use proptest::sample::Index;

use harness::{check, fuzz, largest_allocation};
use inputs::{Payloads, data, encoding, meta, payloads};

#[global_allocator]
static ALLOC: harness::Metered = harness::Metered;

/// A parameter value for the codec's `index`-th parameter: the default half the time,
/// otherwise a pick from values at and beyond the edges of what codecs accept.
#[derive(Clone, Debug)]
struct ParamPick {
    use_default: bool,
    choice: Index,
    float_list: Vec<f64>,
}

fn param_pick() -> impl Strategy<Value = ParamPick> {
    (
        any::<bool>(),
        any::<Index>(),
        prop::collection::vec(
            prop_oneof![Just(0.0), Just(0.5), Just(1.0), Just(-1.0), Just(f64::NAN)],
            0..4,
        ),
    )
        .prop_map(|(use_default, choice, float_list)| ParamPick {
            use_default,
            choice,
            float_list,
        })
}

const INTEGERS: [i64; 12] = [0, 1, 2, 3, 7, 16, 127, 128, 4096, -1, 1 << 16, i64::MAX];
const FLOATS: [f64; 10] = [
    0.0,
    1e-9,
    0.01,
    0.25,
    1.0,
    2.0,
    -1.0,
    f64::NAN,
    f64::INFINITY,
    1e300,
];

/// The codec `name` configured from `picks`; its default configuration when the picks are
/// refused (which `configure` must do with an error, not a panic).
fn configured(name: &str, picks: &[ParamPick]) -> Box<dyn DynCodec> {
    let defaults = || native(name, Vec::new()).unwrap().unwrap();
    let specs = defaults().info().params;
    let given: Vec<(String, Value)> = specs
        .iter()
        .zip(picks)
        .filter(|(_, p)| !p.use_default)
        .map(|(s, p)| {
            let v = match &s.ty {
                ParamType::Boolean => Value::Boolean(p.choice.index(2) == 1),
                ParamType::Integer => Value::Integer(*p.choice.get(&INTEGERS)),
                ParamType::Float => Value::Float(*p.choice.get(&FLOATS)),
                ParamType::Text => Value::Text(["", "x", "rank"][p.choice.index(3)].into()),
                ParamType::FloatList => Value::FloatList(p.float_list.clone()),
                ParamType::Choice(words) => Value::Text(words[p.choice.index(words.len())].clone()),
            };
            (s.name.clone(), v)
        })
        .collect();
    native(name, given).unwrap().unwrap_or_else(|_| defaults())
}

#[derive(Clone, Debug)]
struct Case {
    codec: Index,
    params: Vec<ParamPick>,
    meta: Meta,
    payloads: Payloads,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<Index>(),
        prop::collection::vec(param_pick(), 4),
        meta(),
        payloads(),
    )
        .prop_map(|(codec, params, meta, payloads)| Case {
            codec,
            params,
            meta,
            payloads,
        })
}

fn decode_case(c: Case) -> Result<(), TestCaseError> {
    let name = c.codec.get(&NAMES);
    let codec = configured(name, &c.params);
    let rounds = codec.properties().rounds.max(1);
    let mut meta = c.meta;
    meta.round = rounds - 1;
    let Some(payloads) = c.payloads.build(codec.as_ref(), &meta) else {
        return Ok(());
    };
    let (out, largest) = largest_allocation(|| codec.decode(&meta, &payloads));
    let input: usize = payloads.iter().map(Vec::len).sum();
    // Decode may build the output, a copy of the payload and per-tensor scratch of the
    // bucket's size in binary64; anything beyond that was sized from a claim in the input.
    let bound = 16 * (meta.len as usize + input) + (64 << 10);
    check(largest <= bound, || {
        format!(
            "{name}: one allocation of {largest} bytes for {input} payload bytes and a bucket of {}",
            meta.len
        )
    })?;
    if let Ok(floats) = out {
        check(floats.len() == meta.len as usize, || {
            format!(
                "{name}: decode returned {} floats for a bucket of {}",
                floats.len(),
                meta.len
            )
        })?;
    }
    Ok(())
}

#[test]
fn every_codec_decodes_hostile_payloads_to_an_error_or_a_whole_bucket() {
    fuzz("codec-decode", 3000, case(), decode_case);
}

/// Valid encodings decode: the mutation-free cases reach decode's success path, so the fuzz
/// above is not only exercising its first length check.
#[test]
fn unmutated_encodings_of_valid_layouts_decode_for_every_codec() {
    for name in NAMES {
        let codec = native(name, Vec::new()).unwrap().unwrap();
        for len in [0u32, 1, 7, 64, 1000] {
            let meta = Meta::flat("w", len, 3, 11);
            let x = data(len, 5, 7);
            let p = encoding(codec.as_ref(), &meta, &x).unwrap();
            let mut m = meta.clone();
            m.round = codec.properties().rounds - 1;
            let out = codec
                .decode(&m, &p)
                .unwrap_or_else(|e| panic!("{name} len {len}: {e}"));
            assert_eq!(out.len(), len as usize, "{name}");
        }
    }
}

/// Inputs the fuzzing found, kept as fixed cases.
#[test]
fn regressions() {
    let slice = |shape: &[u32], bucket_offset, len| lsgd_codec::TensorSlice {
        name: "t".into(),
        shape: shape.to_vec(),
        tensor_offset: 0,
        bucket_offset,
        len,
    };
    let cases = [
        // powersgd: prod(shape[1..]) overflowed u32 in TensorSlice::cols (a debug-build panic,
        // a wrapped row length in release).
        ("powersgd", 2201, vec![slice(&[0, 2, 1 << 31], 0, 0)]),
        ("powersgd", 64, vec![slice(&[8, 1 << 16, 1 << 16], 0, 64)]),
        ("ef-sign", 64, vec![slice(&[64], u32::MAX, 2)]),
    ];
    for (name, len, tensors) in cases {
        let codec = native(name, Vec::new()).unwrap().unwrap();
        let meta = Meta {
            len,
            tensors,
            round: codec.properties().rounds - 1,
            ..Meta::default()
        };
        let empty = vec![Vec::new(); codec.properties().rounds as usize];
        assert!(codec.decode(&meta, &empty).is_err(), "{name}: {meta:?}");
        let x = data(len, 1, 0);
        if let Some(p) = encoding(codec.as_ref(), &meta, &x) {
            let out = codec.decode(&meta, &p).unwrap();
            assert_eq!(out.len(), len as usize, "{name}");
        }
    }
}
