//! A plugin that waits, on the clock or in `wasi:io/poll`, cannot hold the host: the sandbox's
//! clock stands still, so a wait is over as soon as it starts, and a plugin that waits for the
//! clock to move loops until its fuel or the wall-clock backstop stops it, like any other loop.
//! Each case runs under a bound, so that a wait which blocks the host fails the test instead of
//! hanging the suite.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use lsgd_host::plugin::{Fault, Limits};

use crate::common::*;

/// Far above what any call here takes (milliseconds), and below the 20 s of `mode=sleep`.
const BOUND: Duration = Duration::from_secs(10);

/// What `f` returns, run on a thread of its own; fails the test if it has not returned within
/// [`BOUND`]. (A call blocked in the host cannot be stopped: its thread is left behind.)
fn within<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    match rx.recv_timeout(BOUND) {
        Ok(r) => r,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: still blocked after {BOUND:?}"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

#[test]
fn a_sleep_takes_no_time_on_the_fixed_clock_and_stdin_is_at_its_end() {
    let values = within("a 20 s sleep, a read of stdin", || {
        let rt = runtime();
        let state = clock(1, 10, 256).state();
        ["sleep", "stdin"].map(|mode| {
            let mut p = load(&rt, "bad-schedule", &[("mode", mode)]).unwrap();
            p.call(&state).unwrap().as_f64()
        })
    });
    // The guest's monotonic clock reads the same before and after the sleep.
    assert_eq!(values, [0.0, 0.0], "[seconds slept, bytes read]");
}

#[test]
fn waiting_for_the_clock_to_move_runs_out_of_fuel_and_the_plugin_recovers() {
    let outcomes = within("sleeping, polling, waiting", || {
        let rt = runtime_with(Limits {
            fuel: 2_000_000,
            ..Limits::default()
        });
        let state = clock(1, 10, 256).state();
        ["sleeping", "polling", "waiting"].map(|mode| {
            let mut p = load(&rt, "bad-schedule", &[("mode", mode)]).unwrap();
            let e = p.call(&state).unwrap_err();
            p.configure(&owned(&[("mode", "ok")])).unwrap();
            (mode, e, p.call(&state).unwrap().as_f64())
        })
    });
    for (mode, e, after) in outcomes {
        assert_eq!(
            e.fault,
            Fault::Fuel {
                units: 2_000_000,
                remedy: "raise it with --plugin-fuel"
            },
            "{mode}: {e}"
        );
        assert!(
            e.to_string().contains(
                "bad-schedule.wasm: learning-rate at step 0: ran out of its 2000000-unit fuel \
                 budget"
            ),
            "{mode}: {e}"
        );
        assert_eq!(after, 0.1, "{mode}: a fresh instance works");
    }
}

#[test]
fn the_wall_clock_backstop_stops_a_plugin_that_sleeps_without_end() {
    let e = within("sleeping without fuel", || {
        let rt = runtime_with(Limits {
            fuel: 1 << 60,
            deadline_ms: 20,
            ..Limits::default()
        });
        let mut p = load(&rt, "bad-schedule", &[("mode", "sleeping")]).unwrap();
        p.call(&clock(1, 10, 256).state()).unwrap_err()
    });
    assert_eq!(e.fault, Fault::Deadline { ms: 20 }, "{e}");
}

#[test]
fn trace_stops_a_sleeping_schedule_with_its_fault() {
    let dir = scratch("trace-sleeping");
    let args = [
        "trace",
        "--schedule",
        "bad-schedule",
        "--set",
        "schedule.mode=sleeping",
        // A small budget, so that fuel, not the 1 s backstop, stops it even on a loaded
        // machine: a sleep's host calls make its fuel last longer than a plain loop's.
        "--plugin-fuel",
        "1000000",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "4",
        "--global-batch",
        "256",
    ]
    .map(String::from);
    let mut child = spawn_logged(env!("CARGO_BIN_EXE_lsgd-host"), &args, &dir);
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    let status = status.unwrap_or_else(|| panic!("trace still running after 30 s\n{stderr}"));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "bad-schedule.wasm: learning-rate at step 0: ran out of its 1000000-unit fuel budget"
        ),
        "{stderr}"
    );
}
