//! `Codec`: a gradient-codec plugin for the DDP comm hook of `lsgd_torch`, and `BucketMeta`, the
//! metadata of one bucket, built by the runtime's `bucket_meta` as the trainer builds it, so a
//! codec sees the same seeds under PyTorch as under `lsgd-host run`. Buffers cross as float32
//! buffers (the buffer protocol: `Tensor.numpy()`), and every codec call runs without the GIL.
//! A stateful codec's per-bucket state (contract 0.4) is kept by the caller, as the trainer's
//! `exchange::carry` keeps it: it goes into the meta (`Codec.meta(…, state=)`) and comes back
//! from `Codec.next_state`.

use std::sync::Mutex;

use lsgd_codec::wire::put_f32s;
use lsgd_codec::{Combine, Meta, Properties, TensorSlice};
use lsgd_runtime::codec::{
    bucket_meta, check_properties, sample_bucket as runtime_sample_bucket, single_rank,
};
use lsgd_runtime::plugin::{Plugin, PolicyKind};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::plugin_to_py;
use crate::exchange::writable;
use crate::{Budget, load, runtime};

/// A loaded codec plugin and its properties.
#[pyclass(module = "lsgd_torch._native", frozen)]
pub struct Codec {
    plugin: Mutex<Plugin>,
    pub(crate) properties: Properties,
    pub(crate) label: String,
}

/// The metadata of one bucket at one step on one rank (WIT `bucket-meta`, round 0), with the
/// bucket's codec state before the step.
#[pyclass(module = "lsgd_torch._native", frozen)]
pub struct BucketMeta {
    pub(crate) meta: Meta,
}

/// One tensor slice as Python passes it: name, shape, tensor offset, bucket offset, length.
type SliceArg = (String, Vec<u32>, u32, u32, u32);

#[pymethods]
impl BucketMeta {
    /// The bucket's index.
    #[getter]
    fn bucket(&self) -> u32 {
        self.meta.bucket
    }

    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.meta.step
    }

    /// Floats in the bucket.
    #[getter]
    fn len(&self) -> u32 {
        self.meta.len
    }

    /// The seed every rank shares for this bucket and step.
    #[getter]
    fn shared_seed(&self) -> u64 {
        self.meta.shared_seed
    }

    /// This rank's own seed for this bucket and step.
    #[getter]
    fn rank_seed(&self) -> u64 {
        self.meta.rank_seed
    }

    /// The bucket's codec state before this step (empty at the first step and for a codec
    /// that is not stateful).
    #[getter]
    fn state<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.meta.state)
    }

    /// The tensors it holds: `[(name, shape, tensor_offset, bucket_offset, len), …]`.
    #[getter]
    fn tensors(&self) -> Vec<SliceArg> {
        self.meta
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.shape.clone(),
                    t.tensor_offset,
                    t.bucket_offset,
                    t.len,
                )
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "BucketMeta(bucket={}, step={}, len={}, tensors={}, state={} bytes)",
            self.meta.bucket,
            self.meta.step,
            self.meta.len,
            self.meta.tensors.len(),
            self.meta.state.len()
        )
    }
}

