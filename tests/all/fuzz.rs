//! Property tests of everything the host reads from outside: codec payloads decoded through
//! the sandbox, IDX data files, npz files, image folders, `--set` settings, `--config` TOML
//! files and checkpoints. Each must give an error or a valid result, never a panic, a hang, or
//! an allocation sized from a claim in the input. The native codecs have their own in `plugins/lsgd-codec/tests/fuzz.rs`;
//! the driver (`LSGD_FUZZ_SECONDS` for a long campaign, `scripts/fuzz.sh`) is shared with it.

use std::cell::RefCell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use clap::Parser;
use lsgd_codec::Meta;
use lsgd_host::cli::{Cli, config_args, parse_settings};
use lsgd_host::data::{self, DatasetKind, read_idx};
use lsgd_host::model::Arch;
use lsgd_host::plugin::{Fault, Plugin};
use lsgd_host::train::checkpoint;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use tch::Tensor;

use crate::common::*;

#[path = "../../plugins/lsgd-codec/tests/fuzz/harness.rs"]
mod harness;
#[path = "../../plugins/lsgd-codec/tests/fuzz/inputs.rs"]
mod inputs;

use harness::{check, fuzz, largest_allocation};
use inputs::{meta, payloads};

#[global_allocator]
static ALLOC: harness::Metered = harness::Metered;

/// Inputs in these tests are a few KiB; an allocation above this was sized from a claim.
const CLAIMED: usize = 128 << 20;

/// Overwrites `bytes` with each edit's bytes at its offset, then cuts it at `cut`: a file
/// damaged in place and truncated.
fn damage(bytes: &mut Vec<u8>, edits: &[(Index, Vec<u8>)], cut: Option<Index>) {
    for (at, new) in edits {
        let at = at.index(bytes.len() + 1);
        let end = (at + new.len()).min(bytes.len());
        bytes.splice(at..end, new.iter().copied());
    }
    if let Some(c) = cut {
        bytes.truncate(c.index(bytes.len() + 1));
    }
}

/// Codec plugins decoded through the sandbox: byte, sparse, sign, seeded-index, and the
/// two-round matrix layouts.
const SANDBOXED: [&str; 6] = [
    "int8", "top-k", "ef-sign", "random-k", "natural", "powersgd",
];

#[test]
fn sandboxed_codecs_refuse_hostile_payloads_as_their_native_builds_do() {
    let rt = runtime();
    let plugins: RefCell<Vec<Plugin>> = RefCell::new(
        SANDBOXED
            .iter()
            .map(|n| load(&rt, &format!("codec-{n}"), &[]).unwrap())
            .collect(),
    );
    let strategy = (any::<Index>(), meta(), payloads());
    fuzz("sandbox-decode", 300, strategy, |(which, meta, plan)| {
        let i = which.index(SANDBOXED.len());
        let name = SANDBOXED[i];
        let native = lsgd_codec::native(name, Vec::new()).unwrap().unwrap();
        let mut meta: Meta = meta;
        meta.round = native.properties().rounds - 1;
        let Some(payloads) = plan.build(native.as_ref(), &meta) else {
            return Ok(());
        };
        let want = native.decode(&meta, &payloads);
        let got = plugins.borrow_mut()[i].decode(&meta, &payloads);
        match (&got, &want) {
            (Ok(g), Ok(w)) => check(
                g.len() == meta.len as usize
                    && g.iter()
                        .zip(w)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()),
                || format!("{name}: the sandbox decoded other floats than the native build"),
            ),
            (Err(e), Err(_)) => check(matches!(e.fault, Fault::Refused(_)), || {
                format!("{name}: decode failed as {e}, not with the codec's own error")
            }),
            _ => Err(TestCaseError::fail(format!(
                "{name}: sandbox {:?} but native {:?}",
                got.as_ref().map(Vec::len).map_err(ToString::to_string),
                want.as_ref().map(Vec::len)
            ))),
        }
    });
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// An IDX file of u8 elements with these dimensions and data.
fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        out.extend(d.to_be_bytes());
    }
    out.extend(data);
    out
}

