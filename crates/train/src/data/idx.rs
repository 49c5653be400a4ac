//! The IDX container: a magic naming the element type and rank, one big-endian `u32` size per
//! dimension, then the elements. The data is streamed through a size cap taken from the
//! header, so a damaged header is reported instead of allocating what it claims.

use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::DataError;

/// The largest payload accepted: the real data sets are well under it, and a header that
/// claims more is far likelier corrupt than a data set this reader could hold in memory.
pub const MAX_BYTES: u64 = 1 << 32;

/// The only element type the trainer has a use for.
pub(super) const U8: u8 = 0x08;

/// First read of the payload at most this large, so a header claiming a large size over a
/// tiny file costs a little memory rather than the claimed amount up front.
const FIRST_CAPACITY: u64 = 64 << 20;

/// An IDX array of bytes: dims in file order (outermost first), data row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// Size of each dimension as the header gives it.
    pub dims: Vec<usize>,
    /// Exactly the product of `dims` elements.
    pub data: Vec<u8>,
}

/// The name of an IDX element type code, for errors about files of another type.
pub(super) fn type_name(code: u8) -> &'static str {
    match code {
        0x08 => "u8",
        0x09 => "i8",
        0x0B => "i16",
        0x0C => "i32",
        0x0D => "f32",
        0x0E => "f64",
        _ => "not an IDX type",
    }
}

/// Reads an IDX file of u8 elements, gzipped or not (told apart by content, since downloads
/// are often renamed or unpacked without changing the name).
pub fn read_idx(path: &Path) -> Result<IdxArray, DataError> {
    let cannot_read = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = BufReader::new(super::open_data(path)?.0);
    let gzipped = file
        .fill_buf()
        .map_err(cannot_read)?
        .starts_with(&[0x1f, 0x8b]);
    let mut reader: Box<dyn Read> = if gzipped {
        Box::new(MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    // A decoder reports damage as data errors; anything else is the file itself failing.
    let read_err = |source: io::Error| match source.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            if gzipped =>
        {
            DataError::Gzip {
                path: path.to_path_buf(),
                source,
            }
        }
        _ => cannot_read(source),
    };
    let mut read = |n: u64, capacity: u64| read_up_to(&mut reader, n, capacity).map_err(read_err);

    let (dims, expected) = header(path, &mut read)?;

    // One byte past the end tells trailing data apart, and makes a gzip decoder reach the
    // end of its stream, where it checks the checksum.
    let want = expected as u64 + 1;
    let data = read(want, want.min(FIRST_CAPACITY))?;
    if data.len() == expected {
        return Ok(IdxArray { dims, data });
    }
    let mut found = data.len() as u64;
    if found > expected as u64 {
        // Counted without storing, and only up to the cap, so the message says how much.
        found += io::copy(&mut (&mut reader).take(MAX_BYTES), &mut io::sink()).map_err(read_err)?;
    }
    Err(DataError::Length {
        path: path.to_path_buf(),
        dims,
        expected,
        found,
    })
}

/// The magic and dimensions of an IDX file of u8 elements: the dimensions and the number of
/// data bytes they call for (refused above [`MAX_BYTES`]).
fn header(
    path: &Path,
    read: &mut impl FnMut(u64, u64) -> Result<Vec<u8>, DataError>,
) -> Result<(Vec<usize>, usize), DataError> {
    let magic = read(4, 4)?;
    if magic.len() < 4 || magic[..2] != [0, 0] {
        return Err(DataError::NotIdx {
            path: path.to_path_buf(),
            found: magic,
        });
    }
    if magic[2] != U8 {
        return Err(DataError::ElementType {
            path: path.to_path_buf(),
            found: magic[2],
        });
    }
    let ndims = magic[3];
    let sizes = read(4 * u64::from(ndims), 4 * u64::from(ndims))?;
    if sizes.len() < 4 * usize::from(ndims) {
        return Err(DataError::TruncatedHeader {
            path: path.to_path_buf(),
            ndims,
            found: sizes.len(),
        });
    }
    let dims: Vec<u32> = sizes
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let product = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)))
        .filter(|&p| p <= MAX_BYTES)
        .and_then(|p| usize::try_from(p).ok());
    let dims: Vec<usize> = dims.into_iter().map(|d| d as usize).collect();
    match product {
        Some(expected) => Ok((dims, expected)),
        None => Err(DataError::TooLarge {
            path: path.to_path_buf(),
            dims,
        }),
    }
}

