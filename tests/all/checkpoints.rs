//! Crash-safe checkpoints: `kill -9` of a run stalled at each phase of a checkpoint write
//! (`LSGD_CHECKPOINT_STALL`), and at random moments, always leaves a checkpoint that `--resume
//! DIR` finds and continues bit for bit; damaged generations are skipped with the file and the
//! reason named; `--keep-checkpoints` bounds the generations kept; a rank killed mid-checkpoint
//! under `mpirun` ends the job and the checkpoint resumes on 3 ranks and on 2. They need
//! Debian's `dataset-fashion-mnist`, like tests/all/train.rs.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lsgd_host::train::checkpoint;

use crate::common::*;

/// `run` flags of a tiny deterministic CPU job: an MLP, 12 steps of 32 on 384 samples.
fn tiny(out: &Path, extra: &[&str]) -> Vec<String> {
    tiny_at(32, 1, out, extra)
}

/// `lsgd-host ARGS` with the built plugins and the CLI tests' cache, as `common::lsgd` runs it.
fn command(args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lsgd-host"));
    c.args(args)
        .env("LSGD_PLUGIN_PATH", plugin_path("warmup").parent().unwrap())
        .env("LSGD_CACHE_DIR", scratch_cache())
        .env_remove(checkpoint::STALL_ENV);
    c
}

fn run(args: &[String]) -> Output {
    command(args).output().unwrap()
}

/// The weights of the tiny job run straight through, once per test process.
fn straight_weights() -> &'static str {
    static W: OnceLock<String> = OnceLock::new();
    W.get_or_init(|| {
        let out = scratch("ckpt-straight");
        let o = run(&tiny(&out, &[]));
        assert!(o.status.success(), "{}", stderr(&o));
        weights(&o)
    })
}

/// Reads `child`'s stderr line by line until one contains `needle`; returns what was read.
fn read_until(stderr: &mut impl BufRead, needle: &str) -> String {
    let mut seen = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        let n = stderr.read_line(&mut line).unwrap();
        seen.push_str(&line);
        if n == 0 || line.contains(needle) {
            return seen;
        }
    }
}

/// The generation JSONs in `out`, sorted.
fn generations(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("checkpoint-") && n.ends_with(".json"))
        .collect();
    v.sort();
    v
}

