//! `OUT/metrics.jsonl`: one JSON object per step and one per evaluation, told apart by `kind`,
//! and optionally the same as `metrics.csv` (steps) and `eval.csv` (evaluations). A resumed
//! run first drops the records past its checkpoint, so the file never holds a step twice.
//! `lsgd-host launch` adds one `restart` record each time it restarts the job after a lost
//! rank; they describe the job rather than the training, so a resumed run keeps them all.
//! A resume with `--allow-policy-change` adds one `policy-change` record at its step, kept by
//! later resumes that continue from after it.
//! Every record written here also goes to a TensorBoard event file ([`crate::tensorboard`]),
//! as the scalars [`Record::scalars`] makes of it, so the two never disagree.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::tensorboard::{self, EventWriter};
use crate::{Error, Result};

/// One optimiser step.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Step index from 0.
    pub step: u64,
    /// Fractional epoch at the start of the step.
    pub epoch: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Momentum (SGD) or β1 (AdamW) a schedule set for the step (absent when none did).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    /// Global batch used.
    pub global_batch: u32,
    /// Micro-batches per worker (gradient-accumulation steps).
    pub micro_batches: u32,
    /// Label-smoothing ε used.
    pub label_smoothing: f32,
    /// Mean training loss over the global batch (with smoothing).
    pub loss: f64,
    /// Global batch / wall time of the step.
    pub samples_per_s: f64,
    /// Seconds in forward, backward and the update.
    pub compute_s: f64,
    /// Seconds in gradient communication.
    pub communication_s: f64,
    /// Of `communication_s`, the seconds the step waited for: all of it when the exchange
    /// runs after the backward pass, what outlasts the backward pass when it overlaps.
    #[serde(default)]
    pub exposed_communication_s: f64,
    /// Of `communication_s`, the seconds that ran behind the backward pass.
    #[serde(default)]
    pub hidden_communication_s: f64,
    /// Of `compute_s`, the seconds of the last micro-batch's backward pass: the part an
    /// overlapped exchange can run behind (the forward pass, earlier micro-batches and the
    /// update cannot), so a step is at best `compute_s - backward_s + max(backward_s,
    /// communication_s)`.
    #[serde(default)]
    pub backward_s: f64,
    /// Bytes this rank sent in the step's collectives.
    #[serde(default)]
    pub bytes_sent: u64,
    /// Bytes of this rank's gradient payloads (every bucket and round): what the codec made of
    /// the gradient, 4 per parameter without one.
    #[serde(default)]
    pub payload_bytes: u64,
    /// Gradient bytes in binary32 / `payload_bytes` (1 without a codec).
    #[serde(default = "one")]
    pub compression_ratio: f64,
    /// Seconds asking the policy plugins.
    pub policy_s: f64,
    /// The fp16 loss scale of the step's backward pass (absent unless `--precision fp16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
    /// The step's fp16 gradients overflowed on some rank, so no update was applied and the
    /// scale was halved (absent when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// `--mode async`: the rank whose gradient the step applied (absent in sync mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    /// `--mode async`: server steps taken between the weights the gradient was computed on
    /// and its application (0: fresh; absent in sync mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staleness: Option<u64>,
    /// With a sync policy (`--sync`): how the step moved, as its `plan` said (`synchronous`,
    /// `local` or `average`; absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
}

/// One evaluation on the test split, after the step that completed an epoch.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct EvalRecord {
    /// The step after which it ran (the number of steps taken).
    pub step: u64,
    /// Epochs completed.
    pub epoch: u32,
    /// Mean test cross-entropy.
    pub test_loss: f64,
    /// Top-1 test accuracy.
    pub test_acc: f64,
    /// Seconds since the run (or resumed run) started.
    pub elapsed_s: f64,
}

