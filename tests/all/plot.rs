//! `lsgd-host plot` comparing runs: PNG and SVG with a legend, labels from directories or
//! `--label`, and clear errors.

use std::path::{Path, PathBuf};

use crate::common::*;

/// A run directory whose metrics.jsonl has 8 steps over 2 epochs at `batch` and 2 evaluations;
/// LR and ε are the same in every run.
fn fake_run(dir: &Path, batch: u32, acc: f64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let mut lines = Vec::new();
    for step in 0..8u64 {
        lines.push(serde_json::json!({
            "kind": "step", "step": step, "epoch": step as f64 / 4.0, "lr": 0.1,
            "global_batch": batch, "micro_batches": 1, "label_smoothing": 0.0,
            "loss": 2.3 - step as f64 * 0.1 * acc, "samples_per_s": 100.0, "compute_s": 0.01,
            "communication_s": 0.0, "policy_s": 0.0,
        }));
        if step % 4 == 3 {
            let epoch = step / 4 + 1;
            lines.push(serde_json::json!({
                "kind": "eval", "step": step + 1, "epoch": epoch, "test_loss": 1.0 / acc,
                "test_acc": acc * epoch as f64 / 2.0, "elapsed_s": 1.0,
            }));
        }
    }
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
    dir.to_path_buf()
}

/// A path as the `&str` an argument list takes.
fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn compares_runs_with_a_legend_in_png_and_svg() {
    let d = scratch("plot-compare");
    let a = fake_run(&d.join("seed1/b256"), 256, 0.8);
    let b = fake_run(&d.join("seed2/b256"), 256, 0.7);
    let c = fake_run(&d.join("seed2/b1024"), 1024, 0.6);

    // Run directories (one given by its metrics.jsonl) named by their shortest distinct suffix.
    let svg = d.join("compare.svg");
    let o = lsgd(&[
        "plot",
        s(&a),
        s(&b.join("metrics.jsonl")),
        s(&c),
        "-o",
        s(&svg),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    for label in ["seed1/b256", "seed2/b256", "b1024", "test accuracy"] {
        assert!(
            text.contains(label),
            "{label} missing from {}",
            svg.display()
        );
    }
    // LR and ε are the same constant in every run: those panels are left out.
    assert!(!text.contains("learning rate"), "{}", svg.display());
    assert!(text.contains("global batch"), "{}", svg.display());

    let png = d.join("compare.png");
    let o = lsgd(&[
        "plot",
        s(&a),
        s(&c),
        "--label",
        "small batch",
        "--label",
        "large batch",
        "--title",
        "batches",
        "-o",
        s(&png),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Four panels of 300 px (training loss, test loss, test accuracy, global batch) + title.
    assert_eq!(
        png_size(&std::fs::read(&png).unwrap()),
        (1000, 4 * 300 + 40)
    );

    // The same labels reach the SVG's legend.
    let o = lsgd(&[
        "plot",
        s(&a),
        s(&c),
        "--label",
        "small batch",
        "--label",
        "large batch",
        "-o",
        s(&svg),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("small batch") && text.contains("large batch"));
    assert!(!text.contains("b1024"), "{}", svg.display());

    // One run: all six panels, no legend, as before compare mode existed.
    let one = d.join("one.png");
    let o = lsgd(&["plot", s(&a), "-o", s(&one)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        png_size(&std::fs::read(&one).unwrap()),
        (1000, 6 * 300 + 40)
    );
}

#[test]
fn a_label_count_other_than_the_run_count_and_missing_metrics_are_errors() {
    let d = scratch("plot-errors");
    let a = fake_run(&d.join("a"), 64, 0.5);
    let b = fake_run(&d.join("b"), 128, 0.5);
    let out = d.join("x.png");
    let o = lsgd(&["plot", s(&a), s(&b), "--label", "only one", "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("1 --label for 2 runs"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());

    let empty = d.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = lsgd(&["plot", s(&a), s(&empty), "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&empty.join("metrics.jsonl").display().to_string()),
        "{}",
        stderr(&o)
    );

    std::fs::write(empty.join("metrics.jsonl"), "\n").unwrap();
    let o = lsgd(&["plot", s(&a), s(&empty), "-o", s(&out)]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&format!(
            "{} holds no records",
            empty.join("metrics.jsonl").display()
        )),
        "{}",
        stderr(&o)
    );
}
