//! Data sets in one tensor file, NumPy's `.npz` or Hugging Face's `.safetensors`, with the
//! arrays `x_train`, `y_train`, `x_test`, `y_test` of Keras's `mnist.npz`: the way to bring
//! any data set that a few lines of Python can put in arrays. Images are N×H×W (one channel),
//! N×C×H×W or N×H×W×C with C 1 or 3; the layout is told from the shape, since neither format
//! records it.

use std::fs;
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use super::error::file_name;
use super::{
    DataError, Dataset, Images, MAX_CLASSES, MAX_FILE_BYTES, Split, classes_of, first_out_of_range,
    npz, open_data,
};

/// Which of the two formats, and so which reader (npz: [`npz`], safetensors: tch's) and file
/// extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    /// A zip of `.npy` arrays (`numpy.savez`, compressed or not).
    Npz,
    /// A safetensors file.
    Safetensors,
}

impl Format {
    /// The file extension, also the format's name in messages.
    fn ext(self) -> &'static str {
        match self {
            Format::Npz => "npz",
            Format::Safetensors => "safetensors",
        }
    }

    /// The arrays `wanted` of `path` and the names of all it has. A data file must be a regular
    /// file; tch reads a safetensors file whole, so its size is checked first.
    fn read(self, path: &Path, wanted: &[&str]) -> Result<Arrays, DataError> {
        let (file, size) = open_data(path)?;
        let (keys, arrays) = match self {
            Format::Npz => {
                let npz = npz::read(path, file, wanted)?;
                (npz.names, npz.arrays)
            }
            Format::Safetensors => {
                if size > MAX_FILE_BYTES {
                    return Err(DataError::FileSize {
                        path: path.to_path_buf(),
                        size,
                        limit: MAX_FILE_BYTES,
                    });
                }
                let arrays =
                    Tensor::read_safetensors(path).map_err(|source| DataError::TensorFile {
                        path: path.to_path_buf(),
                        format: self.ext(),
                        source,
                    })?;
                (arrays.iter().map(|(k, _)| k.clone()).collect(), arrays)
            }
        };
        Ok(Arrays {
            file: path.to_path_buf(),
            keys,
            arrays,
        })
    }
}

/// The arrays of a data set, train then test, images then labels.
const KEYS: [&str; 4] = ["x_train", "y_train", "x_test", "y_test"];

/// The dtypes accepted for labels: the integer ones (the class index is exact in all of them).
const LABEL_KINDS: [Kind; 5] = [Kind::Uint8, Kind::Int8, Kind::Int16, Kind::Int, Kind::Int64];

/// Loads the arrays of the tensor file `path` (or of the one such file in the directory).
pub(super) fn load(path: &Path, format: Format) -> Result<Dataset, DataError> {
    let file = locate(path, format)?;
    let arrays = format.read(&file, &KEYS)?;
    let train = arrays.split("x_train", "y_train")?;
    let test = arrays.split("x_test", "y_test")?;
    let file = arrays.file;
    if test.images_kind != train.images_kind {
        return Err(DataError::ArrayDtype {
            path: file,
            key: "x_test",
            expected: format!("{} to match x_train", kind_name(train.images_kind)),
            found: kind_name(test.images_kind),
        });
    }
    let shape = |s: &Split| [s.channels, s.rows, s.cols];
    if shape(&test.split) != shape(&train.split) {
        return Err(DataError::ArrayImageShape {
            path: file,
            key: "x_test",
            train: "x_train",
            expected: shape(&train.split),
            found: shape(&test.split),
        });
    }
    let classes = classes_of(&train.split.labels);
    if classes < 2 {
        return Err(DataError::ArrayClasses {
            path: file,
            key: "y_train",
            found: classes,
        });
    }
    if let Some((index, found)) = first_out_of_range(&test.split.labels, classes) {
        return Err(DataError::ArrayLabel {
            path: file,
            key: "y_test",
            expected: format!("labels below {classes} (the classes in y_train)"),
            index,
            found: i64::from(found),
        });
    }
    Ok(Dataset {
        train: train.split,
        test: test.split,
        classes,
        class_names: Vec::new(),
    })
}

