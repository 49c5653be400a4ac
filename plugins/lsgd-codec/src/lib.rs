//! The codec interface of `lsgd:policy` (0.2.0, and 0.4.0's codec state) as plain Rust, plus the
//! reference codecs.
//!
//! As with `lsgd-policy`, one copy of every algorithm serves two places: compiled natively into
//! `lsgd-host` (the native side of `bench codecs`, and `compare` baselines) and compiled to
//! `wasm32-wasip2` in each `plugins/codec-*` component. Hot loops have an explicit wasm SIMD
//! path (`#[cfg(target_arch = "wasm32")]`) and a portable one the native compiler vectorises.
//!
//! A guest crate exports a codec with two lines:
//!
//! ```ignore
//! wit_bindgen::generate!({ path: "../../wit/v0.2.0", world: "codec-plugin" });
//! lsgd_codec::export_codec!(lsgd_codec::int8::Int8);
//! ```

#![warn(missing_docs)]

pub use lsgd_policy;
pub use lsgd_policy::{Info, ParamSpec, ParamType, Params, Policy, Value};

mod export;
pub mod rng;
pub mod wire;

pub mod bf16;
pub mod dgc;
pub mod ef_sign;
pub mod fp16;
pub mod identity;
pub mod int8;
pub mod natural;
pub mod powersgd;
pub mod qsgd;
pub mod random_k;
pub mod sign;
pub mod sparse;
pub mod terngrad;
pub mod threshold;
pub mod top_k;

/// Where one tensor lies inside a bucket (WIT `tensor-slice`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TensorSlice {
    /// The parameter's name.
    pub name: String,
    /// The whole tensor's shape, outermost first.
    pub shape: Vec<u32>,
    /// First element of the slice within the flattened tensor (a multiple of the row length).
    pub tensor_offset: u32,
    /// First element of the slice within the bucket.
    pub bucket_offset: u32,
    /// Elements in the slice.
    pub len: u32,
}

impl TensorSlice {
    /// A whole tensor of `shape` named `name`, at `bucket_offset` in its bucket.
    pub fn whole(name: &str, shape: &[u32], bucket_offset: u32) -> TensorSlice {
        TensorSlice {
            name: name.to_owned(),
            shape: shape.to_vec(),
            tensor_offset: 0,
            bucket_offset,
            len: shape.iter().product(),
        }
    }

    /// Row length prod(shape[1..]) (1 for a vector or scalar): the slice is `len / cols` whole
    /// rows of the tensor viewed as a matrix. A product above `u32::MAX` (a shape no bucket can
    /// hold a row of, so only a hostile meta has one) saturates rather than overflowing.
    pub fn cols(&self) -> u32 {
        let cols = self
            .shape
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(u64::from(d)));
        cols.clamp(1, u64::from(u32::MAX)) as u32
    }

    /// The bucket range of this slice (saturating, so a hostile offset cannot overflow).
    pub fn range(&self) -> core::ops::Range<usize> {
        let start = self.bucket_offset as usize;
        start..start.saturating_add(self.len as usize)
    }
}

/// What a codec may know about the bucket it is called on (WIT `bucket-meta`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Meta {
    /// Bucket index, stable for the whole run.
    pub bucket: u32,
    /// Optimiser step.
    pub step: u64,
    /// Round of this call (the last round, for `decode`).
    pub round: u32,
    /// Floats in the bucket.
    pub len: u32,
    /// The tensors of the bucket, in order.
    pub tensors: Vec<TensorSlice>,
    /// Equal on every rank for this (run, step, bucket).
    pub shared_seed: u64,
    /// Different on every rank for this (run, step, bucket).
    pub rank_seed: u64,
    /// The bucket's codec state before this step (contract 0.4), the same on every rank: what
    /// [`Codec::next_state`] returned at the previous step; empty at the first step and for a
    /// codec that is not [`Properties::stateful`].
    pub state: Vec<u8>,
}

impl Meta {
    /// A bucket of one flat tensor of `len` floats named `name`, as tests and benchmarks use.
    pub fn flat(name: &str, len: u32, step: u64, seed: u64) -> Meta {
        Meta {
            bucket: 0,
            step,
            round: 0,
            len,
            tensors: vec![TensorSlice::whole(name, &[len], 0)],
            shared_seed: seed,
            rank_seed: seed ^ 0x9e37_79b9_7f4a_7c15,
            state: Vec::new(),
        }
    }
}

/// The element type of a summable payload (WIT `element`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// binary32, little-endian.
    F32,
    /// binary16, little-endian.
    F16,
    /// bfloat16, little-endian.
    Bf16,
}

impl Element {
    /// Every element type.
    pub const ALL: [Element; 3] = [Element::F32, Element::F16, Element::Bf16];

    /// `f32`, `f16` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Element::F32 => "f32",
            Element::F16 => "f16",
            Element::Bf16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Element::F32 => 4,
            Element::F16 | Element::Bf16 => 2,
        }
    }
}

/// How the payloads of different ranks combine (WIT `combine`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// All-gather the payloads, decode each, sum the floats.
    Gather,
    /// All-reduce the payloads as dense vectors of this element type.
    Sum(Element),
}

/// How the host must move a codec's payloads (WIT `codec-properties`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Properties {
    /// How payloads combine.
    pub combine: Combine,
    /// Rounds per step, at least 1.
    pub rounds: u32,
    /// Whether the codec carries state from step to step ([`Meta::state`],
    /// [`Codec::next_state`]; contract 0.4).
    pub stateful: bool,
}

impl Properties {
    /// One round, payloads all-gathered.
    pub const GATHER: Properties = Properties {
        combine: Combine::Gather,
        rounds: 1,
        stateful: false,
    };

