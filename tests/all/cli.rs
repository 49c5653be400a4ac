//! The `lsgd-host` binary end to end: trace (CSV, JSON, plots), inspect, compare exit codes,
//! and error messages for bad input.

use crate::common::*;

const SHAPE: &[&str] = &[
    "--epochs",
    "90",
    "--steps-per-epoch",
    "10",
    "--global-batch",
    "8192",
];

#[test]
fn trace_prints_csv_matching_the_golden_file() {
    let o = lsgd(&[&["trace", "--schedule", "warmup"], SHAPE].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let golden = std::fs::read_to_string(root().join("tests/golden/warmup.csv")).unwrap();
    assert_eq!(stdout(&o), golden);
}

#[test]
fn trace_json_and_plots() {
    let d = scratch("cli-plot");
    let png = d.join("warmup.png");
    let svg = d.join("warmup.svg");
    for (plot, magic) in [(&png, &b"\x89PNG"[..]), (&svg, &b"<svg"[..])] {
        let o = lsgd(
            &[
                &[
                    "trace",
                    "--schedule",
                    "warmup",
                    "--label-smoothing",
                    "label-smoothing",
                    "--format",
                    "json",
                    "--plot",
                    plot.to_str().unwrap(),
                ],
                SHAPE,
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(rows.as_array().unwrap().len(), 900);
        assert_eq!(rows[0]["lr"], 0.1);
        // f32 values are written in their shortest f32 form, as in CSV.
        assert_eq!(rows[0]["label_smoothing"].to_string(), "0.1");
        let bytes = std::fs::read(plot).unwrap();
        assert!(
            bytes.starts_with(magic) && bytes.len() > 5000,
            "{}",
            plot.display()
        );
    }
}

#[test]
fn trace_set_addresses_each_plugin() {
    let o = lsgd(
        &[
            &[
                "trace",
                "--schedule",
                "warmup",
                "--set",
                "schedule.warmup_epochs=0",
                "--set",
                "schedule.milestones=",
            ],
            SHAPE,
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .lines()
            .skip(1)
            .all(|l| l.split(',').nth(2) == Some("3.2"))
    );
    let o = lsgd(
        &[
            &[
                "trace",
                "--schedule",
                "warmup",
                "--set",
                "batch_size.factor=2",
            ],
            SHAPE,
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no --batch-size plugin"),
        "{}",
        stderr(&o)
    );
    let o = lsgd(
        &[
            &[
                "trace",
                "--schedule",
                "warmup",
                "--set",
                "schedule.gama=0.2",
            ],
            SHAPE,
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown parameter `gama`"),
        "{}",
        stderr(&o)
    );
    let o = lsgd(&[&["trace", "--schedule", "nosuchplugin"], SHAPE].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no plugin file `nosuchplugin`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn inspect_describes_the_plugin() {
    let o = lsgd(&["inspect", "warmup"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "world:       schedule-plugin (lsgd:policy@0.1.0)",
        "plugin:      warmup 1.0.0",
        "compile:",
        "warmup_epochs",
        "milestones",
        "30,60,80",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let o = lsgd(&["inspect", "batch-ramp", "--format", "json"]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["world"], "batch-size-plugin");
    assert_eq!(j["wit_version"], "0.1.0");
}

#[test]
fn compare_exit_codes() {
    let same = lsgd(&[&["compare", "warmup", "warmup"], SHAPE].concat());
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    assert!(stdout(&same).contains("result: SAME (bit-identical)"));
    // γ = 0.1 vs 0.1000001: differs from epoch 30 (step 300) on.
    let diff = lsgd(
        &[
            &["compare", "warmup", "warmup", "--set", "b.gamma=0.1000001"],
            SHAPE,
        ]
        .concat(),
    );
    assert_eq!(diff.status.code(), Some(1));
    let out = stdout(&diff);
    assert!(
        out.contains("result: DIFFERENT") && out.contains("first at step 300"),
        "{out}"
    );
    let tolerant = lsgd(
        &[
            &[
                "compare",
                "warmup",
                "warmup",
                "--set",
                "b.gamma=0.1000001",
                "--rtol",
                "1e-5",
            ],
            SHAPE,
        ]
        .concat(),
    );
    assert_eq!(tolerant.status.code(), Some(0), "{}", stdout(&tolerant));
    let kinds = lsgd(&[&["compare", "warmup", "batch-ramp"], SHAPE].concat());
    assert_eq!(kinds.status.code(), Some(2));
    assert!(stderr(&kinds).contains("cannot compare a schedule plugin"));
}
