//! Contract 0.4's codec state through the trainer, with `codec-powersgd`'s warm start: kept in
//! checkpoints and resumed bit for bit, identical on every rank (the consistency check compares
//! it), taken as saved by a resume on another number of ranks; and `--error-feedback mean`,
//! PyTorch's residual, which splits between the ranks what `residual` keeps, to the same sum.

use lsgd_host::train::checkpoint;

use crate::codecs::{losses, run};
use crate::common::*;

const POWERSGD: [&str; 2] = ["--codec", "codec-powersgd"];

/// The codec-state tensors of a run directory's newest checkpoint, by name, as bytes.
fn codec_state(out: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let (_, tensors) = checkpoint::load(&out.join("checkpoint.json")).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = tensors
        .into_iter()
        .filter(|(n, _)| n.starts_with("codec.state."))
        .map(|(n, t)| (n, Vec::<u8>::try_from(t.flatten(0, -1)).unwrap()))
        .collect();
    v.sort();
    v
}

/// Each rank's saved residual, summed over the buckets in order: `ef.rank{r}.bucket{b}`.
fn residuals(out: &std::path::Path, ranks: usize) -> Vec<Vec<f32>> {
    let (_, tensors) = checkpoint::load(&out.join("checkpoint.json")).unwrap();
    (0..ranks)
        .map(|r| {
            let prefix = format!("ef.rank{r}.bucket");
            let mut parts: Vec<(usize, Vec<f32>)> = tensors
                .iter()
                .filter_map(|(n, t)| {
                    let b = n.strip_prefix(&prefix)?.parse().ok()?;
                    Some((b, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
                })
                .collect();
            parts.sort_by_key(|(b, _)| *b);
            parts.into_iter().flat_map(|(_, v)| v).collect()
        })
        .collect()
}

#[test]
fn powersgd_warm_start_state_resumes_bit_for_bit() {
    let (straight, split) = (scratch("state-straight"), scratch("state-split"));
    let o = run(&straight, &POWERSGD);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(
        &split,
        &[&POWERSGD[..], &["--stop-after-steps", "3"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = codec_state(&split);
    assert!(!saved.is_empty(), "the warm start keeps a Q per bucket");
    assert!(
        saved.iter().all(|(_, b)| !b.is_empty() && b.len() % 4 == 0),
        "{saved:?}"
    );
    let resumed = [&POWERSGD[..], &["--resume", split.to_str().unwrap()]].concat();
    let o = run(&split, &resumed);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        losses(&straight),
        losses(&split),
        "the resume continued the same Q"
    );

    // Without warm start the codec keeps nothing, and the run is another run.
    let cold = scratch("state-cold");
    let o = run(
        &cold,
        &[&POWERSGD[..], &["--set", "codec.warm_start=false"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(codec_state(&cold).is_empty());
    let (warm, cold) = (losses(&straight), losses(&cold));
    assert_eq!(warm[0], cold[0], "both start from the same Q₀");
    assert_ne!(warm, cold);
}

#[test]
fn two_ranks_hold_the_same_state_and_one_rank_resumes_it_as_saved() {
    if no_mpirun() {
        return;
    }
    let out = scratch("state-ranks");
    let stop = [&POWERSGD[..], &["--stop-after-steps", "3"]].concat();
    let o = mpirun(&[ranks(2, &out, &stop)]);
    assert!(o.status.success(), "{}", stderr(&o));
    // --consistency-every 2: the codec state was compared at step 2 and at the end.
    assert!(
        stderr(&o).contains("bit-identical on all 2 ranks"),
        "{}",
        stderr(&o)
    );
    let two = codec_state(&out);
    assert!(!two.is_empty());
    let mut one = ranks(1, &out, &stop);
    one.extend(["--resume".to_string(), out.display().to_string()]);
    let o = mpirun(&[one]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        codec_state(&out),
        two,
        "every rank takes the state as saved"
    );
}

#[test]
fn the_mean_residual_splits_the_ranks_share_differently_to_the_same_sum() {
    if no_mpirun() {
        return;
    }
    let mut kept = Vec::new();
    for mode in ["residual", "mean"] {
        let out = scratch(&format!("state-ef-{mode}"));
        let flags = [
            &POWERSGD[..],
            &["--error-feedback", mode, "--stop-after-steps", "1"],
        ]
        .concat();
        let o = mpirun(&[ranks(2, &out, &flags)]);
        assert!(o.status.success(), "{mode}: {}", stderr(&o));
        kept.push(residuals(&out, 2));
    }
    let (residual, mean) = (&kept[0], &kept[1]);
    assert_ne!(residual[0], mean[0], "the split differs");
    // After one step from zero residuals both modes sent the same payloads: the sums owed
    // agree but for the rounding of the two ways of computing them.
    let sum = |e: &Vec<Vec<f32>>| -> Vec<f64> {
        e[0].iter()
            .zip(&e[1])
            .map(|(a, b)| f64::from(*a) + f64::from(*b))
            .collect()
    };
    let (a, b) = (sum(residual), sum(mean));
    let scale = a.iter().fold(0f64, |m, x| m.max(x.abs()));
    assert!(scale > 0.0);
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        worst <= 1e-5 * scale,
        "sums differ by {worst} at scale {scale}"
    );
}

#[test]
fn compare_carries_a_stateful_codecs_state_from_bucket_to_bucket() {
    use lsgd_host::compare::{CodecInputs, Tolerance, compare_codecs};
    let rt = runtime();
    let mut warm = load(&rt, "codec-powersgd", &[]).unwrap();
    let mut cold = load(&rt, "codec-powersgd", &[("warm_start", "false")]).unwrap();
    let inputs = CodecInputs {
        rows: 48,
        cols: 32,
        buckets: 3,
        seed: 9,
    };
    let exact = Tolerance {
        rtol: 0.0,
        atol: 0.0,
    };
    let r = compare_codecs(&mut warm, &mut cold, inputs, exact).unwrap();
    let (a, b) = (&r.a.payload_blake3, &r.b.payload_blake3);
    assert_eq!(a[0], b[0], "the first bucket starts both from the same Q₀");
    assert!(
        a[1] != b[1] && a[2] != b[2],
        "later buckets start from the kept Q"
    );
    // The same codec on both sides carries the same state: identical throughout.
    let mut again = load(&rt, "codec-powersgd", &[]).unwrap();
    let mut warm = load(&rt, "codec-powersgd", &[]).unwrap();
    let r = compare_codecs(&mut warm, &mut again, inputs, exact).unwrap();
    assert!(r.payloads_identical && r.within_tolerance());
}

/// Error-feedback residuals saved with the buckets laid out in one order (an older checkpoint's
/// optimizer order, or another readiness order) are moved to the resuming run's buckets element
/// for element: each tensor's residual is the same after the move.
#[test]
fn residuals_saved_for_another_bucket_layout_move_to_this_runs_element_for_element() {
    use lsgd_host::collective::{Algorithm, World};
    use lsgd_host::train::exchange::{ErrorFeedback, GradientExchange, Local};
    use tch::{Kind, Tensor};

    let shapes: Vec<(String, Vec<i64>)> = [("a", vec![4, 3]), ("b", vec![5]), ("c", vec![6, 2])]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    let weights: Vec<Tensor> = shapes
        .iter()
        .enumerate()
        .map(|(i, (_, s))| {
            let w = Tensor::ones(s.as_slice(), (Kind::Float, tch::Device::Cpu));
            let w = (w * (i as f64 + 1.0)).set_requires_grad(true);
            let n = w.numel() as i64;
            // A gradient whose elements all differ, so that top-k leaves a residual everywhere.
            (&w * Tensor::arange(n, (Kind::Float, tch::Device::Cpu)).view(s.as_slice()))
                .sum(Kind::Float)
                .backward();
            w
        })
        .collect();
    let refs: Vec<&Tensor> = weights.iter().collect();
    let local = Local {
        error_feedback: ErrorFeedback::Residual,
        ..Local::default()
    };
    let rt = runtime();
    let mut codec = load(&rt, "codec-top-k", &[("density", "0.25")]).unwrap();
    let mut world = World::single();
    let exchange = |order: &[usize], codec: &mut lsgd_host::plugin::Plugin| {
        GradientExchange::new(
            &shapes,
            order,
            8,
            Algorithm::Mpi,
            Some(codec),
            local.clone(),
            1,
        )
        .unwrap()
    };
    // Each tensor's residual, from a checkpoint's bucket tensors and the layout's order.
    let per_tensor = |x: &GradientExchange, saved: &[(String, Tensor)]| -> Vec<Vec<f32>> {
        let mut flat: Vec<Vec<f32>> = shapes
            .iter()
            .map(|(_, s)| vec![0.0; s.iter().product::<i64>() as usize])
            .collect();
        for (b, bucket) in x.buckets().iter().enumerate() {
            let key = format!("ef.rank0.bucket{b}");
            let (_, t) = saved.iter().find(|(n, _)| *n == key).unwrap();
            let v = Vec::<f32>::try_from(t).unwrap();
            let mut offset = 0;
            for s in &bucket.slices {
                let (tensor, start) = (
                    shapes.iter().position(|(n, _)| *n == s.name).unwrap(),
                    s.tensor_offset as usize,
                );
                let len = s.len as usize;
                flat[tensor][start..start + len].copy_from_slice(&v[offset..offset + len]);
                offset += len;
            }
        }
        flat
    };
    let mut first = exchange(&[0, 1, 2], &mut codec);
    first
        .exchange(&mut world, Some(&mut codec), &refs, 0)
        .unwrap();
    let saved = first.checkpoint_tensors(&world).unwrap();
    let before = per_tensor(&first, &saved);
    assert!(before.iter().flatten().any(|&r| r != 0.0));
    for (saved_order, order) in [(None, [2, 0, 1]), (Some(vec![0, 1, 2]), [1, 2, 0])] {
        let mut resumed = exchange(&order, &mut codec);
        assert_ne!(resumed.buckets(), first.buckets());
        resumed
            .restore(&saved, 0, 1, saved_order.as_deref())
            .unwrap();
        let after = per_tensor(&resumed, &resumed.checkpoint_tensors(&world).unwrap());
        assert_eq!(after, before, "{order:?}");
    }
}
