//! Checkpoints: the weights, BatchNorm statistics and optimiser history in one safetensors
//! file, and everything else in `checkpoint.json` beside it — the step and stream position
//! (which determine the data order, see [`super::order`]), the last loss and metric the
//! policies see, the last LR (for momentum correction), the run's settings and the identity of
//! every policy plugin (file, blake3, parameters).
//!
//! Writing is atomic: the tensors go to a new file, then the JSON, which names that file, is
//! renamed over the old one; only then is the previous tensor file removed. A crash at any
//! moment leaves the previous or the new checkpoint whole. Most policies hold no state across
//! calls (a fresh instance gives the same outputs), so their identity and parameters are all
//! there is to save; a stateful plugin (contract 0.3's `state` interface) adds its snapshot as
//! of the checkpointed step, in hex, under its kind.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use crate::config::TrainConfig;
use crate::{Error, Result};

/// Identifies the checkpoint format.
pub const FORMAT: &str = "lsgd-host checkpoint 1";
/// File name of the checkpoint's JSON part in a run directory.
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

/// Writes `tensors` and `meta` into `dir` atomically; returns the JSON's path.
pub fn save(dir: &Path, mut meta: Meta, tensors: &[(String, Tensor)]) -> Result<PathBuf> {
    let name = format!("checkpoint-{:08}.safetensors", meta.step);
    let final_tensors = dir.join(&name);
    let tmp_tensors = dir.join(format!("{name}.tmp"));
    Tensor::write_safetensors(tensors, &tmp_tensors)
        .map_err(|e| Error::Checkpoint(format!("cannot write {}: {e}", tmp_tensors.display())))?;
    let bytes = fs::read(&tmp_tensors)
        .map_err(Error::io(format!("cannot read {}", tmp_tensors.display())))?;
    meta.tensors_blake3 = blake3::hash(&bytes).to_hex().to_string();
    fs::rename(&tmp_tensors, &final_tensors).map_err(Error::io(format!(
        "cannot write {}",
        final_tensors.display()
    )))?;

    let json_path = dir.join(JSON_NAME);
    let previous = fs::read(&json_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Meta>(&b).ok())
        .map(|m| m.tensors);
    meta.tensors = name.clone();
    let tmp_json = dir.join(format!("{JSON_NAME}.tmp"));
    let json = serde_json::to_vec_pretty(&meta).map_err(|source| Error::Json {
        context: format!("cannot write {}", tmp_json.display()),
        source,
    })?;
    fs::write(&tmp_json, json)
        .map_err(Error::io(format!("cannot write {}", tmp_json.display())))?;
    fs::rename(&tmp_json, &json_path)
        .map_err(Error::io(format!("cannot write {}", json_path.display())))?;
    if let Some(old) = previous.filter(|old| *old != name) {
        let _ = fs::remove_file(dir.join(old));
    }
    Ok(json_path)
}

/// Reads a checkpoint from its JSON file or from a run directory holding one.
pub fn load(path: &Path) -> Result<(Meta, Vec<(String, Tensor)>)> {
    let json_path = if path.is_dir() {
        path.join(JSON_NAME)
    } else {
        path.to_path_buf()
    };
    let bytes = fs::read(&json_path).map_err(Error::io(format!(
        "cannot read checkpoint {}",
        json_path.display()
    )))?;
    let meta: Meta = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        context: format!(
            "{} is not an lsgd-host checkpoint (expected the JSON written next to checkpoint-*.safetensors)",
            json_path.display()
        ),
        source,
    })?;
    if meta.format != FORMAT {
        return Err(Error::Checkpoint(format!(
            "{}: checkpoint format `{}`, this lsgd-host reads `{FORMAT}`",
            json_path.display(),
            meta.format
        )));
    }
    let tensor_path = json_path
        .parent()
        .unwrap_or(Path::new("."))
        .join(&meta.tensors);
    let tensor_bytes = fs::read(&tensor_path).map_err(Error::io(format!(
        "cannot read checkpoint tensors {}",
        tensor_path.display()
    )))?;
    let hash = blake3::hash(&tensor_bytes).to_hex().to_string();
    if hash != meta.tensors_blake3 {
        return Err(Error::Checkpoint(format!(
            "{} is damaged: its blake3 is {hash}, {} recorded {}",
            tensor_path.display(),
            json_path.display(),
            meta.tensors_blake3
        )));
    }
    let tensors = Tensor::read_safetensors(&tensor_path)
        .map_err(|e| Error::Checkpoint(format!("cannot decode {}: {e}", tensor_path.display())))?;
    Ok((meta, tensors))
}
