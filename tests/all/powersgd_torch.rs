//! `codec-powersgd` with warm start against PyTorch's own `powerSGD_hook`
//! (scripts/torch-powersgd-reference.py, two gloo ranks): from the same initial Q and the same
//! gradients, 20 steps of two ranks give the same P̂ and Q of every matrix, the same result and,
//! with `--error-feedback mean`, the same residuals, to 1e-5 relative.
//!
//! The plugin runs through the sandbox as the trainer calls it (contract 0.4: the bucket's
//! state in its meta, `next-state` after the decode), the two ranks' payloads summed here in
//! rank order as an all-reduce of two ranks sums them.

use lsgd_codec::rng::Rng;
use lsgd_codec::wire::{f32s_from_le, put_f32s};
use lsgd_codec::{Meta, TensorSlice};
use lsgd_host::codec::bucket_meta;
use serde_json::Value;

use crate::common::{load, root, runtime, scratch, stderr, venv_python};

const RANKS: usize = 2;
const STEPS: usize = 20;
const R: usize = 2;

/// Distinct shapes (the hook groups tensors by shape): a convolution (16 × 72), a bias, a
/// linear layer (24 × 40), a 3 × 3 matrix too small to gain (sent raw) and another layer.
const SHAPES: [&[u32]; 5] = [&[16, 8, 3, 3], &[32], &[24, 40], &[3, 3], &[10, 24]];

/// (rows, cols) of the compressed tensors, in bucket order.
const MATS: [(usize, usize); 3] = [(16, 72), (24, 40), (10, 24)];

/// One step as either side saw it on one rank: each matrix's P̂ and Q (row-major, n × r and
/// m × r), the step's result and the rank's residual (in torch's units: not divided by the
/// number of ranks).
#[derive(Debug)]
struct Step {
    p_hat: Vec<Vec<f32>>,
    q: Vec<Vec<f32>>,
    out: Vec<f32>,
    error: Vec<f32>,
}

fn tensors() -> Vec<TensorSlice> {
    let mut at = 0;
    SHAPES
        .iter()
        .map(|s| {
            let t = TensorSlice::whole("t", s, at);
            at += t.len;
            t
        })
        .collect()
}

fn len() -> usize {
    tensors().iter().map(|t| t.len as usize).sum()
}

