//! The sync policies against PyTorch on one job (`scripts/torch-study-job.py --sync`, which
//! replicates lsgd-host's cnn job): `local-sgd` and `post-local-sgd` against PyTorch's
//! `PeriodicModelAverager` (with its `post_localSGD_hook` for the warm-up), `diloco` against the
//! paper's algorithm written with `torch.optim.SGD` as the outer optimizer. Rank 0's parameters
//! after every step (lsgd-host's checkpoint of each step) are compared to fp32 tolerance: the
//! local steps are bit for bit PyTorch's, and so is plain averaging (the ranks' mean formed as
//! `average_parameters` forms it); an outer step with momentum rounds differently (torch's
//! `add_(d, alpha=-lr)` is one fused operation, lsgd-host's SGD two).

use std::path::Path;
use std::process::Command;

use tch::Tensor;

use crate::common::{mpirun, no_mpirun, root, run_app, scratch, stderr, stdout, venv_python};

/// The job: the cnn on 1,280 samples at global batch 128 for one epoch (10 steps), 2 ranks.
const STEPS: usize = 10;

/// `mpirun -np 2 lsgd-host run` of the job with `sync` flags, a checkpoint after every step.
fn host(out: &Path, sync: &[&str]) {
    let mut app = run_app(2);
    let dir = out.display().to_string();
    app.extend(
        [
            "--model",
            "cnn",
            "--schedule",
            "warmup",
            "--set",
            "schedule.warmup_epochs=0.5",
            "--set",
            "schedule.milestones=",
            "--train-subset",
            "1280",
            "--test-subset",
            "100",
            "--epochs",
            "1",
            "--global-batch",
            "128",
            "--base-lr",
            "0.1",
            "--seed",
            "1",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--quiet",
            "--checkpoint-every",
            "1",
            "--keep-checkpoints",
            "100",
            "--out",
            &dir,
        ]
        .iter()
        .chain(sync)
        .map(|s| s.to_string()),
    );
    let o = mpirun(&[app]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
}

/// The same job in PyTorch under torchrun with `sync` flags, rank 0's parameters after each
/// step in `dump`.
fn torch(dump: &Path, sync: &[&str]) {
    let o = Command::new(venv_python())
        .args([
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
        ])
        .arg("--nproc_per_node=2")
        .arg(root().join("scripts/torch-study-job.py"))
        .args([
            "--train-subset",
            "1280",
            "--test-subset",
            "100",
            "--epochs",
            "1",
            "--global-batch",
            "128",
            "--seed",
            "1",
            "--threads",
            "1",
            "--last-average",
            "--dump-weights",
        ])
        .arg(dump)
        .args(sync)
        .env("PYTHONWARNINGS", "ignore::UserWarning")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("the venv's python runs torch (scripts/setup.sh --python-torch)");
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
}

/// torch.allclose's test with rtol 1e-5 and atol 1e-6 (fp32 rounding after a few outer
/// steps, on weights of order 0.1 to 1), over every parameter after every step: the worst
/// element's |ours − theirs| over atol + rtol·|theirs|, and where.
fn worst(host_out: &Path, dump: &Path) -> (f64, String) {
    let mut worst = (0.0f64, String::new());
    for step in 0..STEPS {
        let ours = Tensor::read_safetensors(
            host_out.join(format!("checkpoint-{:08}.safetensors", step + 1)),
        )
        .unwrap();
        let theirs =
            Tensor::read_safetensors(dump.join(format!("step-{step:08}.safetensors"))).unwrap();
        assert!(!theirs.is_empty());
        for (name, t) in &theirs {
            let key = format!("model.{name}");
            let (_, o) = ours
                .iter()
                .find(|(n, _)| *n == key)
                .unwrap_or_else(|| panic!("no {key} in lsgd-host's checkpoint of step {step}"));
            let allowed = t.abs() * 1e-5 + 1e-6;
            let ratio = ((o - t).abs() / allowed).max().double_value(&[]);
            if ratio > worst.0 {
                worst = (ratio, format!("{name} after step {step}"));
            }
        }
    }
    worst
}

/// Runs both sides and checks every step's parameters agree (`worst` at most 1).
fn parity(name: &str, ours: &[&str], theirs: &[&str]) {
    if no_mpirun() {
        return;
    }
    let (out, dump) = (
        scratch(&format!("{name}-host")),
        scratch(&format!("{name}-torch")),
    );
    host(&out, ours);
    torch(&dump, theirs);
    let (ratio, at) = worst(&out, &dump);
    assert!(
        ratio <= 1.0,
        "{name}: rank 0's parameters differ by {ratio:.3} times the tolerance at {at}"
    );
}

#[test]
fn local_sgd_averages_as_periodic_model_averager_does() {
    parity(
        "sync-torch-local",
        &["--sync", "local-sgd", "--set", "sync.period=3"],
        &["--sync", "local-sgd", "--period", "3"],
    );
}

#[test]
fn post_local_sgd_is_torchs_post_local_sgd_hook_and_averager() {
    parity(
        "sync-torch-post-local",
        &[
            "--sync",
            "post-local-sgd",
            "--set",
            "sync.warmup_steps=3",
            "--set",
            "sync.period=3",
        ],
        &[
            "--sync",
            "post-local-sgd",
            "--warmup-steps",
            "3",
            "--period",
            "3",
        ],
    );
}

#[test]
fn diloco_takes_the_papers_outer_nesterov_step() {
    parity(
        "sync-torch-diloco",
        &["--sync", "diloco", "--set", "sync.period=4"],
        &[
            "--sync",
            "diloco",
            "--period",
            "4",
            "--outer-lr",
            "0.7",
            "--outer-momentum",
            "0.9",
        ],
    );
}
