//! Errors of the plugin runtime. Every fault names the plugin file, the call and, where there is
//! one, the training step, because a user staring at a failed 90-epoch run needs all three.

use super::guest::{self, GuestReport};
use super::words::{CLI, Knob, Words};

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
    #[error("{}", deadline_text(*.ms, &CLI))]
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
    #[error("{}", memory_text(*.cap, *.requested, &CLI))]
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

/// A plugin fault with the context needed to find it: file, call, step. A trap leads with what
/// the guest said (a Python exception, a Rust panic's message, a C/Go/JavaScript error line;
/// see [`super::guest`]), then the rest of its report, then the wasm trap and its backtrace.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginError {
    /// The plugin as the user named it (its file path).
    pub plugin: Box<str>,
    /// The WIT function (or load stage) that failed, e.g. `learning-rate`.
    pub call: &'static str,
    /// The training step of the call, when the call had one.
    pub step: Option<u64>,
    /// What went wrong.
    pub fault: Fault,
    /// What the guest wrote to stderr (its last 16 KiB), e.g. a Rust panic message or a
    /// Python traceback.
    pub guest_stderr: Option<Box<str>>,
    /// The wasm frames of a trap, innermost first, as wasmtime prints them.
    pub backtrace: Option<Box<str>>,
}

impl PluginError {
    /// A fault outside any step (loading, describe, configure).
    pub fn new(plugin: impl Into<String>, call: &'static str, fault: Fault) -> Self {
        PluginError {
            plugin: plugin.into().into_boxed_str(),
            call,
            step: None,
            fault,
            guest_stderr: None,
            backtrace: None,
        }
    }

    /// The error as a caller whose users name the limits in `words` shows it (its `Display`
    /// uses lsgd-host's flags, [`CLI`]).
    pub fn worded<'a>(&'a self, words: &'a Words) -> Worded<'a> {
        Worded { error: self, words }
    }

    /// The same error, attributed to a training step.
    pub fn at_step(mut self, step: u64) -> Self {
        self.step = Some(step);
        self
    }

    /// What the guest said, read in its language's terms ([`super::guest::report`]).
    pub fn guest_report(&self) -> Option<GuestReport> {
        self.guest_stderr.as_deref().and_then(guest::report)
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.worded(&CLI).fmt(f)
    }
}

/// A [`PluginError`] shown in a caller's words ([`PluginError::worded`]).
#[derive(Debug, Clone, Copy)]
pub struct Worded<'a> {
    error: &'a PluginError,
    words: &'a Words,
}

impl Worded<'_> {
    /// The fault, a limit it tells the user to raise named in the caller's words.
    fn fault_text(&self) -> String {
        match self.error.fault {
            Fault::Deadline { ms } => deadline_text(ms, self.words),
            Fault::MemoryCap { cap, requested } => memory_text(cap, requested, self.words),
            ref fault => fault.to_string(),
        }
    }
}

impl std::fmt::Display for Worded<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = self.error;
        write!(f, "plugin {}: {}{}: ", e.plugin, e.call, at_step(e.step))?;
        match (&e.fault, e.guest_report()) {
            (Fault::Trap(reason), Some(report)) => {
                write!(f, "trapped: {}", report.headline)?;
                for line in &report.details {
                    write!(f, "\n  {line}")?;
                }
                write!(f, "\n  {reason}")?;
            }
            (_, report) => {
                write!(f, "{}", self.fault_text())?;
                if let Some(report) = report {
                    write!(f, "\n  plugin stderr: {}", report.headline)?;
                    for line in &report.details {
                        write!(f, "\n    {line}")?;
                    }
                }
            }
        }
        if let Some(backtrace) = e.backtrace.as_deref().filter(|b| !b.trim().is_empty()) {
            write!(f, "\n  wasm backtrace:")?;
            for line in backtrace.trim_end().lines() {
                write!(f, "\n  {line}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for PluginError {}

/// [`Fault::Deadline`]'s message, naming the setting in `words`.
fn deadline_text(ms: u64, words: &Words) -> String {
    let remedy = words.raise(Knob::DeadlineMs).map(|r| format!("; {r}"));
    format!(
        "exceeded its {ms} ms wall-clock deadline (a backstop{})",
        remedy.unwrap_or_default()
    )
}

/// [`Fault::MemoryCap`]'s message, naming the setting in `words`.
fn memory_text(cap: usize, requested: usize, words: &Words) -> String {
    let remedy = words.raise(Knob::MemoryMb).map(|r| format!(" ({r})"));
    format!(
        "tried to grow its memory to {} MiB, over the {} MiB cap{}",
        requested.div_ceil(1 << 20),
        cap >> 20,
        remedy.unwrap_or_default()
    )
}

/// ` at step N`, when the call had a step.
fn at_step(step: Option<u64>) -> String {
    step.map(|s| format!(" at step {s}")).unwrap_or_default()
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
        let mut e = PluginError::new(
            "w.wasm",
            "learning-rate",
            Fault::Trap("wasm trap: wasm `unreachable` instruction executed".into()),
        );
        e.guest_stderr = Some("thread '<unnamed>' panicked at src/lib.rs:3:5:\nboom\n".into());
        e.backtrace = Some("    0: 0x1a2 - <unknown>!<wasm function 3>\n".into());
        assert_eq!(
            e.at_step(7).to_string(),
            "plugin w.wasm: learning-rate at step 7: trapped: boom (panicked at src/lib.rs:3:5)\n  \
             wasm trap: wasm `unreachable` instruction executed\n  wasm backtrace:\n      0: \
             0x1a2 - <unknown>!<wasm function 3>"
        );
        let mut noisy = PluginError::new("w.wasm", "epsilon", Fault::Deadline { ms: 10 });
        noisy.guest_stderr = Some("still here\nand here\n".into());
        assert_eq!(
            noisy.to_string(),
            "plugin w.wasm: epsilon: exceeded its 10 ms wall-clock deadline (a backstop; raise it \
             with --plugin-deadline-ms)\n  plugin stderr: still here\n    and here"
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

    #[test]
    fn a_caller_shows_the_limits_in_its_own_words() {
        static KW: Words = Words {
            names: &[(Knob::DeadlineMs, "deadline_ms")],
            style: super::super::words::Style::Keyword,
            ..CLI
        };
        let e = PluginError::new("w.wasm", "epsilon", Fault::Deadline { ms: 10 });
        assert_eq!(
            e.worded(&KW).to_string(),
            "plugin w.wasm: epsilon: exceeded its 10 ms wall-clock deadline (a backstop; raise it \
             with the deadline_ms= argument)"
        );
        // A limit the caller's users cannot set is not offered.
        let cap = Fault::MemoryCap {
            cap: 64 << 20,
            requested: (64 << 20) + 1,
        };
        assert_eq!(
            PluginError::new("w.wasm", "epsilon", cap)
                .worded(&KW)
                .to_string(),
            "plugin w.wasm: epsilon: tried to grow its memory to 65 MiB, over the 64 MiB cap"
        );
    }
}
