//! Checkpoints: the weights, BatchNorm statistics and optimiser history in one safetensors
//! file, and everything else in a JSON file beside it — the step and stream position (which
//! determine the data order, see [`super::order`]), the last loss and metric the policies see,
//! the last LR (for momentum correction), the run's settings and the identity of every policy
//! plugin (file, blake3, parameters).
//!
//! A run directory keeps the last `--keep-checkpoints` generations, each a
//! `checkpoint-<step:08>.json` naming its `checkpoint-<step:08>.safetensors`, and
//! `checkpoint.json`, a copy of the newest generation's JSON. Writing is crash-safe: every file
//! goes to a `.tmp` file that is fsynced, renamed into place and made durable by an fsync of the
//! directory, the tensors before the JSON that names them, and older generations are removed
//! only once the new one is durable. A crash or `kill -9` at any moment leaves the previous
//! generations whole; [`newest_valid`] then finds the newest one that reads back (its JSON
//! parses, its tensor file exists, hashes to the recorded blake3 and decodes), and says why it
//! passed over the newer ones. A checkpoint at the step of an existing generation (the final
//! one after a periodic one) replaces it. The next save removes the `.tmp` files a killed
//! writer left.
//!
//! Most policies hold no state across calls (a fresh instance gives the same outputs), so their
//! identity and parameters are all there is to save; a stateful plugin (contract 0.3's `state`
//! interface) adds its snapshot as of the checkpointed step, in hex, under its kind.
//!
//! Test hook: `LSGD_CHECKPOINT_STALL=<phase>:<ms>[:<step>]` (read once per process) makes
//! [`save`] print `checkpoint stall <phase> <path> pid <pid>` to stderr and sleep `ms`
//! milliseconds at `phase` (of every save, or only the save of `step`), so a test can kill the
//! writer there. The phases, in order: `tensors-written` (the temp tensor file written, not
//! renamed), `tensors-renamed`, `json-written` (the generation's temp JSON written),
//! `json-renamed` (the generation's JSON in place, `checkpoint.json` not yet) and `pruning`
//! (before older generations are removed).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::config::TrainConfig;
use crate::{Error, Result};

/// Identifies the checkpoint format.
pub const FORMAT: &str = "lsgd-host checkpoint 1";
/// File name of the newest checkpoint's JSON part in a run directory (a copy of the newest
/// generation's `checkpoint-<step:08>.json`).
pub const JSON_NAME: &str = "checkpoint.json";

/// A policy plugin as recorded in a checkpoint.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PluginRecord {
    /// `schedule`, `batch-size` or `label-smoothing`.
    pub kind: String,
    /// The file, as given.
    pub file: String,
    /// blake3 of the component.
    pub blake3: String,
    /// describe() name and version.
    pub name: String,
    /// describe() version.
    pub version: String,
    /// Resolved parameters, as text.
    pub params: Vec<(String, String)>,
}

/// The JSON part of a checkpoint.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Meta {
    /// [`FORMAT`].
    pub format: String,
    /// Why it was written: `periodic`, `final`, `stopped` or `plugin fault`.
    pub reason: String,
    /// The tensor file, relative to this file's directory.
    pub tensors: String,
    /// blake3 of the tensor file, checked on load.
    pub tensors_blake3: String,
    /// Steps taken.
    pub step: u64,
    /// Training samples consumed (the data stream position).
    pub samples_seen: u64,
    /// The last training loss the policies saw.
    pub last_loss: Option<f64>,
    /// The last test accuracy the policies saw.
    pub last_metric: Option<f64>,
    /// The LR of the last step.
    pub last_lr: Option<f64>,
    /// Evaluations done (completed epochs).
    pub epochs_evaluated: u32,
    /// Training samples in the (sub)set, to refuse resuming on different data.
    pub train_len: usize,
    /// The run's settings.
    pub config: TrainConfig,
    /// The policy plugins.
    pub plugins: Vec<PluginRecord>,
    /// The snapshot of each stateful plugin at `step`, hex, by kind (absent in checkpoints
    /// written before contract 0.3).
    #[serde(default)]
    pub policy_state: std::collections::BTreeMap<String, String>,
    /// fp16's loss scaler at `step` (absent for other precisions and older checkpoints).
    #[serde(default)]
    pub loss_scaler: Option<crate::precision::ScalerState>,
    /// The order of the tensors the gradient buckets were laid out in (their readiness order),
    /// which the error-feedback state follows; absent in checkpoints from before it, whose
    /// buckets followed the optimizer's order.
    #[serde(default)]
    pub bucket_order: Option<Vec<usize>>,
    /// Where a sync policy's windows stood (absent without one, and in checkpoints from before
    /// contract 0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::trainer::WindowMeta>,
}

