//! Golden traces of the reference plugins, compared byte for byte. Every `tests/golden/NAME.toml`
//! is a case: the plugins of a run (one `[[plugin]]` table each, with its `--set` values as
//! `set = ["KEY=VALUE", ...]`), traced over the same short but complete 90-epoch run, fed what
//! training would feed back when the case names them (`metric_file`, `loss_file`,
//! `norms_file`, `drift_file`: paths under `tests/golden/`, as `trace`'s flags of those names); its
//! expected trace is `tests/golden/NAME.csv`. A failure prints a unified diff of the CSV.
//! Add a case by adding a `.toml` file; write or regenerate the CSVs after an intended change
//! with `LSGD_BLESS=1 cargo test golden`, and review the diff.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use lsgd_host::policy::{Bounds, PolicySet};
use lsgd_host::trace::{
    Drift, Inputs, Norms, parse_series, read_input, trace_with_drift, write_csv,
};
use serde::Deserialize;

use crate::common::*;

/// One `tests/golden/*.toml` file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// The plugins of the run, in any order (each goes to the slot of its kind).
    plugin: Vec<CasePlugin>,
    /// Test metrics, one per epoch (`trace --metric-file`).
    metric_file: Option<String>,
    /// Training losses, one per step (`trace --loss-file`).
    loss_file: Option<String>,
    /// Tensor norms for a layer-rate plugin (`trace --norms-file`).
    norms_file: Option<String>,
    /// Window-end drift for a sync plugin's outer steps (`trace --drift-file`); without it,
    /// `trace`'s default of one unit tensor.
    drift_file: Option<String>,
}

impl Case {
    /// The inputs its files describe.
    fn inputs(&self) -> Inputs {
        let path = |f: &String| golden_dir().join(f);
        let series = |f: &Option<String>| {
            f.as_ref()
                .map(|f| read_input(&path(f), parse_series).unwrap())
                .unwrap_or_default()
        };
        Inputs {
            metrics: series(&self.metric_file),
            losses: series(&self.loss_file),
            norms: self
                .norms_file
                .as_ref()
                .map(|f| read_input(&path(f), Norms::parse).unwrap())
                .unwrap_or_default(),
        }
    }

    /// The drift its file describes, or `trace`'s default.
    fn drift(&self) -> Drift {
        self.drift_file
            .as_ref()
            .map(|f| read_input(&golden_dir().join(f), Drift::parse).unwrap())
            .unwrap_or_default()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CasePlugin {
    /// A reference plugin's name (`warmup`, `batch-ramp` ...).
    name: String,
    /// `KEY=VALUE` settings, as after `--set KIND.`.
    #[serde(default)]
    set: Vec<String>,
}

fn golden_dir() -> PathBuf {
    root().join("tests/golden")
}

/// Every case file, by name, sorted so failures are reported in a stable order.
fn cases() -> Vec<(String, PathBuf)> {
    let mut cases: Vec<(String, PathBuf)> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    cases.sort();
    cases
}

/// The CSV trace of one case.
fn run_case(rt: &lsgd_host::plugin::Runtime, path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let case: Case = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let loaded = case
        .plugin
        .iter()
        .map(|p| {
            let set: Vec<(&str, &str)> = p
                .set
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .unwrap_or_else(|| panic!("{}: `{kv}` is not KEY=VALUE", path.display()))
                })
                .collect();
            load(rt, &p.name, &set).unwrap()
        })
        .collect();
    let mut set = PolicySet::new(loaded, Bounds::default()).unwrap();
    let (inputs, drift) = (case.inputs(), case.drift());
    let rows = trace_with_drift(&mut set, clock(90, 10, 8192), &inputs, &drift).unwrap();
    let mut csv = Vec::new();
    write_csv(&rows, &inputs.norms.names(), &drift.names(), &mut csv).unwrap();
    String::from_utf8(csv).unwrap()
}

