//! On-disk cache of compiled components. Compiling a component takes from tens of milliseconds
//! (Rust guests) to seconds (Python guests); loading the serialised machine code takes a few
//! milliseconds. Entries are keyed on the component's content hash and on the engine's
//! compatibility hash (wasmtime version, target, compiler settings), so a changed plugin or a
//! new host never picks up stale code. Beside each entry, `<entry>.ms` keeps how long the
//! compilation took, so `inspect` can report it without compiling again.
//!
//! A compilation still running after [`NOTICE_AFTER`] says so on stderr ("compiling … (first
//! use; cached afterwards)"): a Python plugin takes ~15 s on first use, which would otherwise
//! look like a hang.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

/// A compilation that takes longer than this is announced on stderr while it runs.
pub const NOTICE_AFTER: Duration = Duration::from_secs(1);

/// How a component was obtained, for `inspect` and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Origin {
    /// Compiled now (and written to the cache when one is configured).
    Compiled(Duration),
    /// Deserialised from the cache.
    Cached(Duration),
}

/// A directory of serialised components.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: Option<PathBuf>,
}

impl Cache {
    /// The cache at `dir`; `None` disables caching.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Cache { dir }
    }

    /// `$LSGD_CACHE_DIR`, else `$XDG_CACHE_HOME/lsgd-host`, else `~/.cache/lsgd-host`.
    /// `LSGD_CACHE_DIR=off` disables caching.
    pub fn from_env() -> Self {
        let dir = match std::env::var_os("LSGD_CACHE_DIR") {
            Some(d) if d == "off" => None,
            Some(d) => Some(PathBuf::from(d)),
            None => std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
                .map(|d| d.join("lsgd-host")),
        };
        Cache { dir }
    }

    /// The directory entries live in, if caching is on.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Loads `bytes` from the cache or compiles (and caches) it; `label` (the plugin's file)
    /// names it in the notice of a slow compilation.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        label: &str,
    ) -> wasmtime::Result<(Component, Origin)> {
        let Some(entry) = self.entry_path(engine, bytes) else {
            return compile(engine, bytes, label, "caching is off: LSGD_CACHE_DIR=off");
        };
        if entry.exists() {
            let start = Instant::now();
            // SAFETY: deserialisation trusts the file to be machine code that wasmtime wrote.
            // Only this cache writes these names, keyed on the engine's compatibility hash, and
            // wasmtime re-checks the header; an entry that fails to load is recompiled below.
            if let Ok(c) = unsafe { Component::deserialize_file(engine, &entry) } {
                return Ok((c, Origin::Cached(start.elapsed())));
            }
        }
        let (component, origin) = compile(engine, bytes, label, "cached afterwards")?;
        // A cache that cannot be written only costs time, never correctness.
        if let Ok(serialized) = component.serialize()
            && write_atomically(&entry, &serialized).is_ok()
            && let Origin::Compiled(took) = origin
        {
            let _ = write_atomically(
                &timing_path(&entry),
                format!("{:.3}", took.as_secs_f64() * 1e3).as_bytes(),
            );
        }
        Ok((component, origin))
    }

    /// How long `bytes` took to compile when it was cached, if the cache holds it and recorded
    /// that (entries written before the time was kept have none).
    pub fn compile_time(&self, engine: &Engine, bytes: &[u8]) -> Option<Duration> {
        let entry = self.entry_path(engine, bytes)?;
        let ms: f64 = std::fs::read_to_string(timing_path(&entry))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (ms.is_finite() && ms >= 0.0).then(|| Duration::from_secs_f64(ms / 1e3))
    }

    fn entry_path(&self, engine: &Engine, bytes: &[u8]) -> Option<PathBuf> {
        let dir = self.dir.as_ref()?;
        let mut h = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let content = blake3::hash(bytes).to_hex();
        Some(dir.join(format!("{}-{:016x}.cwasm", &content[..32], h.finish())))
    }
}

/// The file beside `entry` that holds its compile time in milliseconds.
fn timing_path(entry: &Path) -> PathBuf {
    let mut name = entry.as_os_str().to_owned();
    name.push(".ms");
    PathBuf::from(name)
}

/// Compiles `bytes`; if that takes over [`NOTICE_AFTER`], says so on stderr while it runs
/// (`then` says what happens to the result: cached or not).
fn compile(
    engine: &Engine,
    bytes: &[u8],
    label: &str,
    then: &str,
) -> wasmtime::Result<(Component, Origin)> {
    let start = Instant::now();
    let (done, finished) = mpsc::channel::<()>();
    let c = std::thread::scope(|scope| {
        scope.spawn(move || {
            if finished.recv_timeout(NOTICE_AFTER) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!(
                    "compiling {label} ({:.1} MiB; first use, {then}) …",
                    bytes.len() as f64 / f64::from(1 << 20)
                );
            }
        });
        let c = Component::new(engine, bytes);
        let _ = done.send(());
        c
    })?;
    Ok((c, Origin::Compiled(start.elapsed())))
}

/// Writes via a temporary file and rename, so a concurrent reader (another rank) never sees a
/// half-written entry.
fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache entries live in a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand_suffix()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn rand_suffix() -> u64 {
    let mut h = DefaultHasher::new();
    Instant::now().hash(&mut h);
    std::thread::current().id().hash(&mut h);
    h.finish()
}
