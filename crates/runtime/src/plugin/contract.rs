//! Which contract a component implements, read from its export names before anything is
//! instantiated. A plugin exports `lsgd:policy/plugin@X.Y.Z` and exactly one policy interface
//! (`lsgd:policy/schedule@X.Y.Z`, ...). The host keeps one set of bindings per released minor
//! version (`v0_1` ...) and dispatches on the version the plugin declares, so plugins built
//! against an older minor version keep loading after the contract grows.

use std::fmt;

use crate::{Error, Result};

/// The WIT package every plugin implements.
pub const PACKAGE: &str = "lsgd:policy";

/// The kinds of policy, one WIT world each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// `learning-rate(state) -> f64`.
    Schedule,
    /// `global-batch(state) -> u32`.
    BatchSize,
    /// `epsilon(state) -> f32`.
    LabelSmoothing,
    /// `encode`/`decode` of gradient buckets (contract 0.2 and later).
    Codec,
    /// `multipliers(state, tensors) -> list<f64>`: one LR multiplier per parameter tensor
    /// (contract 0.3 and later).
    LayerRate,
    /// `plan(state, window) -> step-kind` before each step and `outer-step` at a window's end:
    /// when the ranks synchronise (contract 0.5 and later).
    Sync,
}

impl PolicyKind {
    /// The kinds consulted once per step for a value, in the order the host calls them.
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::BatchSize,
        PolicyKind::Schedule,
        PolicyKind::LabelSmoothing,
    ];

    /// Every kind: [`PolicyKind::ALL`], the gradient codec, the layer-wise rate and the sync
    /// policy. New kinds go last, so that the slots of older checkpoints keep their order.
    pub const EVERY: [PolicyKind; 6] = [
        PolicyKind::BatchSize,
        PolicyKind::Schedule,
        PolicyKind::LabelSmoothing,
        PolicyKind::Codec,
        PolicyKind::LayerRate,
        PolicyKind::Sync,
    ];

    /// The WIT interface name.
    pub fn interface(self) -> &'static str {
        match self {
            PolicyKind::Schedule => "schedule",
            PolicyKind::BatchSize => "batch-size",
            PolicyKind::LabelSmoothing => "label-smoothing",
            PolicyKind::Codec => "codec",
            PolicyKind::LayerRate => "layer-rate",
            PolicyKind::Sync => "sync",
        }
    }

    /// The WIT world a plugin of this kind targets.
    pub fn world(self) -> &'static str {
        match self {
            PolicyKind::Schedule => "schedule-plugin",
            PolicyKind::BatchSize => "batch-size-plugin",
            PolicyKind::LabelSmoothing => "label-smoothing-plugin",
            PolicyKind::Codec => "codec-plugin",
            PolicyKind::LayerRate => "layer-rate-plugin",
            PolicyKind::Sync => "sync-plugin",
        }
    }

    /// The WIT function a plugin of this kind exports, called once per step (a codec's first).
    pub fn function(self) -> &'static str {
        match self {
            PolicyKind::Schedule => "learning-rate",
            PolicyKind::BatchSize => "global-batch",
            PolicyKind::LabelSmoothing => "epsilon",
            PolicyKind::Codec => "encode",
            PolicyKind::LayerRate => "multipliers",
            PolicyKind::Sync => "plan",
        }
    }

    /// The prefix of `--set PREFIX.KEY=VALUE` for this kind.
    pub fn set_prefix(self) -> &'static str {
        match self {
            PolicyKind::Schedule => "schedule",
            PolicyKind::BatchSize => "batch_size",
            PolicyKind::LabelSmoothing => "label_smoothing",
            PolicyKind::Codec => "codec",
            PolicyKind::LayerRate => "layer_rate",
            PolicyKind::Sync => "sync",
        }
    }

    /// The command-line flag that takes a plugin of this kind.
    pub fn flag(self) -> &'static str {
        match self {
            PolicyKind::Schedule => "--schedule",
            PolicyKind::BatchSize => "--batch-size",
            PolicyKind::LabelSmoothing => "--label-smoothing",
            PolicyKind::Codec => "--codec",
            PolicyKind::LayerRate => "--layer-rate",
            PolicyKind::Sync => "--sync",
        }
    }

    fn from_interface(name: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|k| k.interface() == name)
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.interface())
    }
}