#[derive(Clone, Debug)]
enum IdxFile {
    Random(Vec<u8>),
    /// A valid file of `dims` (product kept small), changed by `edits` (bytes set at an offset,
    /// a truncation, bytes appended), then gzipped when `gz` is 1 (before the edits) or 2
    /// (after them).
    Edited {
        dims: Vec<u32>,
        gz: u8,
        edits: Vec<(Index, Vec<u8>)>,
        cut: Option<Index>,
        tail: Vec<u8>,
    },
}

fn idx_file() -> impl Strategy<Value = IdxFile> {
    let dim = prop_oneof![8 => 0u32..6, 1 => Just(u32::MAX), 1 => Just(1 << 16), 1 => any::<u32>()];
    let edit = (
        any::<Index>(),
        prop::collection::vec(
            prop_oneof![
                Just(0u8),
                Just(0xff),
                Just(0x08),
                Just(0x1f),
                Just(0x8b),
                any::<u8>()
            ],
            1..5,
        ),
    );
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(IdxFile::Random),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|mut b| {
            b.splice(0..0, [0x1f, 0x8b]);
            IdxFile::Random(b)
        }),
        4 => (
            prop::collection::vec(dim, 0..5),
            0u8..3,
            prop::collection::vec(edit, 0..3),
            prop::option::of(any::<Index>()),
            prop::collection::vec(any::<u8>(), 0..4),
        )
            .prop_map(|(dims, gz, edits, cut, tail)| IdxFile::Edited { dims, gz, edits, cut, tail }),
    ]
}

fn idx_bytes(f: &IdxFile) -> Vec<u8> {
    let IdxFile::Edited {
        dims,
        gz,
        edits,
        cut,
        tail,
    } = f
    else {
        let IdxFile::Random(b) = f else {
            unreachable!()
        };
        return b.clone();
    };
    // Data for the dimensions as claimed, up to a few KiB: a large claim gets a short file.
    let n = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(u64::from(d)))
        .unwrap_or(u64::MAX);
    let data: Vec<u8> = (0..n.min(4096)).map(|i| (i * 7) as u8).collect();
    let mut b = idx(dims, &data);
    if *gz == 1 {
        b = gzip(&b);
    }
    damage(&mut b, edits, *cut);
    b.extend(tail);
    if *gz == 2 {
        b = gzip(&b);
    }
    b
}

#[test]
fn the_idx_reader_refuses_damaged_files_without_believing_their_sizes() {
    let dir = scratch("fuzz-idx");
    let path = dir.join("case-idx3-ubyte");
    fuzz("idx", 400, idx_file(), |f| {
        let bytes = idx_bytes(&f);
        std::fs::write(&path, &bytes).unwrap();
        let (out, largest) = largest_allocation(|| read_idx(&path));
        check(largest <= CLAIMED, || {
            format!(
                "one allocation of {largest} bytes for a file of {}",
                bytes.len()
            )
        })?;
        match out {
            Ok(a) => check(a.data.len() == a.dims.iter().product::<usize>(), || {
                format!("{} bytes of data for dims {:?}", a.data.len(), a.dims)
            }),
            Err(e) => check(e.to_string().contains("case-idx3-ubyte"), || {
                format!("the error does not name the file: {e}")
            }),
        }
    });
}

/// Text made mostly of the characters `--set` and TOML give meaning to.
fn text(max: usize) -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        6 => select(vec!['.', '=', '-', '_', ',', ' ', '"', '\'', '[', ']', '{', '}', '#', '\\', '\n']),
        6 => select(vec!['a', 'e', 's', 'x', 'k', '0', '1', '9', '.']),
        1 => any::<char>(),
    ];
    let words = select(vec![
        "schedule",
        "batch_size",
        "batch-size",
        "label_smoothing",
        "codec",
        "layer_rate",
        "layer-rate",
        "warmup_epochs",
        "=",
        ".",
        "true",
        "1e400",
        "nan",
        "-inf",
        "0x10",
        "\u{feff}",
        "\u{0}",
    ]);
    prop::collection::vec(
        prop_oneof![3 => ch.prop_map(String::from), 1 => words.prop_map(String::from)],
        0..max,
    )
    .prop_map(|parts| parts.concat())
}

