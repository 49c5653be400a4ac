//! Golden traces of every reference plugin under tests/golden/, compared byte for byte.
//! Regenerate after an intended change with `LSGD_BLESS=1 cargo test golden` and review the diff.

use lsgd_host::policy::{Bounds, PolicySet};
use lsgd_host::trace::{trace, write_csv};

use crate::common::*;

/// `--set` pairs of one plugin.
type Settings = &'static [(&'static str, &'static str)];

/// (golden file, plugins with settings) — each a short but complete 90-epoch run.
const CASES: &[(&str, &[(&str, Settings)])] = &[
    ("warmup", &[("warmup", &[])]),
    ("warmup-constant", &[("warmup", &[("warmup", "constant")])]),
    ("cosine", &[("cosine", &[("warmup_epochs", "5")])]),
    (
        "cosine-restarts",
        &[("cosine", &[("restart_epochs", "10"), ("restart_mult", "2")])],
    ),
    (
        "poly",
        &[("poly", &[("warmup_epochs", "5"), ("power", "2")])],
    ),
    ("constant", &[("constant", &[])]),
    (
        "batch-ramp",
        &[("batch-ramp", &[("max_batch", "32768")]), ("warmup", &[])],
    ),
    (
        "constant-batch",
        &[("constant-batch", &[("batch", "4096")]), ("constant", &[])],
    ),
    (
        "label-smoothing",
        &[(
            "label-smoothing",
            &[("final_epsilon", "0.0"), ("ramp_end_epoch", "90")],
        )],
    ),
];

#[test]
fn golden_traces() {
    let rt = runtime();
    let bless = std::env::var_os("LSGD_BLESS").is_some();
    let mut failures = Vec::new();
    for (file, plugins) in CASES {
        let loaded = plugins
            .iter()
            .map(|(name, set)| load(&rt, name, set).unwrap())
            .collect();
        let mut set = PolicySet::new(loaded, Bounds::default()).unwrap();
        let rows = trace(&mut set, clock(90, 10, 8192)).unwrap();
        let mut csv = Vec::new();
        write_csv(&rows, &mut csv).unwrap();
        let path = root().join("tests/golden").join(format!("{file}.csv"));
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &csv).unwrap();
            continue;
        }
        let want = std::fs::read(&path)
            .unwrap_or_else(|_| panic!("{} missing: run with LSGD_BLESS=1", path.display()));
        if want != csv {
            let line = want
                .split(|b| *b == b'\n')
                .zip(csv.split(|b| *b == b'\n'))
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            failures.push(format!("{file}.csv differs first at line {}", line + 1));
        }
    }
    assert!(
        failures.is_empty(),
        "golden traces changed (LSGD_BLESS=1 to accept):\n{}",
        failures.join("\n")
    );
}
