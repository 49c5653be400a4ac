//! The property-test driver shared by `plugins/lsgd-codec/tests/fuzz.rs` and
//! `tests/all/fuzz.rs` (included there by path), and the allocation meter behind the "never
//! allocates what the input claims" checks.
//!
//! By default a target runs a fixed number of cases from a fixed seed, so `scripts/test.sh`
//! stays quick and reproducible (`PROPTEST_CASES` overrides the number). With
//! `LSGD_FUZZ_SECONDS` set (`scripts/fuzz.sh`), it draws fresh seeds until that many seconds
//! have passed, collects every failure (shrunk, with its seed), and prints one summary line
//! per target: `fuzz TARGET: N cases in S s, F failures`. A case that runs longer than
//! `LSGD_FUZZ_HANG_SECONDS` (default 120) aborts the process naming the target and seed: a hang.
//! `LSGD_FUZZ_SEED` (hex) replays one seed.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt::Debug;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// The system allocator, recording the largest single request of each thread.
pub struct Metered;

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note(bytes: usize) {
    // try_with: allocations during thread teardown find no slot and are not metered.
    let _ = PEAK.try_with(|p| p.set(p.get().max(bytes)));
}

// SAFETY: every call is forwarded unchanged to `System`; `note` neither allocates nor unwinds.
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// `f()` and the largest single allocation it made on this thread, in bytes.
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let before = PEAK.with(|p| p.replace(0));
    let out = f();
    let peak = PEAK.with(|p| p.replace(before.max(p.get())));
    (out, peak)
}

/// Fails the case unless `cond`, with the message `what()`.
pub fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if cond {
        Ok(())
    } else {
        Err(TestCaseError::fail(what()))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Runs the property `test` over `strategy` as the module doc says; `quick` is the default
/// number of cases. Panics listing every failure.
pub fn fuzz<S>(
    target: &str,
    quick: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let budget = env_u64("LSGD_FUZZ_SECONDS").map(Duration::from_secs);
    let replay = std::env::var("LSGD_FUZZ_SEED")
        .ok()
        .map(|s| u64::from_str_radix(s.trim(), 16).expect("LSGD_FUZZ_SEED is hex"));
    let hang = Duration::from_secs(env_u64("LSGD_FUZZ_HANG_SECONDS").unwrap_or(120));
    let cases = AtomicU64::new(0);
    let start = Instant::now();

    // The watchdog: `progress` is the milliseconds since `start` at which the current case
    // began; a case older than `hang` aborts, since a hung case cannot be unwound.
    let progress = Arc::new(AtomicU64::new(0));
    let seed_now = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let (progress, seed_now, done) = (progress.clone(), seed_now.clone(), done.clone());
        let target = target.to_owned();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let began = Duration::from_millis(progress.load(Ordering::Relaxed));
                if start.elapsed().saturating_sub(began) > hang && !done.load(Ordering::Relaxed) {
                    eprintln!(
                        "fuzz {target}: a case has run for over {} s (LSGD_FUZZ_SEED={:x}): a hang",
                        hang.as_secs(),
                        seed_now.load(Ordering::Relaxed)
                    );
                    std::process::abort();
                }
            }
        })
    };
    let counted = |v: S::Value| {
        progress.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        cases.fetch_add(1, Ordering::Relaxed);
        test(v)
    };

    let mut failures = Vec::new();
    let mut round = 0u64;
    loop {
        let seed = match (replay, budget) {
            (Some(s), _) => s,
            // Fixed: the quick run is the same every time.
            (None, None) => 0x15d_f022,
            (None, Some(_)) => RandomState::new().hash_one(round),
        };
        seed_now.store(seed, Ordering::Relaxed);
        let config = Config {
            cases: match budget {
                Some(_) => 256,
                None => env_u64("PROPTEST_CASES").map_or(quick, |n| n as u32),
            },
            failure_persistence: None,
            max_shrink_iters: 2048,
            ..Config::default()
        };
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
        let mut runner = TestRunner::new_with_rng(config, rng);
        match runner.run(&strategy, counted) {
            Ok(()) => {}
            Err(TestError::Fail(why, input)) => {
                let line = format!("LSGD_FUZZ_SEED={seed:x}: {why}\n    input: {input:?}");
                eprintln!("fuzz {target}: FAILURE {line}");
                failures.push(line);
            }
            Err(e) => failures.push(format!("LSGD_FUZZ_SEED={seed:x}: {e}")),
        }
        round += 1;
        let over = match budget {
            Some(b) => start.elapsed() >= b,
            None => true,
        };
        if over || replay.is_some() {
            break;
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    eprintln!(
        "fuzz {target}: {} cases in {:.1} s, {} failures",
        cases.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "fuzz {target} found {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
