//! Cross-language regression tests: the plugins written in C, Python, JavaScript and Go
//! (`plugins/*-c`, `*-python`, `*-js`, `*-go`, built by `scripts/build-guests.sh`) against the
//! Rust reference plugins: `lsgd-host compare` bit for bit over whole 90-epoch runs (codecs:
//! the same payload bytes and reconstructions), the same describe(), and the same configure()
//! error messages. The stateful schedule `lsgd-host new --stateful` writes keeps the same state
//! in every language: the same snapshot bytes, the same refusal of a bad one, the same state
//! after a restore.
//!
//! They load through the on-disk component cache of the environment (`LSGD_CACHE_DIR`), not a
//! per-process one: compiling an 18 MB Python component takes ~30 s, loading it back ~5 ms.

use std::process::Command;

use lsgd_codec::Meta;
use lsgd_codec::rng::Rng;
use lsgd_host::plugin::{Cache, Limits, Plugin, Runtime};

use crate::common::*;
use crate::scaffold::built;

/// The Goyal warmup schedule in every language other than Rust.
const WARMUPS: &[&str] = &["warmup-c", "warmup-python", "warmup-js", "warmup-go"];

/// Every non-Rust plugin with the Rust reference plugin it reproduces.
const TWINS: &[(&str, &str)] = &[
    ("warmup-c", "warmup"),
    ("warmup-python", "warmup"),
    ("warmup-js", "warmup"),
    ("warmup-go", "warmup"),
    ("batch-ramp-c", "batch-ramp"),
    ("label-smoothing-python", "label-smoothing"),
    ("codec-int8-c", "codec-int8"),
];

/// Goyal et al.'s ImageNet run: 90 epochs at batch 8192 on 32 workers, 100 steps an epoch.
const GOYAL: &[&str] = &[
    "--epochs",
    "90",
    "--steps-per-epoch",
    "100",
    "--global-batch",
    "8192",
    "--world-size",
    "32",
];