#[test]
fn set_settings_split_or_are_refused_with_the_setting_named() {
    let prefixes = [
        "schedule",
        "batch_size",
        "label_smoothing",
        "codec",
        "layer_rate",
    ];
    let strategy = prop::collection::vec(text(24), 0..4);
    fuzz("set", 2000, strategy, |raw| {
        match parse_settings(&raw, &prefixes) {
            Ok(parsed) => {
                check(parsed.len() == raw.len(), || {
                    format!("{} settings for {}", parsed.len(), raw.len())
                })?;
                for ((prefix, key, value), s) in parsed.iter().zip(&raw) {
                    let (lhs, v) = s.split_once('=').unwrap_or_default();
                    check(
                        prefixes.contains(&prefix.as_str())
                            && v == value
                            && lhs.ends_with(&format!(".{key}"))
                            && lhs.replace('-', "_").starts_with(&format!("{prefix}.")),
                        || format!("`{s}` split into ({prefix:?}, {key:?}, {value:?})"),
                    )?;
                }
                Ok(())
            }
            Err(e) => check(e.to_string().starts_with("--set "), || {
                format!("unnamed error: {e}")
            }),
        }
    });
}

const GOYAL: &str = include_str!("../../examples/goyal-90-epochs.toml");

#[derive(Clone, Debug)]
enum Toml {
    /// Generated lines: keys (real flags or not) with values of every TOML type.
    Lines(Vec<(String, String)>),
    /// The example, its bytes changed: (position, removed bytes, inserted text).
    Goyal(Vec<(Index, u8, String)>),
}

fn toml_value() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        any::<i64>().prop_map(|i| i.to_string()),
        select(vec![
            "1.5",
            "-0.0",
            "nan",
            "inf",
            "-inf",
            "1e400",
            "true",
            "false",
            "1979-05-27T07:32:00Z",
            "07:32:00",
            "0x7f",
            "1_000"
        ])
        .prop_map(String::from),
        text(12).prop_map(|t| format!("{t:?}")),
        text(12).prop_map(|t| format!("'{t}'")),
    ];
    prop_oneof![
        4 => scalar.clone(),
        1 => prop::collection::vec(scalar.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
        1 => prop::collection::vec(scalar.clone(), 0..3).prop_map(|v| format!("[[{}], {}]", v.join(", "), v.join(", "))),
        1 => scalar.prop_map(|v| format!("{{ a = {v} }}")),
        1 => text(16),
    ]
}

fn toml_doc() -> impl Strategy<Value = Toml> {
    let key = prop_oneof![
        select(vec![
            "epochs",
            "global_batch",
            "global-batch",
            "set",
            "schedule",
            "codec",
            "error_feedback",
            "quiet",
            "config",
            "resume",
            "threads",
            "torus_shape",
            "model",
            "out",
            "base_lr",
            "help",
            "version",
            "checkpoint_every",
            "seed",
            "[table]",
            "\"quoted key\"",
            "a.b",
        ])
        .prop_map(String::from),
        text(8),
    ];
    let goyal_edit = (any::<Index>(), 0u8..4, text(6));
    prop_oneof![
        1 => prop::collection::vec((key, toml_value()), 0..6).prop_map(Toml::Lines),
        1 => prop::collection::vec(goyal_edit, 1..4).prop_map(Toml::Goyal),
    ]
}

fn toml_text(doc: &Toml) -> Vec<u8> {
    match doc {
        Toml::Lines(lines) => lines
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
            .into_bytes(),
        Toml::Goyal(edits) => {
            let mut b = GOYAL.as_bytes().to_vec();
            for (at, removed, inserted) in edits {
                let at = at.index(b.len() + 1);
                let end = (at + usize::from(*removed)).min(b.len());
                // Byte-wise: an edit may split a UTF-8 sequence, which must be refused too.
                b.splice(at..end, inserted.bytes());
            }
            b
        }
    }
}

