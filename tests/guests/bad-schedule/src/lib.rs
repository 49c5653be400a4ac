//! Test guest: a schedule that misbehaves on request, so the host's sandbox (deadline, memory
//! cap, trap recovery, output validation, configure errors) can be tested against a real component.

wit_bindgen::generate!({ path: "../../../wit/v0.1.0", world: "schedule-plugin" });

use lsgd_policy::{Info, ParamSpec, Params, Policy, Schedule, State};
use std::hint::black_box;
use std::io::Read;
use std::time::{Duration, Instant};

/// What `learning_rate` does; `reject` never gets this far because `configure` fails.
#[derive(Clone, Copy)]
enum Mode {
    Ok,
    Trap,
    Loop,
    Grow,
    Nan,
    Negative,
    Infinite,
    Clock,
    Env,
    File,
    Recurse,
    Leak,
    Sleep,
    Sleeping,
    Polling,
    Waiting,
    Stdin,
}

/// The misbehaving schedule.
struct BadSchedule {
    mode: Mode,
    /// Behave (return 0.1) before this step, so a fault can strike mid-training.
    from_step: u64,
    /// Behave again from this step on, so a run can recover from a burst of faults.
    until_step: u64,
}

impl Policy for BadSchedule {
    fn info() -> Info {
        Info::new(
            "bad-schedule",
            "Test guest: returns 0.1, or traps, loops, exhausts memory or returns NaN/-1/inf",
            vec![
                ParamSpec::choice(
                    "mode",
                    &[
                        "ok", "trap", "loop", "grow", "nan", "negative", "infinite", "reject",
                        "clock", "env", "file", "recurse", "leak", "sleep", "sleeping", "polling",
                        "waiting", "stdin",
                    ],
                    "misbehaviour: ok (0.1), trap, loop, grow, nan, negative, infinite, reject \
                 (configure fails), recurse (unbounded recursion: stack overflow), leak (keeps \
                 64 KiB more at every call, returns 0.1 until the memory cap stops it), \
                 sleeping (sleeps an hour at a time without end), polling (poll() with a \
                 24-day timeout without end), waiting (spins until the monotonic clock moves \
                 1 s); sandbox probes: clock (wall-clock seconds), env (number of environment \
                 variables and arguments), file (1 if /etc/hostname is readable), sleep \
                 (monotonic seconds a 20 s sleep took), stdin (bytes read from stdin to its end)",
                ),
                ParamSpec::integer(
                    "from_step",
                    0,
                    "misbehave from this step on; return 0.1 before it",
                ),
                ParamSpec::integer(
                    "until_step",
                    -1,
                    "return 0.1 again from this step on (-1: never)",
                ),
            ],
        )
    }

    fn configure(p: &Params) -> Result<Self, String> {
        let mode = match p.text("mode")? {
            "ok" => Mode::Ok,
            "trap" => Mode::Trap,
            "loop" => Mode::Loop,
            "grow" => Mode::Grow,
            "nan" => Mode::Nan,
            "negative" => Mode::Negative,
            "infinite" => Mode::Infinite,
            "clock" => Mode::Clock,
            "env" => Mode::Env,
            "file" => Mode::File,
            "recurse" => Mode::Recurse,
            "leak" => Mode::Leak,
            "sleep" => Mode::Sleep,
            "sleeping" => Mode::Sleeping,
            "polling" => Mode::Polling,
            "waiting" => Mode::Waiting,
            "stdin" => Mode::Stdin,
            "reject" => return Err("bad-schedule rejects its parameters".to_owned()),
            other => return Err(format!("mode must be a listed word, got '{other}'")),
        };
        let from_step = u64::try_from(p.integer("from_step")?)
            .map_err(|_| "from_step must be >= 0".to_owned())?;
        let until_step = u64::try_from(p.integer("until_step")?).unwrap_or(u64::MAX);
        Ok(BadSchedule {
            mode,
            from_step,
            until_step,
        })
    }
}

impl Schedule for BadSchedule {
    fn learning_rate(&self, s: &State) -> f64 {
        if s.step < self.from_step || s.step >= self.until_step {
            return 0.1;
        }
        match self.mode {
            Mode::Ok => 0.1,
            Mode::Trap => panic!("bad-schedule traps on purpose"),
            Mode::Loop => spin(),
            Mode::Grow => hoard(),
            Mode::Nan => f64::NAN,
            Mode::Negative => -1.0,
            Mode::Infinite => f64::INFINITY,
            Mode::Clock => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(-1.0, |d| d.as_secs_f64()),
            Mode::Env => (std::env::vars_os().count() + std::env::args_os().count()) as f64,
            Mode::File => f64::from(u8::from(std::fs::read("/etc/hostname").is_ok())),
            Mode::Recurse => descend(black_box(1)),
            Mode::Leak => {
                LEAKED.with_borrow_mut(|l| l.push(black_box(vec![0x5Au8; 64 << 10])));
                0.1
            }
            Mode::Sleep => {
                let start = Instant::now();
                std::thread::sleep(Duration::from_secs(20));
                start.elapsed().as_secs_f64()
            }
            Mode::Sleeping => loop {
                std::thread::sleep(Duration::from_secs(3_600));
            },
            Mode::Polling => loop {
                // wasi-libc's poll(2), which Rust's std links: no descriptors, the longest
                // timeout (24.8 days). SAFETY: with nfds 0 the descriptor pointer is never read.
                unsafe { poll(std::ptr::null_mut(), 0, i32::MAX) };
            },
            Mode::Waiting => {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(1) {}
                0.1
            }
            Mode::Stdin => {
                let mut input = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut input)
                    .map_or(-1.0, |n| n as f64)
            }
        }
    }
}

unsafe extern "C" {
    /// poll(2) of wasi-libc: waits on a clock subscription in `wasi:io/poll`.
    fn poll(fds: *mut std::ffi::c_void, nfds: usize, timeout_ms: i32) -> i32;
}

/// Never returns; black_box keeps the optimiser from proving the loop side-effect free.
fn spin() -> ! {
    let mut n = 0u64;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

thread_local! {
    /// What `leak` keeps across calls: the instance's memory only grows.
    static LEAKED: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Recurses without end; the frame's array and black_box keep it from becoming a loop.
fn descend(depth: u64) -> f64 {
    let frame = black_box([depth; 16]);
    // Never true at runtime; it only makes the recursion conditional for the compiler.
    if black_box(depth) == 0 {
        return 0.0;
    }
    descend(black_box(frame[depth as usize % 16] + 1)) + 1.0
}

/// Allocates and writes 1 MiB chunks until the allocator fails, which the host's memory cap
/// must turn into a trap.
fn hoard() -> ! {
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut chunk = Vec::with_capacity(1 << 20);
        chunk.resize(1 << 20, 0xA5u8);
        chunks.push(black_box(chunk));
    }
}

lsgd_policy::export_schedule!(BadSchedule);
