//! Image folders in torchvision's `ImageFolder` layout: `DIR/train/CLASS/…` and `DIR/val/CLASS/…`
//! (or `DIR/test/CLASS/…`). Classes are the train sub-folders in sorted order and samples go
//! class by class, each class's files sorted, so the class indices and the sample order are
//! those a PyTorch script over the same folder gets. Validation classes are looked up by name
//! among the train classes (torchvision numbers each folder on its own, which silently
//! mislabels a validation set that lacks a class).
//!
//! Loading reads only each image's header, so a file that is no image is reported before
//! training starts without decoding a whole data set; [`decode`] reads the pixels when a batch
//! needs them. Both refuse, from the header, an image whose decoding (or evaluation resize)
//! would take more memory than any image a model sees is worth ([`MAX_PIXELS`],
//! [`MAX_ASPECT`]), and only regular files are opened.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use image::ImageFormat;
use image::io::Reader;

use super::error::kind_text;
use super::{DataError, Dataset, Images, Split, open_data};

/// The most pixels an image may have: PIL's `Image.MAX_IMAGE_PIXELS`, above which it warns of
/// a decompression bomb. Every image is resized to `--image-size`, so a larger one costs
/// seconds and hundreds of MB to decode for nothing a model sees.
pub const MAX_PIXELS: u64 = 89_478_485;

/// The most one side of an image may be longer than the other: the evaluation resize scales
/// the short side to about `--image-size` and the long one in proportion, so a 1×4,000,000
/// image would become 37×148,000,000 pixels (16 GB).
pub const MAX_ASPECT: u64 = 256;

/// File extensions taken for images (compared without case); other files are ignored, as
/// torchvision does, so README files and thumbnails databases do no harm.
const EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// One decoded image: `height × width × 3` bytes, row after row, each pixel R, G, B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// HWC RGB bytes, `height * width * 3` of them.
    pub pixels: Vec<u8>,
}

/// Decodes the image file `path` to RGB: grayscale is repeated over the three channels and
/// alpha dropped, as PIL's `convert("RGB")` does. The format is told from the content, so a
/// PNG named `.jpg` still decodes.
pub fn decode(path: &Path) -> Result<Rgb, DataError> {
    // Checked again: the file may have changed since the data set was loaded.
    check_header(path)?;
    let image = reader(path)?.decode().map_err(|source| DataError::Image {
        path: path.to_path_buf(),
        source,
    })?;
    let rgb = image.into_rgb8();
    Ok(Rgb {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        pixels: rgb.into_raw(),
    })
}

/// Loads the image folder `dir`: every train and validation image listed, its header read.
pub(super) fn load(dir: &Path) -> Result<Dataset, DataError> {
    let train_dir = dir.join("train");
    if !train_dir.is_dir() {
        return Err(DataError::Missing {
            dir: dir.to_path_buf(),
            tried: vec!["train/".to_string()],
        });
    }
    let test_dir = ["val", "test"]
        .iter()
        .map(|name| dir.join(name))
        .find(|path| path.is_dir())
        .ok_or_else(|| DataError::Missing {
            dir: dir.to_path_buf(),
            tried: vec!["val/".to_string(), "test/".to_string()],
        })?;
    let classes = class_folders(&train_dir)?;
    if classes.len() < 2 {
        return Err(DataError::TooFewFolders {
            path: train_dir,
            found: classes.len(),
        });
    }
    let train = load_split(&train_dir, &classes, &train_dir)?;
    let test = load_split(&test_dir, &classes, &train_dir)?;
    Ok(Dataset {
        train,
        test,
        classes: classes.len(),
        class_names: classes
            .iter()
            .map(|name| name.to_string_lossy().into_owned())
            .collect(),
    })
}

/// The sub-folders of `dir` (symbolic links followed), sorted by name in byte order, which for
/// UTF-8 names is the order of Python's `sorted`.
fn class_folders(dir: &Path) -> Result<Vec<OsString>, DataError> {
    let mut names = Vec::new();
    for entry in read_dir(dir)? {
        if entry.is_dir() {
            names.extend(entry.file_name().map(OsString::from));
        }
    }
    names.sort();
    Ok(names)
}

/// The paths in `dir`, unsorted.
fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let cannot_read = |source| DataError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::read_dir(dir)
        .map_err(cannot_read)?
        .map(|entry| entry.map(|e| e.path()).map_err(cannot_read))
        .collect()
}