/// `lsgd-host compare REFERENCE PLUGIN ARGS...`: (exit code, stdout, stderr).
fn compare(reference: &str, plugin: &str, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_lsgd-host"))
        .arg("compare")
        .arg(plugin_path(reference))
        .arg(plugin_path(plugin))
        .args(args)
        // Bit equality is the point here; the deadline has its own tests (faults.rs), and a
        // busy CI machine that deschedules a 15 µs Python call for 10 ms must not fail this.
        .args(["--plugin-deadline-ms", "1000"])
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_same(reference: &str, plugin: &str, args: &[&str]) {
    let (code, out, err) = compare(reference, plugin, args);
    assert!(
        code == 0 && out.contains("result: SAME (bit-identical)"),
        "{plugin} vs {reference} {args:?}: exit {code}\n{out}{err}"
    );
}

/// A runtime on the environment's component cache (see the module docs).
fn shared_runtime() -> Runtime {
    Runtime::new(Cache::from_env(), Limits::default()).unwrap()
}

fn load(rt: &Runtime, name: &str) -> Plugin {
    rt.load(&plugin_path(name), None).unwrap()
}

#[test]
fn every_language_warmup_is_bit_identical_to_rust_over_90_epochs() {
    for w in WARMUPS {
        assert_same("warmup", w, GOYAL);
        let (_, out, _) = compare("warmup", w, GOYAL);
        assert!(out.contains("over 9000 steps"), "{out}");
    }
}

#[test]
fn every_language_warmup_matches_with_other_parameters() {
    let variants: &[&[&str]] = &[
        &[
            "--set",
            "both.scaling=sqrt",
            "--set",
            "both.warmup_epochs=2.5",
        ],
        &["--set", "both.warmup=constant", "--set", "both.gamma=0.5"],
        &[
            "--set",
            "both.warmup=none",
            "--set",
            "both.milestones=1,2,3.5,50",
        ],
        &["--set", "both.scaling=none", "--set", "both.milestones="],
    ];
    for w in WARMUPS {
        for v in variants {
            assert_same("warmup", w, &[GOYAL, v].concat());
        }
        // Below the reference batch k is 1, and a batch that does not divide evenly.
        assert_same(
            "warmup",
            w,
            &[
                "--epochs",
                "30",
                "--steps-per-epoch",
                "37",
                "--global-batch",
                "200",
                "--reference-batch",
                "256",
            ],
        );
    }
}

#[test]
fn batch_size_and_label_smoothing_outside_rust_match() {
    assert_same("batch-ramp", "batch-ramp-c", GOYAL);
    assert_same(
        "batch-ramp",
        "batch-ramp-c",
        &[
            "--epochs",
            "90",
            "--steps-per-epoch",
            "100",
            "--global-batch",
            "8190",
            "--world-size",
            "7",
            "--set",
            "both.factor=3",
            "--set",
            "both.max_batch=30000",
            "--set",
            "both.milestones=10,20,30,40",
        ],
    );
    assert_same("label-smoothing", "label-smoothing-python", GOYAL);
    for ramp in [
        &["--set", "both.epsilon=0", "--set", "both.final_epsilon=0.2"][..],
        &[
            "--set",
            "both.epsilon=0.3",
            "--set",
            "both.final_epsilon=0.01",
            "--set",
            "both.ramp_start_epoch=10",
            "--set",
            "both.ramp_end_epoch=77.7",
        ],
    ] {
        assert_same(
            "label-smoothing",
            "label-smoothing-python",
            &[GOYAL, ramp].concat(),
        );
    }
}

#[test]
fn compare_catches_a_difference_between_languages() {
    let (code, out, _) = compare(
        "warmup",
        "warmup-go",
        &[GOYAL, &["--set", "b.gamma=0.2"]].concat(),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("first at step 3000"), "{out}");
}

#[test]
fn every_language_describes_itself_like_its_rust_twin() {
    let rt = shared_runtime();
    for (plugin, reference) in TWINS {
        let (p, r) = (load(&rt, plugin), load(&rt, reference));
        assert_eq!(p.info(), r.info(), "{plugin} vs {reference}");
        assert_eq!(p.kind(), r.kind());
    }
}

#[test]
fn every_language_rejects_bad_parameters_with_the_rust_message() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("warmup", &[("warmup_epochs", "-1")]),
        ("warmup", &[("milestones", "60,30")]),
        ("warmup", &[("milestones", "-1.5")]),
        ("warmup", &[("gamma", "-0.000001")]),
        ("batch-ramp", &[("factor", "0")]),
        ("batch-ramp", &[("max_batch", "-5")]),
        ("batch-ramp", &[("milestones", "1,0")]),
        ("label-smoothing", &[("epsilon", "1")]),
        ("label-smoothing", &[("epsilon", "0.999999999")]),
        ("label-smoothing", &[("final_epsilon", "1.5")]),
        (
            "label-smoothing",
            &[("ramp_start_epoch", "10"), ("ramp_end_epoch", "5")],
        ),
        ("codec-int8", &[("chunk", "0")]),
        ("codec-int8", &[("chunk", "-5")]),
        ("codec-int8", &[("chunk", "4294967296")]),
    ];
    let rt = shared_runtime();
    for (plugin, reference) in TWINS {
        let (mut p, mut r) = (load(&rt, plugin), load(&rt, reference));
        for (_, settings) in cases.iter().filter(|(k, _)| k == reference) {
            let settings = owned(settings);
            let want = r.configure(&settings).unwrap_err().fault.to_string();
            let got = p.configure(&settings).unwrap_err().fault.to_string();
            assert_eq!(got, want, "{plugin} with {settings:?}");
        }
        // After a rejection the plugin still runs on what it had.
        p.configure(&[]).unwrap();
    }
}

