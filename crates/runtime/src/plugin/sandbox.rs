//! What a plugin instance may touch: nothing. The store data behind every instance — an empty
//! WASI context with a fixed clock and seeded randomness (for toolchains that import WASI even
//! when the policy never uses it), a memory cap, and a capture of the guest's stderr (its last
//! 16 KiB, [`TailPipe`]) so that a panic message or an exception reaches the user's error report.
//! Waits on the fixed clock are over at once and never block the host (`super::waits`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

/// Length of one epoch tick of the engine's ticker; deadlines are whole numbers of ticks.
pub const TICK: Duration = Duration::from_millis(1);

/// Resource limits applied to every plugin instance.
///
/// A call's budget is counted in fuel (about one unit per WebAssembly instruction executed), so
/// it is the same on every rank whatever the machine's load; the wall-clock deadline is only a
/// backstop for what fuel does not count (a host engine compiled without fuel metering).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock backstop of one policy call, in milliseconds (setup and codec calls get
    /// [`SETUP_DEADLINE_FACTOR`] times it).
    pub deadline_ms: u64,
    /// Fuel of one policy call (learning-rate, global-batch, epsilon, multipliers).
    pub fuel: u64,
    /// Fuel of one codec call on top of its share per float, whatever the bucket's size.
    pub codec_fuel_base: u64,
    /// Fuel of one codec call per float it handles: the bucket's floats plus its input
    /// payloads' bytes / 4.
    pub codec_fuel_per_float: u64,
    /// Fuel of one setup call (instantiation, describe, configure, snapshot, restore,
    /// properties): language runtimes (Python, JavaScript) initialise there.
    pub setup_fuel: u64,
    /// Largest component file the host compiles, in bytes.
    pub max_component_bytes: u64,
    /// Seed of the guest's WASI randomness, so runs are reproducible.
    pub seed: u64,
}

/// Setup and codec calls get this many times the policy call's wall-clock backstop, and at
/// least [`SETUP_MIN_MS`].
pub const SETUP_DEADLINE_FACTOR: u64 = 100;
/// The least wall-clock backstop of a setup or codec call.
pub const SETUP_MIN_MS: u64 = 1_000;

/// Default fuel of a policy call: 64x the dearest reference call measured, the JavaScript
/// warmup's 155,893 units (Python's 58,789; Rust, C and Go 59 to 858).
pub const DEFAULT_FUEL: u64 = 10_000_000;
/// Default fixed part of a codec call's fuel: what a small bucket gets whatever its size.
pub const DEFAULT_CODEC_FUEL_BASE: u64 = 10_000_000;
/// Default fuel of a codec call per float: 25x the dearest reference codec measured, qsgd's
/// 78 units per float (fp16 72, terngrad 71, dgc 68, powersgd 13, top-k 12).
pub const DEFAULT_CODEC_FUEL_PER_FLOAT: u64 = 2_000;
/// Default fuel of a setup call: 1,700x the dearest measured, the Go warmup's 589,673 units
/// (JavaScript 289,663, Python 202,803, Rust about 23,000), and still under a second of a
/// guest that loops in `configure`.
pub const DEFAULT_SETUP_FUEL: u64 = 1_000_000_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            deadline_ms: 1_000,
            fuel: DEFAULT_FUEL,
            codec_fuel_base: DEFAULT_CODEC_FUEL_BASE,
            codec_fuel_per_float: DEFAULT_CODEC_FUEL_PER_FLOAT,
            setup_fuel: DEFAULT_SETUP_FUEL,
            max_component_bytes: 64 << 20,
            seed: 0,
        }
    }
}

impl Limits {
    /// The fuel of a codec call that handles `floats` floats.
    pub fn codec_fuel(&self, floats: u64) -> u64 {
        self.codec_fuel_base
            .saturating_add(self.codec_fuel_per_float.saturating_mul(floats))
    }

    /// The wall-clock backstop of a policy call, or of a setup or codec call (`long`), in ms.
    pub fn deadline_ms(&self, long: bool) -> u64 {
        if long {
            self.deadline_ms
                .saturating_mul(SETUP_DEADLINE_FACTOR)
                .max(SETUP_MIN_MS)
        } else {
            self.deadline_ms
        }
    }
}

/// How much of the guest's stderr is kept: its last bytes, so a runaway printer cannot eat host
/// memory, and what it wrote last (a panic) is what a fault shows.
const STDERR_CAPACITY: usize = 16 << 10;