/// `lsgd-host launch` restarted the job after losing ranks (written before the restart).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RestartRecord {
    /// 1 for the first restart.
    pub attempt: u32,
    /// The ranks Open MPI reported lost, numbered in the world that lost them.
    pub lost_ranks: Vec<u32>,
    /// The signal that ended them (absent when a rank exited without one, e.g. improperly).
    pub signal: Option<i32>,
    /// Ranks before the loss.
    pub world_size_before: u32,
    /// Ranks of the restarted job.
    pub world_size_after: u32,
    /// The step the restarted job resumes from (0: no checkpoint yet, it starts over).
    pub resumed_step: u64,
    /// Seconds since the Unix epoch when the launcher restarted the job.
    pub unix_s: f64,
    /// Seconds since `launch` started.
    pub elapsed_s: f64,
}

/// `--fault-tolerance` survived a lost rank: the world shrank and the step in flight (or the
/// check or checkpoint after it) was redone on the ranks left (written after the redone step).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RankLostRecord {
    /// The step that was redone (or after which the check or checkpoint was).
    pub step: u64,
    /// What was in flight: `step`, `consistency check` or `checkpoint`.
    pub during: String,
    /// The ranks lost, numbered in the world that lost them.
    pub lost_ranks: Vec<u32>,
    /// Their hosts.
    pub hosts: Vec<String>,
    /// Those a survivor on their host killed (stopped or stuck, not dead).
    pub killed: Vec<u32>,
    /// Ranks before the loss.
    pub world_size_before: u32,
    /// Ranks after it.
    pub world_size_after: u32,
    /// Seconds from the start of the failed attempt to the first error on the rank that
    /// writes this (work thrown away, plus the failure detector's timeout for a silent rank).
    pub detect_s: f64,
    /// Seconds from that error to the redone attempt's end (agreement, shrink, redo).
    pub recover_s: f64,
    /// Seconds since the Unix epoch at the redone attempt's end.
    pub unix_s: f64,
}

/// `--grow-back` started replacements for lost ranks and the world grew back (written when the
/// replacements have the state, before the step the grown world starts with).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GrewBackRecord {
    /// The first step on the grown world.
    pub step: u64,
    /// Ranks before.
    pub world_size_before: u32,
    /// Ranks after.
    pub world_size_after: u32,
    /// The replacements' hosts, in rank order.
    pub hosts: Vec<String>,
    /// Seconds from the decision to grow to the replacements resuming the state (their start,
    /// libtorch and plugins included).
    pub seconds: f64,
    /// Seconds since the Unix epoch when it was written.
    pub unix_s: f64,
}

/// A resume with `--allow-policy-change` continued the run with other policy plugins, other
/// parameters or another `--epochs` (written when the resumed run opens its metrics).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PolicyChangeRecord {
    /// The step the new policies start at: the checkpoint's.
    pub step: u64,
    /// Each slot whose plugin changed, in slot order (empty when only `--epochs` did).
    pub changes: Vec<PluginChange>,
    /// `--epochs` of the checkpoint, when this run has another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_from: Option<u32>,
    /// `--epochs` of this run, when it differs from the checkpoint's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs_to: Option<u32>,
    /// The stateful plugins (slot keys) that start from a fresh instance: their identity
    /// changed, so the checkpoint's snapshot is not theirs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fresh_state: Vec<String>,
    /// The codec changed, so the checkpoint's error-feedback residuals (and DGC velocities),
    /// which only its codec's payloads can pay back, were dropped: the new one starts from zero.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub codec_state_dropped: bool,
}

/// One slot of a [`PolicyChangeRecord`]: the plugin there before and after, as identity
/// lines (`schedule warmup (blake3 1a2b3c4d5e6f…, params [...])`), `None` for no plugin.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PluginChange {
    /// The slot's key: `schedule`, `schedule.1` (a composed schedule's part), `codec` ...
    pub slot: String,
    /// The checkpoint's plugin in the slot.
    pub from: Option<String>,
    /// This run's plugin in the slot.
    pub to: Option<String>,
}

impl PolicyChangeRecord {
    /// Whether a checkpoint with these plugin identity lines and `--epochs` was written after
    /// this change (its new plugins and epochs in force), rather than before it.
    pub fn is_in(&self, plugins: &[String], epochs: u32) -> bool {
        let slot_of = |line: &String| line.split(' ').next().unwrap_or_default().to_string();
        let plugins_in = self.changes.iter().all(|c| match &c.to {
            Some(line) => plugins.contains(line),
            None => !plugins.iter().any(|l| slot_of(l) == c.slot),
        });
        plugins_in && self.epochs_to.is_none_or(|e| e == epochs)
    }
}

