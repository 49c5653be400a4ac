//! `lsgd-host run` on real Fashion-MNIST subsets: learning, resume equivalence, a plugin fault
//! mid-run, bad data, the config file and the plot. They need Debian's
//! `dataset-fashion-mnist` (the test command installs it).

use std::path::{Path, PathBuf};

use lsgd_host::collective::Algorithm;
use lsgd_host::data::DEFAULT_DIR;
use lsgd_host::model::{Arch, ModelSpec, Shortcut};
use lsgd_host::optim::{AdamWConfig, SgdConfig, SgdForm};
use lsgd_host::plugin::Plugin;
use lsgd_host::policy::{Bounds, PolicySet};
use lsgd_host::train::metrics::{self, Record};
use lsgd_host::train::{self, DeviceChoice, Invocation, Reporting, RunConfig, TrainConfig};

use crate::common::*;

/// A small CPU run on `train` training samples; one thread, so it is deterministic.
pub(crate) fn config(
    out: PathBuf,
    arch: Arch,
    train: usize,
    epochs: u32,
    batch: u32,
) -> TrainConfig {
    TrainConfig {
        run: RunConfig {
            model: ModelSpec {
                arch,
                depth: 8,
                zero_init_residual: arch == Arch::Resnet,
                shortcut: Shortcut::A,
                script: None,
            },
            sgd: SgdConfig::default(),
            adamw: None,
            epochs,
            global_batch: batch,
            max_micro_batch: 512,
            base_lr: 0.1,
            reference_batch: 256,
            max_batch: 1 << 20,
            seed: 7,
            train_subset: Some(train),
            test_subset: Some(1000),
            bucket_mb: 25.0,
            error_feedback: Default::default(),
            local_clip_norm: None,
            mixed_precision: Default::default(),
            mode: Default::default(),
            dataset: Default::default(),
            augment: Default::default(),
            image_size: 224,
        },
        invocation: Invocation {
            threads: 1,
            data: PathBuf::from(DEFAULT_DIR),
            device: DeviceChoice::Cpu,
            out,
            checkpoint_every: 0,
            stop_after_steps: None,
            csv: false,
            allreduce: Algorithm::Mpi,
            consistency_every: 100,
            slow: None,
            tolerance: None,
            lose: None,
            keep_checkpoints: 2,
            overwrite: false,
            loader_threads: 2,
            save_model: None,
            overlap: None,
        },
    }
}

fn policies(plugins: Vec<Plugin>) -> PolicySet {
    PolicySet::new(plugins, Bounds::default()).unwrap()
}

fn warmup_and_smoothing() -> PolicySet {
    let rt = runtime();
    policies(vec![
        load(
            &rt,
            "warmup",
            &[("warmup_epochs", "1"), ("milestones", "1.5")],
        )
        .unwrap(),
        load(&rt, "label-smoothing", &[]).unwrap(),
    ])
}

/// A run directory's checkpoint.json.
fn checkpoint_meta(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap()
}

pub(crate) fn quiet() -> Reporting {
    Reporting { quiet: true }
}

#[test]
fn a_short_run_learns_well_above_chance() {
    let out = scratch("train-learns");
    let cfg = config(out.clone(), Arch::Cnn, 3000, 2, 100);
    let rt = runtime();
    let set = policies(vec![
        load(&rt, "warmup", &[("warmup_epochs", "0.5")]).unwrap(),
    ]);
    let s = train::run(&cfg, set, None, quiet()).unwrap();
    assert_eq!(s.steps, 60);
    let acc = s.last_eval.unwrap().accuracy;
    assert!(
        acc > 0.65,
        "test accuracy {acc} after 2 epochs of 3000 samples"
    );
    let st = steps(&out);
    let mean = |r: &[metrics::StepRecord]| r.iter().map(|s| s.loss).sum::<f64>() / r.len() as f64;
    assert!(mean(&st[50..]) < 0.7 * mean(&st[..5]), "loss did not fall");
    // The linear scaling rule also scales down: η = 0.1 · 100/256 throughout.
    assert_eq!(st[0].lr, 0.1 * 100.0 / 256.0);
    assert_eq!(st[59].lr, 0.1 * 100.0 / 256.0);
    let evals = metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter(|r| matches!(r, Record::Eval(_)))
        .count();
    assert_eq!(evals, 2);
}

