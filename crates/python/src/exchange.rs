//! `Codec.exchange`: one DDP bucket through the runtime's one exchange
//! (`lsgd_runtime::exchange`), its collectives done by a Python object over `torch.distributed`
//! (`lsgd_torch.comm`'s mover: `lengths`, `sum`, `gather`). The rounds, the agreement, the
//! decodes, error feedback's own share and a stateful codec's next state are the trainer's
//! code; the plugin runs without the GIL, which the mover takes back for each collective.

use lsgd_codec::Element;
use lsgd_codec::Meta;
use lsgd_runtime::exchange::{Lengths, Mover, Own, Plan, Stop, exchange};
use lsgd_runtime::plugin::PluginError;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use crate::codec::{BucketMeta, Codec};
use crate::errors::plugin_to_py;

/// The collectives of a Python mover object, called with the GIL taken back.
struct PyMover {
    obj: Py<PyAny>,
    rank: usize,
    size: usize,
}

/// The bytes of a buffer a mover returned (`bytes`, a `bytearray`, a uint8 array).
fn bytes_of(b: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    PyBuffer::<u8>::get(b)?.to_vec(b.py())
}

impl Mover for PyMover {
    type Error = PyErr;
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn agree_lengths(&mut self, mine: Option<u64>) -> PyResult<Lengths> {
        Python::attach(|py| {
            let lens: Vec<i64> = self
                .obj
                .bind(py)
                .call_method1("lengths", (mine.map(|m| m as i64),))?
                .extract()?;
            Ok(match lens.iter().position(|&l| l < 0) {
                Some(rank) => Lengths::Failed { rank },
                None => Lengths::Agreed(lens.into_iter().map(|l| l as u64).collect()),
            })
        })
    }
    fn sum(&mut self, element: Element, payload: &[u8]) -> PyResult<Vec<u8>> {
        Python::attach(|py| {
            // A bytearray the mover may sum into in place (torch.frombuffer shares it).
            let sum = self
                .obj
                .bind(py)
                .call_method1("sum", (element.name(), PyByteArray::new(py, payload)))?;
            bytes_of(&sum)
        })
    }
    fn gather(&mut self, payload: &[u8]) -> PyResult<Vec<Vec<u8>>> {
        Python::attach(|py| {
            let all = self
                .obj
                .bind(py)
                .call_method1("gather", (PyBytes::new(py, payload),))?;
            all.try_iter()?.map(|p| bytes_of(&p?)).collect()
        })
    }
}

/// A writable, C-contiguous float32 buffer of `len` floats, or an error naming `what`.
pub(crate) fn writable(b: &Bound<'_, PyAny>, len: u32, what: &str) -> PyResult<PyBuffer<f32>> {
    let buf = PyBuffer::<f32>::get(b)
        .map_err(|e| PyValueError::new_err(format!("{what}: not a float32 buffer: {e}")))?;
    if buf.readonly() || !buf.is_c_contiguous() || buf.item_count() != len as usize {
        return Err(PyValueError::new_err(format!(
            "{what}: a writable, contiguous float32 buffer of {len} floats is needed, not {}{}{}",
            buf.item_count(),
            if buf.readonly() { " (read-only)" } else { "" },
            if buf.is_c_contiguous() {
                ""
            } else {
                " (strided)"
            },
        )));
    }
    Ok(buf)
}

/// An error unless the residual's floats and the data's are apart (the data is read in place
/// while the residual is written).
fn disjoint(data: &PyBuffer<f32>, residual: &PyBuffer<f32>) -> PyResult<()> {
    let span = |b: &PyBuffer<f32>| {
        let start = b.buf_ptr() as usize;
        (start, start + b.len_bytes())
    };
    let ((a, b), (c, d)) = (span(data), span(residual));
    match a < d && c < b {
        true => Err(PyValueError::new_err(
            "exchange: residual and data share memory; the residual needs its own buffer",
        )),
        false => Ok(()),
    }
}

/// `own=` as the exchange's [`Own`]: `skip` without a residual buffer, `decode` or `mean` with
/// one.
fn own_mode(own: &str, residual: bool) -> PyResult<Own> {
    match (own, residual) {
        ("skip", false) => Ok(Own::Skip),
        ("decode", true) => Ok(Own::Decode),
        ("mean", true) => Ok(Own::Mean),
        _ => Err(PyValueError::new_err(format!(
            "exchange: own={own:?} {} a residual buffer (skip without one; decode or mean with one)",
            if residual { "with" } else { "without" }
        ))),
    }
}