/// `path` itself unless it is a directory, else the one `*.EXT` file in it (any case).
fn locate(path: &Path, format: Format) -> Result<PathBuf, DataError> {
    let cannot_read = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !fs::metadata(path).map_err(cannot_read)?.is_dir() {
        return Ok(path.to_path_buf());
    }
    let mut found = Vec::new();
    for entry in fs::read_dir(path).map_err(cannot_read)? {
        let candidate = entry.map_err(cannot_read)?.path();
        let ext_matches = candidate
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case(format.ext()));
        if ext_matches && candidate.is_file() {
            found.push(candidate);
        }
    }
    if found.len() == 1 {
        return Ok(found.remove(0));
    }
    let mut names: Vec<String> = found.iter().map(|p| file_name(p)).collect();
    names.sort();
    Err(DataError::DataFile {
        dir: path.to_path_buf(),
        ext: format.ext(),
        found: names,
    })
}

/// The arrays of one file, looked up by key; errors name the file.
struct Arrays {
    file: PathBuf,
    /// The names of all arrays in the file, read or not.
    keys: Vec<String>,
    /// The arrays read.
    arrays: Vec<(String, Tensor)>,
}

/// A split and the dtype its images had, which the test split must share with the train one.
struct Loaded {
    split: Split,
    images_kind: Kind,
}

impl Arrays {
    /// The array `key`, or an error listing the keys the file has.
    fn get(&self, key: &'static str) -> Result<&Tensor, DataError> {
        match self.arrays.iter().find(|(name, _)| name == key) {
            Some((_, tensor)) => Ok(tensor),
            None => {
                let mut keys = self.keys.clone();
                keys.sort();
                Err(DataError::MissingArray {
                    path: self.file.clone(),
                    key,
                    keys,
                })
            }
        }
    }

    /// The images `x` and labels `y` of one split, checked to pair up.
    fn split(&self, x: &'static str, y: &'static str) -> Result<Loaded, DataError> {
        let images = self.images(x)?;
        let labels = self.labels(y)?;
        if labels.len() != images.split.len {
            return Err(DataError::ArrayCount {
                path: self.file.clone(),
                key: y,
                images: x,
                expected: images.split.len,
                found: labels.len(),
            });
        }
        let mut loaded = images;
        loaded.split.labels = labels;
        Ok(loaded)
    }

    /// The images of `key` as CHW images (labels left empty for [`Arrays::split`]).
    fn images(&self, key: &'static str) -> Result<Loaded, DataError> {
        let tensor = self.get(key)?;
        let kind = tensor.kind();
        if !matches!(kind, Kind::Uint8 | Kind::Float) {
            return Err(DataError::ArrayDtype {
                path: self.file.clone(),
                key,
                expected: "u8 or f32 (images)".to_string(),
                found: kind_name(kind),
            });
        }
        let dims: Vec<usize> = tensor.size().iter().map(|&d| d as usize).collect();
        let shape_error = |problem, expected| DataError::ArrayShape {
            path: self.file.clone(),
            key,
            problem,
            expected,
            dims: dims.clone(),
        };
        let is_channels = |d: usize| d == 1 || d == 3;
        const CHANNEL_AXIS: &str = "dim 1 (N×C×H×W) or the last dim (N×H×W×C), not both, to be \
                                    1 or 3 channels";
        let chw = match *dims.as_slice() {
            [n, h, w] => (tensor.shallow_clone(), [n, 1, h, w]),
            [n, a, h, b] => match (is_channels(a), is_channels(b)) {
                (true, false) => (tensor.shallow_clone(), [n, a, h, b]),
                // Per image HWC → CHW, which the rest of the trainer assumes.
                (false, true) => (tensor.permute([0, 3, 1, 2]), [n, b, a, h]),
                (true, true) => return Err(shape_error("ambiguous channel axis", CHANNEL_AXIS)),
                (false, false) => return Err(shape_error("no channel axis", CHANNEL_AXIS)),
            },
            _ => {
                return Err(shape_error(
                    "wrong rank",
                    "N×H×W, N×C×H×W or N×H×W×C images",
                ));
            }
        };
        let (tensor, [len, channels, rows, cols]) = chw;
        if rows == 0 || cols == 0 {
            return Err(shape_error(
                "zero-size images",
                "images of at least 1×1 pixels",
            ));
        }
        if len == 0 {
            return Err(shape_error("no images", "at least one image"));
        }
        let images = match kind {
            Kind::Uint8 => Images::U8(to_vec(&tensor)),
            _ => Images::F32(to_vec(&tensor)),
        };
        let split = Split {
            images,
            labels: Vec::new(),
            len,
            channels,
            rows,
            cols,
        };
        Ok(Loaded {
            split,
            images_kind: kind,
        })
    }