#[test]
fn n_steps_straight_equal_half_resume_half_bit_for_bit() {
    // 600 samples at batch 64: batches straddle epochs, the LR warms up over the first epoch
    // and drops at 1.5, ε ramps; Goyal's SGD form so the last LR matters on resume.
    let mut straight = config(scratch("train-straight"), Arch::Cnn, 600, 2, 64);
    straight.run.sgd.form = SgdForm::Goyal;
    straight.run.sgd.nesterov = true;
    let a = train::run(&straight, warmup_and_smoothing(), None, quiet()).unwrap();
    assert_eq!(a.steps, 19);

    let mut first = straight.clone();
    first.invocation.out = scratch("train-split");
    first.invocation.stop_after_steps = Some(9);
    let half = train::run(&first, warmup_and_smoothing(), None, quiet()).unwrap();
    assert_eq!(half.steps, 9);
    assert_ne!(half.weights_blake3, a.weights_blake3);
    let mut second = first.clone();
    second.invocation.stop_after_steps = None;
    let b = train::run(
        &second,
        warmup_and_smoothing(),
        Some(&first.invocation.out),
        quiet(),
    )
    .unwrap();
    assert_eq!(b.steps, 19);
    assert_eq!(b.weights_blake3, a.weights_blake3, "resumed weights differ");
    assert_eq!(b.last_eval.unwrap(), a.last_eval.unwrap());
    // The resumed run's metrics hold every step once, with the same losses and LRs.
    let (sa, sb) = (
        steps(&straight.invocation.out),
        steps(&first.invocation.out),
    );
    assert_eq!(
        sb.iter().map(|s| s.step).collect::<Vec<_>>(),
        (0..19).collect::<Vec<_>>()
    );
    for (x, y) in sa.iter().zip(&sb) {
        assert_eq!(
            (x.loss, x.lr, x.label_smoothing),
            (y.loss, y.lr, y.label_smoothing)
        );
    }
}

#[test]
fn a_resume_with_other_settings_or_plugins_is_refused() {
    let mut cfg = config(scratch("train-mismatch"), Arch::Mlp, 300, 1, 100);
    cfg.invocation.stop_after_steps = Some(1);
    train::run(&cfg, warmup_and_smoothing(), None, quiet()).unwrap();
    let mut other = cfg.clone();
    other.run.seed = 8;
    let rt = runtime();
    let different = policies(vec![load(&rt, "cosine", &[]).unwrap()]);
    let e = train::run(&other, different, Some(&cfg.invocation.out), quiet()).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("--seed: checkpoint has 7, this run has 8"),
        "{msg}"
    );
    assert!(msg.contains("policy plugins"), "{msg}");
    assert!(msg.contains("cosine"), "{msg}");
}

#[test]
fn a_plugin_fault_mid_run_saves_a_checkpoint_first() {
    let cfg = config(scratch("train-fault"), Arch::Mlp, 500, 1, 50);
    let rt = runtime();
    let bad = load(&rt, "bad-schedule", &[("mode", "nan"), ("from_step", "4")]).unwrap();
    let e = train::run(&cfg, policies(vec![bad]), None, quiet()).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("bad-schedule.wasm"), "{msg}");
    assert!(msg.contains("learning-rate at step 4"), "{msg}");
    assert!(msg.contains("state before step 4 saved to"), "{msg}");
    let meta = checkpoint_meta(&cfg.invocation.out);
    assert_eq!(meta["step"], 4);
    assert_eq!(meta["reason"], "plugin fault");
    assert_eq!(steps(&cfg.invocation.out).len(), 4);
}

