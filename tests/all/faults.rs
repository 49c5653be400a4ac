//! Every way a plugin can be bad gets a clear error that names the plugin, the call and the
//! step, and the host keeps running: one test per case.

use lsgd_host::codec::sample_bucket;
use lsgd_host::plugin::{Fault, Limits, Plugin, PluginError, PolicyKind};
use lsgd_host::policy::{Bounds, PolicySet};

use crate::common::*;

fn load_err(rt: &lsgd_host::plugin::Runtime, path: &std::path::Path) -> PluginError {
    match rt.load(path, None) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e,
    }
}

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn missing_file() {
    let e = load_err(&runtime(), std::path::Path::new("/nonexistent/warmup.wasm"));
    assert_eq!(e.call, "load");
    assert!(
        e.to_string()
            .contains("/nonexistent/warmup.wasm: load: cannot read the file"),
        "{e}"
    );
}

#[test]
fn not_webassembly() {
    let d = scratch("not-wasm");
    let e = load_err(&runtime(), &write(&d, "notes.wasm", b"just some text"));
    assert!(e.to_string().contains("not a WebAssembly file"), "{e}");
}

#[test]
fn core_module_instead_of_component() {
    let d = scratch("core");
    let bytes =
        wat::parse_str("(module (func (export \"learning-rate\") (result f64) f64.const 0.1))")
            .unwrap();
    let e = load_err(&runtime(), &write(&d, "core.wasm", &bytes));
    assert!(
        e.to_string()
            .contains("a core WebAssembly module, not a component"),
        "{e}"
    );
}

#[test]
fn corrupt_component() {
    let d = scratch("corrupt");
    let mut bytes = std::fs::read(plugin_path("warmup")).unwrap();
    bytes.truncate(bytes.len() / 2);
    let e = load_err(&runtime(), &write(&d, "half.wasm", &bytes));
    assert!(e.to_string().contains("not a valid component"), "{e}");
}

#[test]
fn component_without_policy_exports() {
    let d = scratch("empty");
    let bytes = wat::parse_str("(component)").unwrap();
    let e = load_err(&runtime(), &write(&d, "empty.wasm", &bytes));
    assert!(
        e.to_string()
            .contains("not an lsgd policy plugin: it exports nothing"),
        "{e}"
    );
}

/// A component whose exports carry the given names, each an instance with one function.
fn component_exporting(names: &[&str]) -> Vec<u8> {
    let exports: String = names
        .iter()
        .map(|n| format!("(export \"{n}\" (instance $x))"))
        .collect();
    wat::parse_str(format!(
        r#"(component
             (core module $m (func (export "f")))
             (core instance $i (instantiate $m))
             (func $f (canon lift (core func $i "f")))
             (instance $x (export "describe" (func $f)))
             {exports})"#
    ))
    .unwrap()
}

#[test]
fn unsupported_major_version() {
    let d = scratch("major");
    let bytes = component_exporting(&["lsgd:policy/plugin@1.0.0", "lsgd:policy/schedule@1.0.0"]);
    let e = load_err(&runtime(), &write(&d, "future.wasm", &bytes));
    assert!(
        e.to_string().contains(
            "built against lsgd:policy@1.0.0, an unsupported major version; this host loads 0.1"
        ),
        "{e}"
    );
}

#[test]
fn newer_minor_version_asks_for_a_newer_host() {
    let d = scratch("minor");
    let bytes = component_exporting(&["lsgd:policy/plugin@0.9.0", "lsgd:policy/schedule@0.9.0"]);
    let e = load_err(&runtime(), &write(&d, "newer.wasm", &bytes));
    assert!(e.to_string().contains("newer than this host"), "{e}");
}

#[test]
fn missing_plugin_interface() {
    let d = scratch("no-plugin");
    let bytes = component_exporting(&["lsgd:policy/schedule@0.1.0"]);
    let e = load_err(&runtime(), &write(&d, "noplugin.wasm", &bytes));
    assert!(
        e.to_string()
            .contains("missing export lsgd:policy/plugin@0.1.0"),
        "{e}"
    );
}