#[test]
fn the_c_int8_codec_sends_the_rust_bytes() {
    // Sample buckets (a rows×cols weight and a cols bias): odd sizes leave a short last chunk,
    // chunk 1 is one scale per element, 2^32 - 1 one scale per bucket.
    let cases: &[&[&str]] = &[
        &["--buckets", "8"],
        &["--rows", "7", "--cols", "3"],
        &["--set", "both.chunk=5"],
        &[
            "--rows",
            "7",
            "--cols",
            "3",
            "--set",
            "both.chunk=5",
            "--buckets",
            "20",
        ],
        &[
            "--rows",
            "33",
            "--cols",
            "17",
            "--set",
            "both.chunk=1",
            "--seed",
            "3",
        ],
        &["--rows", "1", "--cols", "1", "--set", "both.chunk=16"],
        &[
            "--rows",
            "100",
            "--cols",
            "9",
            "--set",
            "both.chunk=4294967295",
        ],
        &[
            "--rows",
            "64",
            "--cols",
            "48",
            "--set",
            "both.chunk=17",
            "--seed",
            "7",
        ],
    ];
    for args in cases {
        let (code, out, err) = compare("codec-int8", "codec-int8-c", args);
        assert!(
            code == 0
                && out.contains("payloads: identical bytes")
                && out.contains("result: SAME (bit-identical)"),
            "codec-int8-c vs codec-int8 {args:?}: exit {code}\n{out}{err}"
        );
    }
}

/// Bit patterns, so that NaNs compare equal to themselves.
fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_c_int8_codec_matches_rust_on_edge_values_and_malformed_payloads() {
    let rt = shared_runtime();
    let (mut rust, mut c) = (load(&rt, "codec-int8"), load(&rt, "codec-int8-c"));

    // Zeros, signed NaNs and infinities, the extremes, runs of half-integers and every binary32
    // exponent: chunks that are NaN, zero (max|x| = 0 or so small that 1/scale overflows), or
    // quantised.
    let mut special = vec![
        0.0,
        -0.0,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        -1e-38,
        1e-30,
        1e30,
    ];
    for scale in [1.0f32, 2.0] {
        special.push(127.0 * scale);
        special.extend((-127..127).map(|k| (k as f32 + 0.5) * scale));
    }
    for e in 0..256u32 {
        special.push(f32::from_bits(e << 23));
        special.push(-f32::from_bits((e << 23) | 0x7f_ffff));
    }
    let mut rng = Rng::new(42);
    // Any bit pattern, and any finite one (a NaN or inf in most chunks hides the rest).
    let random: Vec<f32> = (0..5000)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .collect();
    let finite: Vec<f32> = random
        .iter()
        .map(|x| f32::from_bits(x.to_bits() & !(1 << 30)))
        .collect();
    // Gradients whose magnitude changes by 2^8 every 13 elements.
    let wide: Vec<f32> = (0..3000)
        .map(|i| rng.normal() * f32::from_bits((((i / 13) % 30 * 8 + 8) as u32) << 23))
        .collect();
    let mut compared = 0;
    for chunk in ["1", "3", "16", "17", "1024"] {
        let set = owned(&[("chunk", chunk)]);
        rust.configure(&set).unwrap();
        c.configure(&set).unwrap();
        // Every chunk starts at max|x| = 127 (or 254), so its scale is 1 (or 2) and the rest
        // are exact ties k + 0.5 of x·(1/scale), in the vector blocks and in the tails.
        let size: usize = chunk.parse().unwrap();
        let ties: Vec<f32> = (0..2001)
            .map(|i| {
                let s = if (i / size).is_multiple_of(2) {
                    1.0
                } else {
                    2.0
                };
                if i.is_multiple_of(size) {
                    127.0 * s
                } else {
                    ((i % 254) as f32 - 126.5) * s
                }
            })
            .collect();
        for data in [&special, &random, &finite, &wide, &ties] {
            for n in [0, 1, 15, 16, 17, 33, 100, data.len()] {
                let data = &data[..n.min(data.len())];
                let meta = Meta::flat("w", data.len() as u32, 0, 1);
                let want = rust.encode(&meta, data, &[]).unwrap();
                let got = c.encode(&meta, data, &[]).unwrap();
                assert_eq!(got, want, "chunk {chunk}, {n} floats");
                let want = rust.decode(&meta, std::slice::from_ref(&want)).unwrap();
                let got = c.decode(&meta, &[got]).unwrap();
                assert_eq!(bits(&got), bits(&want), "chunk {chunk}, {n} floats");
                compared += 1;
            }
        }
        // Arbitrary bytes of the right length decode alike (NaN and huge scales included).
        for n in [1, 16, 100, 1025] {
            let meta = Meta::flat("w", n, 0, 1);
            let chunks = n.div_ceil(size as u32);
            let payload: Vec<u8> = (0..4 * chunks + n).map(|_| rng.next_u64() as u8).collect();
            let want = rust.decode(&meta, std::slice::from_ref(&payload)).unwrap();
            let got = c.decode(&meta, &[payload]).unwrap();
            assert_eq!(bits(&got), bits(&want), "chunk {chunk}, {n} random bytes");
        }
    }
    assert_eq!(compared, 5 * 5 * 8);

    // The same errors, word for word: wrong input lengths, wrong payload counts and lengths,
    // and scale headers that overflow the wasm32 usize (chunk 1, 2 and 4 for 2^32 - 1 floats).
    let refused = |p: &mut Plugin, meta: &Meta, payloads: &[Vec<u8>]| {
        p.decode(meta, payloads).unwrap_err().fault.to_string()
    };
    for chunk in ["1024", "1", "2", "4", "5"] {
        let set = owned(&[("chunk", chunk)]);
        rust.configure(&set).unwrap();
        c.configure(&set).unwrap();
        let meta = Meta::flat("w", 2000, 0, 0);
        let data = &wide[..2000];
        let good = rust.encode(&meta, data, &[]).unwrap();
        let e = c
            .encode(&meta, &data[..1999], &[])
            .unwrap_err()
            .fault
            .to_string();
        assert_eq!(
            e,
            rust.encode(&meta, &data[..1999], &[])
                .unwrap_err()
                .fault
                .to_string()
        );
        assert!(
            e.contains("encode got 1999 floats for a bucket of 2000"),
            "{e}"
        );
        let mut long = good.clone();
        long.push(0);
        let huge = Meta::flat("w", u32::MAX, 0, 0);
        for (meta, payloads) in [
            (&meta, vec![]),
            (&meta, vec![good.clone(), good.clone()]),
            (&meta, vec![good[..good.len() - 1].to_vec()]),
            (&meta, vec![good[..7].to_vec()]),
            (&meta, vec![vec![]]),
            (&meta, vec![long]),
            (&huge, vec![vec![0; 12]]),
        ] {
            let want = refused(&mut rust, meta, &payloads);
            assert_eq!(refused(&mut c, meta, &payloads), want, "chunk {chunk}");
            assert!(want.contains("payload"), "{want}");
        }
    }
    let e = c
        .configure(&owned(&[("chunk", "0")]))
        .unwrap_err()
        .fault
        .to_string();
    assert!(e.contains("chunk must be in [1, 4294967295], got 0"), "{e}");
}

