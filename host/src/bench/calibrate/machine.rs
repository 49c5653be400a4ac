//! The α-β-γ model's machine parameters as a file: what `bench calibrate --out` writes (among
//! more) and `simulate --model`, `bench allreduce --model` and the network study read.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::collective::cost::CostModel;

/// The model's machine parameters: what `bench calibrate` writes (among more) and
/// `simulate --model` / `bench allreduce --model` read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Seconds per message between hosts.
    pub alpha: f64,
    /// Seconds per byte between hosts.
    pub beta: f64,
    /// Seconds per byte added.
    pub gamma: f64,
    /// Seconds per message inside a host.
    pub alpha_intra: f64,
    /// Seconds per byte inside a host.
    pub beta_intra: f64,
    /// The most ranks on one host.
    pub ranks_per_node: usize,
}

impl Machine {
    /// Reads a model file (`bench calibrate --out`'s JSON; keys other than the six parameters
    /// are ignored, so a hand-written file needs only those).
    pub fn load(path: &Path) -> Result<Machine> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the model file {}", path.display()))?;
        let m: Machine = serde_json::from_str(&text).with_context(|| {
            format!(
                "model file {}: expected JSON with alpha, beta, gamma, alpha_intra, beta_intra \
                 and ranks_per_node (what `lsgd-host bench calibrate --out` writes)",
                path.display()
            )
        })?;
        m.check()
            .with_context(|| format!("model file {}", path.display()))?;
        Ok(m)
    }

    /// Refuses parameters no machine has (negative or infinite times, no ranks per node).
    pub fn check(&self) -> Result<()> {
        for (name, v) in [
            ("alpha", self.alpha),
            ("beta", self.beta),
            ("gamma", self.gamma),
            ("alpha_intra", self.alpha_intra),
            ("beta_intra", self.beta_intra),
        ] {
            anyhow::ensure!(
                v.is_finite() && v >= 0.0,
                "{name} must be a finite number of seconds ≥ 0, got {v}"
            );
        }
        anyhow::ensure!(
            self.ranks_per_node >= 1,
            "ranks_per_node must be at least 1"
        );
        Ok(())
    }

    /// The cost model of these parameters with a torus grid (`None`: near-square).
    pub fn cost_model(&self, torus_shape: Option<(usize, usize)>) -> CostModel {
        CostModel {
            alpha: self.alpha,
            beta: self.beta,
            gamma: self.gamma,
            alpha_intra: self.alpha_intra,
            beta_intra: self.beta_intra,
            ranks_per_node: self.ranks_per_node,
            torus_shape,
        }
    }

    /// The parameters as `lsgd-host simulate` flags (four significant digits).
    pub fn simulate_flags(&self) -> String {
        format!(
            "--alpha {:.3e} --beta {:.3e} --gamma {:.3e} --alpha-intra {:.3e} --beta-intra {:.3e} \
             --ranks-per-node {}",
            self.alpha,
            self.beta,
            self.gamma,
            self.alpha_intra,
            self.beta_intra,
            self.ranks_per_node
        )
    }
}
