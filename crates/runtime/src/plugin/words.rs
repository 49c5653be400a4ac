//! The names a message gives the settings it tells the user to change. The runtime has two
//! callers whose users spell them differently: lsgd-host's command line (`--plugin-fuel`,
//! `--global-batch 250`, `--schedule`) and lsgd-torch's Python keywords (`fuel=`,
//! `global_batch=250`, `WasmLR`). Each caller hands its [`Words`] to the runtime
//! ([`super::Runtime::with_words`], [`crate::policy::RunShape::check`],
//! [`super::locate::locate_in`]); plugins loaded by that runtime name them in their faults'
//! remedies, and [`super::PluginError::worded`] shows a fault in them.
//! The messages themselves are written once, here and at their call sites: a caller chooses
//! names, not sentences.

use super::contract::PolicyKind;

/// A setting a message may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Knob {
    /// What takes a plugin of this kind (`--schedule`; `WasmLR`).
    Plugin(PolicyKind),
    /// Epochs to train.
    Epochs,
    /// Data-parallel workers.
    WorldSize,
    /// The global batch at step 0.
    GlobalBatch,
    /// The batch the base LR applies to.
    ReferenceBatch,
    /// The LR at the reference batch.
    BaseLr,
    /// The largest batch a batch-size policy may ask for.
    MaxBatch,
    /// A policy call's fuel.
    Fuel,
    /// A codec call's fuel per float.
    CodecFuelPerFloat,
    /// A call's wall-clock backstop.
    DeadlineMs,
    /// A plugin's memory cap.
    MemoryMb,
    /// The largest component file.
    MaxComponentMb,
}

/// How a setting and its value are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A command-line flag: `--global-batch 250`, `raise it with --plugin-fuel`.
    Flag,
    /// A keyword argument: `global_batch=250`, `raise it with the fuel= argument`.
    Keyword,
}

/// One caller's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    /// Each knob's name (`--plugin-fuel`, `fuel`); a knob missing here is one the caller's
    /// users cannot set, and a message then leaves out how to change it.
    pub names: &'static [(Knob, &'static str)],
    /// How a knob and its value are written.
    pub style: Style,
    /// What a fuel fault of a policy call and of a codec call say ([`super::Fault::Fuel`]
    /// keeps a static remedy): `raise it with` and the name of [`Knob::Fuel`] and
    /// [`Knob::CodecFuelPerFloat`], in [`Words::raise`]'s form.
    pub fuel_remedies: [&'static str; 2],
    /// What to do when a plugin name is found in none of the places looked in.
    pub not_found: &'static str,
}

/// lsgd-host's words: its command-line flags.
pub static CLI: Words = Words {
    names: &[
        (Knob::Plugin(PolicyKind::Schedule), "--schedule"),
        (Knob::Plugin(PolicyKind::BatchSize), "--batch-size"),
        (
            Knob::Plugin(PolicyKind::LabelSmoothing),
            "--label-smoothing",
        ),
        (Knob::Plugin(PolicyKind::Codec), "--codec"),
        (Knob::Plugin(PolicyKind::LayerRate), "--layer-rate"),
        (Knob::Plugin(PolicyKind::Sync), "--sync"),
        (Knob::Epochs, "--epochs"),
        (Knob::WorldSize, "--world-size"),
        (Knob::GlobalBatch, "--global-batch"),
        (Knob::ReferenceBatch, "--reference-batch"),
        (Knob::BaseLr, "--base-lr"),
        (Knob::MaxBatch, "--max-batch"),
        (Knob::Fuel, "--plugin-fuel"),
        (Knob::CodecFuelPerFloat, "--codec-fuel-per-float"),
        (Knob::DeadlineMs, "--plugin-deadline-ms"),
        (Knob::MemoryMb, "--plugin-memory-mb"),
        (Knob::MaxComponentMb, "--plugin-max-mb"),
    ],
    style: Style::Flag,
    fuel_remedies: [
        "raise it with --plugin-fuel",
        "raise it with --codec-fuel-per-float",
    ],
    not_found: "set LSGD_PLUGIN_PATH, or build the reference plugins with \
                scripts/build-plugins.sh",
};

