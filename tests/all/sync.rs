//! Sync policies in training (`--sync`, contract 0.5): local steps exchange nothing, a window's
//! end averages the pseudo-gradients and takes the plugin's outer step, every rank ends a
//! window with the same weights, a run stopped inside a window resumes bit for bit, and what a
//! sync policy cannot run beside is refused. On the small cnn job of `common::ranks` (10 steps
//! of 64 on 2 ranks, BatchNorm's statistics each rank's own).

use std::path::Path;
use std::process::Output;

use crate::common::{mpirun, ranks, scratch, stderr, stdout, steps, weights};

/// `mpirun -np n lsgd-host run` of the small cnn job into `out`, plus `extra`.
fn run(n: usize, out: &Path, extra: &[&str]) -> Output {
    mpirun(&[ranks(n, out, extra)])
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}\n{}", stdout(o), stderr(o));
}

/// Each step's `sync` field and bytes sent, from the run's metrics.
fn plans(out: &Path) -> Vec<(String, u64)> {
    steps(out)
        .into_iter()
        .map(|s| (s.sync.unwrap_or_default(), s.bytes_sent))
        .collect()
}

#[test]
fn local_steps_send_nothing_and_each_window_ends_with_the_same_weights_on_every_rank() {
    let out = scratch("sync-local-sgd");
    let o = run(
        2,
        &out,
        &["--sync", "local-sgd", "--set", "sync.period=3", "--csv"],
    );
    assert_ok(&o);
    let plans = plans(&out);
    let kinds: Vec<&str> = plans.iter().map(|(k, _)| k.as_str()).collect();
    // 10 steps: averages after steps 2, 5 and 8, and at the last step (the host's rule).
    assert_eq!(
        kinds,
        [
            "local", "local", "average", "local", "local", "average", "local", "local", "average",
            "average"
        ]
    );
    for (i, (kind, bytes)) in plans.iter().enumerate() {
        match kind.as_str() {
            "local" => assert_eq!(*bytes, 0, "step {i} is local but sent {bytes} bytes"),
            _ => assert!(*bytes > 0, "step {i} averaged but sent nothing"),
        }
    }
    for s in steps(&out) {
        assert!(
            s.loss.is_finite() && s.loss > 0.0,
            "step {}: loss {}",
            s.step,
            s.loss
        );
    }
    // The consistency check (every 2 steps where the ranks agree, and at the end) passed.
    assert!(
        stderr(&o).contains("bit-identical on all 2 ranks at step 10"),
        "{}",
        stderr(&o)
    );
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    assert!(csv.lines().next().unwrap().ends_with(",sync"), "{csv}");
    assert!(csv.lines().nth(1).unwrap().ends_with(",local"), "{csv}");
}

#[test]
fn averaging_after_every_step_without_momentum_follows_synchronous_sgd() {
    // With SGD without momentum or decay, averaging the weights after each local step is the
    // synchronous step up to the rounding of the mean: θ − η·(g₁+g₂)/2.
    let plain = ["--momentum", "0", "--weight-decay", "0"];
    let sync_out = scratch("sync-period-1");
    let mut extra = plain.to_vec();
    extra.extend(["--sync", "local-sgd", "--set", "sync.period=1"]);
    assert_ok(&run(2, &sync_out, &extra));
    let dp_out = scratch("sync-period-1-dp");
    assert_ok(&run(2, &dp_out, &plain));
    let (a, b) = (steps(&sync_out), steps(&dp_out));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.sync.as_deref(), Some("average"));
        let rel = (x.loss - y.loss).abs() / y.loss;
        assert!(
            rel < 1e-5,
            "step {}: {} against {} (rel {rel:e})",
            x.step,
            x.loss,
            y.loss
        );
    }
}

/// A run of `sync` stopped after `stop` steps and resumed ends with the uninterrupted run's
/// weights, losses and plans; the stopped run's checkpoint (returned) is `local_steps` into a
/// window, when given.
fn resumes_bit_for_bit(
    name: &str,
    sync: &[&str],
    stop: &str,
    local_steps: Option<u64>,
) -> serde_json::Value {
    let whole = scratch(&format!("{name}-whole"));
    let o = run(2, &whole, sync);
    assert_ok(&o);
    let parted = scratch(&format!("{name}-parted"));
    let mut first = sync.to_vec();
    first.extend(["--stop-after-steps", stop]);
    assert_ok(&run(2, &parted, &first));
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(parted.join("checkpoint.json")).unwrap()).unwrap();
    if let Some(local_steps) = local_steps {
        assert_eq!(saved["window"]["local_steps"], local_steps, "{saved}");
        assert_eq!(saved["window"]["ranks"], 2, "{saved}");
    }
    let mut second = sync.to_vec();
    let dir = parted.display().to_string();
    second.extend(["--resume", &dir]);
    let resumed = run(2, &parted, &second);
    assert_ok(&resumed);
    assert_eq!(weights(&resumed), weights(&o));
    let (a, b) = (steps(&whole), steps(&parted));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.step, &x.sync), (y.step, &y.sync));
        // The records before the checkpoint are read back and written again on resume, which
        // may move a loss by its last bit: the weights above are the bit-for-bit check.
        let rel = (x.loss - y.loss).abs() / x.loss.abs();
        assert!(
            rel <= 1e-15,
            "step {}: {} against {}",
            x.step,
            x.loss,
            y.loss
        );
    }
    saved
}

