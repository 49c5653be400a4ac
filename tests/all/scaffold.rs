//! `lsgd-host new`: a project of every language and kind, stateful (`--stateful`) or not, builds
//! with its one command (`./build.sh`) into a component of its kind's contract (0.5.0 for a sync
//! policy, 0.4.0 for the others) exporting `plugin`, its kind's interface and, if stateful,
//! `state`, and loads in the host: `inspect` names its world and version, a short trace with a
//! good and with a bad parameter, and the command `new` suggests; a stateful one is traced with
//! test metrics, which its state (the best metric so far) turns into other values. A sync
//! policy's trace shows its plan, step by step. In every language a schedule edited to return a
//! momentum shows it in the trace's `momentum` column. Python components, the slowest to load
//! (~18 MiB that take ~30 s to compile), are loaded for a few kinds only; the exports of all are
//! read without compiling them.
//!
//! The toolchains are the ones `scripts/build-guests.sh` installs (the test command runs it
//! first); a missing one fails the test with that hint rather than skipping it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, OnceLock};

use crate::common::*;

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

/// The contract version `new` scaffolds for every kind but sync.
const VERSION: &str = "0.4.0";

/// The contract version of a sync project: the kind is new in 0.5.
const SYNC_VERSION: &str = "0.5.0";

/// The contract version `new` scaffolds for `kind`.
fn version(kind: &str) -> &'static str {
    if kind == "sync" {
        SYNC_VERSION
    } else {
        VERSION
    }
}

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

/// [`scaffold_and_build`] once per test run: the tests that need the same fresh project (this
/// file's and the stateful snapshot test in `languages.rs`) share its build, the slow part.
pub fn built(lang: &str, kind: &str, stateful: bool) -> (PathBuf, String) {
    type Slot = Arc<OnceLock<(PathBuf, String)>>;
    static BUILT: Mutex<BTreeMap<(String, String, bool), Slot>> = Mutex::new(BTreeMap::new());
    let slot = BUILT
        .lock()
        .unwrap()
        .entry((lang.into(), kind.into(), stateful))
        .or_default()
        .clone();
    slot.get_or_init(|| scaffold_and_build(lang, kind, stateful))
        .clone()
}

/// Creates a project of `kind` with `lsgd-host new` (`--stateful` if `stateful`) in a scratch
/// directory and builds it; returns the component and what `new` printed.
fn scaffold_and_build(lang: &str, kind: &str, stateful: bool) -> (PathBuf, String) {
    let name = if stateful {
        format!("my-{lang}-stateful-{kind}")
    } else {
        format!("my-{lang}-{kind}")
    };
    let (dir, hint) = new_project_with(lang, kind, &name, stateful);
    (build_project(lang, &dir, &name), hint)
}

/// Creates the project `name` with `lsgd-host new` in a scratch directory; returns its
/// directory and what `new` printed.
pub fn new_project(lang: &str, kind: &str, name: &str) -> (PathBuf, String) {
    new_project_with(lang, kind, name, false)
}

