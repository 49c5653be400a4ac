//! α-β(-γ) predictions of each all-reduce, as implemented here, for `lsgd-host simulate`.
//!
//! p ranks, n bytes; α seconds per message, β seconds per byte sent, γ seconds per byte reduced
//! (Thakur, Rabenseifner & Gropp 2005; Mikami et al. 2018 for the torus). A step where a rank
//! sends and receives at once costs one α + message·β.
//!
//! - ring: 2(p−1)α + 2((p−1)/p)·n·β + ((p−1)/p)·n·γ;
//! - halving-doubling: 2·log₂q·α + 2((q−1)/q)·n·β + ((q−1)/q)·n·γ with q the largest power of
//!   two ≤ p, plus the fold when q < p: 2(α + n·β) + n·γ (send away, get back, one add);
//! - binary-blocks, blocks s₀ > … > s_m by the binary digits of p, r_b = s_b/s_{b+1}: halving
//!   H_b = log₂s_b·α + (1 − 1/s_b)·n·(β + γ); up U_m = H_m, U_b = max(H_b, U_{b+1}) + r_b·α +
//!   (n/s_{b+1})·β + (n/s_b)·γ; down D₀ = 0, D_{b+1} = D_b + r_b·α + (n/s_{b+1})·β; block b
//!   ends at E_b = D_b + log₂s_b·α + (1 − 1/s_b)·n·β (+ α + (n/s_b)·β for b < m); total
//!   U₀ + max E_b (derived in [`super::binary_blocks`]; halving-doubling's at a power of two);
//! - torus2d X×Y: 2(X+Y−2)α + 2((p−1)/p)·n·β + ((p−1)/p)·n·γ;
//! - hierarchical, k ranks per node, m = ⌈p/k⌉ nodes, intra-node α_l, β_l:
//!   ring reduce-scatter in the node (k−1)(α_l + (n/k)·β_l) + ((k−1)/k)·n·γ; gather to the
//!   leader (k−1)α_l + ((k−1)/k)·n·β_l; ring among leaders 2(m−1)α + 2((m−1)/m)·n·β +
//!   ((m−1)/m)·n·γ; MPI_Bcast in the node at the better of a binomial tree ⌈log₂k⌉(α_l + n·β_l)
//!   and scatter + all-gather (⌈log₂k⌉ + k − 1)α_l + 2((k−1)/k)·n·β_l (what Open MPI's tuned
//!   broadcast switches between). Only the leaders' ring crosses the network, with the whole
//!   vector: hierarchical wins where latency dominates (many ranks, small buffers) or where the
//!   network is much slower than the node;
//! - mpi: what a tuned MPI can at best pick, the minimum of ring, halving-doubling and
//!   recursive doubling (log₂p·(α + n·β + n·γ), the small-message choice).

use serde::Serialize;

use super::Algorithm;

/// Machine parameters of the α-β model.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CostModel {
    /// Seconds per message between nodes.
    pub alpha: f64,
    /// Seconds per byte between nodes.
    pub beta: f64,
    /// Seconds per byte reduced (added).
    pub gamma: f64,
    /// Seconds per message inside a node.
    pub alpha_intra: f64,
    /// Seconds per byte inside a node.
    pub beta_intra: f64,
    /// Ranks per node, for `hierarchical`.
    pub ranks_per_node: usize,
    /// Torus grid X×Y; `None`: the near-square default.
    pub torus_shape: Option<(usize, usize)>,
}

impl CostModel {
    /// Predicted seconds of `algo` over `p` ranks for `n` bytes.
    pub fn predict(&self, algo: Algorithm, p: usize, n: f64) -> f64 {
        let (a, b, g) = (self.alpha, self.beta, self.gamma);
        match algo {
            Algorithm::Ring => ring(p, n, a, b, g),
            Algorithm::HalvingDoubling => halving_doubling(p, n, a, b, g),
            Algorithm::BinaryBlocks => binary_blocks(p, n, a, b, g),
            Algorithm::Torus2d => {
                let (x, y) = self
                    .torus_shape
                    .unwrap_or_else(|| super::torus::default_shape(p));
                torus2d(x, y, n, a, b, g)
            }
            Algorithm::Hierarchical => hierarchical(p, n, self),
            Algorithm::Mpi => ring(p, n, a, b, g)
                .min(halving_doubling(p, n, a, b, g))
                .min(recursive_doubling(p, n, a, b, g)),
        }
    }
}

/// Ring all-reduce.
pub fn ring(p: usize, n: f64, alpha: f64, beta: f64, gamma: f64) -> f64 {
    let pf = p as f64;
    let share = (pf - 1.0) / pf;
    2.0 * (pf - 1.0) * alpha + 2.0 * share * n * beta + share * n * gamma
}

