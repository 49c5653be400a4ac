//! A run's plugin identity: what a checkpoint records of each plugin (file, blake3, parameters),
//! how a resume compares it (and, with `--allow-policy-change`, which slots changed), and the
//! start-up check that every rank loaded the same plugins with the same parameters.

use lsgd_collective::World;
use lsgd_runtime::plugin::{self, Plugin};
use lsgd_runtime::policy::PolicySet;

use crate::checkpoint::PluginRecord;
use crate::metrics::PluginChange;
use crate::{Error, Result, parallel};

/// How a plugin is identified when a resume compares plugins.
pub(super) fn identity(plugins: &[PluginRecord]) -> Vec<String> {
    plugins.iter().map(identity_line).collect()
}

/// One plugin's [`identity`] line.
fn identity_line(p: &PluginRecord) -> String {
    plugin::identity(&p.kind, &p.name, &p.blake3, &p.params)
}

/// The slot key of a record's kind: its label up to the composition's note
/// (`schedule.1 (from step 30)` is slot `schedule.1`).
fn slot_key(p: &PluginRecord) -> &str {
    p.kind.split(' ').next().unwrap_or(&p.kind)
}

/// The record of slot `key` among `records`.
pub(super) fn in_slot<'a>(records: &'a [PluginRecord], key: &str) -> Option<&'a PluginRecord> {
    records.iter().find(|p| slot_key(p) == key)
}

/// Whether `a` and `b` are one plugin in one place: the slot and its place in a composition,
/// the component's bytes and the parameters. The file's path may differ: it is where the bytes
/// were found, not what they compute.
pub(super) fn same_plugin(a: &PluginRecord, b: &PluginRecord) -> bool {
    a.kind == b.kind && a.blake3 == b.blake3 && a.params == b.params
}

/// The slots whose plugin differs between the checkpoint's records `then` and this run's
/// `now`: this run's slots in order, then those only the checkpoint had.
pub(super) fn plugin_changes(then: &[PluginRecord], now: &[PluginRecord]) -> Vec<PluginChange> {
    let mut keys: Vec<&str> = now.iter().map(slot_key).collect();
    keys.extend(
        then.iter()
            .map(slot_key)
            .filter(|k| in_slot(now, k).is_none()),
    );
    keys.into_iter()
        .filter_map(|key| {
            let (from, to) = (in_slot(then, key), in_slot(now, key));
            if let (Some(a), Some(b)) = (from, to)
                && same_plugin(a, b)
            {
                return None;
            }
            Some(PluginChange {
                slot: key.to_string(),
                from: from.map(identity_line),
                to: to.map(identity_line),
            })
        })
        .collect()
}

/// What a checkpoint records of each loaded plugin.
pub(super) fn plugin_records(policies: &PolicySet) -> Vec<PluginRecord> {
    policies
        .plugins()
        .into_iter()
        .map(|(slot, p): (_, &Plugin)| PluginRecord {
            kind: policies.slot_label(slot),
            file: p.label().to_string(),
            blake3: p.facts().blake3.clone(),
            name: p.info().name.clone(),
            version: p.info().version.clone(),
            params: p.rendered_params(),
        })
        .collect()
}

/// Refuses, on every rank alike, ranks that loaded different plugins or parameters (an MPMD
/// launch, or flags that differ per rank): one all-gather of a digest of each rank's plugins,
/// then, on a mismatch only, of their records, to name the ranks and what differs.
pub(super) fn same_plugins(world: &World, plugins: &[PluginRecord]) -> Result<()> {
    if world.size() == 1 {
        return Ok(());
    }
    // The file's path may differ between ranks; its contents and parameters may not.
    let identity: Vec<_> = plugins
        .iter()
        .map(|p| (&p.kind, &p.blake3, &p.params))
        .collect();
    let bytes = serde_json::to_vec(&identity).expect("strings serialize");
    let digests = world.all_gather_u64(parallel::bytes_digest(std::iter::once(&bytes[..])))?;
    if digests.iter().all(|&d| d == digests[0]) {
        return Ok(());
    }
    let mine = serde_json::to_vec(plugins).expect("records serialize");
    let (all, _) = world.all_gather_bytes(&mine)?;
    let all: Vec<Vec<PluginRecord>> = all
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Config(format!("cannot compare the ranks' plugins: {e}")))?;
    let mut problems = Vec::new();
    for (rank, theirs) in all.iter().enumerate().skip(1) {
        if digests[rank] != digests[0] {
            problems.extend(plugin_differences(rank, theirs, &all[0]));
        }
    }
    Err(Error::PluginsDiffer(problems))
}

