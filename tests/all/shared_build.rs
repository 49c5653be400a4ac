//! One compiled wasmtime for the host's tests and lsgd-torch's wheel. `scripts/test.sh` builds
//! the tests, then `scripts/python-package.sh` builds the wheel in the same target directory;
//! cargo shares a compiled crate between the two only where both resolve it with the same
//! features, profile and dependencies, else a cold run compiles wasmtime and Cranelift a second
//! time (~10 minutes on 2 cores). lsgd-torch alone would resolve a few of wasmtime's
//! dependencies with fewer features: `crates/python/Cargo.toml` names those features.

use std::collections::{HashMap, HashSet};
use std::process::Command;

use serde_json::Value;

use crate::common::*;

/// `cargo … --unit-graph`: every unit cargo would compile, with its features and profile.
fn unit_graph(args: &[String]) -> Vec<Value> {
    let o = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .args(["--locked", "-Z", "unstable-options", "--unit-graph"])
        .env("RUSTC_BOOTSTRAP", "1")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let graph: Value = serde_json::from_slice(&o.stdout).unwrap();
    graph["units"].as_array().unwrap().clone()
}

/// The indices of a unit's dependencies in its graph.
fn deps(u: &Value) -> impl Iterator<Item = usize> + '_ {
    u["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["index"].as_u64().unwrap() as usize)
}

/// A key per unit that two graphs share only for one compiled artifact: the package, target,
/// mode, features and profile (less its name), and the keys of its dependencies.
fn keys(units: &[Value]) -> Vec<String> {
    fn key(i: usize, units: &[Value], memo: &mut HashMap<usize, String>) -> String {
        if let Some(k) = memo.get(&i) {
            return k.clone();
        }
        let u = &units[i];
        let mut profile = u["profile"].clone();
        profile.as_object_mut().unwrap().remove("name");
        let mut deps: Vec<String> = deps(u).map(|d| key(d, units, memo)).collect();
        deps.sort();
        let own = format!(
            "{} {} {} {} {profile}",
            u["pkg_id"], u["target"]["name"], u["mode"], u["features"]
        );
        let k = blake3::hash(format!("{own} [{}]", deps.join(",")).as_bytes())
            .to_hex()
            .to_string();
        memo.insert(i, k.clone());
        k
    }
    let mut memo = HashMap::new();
    (0..units.len()).map(|i| key(i, units, &mut memo)).collect()
}

/// The crates `scripts/test.sh` builds the tests of, as its `crates=(…)` line names them.
fn test_build_args() -> Vec<String> {
    let script = std::fs::read_to_string(root().join("scripts/test.sh")).unwrap();
    let line = script
        .lines()
        .find(|l| l.starts_with("crates=("))
        .expect("scripts/test.sh names its crates in one `crates=(…)` line");
    let mut args: Vec<String> = ["test", "--no-run", "--lib", "--bins", "--tests"]
        .map(String::from)
        .to_vec();
    args.extend(
        line.trim_start_matches("crates=(")
            .trim_end_matches(')')
            .split_whitespace()
            .map(String::from),
    );
    args
}

#[test]
fn the_wheel_build_reuses_the_wasmtime_the_test_build_compiled() {
    let tests = unit_graph(&test_build_args());
    let wheel =
        unit_graph(&["rustc", "-p", "lsgd-torch", "--lib", "--profile", "dev"].map(String::from));
    let test_keys: HashSet<String> = keys(&tests).into_iter().collect();
    let wheel_keys = keys(&wheel);
    let name = |u: &Value| {
        u["pkg_id"]
            .as_str()
            .unwrap()
            .rsplit('#')
            .next()
            .unwrap()
            .to_string()
    };
    // Every unit of wasmtime's closure in the wheel build, build scripts and proc macros too.
    let root = wheel
        .iter()
        .position(|u| name(u).starts_with("wasmtime@") && u["mode"] == "build")
        .expect("the wheel build compiles wasmtime");
    let (mut todo, mut seen) = (vec![root], HashSet::new());
    while let Some(i) = todo.pop() {
        if seen.insert(i) {
            todo.extend(deps(&wheel[i]));
        }
    }
    assert!(
        seen.len() > 100,
        "wasmtime's closure has {} units",
        seen.len()
    );
    let features = |units: &[Value], n: &str| -> Vec<String> {
        let mut f: Vec<String> = units
            .iter()
            .filter(|u| name(u) == n)
            .map(|u| u["features"].to_string())
            .collect();
        f.sort();
        f.dedup();
        f
    };
    // The causes: units that differ though all their dependencies are shared.
    let shared = |i: &usize| test_keys.contains(&wheel_keys[*i]);
    let mut apart: Vec<String> = seen
        .iter()
        .filter(|i| !shared(i))
        .filter(|&&i| deps(&wheel[i]).all(|d| shared(&d)))
        .map(|&i| {
            let n = name(&wheel[i]);
            let (w, t) = (features(&wheel, &n), features(&tests, &n));
            format!("{n}: wheel build {w:?}, test build {t:?}")
        })
        .collect();
    apart.sort();
    apart.dedup();
    assert!(
        apart.is_empty(),
        "the wheel build would compile these (and what depends on them) a second time; \
         give lsgd-torch the test build's features in crates/python/Cargo.toml:\n{}",
        apart.join("\n")
    );
}