#[test]
fn missing_policy_interface() {
    let d = scratch("no-policy");
    let bytes = component_exporting(&["lsgd:policy/plugin@0.1.0"]);
    let e = load_err(&runtime(), &write(&d, "nopolicy.wasm", &bytes));
    assert!(e.to_string().contains("exports no policy interface"), "{e}");
}

#[test]
fn right_names_wrong_types() {
    let d = scratch("types");
    let bytes = component_exporting(&["lsgd:policy/plugin@0.1.0", "lsgd:policy/schedule@0.1.0"]);
    let e = load_err(&runtime(), &write(&d, "types.wasm", &bytes));
    assert!(
        e.to_string()
            .contains("does not match world schedule-plugin of lsgd:policy@0.1.0"),
        "{e}"
    );
}

/// A 0.1.x patch release binds to the 0.1.0 bindings: the lookup finds the exports (this
/// component then fails on their types, not on their names).
#[test]
fn patch_versions_bind_to_their_minor_version() {
    let d = scratch("patch");
    let bytes = component_exporting(&["lsgd:policy/plugin@0.1.3", "lsgd:policy/schedule@0.1.3"]);
    let e = load_err(&runtime(), &write(&d, "patch.wasm", &bytes));
    let text = e.to_string();
    assert!(
        text.contains("does not match world schedule-plugin of lsgd:policy@0.1.3"),
        "{text}"
    );
    assert!(!text.contains("no exported instance"), "{text}");
}

#[test]
fn wrong_world_for_the_flag() {
    let e = load_as(&runtime(), "batch-ramp", PolicyKind::Schedule)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("is a batch-size plugin (world batch-size-plugin), but --schedule takes a schedule plugin"),
        "{e}"
    );
}

#[test]
fn unknown_parameter_is_refused_by_the_host() {
    let e = load(&runtime(), "warmup", &[("warmup_epoch", "5")])
        .err()
        .unwrap();
    assert!(matches!(e.fault, Fault::Param(_)));
    assert!(
        e.to_string()
            .contains("unknown parameter `warmup_epoch`; it accepts: "),
        "{e}"
    );
}

#[test]
fn configure_rejection_carries_the_plugins_message() {
    let e = load(&runtime(), "warmup", &[("warmup_epochs", "-1")])
        .err()
        .unwrap();
    assert_eq!(e.call, "configure");
    assert!(matches!(e.fault, Fault::Configure(_)), "{e}");
    assert!(e.to_string().contains("warmup_epochs"), "{e}");
    let e = load(&runtime(), "bad-schedule", &[("mode", "reject")])
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("rejected its parameters: bad-schedule rejects its parameters"),
        "{e}"
    );
}

fn first_call_error(
    rt: &lsgd_host::plugin::Runtime,
    name: &str,
    settings: &[(&str, &str)],
) -> PluginError {
    let plugin = load(rt, name, settings).unwrap();
    let mut set = PolicySet::new(vec![plugin], Bounds { max_batch: 65536 }).unwrap();
    let mut clock = clock(2, 5, 256);
    for _ in 0..3 {
        clock.advance(256, Some(1.0));
    }
    set.decide(&clock).expect_err("the policy call fails")
}

