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
