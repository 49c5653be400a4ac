//! Finds a plugin file from what the user typed: a path, or a bare name such as `warmup` or
//! `warmup.wasm` looked up in `$LSGD_PLUGIN_PATH` and next to the installed binary
//! (`target/release/lsgd-host` finds `target/plugins/`, where `scripts/build-plugins.sh` puts
//! the reference plugins).

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Resolves `arg` to an existing plugin file, or says everywhere it looked
/// ([`Error::NotFound`]).
pub fn locate(arg: &str) -> Result<PathBuf> {
    let given = Path::new(arg);
    if given.exists() || given.components().count() > 1 {
        return Ok(given.to_path_buf());
    }
    let file = if arg.ends_with(".wasm") {
        arg.to_string()
    } else {
        format!("{arg}.wasm")
    };
    let dirs = search_dirs();
    dirs.iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p))
        .ok_or_else(|| Error::NotFound {
            arg: arg.to_string(),
            looked: dirs.iter().map(|d| d.display().to_string()).collect(),
            file: file.clone(),
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
