//! The training clock: produces the `train-state` of every step. Time is counted in samples so
//! it stays meaningful when a batch-size policy changes the global batch mid-run: each step
//! consumes one global batch from an endless stream of epochs, and the fractional epoch is
//! `samples_seen / samples_per_epoch`. While the batch is constant this equals
//! `step / steps_per_epoch` bit for bit (both are correctly rounded quotients of the same
//! rational number), which is the clock Goyal et al. use.
//!
//! With a sync policy the clock also keeps the run's place in its synchronisation windows
//! ([`Window`]), so that the trainer, `trace`, `compare` and lsgd-torch count windows alike:
//! each step's plan goes through [`Clock::pass`] beside [`Clock::advance`].

use lsgd_policy::{State, StepKind, Window};

use crate::plugin::words::{CLI, Knob, Words};
use crate::{Error, Result};

/// The fixed shape of a run, from the command line or config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunShape {
    /// Epochs to train.
    pub epochs: u32,
    /// Training samples per epoch (the data set size).
    pub samples_per_epoch: u64,
    /// Global batch at step 0.
    pub initial_batch: u32,
    /// Data-parallel workers.
    pub world_size: u32,
    /// Learning rate at `reference_batch`.
    pub base_lr: f64,
    /// Batch size `base_lr` applies to.
    pub reference_batch: u32,
}

impl RunShape {
    /// Checks the shape makes sense before any policy sees it; the error
    /// ([`Error::Shape`]) names the flag to fix.
    pub fn validate(&self) -> Result<()> {
        self.check(&CLI)
    }

    /// The same check, naming what to fix in the caller's `words`.
    pub fn check(&self, words: &Words) -> Result<()> {
        let at_least_one = |knob| Err(shape(format!("{} must be at least 1", words.subject(knob))));
        if self.epochs == 0 {
            return at_least_one(Knob::Epochs);
        }
        if self.samples_per_epoch == 0 {
            return Err(shape("an epoch must have at least one sample"));
        }
        if self.world_size == 0 {
            return at_least_one(Knob::WorldSize);
        }
        if self.initial_batch == 0 || !self.initial_batch.is_multiple_of(self.world_size) {
            return Err(shape(format!(
                "{} must be a positive multiple of the world size {}",
                words.with_value(Knob::GlobalBatch, self.initial_batch),
                self.world_size
            )));
        }
        if self.reference_batch == 0 {
            return at_least_one(Knob::ReferenceBatch);
        }
        if !(self.base_lr.is_finite() && self.base_lr >= 0.0) {
            return Err(shape(format!(
                "{} must be finite and >= 0, got {}",
                words.subject(Knob::BaseLr),
                self.base_lr
            )));
        }
        Ok(())
    }

    /// Samples the whole run consumes.
    pub fn total_samples(&self) -> u64 {
        self.samples_per_epoch
            .saturating_mul(u64::from(self.epochs))
    }
}

fn shape(message: impl Into<String>) -> Error {
    Error::Shape(message.into())
}

/// Where training is: step, samples consumed, last loss and metric, synchronisation window.
#[derive(Debug, Clone, PartialEq)]
pub struct Clock {
    shape: RunShape,
    step: u64,
    samples_seen: u64,
    last_loss: Option<f64>,
    last_metric: Option<f64>,
    window: Window,
}

impl Clock {
    /// A clock at step 0; the shape must be valid.
    pub fn new(shape: RunShape) -> Result<Self> {
        shape.validate()?;
        Ok(Clock {
            shape,
            step: 0,
            samples_seen: 0,
            last_loss: None,
            last_metric: None,
            window: Window::default(),
        })
    }

    /// A clock where a checkpointed run stopped: `step` steps taken, `samples_seen` consumed;
    /// with a sync policy, [`Clock::set_window`] puts its window back.
    pub fn resume(
        shape: RunShape,
        step: u64,
        samples_seen: u64,
        last_loss: Option<f64>,
        last_metric: Option<f64>,
    ) -> Self {
        Clock {
            shape,
            step,
            samples_seen,
            last_loss,
            last_metric,
            window: Window::default(),
        }
    }

    /// The run's shape.
    pub fn shape(&self) -> &RunShape {
        &self.shape
    }

    /// The step about to be taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// True once every epoch's samples have been consumed.
    pub fn finished(&self) -> bool {
        self.samples_seen >= self.shape.total_samples()
    }

    /// The state at the configured batch: what a batch-size policy sees, and every policy
    /// when there is none.
    pub fn state(&self) -> State {
        self.state_with_batch(self.shape.initial_batch)
    }

    /// The state of this step once its global batch is decided.
    pub fn state_with_batch(&self, batch: u32) -> State {
        let s = &self.shape;
        let remaining = s.total_samples().saturating_sub(self.samples_seen);
        let b = u64::from(batch.max(1));
        State {
            step: self.step,
            epoch: (self.samples_seen / s.samples_per_epoch) as u32,
            epoch_fraction: self.samples_seen as f64 / s.samples_per_epoch as f64,
            steps_per_epoch: s.samples_per_epoch.div_ceil(b),
            total_steps: self.step + remaining.div_ceil(b),
            total_epochs: s.epochs,
            samples_seen: self.samples_seen,
            global_batch: batch,
            worker_batch: batch / s.world_size,
            world_size: s.world_size,
            base_lr: s.base_lr,
            reference_batch: s.reference_batch,
            last_loss: self.last_loss,
            last_metric: self.last_metric,
        }
    }

