//! NumPy's `.npz`, a zip of `.npy` arrays, read here rather than by tch, whose reader copies as
//! many bytes as an array's header claims from however few the entry has, and panics on an
//! encrypted, otherwise compressed or damaged entry. Each array asked for is read as exactly
//! the bytes its shape and dtype call for (never more than one past them from a decompressor),
//! then the end of its entry and its CRC-32, as `numpy.load` checks the length; object arrays
//! are refused, as `numpy.load(allow_pickle=False)` does. Only stored and deflated entries are
//! read (what `numpy.savez` and `savez_compressed` write), by this module, not by the zip
//! crate, whose decryption paths can panic on a forged entry.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

use flate2::CrcReader;
use flate2::read::DeflateDecoder;
use tch::{Kind, Tensor};
use zip::ZipArchive;
use zip::result::ZipError;

use super::{DataError, MAX_BYTES};

/// NumPy's `_MAX_HEADER_SIZE`: `numpy.load` refuses a longer header unless told otherwise.
const MAX_HEADER: usize = 10_000;

/// First allocation for an array's bytes at most this large, so a header claiming much over a
/// short entry costs what the entry has, not what it claims.
const FIRST_CAPACITY: usize = 64 << 20;

/// The zip compression methods read: stored and deflated.
const STORED: u16 = 0;
const DEFLATED: u16 = 8;

/// The arrays of an npz file asked for, and the names of all it has.
pub(super) struct Npz {
    /// Every entry's name without `.npy` (the keys of `numpy.load`), in file order.
    pub names: Vec<String>,
    /// The arrays asked for that the file has.
    pub arrays: Vec<(String, Tensor)>,
}

/// Reads the arrays `wanted` of the npz file `path` (opened as `file`); the others are listed,
/// not read.
pub(super) fn read(path: &Path, file: File, wanted: &[&str]) -> Result<Npz, DataError> {
    let whole = |problem: String| DataError::Npz {
        path: path.to_path_buf(),
        entry: None,
        problem,
    };
    let headers = file.try_clone().map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut zip = ZipArchive::new(BufReader::new(file)).map_err(|e| whole(e.to_string()))?;
    let mut npz = Npz {
        names: Vec::new(),
        arrays: Vec::new(),
    };
    for index in 0..zip.len() {
        let entry = zip.by_index_raw(index).map_err(|e| whole(e.to_string()))?;
        let name = entry.name().to_string();
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        if npz.names.contains(&key) {
            return Err(whole(format!("two entries named {name}")));
        }
        npz.names.push(key.clone());
        if !wanted.contains(&key.as_str()) {
            continue;
        }
        let fail = |problem: String| DataError::Npz {
            path: path.to_path_buf(),
            entry: Some(name.clone()),
            problem,
        };
        let method = readable_method(&headers, entry.central_header_start())
            .map_err(|e| fail(e.to_string()))?
            .map_err(fail)?;
        let tensor = read_entry(entry, method).map_err(|e| match e {
            Failure::Problem(problem) => fail(problem),
            Failure::Io(source) => DataError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        npz.arrays.push((key, tensor));
    }
    Ok(npz)
}

/// The compression method of the entry whose central directory header starts at `at`, if it
/// is one this module reads; the inner error is the entry's problem. Read from the header's
/// bytes, since the zip crate keeps the encryption flag to itself.
fn readable_method(file: &File, at: u64) -> Result<Result<u16, String>, ZipError> {
    // Signature, version made by, version needed, flags, method.
    let mut header = [0u8; 12];
    file.read_exact_at(&mut header, at)?;
    let flags = u16::from_le_bytes([header[8], header[9]]);
    let method = u16::from_le_bytes([header[10], header[11]]);
    Ok(if flags & 1 == 1 || method == 99 {
        Err("encrypted (password-protected) entries are not read".to_string())
    } else if method != STORED && method != DEFLATED {
        Err(format!(
            "compression method {method} is not read: expected stored (0) or deflated (8), as \
             numpy.savez and savez_compressed write"
        ))
    } else {
        Ok(method)
    })
}

/// Why an entry cannot be read: its content, or the file failing underneath.
enum Failure {
    /// What is wrong with the entry.
    Problem(String),
    /// What the OS said.
    Io(io::Error),
}

/// An error of a decompressor or of the file: decompressors report damage as data errors.
fn failure(e: io::Error) -> Failure {
    match e.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => {
            Failure::Problem(format!("corrupt deflate stream: {e}"))
        }
        _ => Failure::Io(e),
    }
}

/// The array in `entry`, compressed by `method`: the `.npy` header, exactly the data bytes it
/// calls for, the end of the entry, and the entry's CRC-32.
fn read_entry(mut entry: zip::read::ZipFile<'_>, method: u16) -> Result<Tensor, Failure> {
    let declared = entry.size();
    let crc = entry.crc32();
    let raw: Box<dyn Read + '_> = match method {
        DEFLATED => Box::new(DeflateDecoder::new(&mut entry)),
        _ => Box::new(&mut entry),
    };
    let mut reader = CrcReader::new(raw);
    let (header, header_len) = read_header(&mut reader)?;
    let array = header.array().map_err(Failure::Problem)?;
    let room = declared.saturating_sub(header_len);
    if array.bytes != room {
        return Err(Failure::Problem(length_text(
            &header.shape,
            array.bytes,
            room,
            "entry says",
        )));
    }
    let mut data = Vec::with_capacity((array.bytes as usize).min(FIRST_CAPACITY));
    (&mut reader)
        .take(array.bytes + 1)
        .read_to_end(&mut data)
        .map_err(failure)?;
    if data.len() as u64 != array.bytes {
        let found = data.len() as u64;
        return Err(Failure::Problem(length_text(
            &header.shape,
            array.bytes,
            found,
            "entry has",
        )));
    }
    if reader.crc().sum() != crc {
        return Err(Failure::Problem(
            "CRC-32 mismatch: the entry is damaged".to_string(),
        ));
    }
    array
        .tensor(data)
        .map_err(|e| Failure::Problem(e.to_string()))
}

