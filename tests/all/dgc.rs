//! Deep Gradient Compression end to end: the `codec-dgc` plugin along its warm-up ramp against
//! its native build, two ranks at 99.9% final sparsity with `--error-feedback momentum` and
//! local clipping (bit-identical, at most a point below uncompressed, payload bytes shrinking
//! along the ramp), momentum correction through the identity codec equal to SGD without
//! momentum, a resume bit for bit with the velocity in the checkpoint, the refusals, and the
//! flag in a config file.

use lsgd_codec::Value;
use lsgd_host::codec::{native_round_trip, round_trip, sample_bucket};

use crate::codecs::{accuracy, accuracy_job, losses, run, uncompressed_accuracy};
use crate::common::*;

/// Steps per warm-up stage in the accuracy job (94 steps, 47 per epoch): the four warm-up
/// stages fill the first epoch, the second runs at 99.9%.
const STAGE: u64 = 12;

/// Payload bytes of `codec-dgc` (warm-up stages of 2 steps, `selection` as given) over steps
/// 0–11 of a 256×128 weight and its bias, checked step by step against the native build.
fn ramp(selection: &str) -> Vec<usize> {
    let set = [("warmup_steps", "2"), ("selection", selection)];
    let mut plugin = load(&runtime(), "codec-dgc", &set).unwrap();
    let given = vec![
        ("warmup_steps".into(), Value::Integer(2)),
        ("selection".into(), Value::Text(selection.into())),
    ];
    let native = lsgd_codec::native("dgc", given).unwrap().unwrap();
    (0..12)
        .map(|step| {
            let (meta, data) = sample_bucket(256, 128, step, 3);
            let wasm = round_trip(&mut plugin, &meta, &data).unwrap();
            let twin = native_round_trip(native.as_ref(), &meta, &data).unwrap();
            assert_eq!(wasm, twin, "{selection}, step {step}");
            wasm.0[0].len()
        })
        .collect()
}

#[test]
fn the_plugin_follows_the_ramp_as_its_native_build_does() {
    // k = n − ⌊s·n⌋ of the bucket's 32,896 floats, 8 bytes per entry plus the count.
    let k = [8224, 8224, 2056, 2056, 514, 514, 129, 129, 33, 33, 33, 33];
    assert_eq!(ramp("bucket"), k.map(|k| 4 + 8 * k));
    // Per tensor: the weight's 32,768 and the bias's 128 floats each keep their share.
    let k = [8224, 8224, 2056, 2056, 514, 514, 129, 129, 34, 34, 34, 34];
    assert_eq!(ramp("tensor"), k.map(|k| 4 + 8 * k));
}

#[test]
fn dgc_at_99_9_percent_on_two_ranks_stays_bit_identical_and_within_a_point_of_uncompressed() {
    let out = scratch("dgc-acc");
    let stage = STAGE.to_string();
    let o = accuracy_job(
        &out,
        &[
            "--codec",
            "codec-dgc",
            "--set",
            "codec.sparsity=0.999",
            "--set",
            &format!("codec.warmup_steps={stage}"),
            "--error-feedback",
            "momentum",
            "--local-clip-norm",
            "5",
        ],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("error feedback with momentum correction (DGC)"),
        "{err}"
    );
    assert!(
        err.contains("bit-identical on all 2 ranks at step 94"),
        "{err}"
    );
    // Payload bytes per step: constant within a stage, smaller at each new one (about 4×
    // between the first two), then 99.9% to the end.
    let st = steps(&out);
    assert_eq!(st.len(), 94);
    let at = |stage: u64| st[(stage * STAGE) as usize].payload_bytes;
    for s in &st {
        let stage = (s.step / STAGE).min(4);
        assert_eq!(s.payload_bytes, at(stage), "step {}", s.step);
    }
    for stage in 0..4 {
        assert!(at(stage) > at(stage + 1), "stage {stage}: {:?}", at(stage));
    }
    let first = at(0) as f64 / at(1) as f64;
    assert!((3.5..=4.0).contains(&first), "{first}");
    let last = st.last().unwrap();
    assert!(last.compression_ratio > 400.0, "{last:?}");
    let (a, b) = (uncompressed_accuracy(), accuracy(&o));
    eprintln!(
        "uncompressed {a:.2}%, dgc 99.9% + momentum correction {b:.2}% ({} payload bytes per step at 99.9%, {:.0}x)",
        last.payload_bytes, last.compression_ratio
    );
    // At most one point below (above is allowed: a short run's noise is larger than that).
    assert!(b >= a - 1.0, "uncompressed {a}%, dgc {b}%");
}

/// The flags of a single-process DGC run with momentum correction and local clipping.
const MOMENTUM: [&str; 8] = [
    "--codec",
    "codec-dgc",
    "--set",
    "codec.warmup_steps=2",
    "--error-feedback",
    "momentum",
    "--local-clip-norm",
    "2",
];