/// Bytes as lowercase hex, for the JSON part.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex`]'s text.
pub fn unhex(text: &str) -> std::result::Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err(format!("odd-length hex ({} characters)", text.len()));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(text.get(i..i + 2).unwrap_or("?"), 16)
                .map_err(|_| format!("not hex at character {i}"))
        })
        .collect()
}

/// Writes `tensors` and `meta` into `dir` as the generation of `meta.step`, crash-safely, and
/// keeps the newest `meta.config.invocation.keep_checkpoints` generations; returns the path of
/// `checkpoint.json`.
pub fn save(dir: &Path, mut meta: Meta, tensors: &[(String, Tensor)]) -> Result<PathBuf> {
    remove_stale_temps(dir);
    let step = meta.step;
    let tmp_tensors = dir.join(format!("{}.tmp", tensors_name(step)));
    Tensor::write_safetensors(tensors, &tmp_tensors)
        .map_err(|e| Error::Checkpoint(format!("cannot write {}: {e}", tmp_tensors.display())))?;
    sync_file(&tmp_tensors)?;
    let bytes = fs::read(&tmp_tensors)
        .map_err(Error::io(format!("cannot read {}", tmp_tensors.display())))?;
    meta.tensors_blake3 = blake3::hash(&bytes).to_hex().to_string();
    drop(bytes);
    stall("tensors-written", step, &tmp_tensors);
    // A generation of this step may already name `checkpoint-<step>.safetensors`: renaming
    // different bytes over it would leave that generation unreadable until its JSON is
    // replaced too, so different tensors of the same step go under their own name.
    let mut name = tensors_name(step);
    if fs::read(dir.join(&name))
        .is_ok_and(|old| blake3::hash(&old).to_hex().as_str() != meta.tensors_blake3)
    {
        name = format!(
            "checkpoint-{step:08}-{}.safetensors",
            &meta.tensors_blake3[..12]
        );
    }
    let final_tensors = dir.join(&name);
    rename_durably(&tmp_tensors, &final_tensors)?;
    stall("tensors-renamed", step, &final_tensors);

    meta.tensors = name;
    let json = serde_json::to_vec_pretty(&meta).map_err(|source| Error::Json {
        context: format!(
            "cannot write the checkpoint JSON of step {step} in {}",
            dir.display()
        ),
        source,
    })?;
    let generation = dir.join(json_name(step));
    let tmp_json = write_temp(&generation, &json)?;
    stall("json-written", step, &tmp_json);
    rename_durably(&tmp_json, &generation)?;
    stall("json-renamed", step, &generation);
    let newest = dir.join(JSON_NAME);
    rename_durably(&write_temp(&newest, &json)?, &newest)?;

    stall("pruning", step, dir);
    prune(
        dir,
        step,
        meta.config.invocation.keep_checkpoints.max(1) as usize,
    )?;
    Ok(newest)
}

/// The name of step `step`'s generation JSON.
pub fn json_name(step: u64) -> String {
    format!("checkpoint-{step:08}.json")
}

/// The name `save` gives step `step`'s tensor file.
fn tensors_name(step: u64) -> String {
    format!("checkpoint-{step:08}.safetensors")
}