#[test]
fn a_damaged_data_file_is_named() {
    let dir = scratch("train-bad-data");
    for f in [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ] {
        std::fs::copy(Path::new(DEFAULT_DIR).join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("t10k-images-idx3-ubyte.gz"),
        b"\x1f\x8b\x08\x00garbage",
    )
    .unwrap();
    let mut cfg = config(scratch("train-bad-data-out"), Arch::Mlp, 100, 1, 50);
    cfg.invocation.data = dir.clone();
    let e = train::run(&cfg, policies(vec![]), None, quiet()).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains(&dir.join("t10k-images-idx3-ubyte.gz").display().to_string()),
        "{msg}"
    );
}

#[test]
fn run_reads_a_config_file_where_flags_win_and_plot_draws_the_curves() {
    let d = scratch("train-cli");
    let cfg = d.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "model = \"mlp\"\nepochs = 3\nglobal_batch = 100\ntrain-subset = 400\ntest_subset = 200\n\
             threads = 1\ndevice = \"cpu\"\nnesterov = true\nschedule = \"warmup\"\n\
             set = [\"schedule.warmup_epochs=1\"]\nout = \"{}\"\ncsv = true\n",
            d.join("run").display()
        ),
    )
    .unwrap();
    let o = lsgd(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        "--epochs",
        "1",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("test accuracy"), "{}", stdout(&o));
    let meta = checkpoint_meta(&d.join("run"));
    assert_eq!(
        meta["config"]["epochs"], 1,
        "the flag must win over the file"
    );
    assert_eq!(meta["config"]["sgd"]["nesterov"], true);
    let params = meta["plugins"][0]["params"].as_array().unwrap();
    assert!(
        params.contains(&serde_json::json!(["warmup_epochs", "1"])),
        "{params:?}"
    );
    assert!(d.join("run/metrics.csv").is_file() && d.join("run/eval.csv").is_file());

    let png = d.join("curves.png");
    let o = lsgd(&[
        "plot",
        d.join("run/metrics.jsonl").to_str().unwrap(),
        "-o",
        png.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&png).unwrap().len() > 10_000);

    std::fs::write(&cfg, "epochs = 1\nlearning_rate = 3\n").unwrap();
    let o = lsgd(&["run", "--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown key `learning_rate`"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("run.toml"), "{}", stderr(&o));
}

#[test]
fn cuda_runs_where_there_is_a_gpu_and_is_refused_clearly_where_not() {
    let mut cfg = config(scratch("train-cuda"), Arch::Cnn, 512, 1, 128);
    cfg.invocation.device = DeviceChoice::Cuda;
    match train::run(&cfg, policies(vec![]), None, quiet()) {
        Ok(s) => {
            assert!(tch::Cuda::is_available());
            assert!(s.last_eval.unwrap().accuracy > 0.1);
        }
        Err(e) => {
            assert!(
                !tch::Cuda::is_available(),
                "CUDA is there but the run failed: {e:#}"
            );
            assert!(format!("{e:#}").contains("--device cuda: libtorch sees no CUDA device"));
        }
    }
}

#[test]
fn two_ranks_keep_bit_identical_weights_and_a_resume_may_change_the_rank_count() {
    let out = scratch("mpi-train");
    let o = mpirun(&[ranks(
        2,
        &out,
        &["--allreduce", "ring", "--stop-after-steps", "6"],
    )]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("2 rank(s), ring all-reduce"), "{err}");
    assert!(
        err.contains("bit-identical on all 2 ranks at step 6"),
        "{err}"
    );
    // Rank 0 alone wrote metrics: one record per step, each with the bytes it sent.
    let st = steps(&out);
    assert_eq!(st.len(), 6);
    assert!(st.iter().all(|s| s.bytes_sent > 0 && s.global_batch == 64));
    // The same run continues on one process (64 is divisible by 1) to the end of the epoch.
    let o = mpirun(&[ranks(1, &out, &["--resume", out.to_str().unwrap()])]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("test accuracy"), "{}", stdout(&o));
    assert_eq!(steps(&out).len(), 10);
}

