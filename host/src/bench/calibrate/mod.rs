//! `lsgd-host bench calibrate`: the α-β-γ model's machine parameters, fitted from
//! measurements, for `simulate --model` and `bench allreduce --model`.
//!
//! Ranks are grouped by host name. Between rank 0 and the first rank on another host (the
//! inter-host link: α, β) and between two ranks on one host (α_intra, β_intra), every message
//! size is timed two ways, each the median of several repetitions:
//!
//! - one way: half a ping-pong's round trip (one direction busy at a time);
//! - exchange: both ranks send the size to each other at once (MPI_Sendrecv).
//!
//! The model charges a step in which a rank sends and receives at once one α + m·β (every step
//! of the ring, halving-doubling and the torus is such a step), so the parameters it is given
//! are the exchange's fit. On a full-duplex link the two fits agree (the printed duplex ratio,
//! exchange β / one-way β, is about 1); where both directions share one resource (a half-duplex
//! link, or shared memory, where both copies go through one memory bus) it is up to 2, and the
//! one-way β would predict the algorithms too fast.
//!
//! With every rank on one host there is no inter-host link: the only link there is (shared
//! memory) is calibrated, reported as intra-host, and also given as α, β, so the model predicts
//! that machine. With one rank per host, α_intra and β_intra are α and β. γ is the median time
//! of the f32 addition every algorithm reduces with, per byte, on rank 0.
//!
//! The parts: `machine.rs` is the model file (the six parameters), `fit.rs` the least-squares
//! fit (pure arithmetic), `measure.rs` the timings under MPI and the calibration made from
//! them, `report.rs` its tables.

mod fit;
mod machine;
mod measure;
mod report;

use serde::{Deserialize, Serialize};

pub use fit::{Fit, fit};
pub use machine::Machine;
pub use measure::{Addition, Link, Point, Setup, pairs, ranks_per_node, run};
pub use report::print;

/// Everything `bench calibrate` measured; its JSON has the [`Machine`] parameters at the top
/// level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The fitted parameters.
    #[serde(flatten)]
    pub machine: Machine,
    /// Ranks in the world.
    pub ranks: usize,
    /// Each rank's host, in rank order.
    pub hosts: Vec<String>,
    /// Rank 0 and the first rank on another host; `None` with every rank on one host.
    pub inter: Option<Link>,
    /// Two ranks on one host; `None` with one rank per host.
    pub intra: Option<Link>,
    /// The γ measurement.
    pub addition: Addition,
    /// What was assumed where a link was missing.
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Calibration {
        let f = fit(&[0.0, 8.0, 4096.0, 1048576.0].map(|n| (n, 2e-6 + n * 1e-9))).unwrap();
        let link = Link {
            ranks: [0, 1],
            hosts: ["h1".into(), "h1".into()],
            points: vec![Point {
                bytes: 8,
                reps: 51,
                one_way_s: 2e-6,
                exchange_s: 2.1e-6,
            }],
            one_way: f,
            exchange: f,
            duplex_ratio: 1.0,
        };
        Calibration {
            machine: Machine {
                alpha: 2e-6,
                beta: 1e-9,
                gamma: 1e-10,
                alpha_intra: 2e-6,
                beta_intra: 1e-9,
                ranks_per_node: 2,
            },
            ranks: 2,
            hosts: vec!["h1".into(), "h1".into()],
            inter: None,
            intra: Some(link),
            addition: Addition {
                bytes: 1 << 20,
                reps: 7,
                seconds: 1e-4,
            },
            notes: vec!["all 2 ranks are on one host".into()],
        }
    }

    #[test]
    fn the_json_round_trips_and_loads_as_a_model() {
        let cal = sample();
        let json = serde_json::to_string_pretty(&cal).unwrap();
        assert_eq!(serde_json::from_str::<Calibration>(&json).unwrap(), cal);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["alpha"], 2e-6);
        assert_eq!(v["ranks_per_node"], 2);
        let dir = std::env::temp_dir().join(format!("lsgd-calibrate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("model.json");
        std::fs::write(&file, &json).unwrap();
        assert_eq!(Machine::load(&file).unwrap(), cal.machine);
        std::fs::write(&file, r#"{"alpha": 1e-6, "beta": 1e-9}"#).unwrap();
        let err = format!("{:#}", Machine::load(&file).unwrap_err());
        assert!(err.contains("gamma"), "{err}");
        let mut bad = cal.machine;
        bad.beta = -1.0;
        std::fs::write(&file, serde_json::to_string(&bad).unwrap()).unwrap();
        let err = format!("{:#}", Machine::load(&file).unwrap_err());
        assert!(err.contains("beta must be"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
        let mut text = Vec::new();
        print(&cal, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("--alpha 2.000e-6 --beta 1.000e-9"), "{text}");
        assert!(text.contains("intra-host link") && !text.contains("inter-host link"));
    }
}
