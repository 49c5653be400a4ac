//! Where the project's Python virtual environment is, found exactly as `scripts/env.sh` finds
//! it, so that the benchmarks and tests run the interpreter `scripts/setup.sh` filled.
//!
//! env.sh expands `${VAR:-default}`, which takes the default for a variable that is unset *or
//! empty*; the lookups here do the same.

use std::ffi::OsString;
use std::path::PathBuf;

/// The cache root: `$LSGD_CACHE_ROOT`, else `$XDG_CACHE_HOME/lsgd-host`, else
/// `$HOME/.cache/lsgd-host`.
pub fn cache_root() -> PathBuf {
    cache_root_in(&env)
}

/// The venv: `$LSGD_VENV`, else `$LSGD_CACHE_ROOT/venv` (with [`cache_root`]'s defaults).
pub fn dir() -> PathBuf {
    dir_in(&env)
}

/// The venv's interpreter, `bin/python` in [`dir`].
pub fn python() -> PathBuf {
    dir().join("bin/python")
}

/// A variable as `${VAR:-…}` sees it: an empty value counts as unset.
fn env(name: &str) -> Option<OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

fn cache_root_in(var: &dyn Fn(&str) -> Option<OsString>) -> PathBuf {
    if let Some(root) = var("LSGD_CACHE_ROOT") {
        return root.into();
    }
    let cache = var("XDG_CACHE_HOME").unwrap_or_else(|| {
        // `$HOME/.cache` in the shell: an unset HOME leaves `/.cache`.
        let mut home = var("HOME").unwrap_or_default();
        home.push("/.cache");
        home
    });
    PathBuf::from(cache).join("lsgd-host")
}

fn dir_in(var: &dyn Fn(&str) -> Option<OsString>) -> PathBuf {
    var("LSGD_VENV").map_or_else(|| cache_root_in(var).join("venv"), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(vars: &[(&str, &str)]) -> PathBuf {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
                .filter(|v| !v.is_empty())
        };
        dir_in(&lookup)
    }

    #[test]
    fn the_venv_is_found_as_env_sh_finds_it() {
        let all = [
            ("LSGD_VENV", "/v"),
            ("LSGD_CACHE_ROOT", "/root"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(dir_with(&all), PathBuf::from("/v"));
        assert_eq!(dir_with(&all[1..]), PathBuf::from("/root/venv"));
        assert_eq!(dir_with(&all[2..]), PathBuf::from("/xdg/lsgd-host/venv"));
        assert_eq!(
            dir_with(&all[3..]),
            PathBuf::from("/home/u/.cache/lsgd-host/venv")
        );
        assert_eq!(dir_with(&[]), PathBuf::from("/.cache/lsgd-host/venv"));
        // Empty is unset, as with `${VAR:-…}`.
        let empty = [
            ("LSGD_VENV", ""),
            ("LSGD_CACHE_ROOT", ""),
            ("XDG_CACHE_HOME", ""),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            dir_with(&empty),
            PathBuf::from("/home/u/.cache/lsgd-host/venv")
        );
    }
}
