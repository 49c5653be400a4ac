//! Every algorithm against MPI_Allreduce and the exact sum, the payload all-reduce against the
//! direct sums, the byte all-gather and the agreements (`lsgd-host selftest allreduce`, run by
//! the mpirun tests).
//!
//! Different algorithms add in different orders, so binary32 results are compared with
//! MPI_Allreduce with a tolerance: two summation orders of p terms differ by at most
//! (p−1)·ε·Σ|xᵢ| per element. 16-bit sums are compared with the exact sum, which every rank
//! computes from every rank's inputs (each rank's data is a function of the seed, its rank and
//! the size). Across ranks there is no tolerance: each algorithm must give every rank the same
//! bytes (a hash per rank), every rank must receive every payload of the all-gather exactly,
//! [`World::all_reduce_payload`] must give the bytes of the direct call it stands for, and
//! every rank must get the answer expected of [`World::agree_lengths`] and
//! [`World::agree_failure`].

use std::io::Write;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::chunks::{Bf16, F16, Half};
use super::{Agreement, Algorithm, Element, Result, World};

/// What to test.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The algorithms to test, in row order (every one: [`Algorithm::ALL`]).
    pub algos: Vec<Algorithm>,
    /// Vector lengths (elements); [`default_sizes`] covers the edge cases.
    pub sizes: Vec<usize>,
    /// Torus grid for `torus2d`; `None`: the default shape.
    pub torus_shape: Option<(usize, usize)>,
    /// Simulated node sizes for `hierarchical`, tested in addition to the real nodes (when
    /// `algos` has it).
    pub ranks_per_node: Vec<usize>,
    /// Base seed; each rank draws its data from a seed derived from it, its rank and the size.
    pub seed: u64,
}

/// One algorithm (and variant) in one element format over every size.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `ring`, `torus2d 2x2`, `hierarchical (2 ranks/node)`, `all-reduce of payloads`,
    /// `all-gather of bytes`, `length agreement`, `failure agreement`.
    pub name: String,
    /// What was summed (`f32`, `f16`, `bf16`), gathered (`bytes`) or agreed on (`u64`, `flag`).
    pub element: &'static str,
    /// The largest error allowed, relative to Σ|xᵢ| (0: exact).
    pub tolerance: f64,
    /// Largest |result − reference| / Σ|xᵢ| over every element and size, on any rank; the
    /// reference is MPI_Allreduce for f32 and the exact sum for 16-bit formats. For the
    /// payload all-reduce: the largest fraction of its calls that differed from the direct sum;
    /// for the all-gather: of payloads a rank received wrong; for the agreements: of answers a
    /// rank got wrong.
    pub max_error: f64,
    /// Sizes where some rank exceeded the tolerance.
    pub wrong_sizes: Vec<usize>,
    /// Sizes where ranks got different bytes.
    pub divergent_sizes: Vec<usize>,
}

impl Outcome {
    fn new(name: &str, element: &'static str, tolerance: f64) -> Outcome {
        Outcome {
            name: name.to_string(),
            element,
            tolerance,
            max_error: 0.0,
            wrong_sizes: Vec::new(),
            divergent_sizes: Vec::new(),
        }
    }

    /// Whether this algorithm passed.
    pub fn passed(&self) -> bool {
        self.wrong_sizes.is_empty() && self.divergent_sizes.is_empty()
    }

    /// Records size `n` from this rank's `error` and result `hash` (collective).
    fn record(&mut self, world: &World, n: usize, error: f64, hash: u64) -> Result<()> {
        let mut errors = [error];
        world.all_reduce_max_f64(&mut errors)?;
        self.max_error = self.max_error.max(errors[0]);
        if errors[0] > self.tolerance {
            self.wrong_sizes.push(n);
        }
        if world.all_gather_u64(hash)?.iter().any(|&h| h != hash) {
            self.divergent_sizes.push(n);
        }
        Ok(())
    }
}