/// The files in `out` whose names end with `suffix`.
fn files_ending(out: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

/// Stalls the tiny job at `phase` of step 5's checkpoint, kills it there, resumes: the resume
/// must say it used `expected` and end with the straight run's weights.
fn killed_at(phase: &str, expected: &str) {
    killed_at_then(phase, expected, "", |_| {});
}

/// [`killed_at`], with `damage` done to the run directory between the kill and the resume;
/// returns the run directory.
fn killed_at_then(phase: &str, expected: &str, name: &str, damage: impl FnOnce(&Path)) -> PathBuf {
    let out = scratch(&format!("ckpt-phase-{phase}{name}"));
    let started = Instant::now();
    let mut child: Child = command(&tiny(&out, &["--checkpoint-every", "1"]))
        .env(checkpoint::STALL_ENV, format!("{phase}:60000:5"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let seen = read_until(&mut err, "checkpoint stall");
    assert!(
        seen.contains(&format!("checkpoint stall {phase} ")),
        "the run did not stall at {phase}:\n{seen}"
    );
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    let killed = started.elapsed();
    damage(&out);

    let o = run(&tiny(
        &out,
        &["--checkpoint-every", "1", "--resume", out.to_str().unwrap()],
    ));
    let e = stderr(&o);
    assert!(o.status.success(), "resume after a kill at {phase}:\n{e}");
    let used = format!("resume: using {}", out.join(expected).display());
    assert!(e.contains(&used), "expected `{used}` after {phase}:\n{e}");
    assert!(!e.contains("skipped"), "{e}");
    assert_eq!(weights(&o), straight_weights(), "after a kill at {phase}");
    // The next saves removed the killed writer's temp files and pruned to the default 2.
    assert_eq!(
        generations(&out),
        ["checkpoint-00000011.json", "checkpoint-00000012.json"]
    );
    assert!(
        files_ending(&out, ".tmp").is_empty(),
        "{:?}",
        files_ending(&out, ".tmp")
    );
    assert_eq!(files_ending(&out, ".safetensors").len(), 2);
    eprintln!(
        "{phase}: killed after {:.2} s; {}",
        killed.as_secs_f64(),
        e.lines().find(|l| l.starts_with("resume: using")).unwrap()
    );
    out
}

#[test]
fn kill_while_the_tensors_are_written_resumes_from_the_previous_checkpoint() {
    killed_at("tensors-written", "checkpoint-00000004.json");
}

#[test]
fn a_torn_last_metrics_line_does_not_stop_the_resume() {
    // What a kill between two flushes leaves: the last record cut off mid-line.
    let tear = |out: &Path| {
        let path = out.join("metrics.jsonl");
        let text = std::fs::read(&path).unwrap();
        assert!(
            text.ends_with(b"}\n"),
            "metrics.jsonl ends in a whole record"
        );
        std::fs::write(&path, &text[..text.len() - 20]).unwrap();
    };
    let out = killed_at_then("tensors-written", "checkpoint-00000004.json", "-torn", tear);
    let done: Vec<u64> = steps(&out).iter().map(|s| s.step).collect();
    assert_eq!(
        done,
        (0..12).collect::<Vec<u64>>(),
        "each step recorded once"
    );
}

#[test]
fn kill_after_the_tensors_are_renamed_resumes_from_the_previous_checkpoint() {
    killed_at("tensors-renamed", "checkpoint-00000004.json");
}

#[test]
fn kill_while_the_json_is_written_resumes_from_the_previous_checkpoint() {
    killed_at("json-written", "checkpoint-00000004.json");
}

#[test]
fn kill_after_the_generation_json_is_in_place_resumes_from_it() {
    killed_at("json-renamed", "checkpoint-00000005.json");
}

#[test]
fn kill_before_pruning_resumes_from_the_new_checkpoint() {
    killed_at("pruning", "checkpoint-00000005.json");
}

#[test]
fn kills_at_random_moments_always_leave_a_valid_checkpoint() {
    // Two epochs in batches of 8: 96 steps, each checkpointed, so a kill lands in a write often.
    let job = |out: &Path, extra: &[&str]| {
        tiny_at(8, 2, out, &[&["--checkpoint-every", "1"], extra].concat())
    };
    let reference = scratch("ckpt-random-straight");
    let o = run(&job(&reference, &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    let straight = weights(&o);

    let out = scratch("ckpt-random-kills");
    let started = Instant::now();
    // xorshift64, seeded: the same delays on every run of the test.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut resumed_from, mut cut_short) = (Vec::new(), 0);
    for i in 0..10 {
        let dir = out.to_str().unwrap();
        let valid = checkpoint::newest_valid(&out);
        let extra: &[&str] = if valid.is_ok() {
            &["--resume", dir]
        } else {
            &[]
        };
        resumed_from.push(valid.map_or(0, |l| l.meta.step));
        let mut child = command(&job(&out, extra))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        // Startup (data, plugins) takes longer than the training itself: the random delay
        // starts when training does.
        let mut seen = read_until(&mut err, "training ");
        let delay = Duration::from_millis(next() % 500);
        std::thread::sleep(delay);
        let _ = child.kill();
        let status = child.wait().unwrap();
        err.read_to_string(&mut seen).unwrap();
        assert!(
            seen.contains("training ") && !seen.contains("Error"),
            "run {i} failed before the kill:\n{seen}"
        );
        cut_short += usize::from(!files_ending(&out, ".tmp").is_empty());
        // After the first checkpoint there is always a valid one, whatever was cut short.
        let found = checkpoint::newest_valid(&out);
        if let Err(e) = &found
            && !generations(&out).is_empty()
        {
            panic!("kill {i} {delay:?} into training ({status}) left no valid checkpoint: {e}");
        }
    }
    // A last resume runs to the end with the weights of the run never killed.
    let dir = out.to_str().unwrap();
    let o = run(&job(&out, &["--resume", dir]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(weights(&o), straight);
    eprintln!(
        "10 kills at random moments ({cut_short} left a .tmp file) and a last resume took \
         {:.1} s; the runs started from steps {resumed_from:?}",
        started.elapsed().as_secs_f64()
    );
}

/// A run directory with generations 4, 5 and 6 (`--keep-checkpoints 3` after 6 checkpoints),
/// made once; each test damages a copy.
fn three_generations() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = scratch("ckpt-keep-3");
        let o = run(&tiny(
            &out,
            &[
                "--checkpoint-every",
                "1",
                "--keep-checkpoints",
                "3",
                "--stop-after-steps",
                "6",
            ],
        ));
        assert!(o.status.success(), "{}", stderr(&o));
        out
    })
}

fn copy_of_three_generations(name: &str) -> PathBuf {
    let dir = scratch(name);
    for e in std::fs::read_dir(three_generations()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

/// Resumes `out` for one more step than its newest checkpoint allows at most.
fn resume(out: &Path) -> Output {
    run(&tiny(
        out,
        &["--resume", out.to_str().unwrap(), "--stop-after-steps", "7"],
    ))
}

fn truncate(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

#[test]
fn keep_checkpoints_3_leaves_exactly_3_generations() {
    let out = three_generations();
    assert_eq!(
        generations(out),
        [
            "checkpoint-00000004.json",
            "checkpoint-00000005.json",
            "checkpoint-00000006.json"
        ]
    );
    let mut tensors = files_ending(out, ".safetensors");
    tensors.sort();
    assert_eq!(
        tensors,
        [
            "checkpoint-00000004.safetensors",
            "checkpoint-00000005.safetensors",
            "checkpoint-00000006.safetensors"
        ]
    );
    // checkpoint.json is the newest generation's JSON (the `stopped` one, which replaced the
    // periodic checkpoint of the same step).
    assert_eq!(
        std::fs::read(out.join("checkpoint.json")).unwrap(),
        std::fs::read(out.join("checkpoint-00000006.json")).unwrap()
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(meta["reason"], "stopped");
    assert_eq!(meta["config"]["keep_checkpoints"], 3);
}

#[test]
fn a_truncated_tensor_file_is_skipped_with_its_name_and_reason() {
    let out = copy_of_three_generations("ckpt-truncated");
    truncate(&out.join("checkpoint-00000006.safetensors"));
    let o = resume(&out);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "resume: skipped checkpoint-00000006.json: checkpoint-00000006.safetensors is damaged: blake3"
        ) && e.contains("(truncated or corrupted)"),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "resume: using {} (step 5, periodic), the newest valid checkpoint",
            out.join("checkpoint-00000005.json").display()
        )),
        "{e}"
    );
    // checkpoint.json, a copy of generation 6's JSON, is not reported a second time.
    assert_eq!(e.matches("resume: skipped").count(), 1, "{e}");
    // Named explicitly, the damaged checkpoint is refused, naming the tensor file.
    let o = run(&tiny(
        &out,
        &[
            "--resume",
            out.join("checkpoint-00000006.json").to_str().unwrap(),
        ],
    ));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{} is damaged",
            out.join("checkpoint-00000006.safetensors").display()
        )),
        "{e}"
    );
}

#[test]
fn a_corrupted_json_is_skipped_and_its_copy_used_then_the_previous_generation() {
    let out = copy_of_three_generations("ckpt-bad-json");
    std::fs::write(
        out.join("checkpoint-00000006.json"),
        b"{\"format\": \"lsgd-h",
    )
    .unwrap();
    let o = resume(&out);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "resume: skipped checkpoint-00000006.json: checkpoint-00000006.json is not an \
             lsgd-host checkpoint JSON (truncated or corrupted? 18 bytes)"
        ),
        "{e}"
    );
    // checkpoint.json holds the same step and names intact tensors.
    assert!(
        e.contains(&format!(
            "resume: using {} (step 6, stopped)",
            out.join("checkpoint.json").display()
        )),
        "{e}"
    );

    let out = copy_of_three_generations("ckpt-bad-jsons");
    for name in ["checkpoint-00000006.json", "checkpoint.json"] {
        truncate(&out.join(name));
    }
    let o = resume(&out);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    for name in ["checkpoint-00000006.json", "checkpoint.json"] {
        assert!(
            e.contains(&format!(
                "resume: skipped {name}: {name} is not an lsgd-host checkpoint JSON"
            )),
            "{e}"
        );
    }
    assert!(
        e.contains(&format!(
            "resume: using {} (step 5",
            out.join("checkpoint-00000005.json").display()
        )),
        "{e}"
    );
}

