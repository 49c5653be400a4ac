//! The hostfile of a `launch`ed job, and the one a restart gets without the lost hosts, so
//! that mpirun does not try a dead host again (it would wait for its daemon, or fail to start).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The variable through which a hostfile reaches mpirun without a flag (`scripts/netlab.sh`
/// sets it).
pub const DEFAULT_HOSTFILE_VAR: &str = "OMPI_MCA_orte_default_hostfile";

/// Where the job's hostfile comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--hostfile F` (or `--machinefile`, `-hostfile`, `=F` forms) among the mpirun arguments.
    Flag(PathBuf),
    /// [`DEFAULT_HOSTFILE_VAR`].
    Env(PathBuf),
}

impl Source {
    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            Source::Flag(p) | Source::Env(p) => p,
        }
    }
}

const FLAGS: [&str; 4] = ["--hostfile", "-hostfile", "--machinefile", "-machinefile"];

/// The hostfile `mpirun_args` name (the last one, as mpirun takes it), else the one in the
/// environment variable `env`.
pub fn find(mpirun_args: &[String], env: Option<&str>) -> Option<Source> {
    let mut found = None;
    let mut args = mpirun_args.iter();
    while let Some(a) = args.next() {
        if FLAGS.contains(&a.as_str()) {
            found = args.next().map(PathBuf::from);
        } else if let Some((flag, value)) = a.split_once('=')
            && FLAGS.contains(&flag)
        {
            found = Some(PathBuf::from(value));
        }
    }
    found
        .map(Source::Flag)
        .or_else(|| env.filter(|e| !e.is_empty()).map(|e| Source::Env(e.into())))
}

/// `mpirun_args` with every hostfile flag replaced by one `--hostfile new`.
pub fn with_hostfile(mpirun_args: &[String], new: &Path) -> Vec<String> {
    let mut out = Vec::with_capacity(mpirun_args.len());
    let mut args = mpirun_args.iter();
    while let Some(a) = args.next() {
        if FLAGS.contains(&a.as_str()) {
            args.next();
        } else if !a.split_once('=').is_some_and(|(f, _)| FLAGS.contains(&f)) {
            out.push(a.clone());
        }
    }
    out.extend(["--hostfile".to_string(), new.display().to_string()]);
    out
}

/// The mpirun arguments and hostfile of each attempt: the job's own, then after a host is lost
/// one without it.
#[derive(Debug)]
pub struct Hosts {
    /// The mpirun arguments (`launch --mpirun-arg`), their hostfile flag replaced after a loss.
    pub mpirun_args: Vec<String>,
    source: Option<Source>,
    /// The newest hostfile written for a restart.
    latest: Option<PathBuf>,
    /// The hostfile to pass through [`DEFAULT_HOSTFILE_VAR`] instead of the job's.
    pub env_override: Option<PathBuf>,
}

impl Hosts {
    /// The job's own: its mpirun arguments and the hostfile they or `env` name.
    pub fn new(mpirun_args: Vec<String>, env: Option<&str>) -> Hosts {
        let source = find(&mpirun_args, env);
        Hosts {
            mpirun_args,
            source,
            latest: None,
            env_override: None,
        }
    }

    /// Writes `OUT/hostfile.restart-N` without the `lost` hosts and makes the next attempt use
    /// it; the new file and the slots the lost hosts had. `None` when the job has no hostfile
    /// (mpirun then runs where it was started, and no host can be dropped).
    pub fn drop_hosts(
        &mut self,
        lost: &[String],
        out: &Path,
        restart: u32,
    ) -> Result<Option<(PathBuf, u32)>> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        let current = self.latest.as_deref().unwrap_or(source.path());
        let text = std::fs::read_to_string(current)
            .with_context(|| format!("cannot read the hostfile {}", current.display()))?;
        let (kept, slots) = without(&text, lost);
        let new = out.join(format!("hostfile.restart-{restart}"));
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        std::fs::write(&new, kept).with_context(|| format!("cannot write {}", new.display()))?;
        match source {
            Source::Flag(_) => self.mpirun_args = with_hostfile(&self.mpirun_args, &new),
            Source::Env(_) => self.env_override = Some(new.clone()),
        }
        self.latest = Some(new.clone());
        Ok(Some((new, slots)))
    }
}

impl Hosts {
    /// The hosts of the hostfile the next attempt uses, in file order (empty without one).
    pub fn current(&self) -> Result<Vec<String>> {
        let Some(source) = &self.source else {
            return Ok(Vec::new());
        };
        let path = self.latest.as_deref().unwrap_or(source.path());
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the hostfile {}", path.display()))?;
        Ok(text.lines().filter_map(host_of).map(String::from).collect())
    }
}

