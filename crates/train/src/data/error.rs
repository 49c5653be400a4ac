//! [`DataError`], every way a data file or directory can be unusable, and the helpers its
//! messages are worded with: each names the file and says what was expected and what was found.

use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::MAX_BYTES;
use super::idx::type_name;

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
        type_name(*.found)
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
    /// A file read whole that is larger than [`MAX_FILE_BYTES`](super::MAX_FILE_BYTES).
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
pub(super) fn entry_text(entry: &Option<String>) -> String {
    entry
        .as_ref()
        .map_or_else(String::new, |e| format!("entry {e}: "))
}

/// What a file type is, for [`DataError::NotRegular`].
pub(super) fn kind_text(t: fs::FileType) -> &'static str {
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

/// `60000×28×28`, the notation of the messages.
pub(super) fn dims_text(dims: &[usize]) -> String {
    let sizes: Vec<String> = dims.iter().map(usize::to_string).collect();
    sizes.join("×")
}

/// Just the file name, for mentioning a second file beside the one a message is about.
pub(super) fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// `a or b.gz`, the names a missing file was looked for under.
pub(super) fn or_list(names: &[String]) -> String {
    names.join(" or ")
}

/// `a, b`, or `none` when there is nothing to list.
pub(super) fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// The bytes found where the magic should be, in hex, and whether the file ended there.
pub(super) fn magic_text(found: &[u8]) -> String {
    let bytes: Vec<String> = found.iter().map(|b| format!("{b:02x}")).collect();
    let end = match found.len() {
        0 => "end of file",
        4 => "",
        _ => " then end of file",
    };
    format!("{}{end}", bytes.join(" "))
}

/// Which way the data length is wrong: `truncated` when short, `trailing bytes` when long.
pub(super) fn length_problem(expected: usize, found: u64) -> &'static str {
    if found < expected as u64 {
        "truncated"
    } else {
        "trailing bytes"
    }
}

/// `2×3 = ` before the byte count, left out for one dimension, where it would repeat it.
pub(super) fn dims_product(dims: &[usize]) -> String {
    match dims.len() {
        1 => String::new(),
        _ => format!("{} = ", dims_text(dims)),
    }
}

/// The plural ending of `dimension` for `n` of them.
pub(super) fn plural_s(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `28×28`, an image shape `(rows, cols)` in the notation of the messages.
pub(super) fn shape_text((rows, cols): (usize, usize)) -> String {
    format!("{rows}×{cols}")
}
