//! Runtime errors as Python exceptions. A fault inside a call (a trap, fuel or memory spent,
//! the deadline, an output the contract refuses, a codec's own error) is
//! `lsgd_torch.PluginFault`, carrying the plugin, the call and the step; what is wrong before
//! any call (a missing file, the wrong kind of plugin, a bad parameter, a bad run shape) is a
//! `FileNotFoundError` or `ValueError` with the message the CLI prints.

use lsgd_runtime::Error;
use lsgd_runtime::plugin::{Fault, PluginError};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

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
            PyValueError::new_err(e.to_string())
        }
        _ => Python::attach(|py| fault(py, &e)),
    }
}

/// `lsgd_torch.PluginFault(plugin, call, step, message)`.
fn fault(py: Python<'_>, e: &PluginError) -> PyErr {
    let made = py
        .import("lsgd_torch.errors")
        .and_then(|m| m.getattr("PluginFault"))
        .and_then(|cls| cls.call1((&*e.plugin, e.call, e.step, e.to_string())));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        // The package's Python half is missing (the bare extension imported alone).
        Err(_) => PyRuntimeError::new_err(e.to_string()),
    }
}