    /// The labels of `key`, each a class index (a non-negative `u32`).
    fn labels(&self, key: &'static str) -> Result<Vec<u32>, DataError> {
        let tensor = self.get(key)?;
        let kind = tensor.kind();
        if !LABEL_KINDS.contains(&kind) {
            return Err(DataError::ArrayDtype {
                path: self.file.clone(),
                key,
                expected: "u8, i8, i16, i32 or i64 (labels)".to_string(),
                found: kind_name(kind),
            });
        }
        let dims: Vec<usize> = tensor.size().iter().map(|&d| d as usize).collect();
        // N×1 is how Keras's CIFAR loaders return labels, so it is taken as N.
        if !matches!(*dims.as_slice(), [_] | [_, 1]) {
            return Err(DataError::ArrayShape {
                path: self.file.clone(),
                key,
                problem: "wrong shape",
                expected: "N or N×1 (one label per image)",
                dims,
            });
        }
        let values: Vec<i64> = to_vec(&tensor.to_kind(Kind::Int64));
        values
            .into_iter()
            .enumerate()
            .map(|(index, found)| {
                let expected = if found < 0 {
                    "labels ≥ 0".to_string()
                } else if found >= MAX_CLASSES as i64 {
                    format!("labels below {MAX_CLASSES} (the most classes a model is built for)")
                } else {
                    return Ok(found as u32);
                };
                Err(DataError::ArrayLabel {
                    path: self.file.clone(),
                    key,
                    expected,
                    index,
                    found,
                })
            })
            .collect()
    }
}

/// All elements of `tensor` in row-major order (tch makes a strided view contiguous).
fn to_vec<T: tch::kind::Element>(tensor: &Tensor) -> Vec<T> {
    let numel = tensor.numel();
    let mut out = vec![T::ZERO; numel];
    tensor.copy_data(&mut out, numel);
    out
}

