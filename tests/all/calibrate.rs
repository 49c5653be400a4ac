//! `bench calibrate` and the model file it writes, under a real `mpirun` with two ranks on this
//! one host: with no inter-host link, calibrate fits the shared-memory link, says so, and gives
//! it as α, β too; `bench allreduce --model` and `simulate --model` price with the file.

use std::path::Path;
use std::process::Output;

use crate::common::{lsgd, mpirun_command, no_mpirun, scratch, stderr, stdout};

/// `mpirun -np 2 lsgd-host ARGS` over shared memory, oversubscribed and unbound.
fn two_ranks(args: &[&str]) -> Output {
    let o = mpirun_command()
        .args(["-np", "2", env!("CARGO_BIN_EXE_lsgd-host")])
        .args(args)
        .output()
        .expect("mpirun (Open MPI) is installed by scripts/setup.sh");
    assert!(
        o.status.success(),
        "{args:?}: {}\n{}\n{}",
        o.status,
        stdout(&o),
        stderr(&o)
    );
    o
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

fn calibrate(file: &Path) -> serde_json::Value {
    let o = two_ranks(&[
        "bench",
        "calibrate",
        // Up to 64M, 9 repetitions: beside the suite's other tests on two cores, the medians
        // of 5 up to 1M once fell with the size (a rank descheduled for milliseconds at the
        // small sizes) and the fit was refused; a 64M copy takes tens of milliseconds.
        "--sizes",
        "0,8,4K,64K,1M,64M",
        "--reps",
        "9",
        "--gamma-bytes",
        "1M",
        "--out",
        file.to_str().unwrap(),
    ]);
    let out = stdout(&o);
    for want in [
        "intra-host link: rank 0",
        "there is no inter-host link, so α and β are the intra-host link's",
        "duplex: exchange β / one-way β",
        "--ranks-per-node 2",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    assert!(!out.contains("inter-host link: rank"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("--alpha ")), "{out}");
    json(&std::fs::read_to_string(file).unwrap())
}

#[test]
fn calibrate_on_one_host_fits_shared_memory_and_the_model_file_prices_bench_and_simulate() {
    if no_mpirun() {
        return;
    }
    let dir = scratch("calibrate");
    let file = dir.join("model.json");
    let cal = calibrate(&file);
    assert!(cal["inter"].is_null(), "{cal}");
    let intra = &cal["intra"];
    assert_eq!(intra["points"].as_array().unwrap().len(), 6, "{cal}");
    let (alpha, beta, gamma) = (
        cal["alpha"].as_f64().unwrap(),
        cal["beta"].as_f64().unwrap(),
        cal["gamma"].as_f64().unwrap(),
    );
    assert!(alpha >= 0.0 && beta > 0.0 && gamma > 0.0, "{cal}");
    assert_eq!(cal["alpha_intra"], cal["alpha"]);
    assert_eq!(cal["beta"], intra["exchange"]["beta"]);
    assert_eq!(cal["ranks_per_node"], 2);

    let model = file.to_str().unwrap();
    let bench = [
        "bench",
        "allreduce",
        "--model",
        model,
        "--algo",
        "mpi,ring",
        "--sizes",
        "1K,64K",
        "--iters",
        "3",
        "--warmup",
        "1",
    ];
    let table = stdout(&two_ranks(&bench));
    assert!(
        table.contains("predicted(us)") && table.contains("measured/predicted"),
        "{table}"
    );
    let rows = json(&stdout(&two_ranks(
        &[&bench[..], &["--format", "json"]].concat(),
    )));
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        let predicted = r["predicted_s"].as_f64().unwrap();
        assert!(predicted > 0.0, "{r}");
        let ratio = r["ratio"].as_f64().unwrap();
        let measured = r["seconds"].as_f64().unwrap();
        assert!((ratio - measured / predicted).abs() <= 1e-9 * ratio, "{r}");
    }
    // The ring on 2 ranks: 2α + n·β + (n/2)·γ, in bench and simulate alike.
    let n = 65536.0 * 4.0;
    let ring = 2.0 * alpha + n * beta + n / 2.0 * gamma;
    let row = rows
        .iter()
        .find(|r| r["algorithm"] == "ring" && r["bytes"] == 262144)
        .unwrap();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    assert!(close(row["predicted_s"].as_f64().unwrap(), ring), "{row}");
    let simulated = |extra: &[&str]| {
        let o = lsgd(
            &[
                &[
                    "simulate", "--model", model, "--ranks", "2", "--sizes", "256K",
                ][..],
                extra,
                &["--format", "json"],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let v = json(&stdout(&o));
        v.as_array()
            .unwrap()
            .iter()
            .find(|p| p["algorithm"] == "ring")
            .unwrap()["seconds"]
            .as_f64()
            .unwrap()
    };
    assert!(close(simulated(&[]), ring));
    // A flag overrides the file's value, the rest still from the file.
    assert!(close(
        simulated(&["--alpha", "1e-3"]),
        2e-3 + n * beta + n / 2.0 * gamma
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn calibrate_without_mpirun_says_it_needs_two_ranks() {
    let o = lsgd(&["bench", "calibrate"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mpirun"), "{}", stderr(&o));
}