#[test]
fn a_missing_tensor_file_is_skipped_and_when_all_are_bad_the_error_names_every_file() {
    let out = copy_of_three_generations("ckpt-missing");
    std::fs::remove_file(out.join("checkpoint-00000006.safetensors")).unwrap();
    let o = resume(&out);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(
            "resume: skipped checkpoint-00000006.json: its tensor file \
             checkpoint-00000006.safetensors is missing"
        ),
        "{e}"
    );
    assert!(e.contains("checkpoint-00000005.json (step 5"), "{e}");

    let out = copy_of_three_generations("ckpt-all-bad");
    std::fs::remove_file(out.join("checkpoint-00000006.safetensors")).unwrap();
    truncate(&out.join("checkpoint-00000005.safetensors"));
    std::fs::write(out.join("checkpoint-00000004.json"), b"not json").unwrap();
    let o = resume(&out);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains(&format!("no valid checkpoint in {}", out.display())),
        "{e}"
    );
    for line in [
        "checkpoint-00000006.json: its tensor file checkpoint-00000006.safetensors is missing",
        "checkpoint-00000005.json: checkpoint-00000005.safetensors is damaged: blake3",
        "checkpoint-00000004.json: checkpoint-00000004.json is not an lsgd-host checkpoint JSON",
    ] {
        assert!(e.contains(line), "no `{line}` in\n{e}");
    }
}

