//! `run --fault-tolerance` on one machine (Open MPI 5's ULFM): a rank killed or stopped mid-run
//! costs the step in flight, not the run. The survivors' weights equal a resume on fewer ranks
//! bit for bit; only a majority goes on; below `--min-np` the survivors stop with a checkpoint;
//! `launch` runs such a job without a restart. The lab's losses (a dead host, a cut link) are in
//! netlab.rs.

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

/// How long any of these jobs may take, losses and detection included.
const BOUND: Duration = Duration::from_secs(90);

/// Runs `args` under Open MPI 5 with `np` ranks; fails the test past [`BOUND`].
fn ulfm(np: usize, args: &[String]) -> Option<Output> {
    let mut cmd = ulfm_mpirun()?;
    let logs = scratch(&format!("ft-logs-{}", LOGS.fetch_add(1, Ordering::SeqCst)));
    let file = |name: &str| std::fs::File::create(logs.join(name)).unwrap();
    cmd.args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_lsgd-host")])
        .args(args)
        .stdin(Stdio::null())
        .stdout(file("stdout"))
        .stderr(file("stderr"));
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = wait_at_most(&mut child, BOUND);
    let read = |name: &str| std::fs::read(logs.join(name)).unwrap();
    let (stdout, stderr) = (read("stdout"), read("stderr"));
    let Some(status) = status else {
        panic!(
            "{args:?} ran past {BOUND:?}\n{}\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    };
    let took = started.elapsed().as_secs_f64();
    eprintln!("{np} ranks, {took:.1} s: {}", args.join(" "));
    Some(Output {
        status,
        stdout,
        stderr,
    })
}

/// Numbers the log directories of the jobs one test process runs.
static LOGS: AtomicUsize = AtomicUsize::new(0);

/// Runs the `run` of `args` on `np` ranks under the machine's Open MPI (4.1, no ULFM).
fn on_machine_mpi(np: usize, args: Vec<String>) -> Output {
    // `args` begins with `run`, which `run_app` already ends with.
    let mut app = run_app(np);
    app.extend(args.into_iter().skip(1));
    mpirun(&[app])
}

/// The tiny mlp job: 384 samples at global batch 48 (8 steps an epoch, divisible by 4, 3 and
/// 2 ranks), 2 epochs, a failure detector of a few seconds.
fn job(out: &Path, extra: &[&str]) -> Vec<String> {
    // 8 s: on two cores shared with other tests' jobs a rank can be still for seconds (at the
    // start, loading libtorch and the plugins), and must not look silent or stuck.
    let mut base = vec!["--collective-timeout", "8", "--quiet"];
    base.extend_from_slice(extra);
    tiny_at(48, 2, out, &base)
}

#[test]
fn the_collectives_survive_a_killed_and_a_stopped_rank() {
    for (lose, how) in [("2", "kill"), ("1", "stop")] {
        let args: Vec<String> = [
            "selftest",
            "survive",
            "--lose",
            lose,
            "--at",
            "2",
            "--how",
            how,
            "--detector",
            "2",
        ]
        .map(String::from)
        .to_vec();
        let Some(o) = ulfm(3, &args) else { return };
        let text = stdout(&o);
        assert!(o.status.success(), "{how}: {text}\n{}", stderr(&o));
        assert_eq!(text.matches("sums exact").count(), 6, "{how}: {text}");
        assert!(
            text.contains(&format!(
                "round 2: 2 of 3 ranks, 2 tries, sums exact  lost rank(s) [{lose}]"
            )),
            "{how}: {text}"
        );
    }
}

/// A 3-rank run that loses `lose` (`R@STEP[:stop]`) with `extra` flags ends with the weights
/// of the same run stopped before that step and resumed on 2 ranks.
fn equals_a_resume_on_fewer_ranks(name: &str, lose: &str, extra: &[&str]) {
    let step = lose.split(['@', ':']).nth(1).unwrap();
    let tolerant = scratch(&format!("ft-{name}"));
    let mut flags = vec!["--fault-tolerance", "--lose-rank", lose];
    flags.extend_from_slice(extra);
    let Some(o) = ulfm(3, &job(&tolerant, &flags)) else {
        return;
    };
    assert!(o.status.success(), "{name}: {}", stderr(&o));
    let lost = losses(&tolerant);
    assert_eq!(lost.len(), 1, "{name}: {lost:?}");
    let rank: u32 = lose.split('@').next().unwrap().parse().unwrap();
    assert_eq!(
        (
            lost[0].lost_ranks.clone(),
            lost[0].world_size_after,
            lost[0].step.to_string()
        ),
        (vec![rank], 2, step.to_string()),
        "{name}"
    );
    assert!(restarts(&tolerant).is_empty());
    assert_eq!(
        steps(&tolerant).len(),
        16,
        "{name}: every step recorded once"
    );

    let resumed = scratch(&format!("ft-{name}-resumed"));
    let stopped = on_machine_mpi(
        3,
        job(&resumed, &[extra, &["--stop-after-steps", step]].concat()),
    );
    assert!(stopped.status.success(), "{name}: {}", stderr(&stopped));
    let dir = resumed.display().to_string();
    let again = on_machine_mpi(2, job(&resumed, &[extra, &["--resume", &dir]].concat()));
    assert!(again.status.success(), "{name}: {}", stderr(&again));
    assert_eq!(
        weights(&o),
        weights(&again),
        "{name}: not the resume's weights"
    );
}

#[test]
fn a_run_that_loses_a_rank_ends_with_the_weights_of_a_resume_on_fewer_ranks() {
    equals_a_resume_on_fewer_ranks("mlp", "2@5", &[]);
    // With the exchange behind the backward pass (opt-in under --fault-tolerance): the rank is
    // lost while the step's thread all-reduces and the backward pass runs on another.
    equals_a_resume_on_fewer_ranks("overlap", "2@5", &["--overlap", "--allreduce", "ring"]);
}

#[test]
fn losing_rank_zero_or_a_stopped_rank_under_a_codec_or_another_algorithm_changes_nothing_either() {
    // Rank 0 writes the metrics and checkpoints: its successor takes over. (With BatchNorm its
    // running statistics would be its successor's own, where a resume gives every rank rank 0's:
    // docs/cluster.md.)
    equals_a_resume_on_fewer_ranks("root", "0@3", &["--allreduce", "ring"]);
    equals_a_resume_on_fewer_ranks(
        "cnn",
        "2@3",
        &["--model", "cnn", "--allreduce", "hierarchical"],
    );
    equals_a_resume_on_fewer_ranks("stop-gather", "1@6:stop", &["--codec", "codec-top-k"]);
    equals_a_resume_on_fewer_ranks(
        "sum-torus",
        "2@4",
        &["--codec", "codec-int8", "--allreduce", "torus2d"],
    );
}

#[test]
fn a_majority_goes_on_and_half_the_ranks_without_rank_zero_stop_without_writing() {
    let Some(_) = ulfm_mpirun() else { return };
    let out = scratch("ft-half");
    let o = ulfm(
        4,
        &job(&out, &["--fault-tolerance", "--lose-rank", "0,1@3"]),
    )
    .unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("cut off: 2 of the last agreed world's 4 ranks")
            && err.contains("old rank 0 goes on"),
        "{err}"
    );
    assert_eq!(
        checkpoint_step(&out),
        None,
        "the cut-off half wrote a checkpoint"
    );
    assert!(losses(&out).is_empty());

    let out = scratch("ft-half-with-root");
    let o = ulfm(
        4,
        &job(&out, &["--fault-tolerance", "--lose-rank", "2,3@3"]),
    )
    .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(losses(&out)[0].lost_ranks, [2, 3]);
}

#[test]
fn below_min_np_the_survivors_stop_with_a_checkpoint_that_resumes() {
    let out = scratch("ft-min-np");
    let Some(o) = ulfm(
        3,
        &job(
            &out,
            &["--fault-tolerance", "--min-np", "3", "--lose-rank", "2@4"],
        ),
    ) else {
        return;
    };
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("2 rank(s) left, fewer than --min-np 3"),
        "{err}"
    );
    assert_eq!(
        checkpoint_step(&out),
        Some(4),
        "the state before the lost step"
    );
    let dir = out.display().to_string();
    let again = on_machine_mpi(2, job(&out, &["--resume", &dir]));
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(steps(&out).len(), 16);
}

