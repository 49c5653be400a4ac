//! `scripts/env.sh`, which every script sources first: sourced again under another cache root
//! (a cold run started from a shell that had sourced it), it derives the build's paths from the
//! new root, and keeps the ones set by hand.

use std::process::Command;

use crate::common::*;

/// What `body` echoes after bash ran it with a clean set of the project's variables.
fn sourced(body: &str, target: Option<&str>) -> String {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!(
            "env_sh={}; {body}",
            root().join("scripts/env.sh").display()
        ))
        .env("HOME", "/nonexistent-home");
    for var in [
        "LSGD_CACHE_ROOT",
        "LSGD_DERIVED_FROM",
        "CARGO_TARGET_DIR",
        "LSGD_CACHE_DIR",
        "LSGD_VENV",
        "LSGD_OMPI5",
        "LIBTORCH",
        "XDG_CACHE_HOME",
    ] {
        c.env_remove(var);
    }
    if let Some(t) = target {
        c.env("CARGO_TARGET_DIR", t);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o).trim().to_string()
}

#[test]
fn a_second_source_under_another_cache_root_derives_the_paths_again() {
    let body = r#"source "$env_sh"; echo "$CARGO_TARGET_DIR";
        export LSGD_CACHE_ROOT=/cold; source "$env_sh";
        echo "$CARGO_TARGET_DIR $LSGD_CACHE_DIR $LSGD_VENV ${LIBTORCH%%/lib/*} $LSGD_OMPI5""#;
    assert_eq!(
        sourced(body, None),
        "/nonexistent-home/.cache/lsgd-host/target\n\
         /cold/target /cold/components /cold/venv /cold/venv /cold/openmpi5"
    );
    // A target directory chosen by hand is the caller's, whatever the root.
    assert_eq!(
        sourced(body, Some("/mine")),
        "/mine\n/mine /cold/components /cold/venv /cold/venv /cold/openmpi5"
    );
}
