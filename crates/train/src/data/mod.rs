//! Labelled image data sets for the trainer's `--dataset NAME --data-dir DIR`: the IDX files of
//! MNIST and Fashion-MNIST, the binary CIFAR-10/100 records, image folders, and tensor files
//! (npz, safetensors). Every error names the file (and the record or image) and what was
//! expected, since a wrong, partial or damaged download is the usual cause and the path is what
//! a person needs to fix it.

use std::fmt;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

mod cifar;
mod error;
mod folder;
mod idx;
mod mnist;
mod npz;
mod tensor_file;
#[cfg(test)]
mod test_files;

pub use error::DataError;
use error::kind_text;
pub use folder::{MAX_ASPECT, MAX_PIXELS, Rgb, decode};
pub use idx::{IdxArray, MAX_BYTES, read_idx};
pub use mnist::load_dir;

/// Where Debian's `dataset-fashion-mnist` installs the gzipped files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The largest data file read whole into memory (safetensors, CIFAR batches): four arrays of
/// [`MAX_BYTES`], the most a tensor file of a data set holds.
pub const MAX_FILE_BYTES: u64 = 4 * MAX_BYTES;

/// The most classes a data set may have: its labels size the model's output layer, so one stray
/// label of 3,000,000 would build a model of gigabytes. Above every public classification set
/// (Google Landmarks v2: 203,094 classes).
pub const MAX_CLASSES: usize = 1 << 18;

/// Which data set (and so which file layout) `--data-dir` holds.
#[derive(ValueEnum, Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// Fashion-MNIST's IDX files (plain or gzipped); the default, in [`DEFAULT_DIR`].
    #[default]
    FashionMnist,
    /// MNIST's IDX files: the same layout as Fashion-MNIST.
    Mnist,
    /// CIFAR-10's binary version: `data_batch_1.bin` … `data_batch_5.bin`, `test_batch.bin`.
    Cifar10,
    /// CIFAR-100's binary version: `train.bin`, `test.bin` (the fine labels).
    Cifar100,
    /// `train/CLASS/*.{jpg,jpeg,png}` and `val/` or `test/`, classes numbered by sorted folder
    /// name.
    Imagefolder,
    /// A NumPy `.npz` file with `x_train`, `y_train`, `x_test`, `y_test`.
    Npz,
    /// A `.safetensors` file with `x_train`, `y_train`, `x_test`, `y_test`.
    Safetensors,
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.to_possible_value().expect("no variant is skipped");
        f.write_str(name.get_name())
    }
}

/// The pixels of a split.
#[derive(Debug, Clone, PartialEq)]
pub enum Images {
    /// `len × channels × rows × cols` bytes, each image channel-major (CHW), 0–255.
    U8(Vec<u8>),
    /// `len × channels × rows × cols` floats, each image CHW, used as they are (not / 255).
    F32(Vec<f32>),
    /// One image file per sample, decoded (to RGB) when a batch needs it: image folders, whose
    /// images have sizes of their own.
    Files(Vec<PathBuf>),
}

/// One split's images and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// The pixels, or the files they are in.
    pub images: Images,
    /// One class index per image, each below [`Dataset::classes`].
    pub labels: Vec<u32>,
    /// Number of images (and labels).
    pub len: usize,
    /// Image channels (1 or 3).
    pub channels: usize,
    /// Image height (0 for [`Images::Files`]: each file has its own).
    pub rows: usize,
    /// Image width (0 for [`Images::Files`]).
    pub cols: usize,
}

/// A train and a test split of the same image shape and class set.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// What the model is fitted on.
    pub train: Split,
    /// What it is evaluated on, never trained on.
    pub test: Split,
    /// Number of classes: the output layer's size.
    pub classes: usize,
    /// The classes' names where the data set has them (image folders' folder names, CIFAR's
    /// `batches.meta.txt` or `fine_label_names.txt`), in index order; empty otherwise.
    pub class_names: Vec<String>,
}

