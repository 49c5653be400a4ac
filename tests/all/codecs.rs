//! Gradient-compression codecs end to end: every reference codec plugin against its native
//! build and a pinned payload hash, the round-trip error bounds through the sandbox, `compare`
//! on codecs, training with a codec and error feedback (resume included), codec faults, and
//! codecs across two MPI ranks.

use lsgd_host::codec::{native_round_trip, round_trip, sample_bucket};

use crate::common::*;

/// blake3 of every round's payload (concatenated) for buckets 0 and 1 of
/// `sample_bucket(64, 48, step, 7)`, per codec with default parameters. A change here changes
/// what a codec sends: bump the plugin's version and say so (powersgd 2.0.0: its Q₀ is
/// orthonormalised before use, as PyTorch's is, which changes the P it sends).
const GOLDEN: [(&str, &str); 14] = [
    (
        "identity",
        "1fa3e6f666bce7bc4a476dce8b3ef93653a2123c33d9e86e27e256d56dd8b14a",
    ),
    (
        "fp16",
        "75e6c942222325b00516e9906c8ae8cb611d802ee2b86ff21d5a6d70c4cc81f3",
    ),
    (
        "bf16",
        "66038bf916901ba91df633ecb45efa1c7cfcaa5d890801253e1bfbb67b73e2e2",
    ),
    (
        "int8",
        "3fcf4ec612b05bb66b2ad6b949cfbd559cee9a00df2a50b935b2143065c734bc",
    ),
    (
        "qsgd",
        "ed5d0f5a5e9fa0809d3145fba39156ab4d66b3969c9f79e096aa22bd368b7825",
    ),
    (
        "terngrad",
        "b14f68e413908b484a979259b038861f98f8219d95e740a05f1be0a7abf433ce",
    ),
    (
        "top-k",
        "af502693b43f056d92dd0c963f58d1f10a6c70b046d4701f1cc79d4e15f4860b",
    ),
    (
        "dgc",
        "f6d971bdff21fc4f168e3749f39e66937917c1221ec6c1dd21e9d8c1abf7a010",
    ),
    (
        "random-k",
        "f25c2cc314c517d7545a5d680f4eedbd84fb4938cd97ed0c034c20955c8d8fe9",
    ),
    (
        "threshold",
        "30f5ff0a09d8ac7ac4bebae5f88ad2d4ea8b36fe61312fe5153c50a3b46129f8",
    ),
    (
        "sign",
        "6793be9427e21d68419c2c8973ce80bd90674d1784e5dd0c593d8f2a37ee9716",
    ),
    (
        "ef-sign",
        "37703ffc36b007815c533b3e40d49d10e3b90c5dc8e14cbf3411d1537155b66f",
    ),
    (
        "natural",
        "db80e89a2eb2ac38bce42ea16e42f00f421372660eb2c944ff982c06e402623a",
    ),
    (
        "powersgd",
        "75828c1f136249fdeaff87f63d82b2717cf1863d71c074e30740f9146bf3285e",
    ),
];

#[test]
fn every_codec_plugin_sends_what_its_native_build_sends_and_the_golden_bytes() {
    let rt = runtime();
    let mut wrong = Vec::new();
    for (name, golden) in GOLDEN {
        let mut plugin = load(&rt, &format!("codec-{name}"), &[]).unwrap();
        assert_eq!(plugin.info().name, name);
        let native = lsgd_codec::native(name, Vec::new()).unwrap().unwrap();
        let mut h = blake3::Hasher::new();
        for step in 0..2 {
            let (meta, data) = sample_bucket(64, 48, step, 7);
            let (payloads, out) = round_trip(&mut plugin, &meta, &data).unwrap();
            let (native_payloads, native_out) =
                native_round_trip(native.as_ref(), &meta, &data).unwrap();
            assert_eq!(
                payloads, native_payloads,
                "{name}: payload differs from native"
            );
            assert_eq!(
                out, native_out,
                "{name}: reconstruction differs from native"
            );
            for p in &payloads {
                h.update(p);
            }
        }
        let got = h.finalize().to_hex().to_string();
        if got != golden {
            wrong.push(format!("(\"{name}\", \"{got}\"),"));
        }
    }
    assert!(
        wrong.is_empty(),
        "golden payload hashes differ:\n{}",
        wrong.join("\n")
    );
}

