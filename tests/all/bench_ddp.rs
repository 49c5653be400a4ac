//! `lsgd-host bench ddp`: a short run of both sides (mpirun lsgd-host run, torchrun DDP) on the
//! real data reports throughput and communication for each, their ratio, and the world the
//! Python side actually ran in. Nothing is asserted about which side is faster.

use crate::common::{lsgd, no_mpirun, stderr, stdout};

#[test]
fn bench_ddp_reports_both_sides_and_their_communication() {
    if no_mpirun() {
        return;
    }
    let o = lsgd(&[
        "bench",
        "ddp",
        "--model",
        "mlp",
        "--np",
        "2",
        "--threads",
        "1",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--rounds",
        "1",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let num = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("no number `{k}` in {r}"))
    };
    for key in [
        "lsgd_samples_per_s",
        "pytorch_samples_per_s",
        "lsgd_communication_ms",
        "pytorch_communication_ms",
        "lsgd_step_ms",
        "pytorch_step_ms",
        "lsgd_sequential_samples_per_s",
    ] {
        let v = num(key);
        assert!(v.is_finite() && v > 0.0, "{key} = {v} in {r}");
    }
    let ratio = num("lsgd_samples_per_s") / num("pytorch_samples_per_s");
    assert!((num("ratio") - ratio).abs() <= 1e-12 * ratio, "{r}");
    assert_eq!(num("pytorch_world_size"), 2.0, "{r}");
    assert_eq!(num("pytorch_threads"), 1.0, "{r}");
    assert_eq!(r["pytorch_backend"], "gloo", "{r}");
    assert_eq!(r["allreduce"], "mpi", "{r}");
    assert_eq!(r["rounds"].as_array().map(Vec::len), Some(1), "{r}");
    let overlap = num("lsgd_samples_per_s") / num("lsgd_sequential_samples_per_s");
    assert!(
        (num("overlap_ratio") - overlap).abs() <= 1e-12 * overlap,
        "{r}"
    );
}