/// `truncated: header says 2×3 = 6 bytes of data, entry has 4` and its trailing-bytes twin.
fn length_text(shape: &[u64], expected: u64, found: u64, what: &str) -> String {
    let problem = if found < expected {
        "truncated"
    } else {
        "trailing bytes"
    };
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!(
        "{problem}: header says {} = {expected} bytes of data, {what} {found}",
        if dims.is_empty() {
            "()".to_string()
        } else {
            dims.join("×")
        }
    )
}

/// The `.npy` header at the start of `reader` and the bytes it took (magic to padding).
fn read_header(reader: &mut impl Read) -> Result<(Header, u64), Failure> {
    let problem = |p: &str| Failure::Problem(p.to_string());
    let mut start = [0u8; 8];
    read_exact(
        reader,
        &mut start,
        "no .npy header: the entry ends in its magic",
    )?;
    if &start[..6] != b"\x93NUMPY" {
        return Err(problem("not a .npy array: magic \\x93NUMPY expected"));
    }
    let size_bytes = match start[6] {
        1 => 2,
        2 | 3 => 4,
        v => {
            return Err(Failure::Problem(format!(
                ".npy version {v}.{} is not read: expected 1, 2 or 3",
                start[7]
            )));
        }
    };
    let mut size = [0u8; 4];
    read_exact(
        reader,
        &mut size[..size_bytes],
        "the entry ends in its .npy header",
    )?;
    let len = u32::from_le_bytes(size) as usize;
    if len > MAX_HEADER {
        return Err(Failure::Problem(format!(
            ".npy header of {len} bytes, more than numpy.load's limit of {MAX_HEADER}"
        )));
    }
    let mut text = vec![0u8; len];
    read_exact(reader, &mut text, "the entry ends in its .npy header")?;
    let header = Header::parse(&text).map_err(|e| Failure::Problem(format!(".npy header: {e}")))?;
    Ok((header, (8 + size_bytes + len) as u64))
}

