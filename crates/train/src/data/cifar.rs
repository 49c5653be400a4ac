//! CIFAR-10 and CIFAR-100 in their binary versions: files of fixed-size records, each its label
//! byte(s) then 32×32 RGB pixels as three 1024-byte planes (R, G, B, each row-major), which is
//! already the CHW layout of [`Images::U8`]. The files may lie directly in the directory or in
//! the folder the archive unpacks to, since both are what people point `--data-dir` at.

use std::io;
use std::path::{Path, PathBuf};

use super::{DataError, Dataset, Images, Split, find_any, read_whole};

/// Bytes of pixels in a record: 3 channels of 32×32.
const PIXELS: usize = 3 * 32 * 32;

/// Image side in pixels.
const SIDE: usize = 32;

/// The file layout of one of the two data sets.
pub(super) struct Layout {
    /// The folder the official archive unpacks to.
    sub: &'static str,
    /// The train files, in the order their records are concatenated.
    train: &'static [&'static str],
    /// The test file.
    test: &'static str,
    /// Label bytes before the pixels of a record; the last of them is the label used.
    label_bytes: usize,
    /// Number of classes: labels must be below it.
    classes: usize,
    /// The optional file of class names, one a line in index order.
    names: &'static str,
}

/// CIFAR-10: five train batches of 10000 records, one label byte each.
pub(super) const CIFAR10: Layout = Layout {
    sub: "cifar-10-batches-bin",
    train: &[
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
    ],
    test: "test_batch.bin",
    label_bytes: 1,
    classes: 10,
    names: "batches.meta.txt",
};

/// CIFAR-100: a coarse (20 superclasses) then a fine label byte; the fine one is the task.
pub(super) const CIFAR100: Layout = Layout {
    sub: "cifar-100-binary",
    train: &["train.bin"],
    test: "test.bin",
    label_bytes: 2,
    classes: 100,
    names: "fine_label_names.txt",
};

impl Layout {
    /// Bytes in one record.
    fn record(&self) -> usize {
        self.label_bytes + PIXELS
    }

    /// `dir/name` or `dir/SUB/name`, whichever is a file.
    fn find(&self, dir: &Path, name: &str) -> Result<PathBuf, DataError> {
        find_any(dir, vec![name.to_string(), format!("{}/{name}", self.sub)])
    }
}

/// Loads a CIFAR data set from `dir` (or its archive folder inside `dir`).
pub(super) fn load(dir: &Path, layout: &Layout) -> Result<Dataset, DataError> {
    let train = load_split(dir, layout, layout.train)?;
    let test = load_split(dir, layout, &[layout.test])?;
    // The names are a convenience for reports, so a data set without them still loads.
    let class_names = match layout.find(dir, layout.names) {
        Ok(path) => read_names(&path, layout.classes)?,
        Err(_) => Vec::new(),
    };
    Ok(Dataset {
        train,
        test,
        classes: layout.classes,
        class_names,
    })
}

/// The records of `files`, concatenated in order, as one split.
fn load_split(dir: &Path, layout: &Layout, files: &[&str]) -> Result<Split, DataError> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for name in files {
        let path = layout.find(dir, name)?;
        read_records(&path, layout, &mut pixels, &mut labels)?;
    }
    Ok(Split {
        images: Images::U8(pixels),
        len: labels.len(),
        labels,
        channels: 3,
        rows: SIDE,
        cols: SIDE,
    })
}

/// Appends the pixels and labels of the records in `path`, checking the file is whole records
/// and every label a class.
fn read_records(
    path: &Path,
    layout: &Layout,
    pixels: &mut Vec<u8>,
    labels: &mut Vec<u32>,
) -> Result<(), DataError> {
    let bytes = read_whole(path)?;
    let size = layout.record();
    if bytes.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            expected: format!(
                "records of {size} bytes ({} label, {PIXELS} pixel bytes)",
                layout.label_bytes
            ),
        });
    }
    if bytes.len() % size != 0 {
        return Err(DataError::Record {
            path: path.to_path_buf(),
            index: bytes.len() / size,
            found: bytes.len() % size,
            size,
        });
    }
    pixels.reserve(bytes.len() / size * PIXELS);
    for (index, record) in bytes.chunks_exact(size).enumerate() {
        let (label_bytes, image) = record.split_at(layout.label_bytes);
        let label = u32::from(label_bytes[layout.label_bytes - 1]);
        if label as usize >= layout.classes {
            return Err(DataError::RecordLabel {
                path: path.to_path_buf(),
                index,
                found: label,
                classes: layout.classes,
            });
        }
        labels.push(label);
        pixels.extend_from_slice(image);
    }
    Ok(())
}

