//! A run's plugin identity: what a checkpoint records of each plugin (file, blake3, parameters),
//! how a resume compares it, and the start-up check that every rank loaded the same plugins
//! with the same parameters.

use lsgd_collective::World;
use lsgd_runtime::plugin::{self, Plugin};
use lsgd_runtime::policy::PolicySet;

use crate::checkpoint::PluginRecord;
use crate::{Error, Result, parallel};

/// How a plugin is identified when a resume compares plugins.
pub(super) fn identity(plugins: &[PluginRecord]) -> Vec<String> {
    plugins
        .iter()
        .map(|p| plugin::identity(&p.kind, &p.name, &p.blake3, &p.params))
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
