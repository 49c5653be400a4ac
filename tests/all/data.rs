//! `--dataset`, `--augment` and the loaders through `lsgd-host run`, on small fixtures the tests
//! write themselves (CIFAR records, PNG and JPEG class folders, npz and safetensors files):
//! training runs on each, augmented runs resume bit for bit, image decoding does not depend
//! on the loader's thread count, and bad data stops the run before training with the file
//! named. The loaders' own checks are unit tests in `crates/train/src/data/`.

use std::path::{Path, PathBuf};
use std::process::Output;

use tch::{Kind, Tensor};

use crate::common::*;

/// A deterministic byte stream for fixture pixels.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 56) as u8
        })
        .collect()
}

/// CIFAR-10 records: label `i % 10` and pixels whose mean depends on the label, so a model can
/// learn something.
fn cifar_records(first: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in first..first + n {
        let label = (i % 10) as u8;
        out.push(label);
        out.extend(
            bytes(i as u64, 3072)
                .into_iter()
                .map(|b| b / 2 + label * 12),
        );
    }
    out
}

/// A CIFAR-10 directory: 5 × `per_batch` training records and `test` test records.
fn cifar_dir(name: &str, per_batch: usize, test: usize) -> PathBuf {
    let dir = scratch(name);
    for b in 0..5 {
        std::fs::write(
            dir.join(format!("data_batch_{}.bin", b + 1)),
            cifar_records(b * per_batch, per_batch),
        )
        .unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), cifar_records(10_000, test)).unwrap();
    dir
}

/// `run` with the test's flags on CPU, one thread, quietly.
fn train(data: &[&str], out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--quiet",
        "--base-lr",
        "0.05",
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(data);
    args.extend_from_slice(extra);
    lsgd(&args)
}

/// A straight run and the same run stopped after `k` steps and resumed end with the same
/// weights; returns them.
fn resumes_bit_for_bit(name: &str, data: &[&str], extra: &[&str], k: &str) -> String {
    let straight = weights(&train(data, &scratch(&format!("{name}-straight")), extra));
    let out = scratch(&format!("{name}-split"));
    let stop = [extra, &["--stop-after-steps", k]].concat();
    weights(&train(data, &out, &stop));
    let resume = [extra, &["--resume", out.to_str().unwrap()]].concat();
    assert_eq!(weights(&train(data, &out, &resume)), straight, "{name}");
    straight
}

#[test]
fn cifar_resnet_with_cifar_augmentation_resumes_bit_for_bit() {
    let dir = cifar_dir("data-cifar", 16, 20);
    let d = dir.to_str().unwrap();
    let data = ["--dataset", "cifar10", "--data-dir", d];
    let job = [
        "--model",
        "resnet",
        "--depth",
        "8",
        "--global-batch",
        "16",
        "--epochs",
        "1",
    ];
    let augmented = resumes_bit_for_bit(
        "data-cifar-aug",
        &data,
        &[&job[..], &["--augment", "cifar"]].concat(),
        "2",
    );
    let plain = weights(&train(&data, &scratch("data-cifar-plain"), &job));
    assert_ne!(augmented, plain, "--augment cifar changes the batches");
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(scratch_keep("data-cifar-aug-split").join("checkpoint.json"))
            .unwrap(),
    )
    .unwrap();
    let c = &meta["config"];
    assert_eq!(
        (c["dataset"].as_str(), c["augment"].as_str()),
        (Some("cifar10"), Some("cifar"))
    );
}

/// The scratch directory `name` without emptying it.
fn scratch_keep(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("lsgd-test-{}-{name}", std::process::id()))
}

/// An image folder: two classes (created out of name order), `per_class` training images each
/// (PNG and JPEG alternately, of different sizes) and two validation images each.
fn image_folder(name: &str, per_class: usize) -> PathBuf {
    let dir = scratch(name);
    for (split, n) in [("train", per_class), ("val", 2)] {
        for (c, class) in ["zebra", "ant"].iter().enumerate() {
            let folder = dir.join(split).join(class);
            std::fs::create_dir_all(&folder).unwrap();
            for i in 0..n {
                let (w, h) = (24 + 4 * (i as u32 % 3), 20 + 2 * (i as u32 % 4));
                let px = bytes((c * 100 + i) as u64, (w * h * 3) as usize);
                let shade = if c == 0 { 0 } else { 120 };
                let img = image::RgbImage::from_fn(w, h, |x, y| {
                    let k = ((y * w + x) * 3) as usize;
                    image::Rgb([px[k] / 2 + shade, px[k + 1] / 2, px[k + 2] / 2 + shade / 2])
                });
                let ext = if i % 2 == 0 { "png" } else { "jpg" };
                img.save(folder.join(format!("{i:03}.{ext}"))).unwrap();
            }
        }
    }
    dir
}