    /// Records a finished step that consumed `batch` samples and reached `loss`.
    pub fn advance(&mut self, batch: u32, loss: Option<f64>) {
        self.step += 1;
        self.samples_seen += u64::from(batch);
        if loss.is_some() {
            self.last_loss = loss;
        }
    }

    /// The run goes on with `world_size` ranks (`--fault-tolerance` shrank the world): every
    /// state from the next on says so, as a resume on that many ranks would.
    pub fn set_world_size(&mut self, world_size: u32) {
        self.shape.world_size = world_size;
    }

    /// Records an evaluation result.
    pub fn set_metric(&mut self, metric: f64) {
        self.last_metric = Some(metric);
    }

    /// Records a loss the ranks agreed on after the step ended: a window's steps
    /// [`Clock::advance`] with no loss (nothing is exchanged inside a window), and the mean
    /// loss is set once the window's end has agreed it.
    pub fn set_loss(&mut self, loss: f64) {
        self.last_loss = Some(loss);
    }

    /// Where the run stands in its synchronisation windows before the step about to be taken:
    /// what a sync policy's `plan` sees.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Records that the step just planned moved as `kind` (called once per step, beside
    /// [`Clock::advance`], by everything that runs a sync policy).
    pub fn pass(&mut self, kind: StepKind) {
        self.window = self.window.after(kind);
    }

    /// Puts the window of a checkpointed run back (a resume).
    pub fn set_window(&mut self, window: Window) {
        self.window = window;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> RunShape {
        RunShape {
            epochs: 3,
            samples_per_epoch: 100 * 256,
            initial_batch: 256,
            world_size: 4,
            base_lr: 0.1,
            reference_batch: 256,
        }
    }

    #[test]
    fn constant_batch_fraction_equals_step_over_steps_per_epoch_bit_for_bit() {
        let mut c = Clock::new(shape()).unwrap();
        let mut steps = 0;
        while !c.finished() {
            let s = c.state();
            assert_eq!(
                s.epoch_fraction.to_bits(),
                (s.step as f64 / 100.0).to_bits()
            );
            assert_eq!(s.epoch, (s.step / 100) as u32);
            assert_eq!(
                (s.steps_per_epoch, s.total_steps, s.worker_batch),
                (100, 300, 64)
            );
            c.advance(256, Some(1.0));
            steps += 1;
        }
        assert_eq!(steps, 300);
    }

    #[test]
    fn a_larger_batch_shortens_the_remaining_run() {
        let mut c = Clock::new(shape()).unwrap();
        for _ in 0..100 {
            c.advance(256, None);
        }
        let s = c.state_with_batch(512);
        assert_eq!((s.epoch, s.epoch_fraction, s.steps_per_epoch), (1, 1.0, 50));
        assert_eq!(s.total_steps, 100 + 100);
        assert_eq!(s.global_batch, 512);
        assert_eq!(s.worker_batch, 128);
    }

    #[test]
    fn the_window_counts_local_steps_and_ends_with_average_or_synchronous() {
        let mut c = Clock::new(shape()).unwrap();
        assert_eq!(c.window(), Window::default());
        for kind in [StepKind::Local, StepKind::Local] {
            c.pass(kind);
            c.advance(256, None);
        }
        assert_eq!(
            c.window(),
            Window {
                local_steps: 2,
                windows: 0
            }
        );
        c.pass(StepKind::Average);
        assert_eq!(
            c.window(),
            Window {
                local_steps: 0,
                windows: 1
            }
        );
        c.pass(StepKind::Synchronous);
        c.pass(StepKind::Local);
        assert_eq!(
            c.window(),
            Window {
                local_steps: 1,
                windows: 1
            }
        );
        // A resume starts at the default window until the checkpoint's is put back.
        let mut r = Clock::resume(shape(), 4, 4 * 256, None, None);
        assert_eq!(r.window(), Window::default());
        r.set_window(c.window());
        assert_eq!(r.window(), c.window());
    }

    #[test]
    fn a_loss_agreed_after_the_step_becomes_the_last_loss() {
        let mut c = Clock::new(shape()).unwrap();
        c.advance(256, Some(2.0));
        c.advance(256, None);
        assert_eq!(c.state().last_loss, Some(2.0));
        c.set_loss(1.5);
        assert_eq!(c.state().last_loss, Some(1.5));
    }

    #[test]
    fn invalid_shapes_are_refused_with_the_flag_name() {
        let mut s = shape();
        s.initial_batch = 255;
        assert!(
            Clock::new(s)
                .unwrap_err()
                .to_string()
                .contains("--global-batch 255")
        );
        let mut s = shape();
        s.base_lr = f64::NAN;
        assert!(Clock::new(s).unwrap_err().to_string().contains("--base-lr"));
    }
}
