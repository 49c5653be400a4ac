//! The timings under MPI: ping-pongs and two-way exchanges on the pairs of ranks that stand
//! for the inter- and intra-host links, and the f32 addition, made into a [`Calibration`].

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{Calibration, Fit, Machine, fit};
use crate::bench::stats::median;
use crate::collective::World;
use crate::collective::calibrate::time_additions;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Message sizes in bytes.
    pub sizes: Vec<usize>,
    /// Timed repetitions per size; `None`: from 51 at small sizes down to 5 at 8 MiB and above.
    pub reps: Option<usize>,
    /// Untimed repetitions per size first.
    pub warmup: usize,
    /// Bytes of the vectors added to time γ.
    pub gamma_bytes: usize,
}

/// One message size on one link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Bytes per message.
    pub bytes: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Median one-way seconds (half the round trip).
    pub one_way_s: f64,
    /// Median seconds of a two-way exchange.
    pub exchange_s: f64,
}

/// A link between two ranks, measured and fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// The two ranks (the first starts each ping-pong).
    pub ranks: [usize; 2],
    /// Their hosts.
    pub hosts: [String; 2],
    /// Every size measured.
    pub points: Vec<Point>,
    /// The fit of the one-way times.
    pub one_way: Fit,
    /// The fit of the exchange times: the model's α and β.
    pub exchange: Fit,
    /// exchange β / one-way β: about 1 on a full-duplex link, up to 2 where the directions
    /// share it.
    pub duplex_ratio: f64,
}

/// The f32 additions timed for γ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Addition {
    /// Bytes of each vector.
    pub bytes: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// Median seconds of one `a[i] += b[i]` pass.
    pub seconds: f64,
}

fn default_reps(bytes: usize) -> usize {
    ((1usize << 25) / bytes.max(1)).clamp(5, 50) | 1
}

/// The pairs to measure: rank 0 and the first rank on another host; two ranks on one host
/// (rank 0 and its first neighbour, else the first two ranks sharing a host).
pub fn pairs(hosts: &[String]) -> (Option<[usize; 2]>, Option<[usize; 2]>) {
    let inter = (1..hosts.len())
        .find(|&r| hosts[r] != hosts[0])
        .map(|r| [0, r]);
    let intra = (0..hosts.len()).find_map(|a| {
        (a + 1..hosts.len())
            .find(|&b| hosts[b] == hosts[a])
            .map(|b| [a, b])
    });
    (inter, intra)
}

/// The most ranks on one host.
pub fn ranks_per_node(hosts: &[String]) -> usize {
    hosts
        .iter()
        .map(|h| hosts.iter().filter(|g| *g == h).count())
        .max()
        .unwrap_or(1)
}

fn measure_link(world: &World, setup: &Setup, ranks: [usize; 2], hosts: &[String]) -> Result<Link> {
    let pair = (ranks[0], ranks[1]);
    let mut points = Vec::with_capacity(setup.sizes.len());
    for &bytes in &setup.sizes {
        let reps = setup.reps.unwrap_or_else(|| default_reps(bytes)).max(1);
        world.barrier()?;
        let round_trips = world.ping_pong(pair, bytes, setup.warmup, reps)?;
        world.barrier()?;
        let exchanges = world.exchange_both_ways(pair, bytes, setup.warmup, reps)?;
        points.push(Point {
            bytes,
            reps,
            one_way_s: median(round_trips) / 2.0,
            exchange_s: median(exchanges),
        });
    }
    let of = |f: fn(&Point) -> f64| -> Vec<(f64, f64)> {
        points.iter().map(|p| (p.bytes as f64, f(p))).collect()
    };
    let link = format!(
        "rank {} ({}) ↔ rank {} ({})",
        ranks[0], hosts[ranks[0]], ranks[1], hosts[ranks[1]]
    );
    let one_way = fit(&of(|p| p.one_way_s)).with_context(|| format!("{link}, one way"))?;
    let exchange = fit(&of(|p| p.exchange_s)).with_context(|| format!("{link}, exchange"))?;
    Ok(Link {
        ranks,
        hosts: [hosts[ranks[0]].clone(), hosts[ranks[1]].clone()],
        points,
        one_way,
        exchange,
        duplex_ratio: exchange.beta / one_way.beta,
    })
}

/// Measures and fits (collective; at least 2 ranks); every rank returns the same calibration
/// (γ timed on rank 0).
pub fn run(world: &World, setup: &Setup) -> Result<Calibration> {
    anyhow::ensure!(
        world.size() >= 2,
        "bench calibrate measures links between ranks: run it under mpirun with 2 or more \
         (mpirun -np 2 lsgd-host bench calibrate)"
    );
    anyhow::ensure!(!setup.sizes.is_empty(), "--sizes names no message size");
    let hosts = world.hostnames()?;
    let (inter_pair, intra_pair) = pairs(&hosts);
    let inter = inter_pair
        .map(|p| measure_link(world, setup, p, &hosts))
        .transpose()?;
    let intra = intra_pair
        .map(|p| measure_link(world, setup, p, &hosts))
        .transpose()?;
    let mut notes = Vec::new();
    let (alpha, beta) = match (&inter, &intra) {
        (Some(l), _) => (l.exchange.alpha, l.exchange.beta),
        (None, Some(l)) => {
            notes.push(format!(
                "all {} ranks are on one host ({}): there is no inter-host link, so α and β \
                 are the intra-host link's",
                hosts.len(),
                hosts[0]
            ));
            (l.exchange.alpha, l.exchange.beta)
        }
        (None, None) => unreachable!("two or more ranks share a host or are on two"),
    };
    let (alpha_intra, beta_intra) = match &intra {
        Some(l) => (l.exchange.alpha, l.exchange.beta),
        None => {
            notes.push("no two ranks share a host: α_intra and β_intra are α and β".to_string());
            (alpha, beta)
        }
    };
    world.barrier()?;
    let floats = (setup.gamma_bytes / size_of::<f32>()).max(1);
    let add_reps = 7;
    let mut add = vec![0.0; add_reps];
    if world.is_root() {
        add = time_additions(floats, add_reps);
    }
    // Rank 0's times to every rank (the others contributed zeros).
    world.all_reduce_max_f64(&mut add)?;
    let addition = Addition {
        bytes: floats * size_of::<f32>(),
        reps: add_reps,
        seconds: median(add),
    };
    let machine = Machine {
        alpha,
        beta,
        gamma: addition.seconds / addition.bytes as f64,
        alpha_intra,
        beta_intra,
        ranks_per_node: ranks_per_node(&hosts),
    };
    Ok(Calibration {
        machine,
        ranks: hosts.len(),
        hosts,
        inter,
        intra,
        addition,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_ranks_per_node_follow_the_hosts() {
        let h = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pairs(&h(&["a", "a"])), (None, Some([0, 1])));
        assert_eq!(pairs(&h(&["a", "b"])), (Some([0, 1]), None));
        assert_eq!(
            pairs(&h(&["a", "a", "b", "b"])),
            (Some([0, 2]), Some([0, 1]))
        );
        assert_eq!(
            pairs(&h(&["a", "b", "c", "b"])),
            (Some([0, 1]), Some([1, 3]))
        );
        assert_eq!(ranks_per_node(&h(&["a", "b", "b", "b", "a"])), 3);
    }
}
