//! What a plugin instance may touch: nothing. The store data behind every instance — an empty
//! WASI context with a fixed clock and seeded randomness (for toolchains that import WASI even
//! when the policy never uses it), a memory cap, and a capture of the guest's stderr so that a
//! panic message reaches the user's error report.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

/// Length of one epoch tick of the engine's ticker; deadlines are whole numbers of ticks.
pub const TICK: Duration = Duration::from_millis(1);

/// Resource limits applied to every plugin instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock budget of one call, in milliseconds.
    pub deadline_ms: u64,
    /// Seed of the guest's WASI randomness, so runs are reproducible.
    pub seed: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            deadline_ms: 10,
            seed: 0,
        }
    }
}

/// Keeps the last bytes of guest stderr; a runaway printer cannot eat host memory.
const STDERR_CAPACITY: usize = 16 << 10;

/// Fixed instant the guest's wall clock reports: 2017-06-08, the day Goyal et al. appeared.
const FIXED_WALL_CLOCK: Duration = Duration::from_secs(1_496_880_000);

/// The data every plugin `Store` carries.
pub struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    memory: MemoryCap,
    stderr: MemoryOutputPipe,
}

impl Sandbox {
    /// An empty sandbox: no files, environment, arguments or network.
    pub fn new(limits: &Limits) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stderr(stderr.clone())
            .wall_clock(FixedClock)
            .monotonic_clock(FixedClock)
            .secure_random(StdRng::seed_from_u64(limits.seed))
            .insecure_random(StdRng::seed_from_u64(limits.seed ^ 0x9e37_79b9_7f4a_7c15))
            .insecure_random_seed(u128::from(limits.seed))
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

    /// What the guest wrote to stderr so far, lossily decoded.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents()).into_owned()
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