/// A semantic version of the WIT package.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl Version {
    fn parse(s: &str) -> Option<Version> {
        let mut it = s.split('.').map(|p| p.parse::<u32>().ok());
        let v = Version {
            major: it.next()??,
            minor: it.next()??,
            patch: it.next()??,
        };
        it.next().is_none().then_some(v)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The contract versions this host has bindings for, oldest first.
pub const SUPPORTED: &[Version] = &[
    Version {
        major: 0,
        minor: 1,
        patch: 0,
    },
    Version {
        major: 0,
        minor: 2,
        patch: 0,
    },
    Version {
        major: 0,
        minor: 3,
        patch: 0,
    },
    Version {
        major: 0,
        minor: 4,
        patch: 0,
    },
    Version {
        major: 0,
        minor: 5,
        patch: 0,
    },
];

/// The interface a stateful plugin exports besides its kind's (contract 0.3 and later).
pub const STATE_INTERFACE: &str = "state";

/// The bindings the host uses for a plugin: one variant per released minor version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Binding {
    /// `lsgd:policy@0.1.x`, bound by [`super::v0_1`].
    V0_1,
    /// `lsgd:policy@0.2.x`, bound by [`super::v0_2`].
    V0_2,
    /// `lsgd:policy@0.3.x`, bound by [`super::v0_3`].
    V0_3,
    /// `lsgd:policy@0.4.x`, bound by [`super::v0_4`].
    V0_4,
    /// `lsgd:policy@0.5.x`, bound by [`super::v0_5`].
    V0_5,
}

/// What a component's exports say about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Contract {
    /// The policy kind (world) it implements.
    pub kind: PolicyKind,
    /// The contract version it was built against.
    pub version: Version,
    /// The host bindings that serve it.
    pub binding: Binding,
    /// Whether it exports `state` (snapshot/restore): a policy that keeps state between calls.
    pub stateful: bool,
}