/// [`new_project`], of the kind's stateful world if `stateful`.
pub fn new_project_with(lang: &str, kind: &str, name: &str, stateful: bool) -> (PathBuf, String) {
    let dir = scratch(&format!("scaffold-{name}")).join(name);
    let mut args = vec![
        "new",
        "--lang",
        lang,
        "--kind",
        kind,
        name,
        "--dir",
        dir.to_str().unwrap(),
    ];
    if stateful {
        args.push("--stateful");
    }
    let o = lsgd(&args);
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
            build.env(
                "CARGO_TARGET_DIR",
                lsgd_host::train::venv::cache_root().join("scaffold-target"),
            );
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

/// The component exports `lsgd:policy/plugin@V`, `lsgd:policy/KIND@V` and, if `stateful`,
/// `lsgd:policy/state@V`, V being the kind's [`version`], and nothing else of the contract
/// (toolchains may add their own exports: componentize-qjs's `init`). Read from the binary by
/// `lsgd-plugin-build exports`, so that no compilation is needed.
fn check_exports(wasm: &Path, kind: &str, stateful: bool) {
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
    let v = version(kind);
    let mut want = vec![
        format!("lsgd:policy/plugin@{v}"),
        format!("lsgd:policy/{kind}@{v}"),
    ];
    if stateful {
        want.push(format!("lsgd:policy/state@{v}"));
    }
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
    /// The stateful template's values from epoch 1 on, with `good`, when the test metric after
    /// epoch 1 is 0.5 and after epoch 2 is 0.25: the best metric so far stays 0.5.
    after: &'static [(&'static str, &'static str)],
    /// A sync policy's plan over the short trace with `good`, one letter a step (`l` local,
    /// `a` average, `s` synchronous); empty for the other kinds.
    plan: &'static str,
    /// The stateful template's plan over the four epochs of [`check_state`].
    plan_after: &'static str,
}

/// Window-end drifts for the sync template (plain averaging reads none of them).
const DRIFT: &str = "step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,\
delta_dot_momentum
0,conv.weight,weight,8x1x3x3,2,0.25,0.5,0,0
0,conv.bias,bias,8,0.5,0.01,0.02,0,0
0,bn.weight,batchnorm,8,3,0.1,0.1,0,0
";

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
        // 0.1 x (1 - 0.5).
        after: &[("lr", "0.05")],
        plan: "",
        plan_after: "",
    },
    Case {
        kind: "batch-size",
        flag: "--batch-size",
        good: "batch_size.factor=3",
        values: &[("global_batch", "1536")],
        bad: "batch_size.factor=0",
        error: "factor must be in [1, 4294967295], got 0",
        // Doubled once the best metric reaches 0.5.
        after: &[("global_batch", "3072")],
        plan: "",
        plan_after: "",
    },
    Case {
        kind: "label-smoothing",
        flag: "--label-smoothing",
        good: "label_smoothing.epsilon=0.25",
        values: &[("label_smoothing", "0.25")],
        bad: "label_smoothing.epsilon=1",
        error: "epsilon must be in [0, 1), got 1",
        // 0.25 x (1 - 0.5).
        after: &[("label_smoothing", "0.125")],
        plan: "",
        plan_after: "",
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
        // The coefficient 0.02 x (1 - 0.5), then as above.
        after: &[
            ("scale:conv.weight", "0.03998400639744103"),
            ("scale:conv.bias", "1"),
            ("scale:bn.weight", "1"),
            ("scale:fc.weight", "1"),
            ("scale:new.weight", "1"),
            ("lr", "0.1"),
        ],
        plan: "",
        plan_after: "",
    },
    Case {
        kind: "sync",
        flag: "--sync",
        good: "sync.period=4",
        values: &[],
        bad: "sync.period=0",
        error: "period must be in [1, 4294967295], got 0",
        after: &[],
        // Averages at the fourth step of a window, and at the run's last step, which the host
        // makes an average whatever the plan (a run ends with one model).
        plan: "lllala",
        // Period 4 until the best metric reaches 0.5 at epoch 1 (step 3, where the plain
        // template averages), then 8, in the window that began at step 0: averages at step 7
        // and at the last step.
        plan_after: "lllllllallla",
    },
];

/// The shape of the short traces: two epochs of three steps at batch 512, more epochs to
/// see the state at work; a layer-rate plugin also gets [`NORMS`] and a sync plugin [`DRIFT`]
/// (written next to `wasm`).
fn shape(wasm: &Path, case: &Case, epochs: &'static str) -> Vec<String> {
    let mut shape: Vec<String> = [
        "--epochs",
        epochs,
        "--steps-per-epoch",
        "3",
        "--global-batch",
        "512",
    ]
    .map(String::from)
    .to_vec();
    if case.kind == "layer-rate" {
        let norms = wasm.parent().unwrap().join("test-norms.csv");
        std::fs::write(&norms, NORMS).unwrap();
        shape.extend(["--norms-file".into(), norms.display().to_string()]);
    }
    if case.kind == "sync" {
        let drift = wasm.parent().unwrap().join("test-drift.csv");
        std::fs::write(&drift, DRIFT).unwrap();
        shape.extend(["--drift-file".into(), drift.display().to_string()]);
    }
    shape
}

