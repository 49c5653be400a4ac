//! Measurements that calibrate the α-β-γ model of [`crate::cost`] (`lsgd-host bench
//! calibrate`): every rank's host, the time of messages between two ranks one way and both
//! ways at once, and the time of the f32 addition every algorithm reduces with.
//!
//! Each measurement is collective: every rank calls it with the same arguments (ranks outside
//! the pair only wait) and every rank gets the same times back, so the caller may print or fit
//! on any rank.

use std::time::Instant;

use mpi::point_to_point as p2p;
use mpi::traits::{Communicator, Destination, Source};

use crate::chunks::{F32, add_into};
use crate::{Error, Result, World};

/// The tag of calibration messages (no other traffic runs while they do).
const TAG: i32 = 0x4c43;

impl World {
    /// Every rank's host name (MPI's processor name, which Open MPI takes from gethostname),
    /// in rank order.
    pub fn hostnames(&self) -> Result<Vec<String>> {
        if !self.is_mpi() {
            return Ok(vec![local_hostname()]);
        }
        let mine = mpi::environment::processor_name().unwrap_or_else(|_| local_hostname());
        let (all, _) = self.all_gather_bytes(mine.as_bytes())?;
        Ok(all
            .into_iter()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .collect())
    }

    /// Round-trip seconds of `reps` ping-pongs of `bytes` from rank `a` to rank `b` and back,
    /// after `warmup` untimed ones; each round trip is timed on `a`.
    pub fn ping_pong(
        &self,
        (a, b): (usize, usize),
        bytes: usize,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let pair = Pair {
            a,
            b,
            timed_on_b: false,
        };
        self.between(pair, bytes, warmup, reps, |comm, me, other, buf, back| {
            let peer = comm.process_at_rank(other as i32);
            if me == a {
                peer.send_with_tag(buf, TAG);
                peer.receive_into_with_tag(&mut back[..], TAG);
            } else {
                peer.receive_into_with_tag(&mut back[..], TAG);
                peer.send_with_tag(buf, TAG);
            }
        })
    }

    /// Seconds of `reps` exchanges in which ranks `a` and `b` each send `bytes` to the other
    /// at once (MPI_Sendrecv), after `warmup` untimed ones; an exchange lasts until both ranks
    /// have theirs, so each time is the slower rank's.
    pub fn exchange_both_ways(
        &self,
        (a, b): (usize, usize),
        bytes: usize,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let pair = Pair {
            a,
            b,
            timed_on_b: true,
        };
        self.between(pair, bytes, warmup, reps, |comm, _, other, buf, back| {
            let peer = comm.process_at_rank(other as i32);
            p2p::send_receive_into(buf, &peer, back, &peer);
        })
    }

    /// Runs `step` `warmup + reps` times on the pair, times the last `reps` (on `a`, and on `b`
    /// too when the pair says so) and gives every rank the slower time per repetition.
    fn between(
        &self,
        Pair { a, b, timed_on_b }: Pair,
        bytes: usize,
        warmup: usize,
        reps: usize,
        step: impl Fn(&mpi::topology::SimpleCommunicator, usize, usize, &[u8], &mut [u8]),
    ) -> Result<Vec<f64>> {
        let size = self.size();
        for rank in [a, b] {
            if rank >= size {
                return Err(Error::NoSuchRank { rank, size });
            }
        }
        if a == b {
            return Err(Error::NoSuchRank { rank: b, size });
        }
        let Some(m) = self.mpi.as_deref() else {
            return Err(Error::NoSuchRank { rank: b, size });
        };
        let me = self.rank();
        let mut times = vec![0.0f64; reps];
        if me == a || me == b {
            let other = if me == a { b } else { a };
            // One byte more than the message, sliced: an empty Vec's address is 1, which Open
            // MPI takes for MPI_IN_PLACE.
            let buf = vec![0x5au8; bytes + 1];
            let mut back = vec![0u8; bytes + 1];
            for i in 0..warmup + reps {
                let start = Instant::now();
                step(&m.comm, me, other, &buf[..bytes], &mut back[..bytes]);
                if i >= warmup && (me == a || timed_on_b) {
                    times[i - warmup] = start.elapsed().as_secs_f64();
                }
            }
        }
        self.all_reduce_max_f64(&mut times)?;
        Ok(times)
    }
}

/// Two ranks that time messages between them; `a` sends first.
struct Pair {
    a: usize,
    b: usize,
    /// Whether `b`'s times count too (an exchange ends when both have theirs; a round trip is
    /// `a`'s alone, as `b`'s would include the wait for `a`'s first message).
    timed_on_b: bool,
}

/// Seconds of each of `reps` in-place f32 additions `a[i] += b[i]` of `floats`-long vectors
/// (the kernel every algorithm reduces with), after one untimed pass that faults the pages in.
pub fn time_additions(floats: usize, reps: usize) -> Vec<f64> {
    let mut acc: Vec<f32> = (0..floats).map(|i| (i % 13) as f32 * 0.25).collect();
    let inc: Vec<f32> = (0..floats).map(|i| (i % 7) as f32 * 0.125).collect();
    add_into::<F32>(&mut acc, &inc);
    (0..reps)
        .map(|_| {
            let start = Instant::now();
            add_into::<F32>(std::hint::black_box(&mut acc), std::hint::black_box(&inc));
            start.elapsed().as_secs_f64()
        })
        .collect()
}

/// This machine's host name without MPI (`/proc/sys/kernel/hostname`, which follows the UTS
/// namespace as gethostname does), or `localhost`.
pub fn local_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additions_are_timed_and_a_single_world_has_one_host_and_no_pair() {
        let t = time_additions(1000, 3);
        assert_eq!(t.len(), 3);
        assert!(t.iter().all(|&s| s >= 0.0));
        let w = World::single();
        assert_eq!(w.hostnames().unwrap().len(), 1);
        assert!(w.ping_pong((0, 1), 8, 0, 1).is_err());
        assert!(w.exchange_both_ways((0, 0), 8, 0, 1).is_err());
    }
}
