//! Labelled image data sets for the trainer's `--dataset NAME --data-dir DIR`: the IDX files of
//! MNIST and Fashion-MNIST, the binary CIFAR-10/100 records, image folders, and tensor files
//! (npz, safetensors). Every error names the file (and the record or image) and what was
//! expected, since a wrong, partial or damaged download is the usual cause and the path is what
//! a person needs to fix it.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

mod cifar;
mod folder;
mod idx;
mod npz;
mod tensor_file;
#[cfg(test)]
mod test_files;

pub use folder::{MAX_ASPECT, MAX_PIXELS, Rgb, decode};
pub use idx::{IdxArray, MAX_BYTES, read_idx};

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
        DatasetKind::FashionMnist | DatasetKind::Mnist => load_dir(dir),
        DatasetKind::Cifar10 => cifar::load(dir, &cifar::CIFAR10),
        DatasetKind::Cifar100 => cifar::load(dir, &cifar::CIFAR100),
        DatasetKind::Imagefolder => folder::load(dir),
        DatasetKind::Npz => tensor_file::load(dir, tensor_file::Format::Npz),
        DatasetKind::Safetensors => tensor_file::load(dir, tensor_file::Format::Safetensors),
    }
}

/// Why a data file or directory cannot be used; each variant keeps the path so the message
/// can say which file to replace.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read (the OS error says why).
    #[error("{path}: cannot read: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
    /// None of the names a required file or folder may have (plain or gzipped, directly in the
    /// directory or in the folder an archive unpacks to) is in the directory.
    #[error("{dir}: cannot find {}", or_list(.tried))]
    Missing {
        /// The directory searched.
        dir: PathBuf,
        /// The names tried, in order of preference.
        tried: Vec<String>,
    },
    /// A gzip file whose stream does not decode, as after a damaged or partial download.
    #[error("{path}: gzip stream is corrupt: {source}")]
    Gzip {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        #[source]
        source: io::Error,
    },
    /// The first bytes are not an IDX magic, so this is some other kind of file.
    #[error(
        "{path}: not an IDX file (magic 00 00 08 xx expected, found {})",
        magic_text(.found)
    )]
    NotIdx {
        /// The file.
        path: PathBuf,
        /// Its first bytes (fewer than four when that is all there is).
        found: Vec<u8>,
    },
    /// An IDX element type other than u8, the only one the data sets use.
    #[error(
        "{path}: expected element type 0x08 (u8), found 0x{found:02X} ({})",
        idx::type_name(*.found)
    )]
    ElementType {
        /// The file.
        path: PathBuf,
        /// The type byte of the magic.
        found: u8,
    },
    /// The header ends before the sizes of all its dimensions.
    #[error(
        "{path}: truncated header: {ndims} dimensions need {} bytes of sizes, file has \
         {found}",
        4 * usize::from(*.ndims)
    )]
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// Dimensions the magic announces.
        ndims: u8,
        /// Bytes of sizes present (4 per dimension expected).
        found: usize,
    },
    /// The dimensions multiply to more than [`MAX_BYTES`], which only a corrupt header does.
    #[error(
        "{path}: header says {} elements, more than the limit of {} bytes",
        dims_text(.dims),
        MAX_BYTES
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The sizes as the header gives them.
        dims: Vec<usize>,
    },
    /// The data is shorter (truncated) or longer (trailing bytes) than the header says.
    #[error(
        "{path}: {}: header says {}{expected} bytes of data, file has {found}",
        length_problem(*.expected, *.found),
        dims_product(.dims)
    )]
    Length {
        /// The file.
        path: PathBuf,
        /// The sizes as the header gives them.
        dims: Vec<usize>,
        /// Data bytes the sizes call for.
        expected: usize,
        /// Data bytes present after the header.
        found: u64,
    },
    /// A file with the wrong number of dimensions for its role (images or labels).
    #[error(
        "{path}: expected {expected} dimension{} ({role}), found {}: {}",
        plural_s(*.expected),
        .dims.len(),
        dims_text(.dims)
    )]
    Rank {
        /// The file.
        path: PathBuf,
        /// What the file should hold, with its dimensions named.
        role: &'static str,
        /// Dimensions the role needs.
        expected: usize,
        /// The sizes the file has.
        dims: Vec<usize>,
    },
    /// A label file whose count differs from its split's images.
    #[error(
        "{path}: expected {expected} labels to match the images in {}, found {found}",
        file_name(.images)
    )]
    CountMismatch {
        /// The label file.
        path: PathBuf,
        /// The image file of the same split.
        images: PathBuf,
        /// Number of images.
        expected: usize,
        /// Number of labels.
        found: usize,
    },
    /// Test images of another shape than the train images.
    #[error(
        "{path}: expected {} images to match {}, found {}",
        shape_text(*.expected),
        file_name(.train),
        shape_text(*.found)
    )]
    ShapeMismatch {
        /// The test image file.
        path: PathBuf,
        /// The train image file.
        train: PathBuf,
        /// Train `(rows, cols)`.
        expected: (usize, usize),
        /// Test `(rows, cols)`.
        found: (usize, usize),
    },
    /// Train labels that make fewer than two classes, which cannot be a classification task.
    #[error("{path}: expected labels of at least 2 classes (largest label + 1), found {found}")]
    TooFewClasses {
        /// The train label file.
        path: PathBuf,
        /// Largest label + 1 (0 without labels).
        found: usize,
    },
    /// A test label of a class the train labels never use.
    #[error(
        "{path}: expected labels below {classes} (the classes in {}), found {found} at \
         index {index}",
        file_name(.train)
    )]
    LabelRange {
        /// The test label file.
        path: PathBuf,
        /// The train label file the classes come from.
        train: PathBuf,
        /// Number of classes.
        classes: usize,
        /// Position of the first label out of range.
        index: usize,
        /// That label.
        found: u32,
    },
    /// A file of fixed-size records (CIFAR) that ends inside one, as a cut download does.
    #[error("{path}: truncated: record {index} has {found} of {size} bytes")]
    Record {
        /// The file.
        path: PathBuf,
        /// Position of the partial record (the number of whole ones before it).
        index: usize,
        /// Bytes of it present.
        found: usize,
        /// Bytes a record has.
        size: usize,
    },
    /// A file with no bytes at all, as an interrupted copy leaves behind.
    #[error("{path}: empty file: expected {expected}, found 0 bytes")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What the file should hold.
        expected: String,
    },
    /// A record whose label is not one of the data set's classes, so not the data set named.
    #[error(
        "{path}: label out of range: expected below {classes}, found {found} in record {index}"
    )]
    RecordLabel {
        /// The file.
        path: PathBuf,
        /// Position of the record in its file.
        index: usize,
        /// Its label.
        found: u32,
        /// Number of classes.
        classes: usize,
    },
    /// A class-name file whose name count is not the data set's class count.
    #[error("{path}: expected {expected} class names (one a line), found {found}")]
    ClassNames {
        /// The file.
        path: PathBuf,
        /// Number of classes.
        expected: usize,
        /// Non-blank lines in the file.
        found: usize,
    },
    /// A directory given for a tensor file that does not hold exactly one of them.
    #[error(
        "{dir}: expected one *.{ext} file (or the path of the file itself), found {}",
        list_or_none(.found)
    )]
    DataFile {
        /// The directory.
        dir: PathBuf,
        /// The extension looked for.
        ext: &'static str,
        /// The names of the matching files, sorted.
        found: Vec<String>,
    },
    /// tch cannot read the safetensors file: another format, damaged, or an element type
    /// libtorch has no use for.
    #[error("{path}: cannot read as {format}: {source}")]
    TensorFile {
        /// The file.
        path: PathBuf,
        /// `npz` or `safetensors`.
        format: &'static str,
        /// What tch said.
        #[source]
        source: tch::TchError,
    },
    /// A tensor file without one of the four arrays of a data set.
    #[error(
        "{path}: cannot find array {key}: expected x_train, y_train, x_test and y_test, found {}",
        list_or_none(.keys)
    )]
    MissingArray {
        /// The file.
        path: PathBuf,
        /// The array looked for.
        key: &'static str,
        /// The arrays the file has, sorted.
        keys: Vec<String>,
    },
    /// An array of an element type the trainer cannot use for its role.
    #[error("{path}: array {key}: expected dtype {expected}, found {found}")]
    ArrayDtype {
        /// The file.
        path: PathBuf,
        /// The array.
        key: &'static str,
        /// The types accepted.
        expected: String,
        /// The array's type.
        found: String,
    },
    /// An array whose shape is not one of those its role allows.
    #[error("{path}: array {key}: {problem}: expected {expected}, found {}", dims_text(.dims))]
    ArrayShape {
        /// The file.
        path: PathBuf,
        /// The array.
        key: &'static str,
        /// What is wrong, in a few words.
        problem: &'static str,
        /// The shapes accepted.
        expected: &'static str,
        /// The array's shape.
        dims: Vec<usize>,
    },
    /// A label array whose length differs from its split's images.
    #[error(
        "{path}: expected {expected} labels in {key} to match the images in {images}, found {found}"
    )]
    ArrayCount {
        /// The file.
        path: PathBuf,
        /// The label array.
        key: &'static str,
        /// The image array of the same split.
        images: &'static str,
        /// Number of images.
        expected: usize,
        /// Number of labels.
        found: usize,
    },
    /// Test images of another channels×rows×cols than the train images.
    #[error(
        "{path}: expected {} images in {key} to match {train}, found {}",
        dims_text(.expected),
        dims_text(.found)
    )]
    ArrayImageShape {
        /// The file.
        path: PathBuf,
        /// The test image array.
        key: &'static str,
        /// The train image array.
        train: &'static str,
        /// Train channels, rows, cols.
        expected: [usize; 3],
        /// Test channels, rows, cols.
        found: [usize; 3],
    },
    /// Train labels of a tensor file that make fewer than two classes.
    #[error(
        "{path}: array {key}: expected labels of at least 2 classes (largest label + 1), found \
         {found}"
    )]
    ArrayClasses {
        /// The file.
        path: PathBuf,
        /// The train label array.
        key: &'static str,
        /// Largest label + 1 (0 without labels).
        found: usize,
    },
    /// A label of a tensor file that is no class index: negative, or a class the train labels
    /// never use.
    #[error(
        "{path}: array {key}: label out of range: expected {expected}, found {found} at index \
         {index}"
    )]
    ArrayLabel {
        /// The file.
        path: PathBuf,
        /// The label array.
        key: &'static str,
        /// The labels accepted.
        expected: String,
        /// Position of the first label out of range.
        index: usize,
        /// That label.
        found: i64,
    },
    /// An image folder's `train` with fewer than two class folders.
    #[error("{path}: expected at least 2 class folders, found {found}")]
    TooFewFolders {
        /// The `train` folder.
        path: PathBuf,
        /// Its sub-folders.
        found: usize,
    },
    /// A class folder without a single image file (torchvision's `ImageFolder` refuses one too).
    #[error(
        "{path}: empty class folder: expected at least one .jpg, .jpeg or .png file, found none"
    )]
    EmptyClass {
        /// The class folder.
        path: PathBuf,
    },
    /// A validation class folder whose name is none of the train class folders'.
    #[error("{path}: unknown class: expected one of the class folders in {train}, found {name}")]
    UnknownClass {
        /// The validation class folder.
        path: PathBuf,
        /// The train folder the classes come from.
        train: PathBuf,
        /// The folder's name.
        name: String,
    },
    /// A path that is no regular file (a FIFO, a device, a socket, a directory): reading a FIFO
    /// or a terminal blocks and `/dev/zero` never ends, so only regular files are opened.
    #[error("{path}: not a regular file: expected a data file, found {kind}")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead.
        kind: &'static str,
    },
    /// A file read whole that is larger than [`MAX_FILE_BYTES`].
    #[error("{path}: {size} bytes, more than the limit of {limit} bytes for a data file")]
    FileSize {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// An npz file that is no zip, or one of its entries that is no array the reader takes
    /// (encrypted, compressed otherwise than stored or deflated, damaged, an object array, a
    /// header whose shape and dtype call for other than the bytes the entry has).
    #[error("{path}: cannot read as npz: {}{problem}", entry_text(.entry))]
    Npz {
        /// The file.
        path: PathBuf,
        /// The zip entry, when the problem is in one.
        entry: Option<String>,
        /// What is wrong.
        problem: String,
    },
    /// Images of no pixels, or a split of no images: a model cannot be built on the first and
    /// an accuracy of the second is 0/0.
    #[error("{path}: {problem}: expected {expected}, found {}", dims_text(.dims))]
    ImageShape {
        /// The image file.
        path: PathBuf,
        /// What is wrong, in a few words.
        problem: &'static str,
        /// What is accepted.
        expected: &'static str,
        /// The sizes the file gives.
        dims: Vec<usize>,
    },
    /// An image folder's `val/` (or `test/`) without a single image, whose accuracy would be
    /// 0/0.
    #[error("{path}: empty test split: expected at least one class folder with images, found none")]
    EmptySplit {
        /// The validation folder.
        path: PathBuf,
    },
    /// An image whose header claims a size that decoding (or the evaluation resize) would need
    /// too much memory for, or no pixels at all; refused before its pixels are read.
    #[error("{path}: {width}×{height} image: {problem}")]
    ImageSize {
        /// The image file.
        path: PathBuf,
        /// Width in the header.
        width: u32,
        /// Height in the header.
        height: u32,
        /// What is wrong, with the bound.
        problem: String,
    },
    /// An image file whose header (at load time) or pixels (when a batch needs them) do not
    /// decode.
    #[error("{path}: not a decodable image: {source}")]
    Image {
        /// The image file.
        path: PathBuf,
        /// What the decoder said.
        #[source]
        source: image::ImageError,
    },
}

