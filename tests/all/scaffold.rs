//! `lsgd-host new`: a project of every language builds with its one command (`./build.sh`) and
//! loads in the host, for every kind (Rust and Python, the slow builds, for one kind each).
//!
//! The toolchains are the ones `scripts/build-guests.sh` installs (the test command runs it
//! first); a missing one fails the test with that hint rather than skipping it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::*;

fn env_or(var: &str, default: impl FnOnce() -> PathBuf) -> PathBuf {
    std::env::var_os(var).map_or_else(default, PathBuf::from)
}

/// `~/.cache/lsgd-host`, or what scripts/env.sh exported.
fn cache_root() -> PathBuf {
    env_or("LSGD_CACHE_ROOT", || {
        PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/lsgd-host")
    })
}

fn tool(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: run scripts/build-guests.sh (it installs the guest toolchains)",
        path.display()
    );
    path
}

fn lsgd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lsgd-host"))
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Creates `NAME` with `lsgd-host new` in a scratch directory and builds it; returns the component.
fn scaffold_and_build(lang: &str, kind: &str) -> PathBuf {
    let name = format!("my-{lang}-{kind}");
    let dir = scratch(&format!("scaffold-{lang}-{kind}")).join(&name);
    let o = lsgd(&[
        "new",
        "--lang",
        lang,
        "--kind",
        kind,
        &name,
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("./build.sh"), "{}", text(&o));
    let venv = env_or("LSGD_VENV", || cache_root().join("venv"));
    let target = plugin_path("warmup")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let mut build = Command::new("bash");
    build.arg(dir.join("build.sh"));
    match lang {
        "c" | "go" => {
            build.env(
                "LSGD_PLUGIN_BUILD",
                tool(target.join("debug/lsgd-plugin-build")),
            );
        }
        "python" => {
            build.env("COMPONENTIZE_PY", tool(venv.join("bin/componentize-py")));
        }
        "js" => {
            build.env(
                "COMPONENTIZE_QJS",
                tool(cache_root().join("npm/node_modules/.bin/componentize-qjs")),
            );
        }
        // cargo test holds the lock on the workspace's target directory: build elsewhere.
        _ => {
            build.env("CARGO_TARGET_DIR", cache_root().join("scaffold-target"));
        }
    }
    if lang == "go" {
        build
            .env("GO", tool(venv.join("bin/go")))
            .env("GOTOOLCHAIN", "local")
            .env("GOCACHE", cache_root().join("go-build"))
            .env("GOPATH", cache_root().join("go"));
    }
    let o = build.output().unwrap();
    assert!(
        o.status.success(),
        "{lang} {kind}: ./build.sh failed:\n{}",
        text(&o)
    );
    let wasm = dir.join("target").join(format!("{name}.wasm"));
    assert!(wasm.is_file(), "{}", wasm.display());
    wasm
}

/// What each kind's template computes, with its one parameter set to a good and a bad value.
struct Case {
    kind: &'static str,
    flag: &'static str,
    good: &'static str,
    /// CSV column and its value at every step with `good`, for `--global-batch 512`.
    column: usize,
    value: &'static str,
    bad: &'static str,
    error: &'static str,
}

const CASES: &[Case] = &[
    Case {
        kind: "schedule",
        flag: "--schedule",
        good: "schedule.scale=0.5",
        column: 2,
        value: "0.1",
        bad: "schedule.scale=-1",
        error: "scale must be >= 0, got -1",
    },
    Case {
        kind: "batch-size",
        flag: "--batch-size",
        good: "batch_size.factor=3",
        column: 3,
        value: "1536",
        bad: "batch_size.factor=0",
        error: "factor must be in [1, 4294967295], got 0",
    },
    Case {
        kind: "label-smoothing",
        flag: "--label-smoothing",
        good: "label_smoothing.epsilon=0.25",
        column: 4,
        value: "0.25",
        bad: "label_smoothing.epsilon=1",
        error: "epsilon must be in [0, 1), got 1",
    },
];

/// Loads the component in the host: a short trace with a good and with a bad parameter.
fn check_loads(wasm: &Path, case: &Case) {
    let shape = [
        "--epochs",
        "2",
        "--steps-per-epoch",
        "3",
        "--global-batch",
        "512",
    ];
    let w = wasm.to_str().unwrap();
    let o = lsgd(&[&["trace", case.flag, w, "--set", case.good], &shape[..]].concat());
    assert!(o.status.success(), "{w}: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // Six steps at batch 512; fewer when a batch-size policy grows the batch.
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!((1..=6).contains(&rows.len()), "{out}");
    for row in rows {
        assert_eq!(
            row.split(',').nth(case.column),
            Some(case.value),
            "{w}: {out}"
        );
    }
    let o = lsgd(&[&["trace", case.flag, w, "--set", case.bad], &shape[..]].concat());
    assert!(!o.status.success(), "{w} accepted {}", case.bad);
    assert!(text(&o).contains(case.error), "{w}: {}", text(&o));
}

fn scaffold(lang: &str, kinds: &[&str]) {
    for case in CASES.iter().filter(|c| kinds.contains(&c.kind)) {
        check_loads(&scaffold_and_build(lang, case.kind), case);
    }
}

const ALL: &[&str] = &["schedule", "batch-size", "label-smoothing"];

#[test]
fn new_c_plugins_build_and_load() {
    scaffold("c", ALL);
}

#[test]
fn new_js_plugins_build_and_load() {
    scaffold("js", ALL);
}

#[test]
fn new_go_plugins_build_and_load() {
    scaffold("go", ALL);
}

#[test]
fn new_rust_plugin_builds_and_loads() {
    scaffold("rust", &["batch-size"]);
}

#[test]
fn new_python_plugin_builds_and_loads() {
    scaffold("python", &["label-smoothing"]);
}

#[test]
fn new_refuses_bad_names_and_non_empty_directories() {
    let o = lsgd(&["new", "--lang", "c", "--kind", "schedule", "My_Plugin"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("use lowercase letters"), "{}", text(&o));
    let dir = scratch("scaffold-nonempty");
    std::fs::write(dir.join("keep.txt"), "mine").unwrap();
    let o = lsgd(&[
        "new",
        "--lang",
        "go",
        "--kind",
        "schedule",
        "x",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is not empty"), "{}", text(&o));
}

#[test]
fn authoring_guide_shows_exactly_what_new_writes() {
    let guide = std::fs::read_to_string(root().join("docs/authoring.md")).unwrap();
    for (lang, file) in [
        ("rust", "src/lib.rs"),
        ("c", "plugin.c"),
        ("python", "app.py"),
        ("js", "plugin.js"),
        ("go", "plugin.go"),
    ] {
        let dir = scratch(&format!("guide-{lang}"));
        let o = lsgd(&[
            "new",
            "--lang",
            lang,
            "--kind",
            "schedule",
            "my-schedule",
            "--dir",
            dir.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let source = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            guide.contains(&source),
            "docs/authoring.md does not show the {lang} template as `new` writes it"
        );
    }
}
