//! Faults that strike one rank of a distributed run: a codec that traps or loops on rank 1
//! only, a policy that faults on rank 1 only, ranks started with different plugin parameters,
//! and a rank killed with SIGKILL mid-step or mid-collective. Every fault must stop every rank
//! within a bound, never hang; a plugin fault must leave one message, the same on every rank,
//! and a checkpoint that resumes. Each test prints its time to stop (`--nocapture` shows it).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::common::{
    checkpoint_step, mpirun_command, no_mpirun, overridden, rank_pid, scratch, steps, wait_at_most,
};

/// How long any of these jobs may take to stop after its fault.
const BOUND: Duration = Duration::from_secs(30);

/// `-np N lsgd-host run` on the small cnn job: 480 samples at global batch 48 (10 steps an
/// epoch; the batch splits over 2, 3 and 6 ranks), with `extra` flags.
fn job(np: usize, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "-np",
        &np.to_string(),
        env!("CARGO_BIN_EXE_lsgd-host"),
        "run",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(
        [
            "--model",
            "cnn",
            "--train-subset",
            "480",
            "--test-subset",
            "100",
            "--epochs",
            "1",
            "--global-batch",
            "48",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--seed",
            "7",
            "--out",
        ]
        .map(String::from),
    );
    v.push(out.display().to_string());
    overridden(v, extra)
}

/// A running `mpirun` of `apps` (MPMD when several), each line of output tagged with its rank.
struct Job {
    child: Child,
    started: Instant,
    out: JoinHandle<String>,
    err: JoinHandle<String>,
}

/// How a [`Job`] ended.
struct Ended {
    status: ExitStatus,
    /// From the start (or the kill) to mpirun's exit.
    took: Duration,
    stdout: String,
    stderr: String,
}

impl Job {
    fn start(apps: &[Vec<String>]) -> Job {
        let mut cmd = mpirun_command();
        cmd.arg("--tag-output")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (i, app) in apps.iter().enumerate() {
            if i > 0 {
                cmd.arg(":");
            }
            cmd.args(app);
        }
        let mut child = cmd.spawn().expect("mpirun starts");
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = r.read_to_string(&mut s);
                s
            })
        };
        Job {
            out: drain(Box::new(child.stdout.take().unwrap())),
            err: drain(Box::new(child.stderr.take().unwrap())),
            started: Instant::now(),
            child,
        }
    }

    /// Waits for mpirun to exit, at most [`BOUND`] after `since` (killing it past that, and
    /// failing the test).
    fn wait_from(mut self, since: Instant) -> Ended {
        let left = BOUND.saturating_sub(since.elapsed());
        let Some(status) = wait_at_most(&mut self.child, left) else {
            panic!(
                "mpirun still running {BOUND:?} after the fault\n{}\n{}",
                self.out.join().unwrap(),
                self.err.join().unwrap()
            );
        };
        Ended {
            status,
            took: since.elapsed(),
            stdout: self.out.join().unwrap(),
            stderr: self.err.join().unwrap(),
        }
    }

    /// Waits for mpirun to exit, at most [`BOUND`] from its start.
    fn wait(self) -> Ended {
        let since = self.started;
        self.wait_from(since)
    }
}

/// Runs `apps` to the end, within [`BOUND`].
fn mpirun(apps: &[Vec<String>]) -> Ended {
    Job::start(apps).wait()
}