/// How rank `rank`'s plugins differ from rank 0's, one line per plugin kind: "schedule: rank
/// 1 runs bad-schedule.wasm with mode=trap, rank 0 with mode=ok".
fn plugin_differences(rank: usize, theirs: &[PluginRecord], root: &[PluginRecord]) -> Vec<String> {
    fn find<'a>(records: &'a [PluginRecord], kind: &str) -> Option<&'a PluginRecord> {
        records.iter().find(|p| p.kind == kind)
    }
    let short = |p: &PluginRecord| p.blake3[..12.min(p.blake3.len())].to_string();
    let mut kinds: Vec<&str> = theirs.iter().chain(root).map(|p| p.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let mut out = Vec::new();
    for kind in kinds {
        out.push(match (find(theirs, kind), find(root, kind)) {
            (Some(a), Some(b)) if a.blake3 == b.blake3 => {
                if a.params == b.params {
                    continue;
                }
                format!(
                    "{kind}: rank {rank} runs {} with {}, rank 0 with {}",
                    a.file,
                    params_not_in(a, b),
                    params_not_in(b, a)
                )
            }
            (Some(a), Some(b)) => format!(
                "{kind}: rank {rank} runs {} (blake3 {}…), rank 0 runs {} (blake3 {}…)",
                a.file,
                short(a),
                b.file,
                short(b)
            ),
            (Some(a), None) => format!("{kind}: rank {rank} runs {}, rank 0 none", a.file),
            (None, Some(b)) => format!("{kind}: rank {rank} runs none, rank 0 runs {}", b.file),
            (None, None) => continue,
        });
    }
    out
}

/// `a`'s parameters whose values `b` does not share, as `name=value, …`.
fn params_not_in(a: &PluginRecord, b: &PluginRecord) -> String {
    a.params
        .iter()
        .filter(|p| !b.params.contains(p))
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &str, blake3: &str, params: &[(&str, &str)]) -> PluginRecord {
        PluginRecord {
            kind: kind.into(),
            file: format!("{blake3}.wasm"),
            blake3: blake3.into(),
            name: blake3.into(),
            version: "1".into(),
            params: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn each_changed_slot_is_named_with_its_plugins_before_and_after() {
        let then = [
            record("schedule", "aaaa", &[("mode", "nan")]),
            record("schedule.1 (from step 30)", "bbbb", &[]),
            record("codec", "cccc", &[]),
        ];
        let mut now = vec![
            record("schedule", "aaaa", &[("mode", "ok")]),
            record("schedule.1 (from step 30)", "bbbb", &[]),
            record("batch-size", "dddd", &[]),
        ];
        // Another path to the same bytes is the same plugin.
        now[1].file = "elsewhere/bbbb.wasm".into();
        let changes = plugin_changes(&then, &now);
        let slots: Vec<_> = changes.iter().map(|c| c.slot.as_str()).collect();
        assert_eq!(slots, ["schedule", "batch-size", "codec"]);
        assert_eq!(
            changes[0].to.as_deref(),
            Some("schedule aaaa (blake3 aaaa…, params [(\"mode\", \"ok\")])")
        );
        assert_eq!(
            (changes[1].from.as_deref(), changes[2].to.as_deref()),
            (None, None)
        );
        assert!(plugin_changes(&then, &then).is_empty());
        // A later part that moves its milestone is another plugin in its slot.
        let moved = [record("schedule.1 (from step 40)", "bbbb", &[])];
        assert_eq!(plugin_changes(&then[1..2], &moved).len(), 1);
    }
}
