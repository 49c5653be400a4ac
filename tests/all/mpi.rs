//! The collectives under a real `mpirun`: `lsgd-host selftest allreduce` checks each all-reduce
//! algorithm against MPI_Allreduce in f32 (tolerance for summation order) and against the exact
//! sum in f16 and bf16 (tolerance for 16-bit rounding), that all ranks got the same bytes, and
//! that the byte all-gather delivers every rank's payload (one of them empty) exactly.

use std::process::Output;

use crate::common::mpirun_command;

/// `mpirun -np N lsgd-host selftest allreduce ARGS` over shared memory.
fn selftest(np: usize, args: &[&str]) -> Output {
    mpirun_command()
        .args(["-np", &np.to_string(), env!("CARGO_BIN_EXE_lsgd-host")])
        .args(["selftest", "allreduce"])
        .args(args)
        .output()
        .expect("mpirun (Open MPI) is installed by scripts/setup.sh")
}

fn assert_passes(np: usize, args: &[&str]) -> String {
    let o = selftest(np, args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "np={np} {args:?}: {}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains(&format!("{np} ranks")), "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    out
}

/// Whether the summary has a row for `name` summed in (or gathering) `element`.
fn has_row(out: &str, name: &str, element: &str) -> bool {
    out.lines()
        .any(|l| l.starts_with(name) && l.split_whitespace().any(|w| w == element))
}

#[test]
fn every_algorithm_matches_mpi_allreduce_and_the_exact_16_bit_sum_on_one_to_five_ranks() {
    for np in 1..=5 {
        let out = assert_passes(np, &[]);
        for name in [
            "mpi",
            "ring",
            "halving-doubling",
            "binary-blocks",
            "torus2d",
            "hierarchical",
        ] {
            for element in ["f32", "f16", "bf16"] {
                assert!(
                    has_row(&out, name, element),
                    "np={np}: {name} {element} missing\n{out}"
                );
            }
        }
        if np > 2 {
            for element in ["f32", "f16", "bf16"] {
                assert!(
                    has_row(&out, "hierarchical (2 ranks/node)", element),
                    "{out}"
                );
            }
        }
        assert!(has_row(&out, "all-gather of bytes", "bytes"), "{out}");
    }
}

/// Binary blocks on 7 = 4 + 2 + 1 ranks (np 1–6 run it with every algorithm above and below):
/// every block size, both cascades through a lone rank, sizes odd and below the chunk count.
#[test]
fn binary_blocks_on_seven_ranks() {
    let out = assert_passes(
        7,
        &["--algo", "binary-blocks", "--sizes", "1,3,5,7,8,13,1001"],
    );
    for element in ["f32", "f16", "bf16"] {
        assert!(has_row(&out, "binary-blocks", element), "{out}");
    }
    assert!(
        !has_row(&out, "ring", "f32"),
        "only the named algorithm: {out}"
    );
}

#[test]
fn torus_shapes_and_simulated_nodes_on_four_ranks() {
    let out = assert_passes(4, &["--torus-shape", "1x4", "--ranks-per-node", "1,3"]);
    assert!(
        has_row(&out, "torus2d 1x4", "f16") && has_row(&out, "hierarchical (3 ranks/node)", "bf16"),
        "{out}"
    );
    let out = assert_passes(4, &["--torus-shape", "4x1", "--sizes", "0,1,5,1001"]);
    assert!(out.contains("torus2d 4x1"), "{out}");
    let out = assert_passes(
        6,
        &["--torus-shape", "2x3", "--sizes", "1,5,6,7,1001,65543"],
    );
    assert!(has_row(&out, "torus2d 2x3", "bf16"), "{out}");
}

#[test]
fn a_torus_shape_that_does_not_cover_the_world_is_an_error() {
    let o = selftest(2, &["--torus-shape", "2x2"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("torus shape 2x2 needs 4 ranks, the world has 2"),
        "{err}"
    );
}
