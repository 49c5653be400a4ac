//! `lsgd-host launch`: a rank killed with SIGKILL under `launch -np 3 --min-np 2` is survived
//! by restarting on the 2 left from the newest checkpoint, recorded in metrics.jsonl; a plugin
//! fault is not restarted; `--max-restarts 0` gives up after the first loss. They need mpirun
//! and skip without it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common::*;

/// `lsgd-host launch LAUNCH -- JOB`, its output in files beside the run directory.
struct Launched {
    child: Child,
    dir: PathBuf,
    started: Instant,
}

fn launch(dir: &Path, launch: &[&str], job: &[String]) -> Launched {
    let mut args = vec!["launch".to_string()];
    args.extend(launch.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(job.iter().cloned());
    let child = spawn_logged(env!("CARGO_BIN_EXE_lsgd-host"), &args, dir);
    Launched {
        child,
        dir: dir.to_path_buf(),
        started: Instant::now(),
    }
}

impl Launched {
    /// Waits for the launcher to exit, at most `bound`; its status code, stdout and stderr.
    fn finish(mut self, bound: Duration) -> (Option<i32>, String, String) {
        let left = bound.saturating_sub(self.started.elapsed());
        let status = wait_at_most(&mut self.child, left).unwrap_or_else(|| {
            panic!(
                "launch still running after {bound:?}\n{}",
                self.read("stderr")
            )
        });
        (status.code(), self.read("stdout"), self.read("stderr"))
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Waits until the run directory holds a checkpoint of step >= 2 (the job has started and
    /// a restart has something to resume); its step.
    fn await_checkpoint(&mut self, out: &Path) -> u64 {
        await_checkpoint(&mut self.child, &self.dir.join("stderr"), out)
    }

    /// SIGKILLs the process of MPI rank `rank` under this launcher: found in /proc by its
    /// environment (OMPI_COMM_WORLD_RANK) and a parent chain that leads to the launcher.
    fn kill_rank(&self, rank: u32) {
        let launcher = self.child.id();
        let pid = rank_pid(launcher, rank as usize)
            .unwrap_or_else(|| panic!("no process of rank {rank} under launch {launcher}"));
        let k = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(k.success(), "kill -9 {pid}");
    }
}

#[test]
fn a_rank_killed_under_launch_is_survived_on_the_ranks_left_from_the_newest_checkpoint() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("launch-survives");
    let out = dir.join("run");
    let flags = [
        "--checkpoint-every",
        "2",
        "--slow-rank",
        "0",
        "--slow-ms",
        "300",
    ];
    let mut l = launch(&dir, &["-np", "3", "--min-np", "2"], &cnn_job(&out, &flags));
    let seen = l.await_checkpoint(&out);
    l.kill_rank(1);
    let killed = Instant::now();
    let (code, stdout, stderr) = l.finish(Duration::from_secs(300));
    eprintln!(
        "killed after checkpoint {seen}; the job ended {:?} later",
        killed.elapsed()
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("after 20 steps"), "{stdout}\n{stderr}");

    let r = restarts(&out);
    assert_eq!(r.len(), 1, "one restart record: {r:?}");
    let r = &r[0];
    assert_eq!(
        (r.attempt, r.lost_ranks.as_slice(), r.signal),
        (1, &[1][..], Some(9))
    );
    assert_eq!((r.world_size_before, r.world_size_after), (3, 2));
    // The kill came after checkpoint `seen`; a later one may have been written before it hit.
    assert!(
        r.resumed_step >= seen && r.resumed_step.is_multiple_of(2) && r.resumed_step < 20,
        "{r:?}"
    );
    assert!(r.unix_s > 1.5e9 && r.elapsed_s > 0.0, "{r:?}");
    assert!(
        stderr.contains(&format!(
            "launch: lost rank 1 (signal 9, Killed) of 3 ranks; restart 1 of at most 3: resuming from step {} (the newest checkpoint in {}) on 2 rank(s)",
            r.resumed_step,
            out.display()
        )),
        "{stderr}"
    );
    // Every step of the full run exactly once: the first attempt's up to the checkpoint, the
    // restarted job's after it.
    let steps: Vec<u64> = steps(&out).iter().map(|s| s.step).collect();
    assert_eq!(steps, (0..20).collect::<Vec<_>>());
    // The plot (and every reader of metrics.jsonl) accepts the restart record.
    let png = dir.join("curves.png");
    let o = lsgd(&[
        "plot",
        &out.join("metrics.jsonl").display().to_string(),
        "-o",
        &png.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_plugin_fault_under_launch_is_not_restarted() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("launch-plugin-fault");
    let out = dir.join("run");
    let schedule = plugin_path("bad-schedule").display().to_string();
    let flags = [
        "--schedule",
        &schedule,
        "--set",
        "schedule.mode=trap",
        "--set",
        "schedule.from_step=3",
    ];
    let l = launch(&dir, &["-np", "2", "--min-np", "1"], &cnn_job(&out, &flags));
    let (code, stdout, stderr) = l.finish(Duration::from_secs(120));
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("learning-rate at step 3: trapped")
            && stderr.contains("bad-schedule traps on purpose"),
        "{stderr}"
    );
    assert!(
        stderr.contains("without losing a rank, so it is not restarted"),
        "{stderr}"
    );
    assert!(!stderr.contains("restart 1"), "{stderr}");
    assert!(restarts(&out).is_empty());
}

#[test]
fn launch_with_max_restarts_0_gives_up_after_the_first_loss() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("launch-gives-up");
    let out = dir.join("run");
    let flags = [
        "--checkpoint-every",
        "2",
        "--slow-rank",
        "0",
        "--slow-ms",
        "300",
    ];
    let mut l = launch(
        &dir,
        &["-np", "2", "--min-np", "1", "--max-restarts", "0"],
        &cnn_job(&out, &flags),
    );
    l.await_checkpoint(&out);
    l.kill_rank(1);
    let killed = Instant::now();
    let (code, stdout, stderr) = l.finish(Duration::from_secs(300));
    let stopped = killed.elapsed();
    assert!(
        stopped < Duration::from_secs(30),
        "{stopped:?} to stop\n{stderr}"
    );
    assert_ne!(code, Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "error: launch: lost rank 1 (signal 9, Killed) of 2 ranks, and --max-restarts 0 is spent: giving up; the newest checkpoint (step"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("--resume {}", out.display())),
        "{stderr}"
    );
    assert!(!stdout.contains("after 20 steps"), "{stdout}");
    assert!(restarts(&out).is_empty());
}