impl Words {
    /// The knob's name, as the subject of a sentence (`--epochs must be at least 1`), or
    /// `None` when this caller's users cannot set it.
    pub fn name(&self, knob: Knob) -> Option<&'static str> {
        self.names.iter().find(|(k, _)| *k == knob).map(|(_, n)| *n)
    }

    /// The knob's name, or a plain description where the caller has none.
    pub fn subject(&self, knob: Knob) -> String {
        self.name(knob)
            .map_or_else(|| plain(knob).to_string(), str::to_string)
    }

    /// The knob set to `value`: `--global-batch 250` or `global_batch=250`.
    pub fn with_value(&self, knob: Knob, value: impl std::fmt::Display) -> String {
        match (self.name(knob), self.style) {
            (Some(n), Style::Flag) => format!("{n} {value}"),
            (Some(n), Style::Keyword) => format!("{n}={value}"),
            (None, _) => format!("{} {value}", plain(knob)),
        }
    }

    /// `raise it with --plugin-fuel` or `raise it with the fuel= argument`; `None` when the
    /// caller's users cannot set the knob.
    pub fn raise(&self, knob: Knob) -> Option<String> {
        let n = self.name(knob)?;
        Some(match self.style {
            Style::Flag => format!("raise it with {n}"),
            Style::Keyword => format!("raise it with the {n}= argument"),
        })
    }

    /// `--plugin-deadline-ms raises it` or `the deadline_ms= argument raises it`; `None` when
    /// the caller's users cannot set the knob.
    pub fn raises(&self, knob: Knob) -> Option<String> {
        let n = self.name(knob)?;
        Some(match self.style {
            Style::Flag => format!("{n} raises it"),
            Style::Keyword => format!("the {n}= argument raises it"),
        })
    }

    /// What takes a plugin of `kind`: `--schedule`, `WasmLR`.
    pub fn takes(&self, kind: PolicyKind) -> String {
        self.subject(Knob::Plugin(kind))
    }
}

/// A knob in words, for a caller that has no name for it.
fn plain(knob: Knob) -> &'static str {
    match knob {
        Knob::Plugin(_) => "the plugin argument",
        Knob::Epochs => "the epochs",
        Knob::WorldSize => "the world size",
        Knob::GlobalBatch => "the global batch",
        Knob::ReferenceBatch => "the reference batch",
        Knob::BaseLr => "the base LR",
        Knob::MaxBatch => "the largest batch",
        Knob::Fuel => "the fuel",
        Knob::CodecFuelPerFloat => "the codec fuel per float",
        Knob::DeadlineMs => "the deadline",
        Knob::MemoryMb => "the memory cap",
        Knob::MaxComponentMb => "the largest component",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_words_are_its_flags_and_the_fuel_remedies_follow_them() {
        assert_eq!(CLI.takes(PolicyKind::Codec), "--codec");
        assert_eq!(CLI.with_value(Knob::GlobalBatch, 250), "--global-batch 250");
        assert_eq!(
            CLI.raise(Knob::DeadlineMs).unwrap(),
            "raise it with --plugin-deadline-ms"
        );
        for kind in PolicyKind::EVERY {
            assert_eq!(CLI.takes(kind), kind.flag());
        }
        assert_eq!(
            CLI.fuel_remedies.map(String::from),
            [Knob::Fuel, Knob::CodecFuelPerFloat].map(|k| CLI.raise(k).unwrap())
        );
    }

    #[test]
    fn keywords_are_written_with_their_value_and_a_missing_name_leaves_the_remedy_out() {
        static KW: Words = Words {
            names: &[(Knob::Fuel, "fuel"), (Knob::GlobalBatch, "global_batch")],
            style: Style::Keyword,
            fuel_remedies: ["raise it with the fuel= argument", "fixed"],
            not_found: "give a path",
        };
        assert_eq!(KW.with_value(Knob::GlobalBatch, 250), "global_batch=250");
        assert_eq!(KW.raise(Knob::Fuel).unwrap(), KW.fuel_remedies[0]);
        assert_eq!(KW.raise(Knob::MaxComponentMb), None);
        assert_eq!(
            KW.raises(Knob::Fuel).unwrap(),
            "the fuel= argument raises it"
        );
        assert_eq!(KW.subject(Knob::WorldSize), "the world size");
        assert_eq!(KW.takes(PolicyKind::Schedule), "the plugin argument");
    }
}
