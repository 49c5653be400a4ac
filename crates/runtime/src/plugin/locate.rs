//! Finds a plugin file from what the user typed: a path, or a bare name such as `warmup` or
//! `warmup.wasm` looked up in folders the caller names ([`locate_in`]). lsgd-host looks in
//! `$LSGD_PLUGIN_PATH` and next to its binary ([`search_dirs`]: `target/release/lsgd-host`
//! finds `target/plugins/`, where `scripts/build-plugins.sh` puts the reference plugins);
//! lsgd-torch, whose binary is the Python interpreter, looks in `$LSGD_PLUGIN_PATH` and in its
//! package's `plugins/` folder, which the wheel fills with the reference plugins. Only files
//! count: a folder `my-one-cycle/` in the current directory (a plugin project of `lsgd-host
//! new`, say) does not hide the plugin `my-one-cycle`; a project folder that holds its built
//! component, `my-one-cycle/target/my-one-cycle.wasm`, stands for it.

use std::path::{Path, PathBuf};

use super::words::{CLI, Words};
use crate::{Error, Result};

/// Resolves `arg` to an existing plugin file as lsgd-host does, in [`search_dirs`].
pub fn locate(arg: &str) -> Result<PathBuf> {
    locate_in(arg, &search_dirs(), &CLI)
}

/// Resolves `arg` to an existing plugin file: a path as given, or a bare name in the first of
/// `dirs` that holds it; otherwise the error ([`Error::NotFound`]) names every folder looked in
/// and what `words` say to do.
pub fn locate_in(arg: &str, dirs: &[PathBuf], words: &Words) -> Result<PathBuf> {
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
        hint: words.not_found,
    })
}

/// The entries of `$LSGD_PLUGIN_PATH`, in order: where a user's own plugins come first.
pub fn plugin_path() -> Vec<PathBuf> {
    std::env::var_os("LSGD_PLUGIN_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default()
}

/// lsgd-host's folders: `$LSGD_PLUGIN_PATH` entries, then `<binary dir>/../plugins`, then
/// `./target/plugins`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = plugin_path();
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

    #[test]
    fn a_bare_name_is_found_in_the_first_folder_given_and_a_path_wins_over_them() {
        let dir = std::env::temp_dir().join(format!("lsgd-locate-in-{}", std::process::id()));
        let (own, packaged, empty) = (dir.join("own"), dir.join("packaged"), dir.join("empty"));
        for d in [&own, &packaged, &empty] {
            std::fs::create_dir_all(d).unwrap();
        }
        for d in [&own, &packaged] {
            std::fs::write(d.join("warmup.wasm"), b"\0asm").unwrap();
        }
        std::fs::write(packaged.join("cosine.wasm"), b"\0asm").unwrap();
        let canonical = |p: PathBuf| p.canonicalize().unwrap();
        let dirs = [empty.clone(), own.clone(), packaged.clone()];
        assert_eq!(
            locate_in("warmup", &dirs, &CLI).unwrap(),
            canonical(own.join("warmup.wasm"))
        );
        assert_eq!(
            locate_in("cosine.wasm", &dirs, &CLI).unwrap(),
            canonical(packaged.join("cosine.wasm"))
        );
        // A path is taken as given, whatever the folders hold.
        let path = packaged.join("warmup.wasm");
        assert_eq!(
            locate_in(&path.display().to_string(), &dirs, &CLI).unwrap(),
            path
        );
        // Not found: every folder, in order, and the caller's advice.
        static ADVICE: Words = Words {
            not_found: "give the plugin's path",
            ..CLI
        };
        let err = locate_in("nope", &dirs[..2], &ADVICE)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "no plugin file `nope`: not a path, and no nope.wasm in {}, {} (give the \
                 plugin's path)",
                empty.display(),
                own.display()
            )
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
