//! MNIST and Fashion-MNIST: four IDX files, `train-` and `t10k-` images (count×rows×cols
//! bytes) and labels (count bytes), each plain or gzipped as the downloads come. The two splits
//! are checked against each other (image shape, classes), since a file from another set or a
//! cut download is what goes wrong.

use std::path::{Path, PathBuf};

use super::{
    DataError, Dataset, IdxArray, Images, Split, classes_of, find_any, first_out_of_range, read_idx,
};

/// `dir/base` if it exists, else `dir/base.gz`: the plain file first, as the quicker read.
fn find(dir: &Path, base: &str) -> Result<PathBuf, DataError> {
    find_any(dir, vec![base.to_string(), format!("{base}.gz")])
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
    use super::*;
    use crate::data::test_files::{TempDir, assert_err, gzip, idx};
    use crate::data::{DatasetKind, load};

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
}