/// The samples of the split folder `dir`: each class folder's images with the index of its
/// name among `classes` (the train folders of `train`).
fn load_split(dir: &Path, classes: &[OsString], train: &Path) -> Result<Split, DataError> {
    let mut files = Vec::new();
    let mut labels = Vec::new();
    for name in class_folders(dir)? {
        let folder = dir.join(&name);
        let Ok(label) = classes.binary_search(&name) else {
            return Err(DataError::UnknownClass {
                path: folder,
                train: train.to_path_buf(),
                name: name.to_string_lossy().into_owned(),
            });
        };
        let images = images_in(&folder)?;
        if images.is_empty() {
            return Err(DataError::EmptyClass { path: folder });
        }
        labels.resize(labels.len() + images.len(), label as u32);
        files.extend(images);
    }
    if files.is_empty() {
        // Only the test split can get here: train has at least two classes, none empty.
        return Err(DataError::EmptySplit {
            path: dir.to_path_buf(),
        });
    }
    check_headers(&files)?;
    Ok(Split {
        images: Images::Files(files),
        len: labels.len(),
        labels,
        channels: 3,
        rows: 0,
        cols: 0,
    })
}

/// Reads every file's header, on all cores (a folder of ImageNet's size has a million): the
/// error reported is the one of the first bad file in sample order.
fn check_headers(files: &[PathBuf]) -> Result<(), DataError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let parts: Vec<_> = files
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().try_for_each(|p| check_header(p))))
            .collect();
        parts
            .into_iter()
            .try_for_each(|h| h.join().expect("reading an image header panicked"))
    })
}

/// The image files under `folder`, nested folders included, in the order of torchvision's
/// `sorted(os.walk(folder))` then `sorted(files)`: by folder path as a string, then by name.
/// Links are followed, but each directory is read once, at the first of its paths in byte
/// order, so a link to a parent folder ends the walk instead of looping. An image name on
/// something that is no regular file (a FIFO would block the reader) is refused by name.
fn images_in(folder: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    // Smallest path first: a directory's path is larger than its parent's, so directories
    // come in byte order and which of several paths to one directory is read is fixed.
    let bytes = |p: &Path| p.as_os_str().as_encoded_bytes().to_vec();
    let mut pending = BinaryHeap::from([Reverse((bytes(folder), folder.to_path_buf()))]);
    while let Some(Reverse((_, dir))) = pending.pop() {
        let canonical = fs::canonicalize(&dir).map_err(|source| DataError::Io {
            path: dir.clone(),
            source,
        })?;
        if !seen.insert(canonical) {
            continue;
        }
        for path in read_dir(&dir)? {
            match fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => pending.push(Reverse((bytes(&path), path))),
                Ok(meta) if !meta.is_file() && is_image_name(&path) => {
                    return Err(DataError::NotRegular {
                        path,
                        kind: kind_text(meta.file_type()),
                    });
                }
                // A broken link with an image name is reported when its header is read.
                _ if is_image_name(&path) => found.push(path),
                _ => {}
            }
        }
    }
    // Compared as bytes, not as `Path`s: `Path` orders by component, which puts `a/b/x` before
    // `a/b-c` where Python's string order has `a/b-c` first.
    found.sort_by(|a, b| {
        let key = |p: &Path| {
            let parent = p
                .parent()
                .map_or(&[][..], |d| d.as_os_str().as_encoded_bytes());
            let name = p.file_name().map_or(&[][..], |n| n.as_encoded_bytes());
            (parent.to_vec(), name.to_vec())
        };
        key(a).cmp(&key(b))
    });
    Ok(found)
}

/// Whether the file name has one of the [`EXTENSIONS`].
fn is_image_name(path: &Path) -> bool {
    path.extension()
        .is_some_and(|ext| EXTENSIONS.iter().any(|e| ext.eq_ignore_ascii_case(e)))
}

