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

#[test]
fn a_directory_named_like_a_plugin_is_passed_over() {
    let cwd = scratch("cli-lookup");
    let at_cwd = |args: &[&str]| lsgd_command(args).current_dir(&cwd).output().unwrap();
    // A project folder of the same name as a reference plugin: the plugin is still found.
    std::fs::create_dir_all(cwd.join("warmup/src")).unwrap();
    let found = at_cwd(&[&["trace", "--schedule", "warmup"], SHAPE].concat());
    assert!(found.status.success(), "{}", stderr(&found));
    let golden = std::fs::read_to_string(root().join("tests/golden/warmup.csv")).unwrap();
    assert_eq!(stdout(&found), golden);
    // A project folder that is nothing else: the error lists where it looked and what it passed.
    std::fs::create_dir_all(cwd.join("my-one-cycle")).unwrap();
    let missing = at_cwd(&[&["trace", "--schedule", "my-one-cycle"], SHAPE].concat());
    assert_eq!(missing.status.code(), Some(2));
    let err = stderr(&missing);
    assert!(
        err.contains("no plugin file `my-one-cycle`: not a path, and no my-one-cycle.wasm in ")
            && err.contains(
                "(passed over: my-one-cycle is a directory without a built \
                 my-one-cycle/target/my-one-cycle.wasm (run its ./build.sh))"
            )
            && !err.contains("Is a directory"),
        "{err}"
    );
    // Once built, the project folder stands for its plugin.
    std::fs::create_dir_all(cwd.join("my-one-cycle/target")).unwrap();
    std::fs::copy(
        plugin_path("cosine"),
        cwd.join("my-one-cycle/target/my-one-cycle.wasm"),
    )
    .unwrap();
    let built = at_cwd(&["inspect", "my-one-cycle"]);
    assert!(built.status.success(), "{}", stderr(&built));
    assert!(
        stdout(&built).contains("my-one-cycle/target/my-one-cycle.wasm"),
        "{}",
        stdout(&built)
    );
}

#[test]
fn a_second_inspect_of_a_python_plugin_loads_it_from_the_cache() {
    let cache = scratch("cli-inspect-cache");
    let python = plugin_path("warmup-python");
    let inspect = |extra: &str| {
        lsgd_command(&["inspect", python.to_str().unwrap(), extra])
            .env("LSGD_CACHE_DIR", &cache)
            .output()
            .unwrap()
    };
    let first = inspect("--format=json");
    assert!(first.status.success(), "{}", stderr(&first));
    let j: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(j["compiled_now"], true, "{j}");
    let compile_ms = j["compile_ms"].as_f64().unwrap();
    // 18 MiB of CPython: seconds to compile, which the host says while it happens.
    if compile_ms > 1000.0 {
        assert!(
            stderr(&first).contains("first use, cached afterwards) …"),
            "{}",
            stderr(&first)
        );
    }
    let start = std::time::Instant::now();
    let second = inspect("--format=json");
    let took = start.elapsed();
    assert!(second.status.success(), "{}", stderr(&second));
    let j: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    // Nothing is compiled: the compile time is the one recorded by the first call.
    assert_eq!(j["compiled_now"], false, "{j}");
    let recorded = j["compile_ms"].as_f64().unwrap();
    assert!((recorded - compile_ms).abs() <= 1e-3, "{j}");
    assert!(j["cached_load_ms"].as_f64().is_some(), "{j}");
    assert!(
        !stderr(&second).contains("compiling"),
        "{}",
        stderr(&second)
    );
    eprintln!("second inspect of warmup-python: {took:?} (first compiled in {compile_ms:.0} ms)");
    // `--recompile` measures a fresh compilation again.
    let again = inspect("--recompile");
    assert!(again.status.success(), "{}", stderr(&again));
    let text = stdout(&again);
    let compile = text.lines().find(|l| l.starts_with("compile:")).unwrap();
    assert!(!compile.contains("when first compiled"), "{compile}");
}