/// The non-blank lines of a class-name file, which must be one per class (the official
/// `batches.meta.txt` ends in blank lines).
fn read_names(path: &Path, classes: usize) -> Result<Vec<String>, DataError> {
    let bytes = read_whole(path)?;
    let text = String::from_utf8(bytes).map_err(|e| DataError::Io {
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })?;
    let names: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect();
    if names.len() != classes {
        return Err(DataError::ClassNames {
            path: path.to_path_buf(),
            expected: classes,
            found: names.len(),
        });
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::data::test_files::{TempDir, assert_err};
    use crate::data::{DatasetKind, load};

    /// A record: the label bytes, then pixels counting up from `first` (wrapping).
    fn record(labels: &[u8], first: u8) -> Vec<u8> {
        let mut out = labels.to_vec();
        out.extend((0..PIXELS).map(|i| first.wrapping_add(i as u8)));
        out
    }

    /// Records of one label byte each, pixels starting at the label.
    fn records10(labels: &[u8]) -> Vec<u8> {
        labels.iter().flat_map(|&l| record(&[l], l)).collect()
    }

    /// CIFAR-10 files under `prefix` (`""` or the archive folder): two records per train
    /// batch, labelled by batch, and three test records.
    fn cifar10_set(name: &str, prefix: &str) -> TempDir {
        let t = TempDir::new(name);
        for b in 1..=5u8 {
            let bytes = records10(&[b - 1, b + 4]);
            t.write(&format!("{prefix}data_batch_{b}.bin"), &bytes);
        }
        t.write(&format!("{prefix}test_batch.bin"), &records10(&[9, 0, 3]));
        t
    }

    #[test]
    fn cifar10_train_batches_in_order() {
        let t = cifar10_set("c10", "");
        let d = load(DatasetKind::Cifar10, t.path()).unwrap();
        assert_eq!(d.train.labels, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]);
        assert_eq!(d.test.labels, [9, 0, 3]);
        assert_eq!((d.train.len, d.test.len, d.classes), (10, 3, 10));
        assert_eq!((d.train.channels, d.train.rows, d.train.cols), (3, 32, 32));
        assert!(d.class_names.is_empty());
        let Images::U8(pixels) = &d.train.images else {
            panic!("CIFAR pixels are bytes")
        };
        assert_eq!(pixels.len(), 10 * PIXELS);
        // Record 1 of batch 1 has label 5 and pixels counting from 5, the label dropped.
        assert_eq!(&pixels[PIXELS..PIXELS + 3], [5, 6, 7]);
    }

    #[test]
    fn cifar10_in_archive_folder_with_names() {
        let t = cifar10_set("c10-sub", "cifar-10-batches-bin/");
        let names = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
        t.write("cifar-10-batches-bin/batches.meta.txt", names.as_bytes());
        let d = load(DatasetKind::Cifar10, t.path()).unwrap();
        assert_eq!(d.train.len, 10);
        assert_eq!(d.class_names.len(), 10);
        assert_eq!(
            (&*d.class_names[0], &*d.class_names[9]),
            ("airplane", "truck")
        );
    }

    #[test]
    fn class_names_must_count_the_classes() {
        let t = cifar10_set("c10-names", "");
        t.write("batches.meta.txt", b"airplane\nautomobile\n");
        let msg = "expected 10 class names (one a line), found 2";
        assert_err(
            load(DatasetKind::Cifar10, t.path()),
            &["batches.meta.txt", msg],
        );
    }

    #[test]
    fn missing_batch_lists_both_places() {
        let t = cifar10_set("c10-missing", "");
        fs::remove_file(t.path().join("data_batch_3.bin")).unwrap();
        let dir = t.path().display().to_string();
        let msg = "cannot find data_batch_3.bin or cifar-10-batches-bin/data_batch_3.bin";
        assert_err(load(DatasetKind::Cifar10, t.path()), &[&dir, msg]);
    }

    #[test]
    fn truncated_record_is_named() {
        let t = cifar10_set("c10-cut", "");
        let bytes = records10(&[1, 2]);
        t.write("test_batch.bin", &bytes[..3073 + 100]);
        let msg = "truncated: record 1 has 100 of 3073 bytes";
        assert_err(
            load(DatasetKind::Cifar10, t.path()),
            &["test_batch.bin", msg],
        );
    }

    #[test]
    fn empty_file_is_named() {
        let t = cifar10_set("c10-empty", "");
        t.write("data_batch_2.bin", b"");
        let msg = "empty file: expected records of 3073 bytes (1 label, 3072 pixel bytes)";
        assert_err(
            load(DatasetKind::Cifar10, t.path()),
            &["data_batch_2.bin", msg],
        );
    }

    #[test]
    fn label_out_of_range_names_record() {
        let t = cifar10_set("c10-label", "");
        t.write("data_batch_4.bin", &records10(&[3, 4, 10]));
        let msg = "label out of range: expected below 10, found 10 in record 2";
        assert_err(
            load(DatasetKind::Cifar10, t.path()),
            &["data_batch_4.bin", msg],
        );
    }

    #[test]
    fn cifar100_uses_fine_labels() {
        let t = TempDir::new("c100");
        let train: Vec<u8> = [[19, 99], [0, 42]]
            .iter()
            .flat_map(|l| record(l, 7))
            .collect();
        t.write("cifar-100-binary/train.bin", &train);
        t.write("cifar-100-binary/test.bin", &record(&[3, 17], 0));
        let names: String = (0..100).map(|i| format!("class{i}\n")).collect();
        t.write("cifar-100-binary/fine_label_names.txt", names.as_bytes());
        let d = load(DatasetKind::Cifar100, t.path()).unwrap();
        assert_eq!(
            (d.train.labels.as_slice(), d.test.labels.as_slice()),
            (&[99, 42][..], &[17][..])
        );
        assert_eq!((d.classes, d.class_names[42].as_str()), (100, "class42"));
        let Images::U8(pixels) = &d.test.images else {
            panic!("CIFAR pixels are bytes")
        };
        assert_eq!(
            (pixels.len(), pixels[0], pixels[PIXELS - 1]),
            (PIXELS, 0, 255)
        );
    }

    #[test]
    fn cifar100_records_are_3074_bytes() {
        let t = TempDir::new("c100-cut");
        t.write("train.bin", &record(&[0, 1], 0)[..3073]);
        t.write("test.bin", &record(&[0, 1], 0));
        let msg = "truncated: record 0 has 3073 of 3074 bytes";
        assert_err(load(DatasetKind::Cifar100, t.path()), &["train.bin", msg]);
        t.write("train.bin", &record(&[0, 100], 0));
        let msg = "expected below 100, found 100 in record 0";
        assert_err(load(DatasetKind::Cifar100, t.path()), &["train.bin", msg]);
    }
}
