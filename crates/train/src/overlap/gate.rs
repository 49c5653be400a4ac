//! The step's side of the hooks: which gradients of the backward pass in flight are ready, and
//! a wait for a bucket's on the thread that exchanges them. The hooks stay registered for the
//! whole run; a closed gate ignores them (the sequential step, micro-batches before the last).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::Readiness;

/// The readiness of a run's trainable tensors (optimizer order) in the current backward pass.
#[derive(Debug)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug)]
struct State {
    open: bool,
    ready: Vec<bool>,
    /// The indices in the order the hooks reported them while open.
    order: Vec<usize>,
    /// When the backward pass returned, if it has.
    finished: Option<Instant>,
}

impl Gate {
    /// A closed gate over `n` tensors.
    pub fn new(n: usize) -> Gate {
        Gate {
            state: Mutex::new(State {
                open: false,
                ready: vec![false; n],
                order: Vec::new(),
                finished: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a waiter panicked; the flags are still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the gate for a backward pass: the tensors marked in `already` are ready now (no
    /// path from the loss reaches them), the others once their hook reports.
    pub fn open(&self, already: &[bool]) {
        let mut s = self.lock();
        s.open = true;
        s.ready.copy_from_slice(already);
        s.order.clear();
        s.finished = None;
    }

    /// The backward pass returned (whether or not it succeeded): every wait ends.
    pub fn finish(&self) {
        self.lock().finished = Some(Instant::now());
        self.changed.notify_all();
    }

    /// Closes the gate; returns the order the hooks reported in since it opened, and when the
    /// backward pass returned.
    pub fn close(&self) -> (Vec<usize>, Option<Instant>) {
        let mut s = self.lock();
        s.open = false;
        (std::mem::take(&mut s.order), s.finished.take())
    }

    /// Blocks until every tensor of `tensors` is ready, or the backward pass has returned
    /// without them (it failed); true when they are all ready.
    pub fn wait(&self, tensors: impl IntoIterator<Item = usize>) -> bool {
        let tensors: Vec<usize> = tensors.into_iter().collect();
        let mut s = self.lock();
        loop {
            if tensors.iter().all(|&t| s.ready[t]) {
                return true;
            }
            if s.finished.is_some() {
                return false;
            }
            s = self.changed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Readiness for Gate {
    fn ready(&self, index: usize) {
        let mut s = self.lock();
        if !s.open || index >= s.ready.len() {
            return;
        }
        if !std::mem::replace(&mut s.ready[index], true) {
            s.order.push(index);
        }
        drop(s);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_wait_ends_when_its_tensors_report_and_a_closed_gate_ignores_reports() {
        let gate = Arc::new(Gate::new(3));
        gate.ready(1);
        gate.open(&[false, false, true]);
        assert!(gate.wait([2]));
        let reporter = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                gate.ready(1);
                gate.ready(1);
                gate.ready(0);
                gate.finish();
            })
        };
        assert!(gate.wait([0, 1]));
        reporter.join().unwrap();
        let (order, finished) = gate.close();
        assert_eq!(order, [1, 0]);
        assert!(finished.is_some());
    }

    #[test]
    fn a_backward_pass_that_returns_without_a_tensor_ends_its_wait() {
        let gate = Gate::new(2);
        gate.open(&[false, false]);
        gate.ready(0);
        gate.finish();
        assert!(gate.wait([0]));
        assert!(!gate.wait([0, 1]));
    }
}
