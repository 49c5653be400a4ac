//! A step with `--fault-tolerance`: a lost rank costs the step in flight, not the run.
//!
//! The world's collectives report a lost rank instead of ending the job
//! ([`World::init_tolerant`](lsgd_collective::World::init_tolerant)). Before the update the
//! ranks agree ([`World::agree`](lsgd_collective::World::agree), ULFM's agreement: the same
//! answer on every survivor) that no collective of the step failed on any of them. When one
//! did, every survivor puts back what the step changed so far (the stateful plugins' state,
//! the codec residuals and codec state, BatchNorm's running statistics; nothing was updated
//! yet), the world shrinks to the survivors (only a majority goes on), and the step is redone:
//! the policies decide again for the smaller world, and the same global batch is sharded over
//! fewer ranks, as a resume on fewer ranks would. The checks and checkpoints after a step are
//! agreed and redone the same way ([`Trainer::surviving`]).

use std::time::{Duration, Instant};

use lsgd_collective::Shrunk;
use tch::Tensor;

use super::identity::identity;
use super::{Metrics, Trainer};
use crate::metrics::{self, GrewBackRecord, MetricsWriter, RankLostRecord, Record};
use crate::model::Model;
use crate::progress::Progress;
use crate::{Error, Result};

/// What fault tolerance keeps across the attempts of a step.
pub(super) struct Survival {
    /// This rank in the world the run started with (what `--lose-rank` names), and its size.
    first_rank: usize,
    first_size: usize,
    /// The step whose exchange committed codec state on this rank in the current attempt.
    exchanged: Option<u64>,
    /// `--quiet`, for the progress of a rank that takes over from a lost rank 0.
    quiet: bool,
    /// Losses survived whose record waits for the end of the work redone after them.
    pending: Vec<Pending>,
    /// Why replacements cannot be started (`--grow-back` is not tried again), and whether
    /// that was said.
    cannot_grow: Option<String>,
    said_cannot_grow: bool,
}

struct Pending {
    shrunk: Shrunk,
    during: &'static str,
    step: u64,
    /// The failed attempt's start and the first error this rank saw in it.
    began: Instant,
    first_error: Instant,
}

impl Survival {
    /// Nothing survived yet, on `first_rank` of the starting world.
    pub(super) fn new(first_rank: usize, first_size: usize, quiet: bool) -> Survival {
        Survival {
            first_rank,
            first_size,
            exchanged: None,
            quiet,
            pending: Vec::new(),
            cannot_grow: None,
            said_cannot_grow: false,
        }
    }

    /// The exchange of `step` committed codec state: a redo must roll it back.
    pub(super) fn exchanged(&mut self, step: u64) {
        self.exchanged = Some(step);
    }
}

/// The model's buffers (BatchNorm's running statistics) as they were before an attempt.
enum Buffers {
    /// A TorchScript module's, in its own order.
    Script(Vec<Tensor>),
    /// The built-in models': each non-trainable variable and its copy.
    Vars(Vec<(Tensor, Tensor)>),
}