#[test]
fn config_files_become_flags_or_errors_naming_the_file() {
    let dir = scratch("fuzz-toml");
    let path = dir.join("case.toml");
    fuzz("config-toml", 600, toml_doc(), |doc| {
        std::fs::write(&path, toml_text(&doc)).unwrap();
        match config_args(&path) {
            Ok(args) => {
                check(args.first().is_none_or(|a| a.starts_with("--")), || {
                    format!("flags {args:?}")
                })?;
                // What `lsgd-host run --config` does next: parse them before the command line.
                let argv = ["lsgd-host", "run"]
                    .into_iter()
                    .map(String::from)
                    .chain(args);
                let _ = Cli::try_parse_from(argv);
                Ok(())
            }
            Err(e) => check(format!("{e:#}").contains("case.toml"), || {
                format!("the error does not name the file: {e:#}")
            }),
        }
    });
}

/// A small valid checkpoint, written once with the public API.
fn valid_checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("fuzz-checkpoint-valid");
        let config = crate::train::config(dir.clone(), Arch::Cnn, 100, 1, 10);
        let meta = checkpoint::Meta {
            format: checkpoint::FORMAT.into(),
            reason: "periodic".into(),
            tensors: String::new(),
            tensors_blake3: String::new(),
            step: 3,
            samples_seen: 30,
            last_loss: Some(2.0),
            last_metric: None,
            last_lr: Some(0.1),
            epochs_evaluated: 0,
            train_len: 100,
            config,
            plugins: Vec::new(),
            policy_state: [("schedule".to_string(), "00ff".to_string())].into(),
            loss_scaler: None,
            bucket_order: None,
            window: None,
        };
        let tensors = [
            (
                "fc.weight".to_string(),
                Tensor::from_slice(&[1f32, -2.0, 3.5, 0.25]).reshape([2, 2]),
            ),
            ("fc.bias".to_string(), Tensor::from_slice(&[7i64, 8])),
            ("bn.running_mean".to_string(), Tensor::from_slice(&[0.5f64])),
        ];
        checkpoint::save(&dir, meta, &tensors).unwrap();
        checkpoint::load(&dir).expect("the valid checkpoint loads");
        dir
    })
}

#[derive(Clone, Debug)]
struct CheckpointCase {
    /// Changes to checkpoint.json: (position, removed bytes, inserted text).
    json: Vec<(Index, u8, String)>,
    /// Changes to the tensor file: (position, bytes written over it).
    tensors: Vec<(Index, Vec<u8>)>,
    cut: Option<Index>,
    /// Record the damaged tensor file's blake3 in the JSON, so the safetensors reader sees it.
    rehash: bool,
}

fn checkpoint_case() -> impl Strategy<Value = CheckpointCase> {
    let json_text = prop_oneof![
        text(6),
        select(vec![
            "-1",
            "18446744073709551616",
            "1e999",
            "null",
            "\"\"",
            "[]",
            "{}",
            "\"../../etc/passwd\"",
            "\"checkpoint.json\""
        ])
        .prop_map(String::from),
    ];
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 1..9),
        Just(u64::MAX.to_le_bytes().to_vec()),
        Just((1u64 << 40).to_le_bytes().to_vec()),
        Just(b"\"shape\":[4294967296,4294967296]".to_vec()),
        Just(b"\"dtype\":\"F8_E4M3\"".to_vec()),
        Just(b"\"data_offsets\":[0,99999999]".to_vec()),
    ];
    (
        prop::collection::vec((any::<Index>(), 0u8..6, json_text), 0..3),
        prop::collection::vec((any::<Index>(), bytes), 0..3),
        prop::option::weighted(0.2, any::<Index>()),
        any::<bool>(),
    )
        .prop_map(|(json, tensors, cut, rehash)| CheckpointCase {
            json,
            tensors,
            cut,
            rehash,
        })
}