#[test]
fn momentum_error_feedback_resumes_bit_for_bit_and_refuses_another_mode() {
    let (straight, split) = (scratch("dgc-straight"), scratch("dgc-split"));
    let a = run(&straight, &MOMENTUM);
    assert!(a.status.success(), "{}", stderr(&a));
    let o = run(
        &split,
        &[&MOMENTUM[..], &["--stop-after-steps", "3"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let resume = ["--resume", split.to_str().unwrap()];
    let b = run(&split, &[&MOMENTUM[..], &resume].concat());
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(losses(&straight), losses(&split));
    assert_eq!(weights(&a), weights(&b));
    // Momentum correction is not residual error feedback under another name: the same codec
    // with `residual` ends elsewhere.
    let residual = scratch("dgc-residual");
    let mut flags = MOMENTUM.to_vec();
    flags[5] = "residual";
    let c = run(&residual, &flags);
    assert!(c.status.success(), "{}", stderr(&c));
    assert_ne!(weights(&a), weights(&c));
    // A resume in another mode, or with another clip norm, is refused by name.
    let o = run(&split, &[&flags[..], &resume].concat());
    let err = stderr(&o);
    assert!(
        err.contains("--error-feedback: checkpoint has \"momentum\", this run has \"residual\""),
        "{err}"
    );
    let mut clip = MOMENTUM.to_vec();
    clip[7] = "3";
    let o = run(&split, &[&clip[..], &resume].concat());
    assert!(
        stderr(&o).contains("--local-clip-norm: checkpoint has 2.0, this run has 3.0"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn through_the_identity_codec_momentum_correction_is_sgd_without_momentum() {
    // The identity codec sends every entry: each step empties the accumulation and masks the
    // whole velocity, so what arrives is g + λw and the update w − η·(g + λw), which is what
    // SGD without momentum computes, bit for bit. Decay applied twice or not at all, or a
    // momentum left in the optimizer, would end elsewhere.
    let (sgd, dgc) = (scratch("dgc-sgd-no-momentum"), scratch("dgc-identity"));
    let a = run(&sgd, &["--momentum", "0"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = run(
        &dgc,
        &["--codec", "codec-identity", "--error-feedback", "momentum"],
    );
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(losses(&sgd), losses(&dgc));
    assert_eq!(weights(&a), weights(&b));
    // With momentum in the optimizer instead (0.9, the default) the run differs.
    let c = run(&scratch("dgc-sgd-momentum"), &[]);
    assert_ne!(weights(&a), weights(&c));
}

#[test]
fn momentum_correction_refuses_what_it_cannot_combine_with() {
    let momentum = ["--codec", "codec-dgc", "--error-feedback", "momentum"];
    for (extra, says) in [
        (&["--optimizer", "adamw"][..], "--optimizer adamw"),
        (&["--nesterov"][..], "--nesterov"),
        (&["--sgd-form", "goyal"][..], "--sgd-form goyal"),
        (&["--layer-rate", "lars"][..], "--layer-rate"),
    ] {
        let o = run(&scratch("dgc-refused"), &[&momentum[..], extra].concat());
        assert!(!o.status.success());
        let want = format!("--error-feedback momentum cannot be combined with {says}");
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    }
    let o = run(&scratch("dgc-no-codec"), &["--error-feedback", "momentum"]);
    assert!(stderr(&o).contains("it needs --codec"), "{}", stderr(&o));
    let o = run(&scratch("dgc-clip-zero"), &["--local-clip-norm", "0"]);
    assert!(
        stderr(&o).contains("--local-clip-norm 0 must be finite and above 0"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &scratch("dgc-clip-async"),
        &["--mode", "async", "--local-clip-norm", "1"],
    );
    assert!(
        stderr(&o).contains("which --mode async does not run"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_config_file_says_error_feedback_as_a_switch_or_a_mode() {
    let dir = scratch("dgc-toml");
    for (value, announced) in [
        ("true", "2 bucket(s), error feedback)"),
        (
            "\"momentum\"",
            "error feedback with momentum correction (DGC))",
        ),
        ("false", "2 bucket(s))"),
    ] {
        let file = dir.join("run.toml");
        let toml = format!(
            "error_feedback = {value}\ncodec = \"codec-dgc\"\nepochs = 1\ntrain_subset = 256\n\
             test_subset = 64\nglobal_batch = 128\nthreads = 1\ndevice = \"cpu\"\n"
        );
        std::fs::write(&file, toml).unwrap();
        let out = dir.join("out");
        let o = lsgd(&[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--stop-after-steps",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--overwrite",
        ]);
        assert!(o.status.success(), "{value}: {}", stderr(&o));
        assert!(stderr(&o).contains(announced), "{value}: {}", stderr(&o));
    }
}