/// decode(encode(x)) of a plugin on a sample bucket.
fn through(name: &str, settings: &[(&str, &str)]) -> (Vec<f32>, Vec<f32>, usize) {
    let mut plugin = load(&runtime(), &format!("codec-{name}"), settings).unwrap();
    let (meta, data) = sample_bucket(128, 64, 3, 11);
    let (payloads, out) = round_trip(&mut plugin, &meta, &data).unwrap();
    (data, out, payloads.iter().map(Vec::len).sum())
}

#[test]
fn round_trips_through_the_sandbox_stay_within_each_codecs_bound() {
    let (x, y, bytes) = through("identity", &[]);
    assert_eq!(x, y);
    assert_eq!(bytes, 4 * x.len());

    for (name, rel) in [("fp16", 2f32.powi(-11)), ("bf16", 2f32.powi(-8))] {
        let (x, y, bytes) = through(name, &[]);
        assert_eq!(bytes, 2 * x.len(), "{name}");
        for (a, b) in x.iter().zip(&y) {
            // Half an ulp, relative, plus half the smallest subnormal step of fp16.
            assert!(
                (a - b).abs() <= rel * a.abs() + 2f32.powi(-25),
                "{name}: {a} -> {b}"
            );
        }
    }

    let (x, y, _) = through("int8", &[]);
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(
        x.iter()
            .zip(&y)
            .all(|(a, b)| (a - b).abs() <= max / 254.0 * 1.0001)
    );

    // top-k keeps exactly the k largest magnitudes, unchanged, and zeroes the rest.
    let (x, y, bytes) = through("top-k", &[("density", "0.05")]);
    let k = (0.05 * x.len() as f64).ceil() as usize;
    let kept: Vec<usize> = (0..x.len()).filter(|&i| y[i] != 0.0).collect();
    assert_eq!(kept.len(), k);
    assert!(kept.iter().all(|&i| y[i] == x[i]));
    let smallest_kept = kept.iter().map(|&i| x[i].abs()).fold(f32::MAX, f32::min);
    let largest_dropped = (0..x.len())
        .filter(|i| y[*i] == 0.0)
        .map(|i| x[i].abs())
        .fold(0f32, f32::max);
    assert!(smallest_kept >= largest_dropped);
    assert_eq!(bytes, 4 + 8 * k);

    let (x, y, _) = through("threshold", &[("threshold", "0.004")]);
    assert!(
        x.iter()
            .zip(&y)
            .all(|(a, b)| if a.abs() >= 0.004 { a == b } else { *b == 0.0 })
    );

    let (x, y, bytes) = through("random-k", &[("density", "0.1")]);
    let k = (0.1 * x.len() as f64).ceil() as usize;
    assert_eq!(bytes, 4 * k, "shared-seed random-k sends values only");
    assert!(x.iter().zip(&y).all(|(a, b)| *b == 0.0 || a == b));

    let (_, y, _) = through("sign", &[("scale", "0.5")]);
    assert!(y.iter().all(|v| v.abs() == 0.5));

    // PowerSGD: the bias (last 64 floats) travels uncompressed; the weight is approximated.
    let (x, y, _) = through("powersgd", &[("rank", "4")]);
    assert_eq!(x[128 * 64..], y[128 * 64..]);
    let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = x.iter().map(|a| a * a).sum();
    assert!(
        err < norm,
        "rank-4 approximation error {err} vs norm {norm}"
    );
}