#[test]
fn damaged_checkpoints_are_refused_not_panicked_on() {
    let valid = valid_checkpoint();
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(valid.join(checkpoint::JSON_NAME)).unwrap()).unwrap();
    let tensor_name = json["tensors"].as_str().unwrap().to_string();
    let tensor_bytes = std::fs::read(valid.join(&tensor_name)).unwrap();
    let dir = scratch("fuzz-checkpoint");
    fuzz("checkpoint", 300, checkpoint_case(), |c| {
        let mut t = tensor_bytes.clone();
        damage(&mut t, &c.tensors, c.cut);
        let mut j = json.clone();
        if c.rehash {
            j["tensors_blake3"] = blake3::hash(&t).to_hex().to_string().into();
        }
        let mut jb = serde_json::to_vec_pretty(&j).unwrap();
        for (at, removed, inserted) in &c.json {
            let at = at.index(jb.len() + 1);
            let end = (at + usize::from(*removed)).min(jb.len());
            jb.splice(at..end, inserted.bytes());
        }
        std::fs::write(dir.join(&tensor_name), &t).unwrap();
        std::fs::write(dir.join(checkpoint::JSON_NAME), &jb).unwrap();
        let (out, largest) = largest_allocation(|| checkpoint::load(&dir));
        check(largest <= CLAIMED, || {
            format!("one allocation of {largest} bytes")
        })?;
        if let Err(e) = out {
            let e = e.to_string();
            check(
                e.contains(checkpoint::JSON_NAME)
                    || e.contains(".safetensors")
                    || e.contains("checkpoint"),
                || format!("the error names no file: {e}"),
            )?;
        }
        Ok(())
    });
}