impl Codec {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Plugin> {
        self.plugin.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The floats of a float32 buffer, checked to be `len` long.
fn floats(py: Python<'_>, data: &Bound<'_, PyAny>, len: u32, what: &str) -> PyResult<Vec<f32>> {
    let buf = PyBuffer::<f32>::get(data).map_err(|e| {
        PyValueError::new_err(format!(
            "{what}: expected a float32 buffer (a contiguous CPU float32 tensor's .numpy()): {e}"
        ))
    })?;
    if buf.item_count() != len as usize {
        return Err(PyValueError::new_err(format!(
            "{what}: {} floats for a bucket of {len}",
            buf.item_count()
        )));
    }
    buf.to_vec(py)
}

#[pymethods]
impl Codec {
    /// Loads a codec plugin (a path, or a name looked up in `plugin_dirs()`), configures it with `settings` and asks for its
    /// properties.
    #[new]
    #[pyo3(signature = (plugin, settings, *, fuel_per_float=None, deadline_ms=None,
        memory_mb=None, canonical_nans=false))]
    fn new(
        py: Python<'_>,
        plugin: &str,
        settings: Vec<(String, String)>,
        fuel_per_float: Option<u64>,
        deadline_ms: Option<u64>,
        memory_mb: Option<usize>,
        canonical_nans: bool,
    ) -> PyResult<Self> {
        let rt = runtime(Budget {
            fuel: None,
            codec_fuel_per_float: fuel_per_float,
            deadline_ms,
            memory_mb,
            canonical_codec_nans: canonical_nans,
        })?;
        let mut plugin = load(py, &rt, plugin, Some(PolicyKind::Codec), &settings)?;
        let properties = plugin.properties().map_err(plugin_to_py)?;
        let label = plugin.label().to_string();
        check_properties(&label, properties).map_err(PyValueError::new_err)?;
        Ok(Codec {
            plugin: Mutex::new(plugin),
            properties,
            label,
        })
    }

    /// The plugin file as given.
    #[getter]
    fn label(&self) -> String {
        self.label.clone()
    }

    /// `describe()`'s name.
    #[getter]
    fn name(&self) -> String {
        self.lock().info().name.clone()
    }

    /// `describe()`'s version.
    #[getter]
    fn version(&self) -> String {
        self.lock().info().version.clone()
    }

    /// blake3 of the component bytes, hex.
    #[getter]
    fn blake3(&self) -> String {
        self.lock().facts().blake3.clone()
    }

    /// The parameters in force, as text.
    #[getter]
    fn params(&self) -> Vec<(String, String)> {
        self.lock().rendered_params()
    }

    /// The line a checkpoint's identity check prints for this plugin.
    #[getter]
    fn identity(&self) -> String {
        self.lock().identity()
    }

    /// `sum` (payloads all-reduced as dense vectors of `element`) or `gather`.
    #[getter]
    fn combine(&self) -> &'static str {
        match self.properties.combine {
            Combine::Sum(_) => "sum",
            Combine::Gather => "gather",
        }
    }

    /// The element type of a summable payload (`f32`, `f16`, `bf16`), None for `gather`.
    #[getter]
    fn element(&self) -> Option<&'static str> {
        match self.properties.combine {
            Combine::Sum(e) => Some(e.name()),
            Combine::Gather => None,
        }
    }

    /// Rounds per step (PowerSGD: 2).
    #[getter]
    fn rounds(&self) -> u32 {
        self.properties.rounds
    }

    /// Whether the codec carries a state per bucket from step to step (`Codec.meta`'s `state`,
    /// `Codec.next_state`; PowerSGD with warm start).
    #[getter]
    fn stateful(&self) -> bool {
        self.properties.stateful
    }

    /// The metadata of bucket `bucket` (of `len` floats holding `tensors`) at `step` on `rank`,
    /// its seeds derived from `seed` as the trainer derives them; `state` is the bucket's codec
    /// state before the step (what `next_state` returned at the previous step, the same on
    /// every rank; empty at the first step and for a codec that is not stateful).
    #[staticmethod]
    #[pyo3(signature = (seed, step, bucket, rank, len, tensors, state=Vec::new()))]
    fn meta(
        seed: u64,
        step: u64,
        bucket: u32,
        rank: usize,
        len: u32,
        tensors: Vec<SliceArg>,
        state: Vec<u8>,
    ) -> BucketMeta {
        let tensors = tensors
            .into_iter()
            .map(
                |(name, shape, tensor_offset, bucket_offset, len)| TensorSlice {
                    name,
                    shape,
                    tensor_offset,
                    bucket_offset,
                    len,
                },
            )
            .collect();
        let mut meta = bucket_meta(seed, step, bucket, rank, len, tensors);
        meta.state = state;
        BucketMeta { meta }
    }

    /// This rank's payload for round `round` of a bucket whose float32 data is `data`;
    /// `agreed` holds the combined payloads of the earlier rounds (summable codecs).
    #[pyo3(signature = (meta, data, agreed=Vec::new(), round=0))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        meta: &BucketMeta,
        data: &Bound<'py, PyAny>,
        agreed: Vec<Vec<u8>>,
        round: u32,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let data = floats(py, data, meta.meta.len, "encode")?;
        let mut m = meta.meta.clone();
        m.round = round;
        let out = py
            .detach(|| self.lock().encode(&m, &data, &agreed))
            .map_err(plugin_to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Decodes `payloads` (the combined payload of each round, or one rank's payload of a
    /// gathered codec) into `out`, a writable float32 buffer of the bucket's length.
    #[pyo3(signature = (meta, payloads, out, round=None))]
    fn decode(
        &self,
        py: Python<'_>,
        meta: &BucketMeta,
        payloads: Vec<Vec<u8>>,
        out: &Bound<'_, PyAny>,
        round: Option<u32>,
    ) -> PyResult<()> {
        let buf = writable(out, meta.meta.len, "decode: out")?;
        let mut m = meta.meta.clone();
        m.round = round.unwrap_or(self.properties.rounds - 1);
        let floats = py
            .detach(|| self.lock().decode(&m, &payloads))
            .map_err(plugin_to_py)?;
        buf.copy_from_slice(py, &floats)
    }

    /// A stateful codec's state of the bucket for the next step, from this step's (`meta`'s)
    /// and `agreed`, what every rank received: for a summable codec the combined payload of
    /// each round, for a gathered one every rank's payload in rank order. Called once per
    /// bucket after its decode, with the same arguments on every rank (`round`: the last round
    /// unless given).
    #[pyo3(signature = (meta, agreed, round=None))]
    fn next_state<'py>(
        &self,
        py: Python<'py>,
        meta: &BucketMeta,
        agreed: Vec<Vec<u8>>,
        round: Option<u32>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut m = meta.meta.clone();
        m.round = round.unwrap_or(self.properties.rounds - 1);
        let out = py
            .detach(|| self.lock().next_state(&m, &agreed))
            .map_err(plugin_to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// One bucket through the host's exchange (the rounds, the length agreement, the sum or
    /// gather, the decodes, error feedback's own share, the next codec state), its collectives
    /// done by `mover` (`lengths(n or None) -> [n, …]`, `sum(element, payload) -> bytes`,
    /// `gather(payload) -> [bytes, …]`, each over every rank). The decoded sum over the `size`
    /// ranks replaces `data` (a writable float32 buffer of the bucket); with `residual`, error
    /// feedback's `data − own` is written into it (`own`: `decode`, the decode of this rank's
    /// payloads, or `mean`, the sum over the ranks). `failed`: this rank has a fault to tell.
    /// Returns (payloads, received, next state or None, the decode's fault or None); the first
    /// two are empty lists unless `payloads` (a test's look at what was sent).
    #[pyo3(signature = (meta, data, mover, *, rank, size, own="skip", failed=false, residual=None, payloads=false))]
    #[allow(clippy::too_many_arguments)]
    fn exchange<'py>(
        &self,
        py: Python<'py>,
        meta: &BucketMeta,
        data: &Bound<'py, PyAny>,
        mover: Py<PyAny>,
        rank: usize,
        size: usize,
        own: &str,
        failed: bool,
        residual: Option<&Bound<'py, PyAny>>,
        payloads: bool,
    ) -> PyResult<crate::exchange::Returned<'py>> {
        self.exchange_bucket(
            py, meta, data, mover, rank, size, own, failed, residual, payloads,
        )
    }

    /// One step of a bucket on a single rank, as `lsgd-host compare` runs it
    /// (`lsgd_runtime::codec::single_rank`: the exchange with each round's own payload standing
    /// in for the combined one): writes the decoded bucket into `out` (a writable float32
    /// buffer) and returns (each round's payload, the bucket's next codec state; empty for a
    /// codec that keeps none).
    fn round_trip<'py>(
        &self,
        py: Python<'py>,
        meta: &BucketMeta,
        data: &Bound<'py, PyAny>,
        out: &Bound<'py, PyAny>,
    ) -> PyResult<(Vec<Bound<'py, PyBytes>>, Bound<'py, PyBytes>)> {
        let data = floats(py, data, meta.meta.len, "round_trip")?;
        let out = writable(out, meta.meta.len, "round_trip: out")?;
        let ((payloads, decoded), next) = py
            .detach(|| single_rank(&mut *self.lock(), self.properties, &meta.meta, &data))
            .map_err(plugin_to_py)?;
        out.copy_from_slice(py, &decoded)?;
        let payloads = payloads.iter().map(|p| PyBytes::new(py, p)).collect();
        Ok((payloads, PyBytes::new(py, &next)))
    }
}

/// The reproducible sample bucket of `compare` and `bench codecs`: a `rows`×`cols` weight and a
/// `cols` bias; returns its metadata and its floats as little-endian float32 bytes.
#[pyfunction]
pub fn sample_bucket<'py>(
    py: Python<'py>,
    rows: u32,
    cols: u32,
    step: u64,
    seed: u64,
) -> (BucketMeta, Bound<'py, PyBytes>) {
    let (meta, data) = runtime_sample_bucket(rows, cols, step, seed);
    let mut bytes = Vec::with_capacity(data.len() * 4);
    put_f32s(&mut bytes, &data);
    (BucketMeta { meta }, PyBytes::new(py, &bytes))
}
