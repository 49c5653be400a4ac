//! How this process waits for its messages: in MPI's own blocking wait while nothing else
//! needs the core, with a short sleep between polls while another thread of this process
//! computes (the backward pass that the overlapped exchange runs behind).
//!
//! Open MPI's blocking calls spin: a rank that waits for its partner's bucket takes a whole
//! core from the backward pass of the same process, which on a host whose cores all compute
//! made the overlapped step slower than the sequential one. Every point-to-point step of the
//! algorithms and MPI_Allreduce (outside ULFM, see `baseline`) go through here, as nonblocking
//! operations finished by [`finish`]; what the ranks send and sum does not depend on how they
//! wait, so both ways end with the same bits.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use mpi::datatype::Equivalence;
use mpi::request::{self, Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// The pause between two polls of the parameter server's waits, and the first pause of a wait
/// while another thread computes: short against a training step, long enough that a waiting
/// rank uses almost no CPU.
pub(crate) const POLL: Duration = Duration::from_micros(50);

/// The longest pause between two polls while another thread computes. Each poll runs Open
/// MPI's progress loop, a few microseconds: polled every 50 µs through a 40 ms backward pass,
/// that loop and its locks took 5 % of the cnn's overlapped step (perf). The pauses double up
/// to this; the end of the computation ends a pause at once.
const MAX_POLL: Duration = Duration::from_millis(1);

/// How many [`Computing`] guards are alive in this process, and the signal that one dropped.
static COMPUTING: Mutex<usize> = Mutex::new(0);
static ENDED: Condvar = Condvar::new();

fn computing_guards() -> MutexGuard<'static, usize> {
    // The count is whole even if a holder panicked.
    COMPUTING.lock().unwrap_or_else(|e| e.into_inner())
}

/// While one lives, this process's waits for messages sleep between polls instead of spinning
/// (another thread of it computes and needs the core).
#[derive(Debug)]
pub struct Computing(());

impl Computing {
    /// Marks that a thread of this process computes until the guard drops.
    pub fn begin() -> Computing {
        *computing_guards() += 1;
        Computing(())
    }
}

impl Drop for Computing {
    fn drop(&mut self) {
        *computing_guards() -= 1;
        ENDED.notify_all();
    }
}

fn computing() -> bool {
    *computing_guards() > 0
}

/// Waits until `request` has finished: polls it, with pauses that grow from [`POLL`] to
/// [`MAX_POLL`], while a [`Computing`] guard lives; MPI's blocking wait otherwise (and once a
/// rank was lost, so that the failure is reported as the blocking calls report it).
pub(crate) fn finish<'a, D: ?Sized, S: Scope<'a>>(mut request: Request<'a, D, S>) {
    let mut pause = POLL;
    while computing() && crate::ulfm::failed().is_none() {
        match request.test() {
            Ok(_) => return,
            Err(pending) => request = pending,
        }
        let guards = computing_guards();
        if *guards == 0 {
            break;
        }
        drop(ENDED.wait_timeout(guards, pause));
        pause = (pause * 2).min(MAX_POLL);
    }
    request.wait_without_status();
}

/// Sends `send` to rank `to` of `comm` while receiving exactly `recv.len()` elements from rank
/// `from` (MPI_Sendrecv's semantics).
pub(crate) fn send_receive<T: Equivalence>(
    comm: &SimpleCommunicator,
    to: usize,
    send: &[T],
    from: usize,
    recv: &mut [T],
) {
    request::scope(|scope| {
        let received = comm
            .process_at_rank(from as i32)
            .immediate_receive_into(scope, recv);
        let sent = comm.process_at_rank(to as i32).immediate_send(scope, send);
        finish(received);
        finish(sent);
    });
}

/// Sends all of `buf` to rank `to` of `comm`.
pub(crate) fn send<T: Equivalence>(comm: &SimpleCommunicator, to: usize, buf: &[T]) {
    request::scope(|scope| finish(comm.process_at_rank(to as i32).immediate_send(scope, buf)));
}

/// Receives exactly `buf.len()` elements from rank `from` of `comm`.
pub(crate) fn receive<T: Equivalence>(comm: &SimpleCommunicator, from: usize, buf: &mut [T]) {
    request::scope(|scope| {
        finish(
            comm.process_at_rank(from as i32)
                .immediate_receive_into(scope, buf),
        )
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_the_last_one_ends_the_computing() {
        assert!(!computing());
        let a = Computing::begin();
        let b = Computing::begin();
        drop(a);
        assert!(computing());
        drop(b);
        assert!(!computing());
    }
}
