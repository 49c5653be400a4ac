//! `--overlap` (the exchange behind the backward pass) against `--no-overlap` (after it): on 1,
//! 2 and 3 ranks, with a codec and error feedback, PowerSGD, DGC's momentum correction over
//! small buckets, bf16 and micro-batches, both end with the same weights, bit for bit; the
//! overlapped step's metrics split its communication into exposed and hidden. The scripted
//! models' cases are in torchscript.rs.

use std::path::Path;

use crate::common::*;

/// `-np n` runs of the small cnn job (60 samples a step, 10 steps) with `extra`, overlapped
/// and not: their weights hashes, and the overlapped run's directory.
fn both(name: &str, n: usize, extra: &[&str]) -> (String, String, std::path::PathBuf) {
    let run = |flag: &str| {
        let out = scratch(&format!("overlap-{name}{flag}"));
        let mut app = run_app(n);
        app.extend(
            cnn_job(&out, &["--train-subset", "600"])
                .into_iter()
                .skip(1),
        );
        app.push(flag.to_string());
        app.extend(extra.iter().map(|s| s.to_string()));
        let o = mpirun(&[app]);
        assert!(o.status.success(), "{name} {flag}: {}", stderr(&o));
        (weights(&o), out)
    };
    let (overlapped, out) = run("--overlap");
    let (sequential, _) = run("--no-overlap");
    (overlapped, sequential, out)
}

/// Every step's communication is split into what the step waited for and what ran behind the
/// backward pass; with several buckets some of it ran behind.
fn split_communication(out: &Path) -> f64 {
    let steps = steps(out);
    assert_eq!(steps.len(), 10);
    for s in &steps {
        let parts = s.exposed_communication_s + s.hidden_communication_s;
        assert!(
            (parts - s.communication_s).abs() <= 1e-9 + 1e-6 * s.communication_s
                || s.exposed_communication_s > s.communication_s,
            "{s:?}"
        );
    }
    steps.iter().map(|s| s.hidden_communication_s).sum()
}

#[test]
fn overlapped_and_sequential_steps_end_with_the_same_weights() {
    if no_mpirun() {
        return;
    }
    let cases: [(&str, usize, &[&str]); 5] = [
        ("plain", 2, &["--bucket-mb", "0.05"]),
        (
            "top-k-ef",
            1,
            &["--codec", "codec-top-k", "--error-feedback"],
        ),
        (
            "powersgd-ef",
            3,
            &["--codec", "codec-powersgd", "--error-feedback"],
        ),
        (
            "dgc-momentum",
            3,
            &[
                "--codec",
                "codec-dgc",
                "--error-feedback",
                "momentum",
                "--bucket-mb",
                "0.2",
            ],
        ),
        (
            "bf16-micro",
            2,
            &["--precision", "bf16", "--max-micro-batch", "10"],
        ),
    ];
    for (name, n, extra) in cases {
        let (overlapped, sequential, out) = both(name, n, extra);
        assert_eq!(overlapped, sequential, "{name} on {n} rank(s)");
        let hidden = split_communication(&out);
        if name == "plain" {
            // 40 buckets of 0.05 MiB: the first ones move while the conv layers' gradients
            // are still being computed.
            assert!(hidden > 0.0, "{name}: nothing ran behind the backward pass");
        }
    }
}

/// What cannot overlap says why: fp16's overflow check and `--local-clip-norm` need the whole
/// gradient before anything moves.
#[test]
fn overlap_is_refused_where_the_whole_gradient_is_needed_first() {
    for (extra, why) in [
        (
            &["--precision", "fp16"][..],
            "--overlap: --precision fp16 checks every rank's gradient for overflow",
        ),
        (
            &["--local-clip-norm", "1"][..],
            "--overlap: --local-clip-norm clips by the norm of this rank's whole gradient",
        ),
    ] {
        let out = scratch("overlap-refused");
        let mut args = tiny_at(64, 1, &out, extra);
        args.push("--overlap".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = lsgd(&args);
        assert!(!o.status.success());
        assert!(stderr(&o).contains(why), "{}", stderr(&o));
        // Without the flag the step runs the exchange after the backward pass.
        let args: Vec<&str> = args[..args.len() - 1].to_vec();
        let o = lsgd(&[&args[..], &["--stop-after-steps", "1", "--overwrite"]].concat());
        assert!(o.status.success(), "{}", stderr(&o));
    }
}