#[test]
fn ranks_running_different_policies_are_stopped_with_the_step_and_rank() {
    let out = scratch("mpi-mismatch");
    // Rank 1 starts from another base LR (a run setting: plugin parameters that differ are
    // refused at start-up, see rank_faults.rs), so the LRs part at step 0, and the check after
    // step 2 sees it.
    let other = ranks(1, &out, &["--base-lr", "0.2"]);
    let o = mpirun(&[ranks(1, &out, &[]), other]);
    assert!(!o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "consistency check failed at step 2: the policy outputs (lr, batch, ε, layer-rate \
             multipliers) of rank 1"
        ),
        "{err}"
    );
}

#[test]
fn the_goyal_example_config_is_a_valid_run() {
    let out = scratch("train-goyal-example");
    let cfg = root().join("examples/goyal-90-epochs.toml");
    let o = lsgd(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        // Its recipe, on 256 samples for one epoch: the flags win over the file.
        "--epochs",
        "1",
        "--train-subset",
        "256",
        "--test-subset",
        "100",
        "--global-batch",
        "256",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let meta = checkpoint_meta(&out);
    let c = &meta["config"];
    assert_eq!(
        (c["model"]["arch"].as_str(), c["model"]["depth"].as_u64()),
        (Some("resnet"), Some(20))
    );
    assert_eq!(c["model"]["zero_init_residual"], true);
    assert_eq!(
        (c["max_micro_batch"].as_u64(), c["sgd"]["form"].as_str()),
        (Some(32), Some("goyal"))
    );
    let params = meta["plugins"][0]["params"].as_array().unwrap();
    assert!(
        params.contains(&serde_json::json!(["milestones", "30,60,80"])),
        "{params:?}"
    );
    // 256 samples in micro-batches of 32: eight accumulated passes per step.
    assert_eq!(steps(&out)[0].micro_batches, 8);
}

#[test]
fn adamw_learns_and_resumes_bit_for_bit() {
    let mut straight = config(scratch("train-adamw-straight"), Arch::Cnn, 600, 2, 64);
    straight.run.base_lr = 0.002;
    straight.run.reference_batch = 64;
    straight.run.adamw = Some(AdamWConfig {
        weight_decay: 0.01,
        ..AdamWConfig::default()
    });
    let a = train::run(&straight, warmup_and_smoothing(), None, quiet()).unwrap();
    assert_eq!(a.steps, 19);
    let acc = a.last_eval.unwrap().accuracy;
    assert!(
        acc > 0.5,
        "AdamW reached {acc} after 2 epochs of 600 samples"
    );
    // The moments and the step count are in the checkpoint: 9 + resume + 10 = 19 straight.
    let mut first = straight.clone();
    first.invocation.out = scratch("train-adamw-split");
    first.invocation.stop_after_steps = Some(9);
    train::run(&first, warmup_and_smoothing(), None, quiet()).unwrap();
    let mut second = first.clone();
    second.invocation.stop_after_steps = None;
    let out = first.invocation.out.clone();
    let b = train::run(&second, warmup_and_smoothing(), Some(&out), quiet()).unwrap();
    assert_eq!(b.weights_blake3, a.weights_blake3, "resumed weights differ");
    // SGD's checkpoint does not resume as AdamW.
    let mut sgd = first.clone();
    sgd.run.adamw = None;
    let e = train::run(&sgd, warmup_and_smoothing(), Some(&out), quiet()).unwrap_err();
    assert!(format!("{e:#}").contains("--optimizer"), "{e:#}");
}

#[test]
fn adamw_keeps_two_ranks_bit_identical() {
    let out = scratch("mpi-adamw");
    let o = mpirun(&[ranks(
        2,
        &out,
        &[
            "--optimizer",
            "adamw",
            "--base-lr",
            "0.002",
            "--stop-after-steps",
            "6",
        ],
    )]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("bit-identical on all 2 ranks at step 6"),
        "{}",
        stderr(&o)
    );
    let meta = checkpoint_meta(&out);
    assert_eq!(meta["config"]["adamw"]["beta2"], 0.999);
}
