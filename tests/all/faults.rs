//! Every way a plugin can be bad gets a clear error that names the plugin, the call and the
//! step, and the host keeps running: one test per case.

use lsgd_host::plugin::{Fault, Limits, PluginError, PolicyKind};
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
    assert!(
        text.contains("bad-schedule.wasm: learning-rate at step 3: trapped"),
        "{text}"
    );
    assert!(
        text.contains("plugin stderr:") && text.contains("panicked"),
        "{text}"
    );
}

#[test]
fn infinite_loop_hits_the_deadline() {
    let rt = runtime_with(Limits {
        deadline_ms: 20,
        ..Limits::default()
    });
    let start = std::time::Instant::now();
    let e = first_call_error(&rt, "bad-schedule", &[("mode", "loop")]);
    assert_eq!(e.fault, Fault::Deadline { ms: 20 });
    assert!(
        e.to_string()
            .contains("learning-rate at step 3: exceeded its 20 ms deadline"),
        "{e}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn memory_bomb_hits_the_cap() {
    // A generous deadline: writing 8 MiB on a loaded machine must hit the cap, not the clock.
    let rt = runtime_with(Limits {
        memory_bytes: 8 << 20,
        deadline_ms: 5_000,
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
    // A deadline fault is recoverable the same way.
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