/// Sizes that hit the edge cases of chunking for `p` ranks: empty, fewer elements than ranks,
/// around p, not divisible by p, and large enough for several MPI protocols.
pub fn default_sizes(p: usize) -> Vec<usize> {
    let mut sizes = vec![
        0,
        1,
        2,
        3,
        p.saturating_sub(1),
        p,
        p + 1,
        2 * p + 1,
        7,
        1000,
        4099,
        (1 << 16) + 7,
    ];
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The error bound of a 16-bit sum of `p` terms relative to Σ|xᵢ|: γ₍ₚ₋₁₎ = (p−1)u/(1−(p−1)u),
/// which holds for any summation tree (Higham, Accuracy and Stability of Numerical Algorithms,
/// §4.2). u is the format's unit roundoff plus 2^-23, as each addition first rounds to binary32.
fn half_tolerance<H: Half>(p: usize) -> f64 {
    let u = H::UNIT_ROUNDOFF + 2f64.powi(-23);
    let k = (p - 1) as f64 * u;
    k / (1.0 - k)
}

/// A row's algorithm: its name, the algorithm, and the simulated node size it runs with.
type Case = (String, Algorithm, Option<usize>);

/// The algorithms `plan` names on `p` ranks, hierarchical once more per simulated node size.
fn cases(plan: &Plan, p: usize) -> Vec<Case> {
    let mut cases: Vec<Case> = Vec::new();
    for &algo in &plan.algos {
        let name = match algo {
            Algorithm::Torus2d => {
                let (x, y) = plan
                    .torus_shape
                    .unwrap_or_else(|| super::torus::default_shape(p));
                format!("torus2d {x}x{y}")
            }
            Algorithm::Hierarchical => "hierarchical (shared-memory nodes)".to_string(),
            _ => algo.to_string(),
        };
        cases.push((name, algo, None));
        if algo == Algorithm::Hierarchical {
            for &k in &plan.ranks_per_node {
                cases.push((
                    format!("hierarchical ({k} ranks/node)"),
                    Algorithm::Hierarchical,
                    Some(k),
                ));
            }
        }
    }
    cases
}

/// Runs the plan on every rank (collective); every rank returns the same outcomes (errors are
/// maxed and hashes gathered across ranks).
pub fn run(world: &mut World, plan: &Plan) -> Result<Vec<Outcome>> {
    let (p, rank) = (world.size(), world.rank());
    let cases = cases(plan, p);
    world.set_torus_shape(plan.torus_shape)?;

    // Rows: every case in f32, then in each 16-bit format; the payload all-reduce in each
    // format; the all-gather; the two agreements.
    let k = cases.len();
    let f32_tolerance = p as f64 * f32::EPSILON as f64;
    let mut outcomes: Vec<Outcome> = cases
        .iter()
        .map(|(name, ..)| Outcome::new(name, "f32", f32_tolerance))
        .collect();
    for (element, tolerance) in [
        (Element::F16, half_tolerance::<F16>(p)),
        (Element::Bf16, half_tolerance::<Bf16>(p)),
    ] {
        outcomes.extend(
            cases
                .iter()
                .map(|(name, ..)| Outcome::new(name, element.name(), tolerance)),
        );
    }
    for element in Element::ALL {
        outcomes.push(Outcome::new(PAYLOAD_ROW, element.name(), 0.0));
    }
    outcomes.push(Outcome::new("all-gather of bytes", "bytes", 0.0));
    outcomes.push(Outcome::new("length agreement", "u64", 0.0));
    outcomes.push(Outcome::new("failure agreement", "flag", 0.0));

    for &n in &plan.sizes {
        let inputs: Vec<Vec<f32>> = (0..p).map(|r| rank_data(plan.seed, r, n)).collect();
        let (sums, rest) = outcomes.split_at_mut(3 * k);
        let (payload_rows, rest) = rest.split_at_mut(Element::ALL.len());
        let checks = [
            f32_rows(world, &cases, &inputs[rank], n, &mut sums[..k])?,
            half_rows::<F16>(world, &cases, &inputs, n, &mut sums[k..2 * k])?,
            half_rows::<Bf16>(world, &cases, &inputs, n, &mut sums[2 * k..])?,
        ];
        for (check, row) in checks.into_iter().zip(payload_rows) {
            check.record(world, n, row)?;
        }

        let (all, _) = world.all_gather_bytes(&payload(plan.seed, rank, n, p))?;
        let wrong = (0..p)
            .filter(|&r| all.get(r) != Some(&payload(plan.seed, r, n, p)))
            .count()
            + all.len().saturating_sub(p);
        let mut framed = Vec::new();
        for b in &all {
            framed.extend((b.len() as u64).to_le_bytes());
            framed.extend(b);
        }
        rest[0].record(world, n, wrong as f64 / p as f64, hash([framed]))?;
        agreement_rows(world, plan.seed, n, &mut rest[1..])?;
    }
    world.set_ranks_per_node(None)?;
    Ok(outcomes)
}

/// The name of the rows that check [`World::all_reduce_payload`].
const PAYLOAD_ROW: &str = "all-reduce of payloads";

/// How [`World::all_reduce_payload`] compared with the direct sums of one format at one size.
#[derive(Default)]
struct PayloadCheck {
    calls: usize,
    wrong: usize,
    sums: Vec<u8>,
}

impl PayloadCheck {
    /// Sums `mine` (little-endian `element`s) as a payload with `algo`; it must give `direct`,
    /// the bytes of the direct call's result (collective).
    fn check(
        &mut self,
        world: &mut World,
        algo: Algorithm,
        element: Element,
        mine: &[u8],
        direct: &[u8],
    ) -> Result<()> {
        let (sum, _) = world.all_reduce_payload(algo, element, mine)?;
        self.calls += 1;
        self.wrong += usize::from(sum != direct);
        self.sums.extend(sum);
        Ok(())
    }

    /// Records the fraction of calls that differed, and the sums' hash (collective).
    fn record(self, world: &World, n: usize, row: &mut Outcome) -> Result<()> {
        let error = self.wrong as f64 / self.calls.max(1) as f64;
        row.record(world, n, error, hash([self.sums]))
    }
}

/// The binary32 rows at size `n` (against MPI_Allreduce), and the payload check of each case.
fn f32_rows(
    world: &mut World,
    cases: &[Case],
    data: &[f32],
    n: usize,
    rows: &mut [Outcome],
) -> Result<PayloadCheck> {
    let mut reference = data.to_vec();
    world.all_reduce_sum(Algorithm::Mpi, &mut reference)?;
    let mut magnitude: Vec<f32> = data.iter().map(|x| x.abs()).collect();
    world.all_reduce_sum(Algorithm::Mpi, &mut magnitude)?;
    let mine = le_bytes(data, f32::to_le_bytes);
    let mut check = PayloadCheck::default();
    for ((_, algo, ranks_per_node), outcome) in cases.iter().zip(rows) {
        world.set_ranks_per_node(*ranks_per_node)?;
        let mut got = data.to_vec();
        world.all_reduce_sum(*algo, &mut got)?;
        let error = max_relative_error(
            got.iter()
                .zip(&reference)
                .zip(&magnitude)
                .map(|((g, r), m)| (*g as f64, *r as f64, *m as f64)),
        );
        let got = le_bytes(&got, f32::to_le_bytes);
        check.check(world, *algo, Element::F32, &mine, &got)?;
        outcome.record(world, n, error, hash([got]))?;
    }
    Ok(check)
}

/// The rows of 16-bit format `H` at size `n` (against the exact sum of every rank's `inputs`),
/// and the payload check of each case.
fn half_rows<H: Half>(
    world: &mut World,
    cases: &[Case],
    inputs: &[Vec<f32>],
    n: usize,
    rows: &mut [Outcome],
) -> Result<PayloadCheck> {
    // Scaled so that no partial sum overflows f16 (largest finite 65504) at any world size.
    let scale = 1.0 / inputs.len().next_power_of_two() as f32;
    let bits: Vec<Vec<u16>> = inputs
        .iter()
        .map(|v| v.iter().map(|x| H::bits(x * scale)).collect())
        .collect();
    let (mut exact, mut magnitude) = (vec![0f64; n], vec![0f64; n]);
    for b in &bits {
        for ((e, m), &h) in exact.iter_mut().zip(&mut magnitude).zip(b) {
            *e += H::value(h) as f64;
            *m += (H::value(h) as f64).abs();
        }
    }
    let mine = &bits[world.rank()];
    let mine_bytes = le_bytes(mine, u16::to_le_bytes);
    let mut check = PayloadCheck::default();
    for ((_, algo, ranks_per_node), outcome) in cases.iter().zip(rows) {
        world.set_ranks_per_node(*ranks_per_node)?;
        let mut got = mine.clone();
        world.all_reduce_sum_half(*algo, H::ELEMENT, &mut got)?;
        let error = max_relative_error(
            got.iter()
                .zip(&exact)
                .zip(&magnitude)
                .map(|((g, e), m)| (H::value(*g) as f64, *e, *m)),
        );
        let got = le_bytes(&got, u16::to_le_bytes);
        check.check(world, *algo, H::ELEMENT, &mine_bytes, &got)?;
        outcome.record(world, n, error, hash([got]))?;
    }
    Ok(check)
}

/// [`World::agree_lengths`] and [`World::agree_failure`] at size `n` (`rows`: one row each),
/// once with no rank failing and once with the ranks r where (r + n) mod 3 = 0 failing (none,
/// some or all, depending on n and the size). Every rank knows what every rank reports, so it
/// computes the expected answer itself.
fn agreement_rows(world: &World, seed: u64, n: usize, rows: &mut [Outcome]) -> Result<()> {
    let (p, rank) = (world.size(), world.rank());
    let lengths: Vec<u64> = (0..p)
        .map(|r| payload(seed, r, n, p).len() as u64)
        .collect();
    let failing = |r: usize| (r + n).is_multiple_of(3);
    let mut wrong = [0usize; 2];
    let mut answers = [String::new(), String::new()];
    for some_fail in [false, true] {
        let failed_here = some_fail && failing(rank);
        let lowest = (0..p).find(|&r| some_fail && failing(r));
        let want = match lowest {
            Some(rank) => Agreement::Failed { rank },
            None => Agreement::Lengths(lengths.clone()),
        };
        let got = world.agree_lengths((!failed_here).then_some(lengths[rank]))?;
        wrong[0] += usize::from(got != want);
        answers[0] += &format!("{got:?};");
        let got = world.agree_failure(failed_here)?;
        wrong[1] += usize::from(got != lowest);
        answers[1] += &format!("{got:?};");
    }
    for ((row, wrong), answer) in rows.iter_mut().zip(wrong).zip(answers) {
        row.record(world, n, wrong as f64 / 2.0, hash([answer]))?;
    }
    Ok(())
}

/// `xs` as little-endian bytes.
fn le_bytes<T: Copy, const N: usize>(xs: &[T], to_le: fn(T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(|&x| to_le(x)).collect()
}

/// The rank-0 summary.
pub fn print(world: &World, plan: &Plan, outcomes: &[Outcome], mut out: impl Write) -> Result<()> {
    writeln!(
        out,
        "all-reduce selftest: {} ranks, sizes {:?}",
        world.size(),
        plan.sizes,
    )?;
    writeln!(
        out,
        "errors are |got - reference| / sum|x|: reference MPI_Allreduce for f32, the exact sum \
         for f16 and bf16"
    )?;
    writeln!(
        out,
        "payload, all-gather and agreement rows: the fraction of calls whose result was wrong"
    )?;
    writeln!(
        out,
        "{:<36} {:<7} {:>10} {:>12}  {:<14} result",
        "algorithm", "element", "tolerance", "max error", "ranks agree"
    )?;
    for o in outcomes {
        let tolerance = if o.tolerance == 0.0 {
            "exact".to_string()
        } else {
            format!("{:.2e}", o.tolerance)
        };
        writeln!(
            out,
            "{:<36} {:<7} {:>10} {:>12.3e}  {:<14} {}",
            o.name,
            o.element,
            tolerance,
            o.max_error,
            if o.divergent_sizes.is_empty() {
                "bit-identical"
            } else {
                "DIFFER"
            },
            if o.passed() {
                "ok".to_string()
            } else {
                format!(
                    "FAILED (wrong at {:?}, ranks differ at {:?})",
                    o.wrong_sizes, o.divergent_sizes
                )
            }
        )?;
    }
    Ok(())
}

/// Rank `rank`'s vector of size `n`: spread over 2^±12 so that partial sums round, and
/// summation order shows.
fn rank_data(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(
        seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n as u64,
    );
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * (rng.random_range(-12..=12) as f32).exp2())
        .collect()
}

/// Rank `rank`'s all-gather payload for size `n`: lengths differ between ranks, and rank
/// n mod p sends nothing.
fn payload(seed: u64, rank: usize, n: usize, p: usize) -> Vec<u8> {
    let len = if rank == n % p {
        0
    } else {
        n / (rank + 1) + rank
    };
    (0..len)
        .map(|i| seed.wrapping_add((31 * rank + 7 * i) as u64) as u8)
        .collect()
}

/// The largest |got − want| / scale over `(got, want, scale)` triples; NaN counts as infinite.
fn max_relative_error(triples: impl Iterator<Item = (f64, f64, f64)>) -> f64 {
    triples
        .map(|(got, want, scale)| {
            let e = (got - want).abs() / scale.max(f64::MIN_POSITIVE);
            if e.is_nan() { f64::INFINITY } else { e }
        })
        .fold(0.0, f64::max)
}

fn hash<B: AsRef<[u8]>>(parts: impl IntoIterator<Item = B>) -> u64 {
    let mut h = blake3::Hasher::new();
    for part in parts {
        h.update(part.as_ref());
    }
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::super::chunks::Format;
    use super::*;

    #[test]
    fn a_single_process_world_passes_its_own_selftest() {
        let mut world = World::single();
        let plan = Plan {
            algos: Algorithm::ALL.to_vec(),
            sizes: default_sizes(1),
            torus_shape: None,
            ranks_per_node: vec![1],
            seed: 3,
        };
        let outcomes = run(&mut world, &plan).unwrap();
        assert_eq!(outcomes.len(), 7 * 3 + 3 + 3);
        assert_eq!(outcomes[21].name, PAYLOAD_ROW);
        assert!(
            outcomes.iter().all(|o| o.passed() && o.max_error == 0.0),
            "{outcomes:?}"
        );
    }

    #[test]
    fn a_plan_tests_only_its_algorithms() {
        let mut world = World::single();
        let plan = Plan {
            algos: vec![Algorithm::BinaryBlocks, Algorithm::Ring],
            sizes: vec![0, 5],
            torus_shape: None,
            ranks_per_node: vec![2],
            seed: 3,
        };
        let outcomes = run(&mut world, &plan).unwrap();
        let names: Vec<&str> = outcomes.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names[..6], ["binary-blocks", "ring"].repeat(3));
        assert_eq!(outcomes.len(), 2 * 3 + 3 + 3);
        assert!(outcomes.iter().all(Outcome::passed), "{outcomes:?}");
    }

    /// Random additions in `H` stay within the two-rank tolerance of the exact sum.
    fn one_rounded_addition_within_tolerance<H: Half + Format<Stored = u16>>() {
        let mut rng = StdRng::seed_from_u64(5);
        assert_eq!(half_tolerance::<H>(1), 0.0);
        let tolerance = half_tolerance::<H>(2);
        for _ in 0..100_000 {
            // Exponents from f16's subnormals to near its largest finite value.
            let mut draw = || {
                let x = rng.random_range(-1.0f32..1.0) * (rng.random_range(-24..=14) as f32).exp2();
                H::bits(x)
            };
            let (a, b) = (draw(), draw());
            let (x, y) = (H::value(a) as f64, H::value(b) as f64);
            let error = (H::value(H::add(a, b)) as f64 - (x + y)).abs();
            assert!(
                error <= tolerance * (x.abs() + y.abs()),
                "{:?}: {x} + {y}",
                H::ELEMENT
            );
        }
    }

    #[test]
    fn one_rounded_16_bit_addition_stays_within_the_two_rank_tolerance() {
        one_rounded_addition_within_tolerance::<F16>();
        one_rounded_addition_within_tolerance::<Bf16>();
    }

    #[test]
    fn payloads_have_rank_dependent_lengths_and_one_is_empty() {
        let lengths: Vec<usize> = (0..4).map(|r| payload(1, r, 10, 4).len()).collect();
        assert_eq!(lengths, [10, 6, 0, 5]);
    }

    #[test]
    fn default_sizes_include_the_edge_cases() {
        let s = default_sizes(4);
        for n in [0, 1, 3, 4, 5, 9, 1000, 65543] {
            assert!(s.contains(&n), "{n} missing from {s:?}");
        }
    }
}