/// One change to an array of an npz case.
#[derive(Clone, Debug)]
enum Twist {
    /// The header claims this shape.
    Shape(Vec<u64>),
    /// The header claims this dtype.
    Descr(&'static str),
    Fortran,
    Deflate,
    /// Written under this compression method number (as stored bytes).
    Method(u16),
    Encrypted,
    /// Data bytes added (or removed, negative) after the header.
    Delta(i8),
    /// The `.npy` major version.
    Version(u8),
}

#[derive(Clone, Debug)]
struct NpzCase {
    /// Train and test images, and their rows and cols.
    counts: [u64; 2],
    side: [u64; 2],
    /// Labels, cycled over the samples.
    labels: Vec<i64>,
    /// Changes to the arrays x_train, y_train, x_test, y_test and an extra `meta` (by index).
    twists: Vec<(Index, Twist)>,
    /// Bytes of the whole file set at an offset, and a truncation.
    edits: Vec<(Index, Vec<u8>)>,
    cut: Option<Index>,
}

fn npz_case() -> impl Strategy<Value = NpzCase> {
    let dim =
        prop_oneof![8 => 0u64..5, 1 => Just(100_000), 1 => Just(1 << 31), 1 => Just(u64::MAX)];
    let twist = prop_oneof![
        prop::collection::vec(dim, 0..5).prop_map(Twist::Shape),
        select(vec![
            "|u1", "<i8", "<f4", ">i4", "|b1", "|O", "<U3", "<c8", "f4", "<f2", "x"
        ])
        .prop_map(Twist::Descr),
        Just(Twist::Fortran),
        Just(Twist::Deflate),
        select(vec![1u16, 9, 12, 93, 99]).prop_map(Twist::Method),
        Just(Twist::Encrypted),
        any::<i8>().prop_map(Twist::Delta),
        select(vec![2u8, 3, 0, 4]).prop_map(Twist::Version),
    ];
    let label = prop_oneof![8 => 0i64..4, 1 => Just(-1), 1 => Just(3_000_000), 1 => any::<i64>()];
    (
        [1u64..6, 0u64..4],
        [0u64..4, 1u64..4],
        prop::collection::vec(label, 1..5),
        prop::collection::vec((any::<Index>(), twist), 0..3),
        prop::collection::vec(
            (any::<Index>(), prop::collection::vec(any::<u8>(), 1..4)),
            0..2,
        ),
        prop::option::weighted(0.1, any::<Index>()),
    )
        .prop_map(|(counts, side, labels, twists, edits, cut)| NpzCase {
            counts,
            side,
            labels,
            twists,
            edits,
            cut,
        })
}

/// The dtype size of a descr the case may claim (1 for those the reader refuses).
fn itemsize(descr: &str) -> u64 {
    descr[descr.len() - 1..].parse().unwrap_or(1)
}

/// One array of an npz case as its entry will be written.
struct NpyPlan {
    name: String,
    descr: &'static str,
    shape: Vec<u64>,
    fortran: bool,
    method: u16,
    flags: u16,
    delta: i8,
    version: u8,
}

fn npz_bytes(c: &NpzCase) -> Vec<u8> {
    let [train, test] = c.counts;
    let [h, w] = c.side;
    // Each array as its header will claim it; its data comes from the claimed shape, up to
    // 4 KiB.
    let mut arrays: Vec<NpyPlan> = [
        ("x_train", "|u1", vec![train, h, w]),
        ("y_train", "<i8", vec![train]),
        ("x_test", "|u1", vec![test, h, w]),
        ("y_test", "<i8", vec![test]),
        ("meta", "|O", vec![1]),
    ]
    .into_iter()
    .map(|(name, descr, shape)| NpyPlan {
        name: format!("{name}.npy"),
        descr,
        shape,
        fortran: false,
        method: 0,
        flags: 0,
        delta: 0,
        version: 1,
    })
    .collect();
    for (which, twist) in &c.twists {
        let a = &mut arrays[which.index(5)];
        match twist {
            Twist::Shape(s) => a.shape = s.clone(),
            Twist::Descr(d) => a.descr = d,
            Twist::Fortran => a.fortran = true,
            Twist::Deflate => a.method = 8,
            Twist::Method(m) => a.method = *m,
            Twist::Encrypted => a.flags = 1,
            Twist::Delta(d) => a.delta = *d,
            Twist::Version(v) => a.version = *v,
        }
    }
    let entries: Vec<(String, Vec<u8>, u16, u16)> = arrays
        .into_iter()
        .map(|a| {
            let n = a
                .shape
                .iter()
                .try_fold(itemsize(a.descr), |acc, &d| acc.checked_mul(d))
                .unwrap_or(u64::MAX)
                .min(4096);
            let len = (n as i64 + i64::from(a.delta)).max(0) as usize;
            let data: Vec<u8> = if a.descr == "<i8" {
                (0..len)
                    .map(|i| c.labels[i / 8 % c.labels.len()].to_le_bytes()[i % 8])
                    .collect()
            } else {
                (0..len).map(|i| (i * 7) as u8).collect()
            };
            let bytes = npy(a.version, a.descr, a.fortran, &a.shape, &data);
            (a.name, bytes, a.method, a.flags)
        })
        .collect();
    let mut b = zip_bytes(&entries);
    damage(&mut b, &c.edits, c.cut);
    b
}

#[test]
fn the_npz_reader_refuses_lying_headers_and_damaged_zips() {
    let dir = scratch("fuzz-npz");
    let path = dir.join("case.npz");
    fuzz("npz", 300, npz_case(), |c| {
        let bytes = npz_bytes(&c);
        std::fs::write(&path, &bytes).unwrap();
        let (out, largest) = largest_allocation(|| data::load(DatasetKind::Npz, &path));
        check(largest <= CLAIMED, || {
            format!(
                "one allocation of {largest} bytes for a file of {}",
                bytes.len()
            )
        })?;
        match out {
            Ok(d) => check(
                d.train.labels.len() == d.train.len
                    && d.test.labels.len() == d.test.len
                    && d.test.len > 0
                    && d.classes <= data::MAX_CLASSES
                    && d.train.labels.iter().all(|&l| (l as usize) < d.classes),
                || format!("an inconsistent data set: {d:?}"),
            ),
            Err(e) => check(e.to_string().contains("case.npz"), || {
                format!("the error does not name the file: {e}")
            }),
        }
    });
}

/// One thing put into an image folder case.
#[derive(Clone, Debug)]
enum FolderNode {
    /// A real PNG of this size (small).
    Png(u32, u32),
    /// A PNG header claiming this size, with no pixels.
    Claim(u32, u32),
    /// Bytes with an image name.
    Junk(Vec<u8>),
    /// A symbolic link to this target.
    Link(&'static str),
    /// An empty folder.
    Dir,
}

/// Where a node goes: split, class, sub-folder, and the name's extension.
type Placed = (Index, Index, Index, Index, FolderNode);

fn folder_case() -> impl Strategy<Value = Vec<Placed>> {
    let side = prop_oneof![4 => 0u32..4, 1 => Just(256), 1 => Just(257), 1 => Just(12_000),
        1 => Just(4_000_000), 1 => Just(u32::MAX)];
    let node = prop_oneof![
        (1u32..6, 1u32..6).prop_map(|(w, h)| FolderNode::Png(w, h)),
        (side.clone(), side).prop_map(|(w, h)| FolderNode::Claim(w, h)),
        prop::collection::vec(any::<u8>(), 0..32).prop_map(FolderNode::Junk),
        select(vec![
            ".",
            "..",
            "../..",
            "../../..",
            "../b",
            "/dev/zero",
            "/nonexistent",
            "loop"
        ])
        .prop_map(FolderNode::Link),
        Just(FolderNode::Dir),
    ];
    prop::collection::vec(
        (
            any::<Index>(),
            any::<Index>(),
            any::<Index>(),
            any::<Index>(),
            node,
        ),
        0..6,
    )
}

fn build_folder(dir: &Path, nodes: &[Placed]) {
    let _ = std::fs::remove_dir_all(dir);
    let tiny = |path: PathBuf, w: u32, h: u32| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::RgbImage::from_pixel(w, h, image::Rgb([9, 8, 7]))
            .save(&path)
            .unwrap();
    };
    for base in ["train/a", "train/b", "val/a"] {
        tiny(dir.join(base).join("ok.png"), 3, 2);
    }
    for (i, (split, class, sub, ext, node)) in nodes.iter().enumerate() {
        let folder = dir
            .join(["train", "val"][split.index(2)])
            .join(["a", "b"][class.index(2)])
            .join(["", "s", "s/t"][sub.index(3)]);
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join(format!("n{i}.{}", ["png", "jpg", "txt"][ext.index(3)]));
        match node {
            FolderNode::Png(w, h) => tiny(path.with_extension("png"), *w, *h),
            FolderNode::Claim(w, h) => std::fs::write(&path, png_header(*w, *h)).unwrap(),
            FolderNode::Junk(b) => std::fs::write(&path, b).unwrap(),
            FolderNode::Link(t) => {
                let target = if *t == "loop" {
                    path.as_path()
                } else {
                    Path::new(t)
                };
                std::os::unix::fs::symlink(target, &path).unwrap();
            }
            FolderNode::Dir => std::fs::create_dir_all(&path).unwrap(),
        }
    }
}

#[test]
fn image_folders_with_links_and_lying_headers_load_or_are_refused_by_name() {
    let dir = scratch("fuzz-folder");
    let prefix = dir.display().to_string();
    fuzz("imagefolder", 150, folder_case(), |nodes| {
        build_folder(&dir, &nodes);
        let (out, largest) = largest_allocation(|| data::load(DatasetKind::Imagefolder, &dir));
        check(largest <= CLAIMED, || {
            format!("one allocation of {largest} bytes")
        })?;
        let d = match out {
            Ok(d) => d,
            Err(e) => {
                return check(e.to_string().contains(&prefix), || {
                    format!("the error names no path of the case: {e}")
                });
            }
        };
        check(d.test.len > 0 && d.classes == 2, || format!("{d:?}"))?;
        for split in [&d.train, &d.test] {
            let data::Images::Files(files) = &split.images else {
                return Err(TestCaseError::fail("image folders are files"));
            };
            for f in files {
                let (rgb, largest) = largest_allocation(|| data::decode(f));
                check(largest <= CLAIMED, || {
                    format!(
                        "decoding {} made one allocation of {largest} bytes",
                        f.display()
                    )
                })?;
                if let Err(e) = rgb {
                    check(e.to_string().contains(&prefix), || format!("unnamed: {e}"))?;
                }
            }
        }
        Ok(())
    });
}
