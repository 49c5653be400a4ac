//! A run directory belongs to one run: `run` refuses an `--out` that holds another run's
//! checkpoints or metrics unless told to continue it (`--resume`) or to replace it
//! (`--overwrite`), and a divergence names the newest checkpoint of this run, or says there is
//! none, never one an earlier run left there.

use std::path::Path;

use crate::common::*;

fn run(args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lsgd(&args)
}

fn files(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_out_holding_another_run_is_refused_unless_resumed_or_overwritten() {
    let out = scratch("run-dir-refuse");
    let first = run(&tiny_at(64, 1, &out, &[]));
    assert!(first.status.success(), "{}", stderr(&first));
    let before = files(&out);
    let again = run(&tiny_at(64, 1, &out, &["--seed", "6"]));
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    let shown = out.display();
    assert!(
        stderr(&again).contains(&format!(
            "error: --out {shown} already holds another run (checkpoint at step 6 and \
             metrics.jsonl with 6 step records); continue it with --resume {shown}, replace it \
             with --overwrite (its checkpoints, metrics and event files are removed), or choose \
             another --out"
        )),
        "{}",
        stderr(&again)
    );
    assert_eq!(files(&out), before, "nothing is touched by a refused run");
    // Continued: the run is over, so resuming it trains nothing and keeps its records.
    let resumed = run(&tiny_at(64, 1, &out, &["--resume", out.to_str().unwrap()]));
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    // Replaced: the old run's files go first, and the new run's records are its own.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let replaced = run(&tiny_at(64, 1, &out, &["--seed", "6", "--overwrite"]));
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    assert!(
        stderr(&replaced).contains("--overwrite: removed the previous run's"),
        "{}",
        stderr(&replaced)
    );
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
    let steps = lsgd_host::train::metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter(|r| r.as_step().is_some())
        .count();
    assert_eq!(steps, 6);
    // Continuing the run in --out with --overwrite too (a launch restart of a job started with
    // it) removes nothing: the checkpoint it continues stays.
    let both = run(&tiny_at(
        64,
        1,
        &out,
        &[
            "--seed",
            "6",
            "--overwrite",
            "--resume",
            out.to_str().unwrap(),
        ],
    ));
    assert!(both.status.success(), "{}", stderr(&both));
    assert!(out.join("checkpoint.json").is_file());
    assert!(
        !stderr(&both).contains("--overwrite: removed"),
        "{}",
        stderr(&both)
    );
}

#[test]
fn a_divergence_names_this_runs_newest_checkpoint_or_says_there_is_none() {
    let out = scratch("run-dir-diverge");
    // An LR of 10^6 sends the mlp's loss to infinity within a few steps.
    let huge = ["--base-lr", "1000000"];
    let with = run(&tiny_at(
        64,
        1,
        &out,
        &[&huge[..], &["--checkpoint-every", "1"]].concat(),
    ));
    let err = stderr(&with);
    assert_eq!(with.status.code(), Some(2), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: training diverged at step "))
        .unwrap_or_else(|| panic!("{err}"));
    let step: u64 = line["error: training diverged at step ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(step >= 1, "{line}");
    assert!(
        line.ends_with(&format!(
            "; the newest checkpoint of this run is {} (step {step})",
            out.join("checkpoint.json").display()
        )),
        "{line}"
    );
    // A new run in its place that writes none says so, though the directory held one.
    let without = run(&tiny_at(
        64,
        1,
        &out,
        &[&huge[..], &["--overwrite"]].concat(),
    ));
    let err = stderr(&without);
    assert!(
        err.lines()
            .any(|l| l.starts_with("error: training diverged at step ")
                && l.ends_with(
                    "; this run wrote no checkpoint (--checkpoint-every N writes one every N steps)"
                )),
        "{err}"
    );
}
