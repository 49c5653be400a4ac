//! `lsgd-host selftest survive`: a rank lost on purpose in the middle of a run of all-reduces
//! (killed, or stopped so that only the failure detector can tell), and the survivors' sums
//! checked after they agree, shrink and redo the round: fault tolerance of the collective
//! layer alone, without training.

use std::time::{Duration, Instant};

use crate::{Algorithm, Error, Result, World};

/// How the lost rank goes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Loss {
    /// SIGKILL: the process is gone, its links close.
    Kill,
    /// SIGSTOP: the process stays, silent; the failure detector's timeout finds it.
    Stop,
}

impl Loss {
    fn signal(self) -> i32 {
        match self {
            Loss::Kill => libc::SIGKILL,
            Loss::Stop => libc::SIGSTOP,
        }
    }

    /// Ends or freezes this process now.
    pub fn inflict(self) {
        // SAFETY: a signal to this process, which is what is asked for.
        unsafe { libc::raise(self.signal()) };
    }

    /// Ends or freezes `ranks` of a fault-tolerant `world` at once, this rank among them: the
    /// others that run on this machine first, then this one, so that the survivors see them
    /// go together (as the two sides of a cut link see each other go), not one after the other.
    pub fn inflict_together(self, world: &World, ranks: &[usize]) {
        for &r in ranks.iter().filter(|&&r| r != world.rank()) {
            world.signal_local(r, self.signal());
        }
        self.inflict();
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The algorithms, each once per round.
    pub algos: Vec<Algorithm>,
    /// Rounds in all.
    pub rounds: usize,
    /// The rank (of the starting world) that is lost, and before which round.
    pub lose: Option<(usize, usize, Loss)>,
    /// Floats per all-reduce.
    pub len: usize,
    /// A rank that spends this long away from MPI before each round while the others wait in
    /// it (a long computation, which the failure detector must not take for a silent rank).
    pub busy: Option<(usize, Duration)>,
}

/// One round's result on the rank that prints.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The round.
    pub round: usize,
    /// Ranks that summed it.
    pub ranks: usize,
    /// Whether every algorithm's sum was exact.
    pub exact: bool,
    /// Tries it took (2: redone after a loss).
    pub tries: usize,
    /// After a loss: the lost ranks and the time from the first error to the redone round's end.
    pub lost: Option<(Vec<usize>, Duration)>,
}

/// Element `i` of original rank `r`'s vector in `round`: small integers, so every algorithm's
/// float sum is exact and the expected sum is known for any set of ranks.
fn value(round: usize, r: usize, i: usize) -> f32 {
    ((round * 7 + r * 3 + i) % 64) as f32
}

/// Runs the plan; every survivor returns its rounds. A rank on the losing side of a partition
/// gets [`Error::CutOff`].
pub fn run(world: &mut World, plan: &Plan) -> Result<Vec<Round>> {
    // Each rank's rank in the starting world: the vectors follow it, not the renumbered rank.
    let mut original: Vec<usize> = (0..world.size()).collect();
    let me = world.rank();
    let mut out = Vec::new();
    for round in 0..plan.rounds {
        if let Some((rank, at, loss)) = plan.lose
            && rank == me
            && at == round
        {
            loss.inflict();
        }
        if let Some((rank, busy)) = plan.busy
            && rank == me
        {
            std::thread::sleep(busy);
        }
        let mut tries = 0;
        let mut lost = None;
        let mut failed_at: Option<Instant> = None;
        loop {
            tries += 1;
            let attempt = sum_round(world, plan, round, original[world.rank()]);
            let ok = world.agree(attempt.is_ok());
            match attempt {
                Ok(sums) if ok => {
                    let expected = expected(plan, round, &original);
                    let exact = sums.iter().all(|s| *s == expected);
                    let lost = lost.take().map(|(ranks, since): (Vec<usize>, Duration)| {
                        (
                            ranks,
                            since + failed_at.map_or(Duration::ZERO, |t| t.elapsed()),
                        )
                    });
                    out.push(Round {
                        round,
                        ranks: world.size(),
                        exact,
                        tries,
                        lost,
                    });
                    break;
                }
                Err(e) if !matches!(e, Error::RankLost { .. }) => return Err(e),
                _ => {}
            }
            let shrunk = world.shrink()?;
            for l in &shrunk.lost {
                eprintln!(
                    "rank {} lost rank {} on {}{}",
                    world.rank(),
                    l.rank,
                    l.host,
                    if l.fenced {
                        " (its process killed)"
                    } else {
                        ""
                    }
                );
            }
            let ranks: Vec<usize> = shrunk.lost.iter().map(|l| original[l.rank]).collect();
            original.retain(|r| !ranks.contains(r));
            failed_at = Some(Instant::now());
            lost = Some((ranks, shrunk.since_failure));
        }
    }
    Ok(out)
}

fn sum_round(world: &mut World, plan: &Plan, round: usize, r: usize) -> Result<Vec<Vec<f32>>> {
    let mut sums = Vec::new();
    for &algo in &plan.algos {
        let mut v: Vec<f32> = (0..plan.len).map(|i| value(round, r, i)).collect();
        world.all_reduce_sum(algo, &mut v)?;
        sums.push(v);
    }
    Ok(sums)
}

fn expected(plan: &Plan, round: usize, ranks: &[usize]) -> Vec<f32> {
    (0..plan.len)
        .map(|i| ranks.iter().map(|&r| value(round, r, i)).sum())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_sums_its_own_rounds() {
        let mut w = World::single();
        let plan = Plan {
            algos: Algorithm::ALL.to_vec(),
            rounds: 3,
            lose: None,
            len: 5,
            busy: None,
        };
        let rounds = run(&mut w, &plan).unwrap();
        assert_eq!(rounds.len(), 3);
        assert!(
            rounds
                .iter()
                .all(|r| r.exact && r.tries == 1 && r.lost.is_none())
        );
        assert_eq!(
            expected(&plan, 1, &[0, 2])[0],
            value(1, 0, 0) + value(1, 2, 0)
        );
    }
}