impl Trainer<'_> {
    /// [`Trainer::step`] with fault tolerance: attempts until the ranks agree that nothing
    /// before the update failed, shrinking the world after each loss.
    pub(super) fn step_surviving(&mut self) -> Result<()> {
        loop {
            let step = self.clock.step();
            let buffers = self.save_buffers();
            let began = Instant::now();
            self.survival.exchanged = None;
            let attempt = self.attempt();
            if let Err(e) = &attempt
                && !e.is_rank_lost()
            {
                return attempt.map(drop);
            }
            if self.world.agree(attempt.is_ok()) {
                self.commit(attempt?)?;
                self.record_losses()?;
                return self.grow_back();
            }
            self.policies.rewind(step).map_err(Error::from)?;
            if self.survival.exchanged.take() == Some(step) {
                self.gradients.rollback();
            }
            restore_buffers(&self.model, buffers);
            self.shrink_world("step", step, began)?;
        }
    }

    /// Runs `f` (collectives after a step's update: the consistency check, a checkpoint) until
    /// the ranks agree that it succeeded everywhere, shrinking the world after each loss; without
    /// fault tolerance, once.
    pub(super) fn surviving<T>(
        &mut self,
        during: &'static str,
        mut f: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if !self.world.is_tolerant() {
            return f(self);
        }
        loop {
            let began = Instant::now();
            let done = f(self);
            if matches!(&done, Err(e) if !e.is_rank_lost()) {
                return done;
            }
            if self.world.agree(done.is_ok()) {
                self.record_losses()?;
                return done;
            }
            let step = self.clock.step().saturating_sub(1);
            self.shrink_world(during, step, began)?;
        }
    }

    /// `--grow-back`, at a step boundary of a world smaller than it started: rank 0 writes a
    /// checkpoint, the survivors start a replacement for each lost rank (the same `run`), take
    /// them into the world after themselves, check they loaded the same plugins, and send them
    /// the checkpoint, which they resume as a resume on the grown world would.
    fn grow_back(&mut self) -> Result<()> {
        let wanted = self.survival.first_size;
        let grow = self
            .config
            .invocation
            .tolerance
            .as_ref()
            .is_some_and(|t| t.grow_back);
        let size = self.world.size();
        if !grow || size >= wanted || self.clock.finished() || self.survival.said_cannot_grow {
            return Ok(());
        }
        let began = Instant::now();
        let step = self.clock.step();
        if let Some(why) = self.why_not_grow(wanted - size)? {
            self.stop_growing("not growing back", step, why);
            return Ok(());
        }
        self.metrics.flush()?;
        let json = self.save("grow")?;
        // MPI_Comm_spawn reports its failure to every survivor alike (no slot left, a missing
        // binary): the run goes on with the ranks it has, as it would without --grow-back.
        let hosts = match self.world.grow(wanted - size, "env", &replacement_argv()?) {
            Err(lsgd_collective::Error::Grow(why)) if self.world.size() == size => {
                self.stop_growing("could not grow back", step, why);
                return Ok(());
            }
            grown => grown?,
        };
        super::identity::same_plugins(self.world, &self.plugins)?;
        self.send_checkpoint(&json)?;
        self.clock.set_world_size(self.world.size() as u32);
        let record = GrewBackRecord {
            step,
            world_size_before: size as u32,
            world_size_after: self.world.size() as u32,
            hosts,
            seconds: began.elapsed().as_secs_f64(),
            unix_s: crate::tensorboard::unix_s(),
        };
        self.progress.line(&format!(
            "grew back from {size} to {} ranks at step {step} in {:.2} s (on {})",
            record.world_size_after,
            record.seconds,
            record.hosts.join(", ")
        ));
        self.metrics.write(&Record::GrewBack(record))?;
        self.metrics.flush()
    }

    /// Why the world cannot grow by `missing` ranks now, the same on every rank (collective):
    /// rank 0's reason (each rank judges a silent loss by its own timing), else too few spare
    /// slots by rank 0's count.
    fn why_not_grow(&mut self, missing: usize) -> Result<Option<String>> {
        let mut reason = (self.survival.cannot_grow.clone())
            .unwrap_or_default()
            .into_bytes();
        self.world.broadcast_bytes(&mut reason)?;
        if !reason.is_empty() {
            return Ok(Some(String::from_utf8_lossy(&reason).into_owned()));
        }
        let spare = self.world.spare_slots()?;
        Ok((spare < missing).then(|| {
            format!(
                "{spare} spare slot(s) for {missing} replacement(s): a lost process keeps its \
                 slot, so give mpirun more slots than -np (a hostfile with spare hosts)"
            )
        }))
    }

    /// Gives up `--grow-back` for the rest of the run, saying `what` happened at `step` and why.
    fn stop_growing(&mut self, what: &str, step: u64, why: String) {
        self.progress.line(&format!(
            "{what} at step {step}: {why}; going on with {} ranks",
            self.world.size()
        ));
        self.survival.cannot_grow = Some(why);
        self.survival.said_cannot_grow = true;
    }

    /// Rank 0's checkpoint `json` and its tensors to every rank (a replacement writes them into
    /// `dir` and resumes from there; the others have the state already): two broadcasts.
    pub(super) fn send_checkpoint(&mut self, json: &std::path::Path) -> Result<Vec<Vec<u8>>> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(Error::io(format!("cannot read {}", p.display())))
        };
        let mut meta = if self.world.is_root() {
            read(json)?
        } else {
            Vec::new()
        };
        self.world.broadcast_bytes(&mut meta)?;
        let name: String = serde_json::from_slice::<serde_json::Value>(&meta)
            .ok()
            .and_then(|v| v["tensors"].as_str().map(String::from))
            .ok_or_else(|| {
                Error::Checkpoint("the checkpoint rank 0 sent names no tensors".into())
            })?;
        let dir = json.parent().unwrap_or(std::path::Path::new("."));
        let mut tensors = if self.world.is_root() {
            read(&dir.join(&name))?
        } else {
            Vec::new()
        };
        self.world.broadcast_bytes(&mut tensors)?;
        Ok(vec![meta, name.into_bytes(), tensors])
    }

    /// A replacement's start ([`World::joined`](lsgd_collective::World::joined)): the
    /// checkpoint the survivors send, written into a directory of its own and resumed.
    pub(super) fn join(&mut self) -> Result<()> {
        let received = self.send_checkpoint(std::path::Path::new(""))?;
        let dir = std::env::temp_dir().join(format!("lsgd-join-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(Error::io(format!("cannot create {}", dir.display())))?;
        let name = String::from_utf8_lossy(&received[1]).into_owned();
        let write = |p: std::path::PathBuf, b: &[u8]| {
            std::fs::write(&p, b).map_err(Error::io(format!("cannot write {}", p.display())))
        };
        write(dir.join(&name), &received[2])?;
        write(dir.join(crate::checkpoint::JSON_NAME), &received[0])?;
        let resumed = self.resume(&dir.join(crate::checkpoint::JSON_NAME), false, true);
        let _ = std::fs::remove_dir_all(&dir);
        resumed.map(drop)
    }

    /// `--lose-rank`: this rank goes now if it is the one named for `step`.
    pub(super) fn lose_on_purpose(&self, step: u64) {
        if let Some(l) = &self.config.invocation.lose
            && l.ranks.contains(&self.survival.first_rank)
            && l.step == step
        {
            // The ranks' numbers as they are now: none of them was lost before, or the world
            // would not have them in the starting order any more.
            if self.world.size() == self.survival.first_size {
                l.how.inflict_together(self.world, &l.ranks);
            }
            l.how.inflict();
        }
    }

    /// The survivors' world after a failed `during` of `step`: shrunk, the clock told, rank 0's
    /// duties taken over if it was lost; below `--min-np` the survivors stop with a checkpoint.
    fn shrink_world(&mut self, during: &'static str, step: u64, began: Instant) -> Result<()> {
        let shrunk = self.world.shrink()?;
        let first_error = Instant::now()
            .checked_sub(shrunk.since_failure)
            .unwrap_or(began)
            .max(began);
        self.clock.set_world_size(self.world.size() as u32);
        self.take_over_metrics()?;
        if shrunk.lost.is_empty() {
            // An MPI error without a lost rank (seen once, under load, in the first hierarchical
            // all-reduce): the step is redone all the same, and said, but no rank was lost.
            self.progress.line(&format!(
                "a collective of the {during} of step {step} failed without losing a rank (MPI \
                 error class {}: {}); redone on the same {} ranks",
                shrunk.class,
                lsgd_collective::ulfm::class_name(shrunk.class),
                self.world.size()
            ));
            return Ok(());
        }
        let lost: Vec<usize> = shrunk.lost.iter().map(|l| l.rank).collect();
        let hosts: Vec<&str> = shrunk.lost.iter().map(|l| l.host.as_str()).collect();
        self.progress.line(&format!(
            "lost rank(s) {lost:?} on {} during the {during} of step {step}: {} of {} ranks go on",
            hosts.join(", "),
            self.world.size(),
            shrunk.before
        ));
        if let Some(note) = &shrunk.note {
            self.progress.line(note);
        }
        let min_np = (self.config.invocation.tolerance.as_ref()).map_or(1, |t| t.min_np);
        if self.world.size() < min_np {
            self.metrics.flush()?;
            let checkpoint = self.save("rank-lost")?;
            return Err(Error::TooFewRanks {
                lost,
                step,
                left: self.world.size(),
                min_np,
                checkpoint,
            });
        }
        if let Some(l) = shrunk.lost.iter().find(|l| l.silent && !l.fenced) {
            // Its host (and the MPI daemon there) may be gone: a spawn would reach that daemon,
            // and Open MPI 5.0.11's mpirun ends the whole job once it finds it lost.
            self.survival.cannot_grow.get_or_insert_with(|| {
                format!(
                    "rank {} on {} fell silent (stopped, hung, or its host or link gone) on a \
                     host no survivor shares, and a spawn that reaches a lost MPI daemon makes \
                     Open MPI 5.0.11 end the job",
                    l.rank, l.host
                )
            });
        }
        self.survival.pending.push(Pending {
            shrunk,
            during,
            step,
            began,
            first_error,
        });
        Ok(())
    }

    /// After rank 0 was lost, the new rank 0 writes the metrics (after the records its
    /// predecessor had flushed) and shows the progress.
    fn take_over_metrics(&mut self) -> Result<()> {
        if !self.world.is_root() || self.metrics.0.is_some() {
            return Ok(());
        }
        let inv = &self.config.invocation;
        let from = metrics::Resumed {
            step: self.clock.step(),
            plugins: identity(&self.plugins),
            epochs: self.config.run.epochs,
        };
        self.metrics = Metrics(Some(MetricsWriter::open(&inv.out, inv.csv, Some(&from))?));
        let total = self.clock.state().total_steps;
        self.progress = Progress::new(total, self.survival.quiet);
        Ok(())
    }

    /// Writes the record of each loss survived since the last agreed success (rank 0).
    fn record_losses(&mut self) -> Result<()> {
        if self.survival.pending.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        for p in std::mem::take(&mut self.survival.pending) {
            let seconds = |d: Duration| d.as_secs_f64();
            let record = RankLostRecord {
                step: p.step,
                during: p.during.to_string(),
                lost_ranks: p.shrunk.lost.iter().map(|l| l.rank as u32).collect(),
                hosts: p.shrunk.lost.iter().map(|l| l.host.clone()).collect(),
                killed: (p.shrunk.lost.iter())
                    .filter(|l| l.fenced)
                    .map(|l| l.rank as u32)
                    .collect(),
                world_size_before: p.shrunk.before as u32,
                world_size_after: (p.shrunk.before - p.shrunk.lost.len()) as u32,
                detect_s: seconds(p.first_error - p.began),
                recover_s: seconds(now - p.first_error),
                unix_s: crate::tensorboard::unix_s(),
            };
            self.progress.line(&format!(
                "{} of step {} redone on {} rank(s): {:.2} s from the first error to its end",
                p.during, p.step, record.world_size_after, record.recover_s
            ));
            self.metrics.write(&Record::RankLost(record))?;
        }
        self.metrics.flush()
    }

    /// Copies of the model's buffers, to put back when an attempt is redone.
    fn save_buffers(&self) -> Buffers {
        let _guard = tch::no_grad_guard();
        match &self.model {
            Model::Script(script) => Buffers::Script(script.save_buffers()),
            _ => Buffers::Vars(
                self.vs
                    .variables()
                    .into_values()
                    .filter(|t| !t.requires_grad())
                    .map(|t| {
                        let copy = t.copy();
                        (t, copy)
                    })
                    .collect(),
            ),
        }
    }
}

fn restore_buffers(model: &Model, saved: Buffers) {
    let _guard = tch::no_grad_guard();
    match (model, saved) {
        (Model::Script(script), Buffers::Script(saved)) => script.restore_buffers(&saved),
        (_, Buffers::Vars(pairs)) => {
            for (live, copy) in pairs {
                live.shallow_clone().copy_(&copy);
            }
        }
        _ => {}
    }
}

/// The command line of a replacement: this `lsgd-host run` through env(1), so that it loads
/// this process's libmpi (Open MPI 5's), whatever mpirun hands a spawned job.
fn replacement_argv() -> Result<Vec<String>> {
    let exe = std::env::current_exe().map_err(Error::io("cannot locate the lsgd-host binary"))?;
    let mut argv = vec![format!(
        "LD_LIBRARY_PATH={}",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    )];
    argv.push(exe.display().to_string());
    argv.extend(std::env::args().skip(1));
    Ok(argv)
}