/// `read_exact`, its end-of-stream error told as `short`.
fn read_exact(reader: &mut impl Read, buf: &mut [u8], short: &str) -> Result<(), Failure> {
    reader.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => Failure::Problem(short.to_string()),
        _ => failure(e),
    })
}

/// The dict of a `.npy` header.
#[derive(Debug, PartialEq)]
struct Header {
    /// The dtype string, as `<f4`.
    descr: String,
    /// Column-major data (the shape's last axis varies slowest).
    fortran_order: bool,
    /// The dimensions.
    shape: Vec<u64>,
}

/// An array's element type and size as a header gives them.
struct Array {
    kind: Kind,
    /// Bytes per element.
    itemsize: u64,
    /// Stored big-endian on a little-endian machine or the reverse.
    swap: bool,
    fortran_order: bool,
    shape: Vec<i64>,
    /// Data bytes: elements × itemsize.
    bytes: u64,
}

impl Header {
    /// Parses the Python dict literal NumPy writes: `{'descr': '<f4', 'fortran_order': False,
    /// 'shape': (3, 4), }`, padded with spaces and a newline.
    fn parse(text: &[u8]) -> Result<Header, String> {
        let mut p = Literal { text, at: 0 };
        p.expect(b'{')?;
        let (mut descr, mut fortran_order, mut shape) = (None, None, None);
        while !p.eat(b'}') {
            let key = p.string()?;
            p.expect(b':')?;
            let seen = match key.as_str() {
                "descr" => descr.replace(p.descr()?).is_some(),
                "fortran_order" => fortran_order.replace(p.boolean()?).is_some(),
                "shape" => shape.replace(p.tuple()?).is_some(),
                other => return Err(format!("unexpected key {other:?}")),
            };
            if seen {
                return Err(format!("key {key:?} given twice"));
            }
            if !p.eat(b',') {
                p.expect(b'}')?;
                break;
            }
        }
        p.skip_space();
        if p.at != text.len() {
            return Err("text after the dict".to_string());
        }
        let missing = |k: &str| format!("no {k:?} key");
        Ok(Header {
            descr: descr.ok_or_else(|| missing("descr"))?,
            fortran_order: fortran_order.ok_or_else(|| missing("fortran_order"))?,
            shape: shape.ok_or_else(|| missing("shape"))?,
        })
    }

    /// The element type and byte count, refused for dtypes the trainer has no use for and
    /// for sizes over [`MAX_BYTES`].
    fn array(&self) -> Result<Array, String> {
        let (kind, itemsize, swap) = dtype(&self.descr)?;
        let bytes = self
            .shape
            .iter()
            .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= MAX_BYTES && self.shape.iter().all(|&d| d <= MAX_BYTES));
        let Some(bytes) = bytes else {
            let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
            return Err(format!(
                "header says {} elements of {itemsize} bytes, more than the limit of {MAX_BYTES} \
                 bytes",
                dims.join("×")
            ));
        };
        Ok(Array {
            kind,
            itemsize,
            swap,
            fortran_order: self.fortran_order,
            shape: self.shape.iter().map(|&d| d as i64).collect(),
            bytes,
        })
    }
}

impl Array {
    /// The tensor of `data` (exactly [`Array::bytes`] of them), row-major.
    fn tensor(&self, mut data: Vec<u8>) -> Result<Tensor, tch::TchError> {
        if self.swap {
            data.chunks_exact_mut(self.itemsize as usize)
                .for_each(<[u8]>::reverse);
        }
        if self.kind == Kind::Bool {
            // libtorch's bools are 0 or 1; NumPy writes whatever byte it held.
            data.iter_mut().for_each(|b| *b = u8::from(*b != 0));
        }
        if !self.fortran_order {
            return Tensor::f_from_data_size(&data, &self.shape, self.kind);
        }
        // Column-major data is the row-major array of the reversed shape, transposed.
        let reversed: Vec<i64> = self.shape.iter().rev().copied().collect();
        let axes: Vec<i64> = (0..self.shape.len() as i64).rev().collect();
        Tensor::f_from_data_size(&data, &reversed, self.kind)?.f_permute(axes.as_slice())
    }
}

