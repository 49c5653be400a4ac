//! Who a run directory belongs to: a new run refuses an `--out` that holds another run's
//! checkpoints or metrics, unless told to continue it (`--resume`) or to replace it
//! (`--overwrite`, which removes that run's files first), so two runs' files never mix and a
//! message that names "the checkpoint in --out" always means this run's.

use std::fs;
use std::path::{Path, PathBuf};

use crate::checkpoint::{JSON_NAME, generation_step};
use crate::metrics::{Record, read};
use crate::{Error, Result};

/// The files of a run in its directory: checkpoints and metrics (TensorBoard's event files and
/// the CSV twins of metrics.jsonl go with them).
#[derive(Debug, Default, PartialEq)]
pub struct Held {
    /// `checkpoint.json`, `checkpoint-<step>.json|safetensors` and their temporaries.
    pub checkpoints: Vec<PathBuf>,
    /// The steps of the checkpoint generations, ascending.
    pub checkpoint_steps: Vec<u64>,
    /// Step records in metrics.jsonl (0 when it is absent, unreadable or holds only restarts,
    /// which `launch` writes before a run starts over).
    pub steps_recorded: usize,
    /// metrics.jsonl, metrics.csv, eval.csv and event files.
    pub metrics: Vec<PathBuf>,
}

impl Held {
    /// Whether another run's results are there: a checkpoint, or a metrics record.
    pub fn is_a_run(&self) -> bool {
        !self.checkpoint_steps.is_empty() || self.steps_recorded > 0
    }

    /// "checkpoints at steps 100, 235 and metrics.jsonl with 235 steps".
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.checkpoint_steps.is_empty() {
            let steps: Vec<String> = self.checkpoint_steps.iter().map(u64::to_string).collect();
            parts.push(format!(
                "checkpoint{} at step{} {}",
                plural(steps.len()),
                plural(steps.len()),
                steps.join(", ")
            ));
        }
        if self.steps_recorded > 0 {
            parts.push(format!(
                "metrics.jsonl with {} step record{}",
                self.steps_recorded,
                plural(self.steps_recorded)
            ));
        }
        parts.join(" and ")
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// What of a run `dir` holds (nothing when it does not exist).
pub fn held(dir: &Path) -> Held {
    let mut held = Held::default();
    let Ok(entries) = fs::read_dir(dir) else {
        return held;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name == JSON_NAME || name.starts_with("checkpoint-") {
            if let Some(step) = generation_step(&name) {
                held.checkpoint_steps.push(step);
            }
            held.checkpoints.push(path);
        } else if matches!(
            name.as_str(),
            "metrics.jsonl" | "metrics.jsonl.tmp" | "metrics.csv" | "eval.csv"
        ) || name.starts_with("events.out.tfevents.")
        {
            held.metrics.push(path);
        }
    }
    // A checkpoint.json without generations (written before generations existed) still is one.
    if held.checkpoint_steps.is_empty() && held.checkpoints.iter().any(|p| p.ends_with(JSON_NAME)) {
        held.checkpoint_steps.push(0);
    }
    held.checkpoint_steps.sort_unstable();
    held.checkpoints.sort();
    held.metrics.sort();
    held.steps_recorded = read(&dir.join("metrics.jsonl")).map_or(0, |records| {
        records.iter().filter_map(Record::as_step).count()
    });
    held
}

/// Makes `out` ready for a run: refuses it when it holds another run (`resume`, the
/// checkpoint or directory being continued, may be that run), or with `overwrite` removes that
/// run's files and says so. Returns what was removed.
pub fn claim(out: &Path, resume: Option<&Path>, overwrite: bool) -> Result<Vec<PathBuf>> {
    if resume.is_some_and(|r| same_dir(&run_dir_of(r), out)) {
        return Ok(Vec::new());
    }
    let held = held(out);
    if !held.is_a_run() {
        return Ok(Vec::new());
    }
    if !overwrite {
        let out = out.display();
        return Err(Error::Config(format!(
            "--out {out} already holds another run ({}); continue it with --resume {out}, \
             replace it with --overwrite (its checkpoints, metrics and event files are removed), \
             or choose another --out",
            held.describe()
        )));
    }
    let removed: Vec<PathBuf> = held.checkpoints.into_iter().chain(held.metrics).collect();
    for path in &removed {
        fs::remove_file(path).map_err(Error::io(format!(
            "--overwrite: cannot remove {}",
            path.display()
        )))?;
    }
    Ok(removed)
}

/// The run directory of a `--resume` argument: the directory itself, or a checkpoint file's.
fn run_dir_of(resume: &Path) -> PathBuf {
    if resume.is_dir() {
        resume.to_path_buf()
    } else {
        resume
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    }
}

/// Whether `a` and `b` name one directory (by their canonical paths when both exist).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lsgd-rundir-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    const STEP: &str = r#"{"kind":"step","step":0,"epoch":0.0,"lr":0.1,"global_batch":8,"micro_batches":1,"label_smoothing":0.0,"loss":2.3,"samples_per_s":1.0,"compute_s":0.1,"communication_s":0.0,"bytes_sent":0,"payload_bytes":0,"compression_ratio":1.0,"policy_s":0.0}"#;

    #[test]
    fn another_runs_files_are_refused_then_removed_on_overwrite() {
        let d = scratch("refuse");
        assert_eq!(claim(&d, None, false).unwrap(), Vec::<PathBuf>::new());
        fs::write(d.join("checkpoint-00000008.json"), "{}").unwrap();
        fs::write(d.join("checkpoint-00000008.safetensors"), "x").unwrap();
        fs::write(d.join("checkpoint.json"), "{}").unwrap();
        fs::write(d.join("metrics.jsonl"), format!("{STEP}\n")).unwrap();
        fs::write(d.join("events.out.tfevents.1.host"), "x").unwrap();
        fs::write(d.join("notes.txt"), "mine").unwrap();
        let err = claim(&d, None, false).unwrap_err().to_string();
        let shown = d.display();
        assert_eq!(
            err,
            format!(
                "--out {shown} already holds another run (checkpoint at step 8 and metrics.jsonl \
                 with 1 step record); continue it with --resume {shown}, replace it with \
                 --overwrite (its checkpoints, metrics and event files are removed), or choose \
                 another --out"
            )
        );
        // Continuing it is allowed, by the directory or by its checkpoint file.
        assert!(claim(&d, Some(&d), false).unwrap().is_empty());
        assert!(claim(&d, Some(&d.join("checkpoint.json")), false).is_ok());
        // Continuing a different run into this one is not.
        let other = scratch("other");
        assert!(claim(&d, Some(&other), false).is_err());
        let removed = claim(&d, None, true).unwrap();
        assert_eq!(removed.len(), 5, "{removed:?}");
        assert!(!held(&d).is_a_run());
        assert_eq!(fs::read_to_string(d.join("notes.txt")).unwrap(), "mine");
        fs::remove_dir_all(&d).unwrap();
        fs::remove_dir_all(&other).unwrap();
    }

    #[test]
    fn restart_records_alone_are_not_a_run() {
        let d = scratch("restarts");
        fs::write(
            d.join("metrics.jsonl"),
            "{\"kind\":\"restart\",\"attempt\":1,\"lost_ranks\":[2],\"signal\":9,\
             \"world_size_before\":3,\"world_size_after\":2,\"resumed_step\":0,\"unix_s\":0.0,\
             \"elapsed_s\":1.0}\n",
        )
        .unwrap();
        assert!(!held(&d).is_a_run(), "{:?}", held(&d));
        assert!(claim(&d, None, false).is_ok());
        fs::remove_dir_all(&d).unwrap();
    }
}