/// `entry NAME: ` before a problem in one zip entry, nothing for the file as a whole.
fn entry_text(entry: &Option<String>) -> String {
    entry
        .as_ref()
        .map_or_else(String::new, |e| format!("entry {e}: "))
}

/// What a file type is, for [`DataError::NotRegular`].
fn kind_text(t: fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
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

/// `60000×28×28`, the notation of the messages.
fn dims_text(dims: &[usize]) -> String {
    let sizes: Vec<String> = dims.iter().map(usize::to_string).collect();
    sizes.join("×")
}

/// Just the file name, for mentioning a second file beside the one a message is about.
fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// `a or b.gz`, the names a missing file was looked for under.
fn or_list(names: &[String]) -> String {
    names.join(" or ")
}

/// `a, b`, or `none` when there is nothing to list.
fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// The bytes found where the magic should be, in hex, and whether the file ended there.
fn magic_text(found: &[u8]) -> String {
    let bytes: Vec<String> = found.iter().map(|b| format!("{b:02x}")).collect();
    let end = match found.len() {
        0 => "end of file",
        4 => "",
        _ => " then end of file",
    };
    format!("{}{end}", bytes.join(" "))
}

/// Which way the data length is wrong: `truncated` when short, `trailing bytes` when long.
fn length_problem(expected: usize, found: u64) -> &'static str {
    if found < expected as u64 {
        "truncated"
    } else {
        "trailing bytes"
    }
}