/// The tch kind, bytes per element and byte swap of a NumPy dtype string such as `<f4`.
fn dtype(descr: &str) -> Result<(Kind, u64, bool), String> {
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => descr.split_at(1),
        _ => ("=", descr),
    };
    let (kind, size) = match code {
        "b1" => (Kind::Bool, 1),
        "u1" => (Kind::Uint8, 1),
        "i1" => (Kind::Int8, 1),
        "i2" => (Kind::Int16, 2),
        "i4" => (Kind::Int, 4),
        "i8" => (Kind::Int64, 8),
        "f2" => (Kind::Half, 2),
        "f4" => (Kind::Float, 4),
        "f8" => (Kind::Double, 8),
        c if c.starts_with('O') => {
            return Err(
                "object array (pickled Python objects): refused, as numpy.load(allow_pickle=False) \
                 does"
                    .to_string(),
            );
        }
        _ => {
            return Err(format!(
                "dtype {descr} is not read: expected b1, u1, i1, i2, i4, i8, f2, f4 or f8"
            ));
        }
    };
    let big = order == ">" || (order == "=" && cfg!(target_endian = "big"));
    Ok((kind, size, size > 1 && big != cfg!(target_endian = "big")))
}

/// A cursor over the Python literal of a header.
struct Literal<'a> {
    text: &'a [u8],
    at: usize,
}

