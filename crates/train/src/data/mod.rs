//! Labelled image data sets in the IDX files of MNIST and Fashion-MNIST, for the trainer's
//! `--data DIR`. Every error names the file and what was expected, since a wrong, partial or
//! damaged download is the usual cause and the path is what a person needs to fix it.

use std::io;
use std::path::{Path, PathBuf};

mod idx;

pub use idx::{IdxArray, MAX_BYTES, read_idx};

/// Where Debian's `dataset-fashion-mnist` installs the gzipped files.
pub const DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// One split's images and labels, kept as bytes because the trainer scales them itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// `len × rows × cols` pixels, image after image, each row-major.
    pub images: Vec<u8>,
    /// One class index per image, each below [`Dataset::classes`].
    pub labels: Vec<u8>,
    /// Number of images (and labels).
    pub len: usize,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

/// A train and a test split of the same image shape and class set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    /// What the model is fitted on.
    pub train: Split,
    /// What it is evaluated on, never trained on.
    pub test: Split,
    /// Largest train label + 1, so the trainer sizes its output layer from the data.
    pub classes: usize,
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
    /// Neither the plain nor the gzipped name of a required file is in the directory.
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
        found: u8,
    },
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
    let tried = [base.to_string(), format!("{base}.gz")];
    tried
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| DataError::Missing {
            dir: dir.to_path_buf(),
            tried: tried.to_vec(),
        })
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
        rows: im.dims[1],
        cols: im.dims[2],
        images: im.data,
        labels: lb.data,
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
    let classes = tr.labels.iter().max().map_or(0, |&m| usize::from(m) + 1);
    if classes < 2 {
        return Err(DataError::TooFewClasses {
            path: train.labels,
            found: classes,
        });
    }
    if let Some((index, &found)) = te
        .labels
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= classes)
    {
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
    })
}

/// Files for tests: written under the system temp directory, removed when dropped.
#[cfg(test)]
mod test_files {
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::DataError;

    /// A directory of its own per test, so tests running in parallel never share files.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(name: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("lsgd-host-data-{}-{n}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
            let path = self.0.join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// An IDX file's bytes; `data` is not checked against `dims`, so bad files can be made.
    pub fn idx(type_byte: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, type_byte, dims.len() as u8];
        for d in dims {
            out.extend(d.to_be_bytes());
        }
        out.extend(data);
        out
    }

    pub fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    /// Fails unless `result` is an error whose message contains every one of `parts`.
    #[track_caller]
    pub fn assert_err<T: std::fmt::Debug>(result: Result<T, DataError>, parts: &[&str]) {
        let msg = result.unwrap_err().to_string();
        for part in parts {
            assert!(msg.contains(part), "{msg:?} lacks {part:?}");
        }
    }
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
            images: pixels(6, 0),
            labels: vec![0, 1, 2, 0, 1, 2],
            len: 6,
            rows: 2,
            cols: 3,
        };
        let test = Split {
            images: pixels(3, 100),
            labels: vec![2, 1, 0],
            len: 3,
            rows: 2,
            cols: 3,
        };
        let classes = 3;
        assert_eq!(
            d,
            Dataset {
                train,
                test,
                classes
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
    fn file_errors_name_the_file_in_the_set() {
        let t = tiny_set("file-error");
        t.write(TEST_IMAGES, b"\x1f\x8bnot really gzip");
        assert_err(load_dir(t.path()), &[TEST_IMAGES, "gzip stream is corrupt"]);
    }
}