#[test]
fn launch_runs_a_fault_tolerant_job_without_a_restart() {
    let Some(_) = ulfm_mpirun() else { return };
    let out = scratch("ft-launch");
    // Spare slots for the replacement (see ulfm_mpirun).
    let mut args = vec![
        "launch",
        "-np",
        "3",
        "--mpirun-arg=--host",
        "--mpirun-arg=localhost:8",
    ];
    args.push("--");
    let run = job(&out, &["--fault-tolerance", "--lose-rank", "2@3"]);
    args.extend(run.iter().map(String::as_str));
    let o = lsgd(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(restarts(&out).is_empty());
    assert_eq!(losses(&out).len(), 1);
    // launch passes --grow-back: a replacement joined after the redone step.
    let grew = growths(&out);
    assert_eq!(grew.len(), 1, "{}", stderr(&o));
    assert_eq!((grew[0].step, grew[0].world_size_after), (4, 3));
}

#[test]
fn fault_tolerance_says_what_it_needs() {
    // The machine's Open MPI 4.1 has no ULFM.
    if !no_mpirun() {
        let out = scratch("ft-no-ulfm");
        let o = on_machine_mpi(2, job(&out, &["--fault-tolerance"]));
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains("--fault-tolerance: ") && err.contains("ULFM"),
            "{err}"
        );
    }
    let out = scratch("ft-async");
    let o = lsgd(
        &job(&out, &["--fault-tolerance", "--mode", "async"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--mode async"), "{}", stderr(&o));
    let o = lsgd(
        &job(&out, &["--min-np", "2"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert!(stderr(&o).contains("--fault-tolerance"), "{}", stderr(&o));
}

#[test]
fn launch_takes_a_fault_tolerant_run_that_reached_its_end_as_done_whatever_mpirun_says() {
    // Open MPI 5 may report at the job's end what ULFM survived in it (a spawn that found no
    // slot: status 213). An mpirun that says so after the run's last checkpoint is written:
    // launch must not restart the finished run.
    let Some(_) = ulfm_mpirun() else { return };
    let prefix = std::path::PathBuf::from(std::env::var_os("LSGD_OMPI5").unwrap());
    let fake = scratch("ft-launch-213");
    std::fs::create_dir_all(fake.join("bin")).unwrap();
    std::os::unix::fs::symlink(prefix.join("lib"), fake.join("lib")).unwrap();
    let mpirun = fake.join("bin/mpirun");
    std::fs::write(
        &mpirun,
        format!(
            "#!/bin/sh\n'{}' \"$@\" || exit $?\nexit 213\n",
            prefix.join("bin/mpirun").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&mpirun, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = scratch("ft-launch-213-run");
    let mpirun_flag = format!("--mpirun={}", mpirun.display());
    let mut args = vec![
        "launch",
        "-np",
        "2",
        &mpirun_flag,
        "--mpirun-arg=--oversubscribe",
        "--",
    ];
    let run = job(&out, &["--fault-tolerance"]);
    args.extend(run.iter().map(String::as_str));
    let o = lsgd(&args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("after the run reached its end"), "{err}");
    assert!(restarts(&out).is_empty(), "{err}");
}

/// A 3-rank run with `--grow-back` that loses `lose` (`R@K[:stop]`) redoes step K on 2 ranks,
/// grows back to 3 after it, and ends with the weights of the same run stopped before step K,
/// resumed on 2 ranks for step K, then resumed on 3.
fn grows_back_as_resumes_would(name: &str, lose: &str, extra: &[&str]) {
    let step: u64 = lose.split(['@', ':']).nth(1).unwrap().parse().unwrap();
    let grown = scratch(&format!("ft-grow-{name}"));
    let mut flags = vec!["--fault-tolerance", "--grow-back", "--lose-rank", lose];
    flags.extend_from_slice(extra);
    let Some(o) = ulfm(3, &job(&grown, &flags)) else {
        return;
    };
    let err = stderr(&o);
    assert!(o.status.success(), "{name}: {err}");
    let grew = growths(&grown);
    assert_eq!(grew.len(), 1, "{name}: {err}");
    let g = &grew[0];
    assert_eq!(
        (
            g.step,
            g.world_size_before,
            g.world_size_after,
            g.hosts.len()
        ),
        (step + 1, 2, 3, 1),
        "{name}"
    );
    assert_eq!(losses(&grown).len(), 1, "{name}");
    assert_eq!(steps(&grown).len(), 16, "{name}: every step recorded once");

    let resumed = scratch(&format!("ft-grow-{name}-resumed"));
    let dir = resumed.display().to_string();
    let on = |np: usize, more: &[&str]| {
        let o = on_machine_mpi(np, job(&resumed, &[extra, more].concat()));
        assert!(
            o.status.success(),
            "{name}: {np} ranks {more:?}: {}",
            stderr(&o)
        );
        o
    };
    on(3, &["--stop-after-steps", &step.to_string()]);
    on(
        2,
        &[
            "--resume",
            &dir,
            "--stop-after-steps",
            &(step + 1).to_string(),
        ],
    );
    let again = on(3, &["--resume", &dir]);
    assert_eq!(
        weights(&o),
        weights(&again),
        "{name}: not the resumes' weights"
    );
}

#[test]
fn a_run_that_grows_back_equals_resumes_on_fewer_then_on_all_ranks() {
    grows_back_as_resumes_would("mlp", "2@5", &[]);
}

#[test]
fn growing_back_after_a_stopped_rank_under_a_stateful_codec_and_the_torus_changes_nothing_either() {
    // Rank 1 is lost: the replacement takes the last rank, the survivors' order changes.
    grows_back_as_resumes_would(
        "stop-topk-torus",
        "1@6:stop",
        &["--codec", "codec-top-k", "--allreduce", "torus2d"],
    );
}
