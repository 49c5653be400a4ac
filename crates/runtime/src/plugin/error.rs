//! Errors of the plugin runtime. Every fault names the plugin file, the call and, where there is
//! one, the training step, because a user staring at a failed 90-epoch run needs all three.

/// What went wrong inside or around a plugin.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Fault {
    /// The file could not be read, is not a component, or does not implement a supported world.
    #[error("{0}")]
    Load(String),
    /// The host rejected a parameter before the plugin saw it (unknown name, wrong type).
    #[error("bad parameter: {0}")]
    Param(String),
    /// The plugin's own `configure` returned an error.
    #[error("rejected its parameters: {0}")]
    Configure(String),
    /// The guest trapped (panic, unreachable, out-of-bounds access ...).
    #[error("trapped: {0}")]
    Trap(String),
    /// The call ran past its wall-clock backstop.
    #[error(
        "exceeded its {ms} ms wall-clock deadline (a backstop; raise it with --plugin-deadline-ms)"
    )]
    Deadline { ms: u64 },
    /// The call used up its fuel: the same on every rank, whatever the machine's load.
    #[error(
        "ran out of its {units}-unit fuel budget (deterministic: every rank stops here; {remedy})"
    )]
    Fuel {
        /// The budget of the call.
        units: u64,
        /// How to raise it, e.g. `raise it with --plugin-fuel`.
        remedy: &'static str,
    },
    /// The guest tried to grow its memory past the cap.
    #[error(
        "tried to grow its memory to {} MiB, over the {} MiB cap (raise it with --plugin-memory-mb)",
        .requested.div_ceil(1 << 20),
        .cap >> 20
    )]
    MemoryCap { cap: usize, requested: usize },
    /// The call returned a value the host refuses (NaN learning rate, batch 0 ...).
    #[error("returned an invalid value: {0}")]
    BadOutput(String),
    /// A codec call returned its own error (e.g. a malformed payload).
    #[error("returned an error: {0}")]
    Refused(String),
    /// `--on-plugin-fault hold-last` held the last good output through this many faults in a
    /// row and gave up at this one.
    #[error(
        "{last} ({faults} faults in a row: --on-plugin-fault hold-last gave up, see --max-plugin-faults)"
    )]
    GaveUp { faults: u32, last: Box<Fault> },
}

/// A plugin fault with the context needed to find it: file, call, step.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "plugin {plugin}: {call}{}: {fault}{}",
    at_step(*.step),
    stderr_tail(.guest_stderr.as_deref())
)]
pub struct PluginError {
    /// The plugin as the user named it (its file path).
    pub plugin: String,
    /// The WIT function (or load stage) that failed, e.g. `learning-rate`.
    pub call: &'static str,
    /// The training step of the call, when the call had one.
    pub step: Option<u64>,
    /// What went wrong.
    pub fault: Fault,
    /// The tail of what the guest wrote to stderr, e.g. a Rust panic message.
    pub guest_stderr: Option<String>,
}

impl PluginError {
    /// A fault outside any step (loading, describe, configure).
    pub fn new(plugin: impl Into<String>, call: &'static str, fault: Fault) -> Self {
        PluginError {
            plugin: plugin.into(),
            call,
            step: None,
            fault,
            guest_stderr: None,
        }
    }

    /// The same error, attributed to a training step.
    pub fn at_step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }
}

/// ` at step N`, when the call had a step.
fn at_step(step: Option<u64>) -> String {
    step.map(|s| format!(" at step {s}")).unwrap_or_default()
}

/// The guest's stderr on indented lines after the message, when it wrote anything.
fn stderr_tail(stderr: Option<&str>) -> String {
    match stderr.filter(|s| !s.trim().is_empty()) {
        Some(err) => format!(
            "\n  plugin stderr: {}",
            err.trim_end().replace('\n', "\n    ")
        ),
        None => String::new(),
    }
}

/// A wasmtime error with its chain of causes on one line.
pub fn wasm_msg(e: &wasmtime::Error) -> String {
    format!("{e:#}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_plugin_the_call_the_step_and_the_guest_stderr() {
        let e = PluginError::new("w.wasm", "configure", Fault::Param("x".into()));
        assert_eq!(e.to_string(), "plugin w.wasm: configure: bad parameter: x");
        let mut e = PluginError::new("w.wasm", "learning-rate", Fault::Trap("boom".into()));
        e.guest_stderr = Some("panicked at\nsrc/lib.rs:3\n".into());
        assert_eq!(
            e.at_step(7).to_string(),
            "plugin w.wasm: learning-rate at step 7: trapped: boom\n  plugin stderr: panicked at\n    src/lib.rs:3"
        );
        let cap = Fault::MemoryCap {
            cap: 64 << 20,
            requested: (64 << 20) + 1,
        };
        assert_eq!(
            cap.to_string(),
            "tried to grow its memory to 65 MiB, over the 64 MiB cap (raise it with --plugin-memory-mb)"
        );
        let mut quiet = PluginError::new("w.wasm", "epsilon", Fault::Deadline { ms: 10 });
        quiet.guest_stderr = Some(" \n".into());
        assert_eq!(
            quiet.to_string(),
            "plugin w.wasm: epsilon: exceeded its 10 ms wall-clock deadline (a backstop; raise it \
             with --plugin-deadline-ms)"
        );
        let fuel = Fault::Fuel {
            units: 1000,
            remedy: "raise it with --plugin-fuel",
        };
        assert_eq!(
            PluginError::new("w.wasm", "epsilon", fuel)
                .at_step(4)
                .to_string(),
            "plugin w.wasm: epsilon at step 4: ran out of its 1000-unit fuel budget \
             (deterministic: every rank stops here; raise it with --plugin-fuel)"
        );
    }
}