/// `2×3 = ` before the byte count, left out for one dimension, where it would repeat it.
fn dims_product(dims: &[usize]) -> String {
    match dims.len() {
        1 => String::new(),
        _ => format!("{} = ", dims_text(dims)),
    }
}

/// The plural ending of `dimension` for `n` of them.
fn plural_s(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `28×28`, an image shape `(rows, cols)` in the notation of the messages.
fn shape_text((rows, cols): (usize, usize)) -> String {
    format!("{rows}×{cols}")
}

/// `dir/base` if it exists, else `dir/base.gz`: the plain file first, as the quicker read.
fn find(dir: &Path, base: &str) -> Result<PathBuf, DataError> {
    find_any(dir, vec![base.to_string(), format!("{base}.gz")])
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

/// Reads `path` and checks its rank, so later code can index dims without looking.
fn read_rank(path: &Path, expected: usize, role: &'static str) -> Result<IdxArray, DataError> {
    let a = read_idx(path)?;
    if a.dims.len() != expected {
        return Err(DataError::Rank {
            path: path.to_path_buf(),
            role,
            expected,
            dims: a.dims,
        });
    }
    Ok(a)
}

/// Refuses images of no pixels (no model takes them) and a split of no images (its accuracy is
/// 0/0): `dims` is count, then the pixel dimensions.
fn check_image_dims(path: &Path, dims: &[usize]) -> Result<(), DataError> {
    let (problem, expected) = if dims[1..].contains(&0) {
        ("zero-size images", "images of at least 1×1 pixels")
    } else if dims[0] == 0 {
        ("no images", "at least one image")
    } else {
        return Ok(());
    };
    Err(DataError::ImageShape {
        path: path.to_path_buf(),
        problem,
        expected,
        dims: dims.to_vec(),
    })
}

/// One split with the paths it came from, which the cross-split checks name in errors.
struct Loaded {
    split: Split,
    images: PathBuf,
    labels: PathBuf,
}

/// Loads `{prefix}-images-idx3-ubyte` and `{prefix}-labels-idx1-ubyte` and checks they pair up.
fn load_split(dir: &Path, prefix: &str) -> Result<Loaded, DataError> {
    let images = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let im = read_rank(&images, 3, "images: count×rows×cols")?;
    check_image_dims(&images, &im.dims)?;
    let lb = read_rank(&labels, 1, "labels: count")?;
    if lb.dims[0] != im.dims[0] {
        return Err(DataError::CountMismatch {
            path: labels,
            images,
            expected: im.dims[0],
            found: lb.dims[0],
        });
    }
    let split = Split {
        len: im.dims[0],
        channels: 1,
        rows: im.dims[1],
        cols: im.dims[2],
        images: Images::U8(im.data),
        labels: lb.data.into_iter().map(u32::from).collect(),
    };
    Ok(Loaded {
        split,
        images,
        labels,
    })
}

/// Loads the MNIST-layout files in `dir` (plain or `.gz`) and checks that the splits agree.
pub fn load_dir(dir: &Path) -> Result<Dataset, DataError> {
    let train = load_split(dir, "train")?;
    let test = load_split(dir, "t10k")?;
    let (tr, te) = (&train.split, &test.split);
    if (te.rows, te.cols) != (tr.rows, tr.cols) {
        return Err(DataError::ShapeMismatch {
            path: test.images,
            train: train.images,
            expected: (tr.rows, tr.cols),
            found: (te.rows, te.cols),
        });
    }
    let classes = classes_of(&tr.labels);
    if classes < 2 {
        return Err(DataError::TooFewClasses {
            path: train.labels,
            found: classes,
        });
    }
    if let Some((index, found)) = first_out_of_range(&te.labels, classes) {
        return Err(DataError::LabelRange {
            path: test.labels,
            train: train.labels,
            classes,
            index,
            found,
        });
    }
    Ok(Dataset {
        train: train.split,
        test: test.split,
        classes,
        class_names: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::test_files::{TempDir, assert_err, gzip, idx};
    use super::*;

    const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
    const TRAIN_LABELS: &str = "train-labels-idx1-ubyte.gz";
    const TEST_IMAGES: &str = "t10k-images-idx3-ubyte.gz";
    const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";

    /// `n` images of 2×3 whose pixels count up from `first`.
    fn pixels(n: u8, first: u8) -> Vec<u8> {
        (0..n * 6).map(|i| first + i).collect()
    }

    /// A valid set of 6 train and 3 test 2×3 images of 3 classes, two files plain and two
    /// gzipped; tests spoil one file by writing over it under the same name.
    fn tiny_set(name: &str) -> TempDir {
        let t = TempDir::new(name);
        t.write(TRAIN_IMAGES, &idx(0x08, &[6, 2, 3], &pixels(6, 0)));
        t.write(TRAIN_LABELS, &gzip(&idx(0x08, &[6], &[0, 1, 2, 0, 1, 2])));
        t.write(TEST_IMAGES, &gzip(&idx(0x08, &[3, 2, 3], &pixels(3, 100))));
        t.write(TEST_LABELS, &idx(0x08, &[3], &[2, 1, 0]));
        t
    }

    #[test]
    fn loads_tiny_set() {
        let t = tiny_set("tiny");
        let d = load_dir(t.path()).unwrap();
        let train = Split {
            images: Images::U8(pixels(6, 0)),
            labels: vec![0, 1, 2, 0, 1, 2],
            len: 6,
            channels: 1,
            rows: 2,
            cols: 3,
        };
        let test = Split {
            images: Images::U8(pixels(3, 100)),
            labels: vec![2, 1, 0],
            len: 3,
            channels: 1,
            rows: 2,
            cols: 3,
        };
        let classes = 3;
        assert_eq!(
            d,
            Dataset {
                train,
                test,
                classes,
                class_names: Vec::new(),
            }
        );
    }

    #[test]
    fn plain_file_preferred_over_gzipped() {
        let t = tiny_set("prefer");
        t.write(
            "t10k-labels-idx1-ubyte.gz",
            &gzip(&idx(0x08, &[3], &[9, 9, 9])),
        );
        assert_eq!(load_dir(t.path()).unwrap().test.labels, [2, 1, 0]);
    }

    #[test]
    fn missing_file_lists_names_tried() {
        let t = tiny_set("missing");
        std::fs::remove_file(t.path().join(TEST_LABELS)).unwrap();
        let dir = t.path().display().to_string();
        let msg = "cannot find t10k-labels-idx1-ubyte or t10k-labels-idx1-ubyte.gz";
        assert_err(load_dir(t.path()), &[&dir, msg]);
    }

    #[test]
    fn label_count_must_match_images() {
        let t = tiny_set("count");
        t.write(TRAIN_LABELS, &gzip(&idx(0x08, &[5], &[0, 1, 2, 0, 1])));
        let msg = "expected 6 labels to match the images in train-images-idx3-ubyte, found 5";
        assert_err(load_dir(t.path()), &[TRAIN_LABELS, msg]);
    }

    #[test]
    fn labels_must_be_one_dimensional() {
        let t = tiny_set("label-rank");
        t.write(TEST_LABELS, &idx(0x08, &[3, 1], &[2, 1, 0]));
        let msg = "expected 1 dimension (labels: count), found 2: 3×1";
        assert_err(load_dir(t.path()), &[TEST_LABELS, msg]);
    }

    #[test]
    fn images_must_be_three_dimensional() {
        let t = tiny_set("image-rank");
        t.write(TRAIN_IMAGES, &idx(0x08, &[6, 6], &pixels(6, 0)));
        let msg = "expected 3 dimensions (images: count×rows×cols), found 2: 6×6";
        assert_err(load_dir(t.path()), &[TRAIN_IMAGES, msg]);
    }

    #[test]
    fn test_images_must_match_train_shape() {
        let t = tiny_set("shape");
        t.write(TEST_IMAGES, &gzip(&idx(0x08, &[3, 3, 2], &pixels(3, 100))));
        let msg = "expected 2×3 images to match train-images-idx3-ubyte, found 3×2";
        assert_err(load_dir(t.path()), &[TEST_IMAGES, msg]);
    }

    #[test]
    fn test_labels_must_be_train_classes() {
        let t = tiny_set("range");
        t.write(TEST_LABELS, &idx(0x08, &[3], &[0, 3, 1]));
        let msg = "expected labels below 3 (the classes in train-labels-idx1-ubyte.gz), found 3 \
                   at index 1";
        assert_err(load_dir(t.path()), &[TEST_LABELS, msg]);
    }

    #[test]
    fn at_least_two_classes() {
        let t = tiny_set("classes");
        t.write(TRAIN_LABELS, &gzip(&idx(0x08, &[6], &[0; 6])));
        assert_err(
            load_dir(t.path()),
            &[TRAIN_LABELS, "at least 2 classes", "found 1"],
        );
    }

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
    fn load_dispatches_idx_kinds() {
        let t = tiny_set("dispatch");
        for kind in [DatasetKind::FashionMnist, DatasetKind::Mnist] {
            assert_eq!(load(kind, t.path()).unwrap(), load_dir(t.path()).unwrap());
        }
    }

    #[test]
    fn file_errors_name_the_file_in_the_set() {
        let t = tiny_set("file-error");
        t.write(TEST_IMAGES, b"\x1f\x8bnot really gzip");
        assert_err(load_dir(t.path()), &[TEST_IMAGES, "gzip stream is corrupt"]);
    }

    #[test]
    fn zero_size_images_and_empty_test_split_are_refused() {
        let t = tiny_set("zero-size");
        t.write(TRAIN_IMAGES, &idx(0x08, &[6, 0, 3], &[]));
        let msg = "zero-size images: expected images of at least 1×1 pixels, found 6×0×3";
        assert_err(load_dir(t.path()), &[TRAIN_IMAGES, msg]);
        let t = tiny_set("empty-test");
        t.write(TEST_IMAGES, &gzip(&idx(0x08, &[0, 2, 3], &[])));
        t.write(TEST_LABELS, &idx(0x08, &[0], &[]));
        let msg = "no images: expected at least one image, found 0×2×3";
        assert_err(load_dir(t.path()), &[TEST_IMAGES, msg]);
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
