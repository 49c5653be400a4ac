//! The README and docs/ as a reader meets them: every relative link (and its `#anchor`) leads
//! somewhere, and every script they tell the reader to run can be run as written.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::*;

/// README.md and every Markdown file under docs/.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut pages = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut pages);
    pages.sort();
    pages
}

/// The page's prose: lines outside fenced code blocks, with inline code spans removed.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let spans: Vec<&str> = line.split('`').collect();
            let outside: String = spans
                .iter()
                .step_by(2)
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            lines.push((i + 1, outside));
        }
    }
    lines
}

/// The targets of the inline links `[text](target)` and images `![alt](target)` in `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of `page`'s headings, with GitHub's `-1`, `-2` … for repeated ones.
fn anchors(page: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let base = slug(heading.trim_start_matches('#'));
        let mut anchor = base.clone();
        for n in 1.. {
            if seen.insert(anchor.clone()) {
                break;
            }
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for (line, prose) in prose(&text) {
            for target in link_targets(&prose) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(path)
                };
                if !file.exists() {
                    broken.push(format!("{name}:{line}: {target}: no such file"));
                } else if !anchor.is_empty() && !anchors(&file).contains(anchor) {
                    broken.push(format!(
                        "{name}:{line}: {target}: no heading with that anchor"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_script_the_readme_and_docs_name_is_executable() {
    let mut named = HashSet::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for word in text.split(|c: char| c.is_whitespace() || "`()[]\"',;|".contains(c)) {
            let word = word.trim_start_matches("./").trim_end_matches(['.', ':']);
            let dir = ["scripts/", "examples/"]
                .iter()
                .any(|d| word.starts_with(d));
            if dir && word.ends_with(".sh") && !word.contains('*') {
                named.insert(word.to_string());
            }
        }
    }
    assert!(named.contains("scripts/netlab.sh"), "{named:?}");
    let mut wrong = Vec::new();
    for script in &named {
        match std::fs::metadata(root().join(script)) {
            Ok(m) if m.permissions().mode() & 0o111 == 0o111 => {}
            Ok(_) => wrong.push(format!(
                "{script} is not executable (git update-index --chmod=+x)"
            )),
            Err(e) => wrong.push(format!("{script}: {e}")),
        }
    }
    wrong.sort();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_slug_of_a_heading_is_githubs() {
    assert_eq!(
        slug(" Changing a policy at resume (`--allow-policy-change`)"),
        "changing-a-policy-at-resume---allow-policy-change"
    );
    assert_eq!(
        slug(" libtorch: the install we chose"),
        "libtorch-the-install-we-chose"
    );
    assert_eq!(
        slug(" Codec state (contract 0.4)"),
        "codec-state-contract-04"
    );
}
