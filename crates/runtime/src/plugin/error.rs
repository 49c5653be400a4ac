//! Errors of the plugin runtime. Every fault names the plugin file, the call and, where there is
//! one, the training step, because a user staring at a failed 90-epoch run needs all three.

use std::fmt;

/// What went wrong inside or around a plugin.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The file could not be read, is not a component, or does not implement a supported world.
    Load(String),
    /// The host rejected a parameter before the plugin saw it (unknown name, wrong type).
    Param(String),
    /// The plugin's own `configure` returned an error.
    Configure(String),
    /// The guest trapped (panic, unreachable, out-of-bounds access ...).
    Trap(String),
    /// The call ran past its deadline.
    Deadline { ms: u64 },
    /// The guest tried to grow its memory past the cap.
    MemoryCap { cap: usize, requested: usize },
    /// The call returned a value the host refuses (NaN learning rate, batch 0 ...).
    BadOutput(String),
    /// A codec call returned its own error (e.g. a malformed payload).
    Refused(String),
}

/// A plugin fault with the context needed to find it: file, call, step.
#[derive(Debug, Clone, PartialEq)]
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

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Load(m) => write!(f, "{m}"),
            Fault::Param(m) => write!(f, "bad parameter: {m}"),
            Fault::Configure(m) => write!(f, "rejected its parameters: {m}"),
            Fault::Trap(m) => write!(f, "trapped: {m}"),
            Fault::Deadline { ms } => write!(
                f,
                "exceeded its {ms} ms deadline (raise it with --plugin-deadline-ms)"
            ),
            Fault::MemoryCap { cap, requested } => write!(
                f,
                "tried to grow its memory to {} MiB, over the {} MiB cap (raise it with --plugin-memory-mb)",
                requested.div_ceil(1 << 20),
                cap >> 20
            ),
            Fault::BadOutput(m) => write!(f, "returned an invalid value: {m}"),
            Fault::Refused(m) => write!(f, "returned an error: {m}"),
        }
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {}: {}", self.plugin, self.call)?;
        if let Some(step) = self.step {
            write!(f, " at step {step}")?;
        }
        write!(f, ": {}", self.fault)?;
        if let Some(err) = self
            .guest_stderr
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        {
            write!(
                f,
                "\n  plugin stderr: {}",
                err.trim_end().replace('\n', "\n    ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for PluginError {}