/// Rabenseifner's halving-doubling, with the fold for non-powers of two.
pub fn halving_doubling(p: usize, n: f64, alpha: f64, beta: f64, gamma: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let q = super::halving_doubling::fold_target(p);
    let qf = q as f64;
    let share = (qf - 1.0) / qf;
    let core = 2.0 * qf.log2() * alpha + 2.0 * share * n * beta + share * n * gamma;
    let fold = if q < p {
        2.0 * (alpha + n * beta) + n * gamma
    } else {
        0.0
    };
    core + fold
}

/// Rabenseifner & Träff's binary blocks: halving in each block, partial sums up the blocks,
/// finished shares down, doubling in each block; each stage at its slowest rank.
pub fn binary_blocks(p: usize, n: f64, alpha: f64, beta: f64, gamma: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let sizes: Vec<f64> = super::binary_blocks::blocks(p)
        .iter()
        .map(|k| k.size as f64)
        .collect();
    let halving = |s: f64| s.log2() * alpha + (1.0 - 1.0 / s) * n * (beta + gamma);
    let doubling = |s: f64| s.log2() * alpha + (1.0 - 1.0 / s) * n * beta;
    // Up, smallest block first: U_b = max(H_b, U_{b+1}) + r_b·α + (n/s_{b+1})·β + (n/s_b)·γ.
    let smallest = sizes[sizes.len() - 1];
    let up = sizes.windows(2).rev().fold(halving(smallest), |below, w| {
        let (s, t) = (w[0], w[1]);
        halving(s).max(below) + s / t * alpha + n / t * beta + n / s * gamma
    });
    // Down, largest block first: block b waits D_b, doubles, and sends its share down.
    let (mut down, mut slowest) = (0.0f64, 0.0f64);
    for (b, &s) in sizes.iter().enumerate() {
        let send_down = if b + 1 < sizes.len() {
            alpha + n / s * beta
        } else {
            0.0
        };
        slowest = slowest.max(down + doubling(s) + send_down);
        if let Some(&t) = sizes.get(b + 1) {
            down += s / t * alpha + n / t * beta;
        }
    }
    up + slowest
}

/// Recursive doubling: log₂p rounds of whole-vector exchanges.
pub fn recursive_doubling(p: usize, n: f64, alpha: f64, beta: f64, gamma: f64) -> f64 {
    (p as f64).log2().ceil() * (alpha + n * beta + n * gamma)
}

/// 2D torus on an X×Y grid.
pub fn torus2d(x: usize, y: usize, n: f64, alpha: f64, beta: f64, gamma: f64) -> f64 {
    let pf = (x * y) as f64;
    let share = (pf - 1.0) / pf;
    2.0 * (x as f64 + y as f64 - 2.0) * alpha + 2.0 * share * n * beta + share * n * gamma
}