#[test]
fn trap_names_plugin_call_step_and_shows_the_panic() {
    let e = first_call_error(&runtime(), "bad-schedule", &[("mode", "trap")]);
    assert!(matches!(e.fault, Fault::Trap(_)), "{e}");
    let text = e.to_string();
    // The panic's message is the first line; the wasm trap and its frames come after.
    let first = text.lines().next().unwrap();
    assert!(
        first.ends_with(
            "bad-schedule.wasm: learning-rate at step 3: trapped: bad-schedule traps on purpose \
             (panicked at tests/guests/bad-schedule/src/lib.rs:118:27)"
        ),
        "{text}"
    );
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1], "  wasm trap: wasm `unreachable` instruction executed",
        "{text}"
    );
}

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let rt = runtime_with(Limits {
        fuel: 2_000_000,
        ..Limits::default()
    });
    let start = std::time::Instant::now();
    let e = first_call_error(&rt, "bad-schedule", &[("mode", "loop")]);
    assert_eq!(
        e.fault,
        Fault::Fuel {
            units: 2_000_000,
            remedy: "raise it with --plugin-fuel"
        }
    );
    assert!(
        e.to_string().contains(
            "bad-schedule.wasm: learning-rate at step 3: ran out of its 2000000-unit fuel budget \
             (deterministic: every rank stops here; raise it with --plugin-fuel)"
        ),
        "{e}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn the_wall_clock_backstop_still_stops_a_loop_that_fuel_would_not() {
    let rt = runtime_with(Limits {
        fuel: 1 << 60,
        deadline_ms: 20,
        ..Limits::default()
    });
    let start = std::time::Instant::now();
    let e = first_call_error(&rt, "bad-schedule", &[("mode", "loop")]);
    assert_eq!(e.fault, Fault::Deadline { ms: 20 });
    assert!(
        e.to_string()
            .contains("learning-rate at step 3: exceeded its 20 ms wall-clock deadline"),
        "{e}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(30));
}

/// The fuel of a call depends on the plugin and its inputs only: two runtimes (two ranks) see
/// the same figure for every call, and the same budget stops both or neither.
#[test]
fn fuel_is_the_same_on_every_rank() {
    let mut clock = clock(3, 20, 256);
    let mut states = Vec::new();
    while !clock.finished() {
        states.push(clock.state());
        clock.advance(256, Some(1.0));
    }
    let fuel_of = |rt: &lsgd_host::plugin::Runtime| -> Vec<u64> {
        let mut p = load(rt, "cosine", &[]).unwrap();
        states
            .iter()
            .map(|s| {
                p.call(s).unwrap();
                p.last_fuel().unwrap()
            })
            .collect()
    };
    let (a, b) = (fuel_of(&runtime()), fuel_of(&runtime()));
    assert_eq!(a, b);
    assert!(a.iter().all(|&f| f > 0), "{a:?}");
    // A codec too, on the same bucket.
    let (meta, data) = sample_bucket(64, 48, 2, 7);
    let encode_fuel = |rt: &lsgd_host::plugin::Runtime| {
        let mut p = load(rt, "codec-top-k", &[]).unwrap();
        p.encode(&meta, &data, &[]).unwrap();
        p.last_fuel().unwrap()
    };
    assert_eq!(encode_fuel(&runtime()), encode_fuel(&runtime()));
    // The budget outcome: below a codec call's cost both ranks stop with one message, above
    // it both go on having used the same fuel.
    let cost = encode_fuel(&runtime());
    let outcome = |units: u64| {
        let rt = runtime_with(Limits {
            codec_fuel_base: units,
            codec_fuel_per_float: 0,
            ..Limits::default()
        });
        let mut p = load(&rt, "codec-top-k", &[]).unwrap();
        p.encode(&meta, &data, &[]).map(|_| p.last_fuel())
    };
    let (ea, eb) = (
        outcome(cost / 2).unwrap_err(),
        outcome(cost / 2).unwrap_err(),
    );
    assert_eq!(ea, eb);
    assert!(matches!(ea.fault, Fault::Fuel { .. }), "{ea}");
    assert_eq!(outcome(cost * 2).unwrap(), Some(cost));
    assert_eq!(outcome(cost * 2).unwrap(), Some(cost));
}

#[test]
fn deep_recursion_is_a_stack_overflow_and_a_fresh_instance_works() {
    let rt = runtime();
    let e = first_call_error(&rt, "bad-schedule", &[("mode", "recurse")]);
    assert!(matches!(e.fault, Fault::Trap(_)), "{:?}", e.fault);
    assert!(
        e.to_string().contains(
            "bad-schedule.wasm: learning-rate at step 3: trapped: stack overflow: the call stack \
             is exhausted"
        ),
        "{e}"
    );
    let mut p = load(&rt, "bad-schedule", &[("mode", "recurse")]).unwrap();
    let state = clock(1, 10, 256).state();
    assert!(p.call(&state).is_err());
    p.configure(&owned(&[("mode", "ok")])).unwrap();
    assert_eq!(p.call(&state).unwrap().as_f64(), 0.1);
}

#[test]
fn a_component_over_the_size_limit_is_refused_before_it_is_read() {
    let d = scratch("too-big");
    // A component header, then nothing: were it compiled, it would fail as invalid instead.
    let path = write(&d, "huge.wasm", b"\0asm\x0d\0\x01\0");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(65 << 20).unwrap();
    let e = load_err(&runtime(), &path);
    assert!(matches!(e.fault, Fault::Load(_)), "{e}");
    assert!(
        e.to_string().contains(
            "huge.wasm: load: the component is 65.0 MiB, over the 64 MiB limit on a plugin's \
             size (raise it with --plugin-max-mb)"
        ),
        "{e}"
    );
    let rt = runtime_with(Limits {
        max_component_bytes: 1 << 20,
        ..Limits::default()
    });
    let path = write(&d, "big.wasm", b"\0asm\x0d\0\x01\0");
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(2 << 20).unwrap();
    let e = load_err(&rt, &path);
    assert!(
        e.to_string()
            .contains("the component is 2.0 MiB, over the 1 MiB limit"),
        "{e}"
    );
    assert!(rt.load(&plugin_path("warmup"), None).is_ok());
}

/// A bad codec and a bucket of 48 x 32 + 32 floats at step 2.
fn bad_codec(rt: &lsgd_host::plugin::Runtime, settings: &[(&str, &str)]) -> Plugin {
    load(rt, "bad-codec", settings).unwrap()
}

#[test]
fn a_huge_decoded_list_is_refused() {
    // Ample fuel: writing 4M floats costs more than a 1568-float bucket's budget, which would
    // stop the call before its result is checked.
    let rt = runtime_with(Limits {
        codec_fuel_base: 1 << 40,
        ..Limits::default()
    });
    let mut p = bad_codec(&rt, &[("mode", "huge-decode")]);
    let (meta, data) = sample_bucket(48, 32, 2, 7);
    let payload = p.encode(&meta, &data, &[]).unwrap();
    let e = p.decode(&meta, &[payload]).unwrap_err();
    assert!(matches!(e.fault, Fault::BadOutput(_)), "{e}");
    assert!(
        e.to_string().contains(
            "bad-codec.wasm: decode at step 2: returned an invalid value: 4194304 floats for \
             bucket 0 of 1568 floats"
        ),
        "{e}"
    );
}

#[test]
fn a_payload_far_above_the_bucket_is_refused() {
    let mut p = bad_codec(&runtime(), &[("mode", "huge-encode")]);
    let (meta, data) = sample_bucket(48, 32, 2, 7);
    let e = p.encode(&meta, &data, &[]).unwrap_err();
    assert!(matches!(e.fault, Fault::BadOutput(_)), "{e}");
    // Identity's 6272 bytes, times 64, plus 64.
    assert!(
        e.to_string().contains(
            "bad-codec.wasm: encode at step 2: returned an invalid value: a payload of 401472 \
             bytes for bucket 0 of 1568 floats (6272 bytes): over the bound of 8 x the bucket's \
             bytes + 64 KiB = 115712 bytes"
        ),
        "{e}"
    );
    let mut ok = bad_codec(&runtime(), &[("mode", "ok")]);
    assert_eq!(ok.encode(&meta, &data, &[]).unwrap().len(), 6272);
}

#[test]
fn a_slow_codec_under_its_budget_warns_once_and_is_not_stopped() {
    let (meta, data) = sample_bucket(48, 32, 2, 7);
    let slow = [("mode", "slow"), ("spin", "200000")];
    // What the slow encode costs, under the default budget.
    let mut p = bad_codec(&runtime(), &slow);
    p.encode(&meta, &data, &[]).unwrap();
    let cost = p.last_fuel().unwrap();
    assert_eq!(p.slow_warnings().count(), 0, "far under the default budget");
    // A budget of 1.5 times that: two thirds used.
    let tight = |units: u64| {
        runtime_with(Limits {
            codec_fuel_base: units,
            codec_fuel_per_float: 0,
            ..Limits::default()
        })
    };
    let rt = tight(cost * 3 / 2);
    let mut p = bad_codec(&rt, &slow);
    for step in 2..6 {
        let meta = lsgd_codec::Meta {
            step,
            ..meta.clone()
        };
        p.encode(&meta, &data, &[]).unwrap();
    }
    let warnings: Vec<&str> = p.slow_warnings().collect();
    assert_eq!(warnings.len(), 1, "one warning per call name: {warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "plugin {}: encode at step 2 used 67% of its fuel ({cost} of {} units",
            plugin_path("bad-codec").display(),
            cost * 3 / 2
        )),
        "{}",
        warnings[0]
    );
    // Its decode is cheap: no warning for it.
    let payload = p.encode(&meta, &data, &[]).unwrap();
    p.decode(&meta, &[payload]).unwrap();
    assert_eq!(p.slow_warnings().count(), 1);
    // Under a budget below its cost, the same call is stopped, on every rank alike.
    let mut p = bad_codec(&tight(cost / 2), &slow);
    let e = p.encode(&meta, &data, &[]).unwrap_err();
    assert_eq!(
        e.fault,
        Fault::Fuel {
            units: cost / 2,
            remedy: "raise it with --codec-fuel-per-float"
        }
    );
    assert!(
        e.to_string().contains("encode at step 2: ran out of its"),
        "{e}"
    );
}