#[test]
fn image_folders_train_with_imagenet_crops_whatever_the_loader_threads() {
    let dir = image_folder("data-folder", 12);
    let d = dir.to_str().unwrap();
    let data = ["--dataset", "imagefolder", "--data-dir", d];
    let job = [
        "--model",
        "cnn",
        "--image-size",
        "16",
        "--augment",
        "imagenet",
        "--global-batch",
        "8",
        "--epochs",
        "1",
    ];
    let one = resumes_bit_for_bit(
        "data-folder-1",
        &data,
        &[&job[..], &["--loader-threads", "1"]].concat(),
        "1",
    );
    let three = weights(&train(
        &data,
        &scratch("data-folder-3"),
        &[&job[..], &["--loader-threads", "3"]].concat(),
    ));
    assert_eq!(
        one, three,
        "decoding is a function of the sample, not of the thread"
    );
}

#[test]
fn tensor_files_train_in_either_layout() {
    let dir = scratch("data-tensors");
    // NHWC bytes in npz, NCHW floats in safetensors: the same 3×8×8 images.
    let n = 48;
    let labels = Tensor::from_slice(&(0..n).map(|i| i % 3).collect::<Vec<i64>>());
    let nhwc = Tensor::from_slice(&bytes(5, n as usize * 8 * 8 * 3)).view([n, 8, 8, 3]);
    let nchw = nhwc.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0;
    let npz = dir.join("data.npz");
    let st = dir.join("data.safetensors");
    Tensor::write_npz(
        &[
            ("x_train", &nhwc),
            ("y_train", &labels),
            ("x_test", &nhwc.narrow(0, 0, 12)),
            ("y_test", &labels.narrow(0, 0, 12)),
        ],
        &npz,
    )
    .unwrap();
    Tensor::write_safetensors(
        &[
            ("x_train", &nchw.contiguous()),
            ("y_train", &labels),
            ("x_test", &nchw.narrow(0, 0, 12).contiguous()),
            ("y_test", &labels.narrow(0, 0, 12)),
        ],
        &st,
    )
    .unwrap();
    let job = ["--model", "mlp", "--global-batch", "16", "--epochs", "1"];
    let a = weights(&train(
        &["--dataset", "npz", "--data-dir", npz.to_str().unwrap()],
        &scratch("data-npz"),
        &job,
    ));
    let b = weights(&train(
        &[
            "--dataset",
            "safetensors",
            "--data-dir",
            st.to_str().unwrap(),
        ],
        &scratch("data-st"),
        &job,
    ));
    // Bytes / 255 and the same floats written directly: one data set, one result.
    assert_eq!(a, b);
}

#[test]
fn bad_data_stops_before_training_with_the_file_named() {
    let dir = cifar_dir("data-bad", 4, 5);
    let bad = dir.join("data_batch_3.bin");
    let mut records = std::fs::read(&bad).unwrap();
    records.truncate(3073 * 3 + 100);
    std::fs::write(&bad, records).unwrap();
    let out = scratch("data-bad-out");
    let o = train(
        &["--dataset", "cifar10", "--data-dir", dir.to_str().unwrap()],
        &out,
        &["--model", "mlp"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&bad.display().to_string()) && err.contains("truncated"),
        "{err}"
    );
    assert!(!out.join("metrics.jsonl").exists(), "nothing was trained");
}

#[test]
fn data_flags_are_checked() {
    let out = scratch("data-flags");
    let o = train(&["--dataset", "cifar10"], &out, &[]);
    assert!(
        stderr(&o).contains("--dataset cifar10 needs --data-dir"),
        "{}",
        stderr(&o)
    );
    let dir = cifar_dir("data-flags-cifar", 4, 5);
    let o = train(
        &["--dataset", "cifar10", "--data-dir", dir.to_str().unwrap()],
        &out,
        &["--augment", "imagenet"],
    );
    assert!(
        stderr(&o).contains("--augment imagenet crops image files"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bench_loader_reports_both_rates() {
    let o = lsgd(&[
        "bench",
        "loader",
        "--images",
        "16",
        "--image-size",
        "32",
        "--model",
        "cnn",
        "--global-batch",
        "8",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--threads",
        "1",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in ["loader_images_per_s", "train_samples_per_s", "ratio"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r}");
    }
}

#[test]
fn bench_train_compares_a_cifar_resnet_with_pytorch() {
    let o = lsgd(&[
        "bench",
        "train",
        "--model",
        "resnet",
        "--depth",
        "8",
        "--dataset",
        "cifar10",
        "--synthetic",
        "80",
        "--augment",
        "cifar",
        "--global-batch",
        "16",
        "--steps",
        "2",
        "--warmup-steps",
        "1",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for key in ["lsgd_samples_per_s", "pytorch_samples_per_s", "ratio"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r}");
    }
}

#[test]
fn studies_take_the_data_sets_they_have_a_preset_for() {
    let out = scratch("data-study");
    let o = lsgd(&[
        "study",
        "goyal",
        "--quick",
        "--dataset",
        "npz",
        "--data-dir",
        "x.npz",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("presets for fashion-mnist, mnist, cifar10 and cifar100"),
        "{}",
        stderr(&o)
    );
    let o = lsgd(&["study", "goyal", "--quick", "--dataset", "cifar10"]);
    assert!(
        stderr(&o).contains("--dataset cifar10 needs --data-dir"),
        "{}",
        stderr(&o)
    );
}