/// What one bucket's exchange returns to Python: this rank's payloads, what every rank
/// received (a stateful codec's `next_state` input), the next codec state, and the fault of a
/// decode after the collectives (raised by the caller at the next agreement).
pub(crate) type Returned<'py> = (
    Vec<Bound<'py, PyBytes>>,
    Vec<Bound<'py, PyBytes>>,
    Option<Bound<'py, PyBytes>>,
    Option<PyErr>,
);

impl Codec {
    /// [`Codec`]'s `exchange` (codec.rs holds the Python method): one bucket, `data` (a writable float32 buffer of the bucket) is encoded every
    /// round, the collectives go through `mover` (`lengths(n or None) -> [n, …]`,
    /// `sum(element, payload) -> bytes`, `gather(payload) -> [bytes, …]`), and the decoded sum
    /// over the `size` ranks is written back into `data`. With `residual` (a writable float32
    /// buffer), error feedback's `data − own` is written into it first, `own` being the decode of
    /// this rank's payloads (`own="decode"`) or the sum over the ranks (`own="mean"`). `failed`:
    /// this rank already has a fault to tell (it sends no payload; the agreement stops every
    /// rank). Returns (payloads, received, next_state or None, decode fault or None), the first
    /// two empty unless `keep`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange_bucket<'py>(
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
        keep: bool,
    ) -> PyResult<Returned<'py>> {
        let meta = &meta.meta;
        let data_buf = writable(data, meta.len, "exchange: data")?;
        let residual_buf = residual
            .map(|r| writable(r, meta.len, "exchange: residual"))
            .transpose()?;
        let own = own_mode(own, residual_buf.is_some())?;
        if let Some(r) = &residual_buf {
            disjoint(&data_buf, r)?;
        }
        // SAFETY: `data_buf` holds the exporter (its memory stays put) and was checked to be
        // C-contiguous float32 of `meta.len` items; the bucket is read in place instead of
        // copied, and nothing writes it while `floats` is in use: the residual is disjoint
        // (checked above) and `data` itself is written only after `floats`' last use.
        let floats = unsafe {
            std::slice::from_raw_parts(data_buf.buf_ptr() as *const f32, meta.len as usize)
        };
        let plan = Plan {
            properties: self.properties,
            own,
            failed,
        };
        let mut mover = PyMover {
            obj: mover,
            rank,
            size,
        };
        let done = py.detach(|| {
            exchange(&mut *self.lock(), &mut mover, meta, floats, plan).map_err(Box::new)
        });
        let done = done.map_err(|stop| self.stopped(*stop, meta))?;
        let bytes = |v: &[Vec<u8>]| match keep {
            true => v.iter().map(|p| PyBytes::new(py, p)).collect(),
            false => Vec::new(),
        };
        let (payloads, received) = (bytes(&done.payloads), bytes(&done.received));
        let decoded = match done.decoded {
            Ok(d) => d,
            Err(e) => return Ok((payloads, received, None, Some(plugin_to_py(e)))),
        };
        if let Some(r) = &residual_buf {
            // SAFETY: as for `floats`, and disjoint from it; `r` is writable.
            let e = unsafe {
                std::slice::from_raw_parts_mut(r.buf_ptr() as *mut f32, meta.len as usize)
            };
            for ((e, p), o) in e.iter_mut().zip(floats).zip(&decoded.own) {
                *e = p - o;
            }
        }
        data_buf.copy_from_slice(py, &decoded.sum)?;
        let next = decoded.next.map(|n| PyBytes::new(py, &n));
        Ok((payloads, received, next, None))
    }

    /// The Python exception for an exchange that stopped every rank.
    fn stopped(&self, stop: Stop<PyErr, PluginError>, meta: &Meta) -> PyErr {
        match stop {
            Stop::Move(e) => e,
            Stop::Codec { here: Some(e), .. } => plugin_to_py(e),
            // This rank's own earlier fault, which the caller raises.
            Stop::Codec {
                rank,
                round,
                here: None,
            } => PyRuntimeError::new_err(format!(
                "codec {}: stopped at the agreement of bucket {} round {round}: rank {rank} failed",
                self.label, meta.bucket
            )),
            Stop::Lengths {
                round,
                lengths,
                element,
            } => PyRuntimeError::new_err(format!(
                "codec {} at step {} (bucket {}, round {round}): a summable payload must have the same length on every rank and hold whole {} elements, but the lengths are {lengths:?}",
                self.label,
                meta.step,
                meta.bucket,
                element.name()
            )),
        }
    }
}