/// Fixed instant the guest's wall clock reports: 2017-06-08, the day Goyal et al. appeared.
const FIXED_WALL_CLOCK: Duration = Duration::from_secs(1_496_880_000);

/// The data every plugin `Store` carries.
pub struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    memory: MemoryCap,
    stderr: TailPipe,
}

impl Sandbox {
    /// An empty sandbox: no files, environment, arguments or network.
    pub fn new(limits: &Limits) -> Self {
        let stderr = TailPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone())
            .wall_clock(FixedClock)
            .monotonic_clock(FixedClock)
            .secure_random(StdRng::seed_from_u64(limits.seed))
            .insecure_random(StdRng::seed_from_u64(limits.seed ^ 0x9e37_79b9_7f4a_7c15))
            .insecure_random_seed(u128::from(limits.seed))
            // wasmtime-wasi's defaults, said here because the waits of `super::waits` count on
            // them: no socket is ever created, so none can be waited on.
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .allow_blocking_current_thread(true);
        Sandbox {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            memory: MemoryCap {
                cap: limits.memory_bytes,
                exceeded: None,
            },
            stderr,
        }
    }

    /// The limiter wasmtime consults before any memory or table grows.
    pub fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.memory
    }

    /// The size the guest asked for when it hit the memory cap, if it did.
    pub fn memory_cap_hit(&self) -> Option<usize> {
        self.memory.exceeded
    }

    /// The last of what the guest wrote to stderr, lossily decoded (from the first whole line
    /// when older output was dropped).
    pub fn stderr(&self) -> String {
        self.stderr.text()
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A clock that never moves: policies must not depend on time.
struct FixedClock;

impl HostWallClock for FixedClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        FIXED_WALL_CLOCK
    }
}

impl HostMonotonicClock for FixedClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Refuses growth past the cap and remembers that it did, so the error can say so plainly.
struct MemoryCap {
    cap: usize,
    exceeded: Option<usize>,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.cap {
            self.exceeded = Some(desired);
            wasmtime::bail!("memory cap of {} bytes exceeded", self.cap);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold function references; a policy never needs millions of them.
        Ok(desired <= 1 << 20)
    }
}

/// A guest's stderr that keeps the last `capacity` bytes written and never refuses a write: a
/// plugin that logs every step keeps running (wasmtime's own memory pipe closes once full, and a
/// Rust guest's `eprintln!` then panics), and its last words are what a fault shows.
#[derive(Clone)]
pub struct TailPipe {
    capacity: usize,
    /// The bytes kept, and whether older ones were dropped.
    kept: Arc<Mutex<(VecDeque<u8>, bool)>>,
}

impl TailPipe {
    /// An empty pipe keeping at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        TailPipe {
            capacity,
            kept: Arc::new(Mutex::new((VecDeque::new(), false))),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut kept = self.kept.lock().expect("no writer panics holding it");
        let (buffer, dropped) = &mut *kept;
        buffer.extend(bytes);
        let excess = buffer.len().saturating_sub(self.capacity);
        if excess > 0 {
            buffer.drain(..excess);
            *dropped = true;
        }
    }

    /// What is kept, lossily decoded; when older output was dropped, from the first line that
    /// is whole.
    pub fn text(&self) -> String {
        let kept = self.kept.lock().expect("no writer panics holding it");
        let (buffer, dropped) = &*kept;
        let bytes: Vec<u8> = buffer.iter().copied().collect();
        let start = match dropped {
            true => bytes.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1),
            false => 0,
        };
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

impl IsTerminal for TailPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailPipe {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

impl OutputStream for TailPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Any amount: what does not fit pushes the oldest bytes out.
        Ok(self.capacity.max(4096))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for TailPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_pipe_keeps_the_last_bytes_from_a_whole_line_and_never_refuses() {
        let mut pipe = TailPipe::new(16);
        pipe.write(bytes::Bytes::from_static(b"first\n")).unwrap();
        assert_eq!(pipe.text(), "first\n");
        for _ in 0..100 {
            pipe.write(bytes::Bytes::from_static(b"log line\n"))
                .unwrap();
        }
        pipe.write(bytes::Bytes::from_static(b"panic: x\n"))
            .unwrap();
        assert!(pipe.check_write().unwrap() > 0);
        assert_eq!(pipe.text(), "panic: x\n");
    }
}
