//! Files for tests: written under the system temp directory, removed when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use flate2::Compression;
use flate2::write::GzEncoder;

use super::DataError;

/// A directory of its own per test, so tests running in parallel never share files.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory whose name has `name` in it, for finding it after a failed run.
    pub fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("lsgd-host-data-{}-{n}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `name` (which may have folders in it, made as needed).
    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.mkdir_for(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Makes the folder `name` (and its parents) and returns its path.
    pub fn mkdir(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::create_dir_all(&path).unwrap();
        path
    }

    /// The path of `name`, with its parent folders made, for writers that want a path.
    pub fn mkdir_for(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    }

    /// Makes the FIFO `name`: a reader that opens it waits for a writer.
    pub fn fifo(&self, name: &str) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        let path = self.mkdir_for(name);
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
        assert_eq!(
            unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
            0,
            "mkfifo {name}"
        );
        path
    }

    /// The directory.
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

/// `bytes` as one gzip member.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// A `.npy` file's bytes (version 1): the header says `descr`, `fortran` and `shape`; `data`
/// is not checked against them, so lying headers can be made.
pub fn npy(descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {tuple}, }}");
    // NumPy pads the header with spaces and a newline to a multiple of 64 bytes.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// One entry of a zip made by [`zip`]: its content and how the headers describe it.
pub struct ZipEntry {
    /// The entry's name.
    pub name: String,
    /// The uncompressed content.
    pub content: Vec<u8>,
    /// 0 stored, 8 deflated; other methods are written as stored bytes under their number.
    pub method: u16,
    /// The general-purpose flags (bit 0: encrypted).
    pub flags: u16,
}

impl ZipEntry {
    /// A stored entry of `content`.
    pub fn stored(name: &str, content: Vec<u8>) -> Self {
        ZipEntry {
            name: name.to_string(),
            content,
            method: 0,
            flags: 0,
        }
    }

    /// A deflated entry of `content`, as `numpy.savez_compressed` writes.
    pub fn deflated(name: &str, content: Vec<u8>) -> Self {
        ZipEntry {
            method: 8,
            ..ZipEntry::stored(name, content)
        }
    }
}

/// A zip archive of `entries` written byte by byte (local headers, data, central directory,
/// end record), so tests can set what the zip crate would refuse to write.
pub fn zip(entries: &[ZipEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for e in entries {
        let data = if e.method == 8 {
            let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), Compression::default());
            enc.write_all(&e.content).unwrap();
            enc.finish().unwrap()
        } else {
            e.content.clone()
        };
        let mut crc = flate2::Crc::new();
        crc.update(&e.content);
        // version, flags, method, time, date, CRC-32, sizes, name length, extra length
        let mut common = Vec::new();
        for half in [20u16, e.flags, e.method, 0, 0] {
            common.extend(half.to_le_bytes());
        }
        for word in [crc.sum(), data.len() as u32, e.content.len() as u32] {
            common.extend(word.to_le_bytes());
        }
        common.extend((e.name.len() as u16).to_le_bytes());
        common.extend(0u16.to_le_bytes());
        let offset = out.len() as u32;
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(&common);
        out.extend(e.name.as_bytes());
        out.extend(&data);
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        central.extend(&common);
        // comment length, disk, internal and external attributes, local header offset
        central.extend([0u8; 10]);
        central.extend(offset.to_le_bytes());
        central.extend(e.name.as_bytes());
    }
    let start = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    let n = entries.len() as u16;
    out.extend(n.to_le_bytes());
    out.extend(n.to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(start.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// Fails unless `result` is an error whose message contains every one of `parts`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(result: Result<T, DataError>, parts: &[&str]) {
    let msg = result.unwrap_err().to_string();
    for part in parts {
        assert!(msg.contains(part), "{msg:?} lacks {part:?}");
    }
}