impl Literal<'_> {
    fn skip_space(&mut self) {
        while self.text.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    /// Takes `c` (after spaces) if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_space();
        let next = self.text.get(self.at) == Some(&c);
        self.at += usize::from(next);
        next
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            return Ok(());
        }
        Err(format!("expected {:?} at byte {}", c as char, self.at))
    }

    /// A quoted string without escapes (NumPy's keys and dtype strings have none).
    fn string(&mut self) -> Result<String, String> {
        self.skip_space();
        let quote = match self.text.get(self.at) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at byte {}", self.at)),
        };
        let start = self.at + 1;
        let len = self.text[start..]
            .iter()
            .position(|&c| c == quote)
            .ok_or("unterminated string")?;
        self.at = start + len + 1;
        let s = &self.text[start..start + len];
        if s.contains(&b'\\') || !s.is_ascii() {
            return Err("a string with escapes or non-ASCII bytes".to_string());
        }
        Ok(String::from_utf8_lossy(s).into_owned())
    }

    /// The dtype: a string; a list is a structured dtype, which the trainer has no use for.
    fn descr(&mut self) -> Result<String, String> {
        self.skip_space();
        if self.text.get(self.at) == Some(&b'[') {
            return Err("structured dtype: expected a plain one such as '<f4'".to_string());
        }
        self.string()
    }

    fn boolean(&mut self) -> Result<bool, String> {
        self.skip_space();
        for (word, value) in [(&b"True"[..], true), (b"False", false)] {
            if self.text[self.at..].starts_with(word) {
                self.at += word.len();
                return Ok(value);
            }
        }
        Err(format!("expected True or False at byte {}", self.at))
    }

    /// A tuple of non-negative integers: `()`, `(5,)`, `(2, 3)`; Python 2's `3L` too.
    fn tuple(&mut self) -> Result<Vec<u64>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        while !self.eat(b')') {
            let start = self.at;
            while self.text.get(self.at).is_some_and(u8::is_ascii_digit) {
                self.at += 1;
            }
            let digits = std::str::from_utf8(&self.text[start..self.at]).unwrap_or_default();
            let dim = digits
                .parse::<u64>()
                .map_err(|_| format!("expected a dimension at byte {start}"))?;
            dims.push(dim);
            self.at += usize::from(self.text.get(self.at) == Some(&b'L'));
            if !self.eat(b',') {
                self.expect(b')')?;
                break;
            }
        }
        Ok(dims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_files::{TempDir, ZipEntry, assert_err, npy, zip};
    use crate::data::{DatasetKind, Images, load};

    /// `y_train` as i8 little-endian bytes.
    fn labels_i8(labels: &[i64]) -> Vec<u8> {
        labels.iter().flat_map(|l| l.to_le_bytes()).collect()
    }

    /// The four arrays of a valid set of 4 train and 2 test 2×3 byte images of 3 classes, as
    /// `numpy.savez` writes them; tests replace one.
    fn entries() -> Vec<ZipEntry> {
        vec![
            ZipEntry::stored("x_train.npy", npy("|u1", false, &[4, 2, 3], &[7; 24])),
            ZipEntry::stored(
                "y_train.npy",
                npy("<i8", false, &[4], &labels_i8(&[0, 2, 1, 2])),
            ),
            ZipEntry::stored("x_test.npy", npy("|u1", false, &[2, 2, 3], &[9; 12])),
            ZipEntry::stored("y_test.npy", npy("|u1", false, &[2], &[1, 0])),
        ]
    }

    /// `entries` with the one named `name` replaced by `entry`.
    fn replace(name: &str, entry: ZipEntry) -> Vec<ZipEntry> {
        let mut set = entries();
        let i = set.iter().position(|e| e.name == name).unwrap();
        set[i] = entry;
        set
    }

    fn load_npz(t: &TempDir, entries: &[ZipEntry]) -> Result<crate::data::Dataset, DataError> {
        load(DatasetKind::Npz, &t.write("data.npz", &zip(entries)))
    }

    #[test]
    fn stored_and_deflated_entries_load() {
        let t = TempDir::new("npz-ok");
        let d = load_npz(&t, &entries()).unwrap();
        assert_eq!(d.train.images, Images::U8(vec![7; 24]));
        assert_eq!((d.train.labels, d.classes), (vec![0, 2, 1, 2], 3));
        let deflated: Vec<ZipEntry> = entries()
            .into_iter()
            .map(|e| ZipEntry::deflated(&e.name, e.content))
            .collect();
        let d = load_npz(&t, &deflated).unwrap();
        assert_eq!(d.test.images, Images::U8(vec![9; 12]));
    }

    #[test]
    fn header_claiming_more_than_the_entry_is_refused() {
        let t = TempDir::new("npz-claims");
        // 78 MB and 4 KB claimed over 24 bytes: tch's reader copied the claim from the heap.
        for (shape, msg) in [
            (
                &[100_000, 28, 28][..],
                "entry x_train.npy: truncated: header says 100000×28×28 = 78400000 bytes of \
                 data, entry says 24",
            ),
            (
                &[4, 32, 32],
                "header says 4×32×32 = 4096 bytes of data, entry says 24",
            ),
        ] {
            let set = replace(
                "x_train.npy",
                ZipEntry::stored("x_train.npy", npy("|u1", false, shape, &[7; 24])),
            );
            assert_err(load_npz(&t, &set), &["data.npz: cannot read as npz: ", msg]);
        }
        let set = replace(
            "y_test.npy",
            ZipEntry::deflated("y_test.npy", npy("<i8", false, &[600], &[1; 16])),
        );
        let msg =
            "entry y_test.npy: truncated: header says 600 = 4800 bytes of data, entry says 16";
        assert_err(load_npz(&t, &set), &[msg]);
        let set = replace(
            "y_test.npy",
            ZipEntry::stored("y_test.npy", npy("|u1", false, &[2], &[1, 0, 5])),
        );
        assert_err(
            load_npz(&t, &set),
            &["trailing bytes: header says 2 = 2 bytes"],
        );
    }

    #[test]
    fn encrypted_other_methods_and_damaged_headers_are_errors() {
        let t = TempDir::new("npz-zip");
        let mut set = entries();
        set[0].flags = 1;
        assert_err(
            load_npz(&t, &set),
            &["entry x_train.npy: encrypted (password-protected) entries are not read"],
        );
        let mut set = entries();
        set[1].method = 12;
        assert_err(
            load_npz(&t, &set),
            &["entry y_train.npy: compression method 12 is not read"],
        );
        // The local header's signature of the first entry broken, as a cut download leaves.
        let mut bytes = zip(&entries());
        bytes[0] = b'X';
        let path = t.write("data.npz", &bytes);
        assert_err(
            load(DatasetKind::Npz, &path),
            &["data.npz: cannot read as npz: ", "local file header"],
        );
        // A flipped data byte: the CRC-32 says so.
        let mut bytes = zip(&entries());
        let at = bytes.windows(3).position(|w| w == [7, 7, 7]).unwrap();
        bytes[at] = 8;
        let path = t.write("data.npz", &bytes);
        assert_err(
            load(DatasetKind::Npz, &path),
            &["entry x_train.npy: CRC-32 mismatch"],
        );
    }

    #[test]
    fn object_and_unknown_dtypes_are_refused_unread_entries_ignored() {
        let t = TempDir::new("npz-dtype");
        let set = replace(
            "y_train.npy",
            ZipEntry::stored("y_train.npy", npy("|O", false, &[4], b"\x80\x04pickle")),
        );
        assert_err(
            load_npz(&t, &set),
            &["entry y_train.npy: object array (pickled Python objects): refused"],
        );
        let set = replace(
            "x_test.npy",
            ZipEntry::stored("x_test.npy", npy("<U3", false, &[1], &[0; 12])),
        );
        assert_err(load_npz(&t, &set), &["dtype <U3 is not read"]);
        // An array the data set does not use is listed, not read.
        let mut set = entries();
        set.push(ZipEntry::stored("meta.npy", npy("|O", false, &[1], b"x")));
        assert!(load_npz(&t, &set).is_ok());
    }

    #[test]
    fn fortran_order_and_big_endian_read_as_numpy_does() {
        let t = TempDir::new("npz-order");
        // A 4×2×3 array in column-major order: element (n, h, w) at n + 4h + 8w.
        let column_major: Vec<u8> = (0..24)
            .map(|i| {
                let (n, h, w) = (i % 4, (i / 4) % 2, i / 8);
                (n * 6 + h * 3 + w) as u8
            })
            .collect();
        let mut set = replace(
            "x_train.npy",
            ZipEntry::stored("x_train.npy", npy("|u1", true, &[4, 2, 3], &column_major)),
        );
        let big: Vec<u8> = [0i32, 2, 1, 2]
            .iter()
            .flat_map(|l| l.to_be_bytes())
            .collect();
        set[1] = ZipEntry::deflated("y_train.npy", npy(">i4", false, &[4], &big));
        let d = load_npz(&t, &set).unwrap();
        assert_eq!(d.train.images, Images::U8((0..24).collect()));
        assert_eq!(d.train.labels, [0, 2, 1, 2]);
    }

    #[test]
    fn header_literals() {
        let parse = |s: &str| Header::parse(s.as_bytes());
        let h = parse("{'descr': '<f4', 'fortran_order': False, 'shape': (60000L, 28, 28), }\n")
            .unwrap();
        assert_eq!(h.shape, [60000, 28, 28]);
        assert_eq!(
            parse("{\"descr\":\"|u1\",\"fortran_order\":True,\"shape\":()}")
                .unwrap()
                .shape,
            Vec::<u64>::new()
        );
        for (text, msg) in [
            (
                "{'descr': '<f4', 'shape': (1,), }",
                "no \"fortran_order\" key",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
                "structured",
            ),
            ("{'descr': '<f4', 'descr': '<f4'", "given twice"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
                "expected a dimension",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x",
                "text after",
            ),
            ("{'descr': '<f4", "unterminated"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(msg), "{text}: {e}");
        }
    }
}
