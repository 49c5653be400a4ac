//! The emulated cluster (`scripts/netlab.sh`, docs/cluster.md) a study trains on: up while a
//! [`Lab`] lives, torn down when it drops.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The lab with some hosts and links: up while it lives.
pub struct Lab<'a> {
    /// The `netlab.sh` it was brought up with.
    pub script: &'a Path,
}

impl<'a> Lab<'a> {
    /// `netlab.sh up HOSTS --rate RATE`; `study` names the study in the refusal on a machine
    /// where the lab cannot run.
    pub fn up(script: &'a Path, hosts: u32, rate: &str, study: &str) -> Result<Lab<'a>> {
        let status = Command::new("bash")
            .arg(script)
            .args(["up", &hosts.to_string(), "--rate", rate])
            .status()
            .with_context(|| format!("cannot run {}", script.display()))?;
        if status.code() == Some(3) {
            bail!(
                "the {study} study trains on the emulated cluster, which cannot run here (see \
                 `{} check`)",
                script.display()
            );
        }
        anyhow::ensure!(
            status.success(),
            "{} up {hosts} --rate {rate} failed ({status})",
            script.display()
        );
        Ok(Lab { script })
    }
}

impl Drop for Lab<'_> {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(self.script).arg("down").status();
    }
}

/// The lab script beside this checkout: `$LSGD_ROOT/scripts/netlab.sh`, else relative to the
/// working directory.
pub fn default_netlab() -> PathBuf {
    std::env::var_os("LSGD_ROOT")
        .map_or_else(|| PathBuf::from("."), PathBuf::from)
        .join("scripts/netlab.sh")
}