/// A line of metrics.jsonl.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    /// A step.
    Step(StepRecord),
    /// An evaluation.
    Eval(EvalRecord),
    /// A restart by `lsgd-host launch`.
    Restart(RestartRecord),
    /// A lost rank survived with `--fault-tolerance`.
    #[serde(rename = "rank-lost")]
    RankLost(RankLostRecord),
    /// Replacements for lost ranks joined (`--grow-back`).
    #[serde(rename = "grew-back")]
    GrewBack(GrewBackRecord),
    /// A resume that changed the policies (`--allow-policy-change`).
    #[serde(rename = "policy-change")]
    PolicyChange(PolicyChangeRecord),
}

impl Record {
    /// The step record, if this is one (`records.iter().filter_map(Record::as_step)`).
    pub fn as_step(&self) -> Option<&StepRecord> {
        match self {
            Record::Step(s) => Some(s),
            _ => None,
        }
    }

    /// The evaluation record, if this is one.
    pub fn as_eval(&self) -> Option<&EvalRecord> {
        match self {
            Record::Eval(e) => Some(e),
            _ => None,
        }
    }

    /// The policy-change record, if this is one.
    pub fn as_policy_change(&self) -> Option<&PolicyChangeRecord> {
        match self {
            Record::PolicyChange(c) => Some(c),
            _ => None,
        }
    }

    /// The TensorBoard step of the record and its scalars by tag: every number the record has
    /// (optional ones when present; `restart/lost_ranks` counts the lost ranks,
    /// `policy_change/plugins` the slots whose plugin changed). Steps are at x = their index
    /// (`train/*`), evaluations at x = the steps taken before them (`test/*`: the evaluation
    /// after step index 11 is at 12), restarts by `lsgd-host launch` at the step the job resumed
    /// from (`restart/*`), and a resume with `--allow-policy-change` at the step the new policies
    /// start at (`policy_change/*`).
    pub fn scalars(&self) -> (u64, Vec<(&'static str, f64)>) {
        match self {
            Record::Step(s) => {
                let mut v = vec![
                    ("train/loss", s.loss),
                    ("train/lr", s.lr),
                    ("train/global_batch", f64::from(s.global_batch)),
                    ("train/micro_batches", f64::from(s.micro_batches)),
                    ("train/label_smoothing", f64::from(s.label_smoothing)),
                    ("train/epoch", s.epoch),
                    ("train/samples_per_s", s.samples_per_s),
                    ("train/compute_s", s.compute_s),
                    ("train/communication_s", s.communication_s),
                    ("train/exposed_communication_s", s.exposed_communication_s),
                    ("train/hidden_communication_s", s.hidden_communication_s),
                    ("train/backward_s", s.backward_s),
                    ("train/policy_s", s.policy_s),
                    ("train/bytes_sent", s.bytes_sent as f64),
                    ("train/payload_bytes", s.payload_bytes as f64),
                    ("train/compression_ratio", s.compression_ratio),
                ];
                v.extend(s.momentum.map(|x| ("train/momentum", x)));
                v.extend(s.loss_scale.map(|x| ("train/loss_scale", x)));
                v.extend(s.worker.map(|x| ("train/worker", f64::from(x))));
                v.extend(s.staleness.map(|x| ("train/staleness", x as f64)));
                (s.step, v)
            }
            Record::Eval(e) => (
                e.step,
                vec![
                    ("test/loss", e.test_loss),
                    ("test/accuracy", e.test_acc),
                    ("test/epoch", f64::from(e.epoch)),
                    ("test/elapsed_s", e.elapsed_s),
                ],
            ),
            Record::Restart(r) => {
                let mut v = vec![
                    ("restart/attempt", f64::from(r.attempt)),
                    ("restart/lost_ranks", r.lost_ranks.len() as f64),
                    ("restart/world_size_before", f64::from(r.world_size_before)),
                    ("restart/world_size_after", f64::from(r.world_size_after)),
                    ("restart/elapsed_s", r.elapsed_s),
                ];
                v.extend(r.signal.map(|x| ("restart/signal", f64::from(x))));
                (r.resumed_step, v)
            }
            Record::RankLost(r) => (
                r.step + 1,
                vec![
                    ("rank_lost/lost_ranks", r.lost_ranks.len() as f64),
                    ("rank_lost/world_size_after", f64::from(r.world_size_after)),
                    ("rank_lost/detect_s", r.detect_s),
                    ("rank_lost/recover_s", r.recover_s),
                ],
            ),
            Record::GrewBack(g) => (
                g.step,
                vec![
                    ("grew_back/world_size_after", f64::from(g.world_size_after)),
                    ("grew_back/seconds", g.seconds),
                ],
            ),
            Record::PolicyChange(c) => {
                // A marker at the step, whatever changed: a chart of it shows where.
                let mut v = vec![
                    ("policy_change/count", 1.0),
                    ("policy_change/plugins", c.changes.len() as f64),
                ];
                v.extend(c.epochs_to.map(|e| ("policy_change/epochs", f64::from(e))));
                if c.codec_state_dropped {
                    v.push(("policy_change/codec_state_dropped", 1.0));
                }
                (c.step, v)
            }
        }
    }

    /// The wall time of the record's event: a restart's is when the launcher restarted the
    /// job, since `launch` writes it later; every other record's is now, as it is written.
    fn wall_time(&self) -> f64 {
        match self {
            Record::Restart(r) => r.unix_s,
            Record::RankLost(r) => r.unix_s,
            _ => tensorboard::unix_s(),
        }
    }

    fn step(&self) -> u64 {
        match self {
            Record::Step(s) => s.step + 1,
            Record::Eval(e) => e.step,
            Record::Restart(r) => r.resumed_step,
            Record::PolicyChange(c) => c.step,
            Record::RankLost(r) => r.step + 1,
            Record::GrewBack(g) => g.step,
        }
    }
}

/// The checkpoint a resumed run continues, as [`MetricsWriter::open`] needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// Its step.
    pub step: u64,
    /// The identity lines of the plugins it was written with.
    pub plugins: Vec<String>,
    /// The `--epochs` it was written with.
    pub epochs: u32,
}

