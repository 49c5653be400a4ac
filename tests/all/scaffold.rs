//! `lsgd-host new`: a project of every language and kind builds with its one command
//! (`./build.sh`) into a component of contract 0.3.0 exporting `plugin` and its kind's interface,
//! and loads in the host: a short trace with a good and with a bad parameter, and the command
//! `new` suggests. Python components, the slowest to load (~18 MiB that take ~30 s to compile),
//! are loaded for two kinds only; the exports of all are read without compiling them.
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

pub fn lsgd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lsgd-host"))
        .args(args)
        .output()
        .unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The contract version `new` scaffolds.
const VERSION: &str = "0.3.0";

/// The `lsgd-plugin-build` that `scripts/build-guests.sh` builds.
fn plugin_build() -> PathBuf {
    let target = plugin_path("warmup")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    tool(target.join("debug/lsgd-plugin-build"))
}

/// Creates `NAME` with `lsgd-host new` in a scratch directory and builds it; returns the
/// component and what `new` printed.
fn scaffold_and_build(lang: &str, kind: &str) -> (PathBuf, String) {
    let name = format!("my-{lang}-{kind}");
    let (dir, hint) = new_project(lang, kind, &name);
    (build_project(lang, &dir, &name), hint)
}

/// Creates the project `name` with `lsgd-host new` in a scratch directory; returns its
/// directory and what `new` printed.
pub fn new_project(lang: &str, kind: &str, name: &str) -> (PathBuf, String) {
    let dir = scratch(&format!("scaffold-{name}")).join(name);
    let o = lsgd(&[
        "new",
        "--lang",
        lang,
        "--kind",
        kind,
        name,
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let hint = text(&o);
    assert!(hint.contains("./build.sh"), "{hint}");
    (dir, hint)
}

/// Builds the project in `dir` with its `./build.sh` as a user would on a machine where
/// lsgd-host's setup ran: no variable names a tool (the build finds componentize-py,
/// componentize-qjs and Go where setup put them), except lsgd-plugin-build, this
/// repository's own tool, for C and Go. Returns the component.
pub fn build_project(lang: &str, dir: &Path, name: &str) -> PathBuf {
    let mut build = Command::new("bash");
    build.arg(dir.join("build.sh"));
    for var in [
        "COMPONENTIZE_PY",
        "COMPONENTIZE_QJS",
        "GO",
        "LSGD_PLUGIN_BUILD",
    ] {
        build.env_remove(var);
    }
    match lang {
        "c" | "go" => {
            build.env("LSGD_PLUGIN_BUILD", plugin_build());
        }
        // cargo test holds the lock on the workspace's target directory: build elsewhere.
        "rust" => {
            build.env("CARGO_TARGET_DIR", cache_root().join("scaffold-target"));
        }
        _ => {}
    }
    let o = build.output().unwrap();
    assert!(
        o.status.success(),
        "{lang} {name}: ./build.sh failed:\n{}",
        text(&o)
    );
    let wasm = dir.join("target").join(format!("{name}.wasm"));
    assert!(wasm.is_file(), "{}", wasm.display());
    wasm
}

/// The component exports `lsgd:policy/plugin@0.3.0` and `lsgd:policy/KIND@0.3.0`, and nothing
/// else of the contract (toolchains may add their own exports: componentize-qjs's `init`).
/// Read from the binary by `lsgd-plugin-build exports`, so that no compilation is needed.
fn check_exports(wasm: &Path, kind: &str) {
    let o = Command::new(plugin_build())
        .arg("exports")
        .arg(wasm)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let mut ours: Vec<&str> = out
        .lines()
        .filter(|e| e.starts_with("lsgd:policy/"))
        .collect();
    ours.sort_unstable();
    let mut want = [
        format!("lsgd:policy/plugin@{VERSION}"),
        format!("lsgd:policy/{kind}@{VERSION}"),
    ];
    want.sort_unstable();
    assert_eq!(ours, want, "{}: exports\n{out}", wasm.display());
}

/// What each kind's template computes, with its one parameter set to a good and a bad value.
struct Case {
    kind: &'static str,
    flag: &'static str,
    good: &'static str,
    /// CSV columns and their value at every step with `good`, for `--global-batch 512` (and
    /// for a layer-rate plugin, the tensors of [`NORMS`]).
    values: &'static [(&'static str, &'static str)],
    bad: &'static str,
    error: &'static str,
}

/// Tensor norms for the layer-rate template: a weight it scales, and those it leaves at 1 (a
/// bias, a BatchNorm tensor, a weight without a gradient, a weight of norm 0).
const NORMS: &str = "step,name,role,shape,weight_norm,grad_norm,update_norm,weight_decay
0,conv.weight,weight,8x1x3x3,2,0.5,0.5,0.0001
0,conv.bias,bias,8,0.5,0.1,0.1,0
0,bn.weight,batchnorm,8,3,0.2,0.2,0
0,fc.weight,weight,10x8,1.5,0,0,0.0001
0,new.weight,weight,4x4,0,0.3,0.3,0.0001
";

const CASES: &[Case] = &[
    Case {
        kind: "schedule",
        flag: "--schedule",
        good: "schedule.scale=0.5",
        values: &[("lr", "0.1")],
        bad: "schedule.scale=-1",
        error: "scale must be >= 0, got -1",
    },
    Case {
        kind: "batch-size",
        flag: "--batch-size",
        good: "batch_size.factor=3",
        values: &[("global_batch", "1536")],
        bad: "batch_size.factor=0",
        error: "factor must be in [1, 4294967295], got 0",
    },
    Case {
        kind: "label-smoothing",
        flag: "--label-smoothing",
        good: "label_smoothing.epsilon=0.25",
        values: &[("label_smoothing", "0.25")],
        bad: "label_smoothing.epsilon=1",
        error: "epsilon must be in [0, 1), got 1",
    },
    Case {
        kind: "layer-rate",
        flag: "--layer-rate",
        good: "layer_rate.coefficient=0.02",
        values: &[
            // 0.02 x 2 / (0.5 + 0.0001 x 2), rounded as every language's f64 arithmetic does.
            ("scale:conv.weight", "0.07996801279488205"),
            ("scale:conv.bias", "1"),
            ("scale:bn.weight", "1"),
            ("scale:fc.weight", "1"),
            ("scale:new.weight", "1"),
            ("lr", "0.1"),
        ],
        bad: "layer_rate.coefficient=-1",
        error: "coefficient must be >= 0, got -1",
    },
];

/// Loads the component in the host: a short trace with a good and with a bad parameter, then
/// the trace `new` suggested (`hint`, its output), which for a layer-rate project reads the
/// project's sample `norms.csv`.
fn check_loads(wasm: &Path, case: &Case, hint: &str) {
    let mut shape = vec![
        "--epochs",
        "2",
        "--steps-per-epoch",
        "3",
        "--global-batch",
        "512",
    ];
    let norms = wasm.parent().unwrap().join("test-norms.csv");
    if case.kind == "layer-rate" {
        std::fs::write(&norms, NORMS).unwrap();
        shape.extend(["--norms-file", norms.to_str().unwrap()]);
    }
    let w = wasm.to_str().unwrap();
    let o = lsgd(&[&["trace", case.flag, w, "--set", case.good], &shape[..]].concat());
    assert!(o.status.success(), "{w}: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let header: Vec<&str> = out.lines().next().unwrap_or_default().split(',').collect();
    // Six steps at batch 512; fewer when a batch-size policy grows the batch.
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert!((1..=6).contains(&rows.len()), "{out}");
    for (column, value) in case.values {
        let i = header.iter().position(|h| h == column);
        let i = i.unwrap_or_else(|| panic!("{w}: no column {column}:\n{out}"));
        for row in &rows {
            assert_eq!(row.split(',').nth(i), Some(*value), "{w}: {column}\n{out}");
        }
    }
    let o = lsgd(&[&["trace", case.flag, w, "--set", case.bad], &shape[..]].concat());
    assert!(!o.status.success(), "{w} accepted {}", case.bad);
    assert!(text(&o).contains(case.error), "{w}: {}", text(&o));
    // The suggested command, with a deadline a busy machine cannot miss over 9000 calls.
    let line = hint.lines().find_map(|l| l.strip_prefix("try it:"));
    let args: Vec<&str> = line
        .unwrap_or_else(|| panic!("{hint}"))
        .split_whitespace()
        .collect();
    assert_eq!(args[..2], ["lsgd-host", "trace"], "{hint}");
    let o = lsgd(&[&args[1..], &["--plugin-deadline-ms", "1000"]].concat());
    assert!(o.status.success(), "{hint}: {}", text(&o));
    assert_eq!(
        o.stdout.iter().filter(|b| **b == b'\n').count(),
        9001,
        "{hint}"
    );
}

/// Scaffolds, builds and checks the exports of a `lang` project of every kind; loads those of
/// `load` in the host.
fn scaffold(lang: &str, load: &[&str]) {
    for case in CASES {
        let (wasm, hint) = scaffold_and_build(lang, case.kind);
        check_exports(&wasm, case.kind);
        if load.contains(&case.kind) {
            check_loads(&wasm, case, &hint);
        }
    }
}

/// Every kind `new` scaffolds.
const ALL: &[&str] = &["schedule", "batch-size", "label-smoothing", "layer-rate"];

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
fn new_rust_plugins_build_and_load() {
    scaffold("rust", ALL);
}

#[test]
fn new_python_plugins_build_and_load() {
    scaffold("python", &["label-smoothing", "layer-rate"]);
}

#[test]
fn new_writes_the_0_3_contract_and_a_layer_rate_project_documents_its_use() {
    let dir = scratch("scaffold-layer-rate-files");
    let o = lsgd(&[
        "new",
        "--lang",
        "go",
        "--kind",
        "layer-rate",
        "my-lars",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let wit = std::fs::read_to_string(root().join("wit/v0.3.0/policy.wit")).unwrap();
    assert_eq!(read("wit/policy.wit"), wit);
    let readme = read("README.md");
    for needle in [
        "lsgd:policy@0.3.0",
        "`layer-rate-plugin` world",
        "lsgd-host run --layer-rate ./target/my-lars.wasm --set layer_rate.KEY=VALUE",
        "lsgd-host trace --layer-rate target/my-lars.wasm --norms-file norms.csv",
    ] {
        assert!(
            readme.contains(needle),
            "README.md lacks {needle}:\n{readme}"
        );
    }
    assert!(!readme.contains("{{"), "{readme}");
    // The Go kit's exports are written at the scaffolded version, whatever version the kit's
    // own files (shared with the repository's Go plugins) carry.
    for file in ["lsgd_plugin.go", "lsgd_layer_rate.go"] {
        let go = read(file);
        let exports: Vec<&str> = go
            .lines()
            .filter_map(|l| l.strip_prefix("//go:wasmexport lsgd:policy/"))
            .collect();
        assert!(!exports.is_empty(), "{file}");
        for e in exports {
            assert!(e.contains(&format!("@{VERSION}#")), "{file}: {e}");
        }
    }
    assert!(read("norms.csv").contains("step,name,role,shape,"));
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