/// A JSON whose tensor file is not a file beside it (a device, a path out of the run
/// directory) is skipped before anything is read.
#[test]
fn a_json_naming_a_tensor_file_elsewhere_is_skipped_unread() {
    let out = copy_of_three_generations("ckpt-elsewhere");
    for (json, tensors) in [
        ("checkpoint-00000006.json", "/dev/zero"),
        ("checkpoint.json", "../checkpoint-00000006.safetensors"),
    ] {
        let path = out.join(json);
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        meta["tensors"] = tensors.into();
        std::fs::write(&path, serde_json::to_vec(&meta).unwrap()).unwrap();
    }
    let o = resume(&out);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("names the tensor file `/dev/zero`, not a *.safetensors file beside it"),
        "{e}"
    );
    assert!(e.contains("checkpoint-00000005.json (step 5"), "{e}");
}

/// `mpirun -np N lsgd-host` with the tiny job's flags at global batch 48 (8 steps; divisible
/// by 3 and by 2), plus `extra`.
fn mpirun_tiny(n: usize, out: &Path, extra: &[&str]) -> Command {
    let mut c = mpirun_command();
    c.args(["-np", &n.to_string(), env!("CARGO_BIN_EXE_lsgd-host")])
        .args(tiny_at(48, 1, out, extra))
        .env_remove(checkpoint::STALL_ENV);
    c
}

#[test]
fn killing_rank_0_mid_checkpoint_ends_the_job_and_the_checkpoint_resumes_on_3_and_2_ranks() {
    if no_mpirun() {
        return;
    }
    let out = scratch("ckpt-mpi");
    let mut job = mpirun_tiny(3, &out, &["--checkpoint-every", "1"])
        .env(checkpoint::STALL_ENV, "json-written:60000:4")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(job.stderr.take().unwrap());
    let seen = read_until(&mut err, "checkpoint stall");
    let pid = seen
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint stall json-written "))
        .and_then(|l| l.rsplit_once(" pid "))
        .map(|(_, pid)| pid.trim().to_string())
        .unwrap_or_else(|| panic!("no stall line from rank 0:\n{seen}"));
    let killed = Instant::now();
    let k = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(k.success());
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        rest
    });
    let status = wait_at_most(&mut job, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("mpirun still running 30 s after rank 0 was killed"));
    let stopped = killed.elapsed();
    let rest = drain.join().unwrap();
    assert!(
        !status.success(),
        "mpirun succeeded after a rank was killed:\n{rest}"
    );
    eprintln!(
        "mpirun exited ({status}) {:.2} s after rank 0 was killed mid-checkpoint",
        stopped.as_secs_f64()
    );

    // The newest valid checkpoint (step 3: step 4's JSON was never renamed) resumes on the
    // same 3 ranks and, resharded, on 2.
    let two = scratch("ckpt-mpi-2");
    for e in std::fs::read_dir(&out).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), two.join(e.file_name())).unwrap();
    }
    for (n, dir) in [(3, &out), (2, &two)] {
        let o = mpirun_tiny(n, dir, &["--resume", dir.to_str().unwrap()])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert!(o.status.success(), "resume on {n} ranks:\n{e}");
        assert!(
            e.contains(&format!(
                "resume: using {} (step 3, periodic)",
                dir.join("checkpoint-00000003.json").display()
            )),
            "{e}"
        );
        assert_eq!(
            e.matches("resume: using").count(),
            1,
            "only rank 0 says it:\n{e}"
        );
        assert!(
            e.contains(&format!("bit-identical on all {n} ranks at step 8")),
            "{e}"
        );
        assert_eq!(
            steps(dir).iter().map(|s| s.step).collect::<Vec<_>>(),
            (0..8).collect::<Vec<_>>()
        );
    }
}