#[test]
fn memory_growing_at_every_call_hits_the_cap_then_a_fresh_instance_works() {
    let rt = runtime_with(Limits {
        memory_bytes: 8 << 20,
        ..Limits::default()
    });
    let mut p = load(&rt, "bad-schedule", &[("mode", "leak")]).unwrap();
    let mut clock = clock(1, 100_000, 256);
    let e = loop {
        let state = clock.state();
        match p.call(&state) {
            Ok(out) => assert_eq!(out.as_f64(), 0.1),
            Err(e) => break e,
        }
        assert!(state.step < 10_000, "no fault after 10,000 calls");
        clock.advance(256, Some(1.0));
    };
    let step = e.step.unwrap();
    assert!(step > 100, "{e}");
    assert!(
        matches!(e.fault, Fault::MemoryCap { cap, .. } if cap == 8 << 20),
        "{e}"
    );
    assert!(
        e.to_string().contains(&format!(
            "bad-schedule.wasm: learning-rate at step {step}: tried to grow its memory to"
        )) && e
            .to_string()
            .contains("over the 8 MiB cap (raise it with --plugin-memory-mb)"),
        "{e}"
    );
    // The next call gets a fresh instance, whose memory starts small again.
    assert_eq!(p.call(&clock.state()).unwrap().as_f64(), 0.1);
}