/// `lsgd-host trace --format csv ARGS`, which must succeed: its header and rows, split at the
/// commas.
fn trace_csv(args: &[&str]) -> (Vec<String>, Vec<Vec<String>>, String) {
    let o = lsgd(&[&["trace", "--format", "csv"], args].concat());
    assert!(o.status.success(), "trace {args:?}: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let split = |l: &str| l.split(',').map(String::from).collect::<Vec<_>>();
    let header = split(out.lines().next().unwrap_or_default());
    let rows = out.lines().skip(1).map(split).collect();
    (header, rows, out)
}

/// The values of `column` in `rows`; panics, showing `out`, if the trace has no such column.
fn column<'a>(header: &[String], rows: &'a [Vec<String>], column: &str, out: &str) -> Vec<&'a str> {
    let i = header.iter().position(|h| h == column);
    let i = i.unwrap_or_else(|| panic!("no column {column}:\n{out}"));
    rows.iter()
        .map(|r| r.get(i).map_or("", String::as_str))
        .collect()
}

/// The plan of a sync policy's trace (its `plan` column, the host's final-step rule applied),
/// one letter a step (`l` local, `a` average, `s` synchronous). The template's outer step, in
/// the `outer_lr`, `outer_momentum` and `nesterov` columns, is plain averaging at every
/// `average` step and empty at the others, and it scales no tensor (no `outer_scale:` column).
fn plan(header: &[String], rows: &[Vec<String>], out: &str) -> String {
    assert!(
        !header.iter().any(|h| h.starts_with("outer_scale:")),
        "{out}"
    );
    let outer = ["outer_lr", "outer_momentum", "nesterov"].map(|c| column(header, rows, c, out));
    let mut plan = String::new();
    for (i, kind) in column(header, rows, "plan", out).into_iter().enumerate() {
        let (letter, want) = match kind {
            "local" => ('l', ["", "", ""]),
            "average" => ('a', ["1", "0", "false"]),
            "synchronous" => ('s', ["", "", ""]),
            _ => panic!("step {i}: plan {kind:?}\n{out}"),
        };
        plan.push(letter);
        let got = outer.each_ref().map(|c| c[i]);
        assert_eq!(got, want, "step {i}: the outer step\n{out}");
    }
    plan
}