const STEP_HEADER: &str = "step,epoch,lr,global_batch,micro_batches,label_smoothing,loss,samples_per_s,compute_s,communication_s,bytes_sent,payload_bytes,compression_ratio,policy_s,loss_scale,skipped,worker,staleness,momentum,exposed_communication_s,hidden_communication_s,backward_s,sync";

fn one() -> f64 {
    1.0
}
const EVAL_HEADER: &str = "step,epoch,test_loss,test_acc,elapsed_s";

/// Reads every record of a metrics.jsonl file. A last line without its newline that is not a
/// whole record is what a writer killed mid-record left (`kill -9` between two flushes): it is
/// dropped, as `launch` drops it, since the step it described is past every checkpoint. Any
/// other line that is not a record is an error naming the file and line.
pub fn read(path: &Path) -> Result<Vec<Record>> {
    let bytes = fs::read(path).map_err(Error::io(format!("cannot read {}", path.display())))?;
    let whole = whole_lines(&bytes);
    let text = std::str::from_utf8(whole)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        .map_err(Error::io(format!("{}: not UTF-8 text", path.display())))?;
    let mut records = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|source| Error::Json {
                context: format!(
                    "{}:{}: not a metrics record (expected a JSON object with \"kind\": \"step\", \"eval\", \"restart\" or \"policy-change\")",
                    path.display(),
                    i + 1
                ),
                source,
            })
        })
        .collect::<Result<Vec<Record>>>()?;
    let tail = &bytes[whole.len()..];
    if let Ok(last) = serde_json::from_slice::<Record>(tail) {
        records.push(last);
    }
    Ok(records)
}

