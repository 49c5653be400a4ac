//! `lsgd-host study NAME --quick` (issue 12): every study trains its jobs, writes a report whose
//! numbers are its runs' metrics and PNGs that decode, and a second call trains nothing.

use std::path::Path;

use crate::common::*;

/// Runs a quick study into `out`; returns its standard error (the job lines).
fn study(name: &str, out: &Path) -> String {
    let o = lsgd(&["study", name, "--quick", "--out", out.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(o.status.success(), "study {name} failed:\n{err}");
    assert_eq!(
        stdout(&o).trim(),
        out.join("report.md").display().to_string()
    );
    err
}

/// The last test accuracy (%) in a job's metrics.jsonl.
fn final_accuracy(job: &Path) -> f64 {
    100.0 * last_accuracy(job)
}

/// The cells of the report's table row that starts with `first` (the first such row).
fn row(report: &str, first: &str) -> Vec<String> {
    row_after(report, "#", first)
}

/// The cells of the first table row starting with `first` after the line starting `heading`.
fn row_after(report: &str, heading: &str, first: &str) -> Vec<String> {
    report
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .find(|l| l.starts_with(&format!("| {first} |")))
        .unwrap_or_else(|| panic!("no row `{first}` in:\n{report}"))
        .trim_matches('|')
        .split(" | ")
        .map(|c| c.trim().to_string())
        .collect()
}

/// The report names the command, seed and commit, and embeds each PNG, which decodes.
fn check_report_frame(out: &Path, report: &str, pngs: &[&str]) {
    assert!(report.contains("- command: `lsgd-host study"), "{report}");
    assert!(report.contains("- seeds: 1\n"), "{report}");
    assert!(report.contains("- commit: "), "{report}");
    assert!(report.contains("libtorch thread(s) per job"), "{report}");
    for png in pngs {
        assert!(report.contains(&format!("]({png})")), "{png} not embedded");
        let path = out.join(png);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (w, h) = png_size(&bytes);
        assert!(w >= 800 && h >= 300, "{png} is {w}×{h}");
    }
}

#[test]
fn goyal_reports_its_runs_and_a_second_call_trains_nothing() {
    let out = scratch("study-goyal");
    let first = study("goyal", &out);
    assert_eq!(first.matches("] b").count(), 4, "{first}");
    assert!(!first.contains("trained earlier"), "{first}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    check_report_frame(&out, &report, &["error-vs-batch.png", "curves.png"]);
    // The reference batch's error is its run's, and the large batch has all three warmups.
    let results = "## Test error against the global batch";
    let reference = row_after(&report, results, "32");
    let err = 100.0 - final_accuracy(&out.join("jobs/b32-gradual-s1"));
    assert_eq!(reference[2], format!("{err:.2}"), "{report}");
    let large = row_after(&report, results, "512");
    assert_eq!(large[1], "16", "k = 512/32");
    for (cell, warmup) in large[2..].iter().zip(["gradual", "constant", "none"]) {
        let job = out.join(format!("jobs/b512-{warmup}-s1"));
        if job.join("study-job.json").is_file() && cell.parse::<f64>().is_ok() {
            assert_eq!(*cell, format!("{:.2}", 100.0 - final_accuracy(&job)));
        } else {
            assert!(cell.starts_with("diverged"), "{warmup}: {cell}");
        }
    }
    // The three warmups differ in the LR of their first steps, as the plugin's parameter says.
    let lr0 = |w: &str| {
        let steps = steps(&out.join(format!("jobs/b512-{w}-s1")));
        steps[0].lr
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(lr0("gradual"), 0.0125), "η/k = 0.2/16");
    assert!(close(lr0("constant"), 0.0125));
    assert!(close(lr0("none"), 0.2), "η = 0.0125·512/32 from step 0");

    let second = study("goyal", &out);
    assert_eq!(second.matches("trained earlier").count(), 4, "{second}");
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        report,
        "the same runs give the same report"
    );
    // A job without its marker (interrupted) is trained again, the others are not.
    std::fs::remove_file(out.join("jobs/b512-none-s1/study-job.json")).unwrap();
    let third = study("goyal", &out);
    assert_eq!(third.matches("trained earlier").count(), 3, "{third}");
    assert!(
        third
            .lines()
            .any(|l| l.contains("b512-none-s1") && !l.contains("trained earlier")),
        "{third}"
    );
}

#[test]
fn batch_control_ramps_the_batch_in_fewer_steps() {
    let out = scratch("study-batch-control");
    study("batch-control", &out);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    check_report_frame(&out, &report, &["curves.png"]);
    let decay = row(&report, "batch 128 fixed, LR 0.05 ÷4 at epochs 1");
    let ramp = row(&report, "batch 128 ×4 at epochs 1, LR 0.05 fixed");
    // 2 epochs of 2,000 samples: 16 steps of 128 then 4 of 512 (the ramp) against 32 of 128.
    assert_eq!((decay[3].as_str(), decay[4].as_str()), ("32", "128"));
    assert_eq!((ramp[3].as_str(), ramp[4].as_str()), ("20", "512"));
    assert_eq!(decay[5], "0.0125", "LR ÷4 after the milestone");
    assert_eq!(ramp[5], "0.0500", "the ramp holds the LR");
    let acc = final_accuracy(&out.join("jobs/ramp-ls-s1"));
    assert!(
        report.contains(&format!("| ε = 0.1 | {acc:.2} |")),
        "{report}"
    );
    let smoothed = steps(&out.join("jobs/ramp-ls-s1"));
    assert!(smoothed.iter().all(|s| s.label_smoothing == 0.1));
    assert!(report.contains("## Findings (computed from the table)"));
}

#[test]
fn layerwise_compares_sgd_lars_and_lamb_past_the_breakdown() {
    let out = scratch("study-layerwise");
    study("layerwise", &out);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    check_report_frame(&out, &report, &["error-vs-batch.png"]);
    for (first, job) in [
        ("SGD (linear scaling, gradual warmup)", "sgd-b512-s1"),
        ("LARS: SGD + `lars`, trust coefficient 0.01", "lars-b512-s1"),
        (
            "LAMB: AdamW + `lamb`, √ scaling, weight decay 0.01",
            "lamb-b512-s1",
        ),
    ] {
        let cells = row(&report, first);
        let job = out.join("jobs").join(job);
        let last = cells.last().unwrap();
        if last.starts_with("diverged") {
            continue;
        }
        assert_eq!(
            *last,
            format!("{:.2}", 100.0 - final_accuracy(&job)),
            "{first}"
        );
    }
    // LAMB's LR is AdamW's, scaled by √k = 4 at the end of warmup.
    let lamb = steps(&out.join("jobs/lamb-b512-s1"));
    let peak = lamb.iter().map(|s| s.lr).fold(0.0, f64::max);
    assert!((peak - 0.00177 * 4.0).abs() < 1e-12, "{peak}");
}

#[test]
fn compression_puts_every_codec_on_the_wire_twice() {
    if no_mpirun() {
        return;
    }
    let out = scratch("study-compression");
    study("compression", &out);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    check_report_frame(&out, &report, &["accuracy-vs-compression.png"]);
    let base = row(&report, "none (fp32 all-reduce)");
    assert_eq!(base[4], "1.0×");
    for codec in ["fp16", "top-k", "sign"] {
        let rows: Vec<&str> = report
            .lines()
            .filter(|l| l.starts_with(&format!("| {codec} |")))
            .collect();
        // The quick plan's one extra row: top-k with DGC's momentum correction.
        let extra = usize::from(codec == "top-k");
        assert_eq!(rows.len(), 2 + extra, "{codec}: off and residual");
        assert!(rows[0].contains("| off |") && rows[1].contains("| residual |"));
    }
    assert!(
        report.contains("| top-k | momentum (DGC) |")
            && report.contains("with DGC's momentum correction"),
        "{report}"
    );
    assert_eq!(row(&report, "fp16")[4], "2.0×");
    assert_eq!(row(&report, "sign")[4], "32.0×");
    // Both ranks ran every job: rank 0's payload is what the codec made of the gradient.
    let fp16 = steps(&out.join("jobs/fp16-noef-np2-s1"));
    let plain = steps(&out.join("jobs/uncompressed-np2-s1"));
    assert_eq!(2 * fp16[0].payload_bytes, plain[0].payload_bytes);
}

/// `study sync --quick` on a lab of its own (`NETLAB_NAME=lsgdstudy`, apart from the netlab
/// tests' `lsgdtest`, so the two may run at once): synchronous, local SGD and DiLoCo with int8
/// Δ on 2 hosts at 1 Gbit/s. The report's cells are the jobs' metrics, local steps send nothing
/// and a window's end sends the model (4× less through int8), both plots decode, and a second
/// call trains nothing and needs no lab. Where the lab cannot run (no root or no network
/// namespaces) it says why and passes.
#[test]
fn sync_study_sets_local_sgd_and_diloco_against_synchronous_on_the_lab() {
    let lab = |args: &[&str]| {
        let mut c = std::process::Command::new("bash");
        c.arg(root().join("scripts/netlab.sh"))
            .args(args)
            .env("NETLAB_NAME", "lsgdstudy")
            .env("NETLAB_NET", "10.80.0")
            .stdin(std::process::Stdio::null());
        c
    };
    let check = lab(&["check"]).output().unwrap();
    if !check.status.success() {
        eprintln!("skipped: {}", stdout(&check).trim());
        return;
    }
    let out = scratch("study-sync");
    let call = || {
        let o = lsgd_command(&["study", "sync", "--quick", "--out", out.to_str().unwrap()])
            .env("NETLAB_NAME", "lsgdstudy")
            .env("NETLAB_NET", "10.80.0")
            .env("LSGD_ROOT", root())
            // The kernel's socket buffers, as the netlab tests' lab has them (tests/all/netlab.rs).
            .env("OMPI_MCA_btl_tcp_sndbuf", "0")
            .output()
            .unwrap();
        let _ = lab(&["down"]).status();
        let err = stderr(&o);
        assert!(o.status.success(), "study sync failed:\n{err}");
        err
    };
    let first = call();
    assert_eq!(first.matches("] 1gbit-np2-").count(), 3, "{first}");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    check_report_frame(
        &out,
        &report,
        &["accuracy-vs-time.png", "accuracy-vs-bytes.png"],
    );
    for text in [
        "## 2 hosts, 1 Gbit/s",
        "time to 40% (s)",
        "## Findings (computed from the tables)",
        "Goyal et al. 2017",
        "about 500× less",
    ] {
        assert!(report.contains(text), "no {text:?} in:\n{report}");
    }
    let jobs = out.join("jobs");
    let sync = steps(&jobs.join("1gbit-np2-synchronous-s1"));
    assert!(sync.iter().all(|s| s.sync.is_none()), "no sync plugin");
    // Windows of 4 steps: three local steps that send nothing, then the average.
    let local = steps(&jobs.join("1gbit-np2-local-sgd-h4-s1"));
    let kinds: Vec<&str> = local.iter().map(|s| s.sync.as_deref().unwrap()).collect();
    assert_eq!(kinds, ["local", "local", "local", "average"].repeat(2));
    assert!(
        local
            .iter()
            .all(|s| (s.bytes_sent == 0) == (s.sync.as_deref() == Some("local")))
    );
    let diloco = steps(&jobs.join("1gbit-np2-diloco-h4-int8-s1"));
    let window_end = |run: &[lsgd_host::train::metrics::StepRecord]| run[3].payload_bytes as f64;
    let ratio = window_end(&local) / window_end(&diloco);
    assert!((3.9..4.1).contains(&ratio), "int8 Δ is 4× smaller: {ratio}");
    // The table's cells are the runs' own figures.
    let mb = |run: &[lsgd_host::train::metrics::StepRecord]| {
        run.iter().map(|s| s.bytes_sent as f64).sum::<f64>() / 1e6
    };
    for (first, job, run) in [
        ("synchronous (fp32 ring, overlapped)", "synchronous", &sync),
        ("local SGD H=4", "local-sgd-h4", &local),
        (
            "DiLoCo H=4, int8 Δ + error feedback",
            "diloco-h4-int8",
            &diloco,
        ),
    ] {
        let cells = row(&report, first);
        let acc = final_accuracy(&jobs.join(format!("1gbit-np2-{job}-s1")));
        assert_eq!(cells[1], format!("{acc:.2}"), "{first}");
        assert_eq!(cells[6], format!("{:.1}", mb(run)), "{first}");
    }
    assert_eq!(
        row(&report, "local SGD H=4")[7],
        format!("{:.0}×", mb(&sync) / mb(&local))
    );

    let second = call();
    assert_eq!(second.matches("trained earlier").count(), 3, "{second}");
    assert!(
        !second.contains("netlab: 2 host(s) up"),
        "no lab for finished jobs"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("report.md")).unwrap(),
        report,
        "the same runs give the same report"
    );
}