/// `lsgd-host inspect` names the world (`stateful-…` for a stateful plugin) and the contract
/// version the component was built against, and says whether it keeps state.
fn check_inspect(wasm: &Path, case: &Case, stateful: bool) {
    let o = lsgd(&["inspect", wasm.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let world = if stateful {
        format!("stateful-{}-plugin", case.kind)
    } else {
        format!("{}-plugin", case.kind)
    };
    let want = format!("world:       {world} (lsgd:policy@{})", version(case.kind));
    assert!(
        out.contains(&want),
        "{}: no `{want}` in\n{out}",
        wasm.display()
    );
    let state = if stateful {
        "state:       kept between calls"
    } else {
        "state:       none"
    };
    assert!(
        out.contains(state),
        "{}: no `{state}` in\n{out}",
        wasm.display()
    );
}

/// Loads the component in the host: `inspect`, a short trace with a good and with a bad
/// parameter, then the trace `new` suggested (`hint`, its output), which for a layer-rate project
/// reads the project's sample `norms.csv`, for a sync project its `drift.csv`. A schedule that
/// was not edited answers no momentum; a sync policy's trace shows [`Case::plan`].
fn check_loads(wasm: &Path, case: &Case, hint: &str, stateful: bool) {
    check_inspect(wasm, case, stateful);
    let shape = shape(wasm, case, "2");
    let shape: Vec<&str> = shape.iter().map(String::as_str).collect();
    let w = wasm.to_str().unwrap();
    let (header, rows, out) =
        trace_csv(&[&[case.flag, w, "--set", case.good], &shape[..]].concat());
    // Six steps at batch 512; fewer when a batch-size policy grows the batch.
    assert!((1..=6).contains(&rows.len()), "{out}");
    for (name, value) in case.values {
        for v in column(&header, &rows, name, &out) {
            assert_eq!(v, *value, "{w}: {name}\n{out}");
        }
    }
    if !case.plan.is_empty() {
        assert_eq!(plan(&header, &rows, &out), case.plan, "{w}: plan\n{out}");
    }
    // The momentum column, if the host prints one, is empty: the template answers none.
    if header.iter().any(|h| h == "momentum") {
        for v in column(&header, &rows, "momentum", &out) {
            assert_eq!(v, "", "{w}: momentum\n{out}");
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

/// A stateful template remembers the best test metric: traced over four epochs with the metrics
/// 0.5 (after epoch 1) and 0.25 (after epoch 2, and on), it gives `case.after` from epoch 1 on,
/// also from epoch 2, where the last metric has fallen but the best has not; before,
/// `case.values`. A sync policy's plan over the four epochs is `case.plan_after`.
fn check_state(wasm: &Path, case: &Case) {
    let shape = shape(wasm, case, "4");
    let shape: Vec<&str> = shape.iter().map(String::as_str).collect();
    let metrics = wasm.parent().unwrap().join("test-metrics.txt");
    std::fs::write(&metrics, "0.5\n0.25\n").unwrap();
    let w = wasm.to_str().unwrap();
    let m = metrics.to_str().unwrap();
    let args = [case.flag, w, "--set", case.good, "--metric-file", m];
    let (header, rows, out) = trace_csv(&[&args[..], &shape[..]].concat());
    let epochs: Vec<f64> = column(&header, &rows, "epoch", &out)
        .iter()
        .map(|e| e.parse().unwrap())
        .collect();
    assert!(
        epochs.iter().any(|e| *e >= 2.0),
        "{w}: no step in epoch 2\n{out}"
    );
    for (values, later) in [(case.values, false), (case.after, true)] {
        for (name, value) in values {
            let got = column(&header, &rows, name, &out);
            for (v, e) in got.iter().zip(&epochs) {
                if (*e >= 1.0) == later {
                    assert_eq!(v, value, "{w}: {name} at epoch {e}\n{out}");
                }
            }
        }
    }
    if !case.plan_after.is_empty() {
        assert_eq!(
            plan(&header, &rows, &out),
            case.plan_after,
            "{w}: plan\n{out}"
        );
    }
}

/// Scaffolds, builds and checks the exports of a `lang` project of every kind, stateful if
/// `stateful`; loads those of `load` in the host.
fn scaffold(lang: &str, load: &[&str], stateful: bool) {
    for case in CASES {
        let (wasm, hint) = built(lang, case.kind, stateful);
        check_exports(&wasm, case.kind, stateful);
        if load.contains(&case.kind) {
            check_loads(&wasm, case, &hint, stateful);
            if stateful {
                check_state(&wasm, case);
            }
        }
    }
}

/// Every kind `new` scaffolds.
const ALL: &[&str] = &[
    "schedule",
    "batch-size",
    "label-smoothing",
    "layer-rate",
    "sync",
];

#[test]
fn new_c_plugins_build_and_load() {
    scaffold("c", ALL, false);
}

#[test]
fn new_js_plugins_build_and_load() {
    scaffold("js", ALL, false);
}

#[test]
fn new_go_plugins_build_and_load() {
    scaffold("go", ALL, false);
}

#[test]
fn new_rust_plugins_build_and_load() {
    scaffold("rust", ALL, false);
}

#[test]
fn new_python_plugins_build_and_load() {
    scaffold("python", &["label-smoothing", "layer-rate", "sync"], false);
}

#[test]
fn new_stateful_c_plugins_build_and_keep_their_state() {
    scaffold("c", ALL, true);
}

#[test]
fn new_stateful_js_plugins_build_and_keep_their_state() {
    scaffold("js", ALL, true);
}

#[test]
fn new_stateful_go_plugins_build_and_keep_their_state() {
    scaffold("go", ALL, true);
}

#[test]
fn new_stateful_rust_plugins_build_and_keep_their_state() {
    scaffold("rust", ALL, true);
}

#[test]
fn new_stateful_python_plugins_build_and_keep_their_state() {
    scaffold("python", &["schedule"], true);
}

/// The one line of each language's schedule template that answers no momentum, and what the
/// test puts there to answer 0.9: the edit the templates' comments describe.
const MOMENTUM: &[(&str, &str, &str, &str)] = &[
    (
        "rust",
        "src/lib.rs",
        "        None\n    }",
        "        Some(0.9)\n    }",
    ),
    (
        "c",
        "plugin.c",
        "  return false;\n}",
        "  *ret = 0.9;\n  return true;\n}",
    ),
    (
        "python",
        "app.py",
        "        return None\n",
        "        return 0.9\n",
    ),
    ("js", "plugin.js", "    return null;\n", "    return 0.9;\n"),
    (
        "go",
        "plugin.go",
        "\treturn 0, false\n",
        "\treturn 0.9, true\n",
    ),
];

/// A 0.4 schedule in `lang` whose momentum function is edited to answer 0.9: built with its
/// `./build.sh`, it is a 0.4.0 schedule to `inspect`, and its trace has the template's
/// learning rate and 0.9 in the `momentum` column at every step.
fn momentum(lang: &str) {
    let (_, file, none, some) = MOMENTUM.iter().find(|m| m.0 == lang).unwrap();
    let name = format!("my-{lang}-momentum");
    let (dir, _) = new_project(lang, "schedule", &name);
    let source = dir.join(file);
    let code = std::fs::read_to_string(&source).unwrap();
    assert_eq!(code.matches(none).count(), 1, "{lang}: {none:?} in\n{code}");
    std::fs::write(&source, code.replace(none, some)).unwrap();
    let wasm = build_project(lang, &dir, &name);
    check_exports(&wasm, "schedule", false);
    check_inspect(&wasm, &CASES[0], false);
    let w = wasm.to_str().unwrap();
    let shape = shape(&wasm, &CASES[0], "2");
    let shape: Vec<&str> = shape.iter().map(String::as_str).collect();
    let args = ["--schedule", w, "--set", CASES[0].good];
    let (header, rows, out) = trace_csv(&[&args[..], &shape[..]].concat());
    assert_eq!(rows.len(), 6, "{out}");
    for (name, value) in [("lr", "0.1"), ("momentum", "0.9")] {
        for v in column(&header, &rows, name, &out) {
            assert_eq!(v, value, "{w}: {name}\n{out}");
        }
    }
}

#[test]
fn a_rust_schedule_of_0_4_returns_a_momentum() {
    momentum("rust");
}

#[test]
fn a_c_schedule_of_0_4_returns_a_momentum() {
    momentum("c");
}

#[test]
fn a_python_schedule_of_0_4_returns_a_momentum() {
    momentum("python");
}

#[test]
fn a_js_schedule_of_0_4_returns_a_momentum() {
    momentum("js");
}

#[test]
fn a_go_schedule_of_0_4_returns_a_momentum() {
    momentum("go");
}

/// The outer step of each language's sync template (plain averaging), and what the test puts
/// there: DiLoCo's outer Nesterov step (lr 0.7, momentum 0.9) with a scale per tensor read from
/// the window's drift, ||delta|| / rank-delta-norm, which runs the tensors in and a list out
/// through every language's bindings (Go's hand-written ABI in `lsgd_sync.go`).
const OUTER_STEP: &[(&str, &str, &str, &str)] = &[
    (
        "rust",
        "src/lib.rs",
        "            lr: 1.0,
            momentum: 0.0,
            nesterov: false,
            lr_scale: Vec::new(),",
        "            lr: 0.7,
            momentum: 0.9,
            nesterov: true,
            lr_scale: _tensors.iter().map(|t| t.delta_norm / t.rank_delta_norm).collect(),",
    ),
    (
        "c",
        "plugin.c",
        "  ret->lr = 1.0;
  ret->momentum = 0.0;
  ret->nesterov = false;
  ret->lr_scale.ptr = NULL;
  ret->lr_scale.len = 0;",
        "  ret->lr = 0.7;
  ret->momentum = 0.9;
  ret->nesterov = true;
  ret->lr_scale.len = tensors->len;
  ret->lr_scale.ptr = malloc(tensors->len * sizeof(double));
  for (size_t i = 0; i < tensors->len; i++)
    ret->lr_scale.ptr[i] = tensors->ptr[i].delta_norm / tensors->ptr[i].rank_delta_norm;",
    ),
    (
        "python",
        "app.py",
        "OuterUpdate(lr=1.0, momentum=0.0, nesterov=False, lr_scale=[])",
        "OuterUpdate(lr=0.7, momentum=0.9, nesterov=True,
                           lr_scale=[t.delta_norm / t.rank_delta_norm for t in tensors])",
    ),
    (
        "js",
        "plugin.js",
        "({ lr: 1.0, momentum: 0.0, nesterov: false, lrScale: [] })",
        "({ lr: 0.7, momentum: 0.9, nesterov: true,
    lrScale: tensors.map((t) => t.deltaNorm / t.rankDeltaNorm) })",
    ),
    (
        "go",
        "plugin.go",
        "\treturn Averaging()\n",
        "\to := OuterStep{LR: 0.7, Momentum: 0.9, Nesterov: true}
	for _, t := range tensors {
		o.LRScale = append(o.LRScale, t.DeltaNorm/t.RankDeltaNorm)
	}
	return o
",
    ),
];

/// A sync template in `lang` whose outer step is edited into DiLoCo's: built with its
/// `./build.sh`, it is a 0.5.0 sync policy to `inspect`, and its trace over [`DRIFT`] has the
/// template's plan and, at each `average` step, the outer step's lr, momentum and Nesterov and
/// one `outer_scale:<tensor>` column per tensor: 0.25/0.5, 0.01/0.02 and 0.1/0.1.
fn outer_step(lang: &str) {
    let (_, file, plain, diloco) = OUTER_STEP.iter().find(|m| m.0 == lang).unwrap();
    let name = format!("my-{lang}-diloco");
    let (dir, _) = new_project(lang, "sync", &name);
    let source = dir.join(file);
    let code = std::fs::read_to_string(&source).unwrap();
    assert_eq!(
        code.matches(plain).count(),
        1,
        "{lang}: {plain:?} in\n{code}"
    );
    std::fs::write(&source, code.replace(plain, diloco)).unwrap();
    let wasm = build_project(lang, &dir, &name);
    let case = CASES.iter().find(|c| c.kind == "sync").unwrap();
    check_exports(&wasm, "sync", false);
    check_inspect(&wasm, case, false);
    let w = wasm.to_str().unwrap();
    let shape = shape(&wasm, case, "2");
    let shape: Vec<&str> = shape.iter().map(String::as_str).collect();
    let args = ["--sync", w, "--set", case.good];
    let (header, rows, out) = trace_csv(&[&args[..], &shape[..]].concat());
    let plan = column(&header, &rows, "plan", &out);
    let kinds: String = plan.iter().map(|k| k.chars().next().unwrap()).collect();
    assert_eq!(kinds, case.plan, "{w}: plan\n{out}");
    for (name, value) in [
        ("outer_lr", "0.7"),
        ("outer_momentum", "0.9"),
        ("nesterov", "true"),
        ("outer_scale:conv.weight", "0.5"),
        ("outer_scale:conv.bias", "0.5"),
        ("outer_scale:bn.weight", "1"),
    ] {
        for (v, kind) in column(&header, &rows, name, &out).iter().zip(&plan) {
            let want = if *kind == "average" { value } else { "" };
            assert_eq!(v, &want, "{w}: {name}\n{out}");
        }
    }
}

#[test]
fn a_rust_sync_plugin_takes_diloco_s_outer_step() {
    outer_step("rust");
}

#[test]
fn a_c_sync_plugin_takes_diloco_s_outer_step() {
    outer_step("c");
}

#[test]
fn a_python_sync_plugin_takes_diloco_s_outer_step() {
    outer_step("python");
}

#[test]
fn a_js_sync_plugin_takes_diloco_s_outer_step() {
    outer_step("js");
}

#[test]
fn a_go_sync_plugin_takes_diloco_s_outer_step() {
    outer_step("go");
}

#[test]
fn new_writes_the_0_4_contract_and_a_layer_rate_project_documents_its_use() {
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
    let wit = std::fs::read_to_string(root().join("wit/v0.4.0/policy.wit")).unwrap();
    assert_eq!(read("wit/policy.wit"), wit);
    let readme = read("README.md");
    for needle in [
        "lsgd:policy@0.4.0",
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
fn new_writes_the_0_5_contract_for_a_sync_project_and_documents_its_use() {
    let dir = scratch("scaffold-sync-files");
    let o = lsgd(&[
        "new",
        "--lang",
        "go",
        "--kind",
        "sync",
        "my-local-sgd",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("a Go sync plugin"), "{}", text(&o));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let wit = std::fs::read_to_string(root().join("wit/v0.5.0/policy.wit")).unwrap();
    assert!(
        read("wit/policy.wit") == wit,
        "wit/policy.wit is not wit/v0.5.0/policy.wit"
    );
    let readme = read("README.md");
    for needle in [
        "lsgd:policy@0.5.0",
        "`sync-plugin` world",
        "lsgd-host run --sync ./target/my-local-sgd.wasm --set sync.KEY=VALUE",
        "lsgd-host trace --sync target/my-local-sgd.wasm --drift-file drift.csv",
    ] {
        assert!(
            readme.contains(needle),
            "README.md lacks {needle}:\n{readme}"
        );
    }
    assert!(!readme.contains("{{"), "{readme}");
    // The Go kit's sync ABI, its exports at 0.5.0 as the world's.
    let kit = read("lsgd_sync.go");
    for export in ["sync@0.5.0#plan", "sync@0.5.0#outer-step"] {
        assert!(kit.contains(export), "lsgd_sync.go lacks {export}");
    }
    for file in ["lsgd_plugin.go", "lsgd_sync.go"] {
        for e in read(file)
            .lines()
            .filter_map(|l| l.strip_prefix("//go:wasmexport lsgd:policy/"))
        {
            assert!(e.contains(&format!("@{SYNC_VERSION}#")), "{file}: {e}");
        }
    }
    let plugin = read("plugin.go");
    for needle in [
        "func plan(s *State, w Window) StepKind",
        "func outerStep(s *State, w Window, tensors []Drift) OuterStep",
    ] {
        assert!(
            plugin.contains(needle),
            "plugin.go lacks {needle}:\n{plugin}"
        );
    }
    let drift = read("drift.csv");
    assert!(
        drift.contains(
            "step,name,role,shape,weight_norm,delta_norm,rank_delta_norm,momentum_norm,\
             delta_dot_momentum\n"
        ),
        "{drift}"
    );
}

#[test]
fn new_stateful_writes_the_stateful_world_and_its_kit() {
    let dir = scratch("scaffold-stateful-files");
    let o = lsgd(&[
        "new",
        "--lang",
        "go",
        "--kind",
        "schedule",
        "--stateful",
        "my-plateau",
        "--dir",
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("a stateful Go schedule plugin"),
        "{}",
        text(&o)
    );
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let readme = read("README.md");
    for needle in [
        "`stateful-schedule-plugin` world",
        "lsgd:policy@0.4.0",
        "--metric-file",
    ] {
        assert!(
            readme.contains(needle),
            "README.md lacks {needle}:\n{readme}"
        );
    }
    let plugin = read("plugin.go");
    for needle in [
        "func snapshot() []byte",
        "func restore(b []byte) error",
        "momentum =",
    ] {
        assert!(
            plugin.contains(needle),
            "plugin.go lacks {needle}:\n{plugin}"
        );
    }
    assert!(!plugin.contains("{{"), "{plugin}");
    for (file, export) in [
        ("lsgd_state.go", "state@0.4.0#snapshot"),
        ("lsgd_state.go", "state@0.4.0#restore"),
        ("lsgd_momentum.go", "schedule@0.4.0#momentum"),
    ] {
        assert!(read(file).contains(export), "{file} lacks {export}");
    }
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