/// The part of a metrics file up to and including its last newline: the records written whole.
pub fn whole_lines(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    &bytes[..end]
}

/// Appends records to the metrics files of a run directory.
pub struct MetricsWriter {
    /// The run directory, for error messages.
    dir: PathBuf,
    jsonl: BufWriter<File>,
    csv: Option<(BufWriter<File>, BufWriter<File>)>,
    events: EventWriter,
}

impl MetricsWriter {
    /// Opens `dir/metrics.jsonl` (and the CSV files when `csv`): fresh for a new run, or kept
    /// up to and including the step of the checkpoint `resumed` continues. Restart records
    /// survive a resume, and a new run when they are all the file holds: `launch` clears a
    /// failed attempt's steps before it starts the job over without a checkpoint. A
    /// policy-change record at the checkpoint's own step survives only if the checkpoint was
    /// written after it (an earlier resume changed the policies, then stopped at once), not
    /// when it was that resume's starting point. A new event file receives the records from the
    /// resume step on (after a `SessionLog.START` that hides the earlier files' events from
    /// there on); a new run removes the old event files first.
    pub fn open(dir: &Path, csv: bool, resumed: Option<&Resumed>) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let restart = |r: &Record| matches!(r, Record::Restart(_));
        let resume_step = resumed.map(|r| r.step);
        let kept = match resumed {
            Some(from) if path.exists() => read(&path)?
                .into_iter()
                .filter(|r| match r {
                    Record::Restart(_) => true,
                    Record::PolicyChange(c) if c.step == from.step => {
                        c.is_in(&from.plugins, from.epochs)
                    }
                    r => r.step() <= from.step,
                })
                .collect(),
            // A new run starts over whatever an earlier one left, readable or not.
            None => read(&path)
                .ok()
                .filter(|records| records.iter().all(restart))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        // Written beside and renamed over the old file, so a crash here loses nothing.
        let tmp = dir.join("metrics.jsonl.tmp");
        if resume_step.is_none() {
            tensorboard::remove_event_files(dir)?;
        }
        let mut events = EventWriter::create(dir)?;
        if let Some(step) = resume_step {
            events.session_start(step).map_err(events.error())?;
        }
        let mut w = MetricsWriter {
            dir: dir.to_path_buf(),
            jsonl: BufWriter::new(create(&tmp)?),
            csv: if csv {
                let mut s = BufWriter::new(create(&dir.join("metrics.csv"))?);
                let mut e = BufWriter::new(create(&dir.join("eval.csv"))?);
                let io = |p: &str| Error::io(format!("cannot write {}", dir.join(p).display()));
                writeln!(s, "{STEP_HEADER}").map_err(io("metrics.csv"))?;
                writeln!(e, "{EVAL_HEADER}").map_err(io("eval.csv"))?;
                Some((s, e))
            } else {
                None
            },
            events,
        };
        let from = resume_step.unwrap_or(0);
        for r in &kept {
            // Earlier event files hold the records before `from`, which the START leaves.
            w.append(r).map_err(Error::io(format!(
                "cannot write metrics in {}",
                dir.display()
            )))?;
            if r.scalars().0 >= from {
                w.event(r)?;
            }
        }
        w.flush()?;
        fs::rename(&tmp, &path).map_err(Error::io(format!("cannot replace {}", path.display())))?;
        Ok(w)
    }

