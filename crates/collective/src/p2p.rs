//! Point-to-point messages between two ranks, for loops that do not move in lockstep (the
//! parameter server of asynchronous SGD): typed sends, a receive from a named rank, and a wait
//! for the first of several ranks to send.
//!
//! A wait polls (MPI_Iprobe) and sleeps between polls instead of blocking in MPI_Probe: Open
//! MPI's blocking calls spin on a core, and a server that mostly waits would take a core from
//! the workers that share the machine with it.

use std::time::Instant;

use mpi::datatype::Equivalence;
use mpi::traits::{Communicator, Destination, Source};

use crate::watchdog::{self, Op};
use crate::world::Mpi;
use crate::{Error, Result, Traffic, World};

impl World {
    fn peer(&self, rank: usize) -> Result<&Mpi> {
        match &self.mpi {
            Some(m) if rank < self.size() && rank != self.rank() => Ok(m),
            _ => Err(Error::NoSuchRank {
                rank,
                size: self.size(),
            }),
        }
    }

    /// Sends `data` to rank `to` with `tag` (blocking until the buffer may be reused).
    pub fn send<T: Equivalence>(&self, to: usize, tag: i32, data: &[T]) -> Result<Traffic> {
        let m = self.peer(to)?;
        let t = Instant::now();
        let _busy = watchdog::enter(Op::SEND, Some(to));
        m.comm.process_at_rank(to as i32).send_with_tag(data, tag);
        Ok(Traffic {
            bytes_sent: std::mem::size_of_val(data) as u64,
            seconds: t.elapsed().as_secs_f64(),
        })
    }

    /// Receives the next message tagged `tag` from rank `from`.
    pub fn receive<T: Equivalence>(&self, from: usize, tag: i32) -> Result<Vec<T>> {
        let m = self.peer(from)?;
        let _busy = watchdog::enter(Op::RECEIVE, Some(from));
        let (data, _) = m
            .comm
            .process_at_rank(from as i32)
            .receive_vec_with_tag::<T>(tag);
        Ok(data)
    }

    /// Waits until one of `from` has a message tagged `tag` pending and returns that rank,
    /// polling them in the order given (so a rank that is always ready cannot starve the
    /// others if the caller rotates the list).
    pub fn wait_any(&self, from: &[usize], tag: i32) -> Result<usize> {
        let peers = from
            .iter()
            .map(|&r| Ok((r, self.peer(r)?)))
            .collect::<Result<Vec<_>>>()?;
        let _busy = watchdog::enter(Op::WAIT, (from.len() == 1).then(|| from[0]));
        loop {
            for (r, m) in &peers {
                let process = m.comm.process_at_rank(*r as i32);
                if process.immediate_probe_with_tag(tag).is_some() {
                    return Ok(*r);
                }
            }
            std::thread::sleep(crate::wait::POLL);
        }
    }
}
