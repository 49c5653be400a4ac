//! What a person watching sees: a progress bar on a terminal, plain log lines otherwise (CI
//! logs, `nohup`), at most one per [`LOG_EVERY`] plus one per evaluation.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Interval between plain log lines.
const LOG_EVERY: Duration = Duration::from_secs(15);

/// Reports progress to stderr.
pub struct Progress {
    bar: Option<ProgressBar>,
    last_line: Instant,
    quiet: bool,
}

impl Progress {
    /// A bar if stderr is a terminal and `quiet` is off, plain lines otherwise.
    pub fn new(total_steps: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let b = ProgressBar::new(total_steps);
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps {msg} (eta {eta})",
                )
                .expect("static template"),
            );
            b
        });
        Progress {
            bar,
            last_line: Instant::now(),
            quiet,
        }
    }

    /// After a step; `total_steps` may change when a batch-size policy changes the batch.
    pub fn step(&mut self, step: u64, total_steps: u64, epoch: f64, loss: f64, lr: f64, sps: f64) {
        let msg = format!("epoch {epoch:.2} loss {loss:.4} lr {lr:.4} {sps:.0} samples/s");
        match &self.bar {
            Some(b) => {
                b.set_length(total_steps);
                b.set_position(step);
                b.set_message(msg);
            }
            None if !self.quiet && self.last_line.elapsed() >= LOG_EVERY => {
                eprintln!("step {step}/{total_steps} {msg}");
                self.last_line = Instant::now();
            }
            None => {}
        }
    }

    /// A line that stays (evaluations, checkpoints).
    pub fn line(&mut self, text: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
        self.last_line = Instant::now();
    }

    /// A warning: printed like [`Progress::line`], and even when quiet.
    pub fn warn(&mut self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