#[test]
fn compare_tells_codecs_apart_and_refuses_mixed_kinds() {
    let same = lsgd(&["compare", "codec-fp16", "codec-fp16", "--buckets", "3"]);
    assert!(same.status.success(), "{}", stderr(&same));
    let out = stdout(&same);
    assert!(out.contains("result: SAME (bit-identical)"), "{out}");
    assert!(out.contains("payloads: identical bytes"), "{out}");
    assert!(out.contains("compression 2.00x"), "{out}");

    let differ = lsgd(&["compare", "codec-fp16", "codec-bf16"]);
    assert_eq!(differ.status.code(), Some(1), "{}", stderr(&differ));
    assert!(
        stdout(&differ).contains("result: DIFFERENT"),
        "{}",
        stdout(&differ)
    );
    // bf16 keeps 8 significant bits: within 1% of fp16's reconstruction, except where fp16
    // itself is subnormal (below 6.1e-5), hence the absolute slack.
    let close = lsgd(&[
        "compare",
        "codec-fp16",
        "codec-bf16",
        "--rtol",
        "0.01",
        "--atol",
        "1e-6",
    ]);
    assert!(close.status.success(), "{}", stdout(&close));

    let json = lsgd(&[
        "compare",
        "codec-top-k",
        "codec-top-k",
        "--set",
        "b.density=0.1",
        "--format",
        "json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["payloads_identical"], false);
    assert!(
        report["a"]["rel_l2_error"].as_f64().unwrap()
            > report["b"]["rel_l2_error"].as_f64().unwrap()
    );

    let mixed = lsgd(&["compare", "codec-fp16", "warmup"]);
    assert!(!mixed.status.success());
    assert!(
        stderr(&mixed).contains("cannot compare a codec plugin"),
        "{}",
        stderr(&mixed)
    );
}

/// A small single-process CPU run with `extra` flags.
pub(crate) fn run(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "run",
        "--model",
        "cnn",
        "--train-subset",
        "1024",
        "--test-subset",
        "200",
        "--epochs",
        "1",
        "--global-batch",
        "128",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "5",
        "-q",
        "--out",
    ];
    let out = out.to_str().unwrap();
    args.push(out);
    args.extend_from_slice(extra);
    lsgd(&args)
}

/// Every step's loss, as bits.
pub(crate) fn losses(out: &std::path::Path) -> Vec<u64> {
    steps(out).iter().map(|s| s.loss.to_bits()).collect()
}

#[test]
fn the_identity_codec_trains_bit_for_bit_like_no_codec() {
    let (plain, id) = (scratch("codec-plain"), scratch("codec-identity"));
    assert!(run(&plain, &[]).status.success());
    let o = run(&id, &["--codec", "codec-identity", "--error-feedback"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(losses(&plain), losses(&id));
    let st = steps(&id);
    assert!(
        st.iter()
            .all(|s| s.compression_ratio == 1.0 && s.payload_bytes == 4 * 421_738)
    );
}

#[test]
fn error_feedback_residuals_survive_a_checkpoint_and_resume() {
    let (straight, split) = (scratch("codec-ef-straight"), scratch("codec-ef-split"));
    let codec = [
        "--codec",
        "codec-top-k",
        "--set",
        "codec.density=0.01",
        "--error-feedback",
    ];
    let o = run(&straight, &codec);
    assert!(o.status.success(), "{}", stderr(&o));
    let st = steps(&straight);
    assert!(st.iter().all(|s| s.compression_ratio > 40.0), "{:?}", st[0]);
    let o = run(&split, &[&codec[..], &["--stop-after-steps", "3"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(split.join("checkpoint.json")).unwrap()).unwrap();
    assert!(meta["plugins"].to_string().contains("top-k"), "{meta}");
    let resumed = [&codec[..], &["--resume", split.to_str().unwrap()]].concat();
    let o = run(&split, &resumed);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(losses(&straight), losses(&split));
    // Without the flag the resume is refused: the residuals would be dropped silently.
    let o = run(
        &split,
        &[&codec[..4], &["--resume", split.to_str().unwrap()]].concat(),
    );
    assert!(stderr(&o).contains("--error-feedback"), "{}", stderr(&o));
}

#[test]
fn a_codec_fault_names_the_codec_and_step_and_saves_a_checkpoint_first() {
    for (mode, says) in [
        (
            "refuse",
            "decode at step 2: returned an error: malformed payload",
        ),
        (
            "short",
            // Bucket 0 is the layout's first, at most 1 MiB (DDP's first bucket).
            "decode at step 2: returned an invalid value: 261705 floats for bucket 0 of 261706",
        ),
        ("trap", "encode at step 2: trapped"),
    ] {
        let out = scratch(&format!("codec-fault-{mode}"));
        let o = run(
            &out,
            &[
                "--codec",
                "bad-codec",
                "--set",
                &format!("codec.mode={mode}"),
                "--set",
                "codec.from_step=2",
            ],
        );
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("bad-codec.wasm") && err.contains(says),
            "{mode}: {err}"
        );
        assert!(err.contains("state before step 2 saved to"), "{err}");
        assert_eq!(steps(&out).len(), 2);
    }
    let o = run(
        &scratch("codec-rounds"),
        &["--codec", "bad-codec", "--set", "codec.mode=rounds"],
    );
    assert!(
        stderr(&o).contains("only summable codecs can run several rounds"),
        "{}",
        stderr(&o)
    );
    let o = run(&scratch("codec-ef-alone"), &["--error-feedback"]);
    assert!(stderr(&o).contains("it needs --codec"), "{}", stderr(&o));
}

#[test]
fn codecs_keep_two_ranks_bit_identical_whatever_they_combine_by() {
    for (codec, sets) in [
        ("codec-fp16", vec![]),
        ("codec-random-k", vec!["codec.density=0.1"]),
        ("codec-powersgd", vec!["codec.rank=2"]),
        ("codec-top-k", vec!["codec.density=0.01"]),
    ] {
        let out = scratch(&format!("codec-mpi-{codec}"));
        let mut extra = vec![
            "--codec",
            codec,
            "--error-feedback",
            "--stop-after-steps",
            "4",
        ];
        for s in &sets {
            extra.extend(["--set", s]);
        }
        let o = mpirun(&[ranks(2, &out, &extra)]);
        let err = stderr(&o);
        assert!(o.status.success(), "{codec}: {}\n{err}", stdout(&o));
        assert!(
            err.contains("bit-identical on all 2 ranks at step 4"),
            "{codec}: {err}"
        );
        let st = steps(&out);
        assert!(
            st.iter()
                .all(|s| s.compression_ratio > 1.5 && s.bytes_sent > 0),
            "{codec}: {:?}",
            st[0]
        );
    }
}

#[test]
fn a_summable_payload_of_different_lengths_on_two_ranks_stops_both() {
    let out = scratch("codec-mpi-uneven");
    let o = mpirun(&[ranks(
        2,
        &out,
        &[
            "--codec",
            "bad-codec",
            "--set",
            "codec.mode=uneven",
            "--set",
            "codec.from_step=1",
            // Only rank 1 lengthens its payload (when its rank seed is odd), so the lengths
            // differ at the first odd seed; with both ranks odd in the same bucket the lengths
            // would agree and the decode refuse the extra bytes instead.
            "--set",
            "codec.on_rank=1",
        ],
    )]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("must have the same length on every rank"),
        "{err}"
    );
    // Rank 1's rank seed is odd in some bucket from step 1 on.
    assert!(err.contains("saved to"), "{err}");
}

/// The accuracy a `run` printed ("test accuracy 83.00% ..."), in percent.
pub(crate) fn accuracy(o: &std::process::Output) -> f64 {
    let out = stdout(o);
    let at = out.find("test accuracy ").expect("a finished run") + "test accuracy ".len();
    out[at..].split('%').next().unwrap().parse().unwrap()
}

/// The codec issue's accuracy job on two ranks: the cnn for two epochs of 12,000 samples at
/// batch 256 (94 steps), warmup over half an epoch, with `extra` flags.
pub(crate) fn accuracy_job(out: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut v: Vec<String> = ["-np", "2", env!("CARGO_BIN_EXE_lsgd-host"), "run"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for a in [
        "--model",
        "cnn",
        "--train-subset",
        "12000",
        "--test-subset",
        "2000",
        "--epochs",
        "2",
        "--global-batch",
        "256",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "1",
        "--schedule",
        "warmup",
        "--set",
        "schedule.warmup_epochs=0.5",
        "--set",
        "schedule.milestones=10",
        "--out",
    ] {
        v.push(a.to_string());
    }
    v.push(out.display().to_string());
    mpirun(&[overridden(v, extra)])
}

/// The accuracy of [`accuracy_job`] uncompressed, run once for every test that compares
/// with it.
pub(crate) fn uncompressed_accuracy() -> f64 {
    static ACCURACY: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *ACCURACY.get_or_init(|| {
        let plain = accuracy_job(&scratch("codec-acc-plain"), &["-q"]);
        assert!(plain.status.success(), "{}", stderr(&plain));
        accuracy(&plain)
    })
}

#[test]
fn top_k_one_percent_with_error_feedback_on_two_ranks_lands_within_three_points() {
    let out = scratch("codec-acc-top-k");
    let topk = accuracy_job(
        &out,
        &[
            "-q",
            "--codec",
            "codec-top-k",
            "--set",
            "codec.density=0.01",
            "--error-feedback",
        ],
    );
    assert!(topk.status.success(), "{}", stderr(&topk));
    let (a, b) = (uncompressed_accuracy(), accuracy(&topk));
    let ratio = steps(&out).iter().map(|s| s.compression_ratio).sum::<f64>() / 94.0;
    eprintln!("uncompressed {a:.2}%, top-k 1% + error feedback {b:.2}% (compression {ratio:.1}x)");
    // One seed of this 94-step job moves by points between seeds and CPUs (the compression
    // study's uncompressed seeds: 76.80 / 82.58 %): top-k landed within 2 points of it on the
    // earlier build machines and 2.2 below on an AMD EPYC, with the code before issue 26 too
    // (83.10 / 80.90 %). Without error feedback top-k 1 % lands ~7 points below, which this
    // bound still catches.
    assert!((a - b).abs() <= 3.0, "uncompressed {a}%, top-k {b}%");
    assert!(ratio > 40.0, "{ratio}");
}

/// The saved tensors of a run directory's newest checkpoint whose names start with `prefix`.
fn saved(out: &std::path::Path, prefix: &str) -> Vec<(String, Vec<f32>)> {
    let (_, tensors) = lsgd_host::train::checkpoint::load(&out.join("checkpoint.json")).unwrap();
    let mut v: Vec<(String, Vec<f32>)> = tensors
        .into_iter()
        .filter(|(n, _)| n.starts_with(prefix))
        .map(|(n, t)| (n, Vec::<f32>::try_from(t.flatten(0, -1)).unwrap()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A checkpoint of 2 ranks with error feedback resumes on 1: the lone rank's residual is the
/// sum of the two, which is all the update ever sees of them.
#[test]
fn error_feedback_residuals_are_summed_when_a_resume_has_fewer_ranks() {
    if no_mpirun() {
        return;
    }
    let out = scratch("codec-ef-fewer-ranks");
    let codec = [
        "--codec",
        "codec-top-k",
        "--set",
        "codec.density=0.01",
        "--error-feedback",
    ];
    let o = mpirun(&[ranks(
        2,
        &out,
        &[&codec[..], &["--stop-after-steps", "3"]].concat(),
    )]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let two = saved(&out, "ef.");
    assert!(two.iter().any(|(n, _)| n.contains("rank1")), "{two:?}");
    // One process, resumed and stopped at the same step: the checkpoint it writes holds the
    // folded state, before any step could change it.
    let mut one = ranks(
        1,
        &out,
        &[&codec[..], &["--stop-after-steps", "3"]].concat(),
    );
    one.extend(["--resume".to_string(), out.display().to_string()]);
    let o = mpirun(&[one]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let folded = saved(&out, "ef.");
    assert!(
        folded.iter().all(|(n, _)| n.contains("rank0")),
        "{folded:?}"
    );
    for (name, sum) in &folded {
        let parts: Vec<&Vec<f32>> = two
            .iter()
            .filter(|(n, _)| n.replace("rank1", "rank0") == *name)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(parts.len(), 2, "{name}");
        let expected: Vec<f32> = parts[0].iter().zip(parts[1]).map(|(a, b)| a + b).collect();
        assert_eq!(sum, &expected, "{name}");
        assert!(
            sum.iter().any(|x| *x != 0.0),
            "{name}: an empty residual proves nothing"
        );
    }
}