#[test]
fn golden_traces() {
    let rt = runtime();
    let bless = std::env::var_os("LSGD_BLESS").is_some();
    let cases = cases();
    assert!(!cases.is_empty(), "no cases in {}", golden_dir().display());
    let mut failures = Vec::new();
    for (name, case) in &cases {
        let csv = run_case(&rt, case);
        let path = case.with_extension("csv");
        if bless {
            std::fs::write(&path, &csv).unwrap();
            continue;
        }
        let Ok(want) = std::fs::read_to_string(&path) else {
            failures.push(format!("{} missing: run with LSGD_BLESS=1", path.display()));
            continue;
        };
        if want != csv {
            failures.push(format!(
                "--- tests/golden/{name}.csv\n+++ the trace of tests/golden/{name}.toml\n{}",
                unified_diff(&want, &csv)
            ));
        }
    }
    for orphan in std::fs::read_dir(golden_dir()).unwrap() {
        let p = orphan.unwrap().path();
        if p.extension().is_some_and(|e| e == "csv") && !p.with_extension("toml").exists() {
            failures.push(format!("{} has no case file (.toml)", p.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "golden traces changed (LSGD_BLESS=1 to accept):\n{}",
        failures.join("\n")
    );
}

/// Lines of context around each change, as `diff -u`.
const CONTEXT: usize = 3;
/// Diff lines shown per file; the rest are counted.
const SHOWN: usize = 60;

enum Line<'a> {
    Same(&'a str),
    Removed(&'a str),
    Added(&'a str),
}

/// A line diff of `want` and `got` in unified format (`@@ -a,n +b,m @@` hunks, with context).
fn unified_diff(want: &str, got: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let lines = diff_lines(&a, &b);
    // Line numbers in `want` and `got` before each diff line.
    let mut at = vec![(0, 0)];
    for l in &lines {
        let (x, y) = *at.last().unwrap();
        at.push(match l {
            Line::Same(_) => (x + 1, y + 1),
            Line::Removed(_) => (x + 1, y),
            Line::Added(_) => (x, y + 1),
        });
    }
    // Hunks: each change with its context, overlapping ones merged.
    let mut hunks: Vec<(usize, usize)> = Vec::new();
    for (i, _) in lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !matches!(l, Line::Same(_)))
    {
        let (lo, hi) = (
            i.saturating_sub(CONTEXT),
            (i + CONTEXT + 1).min(lines.len()),
        );
        match hunks.last_mut() {
            Some(h) if lo <= h.1 => h.1 = hi,
            _ => hunks.push((lo, hi)),
        }
    }
    let mut out = Vec::new();
    for (lo, hi) in hunks {
        let ((a0, b0), (a1, b1)) = (at[lo], at[hi]);
        out.push(format!(
            "@@ -{},{} +{},{} @@",
            a0 + 1,
            a1 - a0,
            b0 + 1,
            b1 - b0
        ));
        out.extend(lines[lo..hi].iter().map(|l| match l {
            Line::Same(s) => format!(" {s}"),
            Line::Removed(s) => format!("-{s}"),
            Line::Added(s) => format!("+{s}"),
        }));
    }
    let mut text = String::new();
    for l in out.iter().take(SHOWN) {
        writeln!(text, "{l}").unwrap();
    }
    if out.len() > SHOWN {
        writeln!(text, "... {} more diff lines", out.len() - SHOWN).unwrap();
    }
    text
}

/// A shortest edit from `a` to `b` (longest common subsequence; common ends trimmed first, so
/// the table covers only the changed middle).
fn diff_lines<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<Line<'a>> {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    // lcs[i * w + j]: the longest common subsequence of am[i..] and bm[j..].
    let w = bm.len() + 1;
    let mut lcs = vec![0u32; (am.len() + 1) * w];
    for i in (0..am.len()).rev() {
        for j in (0..bm.len()).rev() {
            lcs[i * w + j] = if am[i] == bm[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    let mut lines: Vec<Line> = a[..head].iter().map(|l| Line::Same(l)).collect();
    let (mut i, mut j) = (0, 0);
    while i < am.len() || j < bm.len() {
        if i < am.len() && j < bm.len() && am[i] == bm[j] {
            lines.push(Line::Same(am[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < am.len() && (j == bm.len() || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            lines.push(Line::Removed(am[i]));
            i += 1;
        } else {
            lines.push(Line::Added(bm[j]));
            j += 1;
        }
    }
    lines.extend(a[a.len() - tail..].iter().map(|l| Line::Same(l)));
    lines
}

#[test]
fn the_diff_shows_changed_lines_with_context() {
    let want = "h\n1\n2\n3\n4\n5\n6\n7\n8\n9\n";
    let got = "h\n1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n";
    assert_eq!(
        unified_diff(want, got),
        "@@ -3,8 +3,9 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n 9\n+10\n"
    );
    assert_eq!(unified_diff("a\nb\n", "a\nb\n"), "");
    assert_eq!(unified_diff("", "x\n"), "@@ -1,0 +1,1 @@\n+x\n");
}