#[test]
fn memory_bomb_hits_the_cap() {
    // Ample fuel and time: writing 8 MiB must hit the cap, not a budget.
    let rt = runtime_with(Limits {
        memory_bytes: 8 << 20,
        deadline_ms: 5_000,
        fuel: 1 << 40,
        ..Limits::default()
    });
    let e = first_call_error(&rt, "bad-schedule", &[("mode", "grow")]);
    assert!(
        matches!(e.fault, Fault::MemoryCap { cap, .. } if cap == 8 << 20),
        "{e}"
    );
    assert!(e.to_string().contains("over the 8 MiB cap"), "{e}");
}

#[test]
fn invalid_learning_rates_are_refused() {
    let rt = runtime();
    for (mode, shown) in [("nan", "NaN"), ("negative", "-1"), ("infinite", "inf")] {
        let e = first_call_error(&rt, "bad-schedule", &[("mode", mode)]);
        assert_eq!(e.step, Some(3));
        assert!(
            e.to_string().contains(&format!(
                "learning-rate at step 3: returned an invalid value: learning rate {shown}"
            )),
            "{e}"
        );
    }
}

#[test]
fn invalid_batches_are_refused() {
    let rt = runtime();
    for (batch, why) in [
        ("0", "must be between 1 and --max-batch 65536"),
        ("131072", "must be between 1"),
        ("1000", "not divisible by the world size 32"),
    ] {
        let e = first_call_error(&rt, "bad-batch", &[("batch", batch)]);
        assert!(
            e.to_string().contains(&format!(
                "global-batch at step 3: returned an invalid value: global batch {batch}: {why}"
            )),
            "{e}"
        );
    }
}

