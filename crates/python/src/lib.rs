//! lsgd-torch's native module (`lsgd_torch._native`): the plugins of lsgd-host loaded through
//! `lsgd-runtime`, for the Python classes of `lsgd_torch` (`python/lsgd_torch/`). Everything a
//! policy's output depends on stays here, in the runtime: the clock and its `train-state`,
//! parameter checking, the sandbox's limits, contract detection, output checks and the codecs'
//! seeds. The Python side only moves tensors and keeps PyTorch's protocols.
//!
//! - [`policy`]: a schedule, batch-size, label-smoothing or layer-rate plugin with its clock;
//! - [`codec`]: a codec plugin and the metadata of the buckets it encodes;
//! - [`exchange`]: one DDP bucket through the runtime's exchange, over `torch.distributed`;
//! - [`errors`]: runtime errors as Python exceptions (`PluginFault` for a fault in a call);
//! - [`alloc`]: the extension's allocator, which keeps the exchange's large blocks for reuse.

mod alloc;
mod codec;
mod errors;
mod exchange;
mod policy;

use std::sync::{Arc, Mutex};

use lsgd_runtime::plugin::{Cache, EngineOptions, Limits, Runtime, contract};
use pyo3::prelude::*;

#[global_allocator]
static ALLOCATOR: alloc::Recycling = alloc::Recycling::new();

/// Limits a Python caller may set; the rest are the host's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Budget {
    fuel: Option<u64>,
    codec_fuel_per_float: Option<u64>,
    deadline_ms: Option<u64>,
    memory_mb: Option<usize>,
    canonical_codec_nans: bool,
}

impl Budget {
    fn limits(&self) -> PyResult<Limits> {
        let d = Limits::default();
        let positive = |v: Option<u64>, name: &str, default: u64| match v {
            Some(0) => Err(pyo3::exceptions::PyValueError::new_err(format!(
                "{name} must be at least 1"
            ))),
            Some(v) => Ok(v),
            None => Ok(default),
        };
        Ok(Limits {
            fuel: positive(self.fuel, "fuel", d.fuel)?,
            codec_fuel_per_float: self.codec_fuel_per_float.unwrap_or(d.codec_fuel_per_float),
            deadline_ms: positive(self.deadline_ms, "deadline_ms", d.deadline_ms)?,
            memory_bytes: match self.memory_mb {
                Some(mb) => positive(Some(mb as u64), "memory_mb", 0)? as usize * (1 << 20),
                None => d.memory_bytes,
            },
            ..d
        })
    }
}

/// One runtime (engines, linker, epoch ticker) per distinct set of limits, shared by every
/// plugin loaded with them in this process; compiled components come from the same on-disk
/// cache as the host's (`LSGD_CACHE_DIR`).
fn runtime(budget: Budget) -> PyResult<Arc<Runtime>> {
    static RUNTIMES: Mutex<Vec<(Budget, Arc<Runtime>)>> = Mutex::new(Vec::new());
    let mut all = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, rt)) = all.iter().find(|(b, _)| *b == budget) {
        return Ok(rt.clone());
    }
    let options = EngineOptions {
        canonical_codec_nans: budget.canonical_codec_nans,
        ..EngineOptions::default()
    };
    let rt = Runtime::with_options(Cache::from_env(), budget.limits()?, options)
        .map_err(errors::to_py)?;
    let rt = Arc::new(rt);
    all.push((budget, rt.clone()));
    Ok(rt)
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<policy::Policy>()?;
    m.add_class::<codec::Codec>()?;
    m.add_class::<codec::BucketMeta>()?;
    m.add_function(wrap_pyfunction!(codec::sample_bucket, m)?)?;
    m.add_function(wrap_pyfunction!(blake3_hex, m)?)?;
    let contracts: Vec<String> = contract::SUPPORTED.iter().map(|v| v.to_string()).collect();
    m.add("CONTRACTS", contracts)?;
    Ok(())
}

/// blake3 of `data`, hex: how plugins and payloads are identified (checkpoints, `check_ranks`).
#[pyfunction]
fn blake3_hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}