    /// Appends one record.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        self.append(record).map_err(Error::io(format!(
            "cannot write metrics in {}",
            self.dir.display()
        )))?;
        self.event(record)
    }

    /// Writes `record` to the event file, as one event of its scalars.
    fn event(&mut self, record: &Record) -> Result<()> {
        let (step, values) = record.scalars();
        self.events
            .scalars(record.wall_time(), step, &values)
            .map_err(self.events.error())
    }

    /// Hands each line to its writer in one piece: a buffer that fills mid-record would
    /// otherwise write the record's first half, and a kill before the next flush tore it.
    fn append(&mut self, record: &Record) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.jsonl.write_all(&line)?;
        if let Some((steps, evals)) = &mut self.csv {
            match record {
                Record::Step(s) => steps.write_all(
                    format!(
                        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                        s.step,
                        s.epoch,
                        s.lr,
                        s.global_batch,
                        s.micro_batches,
                        s.label_smoothing,
                        s.loss,
                        s.samples_per_s,
                        s.compute_s,
                        s.communication_s,
                        s.bytes_sent,
                        s.payload_bytes,
                        s.compression_ratio,
                        s.policy_s,
                        s.loss_scale.map(|v| v.to_string()).unwrap_or_default(),
                        u8::from(s.skipped),
                        s.worker.map(|v| v.to_string()).unwrap_or_default(),
                        s.staleness.map(|v| v.to_string()).unwrap_or_default(),
                        s.momentum.map(|v| v.to_string()).unwrap_or_default(),
                        s.exposed_communication_s,
                        s.hidden_communication_s,
                        s.backward_s,
                        s.sync.as_deref().unwrap_or_default()
                    )
                    .as_bytes(),
                )?,
                Record::Eval(e) => evals.write_all(
                    format!(
                        "{},{},{},{},{}\n",
                        e.step, e.epoch, e.test_loss, e.test_acc, e.elapsed_s
                    )
                    .as_bytes(),
                )?,
                // The CSV files hold the training only.
                Record::Restart(_)
                | Record::PolicyChange(_)
                | Record::RankLost(_)
                | Record::GrewBack(_) => {}
            }
        }
        Ok(())
    }

    /// Pushes buffered records to disk (at evaluations, checkpoints and the end).
    pub fn flush(&mut self) -> Result<()> {
        let flushed = self.jsonl.flush().and_then(|()| match &mut self.csv {
            Some((s, e)) => s.flush().and_then(|()| e.flush()),
            None => Ok(()),
        });
        flushed.map_err(Error::io(format!(
            "cannot write metrics in {}",
            self.dir.display()
        )))?;
        self.events.flush()
    }
}