    /// One round, payloads summed as `element` vectors.
    pub const fn sum(element: Element) -> Properties {
        Properties {
            combine: Combine::Sum(element),
            rounds: 1,
            stateful: false,
        }
    }
}

/// A gradient-compression codec (WIT interface `codec`). Implementations hold only their
/// configuration: every call is a pure function of it and the arguments, the bucket's state
/// ([`Meta::state`]) included.
pub trait Codec: Policy {
    /// How payloads combine and how many rounds a step takes.
    fn properties(&self) -> Properties;

    /// Encodes round `meta.round` of `data` (`meta.len` floats); `agreed` holds the combined
    /// payloads of the earlier rounds.
    fn encode(&self, meta: &Meta, data: &[f32], agreed: &[Vec<u8>]) -> Result<Vec<u8>, String>;

    /// Decodes one payload per round into exactly `meta.len` floats.
    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String>;

    /// The bucket's state for the next step from this step's (`meta.state`) and what every
    /// rank received (`agreed`: each round's combined payload, or every rank's payload of a
    /// gathered codec); called only when [`Properties::stateful`]. The default keeps none.
    fn next_state(&self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        let _ = (meta, agreed);
        Ok(Vec::new())
    }
}

/// A configured codec behind a trait object, for hosts that pick one by name at run time.
pub trait DynCodec {
    /// What `describe` returns.
    fn info(&self) -> Info;
    /// [`Codec::properties`].
    fn properties(&self) -> Properties;
    /// [`Codec::encode`].
    fn encode(&self, meta: &Meta, data: &[f32], agreed: &[Vec<u8>]) -> Result<Vec<u8>, String>;
    /// [`Codec::decode`].
    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String>;
    /// [`Codec::next_state`].
    fn next_state(&self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, String>;
}

/// A [`Codec`] as a [`DynCodec`] (a wrapper, so the two traits' methods never clash on `C`).
struct Dynamic<C>(C);

impl<C: Codec> DynCodec for Dynamic<C> {
    fn info(&self) -> Info {
        C::info()
    }
    fn properties(&self) -> Properties {
        self.0.properties()
    }
    fn encode(&self, meta: &Meta, data: &[f32], agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        self.0.encode(meta, data, agreed)
    }
    fn decode(&self, meta: &Meta, payloads: &[Vec<u8>]) -> Result<Vec<f32>, String> {
        self.0.decode(meta, payloads)
    }
    fn next_state(&self, meta: &Meta, agreed: &[Vec<u8>]) -> Result<Vec<u8>, String> {
        self.0.next_state(meta, agreed)
    }
}

/// `codec` behind a trait object.
pub fn dynamic<C: Codec + 'static>(codec: C) -> Box<dyn DynCodec> {
    Box::new(Dynamic(codec))
}

fn build<C: Codec + 'static>(given: Vec<(String, Value)>) -> Result<Box<dyn DynCodec>, String> {
    let params = Params::resolve(&C::info().params, given)?;
    Ok(dynamic(C::configure(&params)?))
}

/// Every reference codec's `describe()` name, in the order `bench codecs` reports them.
pub const NAMES: [&str; 14] = [
    "identity",
    "fp16",
    "bf16",
    "int8",
    "qsgd",
    "terngrad",
    "top-k",
    "dgc",
    "random-k",
    "threshold",
    "sign",
    "ef-sign",
    "natural",
    "powersgd",
];

/// The reference codec named `name` (its `describe()` name), configured with `given` over its
/// defaults; `None` for an unknown name.
pub fn native(
    name: &str,
    given: Vec<(String, Value)>,
) -> Option<Result<Box<dyn DynCodec>, String>> {
    Some(match name {
        "identity" => build::<identity::Identity>(given),
        "fp16" => build::<fp16::Fp16>(given),
        "bf16" => build::<bf16::Bf16>(given),
        "int8" => build::<int8::Int8>(given),
        "qsgd" => build::<qsgd::Qsgd>(given),
        "terngrad" => build::<terngrad::TernGrad>(given),
        "top-k" => build::<top_k::TopK>(given),
        "dgc" => build::<dgc::Dgc>(given),
        "random-k" => build::<random_k::RandomK>(given),
        "threshold" => build::<threshold::Threshold>(given),
        "sign" => build::<sign::Sign>(given),
        "ef-sign" => build::<ef_sign::EfSign>(given),
        "natural" => build::<natural::Natural>(given),
        "powersgd" => build::<powersgd::PowerSgd>(given),
        _ => return None,
    })
}

/// decode(encode(data)) as on a single rank: every round is encoded from `data`, this rank's
/// payloads of the earlier rounds standing in for the combined ones. Returns the payloads (one
/// per round) and the reconstruction. A test oracle, kept apart from what runs: the reference
/// codecs' unit tests check their inverse with it, and `lsgd_runtime::exchange` (the one
/// exchange `run`, `compare`, `bench` and lsgd-torch share) is tested against it.
pub fn round_trip(
    codec: &dyn DynCodec,
    meta: &Meta,
    data: &[f32],
) -> Result<(Vec<Vec<u8>>, Vec<f32>), String> {
    let rounds = codec.properties().rounds.max(1);
    let mut payloads = Vec::with_capacity(rounds as usize);
    let mut m = meta.clone();
    for r in 0..rounds {
        m.round = r;
        let p = codec.encode(&m, data, &payloads)?;
        payloads.push(p);
    }
    let out = codec.decode(&m, &payloads)?;
    if out.len() != meta.len as usize {
        return Err(format!(
            "decode returned {} floats for a bucket of {}",
            out.len(),
            meta.len
        ));
    }
    Ok((payloads, out))
}