#[test]
fn every_language_stateful_scaffold_snapshots_and_restores_the_same_bytes() {
    let bytes = |best: f64| Some(best.to_le_bytes().to_vec());
    let rt = shared_runtime();
    for lang in ["rust", "c", "python", "js", "go"] {
        let (wasm, _) = built(lang, "schedule", true);
        let mut p = rt.load(&wasm, None).unwrap();
        assert!(p.stateful(), "{lang}");
        p.configure(&[]).unwrap();
        assert_eq!(
            p.state_at(0).unwrap(),
            bytes(0.0),
            "{lang}: the fresh state"
        );
        let mut s = clock(1, 4, 256).state();
        s.last_metric = Some(0.5);
        // A second call at one step (a retry, or momentum after learning-rate) changes nothing.
        p.call(&s).unwrap();
        p.call(&s).unwrap();
        s.step = 1;
        s.last_metric = Some(0.25);
        p.call(&s).unwrap();
        assert_eq!(
            p.state_at(2).unwrap(),
            bytes(0.5),
            "{lang}: the best metric"
        );
        let e = p.restore(2, vec![1, 2, 3]).unwrap_err().fault.to_string();
        assert!(
            e.contains("a snapshot of 3 bytes, expected 8"),
            "{lang}: {e}"
        );
        p.restore(2, 0.75f64.to_le_bytes().to_vec()).unwrap();
        s.step = 2;
        s.last_metric = Some(0.6);
        p.call(&s).unwrap();
        assert_eq!(
            p.state_at(3).unwrap(),
            bytes(0.75),
            "{lang}: the restored best"
        );
    }
}