impl Contract {
    /// Reads the contract off a component's export names; the error ([`Error::Contract`]) says
    /// what is wrong in words a plugin author can act on.
    pub fn detect<'a>(exports: impl IntoIterator<Item = &'a str>) -> Result<Contract> {
        Self::read(exports.into_iter().collect()).map_err(Error::Contract)
    }

    fn read(exports: Vec<&str>) -> Result<Contract, String> {
        let ours: Vec<(&str, &str)> = exports
            .iter()
            .filter_map(|e| e.strip_prefix(PACKAGE)?.strip_prefix('/'))
            .filter_map(|e| e.split_once('@'))
            .collect();
        if ours.is_empty() {
            let shown = if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            };
            return Err(format!(
                "not an lsgd policy plugin: it exports {shown}, but a plugin exports \
                 {PACKAGE}/plugin and one of {PACKAGE}/schedule, /batch-size, /label-smoothing, \
                 /codec, /layer-rate, /sync"
            ));
        }
        let mut versions: Vec<&str> = ours.iter().map(|(_, v)| *v).collect();
        versions.dedup();
        if versions.len() > 1 {
            return Err(format!(
                "exports several versions of {PACKAGE} ({}); a plugin targets one",
                versions.join(", ")
            ));
        }
        let version = Version::parse(versions[0])
            .ok_or_else(|| format!("exports {PACKAGE}@{}, not a valid version", versions[0]))?;
        let binding = binding_for(version)?;
        if !ours.iter().any(|(i, _)| *i == "plugin") {
            return Err(format!(
                "missing export {PACKAGE}/plugin@{version} (describe, configure)"
            ));
        }
        let stateful = ours.iter().any(|(i, _)| *i == STATE_INTERFACE);
        let mut kinds: Vec<PolicyKind> = ours
            .iter()
            .filter_map(|(i, _)| PolicyKind::from_interface(i))
            .collect();
        if binding == Binding::V0_2 && kinds == [PolicyKind::LabelSmoothing, PolicyKind::Codec] {
            // 0.2.0's label-smoothing world wrongly exports `codec` too (wit/README.md): such a
            // component is a label-smoothing plugin whose codec the host never calls.
            kinds.pop();
        }
        if stateful && kinds.contains(&PolicyKind::Codec) {
            return Err(format!(
                "exports {PACKAGE}/state with a codec; codecs cannot be stateful (the host \
                 keeps the error-feedback residual)"
            ));
        }
        match kinds.as_slice() {
            [kind] => Ok(Contract {
                kind: *kind,
                version,
                binding,
                stateful,
            }),
            [] => Err(format!(
                "exports no policy interface: expected one of {PACKAGE}/schedule, \
                 /batch-size, /label-smoothing, /codec, /layer-rate or /sync @{version}"
            )),
            many => Err(format!(
                "exports several policy interfaces ({}); a plugin targets exactly one world",
                many.iter()
                    .map(|k| k.interface())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

fn binding_for(v: Version) -> Result<Binding, String> {
    let supported = SUPPORTED
        .iter()
        .map(|s| format!("{}.{}", s.major, s.minor))
        .collect::<Vec<_>>()
        .join(", ");
    match (v.major, v.minor) {
        (0, 1) => Ok(Binding::V0_1),
        (0, 2) => Ok(Binding::V0_2),
        (0, 3) => Ok(Binding::V0_3),
        (0, 4) => Ok(Binding::V0_4),
        (0, 5) => Ok(Binding::V0_5),
        (0, _) if v > *SUPPORTED.last().expect("at least one version") => Err(format!(
            "built against {PACKAGE}@{v}, newer than this host ({supported}); upgrade lsgd-host"
        )),
        _ => Err(format!(
            "built against {PACKAGE}@{v}, an unsupported major version; this host loads {supported}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detect(exports: &[&str]) -> std::result::Result<Contract, String> {
        Contract::read(exports.to_vec())
    }

    #[test]
    fn a_layer_rate_plugin_of_0_3_is_detected() {
        let c = detect(&["lsgd:policy/plugin@0.3.0", "lsgd:policy/layer-rate@0.3.0"]).unwrap();
        assert_eq!(
            (c.kind, c.binding, c.stateful),
            (PolicyKind::LayerRate, Binding::V0_3, false)
        );
    }

    #[test]
    fn exporting_state_makes_a_plugin_stateful() {
        let c = detect(&[
            "lsgd:policy/plugin@0.3.0",
            "lsgd:policy/schedule@0.3.0",
            "lsgd:policy/state@0.3.0",
        ])
        .unwrap();
        assert_eq!((c.kind, c.stateful), (PolicyKind::Schedule, true));
        let e = detect(&[
            "lsgd:policy/plugin@0.3.0",
            "lsgd:policy/codec@0.3.0",
            "lsgd:policy/state@0.3.0",
        ])
        .unwrap_err();
        assert!(e.contains("codecs cannot be stateful"), "{e}");
    }

    #[test]
    fn a_0_2_label_smoothing_plugin_with_its_forced_codec_is_label_smoothing() {
        let exports = [
            "lsgd:policy/plugin@0.2.0",
            "lsgd:policy/label-smoothing@0.2.0",
            "lsgd:policy/codec@0.2.0",
        ];
        let c = detect(&exports).unwrap();
        assert_eq!(
            (c.kind, c.binding),
            (PolicyKind::LabelSmoothing, Binding::V0_2)
        );
        // Only 0.2.0's world had the mistake: the same pair at 0.3 is two policies.
        let e = detect(
            &exports
                .map(|e| e.replace("0.2.0", "0.3.0"))
                .each_ref()
                .map(|s| s.as_str()),
        )
        .unwrap_err();
        assert!(e.contains("several policy interfaces"), "{e}");
    }

    #[test]
    fn a_sync_plugin_of_0_5_is_detected_stateful_or_not() {
        let c = detect(&["lsgd:policy/plugin@0.5.0", "lsgd:policy/sync@0.5.0"]).unwrap();
        assert_eq!(
            (c.kind, c.binding, c.stateful),
            (PolicyKind::Sync, Binding::V0_5, false)
        );
        let c = detect(&[
            "lsgd:policy/plugin@0.5.0",
            "lsgd:policy/sync@0.5.0",
            "lsgd:policy/state@0.5.0",
        ])
        .unwrap();
        assert_eq!((c.kind, c.stateful), (PolicyKind::Sync, true));
        // Every older kind still loads at 0.5.
        let c = detect(&["lsgd:policy/plugin@0.5.0", "lsgd:policy/schedule@0.5.0"]).unwrap();
        assert_eq!((c.kind, c.binding), (PolicyKind::Schedule, Binding::V0_5));
        assert_eq!(PolicyKind::Sync.flag(), "--sync");
        assert_eq!(PolicyKind::Sync.set_prefix(), "sync");
    }

    #[test]
    fn a_newer_minor_version_asks_for_a_newer_host() {
        let e = detect(&["lsgd:policy/plugin@0.6.0", "lsgd:policy/sync@0.6.0"]).unwrap_err();
        assert!(e.contains("upgrade lsgd-host"), "{e}");
        assert!(e.contains("0.1, 0.2, 0.3, 0.4, 0.5"), "{e}");
    }
}