/// Up to `n` bytes, fewer only at the end of the stream; errors only for real failures, unlike
/// `read_exact`, whose end-of-stream error a gzip decoder's truncation error would look like.
fn read_up_to(reader: &mut dyn Read, n: u64, capacity: u64) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(capacity as usize);
    reader.take(n).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::test_files::{TempDir, assert_err, gzip, idx};

    #[test]
    fn raw_and_gzipped_round_trip() {
        let t = TempDir::new("round-trip");
        let pixels: Vec<u8> = (0..24).map(|i| i * 10).collect();
        let images = idx(U8, &[4, 2, 3], &pixels);
        let labels = idx(U8, &[4], &[3, 0, 255, 7]);
        for (name, bytes) in [
            ("images", images.clone()),
            ("images.gz", gzip(&images)),
            ("labels", labels.clone()),
            ("labels.gz", gzip(&labels)),
        ] {
            let a = read_idx(&t.write(name, &bytes)).unwrap();
            if name.starts_with("images") {
                assert_eq!(a.dims, [4, 2, 3], "{name}");
                assert_eq!(a.data, pixels, "{name}");
            } else {
                assert_eq!(a.dims, [4], "{name}");
                assert_eq!(a.data, [3, 0, 255, 7], "{name}");
            }
        }
    }

    #[test]
    fn concatenated_gzip_members_are_one_stream() {
        let t = TempDir::new("multi-gz");
        let bytes = idx(U8, &[2, 2], &[1, 2, 3, 4]);
        let mut gz = gzip(&bytes[..6]);
        gz.extend(gzip(&bytes[6..]));
        let a = read_idx(&t.write("two-members.gz", &gz)).unwrap();
        assert_eq!((a.dims, a.data), (vec![2, 2], vec![1, 2, 3, 4]));
    }

    #[test]
    fn empty_dimension_gives_empty_data() {
        let t = TempDir::new("empty");
        let a = read_idx(&t.write("empty", &idx(U8, &[0, 28, 28], &[]))).unwrap();
        assert_eq!((a.dims, a.data), (vec![0, 28, 28], vec![]));
    }

    #[test]
    fn missing_file() {
        let t = TempDir::new("missing");
        let err = read_idx(&t.path().join("nope-idx1-ubyte"));
        assert_err(err, &["nope-idx1-ubyte", "cannot read", "No such file"]);
    }

    #[test]
    fn bad_magic() {
        let t = TempDir::new("magic");
        let zip = t.write("archive-idx3-ubyte", b"PK\x03\x04rest of a zip");
        let msg = "not an IDX file (magic 00 00 08 xx expected, found 50 4b 03 04)";
        assert_err(read_idx(&zip), &["archive-idx3-ubyte", msg]);
        let short = t.write("short-idx3-ubyte", &[0, 0]);
        assert_err(
            read_idx(&short),
            &["short-idx3-ubyte", "found 00 00 then end of file"],
        );
    }

    #[test]
    fn wrong_element_type_is_named() {
        let t = TempDir::new("type");
        let f32s = t.write("floats-idx1-ubyte", &idx(0x0D, &[1], &1f32.to_be_bytes()));
        let msg = "expected element type 0x08 (u8), found 0x0D (f32)";
        assert_err(read_idx(&f32s), &["floats-idx1-ubyte", msg]);
    }

    #[test]
    fn truncated_header() {
        let t = TempDir::new("header");
        let bytes = idx(U8, &[4, 2, 3], &[]);
        let p = t.write("cut-idx3-ubyte", &bytes[..9]);
        let msg = "truncated header: 3 dimensions need 12 bytes of sizes, file has 5";
        assert_err(read_idx(&p), &["cut-idx3-ubyte", msg]);
    }

    #[test]
    fn truncated_data_raw_and_gzipped() {
        let t = TempDir::new("truncated");
        let bytes = idx(U8, &[2, 3], &[1, 2, 3, 4]);
        let msg = "truncated: header says 2×3 = 6 bytes of data, file has 4";
        let raw = t.write("short-idx2-ubyte", &bytes);
        assert_err(read_idx(&raw), &["short-idx2-ubyte", msg]);
        let gz = t.write("short-idx2-ubyte.gz", &gzip(&bytes));
        assert_err(read_idx(&gz), &["short-idx2-ubyte.gz", msg]);
    }

    #[test]
    fn trailing_bytes() {
        let t = TempDir::new("trailing");
        let bytes = idx(U8, &[3], &[1, 2, 3, 4, 5, 6]);
        let p = t.write("long-idx1-ubyte", &bytes);
        let msg = "trailing bytes: header says 3 bytes of data, file has 6";
        assert_err(read_idx(&p), &["long-idx1-ubyte", msg]);
    }

    #[test]
    fn corrupt_gzip() {
        let t = TempDir::new("gzip");
        let good = gzip(&idx(U8, &[2, 3], &[1, 2, 3, 4, 5, 6]));
        let mut bad_block = good.clone();
        bad_block[10] = 0xff; // first deflate block: final, reserved type 3
        let mut bad_crc = good.clone();
        let crc_at = good.len() - 8;
        bad_crc[crc_at] ^= 1;
        let cut = &good[..good.len() - 4];
        for (name, bytes) in [
            ("block.gz", &bad_block[..]),
            ("crc.gz", &bad_crc),
            ("cut.gz", cut),
        ] {
            let p = t.write(name, bytes);
            assert_err(read_idx(&p), &[name, "gzip stream is corrupt: "]);
        }
    }

    #[test]
    fn absurd_size_is_refused_before_reading() {
        let t = TempDir::new("absurd");
        let msg = "header says 4294967295×4294967295×4294967295 elements, more than the limit of \
                   4294967296 bytes";
        let p = t.write("huge-idx3-ubyte", &idx(U8, &[u32::MAX; 3], &[0; 16]));
        assert_err(read_idx(&p), &["huge-idx3-ubyte", msg]);
        // Just over the cap without overflowing u64.
        let p = t.write(
            "big-idx2-ubyte.gz",
            &gzip(&idx(U8, &[65536, 65537], &[0; 16])),
        );
        assert_err(read_idx(&p), &["big-idx2-ubyte.gz", "more than the limit"]);
        // Under the cap: the claim is believed only as far as the data goes.
        let p = t.write("claims-idx2-ubyte", &idx(U8, &[65536, 65536], &[0; 16]));
        assert_err(
            read_idx(&p),
            &["claims-idx2-ubyte", "= 4294967296 bytes", "has 16"],
        );
    }
}