#[test]
fn invalid_epsilons_are_refused() {
    let rt = runtime();
    for eps in ["1", "-0.5"] {
        let e = first_call_error(&rt, "bad-smoothing", &[("epsilon", eps)]);
        assert!(
            e.to_string()
                .contains("epsilon at step 3: returned an invalid value: label-smoothing epsilon"),
            "{e}"
        );
    }
}

#[test]
fn a_required_parameter_must_be_given() {
    let rt = runtime();
    let mut p = rt.load(&plugin_path("bad-smoothing"), None).unwrap();
    assert!(p.params().is_empty());
    let e = p.call(&clock(1, 10, 256).state()).unwrap_err();
    assert_eq!((e.call, e.step), ("configure", Some(0)));
    assert!(
        e.to_string()
            .contains("missing required parameter 'epsilon'"),
        "{e}"
    );
    p.configure(&owned(&[("epsilon", "0.25")])).unwrap();
    assert_eq!(p.call(&clock(1, 10, 256).state()).unwrap().as_f64(), 0.25);
}

#[test]
fn a_fresh_instance_after_a_trap_works() {
    let rt = runtime();
    let mut p = load(&rt, "bad-schedule", &[("mode", "trap")]).unwrap();
    let state = clock(1, 10, 256).state();
    assert!(p.call(&state).is_err());
    // The same instance cannot be re-entered after a trap; asking again gets a fresh one.
    assert!(p.call(&state).is_err(), "still configured to trap");
    p.configure(&owned(&[("mode", "ok")])).unwrap();
    assert_eq!(p.call(&state).unwrap().as_f64(), 0.1);
    // A fuel fault is recoverable the same way.
    let mut p = load(&rt, "bad-schedule", &[("mode", "loop")]).unwrap();
    assert!(p.call(&state).is_err());
    p.configure(&owned(&[("mode", "ok")])).unwrap();
    assert_eq!(p.call(&state).unwrap().as_f64(), 0.1);
}

#[test]
fn sandbox_has_a_fixed_clock_no_environment_and_no_files() {
    let rt = runtime();
    let state = clock(1, 10, 256).state();
    let probe = |mode: &str| {
        load(&rt, "bad-schedule", &[("mode", mode)])
            .unwrap()
            .call(&state)
            .unwrap()
            .as_f64()
    };
    // 2017-06-08T00:00:00Z, fixed, whatever the host's clock says.
    assert_eq!(probe("clock"), 1_496_880_000.0);
    assert_eq!(probe("env"), 0.0, "no environment variables, no arguments");
    assert_eq!(probe("file"), 0.0, "no preopened directories");
    let p = rt.load(&plugin_path("bad-schedule"), None).unwrap();
    // WASI (from Rust's std) and the contract's type-only interface; nothing else.
    assert!(
        p.facts()
            .imports
            .iter()
            .all(|i| i.starts_with("wasi:") || i == "lsgd:policy/types@0.1.0"),
        "{:?}",
        p.facts().imports
    );
}