fn create(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(Error::io(format!("cannot write {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(step: u64, to: &str) -> Record {
        Record::PolicyChange(PolicyChangeRecord {
            step,
            changes: vec![PluginChange {
                slot: "schedule".into(),
                from: Some("schedule a (blake3 1…, params [])".into()),
                to: Some(to.into()),
            }],
            epochs_from: None,
            epochs_to: None,
            fresh_state: Vec::new(),
            codec_state_dropped: false,
        })
    }

    fn eval(step: u64) -> Record {
        Record::Eval(EvalRecord {
            step,
            epoch: 1,
            test_loss: 1.0,
            test_acc: 0.5,
            elapsed_s: 1.0,
        })
    }

    #[test]
    fn each_record_becomes_its_scalars_at_its_tensorboard_step() {
        let step = Record::Step(StepRecord {
            step: 300,
            epoch: 1.5,
            lr: 0.1,
            momentum: Some(0.9),
            global_batch: 256,
            micro_batches: 2,
            label_smoothing: 0.1,
            loss: 2.25,
            samples_per_s: 1000.0,
            compute_s: 0.5,
            communication_s: 0.25,
            exposed_communication_s: 0.125,
            hidden_communication_s: 0.125,
            backward_s: 0.25,
            bytes_sent: 1 << 20,
            payload_bytes: 4096,
            compression_ratio: 32.0,
            policy_s: 0.001,
            loss_scale: Some(65536.0),
            skipped: false,
            worker: None,
            staleness: None,
            sync: None,
        });
        let (at, values) = step.scalars();
        assert_eq!(at, 300);
        assert_eq!(
            values,
            [
                ("train/loss", 2.25),
                ("train/lr", 0.1),
                ("train/global_batch", 256.0),
                ("train/micro_batches", 2.0),
                ("train/label_smoothing", f64::from(0.1f32)),
                ("train/epoch", 1.5),
                ("train/samples_per_s", 1000.0),
                ("train/compute_s", 0.5),
                ("train/communication_s", 0.25),
                ("train/exposed_communication_s", 0.125),
                ("train/hidden_communication_s", 0.125),
                ("train/backward_s", 0.25),
                ("train/policy_s", 0.001),
                ("train/bytes_sent", f64::from(1 << 20)),
                ("train/payload_bytes", 4096.0),
                ("train/compression_ratio", 32.0),
                ("train/momentum", 0.9),
                ("train/loss_scale", 65536.0),
            ]
        );
        // An evaluation is at the steps taken before it, not at the index of the last one.
        assert_eq!(
            eval(301).scalars(),
            (
                301,
                vec![
                    ("test/loss", 1.0),
                    ("test/accuracy", 0.5),
                    ("test/epoch", 1.0),
                    ("test/elapsed_s", 1.0),
                ]
            )
        );
        let restart = Record::Restart(RestartRecord {
            attempt: 1,
            lost_ranks: vec![2, 3],
            signal: Some(9),
            world_size_before: 4,
            world_size_after: 2,
            resumed_step: 40,
            unix_s: 1.5e9,
            elapsed_s: 60.0,
        });
        let (at, values) = restart.scalars();
        assert_eq!(at, 40);
        assert!(values.contains(&("restart/lost_ranks", 2.0)), "{values:?}");
        assert!(values.contains(&("restart/signal", 9.0)), "{values:?}");
        assert_eq!(restart.wall_time(), 1.5e9);
        let (at, values) = change(4, "schedule b (blake3 2…, params [])").scalars();
        assert_eq!(at, 4);
        assert_eq!(
            values,
            [("policy_change/count", 1.0), ("policy_change/plugins", 1.0)]
        );
    }

    #[test]
    fn a_torn_last_line_is_dropped_and_a_torn_earlier_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("lsgd-metrics-torn-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metrics.jsonl");
        let line = |step| serde_json::to_string(&eval(step)).unwrap();
        let (a, b) = (line(1), line(2));
        let torn = &b[..b.len() / 2];
        fs::write(&path, format!("{a}\n{torn}")).unwrap();
        assert_eq!(read(&path).unwrap(), [eval(1)]);
        // Whole but for its newline: a record, kept.
        fs::write(&path, format!("{a}\n{b}")).unwrap();
        assert_eq!(read(&path).unwrap(), [eval(1), eval(2)]);
        fs::write(&path, format!("{a}\n{torn}\n{b}\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.ends_with("metrics.jsonl:2: not a metrics record (expected a JSON object with \"kind\": \"step\", \"eval\", \"restart\" or \"policy-change\")"), "{e}");
        // A resume keeps the whole records and leaves a file without the torn line.
        fs::write(&path, format!("{a}\n{b}\n{torn}")).unwrap();
        let resumed = Resumed {
            step: 5,
            plugins: Vec::new(),
            epochs: 1,
        };
        drop(MetricsWriter::open(&dir, false, Some(&resumed)).unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), format!("{a}\n{b}\n"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_policy_change_survives_a_resume_after_it_but_not_one_from_before_it() {
        let dir = std::env::temp_dir().join(format!("lsgd-metrics-change-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let b = "schedule b (blake3 2…, params [])";
        let records = [eval(2), change(2, b), eval(4), change(4, b), eval(6)];
        let text: String = records
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        let tagged = serde_json::to_value(&records[1]).unwrap();
        assert_eq!(tagged["kind"], "policy-change");
        let kept = |step: u64, plugins: &[&str]| {
            fs::write(dir.join("metrics.jsonl"), &text).unwrap();
            let resumed = Resumed {
                step,
                plugins: plugins.iter().map(|p| p.to_string()).collect(),
                epochs: 1,
            };
            drop(MetricsWriter::open(&dir, false, Some(&resumed)).unwrap());
            read(&dir.join("metrics.jsonl")).unwrap()
        };
        // From step 4 with b in force: the change at 4 came before the checkpoint.
        assert_eq!(kept(4, &[b]), records[..4]);
        // From step 4 with a: the checkpoint is the one the change at 4 started from.
        assert_eq!(
            kept(4, &["schedule a (blake3 1…, params [])"]),
            records[..3]
        );
        assert_eq!(kept(6, &[b]), records);
        fs::remove_dir_all(&dir).unwrap();
    }
}
