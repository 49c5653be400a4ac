//! The one error type of the crate. A fault inside or around one plugin is a [`PluginError`]
//! (it names the plugin, the call and the step); everything else that can go wrong before or
//! between plugin calls — a plugin that cannot be found, a run shape that makes no sense, two
//! plugins for one slot — is a variant of [`Error`]. Every message is written for the person at
//! the command line and names the flag or file to fix, in the caller's words
//! ([`crate::plugin::Words`]: lsgd-host's flags, lsgd-torch's keywords).

use crate::plugin::{PluginError, PolicyKind};

/// What went wrong in the plugin runtime.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A plugin failed to load, configure or answer.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// No plugin file under that name (see [`crate::plugin::locate`]).
    #[error(
        "no plugin file `{arg}`: not a path, and no {file} in {}{} ({hint})",
        .looked.join(", "),
        passed_over_note(.passed_over)
    )]
    NotFound {
        /// What the user typed.
        arg: String,
        /// The file name looked for.
        file: String,
        /// The directories searched, in order.
        looked: Vec<String>,
        /// Directories of the name looked for, which are not plugins.
        passed_over: Vec<String>,
        /// What to do, in the caller's words ([`crate::plugin::Words::not_found`]).
        hint: &'static str,
    },
    /// The run's shape (epochs, batch, world size ...) is invalid; the message names the flag.
    #[error("{0}")]
    Shape(String),
    /// A component's exports do not name a contract this host supports.
    #[error("{0}")]
    Contract(String),
    /// A `--set` value or a declared parameter does not fit its declaration.
    #[error("{0}")]
    Param(String),
    /// Two plugins were given for one slot.
    #[error("two {kind} plugins given: {first} and {second}")]
    Duplicate {
        /// The slot.
        kind: PolicyKind,
        /// The plugin already there.
        first: String,
        /// The one refused.
        second: String,
    },
    /// Two plugins of different kinds cannot be compared.
    #[error("cannot compare a {a_kind} plugin ({a}) with a {b_kind} plugin ({b})")]
    Kinds {
        /// Plugin A.
        a: String,
        /// Its kind.
        a_kind: PolicyKind,
        /// Plugin B.
        b: String,
        /// Its kind.
        b_kind: PolicyKind,
    },
    /// A native (host-compiled) codec refused its input.
    #[error("native {name}: {message}")]
    Native {
        /// The codec's describe() name.
        name: String,
        /// Its own message.
        message: String,
    },
    /// A composed schedule that cannot work (milestones that do not fit its parts, a
    /// sequential schedule beside a batch-size policy); the message names the flags.
    #[error("{0}")]
    Composition(String),
    /// An input file (a trace's metric, loss or norms file) is unreadable or malformed; the
    /// message names the file and line.
    #[error("{0}")]
    Input(String),
    /// wasmtime failed outside any plugin (engine setup, compiling a component).
    #[error("{0}")]
    Wasm(String),
}

/// ` (passed over: …)`, when directories of the plugin's name were skipped.
fn passed_over_note(dirs: &[String]) -> String {
    if dirs.is_empty() {
        String::new()
    } else {
        format!(" (passed over: {})", dirs.join("; "))
    }
}

/// A result whose error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<wasmtime::Error> for Error {
    fn from(e: wasmtime::Error) -> Self {
        Error::Wasm(crate::plugin::error::wasm_msg(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Fault;

    #[test]
    fn a_plugin_error_converts_without_changing_its_message_or_adding_a_cause() {
        let plugin = PluginError::new("w.wasm", "load", Fault::Load("not a component".into()));
        let e = Error::from(plugin.clone());
        assert_eq!(e.to_string(), plugin.to_string());
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn messages_keep_their_wording() {
        let e = Error::NotFound {
            arg: "nope".into(),
            file: "nope.wasm".into(),
            looked: vec!["a".into(), "b".into()],
            passed_over: Vec::new(),
            hint: crate::plugin::words::CLI.not_found,
        };
        assert_eq!(
            e.to_string(),
            "no plugin file `nope`: not a path, and no nope.wasm in a, b (set LSGD_PLUGIN_PATH, \
             or build the reference plugins with scripts/build-plugins.sh)"
        );
        let e = Error::Duplicate {
            kind: PolicyKind::Schedule,
            first: "a.wasm".into(),
            second: "b.wasm".into(),
        };
        assert_eq!(
            e.to_string(),
            "two schedule plugins given: a.wasm and b.wasm"
        );
        let e = Error::Kinds {
            a: "a.wasm".into(),
            a_kind: PolicyKind::Codec,
            b: "b.wasm".into(),
            b_kind: PolicyKind::Schedule,
        };
        assert_eq!(
            e.to_string(),
            "cannot compare a codec plugin (a.wasm) with a schedule plugin (b.wasm)"
        );
    }
}
