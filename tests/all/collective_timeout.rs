//! `run --collective-timeout`: a rank frozen with SIGSTOP mid-run (a peer that stops answering,
//! as a cut link does) ends the job within seconds, with a report naming the frozen rank and
//! the newest checkpoint, instead of a hang; under `launch --min-np 1` the job restarts on the
//! rank that reported and finishes. They need mpirun and skip without it.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;

/// The launch tests' job on 2 ranks, rank 0 slowed so that the job outlives its first
/// checkpoints, with a 3 s collective timeout.
fn job(out: &Path) -> Vec<String> {
    job_timing_out_after(out, 3)
}

/// [`job`] with a collective timeout of `seconds`.
fn job_timing_out_after(out: &Path, seconds: u32) -> Vec<String> {
    let timeout = seconds.to_string();
    let flags = [
        "--allreduce",
        "ring",
        "--checkpoint-every",
        "2",
        "--slow-rank",
        "0",
        "--slow-ms",
        "300",
        "--collective-timeout",
        &timeout,
    ];
    cnn_job(out, &flags)
}

/// The job under `mpirun -np 2`, its output in files in `dir`.
fn under_mpirun(dir: &Path, out: &Path) -> Child {
    under_mpirun_timing_out_after(dir, out, 3)
}

/// [`under_mpirun`] with a collective timeout of `seconds`.
fn under_mpirun_timing_out_after(dir: &Path, out: &Path, seconds: u32) -> Child {
    let bin = env!("CARGO_BIN_EXE_lsgd-host").to_string();
    let mut args: Vec<String> = MPIRUN_FLAGS
        .iter()
        .chain(&["-np", "2", &bin])
        .map(|s| s.to_string())
        .collect();
    args.extend(job_timing_out_after(out, seconds));
    spawn_logged("mpirun", &args, dir)
}

/// Whether `pid` is a stopped process (the frozen rank, not a later process given its pid).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s[s.rfind(')')? + 2..].starts_with('T')))
        .unwrap_or(false)
}

/// Sends `signal` to `pid` (errors ignored: the process may be gone).
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

/// Freezes rank 1 under `child` once the job has a checkpoint; its pid.
fn freeze_rank_1(child: &mut Child, dir: &Path, out: &Path) -> u32 {
    await_checkpoint(child, &dir.join("stderr"), out);
    let pid = rank_pid(child.id(), 1).expect("a process of rank 1");
    signal(pid, "-STOP");
    pid
}

/// Waits at most `bound` for `child`; its exit code and stderr. The frozen rank is killed in
/// any case, so that no test leaves a stopped process behind.
fn finish(mut child: Child, dir: &Path, frozen: u32, bound: Duration) -> (Option<i32>, String) {
    let status = wait_at_most(&mut child, bound);
    if stopped(frozen) {
        signal(frozen, "-KILL");
    }
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("still running after {bound:?}\n{stderr}"));
    (status.code(), stderr)
}

#[test]
fn a_frozen_rank_ends_the_job_with_a_collective_timeout_report_instead_of_a_hang() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("collective-timeout");
    let out = dir.join("run");
    let mut child = under_mpirun(&dir, &out);
    let frozen = freeze_rank_1(&mut child, &dir, &out);
    let stopped = Instant::now();
    let (code, stderr) = finish(child, &dir, frozen, Duration::from_secs(60));
    let took = stopped.elapsed();
    eprintln!("the job ended {took:?} after rank 1 froze, status {code:?}");
    // 3 s without progress, the report's 1.5 s linger, mpirun's teardown.
    assert!(took < Duration::from_secs(30), "{took:?}\n{stderr}");
    assert_ne!(code, Some(0), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.contains("error: collective timeout: "))
        .unwrap_or_else(|| panic!("no report\n{stderr}"));
    assert!(
        line.starts_with("error: collective timeout: rank 0 (host ")
            && line.contains(" made no progress for ")
            // The loss's all-reduce is MPI's, the gradients' the ring: either may be waiting.
            && (line.contains(" s in ring all-reduce, waiting on rank 1 (host ")
                || line.contains(" s in MPI_Allreduce, waiting on rank 1 (host "))
            && line.contains("; ranks: 0-1="),
        "{line}"
    );
    let step = line
        .split_once("; newest checkpoint: step ")
        .and_then(|(_, s)| s.split_once(' '))
        .and_then(|(s, _)| s.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no checkpoint named: {line}"));
    assert!(step >= 2 && step.is_multiple_of(2), "{line}");
    assert!(
        line.ends_with(&format!(
            " in {} (resume with --resume {})",
            out.display(),
            out.display()
        )),
        "{line}"
    );
    assert_eq!(
        stderr.matches("error: collective timeout: ").count(),
        1,
        "only rank 0 reports: {stderr}"
    );
}

#[test]
fn a_frozen_rank_under_launch_is_dropped_and_the_job_finishes_on_the_rank_that_reported() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("collective-timeout-launch");
    let out = dir.join("run");
    let mut args: Vec<String> = ["launch", "-np", "2", "--min-np", "1", "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(job(&out));
    let mut child = spawn_logged(env!("CARGO_BIN_EXE_lsgd-host"), &args, &dir);
    let frozen = freeze_rank_1(&mut child, &dir, &out);
    let (code, stderr) = finish(child, &dir, frozen, Duration::from_secs(240));
    let stdout = std::fs::read_to_string(dir.join("stdout")).unwrap_or_default();
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("after 20 steps"), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("error: collective timeout: rank 0 (host "),
        "{stderr}"
    );
    assert!(
        stderr.contains(": no collective-timeout report from it) of 2 ranks; restart 1 of at most 3: resuming from step "),
        "{stderr}"
    );
    let restarts = restarts(&out);
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    let r = &restarts[0];
    assert_eq!(
        (r.lost_ranks.as_slice(), r.signal),
        (&[1][..], None),
        "{r:?}"
    );
    assert_eq!((r.world_size_before, r.world_size_after), (2, 1));
    let steps: Vec<u64> = steps(&out).iter().map(|s| s.step).collect();
    assert_eq!(steps, (0..20).collect::<Vec<_>>());
}

#[test]
fn a_job_stopped_and_continued_whole_is_no_collective_timeout() {
    // As when a machine is suspended, or mpirun continues a rank it stopped: the 12 s without
    // running are no peer's silence, so no rank reports and the job finishes. A 6 s timeout:
    // after both go on, rank 0 finishes its step before it answers rank 1, which on two cores
    // shared with the rest of the suite took over 3 s (twice, in cold runs).
    if no_mpirun() {
        return;
    }
    let dir = scratch("collective-timeout-paused");
    let out = dir.join("run");
    let mut child = under_mpirun_timing_out_after(&dir, &out, 6);
    await_checkpoint(&mut child, &dir.join("stderr"), &out);
    let rank = |r| rank_pid(child.id(), r).unwrap_or_else(|| panic!("a process of rank {r}"));
    let (rank_0, rank_1) = (rank(0), rank(1));
    // Rank 0 first: within a step (well under the 6 s) rank 1 waits on it in the all-reduce,
    // and is stopped there.
    signal(rank_0, "-STOP");
    std::thread::sleep(Duration::from_secs(1));
    signal(rank_1, "-STOP");
    std::thread::sleep(Duration::from_secs(12));
    // Rank 1 first: its watchdog wakes at once, while rank 0 has its step to finish before
    // it sends.
    signal(rank_1, "-CONT");
    signal(rank_0, "-CONT");
    let (code, stderr) = finish(child, &dir, rank_1, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("collective timeout"), "{stderr}");
    assert_eq!(steps(&out).len(), 20);
}
