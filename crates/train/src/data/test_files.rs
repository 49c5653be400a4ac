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

/// Fails unless `result` is an error whose message contains every one of `parts`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(result: Result<T, DataError>, parts: &[&str]) {
    let msg = result.unwrap_err().to_string();
    for part in parts {
        assert!(msg.contains(part), "{msg:?} lacks {part:?}");
    }
}