/// The host a hostfile line names (its first word), `None` for blank and comment lines.
fn host_of(line: &str) -> Option<&str> {
    let line = line.split('#').next().unwrap_or("").trim();
    line.split_whitespace().next()
}

/// `text` without the lines of the hosts in `lost` (comments and other hosts kept as they
/// are), and how many slots those lines gave (`slots=N`, else 1 each).
pub fn without(text: &str, lost: &[String]) -> (String, u32) {
    let mut kept = String::with_capacity(text.len());
    let mut slots = 0;
    for line in text.lines() {
        match host_of(line) {
            Some(h) if lost.iter().any(|l| l == h) => {
                slots += line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("slots="))
                    .and_then(|n| n.parse::<u32>().ok())
                    .unwrap_or(1);
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    (kept, slots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_hostfile_comes_from_the_last_flag_else_the_environment() {
        assert_eq!(
            find(&args("--mca btl tcp --hostfile a.txt"), Some("env.txt")),
            Some(Source::Flag("a.txt".into()))
        );
        assert_eq!(
            find(&args("--hostfile=a.txt -machinefile b.txt"), None),
            Some(Source::Flag("b.txt".into()))
        );
        assert_eq!(
            find(&args("--mca btl tcp"), Some("/run/lab/hostfile")),
            Some(Source::Env("/run/lab/hostfile".into()))
        );
        assert_eq!(find(&args("--mca btl tcp"), Some("")), None);
        assert_eq!(find(&[], None), None);
    }

    #[test]
    fn a_restart_gets_one_hostfile_flag_for_the_new_file() {
        assert_eq!(
            with_hostfile(
                &args("--mca btl tcp --hostfile a.txt --hostfile=b.txt -x A"),
                Path::new("out/hostfile.restart-1")
            ),
            args("--mca btl tcp -x A --hostfile out/hostfile.restart-1")
        );
    }

    #[test]
    fn a_restart_after_a_lost_host_runs_on_a_hostfile_without_it() {
        let dir = std::env::temp_dir().join(format!("lsgd-hostfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let job = dir.join("hosts.txt");
        std::fs::write(&job, "h1 slots=2\nh2 slots=2\nh3 slots=2\n").unwrap();
        let out = dir.join("run");
        let job_arg = format!("--hostfile={}", job.display());

        let mut by_flag = Hosts::new(vec!["-x".into(), "A".into(), job_arg], None);
        let (new, slots) = by_flag
            .drop_hosts(&["h2".into()], &out, 1)
            .unwrap()
            .unwrap();
        assert_eq!((new.clone(), slots), (out.join("hostfile.restart-1"), 2));
        assert_eq!(
            std::fs::read_to_string(&new).unwrap(),
            "h1 slots=2\nh3 slots=2\n"
        );
        let flag = vec![
            "-x".into(),
            "A".into(),
            "--hostfile".into(),
            new.display().to_string(),
        ];
        assert_eq!(
            (by_flag.mpirun_args.clone(), by_flag.env_override.clone()),
            (flag, None)
        );
        // A second loss starts from the first restart's hostfile.
        let (new, _) = by_flag
            .drop_hosts(&["h3".into()], &out, 2)
            .unwrap()
            .unwrap();
        assert_eq!(std::fs::read_to_string(&new).unwrap(), "h1 slots=2\n");

        let env = job.display().to_string();
        let mut by_env = Hosts::new(vec![], Some(&env));
        let (new, _) = by_env.drop_hosts(&["h1".into()], &out, 3).unwrap().unwrap();
        assert_eq!(
            (by_env.mpirun_args.clone(), by_env.env_override.clone()),
            (vec![], Some(new))
        );

        assert!(
            Hosts::new(vec![], None)
                .drop_hosts(&["h1".into()], &out, 1)
                .unwrap()
                .is_none()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lost_hosts_are_dropped_from_the_hostfile_with_their_slots_counted() {
        let text = "# the lab\nh1 slots=2\nh2 slots=2 max_slots=4\n\nh3\nh10 slots=1 # h2\n";
        let (kept, slots) = without(text, &["h2".into(), "h3".into()]);
        assert_eq!(kept, "# the lab\nh1 slots=2\n\nh10 slots=1 # h2\n");
        assert_eq!(slots, 3);
        assert_eq!(without(text, &[]), (text.to_string(), 0));
    }
}