impl Ended {
    fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }

    /// What rank `rank` wrote to stderr. `--tag-output` tags each line, and each write that
    /// ends without one, with `[1,R]<stderr>:`; text after a tagged line's newline is mpirun's.
    fn rank_stderr(&self, rank: usize) -> String {
        let tag = format!("[1,{rank}]<stderr>:");
        let mut text = String::new();
        for (i, _) in self.stderr.match_indices(&tag) {
            let piece = &self.stderr[i + tag.len()..];
            let end = piece
                .find("[1,")
                .into_iter()
                .chain(piece.find('\n').map(|n| n + 1))
                .min()
                .unwrap_or(piece.len());
            text.push_str(&piece[..end]);
        }
        text
    }

    /// Each rank's `error: ` message (its last output), in rank order; each of the `np` ranks
    /// must have printed one.
    fn errors(&self, np: usize) -> Vec<String> {
        (0..np)
            .map(|r| {
                let text = self.rank_stderr(r);
                let at = text
                    .strip_prefix("error: ")
                    .map(|_| 0)
                    .or_else(|| text.find("\nerror: ").map(|i| i + 1))
                    .unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", self.all()));
                text[at + "error: ".len()..].trim_end().to_string()
            })
            .collect()
    }

    /// The one message every one of `np` ranks printed (they must all be the same).
    fn same_error(&self, np: usize) -> String {
        let errors = self.errors(np);
        assert!(
            errors.iter().all(|e| *e == errors[0]),
            "the ranks printed different errors:\n{}",
            errors.join("\n")
        );
        errors[0].clone()
    }
}

/// The checkpoint a "training stopped; … saved to PATH (resume …" message names, which must
/// exist and have been written for the plugin fault.
fn saved_checkpoint(message: &str) -> PathBuf {
    let at = message.find("saved to ").expect("a stopped run") + "saved to ".len();
    let path = PathBuf::from(message[at..].split(" (resume with").next().unwrap());
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    assert_eq!(meta["reason"], "plugin fault", "{meta}");
    path
}

/// Resumes `from` (a run directory) into `out` on `np` ranks with `extra` flags: it must
/// start at step `start` and train on to `until`, the ranks bit-identical at the end.
fn resumes(np: usize, from: &Path, out: &Path, (start, until): (u64, u64), extra: &[&str]) {
    let stop = until.to_string();
    let from = from.to_str().unwrap();
    let flags = [&["--resume", from, "--stop-after-steps", &stop][..], extra].concat();
    let o = mpirun(&[job(np, out, &flags)]);
    assert!(o.status.success(), "resume on {np} ranks:\n{}", o.all());
    let all = o.all();
    assert!(
        all.contains(&format!("1 epochs from step {start}, {np} rank(s)")),
        "{all}"
    );
    if until > start {
        assert!(
            all.contains(&format!("bit-identical on all {np} ranks at step {until}")),
            "{all}"
        );
        assert_eq!(steps(out).len() as u64, until - start);
    }
}

/// A codec fault on rank 1 only: every rank stops with rank 1's message and a checkpoint.
fn codec_fault_on_rank_1(name: &str, mode: &str, says: &[&str]) {
    if no_mpirun() {
        return;
    }
    let out = scratch(name);
    let codec = [
        "--codec",
        "bad-codec",
        "--set",
        &format!("codec.mode={mode}"),
        "--set",
        "codec.on_rank=1",
        "--set",
        "codec.from_step=3",
    ];
    let o = mpirun(&[job(3, &out, &codec)]);
    assert!(!o.status.success(), "{}", o.all());
    let message = o.same_error(3);
    eprintln!("{name}: stopped after {:.2?}: {message}", o.took);
    assert!(
        message.contains("state before step 3 saved to") && message.contains(": rank 1: plugin "),
        "{message}"
    );
    for s in says {
        assert!(message.contains(s), "{s:?} not in {message}");
    }
    saved_checkpoint(&message);
    assert_eq!(steps(&out).len(), 3);
    // The state before the faulting step resumes there (and would fault again at step 3).
    resumes(
        3,
        &out,
        &scratch(&format!("{name}-resumed")),
        (3, 3),
        &codec,
    );
}

#[test]
fn a_codec_that_traps_on_rank_1_stops_all_three_ranks_with_its_message() {
    codec_fault_on_rank_1(
        "rank-fault-codec-trap",
        "trap",
        &["bad-codec.wasm", "encode at step 3: trapped"],
    );
}

#[test]
fn a_codec_that_loops_on_rank_1_stops_all_three_ranks_when_its_budget_runs_out() {
    codec_fault_on_rank_1(
        "rank-fault-codec-loop",
        "loop",
        &["bad-codec.wasm", "encode at step 3"],
    );
}

