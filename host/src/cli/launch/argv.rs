//! The command lines `launch` reads and rewrites: its own `-np` spelled for clap, the job's
//! `run` flags it needs to know, and the `--resume` a restart points at the newest checkpoint.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::train::config::Mode;

/// Removes `flag` and its value (`--flag VALUE` or `--flag=VALUE`) from `argv`.
fn drop_flag(argv: &mut Vec<OsString>, flag: &str) {
    let joined = format!("{flag}=");
    let mut i = 0;
    while i < argv.len() {
        if argv[i] == flag {
            argv.drain(i..(i + 2).min(argv.len()));
        } else if argv[i].to_string_lossy().starts_with(&joined) {
            argv.remove(i);
        } else {
            i += 1;
        }
    }
}

/// Rewrites `launch -np N` (mpirun's spelling, which clap cannot take as a short flag) to
/// `launch --np N`; other command lines pass unchanged, and so does everything after `--`.
pub fn spell_np(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = argv.into_iter().collect();
    if argv.get(1).is_none_or(|a| a != "launch") {
        return argv;
    }
    let mut i = 2;
    while i < argv.len() {
        let a = argv[i].to_string_lossy().into_owned();
        if a == "--" || a == "run" {
            break;
        }
        if a == "--mpirun-arg" || a == "--mpirun" {
            i += 2;
            continue;
        }
        if a == "-np" {
            argv[i] = "--np".into();
        } else if let Some(n) = a.strip_prefix("-np=") {
            argv[i] = format!("--np={n}").into();
        }
        i += 1;
    }
    argv
}

/// What the job's `run` flags say that the launcher needs.
pub(super) struct Job {
    /// `run` and its flags as given.
    pub(super) run: Vec<OsString>,
    pub(super) out: PathBuf,
    /// The `--resume` given, if any.
    pub(super) resume: Option<PathBuf>,
    pub(super) global_batch: u32,
    pub(super) mode: Mode,
    /// `--collective-timeout` (zero: none).
    pub(super) collective_timeout: Duration,
    /// `--fault-tolerance`: the job survives lost ranks itself, on Open MPI 5's ULFM.
    pub(super) fault_tolerance: bool,
    /// Whether the run's flags name `--min-np`.
    pub(super) min_np_given: bool,
    /// `--grow-back`: the job starts replacements for lost ranks itself.
    pub(super) grow_back: bool,
}

impl Job {
    /// Parses `run`'s flags with `run`'s own definitions (the `--config` file's too), so the
    /// launcher sees the same `--out` and `--global-batch` the ranks will.
    pub(super) fn parse(command: &[OsString]) -> Result<Job> {
        use clap::Args as _;
        if command.first().is_none_or(|c| c != "run") {
            bail!(
                "launch runs `lsgd-host run`: write `lsgd-host launch -np N -- run …` (got `{}`)",
                command
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        let parser = || {
            super::super::run::RunArgs::augment_args(clap::Command::new("run"))
                .args_override_self(true)
        };
        let m = parser()
            .try_get_matches_from(command)
            .map_err(|e| anyhow::anyhow!("the run's flags after `--`: {e}"))?;
        let m = match m.get_one::<PathBuf>("config") {
            Some(path) => {
                let mut argv = command.to_vec();
                let from_file = super::super::run::config_args(path)?;
                argv.splice(1..1, from_file.into_iter().map(Into::into));
                parser()
                    .try_get_matches_from(argv)
                    .map_err(|e| anyhow::anyhow!("the run's flags after `--`: {e}"))?
            }
            None => m,
        };
        Ok(Job {
            run: command.to_vec(),
            out: m
                .get_one::<PathBuf>("out")
                .cloned()
                .context("run has --out")?,
            resume: m.get_one::<PathBuf>("resume").cloned(),
            global_batch: *m
                .get_one::<u32>("global_batch")
                .context("run has --global-batch")?,
            mode: *m.get_one::<Mode>("mode").context("run has --mode")?,
            collective_timeout: *m
                .get_one::<Duration>("collective_timeout")
                .context("run has --collective-timeout")?,
            fault_tolerance: m.get_flag("fault_tolerance"),
            min_np_given: m.value_source("min_np") == Some(clap::parser::ValueSource::CommandLine),
            grow_back: m.get_flag("grow_back"),
        })
    }
}

/// Points the next attempt's `run` at the newest checkpoint, if there is one; the words that
/// say where it starts.
pub(super) fn resume_from(run: &mut Vec<OsString>, job: &Job, step: Option<u64>) -> String {
    match step {
        Some(s) => {
            if job.resume.as_deref() != Some(job.out.as_path()) {
                // Replaced, not appended: a flag given twice is refused.
                drop_flag(run, "--resume");
                run.extend(["--resume".into(), job.out.clone().into_os_string()]);
            }
            format!(
                "resuming from step {s} (the newest checkpoint in {})",
                job.out.display()
            )
        }
        None => format!(
            "starting over ({} holds no checkpoint yet)",
            job.out.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_dash_np_is_spelled_for_clap_before_the_run_only() {
        let argv = |s: &str| s.split(' ').map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            spell_np(argv(
                "lsgd-host launch -np 3 --mpirun-arg -np --min-np 2 -- run -np"
            )),
            argv("lsgd-host launch --np 3 --mpirun-arg -np --min-np 2 -- run -np")
        );
        assert_eq!(
            spell_np(argv("lsgd-host launch -np=3 -- run")),
            argv("lsgd-host launch --np=3 -- run")
        );
        assert_eq!(
            spell_np(argv("lsgd-host run -np 3")),
            argv("lsgd-host run -np 3")
        );
    }
}
