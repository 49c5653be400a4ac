//! lsgd-torch's native module (`lsgd_torch._native`): the plugins of lsgd-host loaded through
//! `lsgd-runtime`, for the Python classes of `lsgd_torch` (`python/lsgd_torch/`). Everything a
//! policy's output depends on stays here, in the runtime: the clock and its `train-state`,
//! parameter checking, the sandbox's limits, contract detection, output checks and the codecs'
//! seeds. The Python side only moves tensors and keeps PyTorch's protocols.
//!
//! - [`policy`]: a schedule, batch-size, label-smoothing, layer-rate or sync plugin with its
//!   clock (a sync plugin's plan and outer step, the clock's window);
//! - [`codec`]: a codec plugin and the metadata of the buckets it encodes;
//! - [`exchange`]: one DDP bucket through the runtime's exchange, over `torch.distributed`;
//! - [`errors`]: runtime errors as Python exceptions (`PluginFault` for a fault in a call),
//!   worded in lsgd-torch's names ([`errors::PYTHON`]: `fuel=`, `global_batch=`, `WasmLR`);
//! - [`alloc`]: the extension's allocator, which keeps the exchange's large blocks for reuse.
//!
//! A plugin given by name is looked up in `$LSGD_PLUGIN_PATH`, then in the package's own
//! `plugins/` folder, where the wheel carries the reference plugins ([`search_dirs`]); never
//! next to the process's binary, which here is the Python interpreter.

mod alloc;
mod codec;
mod errors;
mod exchange;
mod policy;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use lsgd_policy::{ParamSpec, ParamType};
use lsgd_runtime::plugin::{
    Cache, EngineOptions, Limits, Plugin, PolicyKind, Runtime, contract, locate,
};
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
        .map_err(errors::to_py)?
        .with_words(&errors::PYTHON);
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
    m.add_function(wrap_pyfunction!(plugin_dirs, m)?)?;
    let contracts: Vec<String> = contract::SUPPORTED.iter().map(|v| v.to_string()).collect();
    m.add("CONTRACTS", contracts)?;
    Ok(())
}

/// blake3 of `data`, hex: how plugins and payloads are identified (checkpoints, `check_ranks`).
#[pyfunction]
fn blake3_hex(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// Where a plugin given by a bare name is looked for, in order: the entries of
/// `$LSGD_PLUGIN_PATH` (a user's own plugins come first), then the package's `plugins/` folder.
fn search_dirs(py: Python<'_>) -> Vec<PathBuf> {
    let mut dirs = locate::plugin_path();
    // The package's folder, from where Python imported it; absent when the bare extension is
    // imported without its Python half.
    let package = py
        .import("lsgd_torch")
        .and_then(|m| m.getattr("__file__"))
        .and_then(|f| f.extract::<PathBuf>());
    if let Some(dir) = package.ok().as_deref().and_then(std::path::Path::parent) {
        dirs.push(dir.join("plugins"));
    }
    dirs
}

/// The folders a plugin name is looked up in, in order (`$LSGD_PLUGIN_PATH`'s entries, then
/// the package's `plugins/` folder).
#[pyfunction]
fn plugin_dirs(py: Python<'_>) -> Vec<PathBuf> {
    search_dirs(py)
}

/// Locates `plugin` (a path, or a name in [`search_dirs`]), loads it expecting `kind` and
/// configures it with `settings`, an integral float given for an integer parameter taken as
/// that integer.
fn load(
    py: Python<'_>,
    rt: &Runtime,
    plugin: &str,
    kind: Option<PolicyKind>,
    settings: &[(String, String)],
) -> PyResult<Plugin> {
    let dirs = search_dirs(py);
    py.detach(|| {
        let path = locate::locate_in(plugin, &dirs, rt.words())?;
        let mut loaded = rt.load(&path, kind)?;
        let settings = integral(&loaded.info().params, settings);
        loaded.configure(&settings)?;
        Ok::<_, lsgd_runtime::Error>(loaded)
    })
    .map_err(errors::to_py)
}

/// `settings` with each value of an integer parameter that Python wrote as an integral float
/// (`4.0`, from `total_iters=4.0` or a computed `epochs * 0.5`) written as the integer, so
/// that it passes the runtime's type check and its identity is that of `4`. Only floats that
/// are exactly integers below 2**53 count; anything else reaches the check unchanged and is
/// refused there.
fn integral(specs: &[ParamSpec], settings: &[(String, String)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(key, raw)| {
            let integer = specs
                .iter()
                .any(|s| s.name == *key && s.ty == ParamType::Integer);
            let whole = raw
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.fract() == 0.0 && x.abs() < 2f64.powi(53));
            match whole {
                Some(x) if integer && raw.trim().parse::<i64>().is_err() => {
                    (key.clone(), format!("{}", x as i64))
                }
                _ => (key.clone(), raw.clone()),
            }
        })
        .collect()
}
