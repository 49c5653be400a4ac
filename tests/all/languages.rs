//! Cross-language regression tests: the plugins written in C, Python, JavaScript and Go
//! (`plugins/*-c`, `*-python`, `*-js`, `*-go`, built by `scripts/build-guests.sh`) against the
//! Rust reference plugins: `lsgd-host compare` bit for bit over whole 90-epoch runs, the same
//! describe(), and the same configure() error messages.
//!
//! They load through the on-disk component cache of the environment (`LSGD_CACHE_DIR`), not a
//! per-process one: compiling an 18 MB Python component takes ~30 s, loading it back ~5 ms.

use std::process::Command;

use lsgd_host::plugin::{Cache, Limits, Plugin, Runtime};

use crate::common::*;

/// The Goyal warmup schedule in every language other than Rust.
const WARMUPS: &[&str] = &["warmup-c", "warmup-python", "warmup-js", "warmup-go"];

/// Every non-Rust plugin with the Rust reference plugin it reproduces.
const TWINS: &[(&str, &str)] = &[
    ("warmup-c", "warmup"),
    ("warmup-python", "warmup"),
    ("warmup-js", "warmup"),
    ("warmup-go", "warmup"),
    ("batch-ramp-c", "batch-ramp"),
    ("label-smoothing-python", "label-smoothing"),
];

/// Goyal et al.'s ImageNet run: 90 epochs at batch 8192 on 32 workers, 100 steps an epoch.
const GOYAL: &[&str] = &[
    "--epochs",
    "90",
    "--steps-per-epoch",
    "100",
    "--global-batch",
    "8192",
    "--world-size",
    "32",
];

/// `lsgd-host compare REFERENCE PLUGIN ARGS...`: (exit code, stdout, stderr).
fn compare(reference: &str, plugin: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_lsgd-host"))
        .arg("compare")
        .arg(plugin_path(reference))
        .arg(plugin_path(plugin))
        .args(args)
        // Bit equality is the point here; the deadline has its own tests (faults.rs), and a
        // busy CI machine that deschedules a 15 µs Python call for 10 ms must not fail this.
        .args(["--plugin-deadline-ms", "1000"])
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_same(reference: &str, plugin: &str, args: &[&str]) {
    let (code, out, err) = compare(reference, plugin, args);
    assert!(
        code == 0 && out.contains("result: SAME (bit-identical)"),
        "{plugin} vs {reference} {args:?}: exit {code}\n{out}{err}"
    );
}

/// A runtime on the environment's component cache (see the module docs).
fn shared_runtime() -> Runtime {
    Runtime::new(Cache::from_env(), Limits::default()).unwrap()
}

fn load(rt: &Runtime, name: &str) -> Plugin {
    rt.load(&plugin_path(name), None).unwrap()
}

#[test]
fn every_language_warmup_is_bit_identical_to_rust_over_90_epochs() {
    for w in WARMUPS {
        assert_same("warmup", w, GOYAL);
        let (_, out, _) = compare("warmup", w, GOYAL);
        assert!(out.contains("over 9000 steps"), "{out}");
    }
}

#[test]
fn every_language_warmup_matches_with_other_parameters() {
    let variants: &[&[&str]] = &[
        &[
            "--set",
            "both.scaling=sqrt",
            "--set",
            "both.warmup_epochs=2.5",
        ],
        &["--set", "both.warmup=constant", "--set", "both.gamma=0.5"],
        &[
            "--set",
            "both.warmup=none",
            "--set",
            "both.milestones=1,2,3.5,50",
        ],
        &["--set", "both.scaling=none", "--set", "both.milestones="],
    ];
    for w in WARMUPS {
        for v in variants {
            assert_same("warmup", w, &[GOYAL, v].concat());
        }
        // Below the reference batch k is 1, and a batch that does not divide evenly.
        assert_same(
            "warmup",
            w,
            &[
                "--epochs",
                "30",
                "--steps-per-epoch",
                "37",
                "--global-batch",
                "200",
                "--reference-batch",
                "256",
            ],
        );
    }
}

#[test]
fn batch_size_and_label_smoothing_outside_rust_match() {
    assert_same("batch-ramp", "batch-ramp-c", GOYAL);
    assert_same(
        "batch-ramp",
        "batch-ramp-c",
        &[
            "--epochs",
            "90",
            "--steps-per-epoch",
            "100",
            "--global-batch",
            "8190",
            "--world-size",
            "7",
            "--set",
            "both.factor=3",
            "--set",
            "both.max_batch=30000",
            "--set",
            "both.milestones=10,20,30,40",
        ],
    );
    assert_same("label-smoothing", "label-smoothing-python", GOYAL);
    for ramp in [
        &["--set", "both.epsilon=0", "--set", "both.final_epsilon=0.2"][..],
        &[
            "--set",
            "both.epsilon=0.3",
            "--set",
            "both.final_epsilon=0.01",
            "--set",
            "both.ramp_start_epoch=10",
            "--set",
            "both.ramp_end_epoch=77.7",
        ],
    ] {
        assert_same(
            "label-smoothing",
            "label-smoothing-python",
            &[GOYAL, ramp].concat(),
        );
    }
}

#[test]
fn compare_catches_a_difference_between_languages() {
    let (code, out, _) = compare(
        "warmup",
        "warmup-go",
        &[GOYAL, &["--set", "b.gamma=0.2"]].concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("first at step 3000"), "{out}");
}

#[test]
fn every_language_describes_itself_like_its_rust_twin() {
    let rt = shared_runtime();
    for (plugin, reference) in TWINS {
        let (p, r) = (load(&rt, plugin), load(&rt, reference));
        assert_eq!(p.info(), r.info(), "{plugin} vs {reference}");
        assert_eq!(p.kind(), r.kind());
    }
}

#[test]
fn every_language_rejects_bad_parameters_with_the_rust_message() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("warmup", &[("warmup_epochs", "-1")]),
        ("warmup", &[("milestones", "60,30")]),
        ("warmup", &[("milestones", "-1.5")]),
        ("warmup", &[("gamma", "-0.000001")]),
        ("batch-ramp", &[("factor", "0")]),
        ("batch-ramp", &[("max_batch", "-5")]),
        ("batch-ramp", &[("milestones", "1,0")]),
        ("label-smoothing", &[("epsilon", "1")]),
        ("label-smoothing", &[("epsilon", "0.999999999")]),
        ("label-smoothing", &[("final_epsilon", "1.5")]),
        (
            "label-smoothing",
            &[("ramp_start_epoch", "10"), ("ramp_end_epoch", "5")],
        ),
    ];
    let rt = shared_runtime();
    for (plugin, reference) in TWINS {
        let (mut p, mut r) = (load(&rt, plugin), load(&rt, reference));
        for (_, settings) in cases.iter().filter(|(k, _)| k == reference) {
            let settings = owned(settings);
            let want = r.configure(&settings).unwrap_err().fault.to_string();
            let got = p.configure(&settings).unwrap_err().fault.to_string();
            assert_eq!(got, want, "{plugin} with {settings:?}");
        }
        // After a rejection the plugin still runs on what it had.
        p.configure(&[]).unwrap();
    }
}