/// NumPy's short name of a dtype (`u8`, `f64`), for messages about the wrong one.
fn kind_name(kind: Kind) -> String {
    let name = match kind {
        Kind::Uint8 => "u8",
        Kind::Int8 => "i8",
        Kind::Int16 => "i16",
        Kind::Int => "i32",
        Kind::Int64 => "i64",
        Kind::Half => "f16",
        Kind::BFloat16 => "bf16",
        Kind::Float => "f32",
        Kind::Double => "f64",
        Kind::Bool => "bool",
        other => return format!("{other:?}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::error::dims_text;
    use crate::data::test_files::{TempDir, assert_err};
    use crate::data::{DatasetKind, load as load_kind};

    /// A tensor's shape in the notation of the messages.
    fn shape(tensor: &Tensor) -> String {
        let dims: Vec<usize> = tensor.size().iter().map(|&d| d as usize).collect();
        dims_text(&dims)
    }

    /// `n` images of `dims` (per image) whose elements count up from `first`, as `kind`.
    fn counting(n: i64, dims: &[i64], first: i64, kind: Kind) -> Tensor {
        let mut size = vec![n];
        size.extend_from_slice(dims);
        let numel: i64 = size.iter().product();
        Tensor::arange_start(first, first + numel, (Kind::Int64, tch::Device::Cpu))
            .remainder(256)
            .to_kind(kind)
            .reshape(size)
    }

    fn write(format: Format, path: &Path, arrays: &[(&str, &Tensor)]) {
        match format {
            Format::Npz => Tensor::write_npz(arrays, path).unwrap(),
            Format::Safetensors => Tensor::write_safetensors(arrays, path).unwrap(),
        }
    }

    /// A valid set: 4 train and 2 test images of 3 classes, `dims` per image.
    fn arrays(dims: &[i64], kind: Kind) -> Vec<(&'static str, Tensor)> {
        vec![
            ("x_train", counting(4, dims, 0, kind)),
            ("y_train", Tensor::from_slice(&[0i64, 2, 1, 2])),
            ("x_test", counting(2, dims, 100, kind)),
            ("y_test", Tensor::from_slice(&[1u8, 0])),
        ]
    }

    /// Writes `arrays` into `t` as `data.EXT` and returns its path.
    fn save(t: &TempDir, format: Format, arrays: &[(&str, Tensor)]) -> PathBuf {
        let path = t.path().join(format!("data.{}", format.ext()));
        let refs: Vec<(&str, &Tensor)> = arrays.iter().map(|(k, v)| (*k, v)).collect();
        write(format, &path, &refs);
        path
    }

    /// Both formats, each with its `--dataset` kind.
    const FORMATS: [(Format, DatasetKind); 2] = [
        (Format::Npz, DatasetKind::Npz),
        (Format::Safetensors, DatasetKind::Safetensors),
    ];

    /// Replaces (or adds) one array of the valid set.
    fn with(
        mut set: Vec<(&'static str, Tensor)>,
        key: &'static str,
        value: Tensor,
    ) -> Vec<(&'static str, Tensor)> {
        set.retain(|(k, _)| *k != key);
        set.push((key, value));
        set
    }

    #[test]
    fn grayscale_u8_both_formats() {
        for (format, kind) in FORMATS {
            let t = TempDir::new("gray");
            let path = save(&t, format, &arrays(&[2, 3], Kind::Uint8));
            let d = load_kind(kind, &path).unwrap();
            let pixels: Vec<u8> = (0..24).collect();
            assert_eq!(d.train.images, Images::U8(pixels), "{format:?}");
            assert_eq!(d.train.labels, [0, 2, 1, 2]);
            assert_eq!(d.test.labels, [1, 0]);
            let dims = (d.train.len, d.train.channels, d.train.rows, d.train.cols);
            assert_eq!(dims, (4, 1, 2, 3));
            assert_eq!((d.test.len, d.classes), (2, 3));
        }
    }

    #[test]
    fn channels_first_f32_kept_as_is() {
        for (format, kind) in FORMATS {
            let t = TempDir::new("nchw");
            let path = save(&t, format, &arrays(&[3, 2, 2], Kind::Float));
            let d = load_kind(kind, &path).unwrap();
            let pixels: Vec<f32> = (0..48).map(|i| i as f32).collect();
            assert_eq!(d.train.images, Images::F32(pixels), "{format:?}");
            assert_eq!((d.train.channels, d.train.rows, d.train.cols), (3, 2, 2));
        }
    }

    #[test]
    fn channels_last_becomes_chw_per_image() {
        for (format, kind) in FORMATS {
            for element in [Kind::Uint8, Kind::Float] {
                let t = TempDir::new("nhwc");
                // 2×4 images of 3 channels: pixel p of image i has channel values 3p..3p+2.
                let set = arrays(&[2, 4, 3], element);
                let expected = set[0].1.permute([0, 3, 1, 2]).contiguous();
                let path = save(&t, format, &set);
                let d = load_kind(kind, &path).unwrap();
                assert_eq!((d.train.channels, d.train.rows, d.train.cols), (3, 2, 4));
                let first: Vec<f32> = to_vec(&expected.to_kind(Kind::Float));
                let got: Vec<f32> = match &d.train.images {
                    Images::U8(p) => p.iter().map(|&b| f32::from(b)).collect(),
                    Images::F32(p) => p.clone(),
                    Images::Files(_) => unreachable!(),
                };
                assert_eq!(got, first, "{format:?} {element:?}");
                // Channel 0 of image 0 is every third value: 0, 3, 6, …
                assert_eq!(&got[..3], [0.0, 3.0, 6.0]);
            }
        }
    }

    #[test]
    fn directory_with_one_file() {
        let t = TempDir::new("dir-one");
        save(&t, Format::Npz, &arrays(&[2, 2], Kind::Uint8));
        t.write("README.txt", b"not data");
        let d = load_kind(DatasetKind::Npz, t.path()).unwrap();
        assert_eq!(d.train.len, 4);
    }

    #[test]
    fn directory_with_none_or_several() {
        let t = TempDir::new("dir-many");
        let dir = t.path().display().to_string();
        let none = "expected one *.safetensors file (or the path of the file itself), found none";
        assert_err(load_kind(DatasetKind::Safetensors, t.path()), &[&dir, none]);
        let set = arrays(&[2, 2], Kind::Uint8);
        save(&t, Format::Npz, &set);
        let refs: Vec<(&str, &Tensor)> = set.iter().map(|(k, v)| (*k, v)).collect();
        write(Format::Npz, &t.path().join("b.NPZ"), &refs);
        let several =
            "expected one *.npz file (or the path of the file itself), found b.NPZ, data.npz";
        assert_err(load_kind(DatasetKind::Npz, t.path()), &[&dir, several]);
    }

    #[test]
    fn missing_path_and_wrong_format() {
        let t = TempDir::new("unreadable");
        let gone = t.path().join("gone.npz");
        assert_err(
            load_kind(DatasetKind::Npz, &gone),
            &["gone.npz", "cannot read: "],
        );
        let text = t.write("text.safetensors", b"not a tensor file");
        assert_err(
            load_kind(DatasetKind::Safetensors, &text),
            &["text.safetensors", "cannot read as safetensors: "],
        );
        let path = save(&t, Format::Safetensors, &arrays(&[2, 2], Kind::Uint8));
        assert_err(
            load_kind(DatasetKind::Npz, &path),
            &["data.safetensors", "cannot read as npz: "],
        );
    }

    #[test]
    fn missing_array_lists_keys() {
        for (format, kind) in FORMATS {
            let t = TempDir::new("key");
            let mut set = arrays(&[2, 2], Kind::Uint8);
            set.retain(|(k, _)| *k != "y_test");
            let path = save(&t, format, &set);
            let msg = "cannot find array y_test: expected x_train, y_train, x_test and y_test, \
                       found x_test, x_train, y_train";
            assert_err(load_kind(kind, &path), &["data.", msg]);
        }
    }

    #[test]
    fn image_dtype_refused() {
        let t = TempDir::new("dtype");
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "x_train",
            counting(4, &[2, 2], 0, Kind::Double),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "array x_train: expected dtype u8 or f32 (images), found f64";
        assert_err(load_kind(DatasetKind::Npz, &path), &["data.npz", msg]);
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "x_test",
            counting(2, &[2, 2], 0, Kind::Float),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "array x_test: expected dtype u8 to match x_train, found f32";
        assert_err(load_kind(DatasetKind::Npz, &path), &[msg]);
    }

    #[test]
    fn label_dtype_and_shape_refused() {
        let t = TempDir::new("label-dtype");
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "y_train",
            Tensor::from_slice(&[0f32, 1., 2., 0.]),
        );
        let path = save(&t, Format::Safetensors, &set);
        let msg = "array y_train: expected dtype u8, i8, i16, i32 or i64 (labels), found f32";
        assert_err(load_kind(DatasetKind::Safetensors, &path), &[msg]);
        let two_d = Tensor::from_slice(&[0i32, 1, 2, 0]).reshape([2, 2]);
        let set = with(arrays(&[2, 2], Kind::Uint8), "y_train", two_d);
        let path = save(&t, Format::Safetensors, &set);
        let msg = "array y_train: wrong shape: expected N or N×1 (one label per image), found 2×2";
        assert_err(load_kind(DatasetKind::Safetensors, &path), &[msg]);
        // Keras's N×1 and the 16- and 32-bit integer types load.
        let column = Tensor::from_slice(&[0i16, 1, 2, 0]).reshape([4, 1]);
        let set = with(arrays(&[2, 2], Kind::Uint8), "y_train", column);
        let set = with(set, "y_test", Tensor::from_slice(&[2i32, 1]));
        let path = save(&t, Format::Safetensors, &set);
        let d = load_kind(DatasetKind::Safetensors, &path).unwrap();
        assert_eq!(
            (d.train.labels, d.test.labels),
            (vec![0, 1, 2, 0], vec![2, 1])
        );
    }

    #[test]
    fn image_layout_errors_name_key_and_shape() {
        let t = TempDir::new("layout");
        let cases = [
            (
                &[3, 5, 3][..],
                "array x_train: ambiguous channel axis: expected dim 1",
                "4×3×5×3",
            ),
            (
                &[5, 5, 5],
                "array x_train: no channel axis: expected dim 1",
                "4×5×5×5",
            ),
            (
                &[5],
                "array x_train: wrong rank: expected N×H×W, N×C×H×W or N×H×W×C images",
                "4×5",
            ),
        ];
        for (dims, msg, found) in cases {
            let set = with(
                arrays(&[2, 2], Kind::Uint8),
                "x_train",
                counting(4, dims, 0, Kind::Uint8),
            );
            assert_eq!(shape(&set[3].1), found);
            let path = save(&t, Format::Npz, &set);
            assert_err(
                load_kind(DatasetKind::Npz, &path),
                &["data.npz", msg, &format!("found {found}")],
            );
        }
    }

    #[test]
    fn label_count_must_match_images() {
        let t = TempDir::new("count");
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "y_test",
            Tensor::from_slice(&[0u8, 1, 2]),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "expected 2 labels in y_test to match the images in x_test, found 3";
        assert_err(load_kind(DatasetKind::Npz, &path), &["data.npz", msg]);
    }

    #[test]
    fn test_images_must_match_train_shape() {
        let t = TempDir::new("shape");
        let set = with(
            arrays(&[1, 2, 2], Kind::Uint8),
            "x_test",
            counting(2, &[2, 2, 3], 0, Kind::Uint8),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "expected 1×2×2 images in x_test to match x_train, found 3×2×2";
        assert_err(load_kind(DatasetKind::Npz, &path), &["data.npz", msg]);
    }

    #[test]
    fn label_values_checked() {
        let t = TempDir::new("labels");
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "y_train",
            Tensor::from_slice(&[0i64, 1, -1, 2]),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "array y_train: label out of range: expected labels ≥ 0, found -1 at index 2";
        assert_err(load_kind(DatasetKind::Npz, &path), &["data.npz", msg]);
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "y_test",
            Tensor::from_slice(&[1u8, 3]),
        );
        let path = save(&t, Format::Npz, &set);
        let msg = "array y_test: label out of range: expected labels below 3 (the classes in \
                   y_train), found 3 at index 1";
        assert_err(load_kind(DatasetKind::Npz, &path), &[msg]);
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "y_train",
            Tensor::from_slice(&[0u8; 4]),
        );
        let set = with(set, "y_test", Tensor::from_slice(&[0u8, 0]));
        let path = save(&t, Format::Npz, &set);
        let msg =
            "array y_train: expected labels of at least 2 classes (largest label + 1), found 1";
        assert_err(load_kind(DatasetKind::Npz, &path), &[msg]);
    }

    #[test]
    fn a_stray_large_label_is_refused_not_a_huge_model() {
        for (format, kind) in FORMATS {
            let t = TempDir::new("stray-label");
            let set = with(
                arrays(&[2, 2], Kind::Uint8),
                "y_train",
                Tensor::from_slice(&[0i64, 1, 3_000_000, 2]),
            );
            let path = save(&t, format, &set);
            let msg = "array y_train: label out of range: expected labels below 262144 (the most \
                       classes a model is built for), found 3000000 at index 2";
            assert_err(load_kind(kind, &path), &["data.", msg]);
        }
    }

    #[test]
    fn zero_size_images_and_empty_test_split_are_refused() {
        let t = TempDir::new("empty");
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "x_train",
            counting(4, &[0, 3], 0, Kind::Uint8),
        );
        let path = save(&t, Format::Safetensors, &set);
        let msg = "array x_train: zero-size images: expected images of at least 1×1 pixels, \
                   found 4×0×3";
        assert_err(load_kind(DatasetKind::Safetensors, &path), &[msg]);
        let set = with(
            arrays(&[2, 2], Kind::Uint8),
            "x_test",
            counting(0, &[2, 2], 0, Kind::Uint8),
        );
        let set = with(set, "y_test", Tensor::from_slice::<u8>(&[]));
        let path = save(&t, Format::Npz, &set);
        let msg = "array x_test: no images: expected at least one image, found 0×2×2";
        assert_err(load_kind(DatasetKind::Npz, &path), &["data.npz", msg]);
    }

    #[test]
    fn devices_and_fifos_are_not_data_files() {
        let zero = Path::new("/dev/zero");
        assert_err(
            load_kind(DatasetKind::Safetensors, zero),
            &["/dev/zero: not a regular file: expected a data file, found a character device"],
        );
        let t = TempDir::new("fifo");
        let fifo = t.fifo("data.npz");
        assert_err(
            load_kind(DatasetKind::Npz, &fifo),
            &["data.npz: not a regular file", "found a FIFO"],
        );
    }
}