#[test]
fn a_run_stopped_inside_a_window_resumes_bit_for_bit() {
    resumes_bit_for_bit(
        "sync-diloco",
        &["--sync", "diloco", "--set", "sync.period=4"],
        "6",
        Some(2),
    );
}

#[test]
fn a_stateful_sync_plugin_resumes_bit_for_bit_from_its_snapshot() {
    let sync = [
        "--sync",
        "adaptive-period",
        "--set",
        "sync.period=2",
        "--set",
        "sync.max_period=4",
    ];
    // Its snapshot (the period it has reached) goes into the checkpoint with the window.
    // Where its window stands after 5 steps depends on how its period adapted.
    let saved = resumes_bit_for_bit("sync-adaptive", &sync, "5", None);
    let snapshot = saved["policy_state"]["sync"].as_str().unwrap_or_default();
    assert!(
        !snapshot.is_empty(),
        "no snapshot of the sync plugin in {saved}"
    );
}

#[test]
fn resuming_inside_a_window_on_another_number_of_ranks_is_refused() {
    let sync = ["--sync", "local-sgd", "--set", "sync.period=4"];
    let out = scratch("sync-refuse-resize");
    let mut first = sync.to_vec();
    first.extend(["--stop-after-steps", "2"]);
    assert_ok(&run(2, &out, &first));
    let dir = out.display().to_string();
    let mut again = sync.to_vec();
    again.extend(["--resume", &dir]);
    let o = run(1, &out, &again);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("2 local step(s) into a sync window on 2 rank(s)")
            && e.contains("resume it on 2 ranks"),
        "{e}"
    );
}

#[test]
fn a_codec_compresses_the_pseudo_gradients() {
    let out = scratch("sync-codec");
    let o = run(
        2,
        &out,
        &[
            "--sync",
            "diloco",
            "--set",
            "sync.period=5",
            "--codec",
            "codec-top-k",
            "--error-feedback",
            "residual",
        ],
    );
    assert_ok(&o);
    let plain = scratch("sync-codec-plain");
    assert_ok(&run(
        2,
        &plain,
        &["--sync", "diloco", "--set", "sync.period=5"],
    ));
    let sent = |out: &Path| -> u64 { steps(out).iter().map(|s| s.bytes_sent).sum() };
    let (compressed, full) = (sent(&out), sent(&plain));
    assert!(
        compressed * 4 < full,
        "top-k sent {compressed} bytes, the plain average {full}"
    );
    let last = steps(&out).pop().unwrap();
    assert!(last.compression_ratio > 4.0, "{}", last.compression_ratio);
}

#[test]
fn post_local_sgd_exchanges_gradients_during_its_warm_up() {
    let out = scratch("sync-post-local");
    assert_ok(&run(
        2,
        &out,
        &[
            "--sync",
            "post-local-sgd",
            "--set",
            "sync.warmup_steps=3",
            "--set",
            "sync.period=3",
        ],
    ));
    let kinds: Vec<String> = plans(&out).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        kinds,
        [
            "synchronous",
            "synchronous",
            "synchronous",
            "average",
            "local",
            "local",
            "average",
            "local",
            "local",
            "average"
        ]
    );
}

#[test]
fn what_needs_every_ranks_gradient_at_every_step_is_refused_beside_a_sync_policy() {
    for (extra, needle) in [
        (vec!["--precision", "fp16"], "--precision fp16"),
        (vec!["--overlap"], "--overlap"),
        (vec!["--layer-rate", "lars"], "--layer-rate"),
        (vec!["--mode", "async"], "--mode async"),
    ] {
        let out = scratch("sync-refused");
        let mut args = vec!["--sync", "local-sgd"];
        args.extend(&extra);
        let o = run(2, &out, &args);
        assert!(!o.status.success(), "{extra:?} was accepted");
        let e = stderr(&o);
        assert!(
            e.contains(&format!("--sync cannot be combined with {needle}")),
            "{extra:?}: {e}"
        );
    }
}