#[test]
fn a_policy_that_faults_on_rank_1_only_stops_both_ranks_with_its_message() {
    if no_mpirun() {
        return;
    }
    // `leak` keeps 64 KiB more at every call: under rank 1's 2 MiB cap it faults at step 15,
    // under rank 0's default cap not for thousands of steps. Limits are the host's, not the
    // plugin's parameters, so the start-up check lets them differ.
    let out = scratch("rank-fault-policy-leak");
    let schedule = [
        "--train-subset",
        "960",
        "--schedule",
        "bad-schedule",
        "--set",
        "schedule.mode=leak",
    ];
    let small = [&schedule[..], &["--plugin-memory-mb", "2"]].concat();
    let o = mpirun(&[job(1, &out, &schedule), job(1, &out, &small)]);
    assert!(!o.status.success(), "{}", o.all());
    let message = o.same_error(2);
    eprintln!(
        "policy fault on rank 1: stopped after {:.2?}: {message}",
        o.took
    );
    assert!(
        message.contains("state before step 15 saved to")
            && message.contains(": rank 1: plugin ")
            && message.contains("bad-schedule.wasm: learning-rate at step 15")
            && message.contains("over the 2 MiB cap"),
        "{message}"
    );
    saved_checkpoint(&message);
    assert_eq!(steps(&out).len(), 15);
    // A fresh instance starts with its memory empty: the resume trains on.
    let resumed = scratch("rank-fault-policy-leak-resumed");
    let resume = [
        "--resume",
        out.to_str().unwrap(),
        "--stop-after-steps",
        "17",
    ];
    let o = mpirun(&[
        job(1, &resumed, &[&schedule[..], &resume].concat()),
        job(1, &resumed, &[&small[..], &resume].concat()),
    ]);
    assert!(o.status.success(), "{}", o.all());
    assert!(o.all().contains("from step 15, 2 rank(s)"), "{}", o.all());
    assert_eq!(steps(&resumed).len(), 2);
}

#[test]
fn ranks_started_with_different_plugin_parameters_are_refused_at_start() {
    if no_mpirun() {
        return;
    }
    let out = scratch("rank-fault-mpmd");
    let schedule = |mode: &str| {
        [
            "--schedule".to_string(),
            "bad-schedule".into(),
            "--set".into(),
            format!("schedule.mode={mode}"),
        ]
    };
    let (ok, trap) = (schedule("ok"), schedule("trap"));
    let ok: Vec<&str> = ok.iter().map(String::as_str).collect();
    let trap: Vec<&str> = trap.iter().map(String::as_str).collect();
    let o = mpirun(&[job(1, &out, &ok), job(1, &out, &trap), job(1, &out, &ok)]);
    assert!(!o.status.success(), "{}", o.all());
    let message = o.same_error(3);
    eprintln!("MPMD parameters: stopped after {:.2?}: {message}", o.took);
    assert!(
        message.contains("the ranks did not load the same plugins")
            && message.contains("schedule: rank 1 runs ")
            && message.contains("bad-schedule.wasm with mode=trap, rank 0 with mode=ok"),
        "{message}"
    );
    assert!(!message.contains("rank 2"), "{message}");
    assert!(!out.join("metrics.jsonl").exists());
}

