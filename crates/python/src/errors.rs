//! Runtime errors as Python exceptions. A fault inside a call (a trap, fuel or memory spent,
//! the deadline, an output the contract refuses, a codec's own error) is
//! `lsgd_torch.PluginFault`, carrying the plugin, the call and the step; what is wrong before
//! any call (a missing file, the wrong kind of plugin, a bad parameter, a bad run shape) is a
//! `FileNotFoundError` or `ValueError`. The messages are the ones lsgd-host prints, with
//! lsgd-torch's names where they tell the user what to change ([`PYTHON`]).

use lsgd_runtime::Error;
use lsgd_runtime::plugin::{Fault, Knob, PluginError, PolicyKind, Style, Words};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// lsgd-torch's words: the classes that take each kind of plugin and the keyword arguments
/// that set each limit, for the messages that tell the user what to change.
pub static PYTHON: Words = Words {
    names: &[
        (Knob::Plugin(PolicyKind::Schedule), "WasmLR"),
        (Knob::Plugin(PolicyKind::BatchSize), "WasmBatchSize"),
        (
            Knob::Plugin(PolicyKind::LabelSmoothing),
            "WasmLabelSmoothing",
        ),
        (Knob::Plugin(PolicyKind::Codec), "CodecState"),
        (Knob::Plugin(PolicyKind::LayerRate), "WasmLayerRate"),
        (Knob::Plugin(PolicyKind::Sync), "WasmSync"),
        (Knob::Epochs, "epochs"),
        (Knob::WorldSize, "world_size"),
        (Knob::GlobalBatch, "global_batch"),
        (Knob::ReferenceBatch, "reference_batch"),
        (Knob::BaseLr, "base_lr"),
        (Knob::MaxBatch, "max_batch"),
        (Knob::Fuel, "fuel"),
        (Knob::CodecFuelPerFloat, "fuel_per_float"),
        (Knob::DeadlineMs, "deadline_ms"),
        (Knob::MemoryMb, "memory_mb"),
        // No keyword sets the largest component: lsgd-torch keeps the host's default.
    ],
    style: Style::Keyword,
    fuel_remedies: [
        "raise it with the fuel= argument",
        "raise it with the fuel_per_float= argument",
    ],
    not_found: "give the plugin's path, or add the folder that holds it to LSGD_PLUGIN_PATH",
};

/// The Python exception for a runtime error.
pub fn to_py(e: impl Into<Error>) -> PyErr {
    match e.into() {
        Error::Plugin(p) => plugin_to_py(p),
        e @ Error::NotFound { .. } => PyFileNotFoundError::new_err(e.to_string()),
        Error::Wasm(m) => PyRuntimeError::new_err(m),
        e => PyValueError::new_err(e.to_string()),
    }
}

/// The Python exception for a fault of one plugin.
pub fn plugin_to_py(e: PluginError) -> PyErr {
    match e.fault {
        Fault::Load(_) | Fault::Param(_) | Fault::Configure(_) => {
            PyValueError::new_err(e.worded(&PYTHON).to_string())
        }
        _ => Python::attach(|py| fault(py, &e)),
    }
}

/// `lsgd_torch.PluginFault(plugin, call, step, message)`.
fn fault(py: Python<'_>, e: &PluginError) -> PyErr {
    let message = e.worded(&PYTHON).to_string();
    let made = py
        .import("lsgd_torch.errors")
        .and_then(|m| m.getattr("PluginFault"))
        .and_then(|cls| cls.call1((&*e.plugin, e.call, e.step, &message)));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        // The package's Python half is missing (the bare extension imported alone).
        Err(_) => PyRuntimeError::new_err(message),
    }
}