/// The step of a generation JSON's file name (`checkpoint-<step:08>.json`).
pub(crate) fn generation_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("checkpoint-")?.strip_suffix(".json")?;
    (digits.len() >= 8 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// The generation JSONs in `dir`, newest step first.
fn generations(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = fs::read_dir(dir).map_err(Error::io(format!(
        "cannot list checkpoints in {}",
        dir.display()
    )))?;
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let step = generation_step(e.file_name().to_str()?)?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    Ok(found)
}

/// Removes what a writer killed mid-save left: `checkpoint*.tmp` files.
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("checkpoint") && name.ends_with(".tmp") {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// Removes all but the `keep` newest generations (always keeping `step`'s, just written), then
/// every tensor file no remaining JSON names (left by a writer killed before its JSON).
fn prune(dir: &Path, step: u64, keep: usize) -> Result<()> {
    let all = generations(dir)?;
    let others = all.iter().filter(|(s, _)| *s != step);
    let (kept, removed): (Vec<_>, Vec<_>) = all
        .iter()
        .filter(|(s, _)| *s == step)
        .chain(others)
        .enumerate()
        .partition(|(i, _)| *i < keep);
    for (_, (_, json)) in removed {
        // The JSON goes first: a crash in between leaves an unnamed tensor file, removed by
        // the next save, never a JSON naming a missing file.
        let _ = fs::remove_file(json);
    }
    let mut named = Vec::new();
    for json in kept
        .iter()
        .map(|(_, (_, json))| json.clone())
        .chain([dir.join(JSON_NAME)])
    {
        if let Some(meta) = fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
        {
            named.push(meta.tensors);
        }
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("checkpoint-")
                && name.ends_with(".safetensors")
                && !named.contains(&name)
            {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    sync_dir(dir)
}

/// Writes `bytes` to `<path>.tmp` and fsyncs it; returns the temp path.
fn write_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let tmp = path.with_file_name(format!(
        "{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let cannot = || format!("cannot write {}", tmp.display());
    let mut f = fs::File::create(&tmp).map_err(Error::io(cannot()))?;
    f.write_all(bytes).map_err(Error::io(cannot()))?;
    f.sync_all().map_err(Error::io(cannot()))?;
    Ok(tmp)
}

/// Flushes a written file to the disk.
fn sync_file(path: &Path) -> Result<()> {
    fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(format!("cannot fsync {}", path.display())))
}

/// Flushes a directory's entries (a rename or removal in it) to the disk.
fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(Error::io(format!(
            "cannot fsync the directory {}",
            dir.display()
        )))
}

/// Renames `from` to `to` and fsyncs their directory, so the rename survives a power cut.
fn rename_durably(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).map_err(Error::io(format!(
        "cannot rename {} to {}",
        from.display(),
        to.display()
    )))?;
    sync_dir(to.parent().unwrap_or(Path::new(".")))
}

/// Name of the environment variable of the stall test hook (see the module documentation).
pub const STALL_ENV: &str = "LSGD_CHECKPOINT_STALL";

/// The stall hook's setting: phase, milliseconds, and the only step it applies to, if any.
struct Stall {
    phase: String,
    ms: u64,
    step: Option<u64>,
}

/// The test hook: sleeps at `phase` of the save of `step` if [`STALL_ENV`] asks for it.
fn stall(phase: &str, step: u64, path: &Path) {
    static STALL: OnceLock<Option<Stall>> = OnceLock::new();
    let setting = STALL.get_or_init(|| {
        let value = std::env::var(STALL_ENV).ok()?;
        let mut parts = value.split(':');
        let phase = parts.next()?.to_string();
        let ms = parts.next()?.parse().ok()?;
        let step = parts.next().and_then(|s| s.parse().ok());
        Some(Stall { phase, ms, step })
    });
    let Some(s) = setting else {
        return;
    };
    if s.phase == phase && s.step.is_none_or(|only| only == step) {
        eprintln!(
            "checkpoint stall {phase} {} pid {}",
            path.display(),
            std::process::id()
        );
        std::thread::sleep(std::time::Duration::from_millis(s.ms));
    }
}

/// A checkpoint [`newest_valid`] passed over, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// Its JSON file.
    pub json: PathBuf,
    /// Why it cannot be used, naming the file at fault.
    pub reason: String,
}

/// A checkpoint read back whole.
pub struct Loaded {
    /// Its JSON part.
    pub meta: Meta,
    /// Its tensors.
    pub tensors: Vec<(String, Tensor)>,
    /// The JSON file it was read from.
    pub json: PathBuf,
    /// Newer checkpoints in the same directory that could not be used, newest first.
    pub skipped: Vec<Skipped>,
}

/// Reads a checkpoint from its JSON file, or the newest valid one of a run directory (see
/// [`newest_valid`]).
pub fn load(path: &Path) -> Result<(Meta, Vec<(String, Tensor)>)> {
    resolve(path).map(|l| (l.meta, l.tensors))
}

/// [`load`], also saying which file was read and which newer ones were skipped.
pub fn resolve(path: &Path) -> Result<Loaded> {
    if path.is_dir() {
        return newest_valid(path);
    }
    let full = |p: &Path| p.display().to_string();
    let (meta, tensors) = read_meta(path, &full)
        .and_then(|meta| read_tensors(path, &meta, &full).map(|t| (meta, t)))
        .map_err(|reason| {
            Error::Checkpoint(format!(
                "cannot read checkpoint {}: {reason}",
                path.display()
            ))
        })?;
    Ok(Loaded {
        meta,
        tensors,
        json: path.to_path_buf(),
        skipped: Vec::new(),
    })
}

/// The newest checkpoint of run directory `dir` that reads back whole: the generations newest
/// step first, and `checkpoint.json` where it is not a copy of one of them already tried. The
/// error, when none does, names every candidate and what is wrong with it.
pub fn newest_valid(dir: &Path) -> Result<Loaded> {
    let short = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    // checkpoint.json ranks by its recorded step, after the generation of the same step (of
    // which it is normally a copy); one that does not parse ranks first, so its fault is told.
    let newest = dir.join(JSON_NAME);
    let newest_step = newest.exists().then(|| match read_meta(&newest, &short) {
        Ok(m) => m.step,
        Err(_) => u64::MAX,
    });
    let mut candidates: Vec<(u64, bool, PathBuf)> = generations(dir)?
        .into_iter()
        .map(|(step, json)| (step, true, json))
        .chain(newest_step.map(|step| (step, false, newest.clone())))
        .collect();
    candidates.sort_by_key(|(step, is_generation, _)| std::cmp::Reverse((*step, *is_generation)));
    if candidates.is_empty() {
        return Err(Error::Checkpoint(format!(
            "no checkpoint in {} (neither {JSON_NAME} nor checkpoint-<step>.json)",
            dir.display()
        )));
    }
    let mut skipped = Vec::new();
    let mut tried: Vec<(String, String)> = Vec::new();
    for (_, is_generation, json) in candidates {
        let meta = match read_meta(&json, &short) {
            Ok(meta) => meta,
            Err(reason) => {
                skipped.push(Skipped { json, reason });
                continue;
            }
        };
        let key = (meta.tensors.clone(), meta.tensors_blake3.clone());
        if !is_generation && tried.contains(&key) {
            continue;
        }
        tried.push(key);
        match read_tensors(&json, &meta, &short) {
            Ok(tensors) => {
                return Ok(Loaded {
                    meta,
                    tensors,
                    json,
                    skipped,
                });
            }
            Err(reason) => skipped.push(Skipped { json, reason }),
        }
    }
    Err(Error::Checkpoint(format!(
        "no valid checkpoint in {}:\n  {}",
        dir.display(),
        skipped
            .iter()
            .map(|s| format!("{}: {}", short(&s.json), s.reason))
            .collect::<Vec<_>>()
            .join("\n  ")
    )))
}

/// The JSON part of a checkpoint, or why it cannot be used (files named by `show`).
fn read_meta(json: &Path, show: &dyn Fn(&Path) -> String) -> std::result::Result<Meta, String> {
    let bytes = fs::read(json).map_err(|e| format!("cannot read {}: {e}", show(json)))?;
    let meta: Meta = serde_json::from_slice(&bytes).map_err(|e| {
        format!(
            "{} is not an lsgd-host checkpoint JSON (truncated or corrupted? {} bytes): {e}",
            show(json),
            bytes.len()
        )
    })?;
    if meta.format != FORMAT {
        return Err(format!(
            "{} has checkpoint format `{}`, this lsgd-host reads `{FORMAT}`",
            show(json),
            meta.format
        ));
    }
    Ok(meta)
}

/// The tensors `meta` (read from `json`) names, or why they cannot be used.
fn read_tensors(
    json: &Path,
    meta: &Meta,
    show: &dyn Fn(&Path) -> String,
) -> std::result::Result<Vec<(String, Tensor)>, String> {
    // The JSON is input like any other: its tensor file must be a file beside it, so that a
    // damaged or hostile checkpoint cannot make the host read /dev/zero or outside the run.
    let plain = Path::new(&meta.tensors).file_name() == Some(std::ffi::OsStr::new(&meta.tensors));
    if !plain || !meta.tensors.ends_with(".safetensors") {
        return Err(format!(
            "names the tensor file `{}`, not a *.safetensors file beside it",
            meta.tensors
        ));
    }
    let path = json.parent().unwrap_or(Path::new(".")).join(&meta.tensors);
    if fs::metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "its tensor file {} is not a regular file",
            show(&path)
        ));
    }
    let bytes = fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("its tensor file {} is missing", show(&path))
        }
        _ => format!("cannot read its tensor file {}: {e}", show(&path)),
    })?;
    let hash = blake3::hash(&bytes).to_hex().to_string();
    if hash != meta.tensors_blake3 {
        return Err(format!(
            "{} is damaged: blake3 {hash} of {} bytes, {} recorded {} (truncated or corrupted)",
            show(&path),
            bytes.len(),
            show(json),
            meta.tensors_blake3
        ));
    }
    drop(bytes);
    Tensor::read_safetensors(&path).map_err(|e| format!("cannot decode {}: {e}", show(&path)))
}