/// `kill -9` of rank `victim` of a 3-rank run in which rank 2 sleeps 2 s before each gradient
/// (ranks 0 and 1 then wait for it in the loss all-reduce): mpirun must exit within the
/// bound, non-zero, naming the lost rank; the newest checkpoint resumes on 3 ranks and on 2.
fn kill_one_rank(name: &str, victim: usize) {
    if no_mpirun() {
        return;
    }
    let out = scratch(name);
    let flags = [
        "--checkpoint-every",
        "1",
        "--slow-rank",
        "2",
        "--slow-ms",
        "2000",
    ];
    let mut job = Job::start(&[self::job(3, &out, &flags)]);
    // Two steps done (each checkpointed), then 0.7 s into the third: rank 2 asleep in its
    // compute, ranks 0 and 1 past theirs and waiting in the collective.
    let metrics = out.join("metrics.jsonl");
    let step_lines = || {
        std::fs::read_to_string(&metrics)
            .map(|s| s.lines().filter(|l| l.contains(r#""kind":"step""#)).count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while step_lines() < 2 {
        assert!(Instant::now() < deadline, "no two steps in 120 s");
        if job.child.try_wait().unwrap().is_some() {
            let o = job.wait();
            panic!("the job ended before its second step:\n{}", o.all());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    let pid = rank_pid(job.child.id(), victim).expect("rank's pid among mpirun's descendants");
    let killed = Instant::now();
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let o = job.wait_from(killed);
    eprintln!(
        "{name}: mpirun exited {:.2?} after kill -9 of rank {victim} (pid {pid}), {}",
        o.took, o.status
    );
    assert!(!o.status.success(), "{}", o.all());
    // Open MPI 4.1 names the rank (its PID it may print as 0).
    assert!(
        o.all().contains(&format!("process rank {victim} with PID"))
            && o.all().contains("exited on signal 9"),
        "the lost rank is not named:\n{}",
        o.all()
    );
    // A resume starts from the newest checkpoint, which may be a step behind the metrics: a
    // step's record is written before its checkpoint, and the kill may fall between the two.
    let done = checkpoint_step(&out).expect("a checkpoint before the kill");
    assert!(done >= 2, "{done}");
    let span = (done, done + 2);
    resumes(3, &out, &scratch(&format!("{name}-on-3")), span, &[]);
    resumes(2, &out, &scratch(&format!("{name}-on-2")), span, &[]);
}

#[test]
fn kill_9_of_a_rank_waiting_in_the_all_reduce_ends_the_job_and_its_checkpoint_resumes() {
    kill_one_rank("rank-fault-kill-mid-collective", 1);
}

#[test]
fn kill_9_of_a_rank_in_its_compute_ends_the_job_and_its_checkpoint_resumes() {
    kill_one_rank("rank-fault-kill-mid-step", 2);
}

/// The 2-rank job with `obstacle` made a directory in its run directory, where rank 0 alone
/// writes a file of that name: rank 0's write fails, and the job must end well within
/// [`BOUND`], under a collective timeout longer than it, with rank 0's own error.
fn rank_0_cannot_write(name: &str, obstacle: &str, extra: &[&str]) -> (Ended, PathBuf) {
    let out = scratch(name);
    std::fs::create_dir_all(out.join(obstacle).join("in-the-way")).unwrap();
    let flags = [&["--collective-timeout", "120"][..], extra].concat();
    let o = mpirun(&[job(2, &out, &flags)]);
    assert!(!o.status.success(), "{}", o.all());
    let own = format!("cannot write {}", out.join(obstacle).display());
    assert!(
        o.rank_stderr(0).contains(&own),
        "rank 0 did not print its own error ({own}):\n{}",
        o.all()
    );
    assert!(!o.all().contains("collective timeout"), "{}", o.all());
    eprintln!("{name}: ended after {:.2?}", o.took);
    (o, out)
}

#[test]
fn a_checkpoint_rank_0_cannot_write_stops_both_ranks_with_its_error() {
    if no_mpirun() {
        return;
    }
    let obstacle = "checkpoint-00000004.safetensors.tmp";
    let (o, out) = rank_0_cannot_write("rank-0-ckpt", obstacle, &["--checkpoint-every", "4"]);
    // Every rank stops at the same checkpoint with rank 0's words; none names a checkpoint.
    let errors = o.errors(2);
    assert!(errors[1].starts_with("rank 0: cannot write "), "{errors:?}");
    assert_eq!(errors[1], format!("rank 0: {}", errors[0]));
    assert!(!o.all().contains("resume with"), "{}", o.all());
    assert_eq!(steps(&out).len(), 4, "the steps before the checkpoint");
    assert!(!out.join("checkpoint.json").exists());
}

#[test]
fn a_metrics_file_rank_0_cannot_write_reaches_the_user_at_once() {
    if no_mpirun() {
        return;
    }
    // Rank 0 alone fails at start-up while rank 1 goes on into the first collective.
    rank_0_cannot_write("rank-0-metrics", "metrics.jsonl.tmp", &[]);
}