/// Loads the data set `kind` from `dir` (for `npz` and `safetensors` the file, or a directory
/// holding exactly one).
pub fn load(kind: DatasetKind, dir: &Path) -> Result<Dataset, DataError> {
    match kind {
        DatasetKind::FashionMnist | DatasetKind::Mnist => mnist::load_dir(dir),
        DatasetKind::Cifar10 => cifar::load(dir, &cifar::CIFAR10),
        DatasetKind::Cifar100 => cifar::load(dir, &cifar::CIFAR100),
        DatasetKind::Imagefolder => folder::load(dir),
        DatasetKind::Npz => tensor_file::load(dir, tensor_file::Format::Npz),
        DatasetKind::Safetensors => tensor_file::load(dir, tensor_file::Format::Safetensors),
    }
}

/// Opens `path` (symbolic links followed) if it is a regular file, with its size. Opened
/// non-blocking and checked on the open file, so a FIFO named like a data file is refused
/// rather than waited on, and no swap of the path after a check can get past it.
fn open_data(path: &Path) -> Result<(File, u64), DataError> {
    let cannot_read = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot_read)?;
    let meta = file.metadata().map_err(cannot_read)?;
    if !meta.is_file() {
        return Err(DataError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_text(meta.file_type()),
        });
    }
    Ok((file, meta.len()))
}

/// The bytes of the regular file `path`, refused above [`MAX_FILE_BYTES`] before reading.
fn read_whole(path: &Path) -> Result<Vec<u8>, DataError> {
    let (file, size) = open_data(path)?;
    if size > MAX_FILE_BYTES {
        return Err(DataError::FileSize {
            path: path.to_path_buf(),
            size,
            limit: MAX_FILE_BYTES,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // One byte over the limit tells a file that grew since the check from one that did not.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(DataError::FileSize {
            path: path.to_path_buf(),
            size: bytes.len() as u64,
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// The first of `tried` (paths relative to `dir`) that is a file.
fn find_any(dir: &Path, tried: Vec<String>) -> Result<PathBuf, DataError> {
    match tried
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
    {
        Some(path) => Ok(path),
        None => Err(DataError::Missing {
            dir: dir.to_path_buf(),
            tried,
        }),
    }
}

/// Largest label + 1: the classes a split's labels imply (0 without labels).
fn classes_of(labels: &[u32]) -> usize {
    labels.iter().max().map_or(0, |&m| m as usize + 1)
}

/// The first label at or above `classes`, with its index.
fn first_out_of_range(labels: &[u32], classes: usize) -> Option<(usize, u32)> {
    labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| l as usize >= classes)
        .map(|(i, &l)| (i, l))
}

#[cfg(test)]
mod tests {
    use super::test_files::{TempDir, assert_err};
    use super::*;

    #[test]
    fn dataset_kind_names_are_kebab_case() {
        let names = [
            (DatasetKind::FashionMnist, "fashion-mnist"),
            (DatasetKind::Mnist, "mnist"),
            (DatasetKind::Cifar10, "cifar10"),
            (DatasetKind::Cifar100, "cifar100"),
            (DatasetKind::Imagefolder, "imagefolder"),
            (DatasetKind::Npz, "npz"),
            (DatasetKind::Safetensors, "safetensors"),
        ];
        assert_eq!(names.len(), DatasetKind::value_variants().len());
        for (kind, name) in names {
            assert_eq!(kind.to_string(), name);
            // The command line and a checkpoint's config spell it the same way.
            assert_eq!(DatasetKind::from_str(name, false), Ok(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{name}\""));
        }
        assert_eq!(DatasetKind::default(), DatasetKind::FashionMnist);
    }

    #[test]
    fn data_files_must_be_regular_files_of_bounded_size() {
        let t = TempDir::new("regular");
        let fifo = t.fifo("train-images-idx3-ubyte");
        assert_err(
            read_idx(&fifo),
            &["train-images-idx3-ubyte", "found a FIFO"],
        );
        assert_err(read_whole(t.path()), &["not a regular file", "a directory"]);
        assert_eq!(read_whole(&t.write("small", b"abc")).unwrap(), b"abc");
    }
}