/// A reader of the regular file `path` whose format is guessed from the content (the name as
/// a fallback).
fn reader(path: &Path) -> Result<Reader<BufReader<fs::File>>, DataError> {
    let (file, _) = open_data(path)?;
    let mut reader = Reader::new(BufReader::new(file));
    if let Ok(format) = ImageFormat::from_path(path) {
        reader.set_format(format);
    }
    reader
        .with_guessed_format()
        .map_err(|source| DataError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Reads just enough of `path` to know it is an image of a format the decoder has, of a size
/// it may decode.
fn check_header(path: &Path) -> Result<(), DataError> {
    let (width, height) = reader(path)?
        .into_dimensions()
        .map_err(|source| DataError::Image {
            path: path.to_path_buf(),
            source,
        })?;
    check_size(path, width, height)
}

/// Refuses an image of no pixels, of more than [`MAX_PIXELS`], or of an aspect ratio over
/// [`MAX_ASPECT`], from its header's size.
fn check_size(path: &Path, width: u32, height: u32) -> Result<(), DataError> {
    let (w, h) = (u64::from(width), u64::from(height));
    let problem = if w == 0 || h == 0 {
        "no pixels: expected at least 1×1".to_string()
    } else if w * h > MAX_PIXELS {
        format!(
            "{} pixels, more than the limit of {MAX_PIXELS} (PIL's decompression-bomb bound)",
            w * h
        )
    } else if w.max(h) > MAX_ASPECT * w.min(h) {
        format!(
            "one side {}× the other, more than the limit of {MAX_ASPECT} (the evaluation \
             resize would scale the long side in proportion)",
            w.max(h) / w.min(h)
        )
    } else {
        return Ok(());
    };
    Err(DataError::ImageSize {
        path: path.to_path_buf(),
        width,
        height,
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_files::{TempDir, assert_err};
    use crate::data::{DatasetKind, load as load_kind};

    use image::{GrayImage, ImageFormat, Luma, Rgb as Pixel, RgbImage, RgbaImage};

    /// A `w×h` RGB image whose red channel is `tag`, saved as PNG or JPEG by `name`'s
    /// extension.
    fn save_rgb(t: &TempDir, name: &str, tag: u8, (w, h): (u32, u32)) -> PathBuf {
        let path = t.mkdir_for(name);
        let image = RgbImage::from_fn(w, h, |x, y| Pixel([tag, x as u8, y as u8]));
        let format = ImageFormat::from_path(&path).unwrap();
        image.save_with_format(&path, format).unwrap();
        path
    }

    /// `train/` with classes created out of name order (`zebra`, `ant`, `moth`), mixed
    /// formats and a non-image file, and `val/` with two of the classes.
    fn folder_set(name: &str) -> TempDir {
        let t = TempDir::new(name);
        save_rgb(&t, "train/zebra/b.png", 1, (4, 3));
        save_rgb(&t, "train/zebra/a.JPG", 2, (8, 8));
        save_rgb(&t, "train/ant/only.jpeg", 3, (2, 2));
        save_rgb(&t, "train/moth/x.png", 4, (5, 5));
        t.write("train/moth/notes.txt", b"not an image, ignored");
        t.write("train/README", b"top-level files are not classes");
        save_rgb(&t, "val/zebra/v.png", 5, (3, 3));
        save_rgb(&t, "val/ant/v.png", 6, (3, 3));
        t
    }

    #[test]
    fn classes_sorted_samples_class_by_class() {
        let t = folder_set("folders");
        let d = load_kind(DatasetKind::Imagefolder, t.path()).unwrap();
        assert_eq!(d.class_names, ["ant", "moth", "zebra"]);
        assert_eq!(d.classes, 3);
        let train = t.path().join("train");
        let expected = ["ant/only.jpeg", "moth/x.png", "zebra/a.JPG", "zebra/b.png"]
            .map(|f| train.join(f))
            .to_vec();
        assert_eq!(d.train.images, Images::Files(expected));
        assert_eq!(d.train.labels, [0, 1, 2, 2]);
        let dims = (d.train.len, d.train.channels, d.train.rows, d.train.cols);
        assert_eq!(dims, (4, 3, 0, 0));
        // val numbers its classes by the train names, not by its own folders.
        assert_eq!(d.test.labels, [0, 2]);
        assert_eq!(d.test.len, 2);
    }

    #[test]
    fn test_folder_when_no_val() {
        let t = folder_set("test-split");
        fs::rename(t.path().join("val"), t.path().join("test")).unwrap();
        let d = load_kind(DatasetKind::Imagefolder, t.path()).unwrap();
        let test = t.path().join("test");
        let expected = vec![test.join("ant/v.png"), test.join("zebra/v.png")];
        assert_eq!(d.test.images, Images::Files(expected));
    }

    #[test]
    fn nested_files_in_python_string_order() {
        let t = folder_set("nested");
        // Python's sorted(os.walk) gives only.jpeg, b-c/y.png, b/x/z.png: roots compare as
        // strings, and "-" sorts before "/".
        save_rgb(&t, "train/ant/b/x/z.png", 7, (2, 2));
        save_rgb(&t, "train/ant/b-c/y.png", 8, (2, 2));
        let d = load_kind(DatasetKind::Imagefolder, t.path()).unwrap();
        let ant = t.path().join("train/ant");
        let Images::Files(files) = &d.train.images else {
            panic!("image folders are files")
        };
        let expected = ["only.jpeg", "b-c/y.png", "b/x/z.png"].map(|f| ant.join(f));
        assert_eq!(files[..3], expected);
        assert_eq!(d.train.labels[..4], [0, 0, 0, 1]);
    }

    #[test]
    fn missing_split_folders() {
        let t = folder_set("no-val");
        fs::remove_dir_all(t.path().join("val")).unwrap();
        let dir = t.path().display().to_string();
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&dir, "cannot find val/ or test/"],
        );
        fs::remove_dir_all(t.path().join("train")).unwrap();
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&dir, "cannot find train/"],
        );
    }

    #[test]
    fn empty_class_folder_is_named() {
        let t = folder_set("empty-class");
        t.mkdir("train/beetle");
        t.write("train/beetle/labels.csv", b"no images here");
        let msg = "empty class folder: expected at least one .jpg, .jpeg or .png file, found none";
        let folder = t.path().join("train/beetle").display().to_string();
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&folder, msg],
        );
    }

    #[test]
    fn corrupt_image_is_named() {
        let t = folder_set("corrupt");
        let bad = t.write(
            "val/zebra/broken.jpg",
            b"\xff\xd8\xff\xe0 then nothing useful",
        );
        let path = bad.display().to_string();
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&path, "not a decodable image: "],
        );
        assert_err(decode(&bad), &[&path, "not a decodable image: "]);
    }

    #[test]
    fn unknown_val_class_is_named() {
        let t = folder_set("unknown");
        save_rgb(&t, "val/wasp/w.png", 9, (2, 2));
        let folder = t.path().join("val/wasp").display().to_string();
        let train = t.path().join("train").display().to_string();
        let msg =
            format!("unknown class: expected one of the class folders in {train}, found wasp");
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&folder, &msg],
        );
    }

    #[test]
    fn one_class_is_too_few() {
        let t = TempDir::new("one-class");
        save_rgb(&t, "train/only/a.png", 1, (2, 2));
        save_rgb(&t, "val/only/a.png", 1, (2, 2));
        let msg = "expected at least 2 class folders, found 1";
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &["train", msg],
        );
    }

    #[test]
    fn decode_gives_hwc_rgb() {
        let t = TempDir::new("decode");
        let path = save_rgb(&t, "a.png", 200, (3, 2));
        let rgb = decode(&path).unwrap();
        assert_eq!((rgb.width, rgb.height, rgb.pixels.len()), (3, 2, 18));
        // Pixel (x 2, y 1), row 1 then column 2: R = tag, G = x, B = y.
        assert_eq!(&rgb.pixels[(3 + 2) * 3..(3 + 2) * 3 + 3], [200, 2, 1]);
        // JPEG is lossy; the size and a roughly kept colour are what can be checked.
        let jpeg = save_rgb(&t, "a.jpg", 200, (16, 8));
        let rgb = decode(&jpeg).unwrap();
        assert_eq!(
            (rgb.width, rgb.height, rgb.pixels.len()),
            (16, 8, 16 * 8 * 3)
        );
        assert!(rgb.pixels[0].abs_diff(200) < 16, "red {}", rgb.pixels[0]);
    }

    #[test]
    fn grayscale_and_rgba_become_rgb() {
        let t = TempDir::new("gray");
        let gray = t.mkdir_for("g.png");
        GrayImage::from_fn(2, 2, |x, y| Luma([(10 * x + 100 * y) as u8]))
            .save(&gray)
            .unwrap();
        let rgb = decode(&gray).unwrap();
        assert_eq!(
            rgb.pixels,
            [0, 0, 0, 10, 10, 10, 100, 100, 100, 110, 110, 110]
        );
        let rgba = t.mkdir_for("a.png");
        RgbaImage::from_pixel(1, 1, image::Rgba([1, 2, 3, 0]))
            .save(&rgba)
            .unwrap();
        assert_eq!(decode(&rgba).unwrap().pixels, [1, 2, 3]);
    }

    #[test]
    fn content_decides_format_not_name() {
        let t = TempDir::new("misnamed");
        let png = save_rgb(&t, "p.png", 9, (2, 2));
        let misnamed = t.path().join("p.jpg");
        fs::rename(&png, &misnamed).unwrap();
        assert_eq!(decode(&misnamed).unwrap().pixels[0], 9);
    }

    /// A PNG of `width × height` RGB pixels as far as its header goes: the IHDR chunk, an IDAT
    /// of no pixels and the end, written by hand so any size can be claimed without pixels.
    fn png_header(width: u32, height: u32) -> Vec<u8> {
        let chunk = |kind: &[u8], data: &[u8]| {
            let mut crc = flate2::Crc::new();
            crc.update(kind);
            crc.update(data);
            let mut out = (data.len() as u32).to_be_bytes().to_vec();
            out.extend(kind);
            out.extend(data);
            out.extend(crc.sum().to_be_bytes());
            out
        };
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend(height.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, adaptive filter, no interlace
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(chunk(b"IHDR", &ihdr));
        png.extend(chunk(
            b"IDAT",
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
        ));
        png.extend(chunk(b"IEND", &[]));
        png
    }

    #[test]
    fn linked_folders_are_read_once() {
        let t = folder_set("links");
        save_rgb(&t, "train/ant/b/z.png", 7, (2, 2));
        // A link to the folder itself and one to its parent: torchvision's walk never ends.
        std::os::unix::fs::symlink(".", t.path().join("train/ant/self")).unwrap();
        std::os::unix::fs::symlink("..", t.path().join("train/ant/b/up")).unwrap();
        let d = load_kind(DatasetKind::Imagefolder, t.path()).unwrap();
        let ant = t.path().join("train/ant");
        let Images::Files(files) = &d.train.images else {
            panic!("image folders are files")
        };
        assert_eq!(files[..2], [ant.join("only.jpeg"), ant.join("b/z.png")]);
        assert_eq!(d.train.labels, [0, 0, 1, 2, 2]);
    }

    #[test]
    fn an_image_name_on_a_fifo_is_refused_not_waited_on() {
        let t = folder_set("fifo");
        let fifo = t.fifo("train/moth/y.png");
        let msg = "not a regular file: expected a data file, found a FIFO";
        let path = fifo.display().to_string();
        assert_err(load_kind(DatasetKind::Imagefolder, t.path()), &[&path, msg]);
        assert_err(decode(&fifo), &[&path, msg]);
    }

    #[test]
    fn image_sizes_are_bounded_before_decoding() {
        let t = folder_set("sizes");
        let long = t.write("val/zebra/long.png", &png_header(1, 4_000_000));
        let msg = "1×4000000 image: one side 4000000× the other, more than the limit of 256";
        let path = long.display().to_string();
        assert_err(load_kind(DatasetKind::Imagefolder, t.path()), &[&path, msg]);
        assert_err(decode(&long), &[&path, msg]);
        fs::remove_file(&long).unwrap();
        let big = t.write("train/ant/big.png", &png_header(12_000, 12_000));
        let msg = "12000×12000 image: 144000000 pixels, more than the limit of 89478485";
        assert_err(
            load_kind(DatasetKind::Imagefolder, t.path()),
            &[&big.display().to_string(), msg],
        );
        // At the bounds, the header is accepted (its pixels are not there to decode).
        check_header(&t.write("edge.png", &png_header(256, 1))).unwrap();
    }

    #[test]
    fn an_empty_test_split_is_refused() {
        let t = folder_set("empty-val");
        fs::remove_dir_all(t.path().join("val")).unwrap();
        t.mkdir("val");
        let val = t.path().join("val").display().to_string();
        let msg = "empty test split: expected at least one class folder with images, found none";
        assert_err(load_kind(DatasetKind::Imagefolder, t.path()), &[&val, msg]);
    }
}