/// Hierarchical: in-node reduce-scatter and gather, ring among leaders, in-node broadcast.
pub fn hierarchical(p: usize, n: f64, m: &CostModel) -> f64 {
    let k = m.ranks_per_node.clamp(1, p.max(1));
    let kf = k as f64;
    let nodes = p.div_ceil(k);
    let local_share = (kf - 1.0) / kf;
    let reduce_scatter =
        (kf - 1.0) * (m.alpha_intra + n / kf * m.beta_intra) + local_share * n * m.gamma;
    let gather = (kf - 1.0) * m.alpha_intra + local_share * n * m.beta_intra;
    let leaders = ring(nodes, n, m.alpha, m.beta, m.gamma);
    let tree = kf.log2().ceil();
    let broadcast = (tree * (m.alpha_intra + n * m.beta_intra))
        .min((tree + kf - 1.0) * m.alpha_intra + 2.0 * local_share * n * m.beta_intra);
    reduce_scatter + gather + leaders + broadcast
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: f64 = 5e-6;
    const B: f64 = 1e-10;
    const G: f64 = 1e-11;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-30)
    }

    #[test]
    fn ring_at_two_ranks_is_two_messages_of_half_the_vector() {
        let n = 1e8;
        assert!(close(ring(2, n, A, B, G), 2.0 * A + n * B + n / 2.0 * G));
        assert_eq!(ring(1, n, A, B, G), 0.0);
    }

    #[test]
    fn a_one_row_or_one_column_torus_is_a_ring() {
        for p in [2, 3, 7, 16] {
            assert!(close(torus2d(p, 1, 1e6, A, B, G), ring(p, 1e6, A, B, G)));
            assert!(close(torus2d(1, p, 1e6, A, B, G), ring(p, 1e6, A, B, G)));
        }
    }

    #[test]
    fn torus_keeps_ring_bandwidth_with_sqrt_latency() {
        let n = 4e8;
        let t = torus2d(32, 32, n, A, 0.0, 0.0);
        assert!(close(t, 2.0 * 62.0 * A));
        assert!(close(
            torus2d(32, 32, n, 0.0, B, 0.0),
            ring(1024, n, 0.0, B, 0.0)
        ));
    }

    #[test]
    fn halving_doubling_matches_rabenseifner_on_powers_of_two_and_adds_the_fold_otherwise() {
        let n = 1e6;
        let expect = 2.0 * 3.0 * A + 2.0 * 7.0 / 8.0 * n * B + 7.0 / 8.0 * n * G;
        assert!(close(halving_doubling(8, n, A, B, G), expect));
        let fold = 2.0 * (A + n * B) + n * G;
        assert!(close(halving_doubling(12, n, A, B, G), expect + fold));
        assert_eq!(halving_doubling(1, n, A, B, G), 0.0);
        assert!(close(
            recursive_doubling(8, n, A, B, G),
            3.0 * (A + n * B + n * G)
        ));
    }

    #[test]
    fn binary_blocks_is_halving_doubling_at_powers_of_two() {
        for p in [2, 4, 8, 512, 1024] {
            for n in [1e3, 1e8] {
                let (bb, hd) = (
                    binary_blocks(p, n, A, B, G),
                    halving_doubling(p, n, A, B, G),
                );
                assert!(close(bb, hd), "p={p} n={n}: {bb} vs {hd}");
            }
        }
        assert_eq!(binary_blocks(1, 1e6, A, B, G), 0.0);
    }

    #[test]
    fn binary_blocks_matches_hand_computed_worlds() {
        let n = 1e6;
        // p = 3 = 2 + 1. Up: the pair halves (α + n/2·(β+γ)); the single rank sends its n in
        // two messages (2α + n·β), the pair adds n/2. Down: the pair doubles and sends n/2 down
        // (2α + n·β); the single rank receives two messages (2α + n·β).
        let want = 5.0 * A + 2.5 * n * B + n * G;
        assert!(close(binary_blocks(3, n, A, B, G), want));
        // p = 6 = 4 + 2. Up: max(2α + ¾n(β+γ), α + ½n(β+γ)) + 2α + ½n·β + ¼n·γ. Down: the four
        // double and send ¼n (3α + n·β); the two wait 2α + ½n·β, then double (α + ½n·β).
        let want = 7.0 * A + 2.25 * n * B + n * G;
        assert!(close(binary_blocks(6, n, A, B, G), want));
        // p = 600 = 512 + 64 + 16 + 8, α only. Up, from the 8: U = 3, max(4, 3) + 2 = 6,
        // max(6, 6) + 4 = 10, max(9, 10) + 8 = 18. Down: D = 0, 8, 12, 14; the blocks end at
        // 0+9+1, 8+6+1, 12+4+1 and 14+3: 17.
        assert!(close(binary_blocks(600, n, A, 0.0, 0.0), 35.0 * A));
        // β only, in n·β. Up: U = 7/8, max(15/16, 7/8) + 1/8, then + 1/16 and + 1/64 (each
        // block waits for the one below). Down: the 16 wait 1/64 + 1/16, then double and send
        // down, 15/16 + 1/16.
        let up = 15.0 / 16.0 + 1.0 / 8.0 + 1.0 / 16.0 + 1.0 / 64.0;
        let down = 1.0 / 64.0 + 1.0 / 16.0 + 1.0;
        assert!(close(
            binary_blocks(600, n, 0.0, B, 0.0),
            (up + down) * n * B
        ));
    }

    #[test]
    fn binary_blocks_beats_the_fold_in_bandwidth_but_not_past_an_unbalanced_world() {
        // Large vectors: no idle ranks means well under the fold's 4n·β.
        let n = 1e9;
        for p in [3, 6, 600, 1000] {
            assert!(
                binary_blocks(p, n, A, B, G) < halving_doubling(p, n, A, B, G),
                "p={p}"
            );
        }
        // 513 = 512 + 1: the lone rank's 512 messages each way cost more than the fold at 1 KB.
        assert!(binary_blocks(513, 1e3, A, B, G) > halving_doubling(513, 1e3, A, B, G));
    }

    #[test]
    fn hierarchical_with_one_rank_per_node_is_a_ring_and_small_messages_prefer_it() {
        let model = |k| CostModel {
            alpha: A,
            beta: B,
            gamma: G,
            alpha_intra: A,
            beta_intra: B,
            ranks_per_node: k,
            torus_shape: None,
        };
        assert!(close(
            hierarchical(64, 1e6, &model(1)),
            ring(64, 1e6, A, B, G)
        ));
        // At 1 KB, latency dominates: 8 leaders beat a 1024-rank ring.
        let m8 = model(8);
        assert!(
            m8.predict(Algorithm::Hierarchical, 1024, 1e3) < m8.predict(Algorithm::Ring, 1024, 1e3)
        );
        // The baseline is never worse than what it can choose from.
        for n in [1e3, 1e6, 1e9] {
            let mpi = m8.predict(Algorithm::Mpi, 1024, n);
            assert!(mpi <= m8.predict(Algorithm::Ring, 1024, n));
            assert!(mpi <= m8.predict(Algorithm::HalvingDoubling, 1024, n));
        }
    }
}
