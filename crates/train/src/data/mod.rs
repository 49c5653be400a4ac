//! Labelled image data sets in the IDX files of MNIST and Fashion-MNIST, for the trainer's
//! `--data DIR`. Every error names the file and what was expected, since a wrong, partial or
//! damaged download is the usual cause and the path is what a person needs to fix it.

use std::fmt;
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
#[derive(Debug)]
pub enum DataError {
    /// The file could not be opened or read (the OS error says why).
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// Neither the plain nor the gzipped name of a required file is in the directory.
    Missing {
        /// The directory searched.
        dir: PathBuf,
        /// The names tried, in order of preference.
        tried: Vec<String>,
    },
    /// A gzip file whose stream does not decode, as after a damaged or partial download.
    Gzip {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        source: io::Error,
    },
    /// The first bytes are not an IDX magic, so this is some other kind of file.
    NotIdx {
        /// The file.
        path: PathBuf,
        /// Its first bytes (fewer than four when that is all there is).
        found: Vec<u8>,
    },
    /// An IDX element type other than u8, the only one the data sets use.
    ElementType {
        /// The file.
        path: PathBuf,
        /// The type byte of the magic.
        found: u8,
    },
    /// The header ends before the sizes of all its dimensions.
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// Dimensions the magic announces.
        ndims: u8,
        /// Bytes of sizes present (4 per dimension expected).
        found: usize,
    },
    /// The dimensions multiply to more than [`MAX_BYTES`], which only a corrupt header does.
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The sizes as the header gives them.
        dims: Vec<usize>,
    },
    /// The data is shorter (truncated) or longer (trailing bytes) than the header says.
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
    TooFewClasses {
        /// The train label file.
        path: PathBuf,
        /// Largest label + 1 (0 without labels).
        found: usize,
    },
    /// A test label of a class the train labels never use.
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

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DataError::*;
        match self {
            Io { path, source } => write!(f, "{}: cannot read: {source}", path.display()),
            Missing { dir, tried } => {
                write!(f, "{}: cannot find {}", dir.display(), tried.join(" or "))
            }
            Gzip { path, source } => {
                write!(f, "{}: gzip stream is corrupt: {source}", path.display())
            }
            NotIdx { path, found } => {
                let bytes: Vec<String> = found.iter().map(|b| format!("{b:02x}")).collect();
                let end = match found.len() {
                    0 => "end of file",
                    4 => "",
                    _ => " then end of file",
                };
                write!(
                    f,
                    "{}: not an IDX file (magic 00 00 08 xx expected, found {}{end})",
                    path.display(),
                    bytes.join(" ")
                )
            }
            ElementType { path, found } => write!(
                f,
                "{}: expected element type 0x08 (u8), found 0x{found:02X} ({})",
                path.display(),
                idx::type_name(*found)
            ),
            TruncatedHeader { path, ndims, found } => write!(
                f,
                "{}: truncated header: {ndims} dimensions need {} bytes of sizes, file has {found}",
                path.display(),
                4 * usize::from(*ndims)
            ),
            TooLarge { path, dims } => write!(
                f,
                "{}: header says {} elements, more than the limit of {MAX_BYTES} bytes",
                path.display(),
                dims_text(dims)
            ),
            Length {
                path,
                dims,
                expected,
                found,
            } => {
                let what = if *found < *expected as u64 {
                    "truncated"
                } else {
                    "trailing bytes"
                };
                let product = match dims.len() {
                    1 => String::new(),
                    _ => format!("{} = ", dims_text(dims)),
                };
                write!(
                    f,
                    "{}: {what}: header says {product}{expected} bytes of data, file has {found}",
                    path.display()
                )
            }
            Rank {
                path,
                role,
                expected,
                dims,
            } => write!(
                f,
                "{}: expected {expected} dimension{} ({role}), found {}: {}",
                path.display(),
                if *expected == 1 { "" } else { "s" },
                dims.len(),
                dims_text(dims)
            ),
            CountMismatch {
                path,
                images,
                expected,
                found,
            } => write!(
                f,
                "{}: expected {expected} labels to match the images in {}, found {found}",
                path.display(),
                file_name(images)
            ),
            ShapeMismatch {
                path,
                train,
                expected: (er, ec),
                found: (fr, fc),
            } => write!(
                f,
                "{}: expected {er}×{ec} images to match {}, found {fr}×{fc}",
                path.display(),
                file_name(train)
            ),
            TooFewClasses { path, found } => write!(
                f,
                "{}: expected labels of at least 2 classes (largest label + 1), found {found}",
                path.display()
            ),
            LabelRange {
                path,
                train,
                classes,
                index,
                found,
            } => write!(
                f,
                "{}: expected labels below {classes} (the classes in {}), found {found} at index \
                 {index}",
                path.display(),
                file_name(train)
            ),
        }
    }
}

impl std::error::Error for DataError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DataError::Io { source, .. } | DataError::Gzip { source, .. } => Some(source),
            _ => None,
        }
    }
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
