//! Finds a plugin file from what the user typed: a path, or a bare name such as `warmup` or
//! `warmup.wasm` looked up in `$LSGD_PLUGIN_PATH` and next to the installed binary
//! (`target/release/lsgd-host` finds `target/plugins/`, where `scripts/build-plugins.sh` puts
//! the reference plugins). Only files count: a folder `my-one-cycle/` in the current directory (a
//! plugin project of `lsgd-host new`, say) does not hide the plugin `my-one-cycle`; a project
//! folder that holds its built component, `my-one-cycle/target/my-one-cycle.wasm`, stands for it.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Resolves `arg` to an existing plugin file, or says everywhere it looked
/// ([`Error::NotFound`]).
pub fn locate(arg: &str) -> Result<PathBuf> {
    let given = Path::new(arg);
    if given.is_file() {
        return Ok(given.to_path_buf());
    }
    let name = given
        .file_name()
        .map_or_else(|| arg.to_string(), |n| n.to_string_lossy().into_owned());
    let mut passed_over = Vec::new();
    if given.is_dir() {
        let built = given.join("target").join(format!("{name}.wasm"));
        if built.is_file() {
            return Ok(built);
        }
        passed_over.push(format!(
            "{arg} is a directory without a built {} (run its ./build.sh)",
            built.display()
        ));
    } else if given.components().count() > 1 {
        // A path with a directory part names one file; a missing one is reported by the load.
        return Ok(given.to_path_buf());
    }
    let file = if name.ends_with(".wasm") {
        name
    } else {
        format!("{name}.wasm")
    };
    let dirs = search_dirs();
    for candidate in dirs.iter().map(|d| d.join(&file)) {
        if candidate.is_file() {
            return Ok(candidate.canonicalize().unwrap_or(candidate));
        }
        if candidate.is_dir() {
            passed_over.push(format!("{} is a directory", candidate.display()));
        }
    }
    Err(Error::NotFound {
        arg: arg.to_string(),
        looked: dirs.iter().map(|d| d.display().to_string()).collect(),
        file,
        passed_over,
    })
}

/// `$LSGD_PLUGIN_PATH` entries, then `<binary dir>/../plugins`, then `./target/plugins`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LSGD_PLUGIN_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(bin_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push(bin_dir.join("../plugins"));
        // Test binaries live one level deeper, in target/<profile>/deps.
        dirs.push(bin_dir.join("../../plugins"));
    }
    dirs.push(PathBuf::from("target/plugins"));
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_of_the_same_name_is_passed_over_and_named_when_nothing_matches() {
        let dir = std::env::temp_dir().join(format!("lsgd-locate-{}", std::process::id()));
        let name = dir.join("my-one-cycle");
        std::fs::create_dir_all(&name).unwrap();
        let arg = name.display().to_string();
        let err = locate(&arg).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "no plugin file `{arg}`: not a path, and no my-one-cycle.wasm in "
            )),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "(passed over: {arg} is a directory without a built {arg}/target/my-one-cycle.wasm \
                 (run its ./build.sh))"
            )),
            "{err}"
        );
        // Once built, the project stands for its component.
        let built = name.join("target/my-one-cycle.wasm");
        std::fs::create_dir_all(built.parent().unwrap()).unwrap();
        std::fs::write(&built, b"\0asm").unwrap();
        assert_eq!(locate(&arg).unwrap(), built);
        // A file is found as given.
        let file = dir.join("plugin.wasm");
        std::fs::write(&file, b"\0asm").unwrap();
        assert_eq!(locate(&file.display().to_string()).unwrap(), file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