/// Each rank's gradient per step, as DDP holds it (not divided by the ranks): a rank-2 part
/// shared by the ranks, its two directions well above the noise and turning slowly, plus each
/// rank's own noise. Both sides round differently (their own dot products and Gram–Schmidt), and
/// P̂ amplifies that by the inverse gap between the r-th and the next singular value: with a
/// second direction drawn from the noise alone the two would part by more than rounding.
fn gradients() -> Vec<Vec<Vec<f32>>> {
    let n = len();
    let mut rng = Rng::new(31);
    let mut vector = || (0..n).map(|_| rng.normal()).collect::<Vec<f32>>();
    let (a, b, c, d) = (vector(), vector(), vector(), vector());
    let (mut first, mut second) = (vec![0f32; n], vec![0f32; n]);
    for t in tensors() {
        let cols = t.cols() as usize;
        let range = t.range();
        for i in 0..range.len() {
            let (row, col) = (range.start + i / cols, range.start + i % cols);
            first[range.start + i] = a[row] * b[col];
            second[range.start + i] = 0.5 * c[row] * d[col];
        }
    }
    (0..STEPS)
        .map(|step| {
            let turn = 1.0 + 0.3 * (step as f32 * 0.3).cos();
            (0..RANKS)
                .map(|_| {
                    (0..n)
                        .map(|i| first[i] * turn + second[i] / turn + 0.1 * rng.normal())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Row-major m × r from the codec's column-major layout (r columns of m floats), and back.
fn row_major(cols_first: &[f32], m: usize) -> Vec<f32> {
    let r = cols_first.len() / m;
    (0..m * r)
        .map(|i| cols_first[(i % r) * m + i / r])
        .collect()
}

fn column_major(rows_first: &[f32], m: usize) -> Vec<f32> {
    let r = rows_first.len() / m;
    (0..m * r)
        .map(|i| rows_first[(i % m) * r + i / m])
        .collect()
}

/// P̂ from a summed P (column-major, r columns of n floats): Gram–Schmidt in binary64, as the
/// codec orthonormalises it; row-major.
fn p_hat(p: &[f32], n: usize) -> Vec<f32> {
    let mut cols: Vec<Vec<f64>> = p
        .chunks(n)
        .map(|c| c.iter().map(|&x| x.into()).collect())
        .collect();
    for j in 0..cols.len() {
        let (done, rest) = cols.split_at_mut(j);
        for e in done.iter() {
            let d: f64 = e.iter().zip(&rest[0]).map(|(a, b)| a * b).sum();
            rest[0].iter_mut().zip(e).for_each(|(x, y)| *x -= d * y);
        }
        let norm = rest[0].iter().map(|x| x * x).sum::<f64>().sqrt();
        rest[0].iter_mut().for_each(|x| *x /= norm);
    }
    let flat: Vec<f32> = cols.iter().flatten().map(|&x| x as f32).collect();
    row_major(&flat, n)
}

fn sum(a: &[u8], b: &[u8]) -> Vec<u8> {
    let s: Vec<f32> = f32s_from_le(a)
        .iter()
        .zip(f32s_from_le(b))
        .map(|(x, y)| x + y)
        .collect();
    let mut out = Vec::new();
    put_f32s(&mut out, &s);
    out
}

/// The host's side: `codec-powersgd` over two ranks from the state `q0` (column-major), with
/// `--error-feedback mean` when `error_feedback`; rank `watch`'s view of every step.
fn host(grads: &[Vec<Vec<f32>>], q0: &[u8], error_feedback: bool, watch: usize) -> Vec<Step> {
    let mut codec = load(&runtime(), "codec-powersgd", &[]).unwrap();
    let n = len();
    let k = RANKS as f32;
    let mut state = q0.to_vec();
    let mut residual = vec![vec![0f32; n]; RANKS];
    let mut seen = Vec::new();
    for (step, grads) in grads.iter().enumerate() {
        let meta = |round| Meta {
            round,
            state: state.clone(),
            ..bucket_meta(7, step as u64, 0, 0, n as u32, tensors())
        };
        // The trainer's gradients arrive divided by the ranks; error feedback adds e.
        let p: Vec<Vec<f32>> = grads
            .iter()
            .zip(&residual)
            .map(|(g, e)| g.iter().zip(e).map(|(g, e)| g / k + e).collect())
            .collect();
        let ps: Vec<Vec<u8>> = p
            .iter()
            .map(|p| codec.encode(&meta(0), p, &[]).unwrap())
            .collect();
        let p_sum = sum(&ps[0], &ps[1]);
        let agreed = [p_sum.clone()];
        let qs: Vec<Vec<u8>> = p
            .iter()
            .map(|p| codec.encode(&meta(1), p, &agreed).unwrap())
            .collect();
        let both = vec![p_sum, sum(&qs[0], &qs[1])];
        let out = codec.decode(&meta(1), &both).unwrap();
        if error_feedback {
            for (e, p) in residual.iter_mut().zip(&p) {
                *e = p.iter().zip(&out).map(|(p, o)| p - o / k).collect();
            }
        }
        state = codec.next_state(&meta(1), &both).unwrap();
        let (mut p_at, mut q_at) = (0, 0);
        let (ps_sum, q_bar) = (f32s_from_le(&both[0]), f32s_from_le(&state));
        let (mut p_hats, mut q) = (Vec::new(), Vec::new());
        for (rows, cols) in MATS {
            p_hats.push(p_hat(&ps_sum[p_at..p_at + rows * R], rows));
            q.push(row_major(&q_bar[q_at..q_at + cols * R], cols));
            p_at += rows * R;
            q_at += cols * R;
        }
        let error = match error_feedback {
            true => residual[watch].iter().map(|e| e * k).collect(),
            false => Vec::new(),
        };
        seen.push(Step {
            p_hat: p_hats,
            q,
            out,
            error,
        });
    }
    seen
}

/// PyTorch's side, each rank's view, from the same gradients and initial Q (row-major).
fn torch(grads: &[Vec<Vec<f32>>], q0_rows: &[f32], error_feedback: bool) -> Vec<Vec<Step>> {
    let dir = scratch(&format!("powersgd-torch-{error_feedback}"));
    let mut g = Vec::new();
    put_f32s(
        &mut g,
        &grads
            .iter()
            .flatten()
            .flatten()
            .copied()
            .collect::<Vec<_>>(),
    );
    std::fs::write(dir.join("grads.f32"), g).unwrap();
    let mut q = Vec::new();
    put_f32s(&mut q, q0_rows);
    std::fs::write(dir.join("q0.f32"), q).unwrap();
    let spec = serde_json::json!({
        "shapes": SHAPES, "rank": R, "ranks": RANKS, "steps": STEPS,
        "error_feedback": error_feedback, "warm_start": true,
        "grads": dir.join("grads.f32"), "q0": dir.join("q0.f32"),
    });
    std::fs::write(dir.join("in.json"), spec.to_string()).unwrap();
    let o = std::process::Command::new(venv_python())
        .arg(root().join("scripts/torch-powersgd-reference.py"))
        .arg(dir.join("in.json"))
        .arg(&dir)
        .output()
        .expect("the venv's python runs (scripts/setup.sh --python-torch)");
    assert!(o.status.success(), "torch reference failed: {}", stderr(&o));
    (0..RANKS)
        .map(|r| {
            let text = std::fs::read_to_string(dir.join(format!("rank{r}.json"))).unwrap();
            let steps: Vec<Value> = serde_json::from_str(&text).unwrap();
            let floats = |v: &Value| -> Vec<f32> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().parse().unwrap())
                    .collect()
            };
            let each = |v: &Value| v.as_array().unwrap().iter().map(floats).collect();
            steps
                .iter()
                .map(|s| Step {
                    p_hat: each(&s["p_hat"]),
                    q: each(&s["q"]),
                    out: floats(&s["out"]),
                    error: floats(&s["error"]),
                })
                .collect()
        })
        .collect()
}

/// ‖a − b‖ / ‖b‖ in binary64.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let n: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (d / n.max(f64::MIN_POSITIVE)).sqrt()
}

fn parity(error_feedback: bool) {
    let grads = gradients();
    let mut rng = Rng::new(5);
    let q0_rows: Vec<f32> = MATS
        .iter()
        .flat_map(|&(_, cols)| (0..cols * R).map(|_| rng.normal()).collect::<Vec<_>>())
        .collect();
    let mut q0_cols = Vec::new();
    let mut at = 0;
    for (_, cols) in MATS {
        q0_cols.extend(column_major(&q0_rows[at..at + cols * R], cols));
        at += cols * R;
    }
    let mut q0 = Vec::new();
    put_f32s(&mut q0, &q0_cols);
    let theirs = torch(&grads, &q0_rows, error_feedback);
    let mut worst = 0f64;
    for (rank, theirs) in theirs.iter().enumerate() {
        let ours = host(&grads, &q0, error_feedback, rank);
        for (step, (a, b)) in ours.iter().zip(theirs).enumerate() {
            let mut check = |what: String, x: &[f32], y: &[f32]| {
                let rel = relative(x, y);
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-5,
                    "rank {rank} step {step} {what}: {rel:e} relative"
                );
            };
            for (m, (x, y)) in a.p_hat.iter().zip(&b.p_hat).enumerate() {
                check(format!("P̂ of matrix {m}"), x, y);
            }
            for (m, (x, y)) in a.q.iter().zip(&b.q).enumerate() {
                check(format!("Q of matrix {m}"), x, y);
            }
            check("result".into(), &a.out, &b.out);
            if error_feedback {
                check("residual".into(), &a.error, &b.error);
            }
        }
    }
    eprintln!(
        "powerSGD_hook parity, error feedback {error_feedback}: {STEPS} steps, worst {worst:.2e} relative"
    );
}

#[test]
fn warm_started_powersgd_matches_torchs_hook_for_twenty_steps() {
    parity(false);
}

#[test]
fn with_the_mean_residual_it_matches_torchs_error_feedback_too() {
    parity(true);
}
