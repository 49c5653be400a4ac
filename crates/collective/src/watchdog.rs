//! The collective watchdog: ends a rank that has made no progress in one MPI call for
//! `--collective-timeout`, naming the rank and host it waits on, so a lost link never hangs a job.
//!
//! Open MPI waits as long as TCP does on a link that died without a reset (~15 minutes), and
//! `mpirun` then ignores SIGTERM. So every blocking call of [`crate::World`] marks what it is in
//! and, at each point-to-point step, whom it waits on, in two atomics (no lock, no allocation:
//! a few nanoseconds against a message's microseconds). A thread started by
//! [`crate::World::set_collective_timeout`] reads them; when one call has made no progress for
//! the timeout it prints one [`Report`] line, waits [`linger`] so that the other ranks stuck on
//! the same peer can say so too, and ends the process with `_exit` ([`EXIT_CODE`]): the main
//! thread is inside MPI, and `exit` would run finalizers that wait for it.
//!
//! The report is for people and for `lsgd-host launch`, which reads it back with
//! [`Report::parse`]: the ranks that did not report are the ones lost.

use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use crate::Algorithm;

/// The exit status of a rank the watchdog ends (EX_TEMPFAIL: the job may succeed again
/// without the peer it waited on).
pub const EXIT_CODE: i32 = 75;

/// How every report line begins.
pub const PREFIX: &str = "error: collective timeout: ";

/// What a marked call is doing; its index in [`OPS`] is what the state word holds.
const OPS: [&str; 16] = [
    "",
    "MPI_Allreduce",
    "ring all-reduce",
    "halving-doubling all-reduce",
    "binary-blocks all-reduce",
    "torus2d all-reduce",
    "hierarchical all-reduce",
    "all-gather",
    "max all-reduce",
    "broadcast",
    "barrier",
    "send",
    "receive",
    "wait for a message",
    "agreement",
    "shrink",
];

/// A blocking call of [`crate::World`], as the watchdog names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Op(u8);

impl Op {
    pub(crate) const ALL_GATHER: Op = Op(7);
    pub(crate) const MAX: Op = Op(8);
    pub(crate) const BROADCAST: Op = Op(9);
    pub(crate) const BARRIER: Op = Op(10);
    pub(crate) const SEND: Op = Op(11);
    pub(crate) const RECEIVE: Op = Op(12);
    pub(crate) const WAIT: Op = Op(13);
    pub(crate) const AGREE: Op = Op(14);
    pub(crate) const SHRINK: Op = Op(15);

    /// The all-reduce of `algo`.
    pub(crate) fn all_reduce(algo: Algorithm) -> Op {
        let i = Algorithm::ALL.iter().position(|a| *a == algo);
        Op(1 + i.expect("ALL lists every algorithm") as u8)
    }

    fn name(self) -> &'static str {
        OPS.get(usize::from(self.0))
            .copied()
            .unwrap_or("collective")
    }
}

/// The peer field's value for "no single rank" (MPI's own collectives, a wait on several).
const UNKNOWN: u64 = 0xFFFF;

/// One word, so that a reader never sees a call's start time with another call's name:
/// bits 0–15 the peer (its rank in the communicator the `comm` field names), 16–23 the
/// [`Op`] (0: in no call), 24–63 milliseconds since [`epoch`] at the last progress.
fn pack(since_ms: u64, op: Op, peer: Option<usize>) -> u64 {
    let peer = peer.map_or(UNKNOWN, |p| (p as u64).min(UNKNOWN));
    since_ms << 24 | u64::from(op.0) << 16 | peer
}

/// A call stuck past the timeout, as read from a [`Watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stall {
    op: Op,
    /// The communicator's handle (0: the world) and the peer's rank in it.
    peer: Option<(usize, usize)>,
    stuck_ms: u64,
}

/// What this rank's MPI calls are doing, written by the thread that calls MPI and read by the
/// watchdog thread.
pub(crate) struct Watch {
    word: AtomicU64,
    comm: AtomicUsize,
}

impl Watch {
    const fn new() -> Watch {
        Watch {
            word: AtomicU64::new(0),
            comm: AtomicUsize::new(0),
        }
    }

    /// A call begins at `now_ms`, waiting on `peer` of the world (or on no single rank).
    fn enter_at(&self, op: Op, peer: Option<usize>, now_ms: u64) {
        self.comm.store(0, SeqCst);
        self.word.store(pack(now_ms, op, peer), SeqCst);
    }

    /// The call has moved on (a point-to-point step began): it now waits on `peer` of the
    /// communicator `comm`. Outside a marked call (a benchmark calling an algorithm directly)
    /// nothing is marked.
    fn progress_at(&self, comm: usize, peer: usize, now_ms: u64) {
        let op = Op((self.word.load(SeqCst) >> 16) as u8);
        if op.0 == 0 {
            return;
        }
        self.comm.store(comm, SeqCst);
        self.word.store(pack(now_ms, op, Some(peer)), SeqCst);
    }

    fn leave(&self) {
        self.word.store(0, SeqCst);
    }

    /// The call in progress, when it has made no progress for `timeout_ms` at `now_ms`,
    /// counting from `running_since_ms` at the earliest (the end of a pause of this process).
    fn stalled_at(&self, now_ms: u64, timeout_ms: u64, running_since_ms: u64) -> Option<Stall> {
        let word = self.word.load(SeqCst);
        let comm = self.comm.load(SeqCst);
        // A step that began between the two loads may have changed `comm`: it is progress.
        if self.word.load(SeqCst) != word {
            return None;
        }
        let op = Op((word >> 16) as u8);
        let stuck_ms = now_ms.saturating_sub((word >> 24).max(running_since_ms));
        if op.0 == 0 || stuck_ms < timeout_ms {
            return None;
        }
        let peer = word & UNKNOWN;
        Some(Stall {
            op,
            peer: (peer != UNKNOWN).then_some((comm, peer as usize)),
            stuck_ms,
        })
    }
}

/// This process's state: one rank, one thread in MPI.
static WATCH: Watch = Watch::new();
/// Whether calls are marked (a timeout is set); unmarked calls cost one relaxed load.
static ENABLED: AtomicBool = AtomicBool::new(false);
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(0);
static THREAD: OnceLock<()> = OnceLock::new();
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// What a report needs besides the stall; set at start-up and at checkpoints, read once.
struct Context {
    rank: usize,
    hosts: Vec<String>,
    /// Sub-communicators' handles and the world rank of each of their ranks.
    comms: Vec<(usize, Vec<usize>)>,
    /// The newest checkpoint's step and the directory to resume from.
    checkpoint: Option<(u64, PathBuf)>,
}

static CONTEXT: Mutex<Context> = Mutex::new(Context {
    rank: 0,
    hosts: Vec::new(),
    comms: Vec::new(),
    checkpoint: None,
});

fn context() -> std::sync::MutexGuard<'static, Context> {
    // The context is plain data: a panic elsewhere while it was held leaves it usable.
    CONTEXT.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Marks this rank as inside `op` until the returned guard drops.
#[must_use = "the call is marked until the guard drops"]
pub(crate) struct Busy(());

/// Marks the start of a blocking call waiting on world rank `peer` (`None`: no single rank).
pub(crate) fn enter(op: Op, peer: Option<usize>) -> Busy {
    if ENABLED.load(std::sync::atomic::Ordering::Relaxed) {
        WATCH.enter_at(op, peer, now_ms());
    }
    Busy(())
}

impl Drop for Busy {
    fn drop(&mut self) {
        if ENABLED.load(std::sync::atomic::Ordering::Relaxed) {
            WATCH.leave();
        }
    }
}

/// Marks progress inside a call: the next point-to-point step waits on rank `peer` of `comm`.
pub(crate) fn progress(comm: &SimpleCommunicator, peer: usize) {
    if ENABLED.load(std::sync::atomic::Ordering::Relaxed) {
        WATCH.progress_at(handle(comm), peer, now_ms());
    }
}

/// A communicator's MPI handle as a number (a pointer in Open MPI, an int in MPICH): what
/// tells a sub-communicator's ranks from the world's in a report.
fn handle(comm: &SimpleCommunicator) -> usize {
    let raw = comm.as_raw();
    let mut bytes = [0u8; size_of::<usize>()];
    let n = size_of_val(&raw).min(bytes.len());
    // SAFETY: reads the first `n` bytes of `raw`, a plain handle of at least `n` bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(&raw).cast::<u8>(), bytes.as_mut_ptr(), n)
    };
    usize::from_ne_bytes(bytes)
}

/// Records this rank and every rank's host, for the report.
pub(crate) fn set_ranks(rank: usize, hosts: Vec<String>) {
    let mut c = context();
    c.rank = rank;
    c.hosts = hosts;
}

/// Records which world rank each rank of the sub-communicator `comm` is, so that a report
/// names world ranks (`world_ranks[i]` is rank i of `comm`).
pub(crate) fn register(comm: &SimpleCommunicator, world_ranks: Vec<usize>) {
    let handle = handle(comm);
    let mut c = context();
    // A freed communicator's handle may come back for a new one.
    c.comms.retain(|(h, _)| *h != handle);
    c.comms.push((handle, world_ranks));
}

/// Records the newest checkpoint of the run (its step, and the directory or file that
/// `--resume` continues it from), which the report names.
pub fn note_checkpoint(step: u64, resume_from: &Path) {
    context().checkpoint = Some((step, resume_from.to_path_buf()));
}

/// How long a rank that reported waits before it ends: long enough for the other ranks stuck
/// on the same peer, which entered their calls up to a step later, to report too (once one
/// rank ends, mpirun ends the others). `launch` waits this long, and a margin, for them.
pub fn linger(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(15))
}

/// Sets the timeout (zero: off) and starts the watchdog thread on first use.
pub(crate) fn start(timeout: Duration) {
    let ms = timeout.as_millis().min(u128::from(u64::MAX >> 24)) as u64;
    TIMEOUT_MS.store(ms, SeqCst);
    ENABLED.store(ms > 0, SeqCst);
    if ms == 0 {
        return;
    }
    now_ms();
    THREAD.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("collective-watchdog".into())
            .spawn(watch);
        if let Err(e) = spawned {
            eprintln!("warning: no collective watchdog ({e}): a lost peer may hang this rank");
        }
    });
}

/// When this process last came back from a pause, from the watchdog's wakes: one far later
/// than its poll asked for is time the process did not run (a SIGSTOP, which mpirun ends with
/// SIGCONT when it tears a job down; a suspended machine). No peer was silent then, so a stall
/// counts from the wake: a frozen rank that is continued does not report its peer.
struct Pauses {
    last_ms: u64,
    running_since_ms: u64,
}

impl Pauses {
    /// Records a wake at `now_ms` after a sleep of `poll_ms`; the end of the latest pause.
    fn wake(&mut self, now_ms: u64, poll_ms: u64, timeout_ms: u64) -> u64 {
        // Late by more than the linger: more than a loaded machine delays a sleeping thread.
        let late = linger(Duration::from_millis(timeout_ms)).as_millis() as u64;
        if now_ms.saturating_sub(self.last_ms) > poll_ms + late {
            self.running_since_ms = now_ms;
        }
        self.last_ms = now_ms;
        self.running_since_ms
    }
}

/// The watchdog thread: polls often enough to end a rank within a tenth of the timeout.
fn watch() {
    let mut pauses = Pauses {
        last_ms: now_ms(),
        running_since_ms: 0,
    };
    loop {
        let timeout_ms = TIMEOUT_MS.load(SeqCst);
        let poll = (timeout_ms / 10).clamp(50, 1000);
        std::thread::sleep(Duration::from_millis(poll));
        let now = now_ms();
        let running_since = pauses.wake(now, poll, timeout_ms);
        if timeout_ms == 0 {
            continue;
        }
        let Some(stall) = WATCH.stalled_at(now, timeout_ms, running_since) else {
            continue;
        };
        let line = report(stall).to_string();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}").and_then(|()| err.flush());
        drop(err);
        std::thread::sleep(linger(Duration::from_millis(timeout_ms)));
        // SAFETY: `_exit` ends the process without running atexit handlers or destructors,
        // which is the point: they would wait for the thread stuck in MPI.
        unsafe { libc::_exit(EXIT_CODE) }
    }
}

/// The report of `stall`, with this process's context.
fn report(stall: Stall) -> Report {
    let c = context();
    let host = |r: usize| c.hosts.get(r).cloned().unwrap_or_else(|| "?".into());
    let peer = stall.peer.map(|(comm, p)| {
        c.comms
            .iter()
            .find(|(h, _)| *h == comm)
            .and_then(|(_, ranks)| ranks.get(p).copied())
            .unwrap_or(p)
    });
    Report {
        rank: c.rank,
        host: host(c.rank),
        seconds: stall.stuck_ms as f64 / 1000.0,
        collective: stall.op.name().to_string(),
        peer: peer.map(|p| (p, host(p))),
        hosts: c.hosts.clone(),
        checkpoint: c.checkpoint.clone(),
    }
}

/// One rank's collective-timeout line: `error: collective timeout: rank 0 (host h1) made no
/// progress for 10.0 s in ring all-reduce, waiting on rank 1 (host h2); ranks: 0=h1,1=h2;
/// newest checkpoint: step 40 in out/run (resume with --resume out/run)`. Consecutive ranks on
/// one host are written as a range (`0-3=h1`).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The rank that reports.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// How long its call made no progress.
    pub seconds: f64,
    /// The call (`ring all-reduce`, `barrier`, …).
    pub collective: String,
    /// The world rank it waits on and its host; `None` inside MPI's own collectives.
    pub peer: Option<(usize, String)>,
    /// Every rank's host, in rank order.
    pub hosts: Vec<String>,
    /// The newest checkpoint's step and where to resume from.
    pub checkpoint: Option<(u64, PathBuf)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}rank {} (host {}) made no progress for {:.1} s in {}, ",
            self.rank, self.host, self.seconds, self.collective
        )?;
        match &self.peer {
            Some((r, h)) => write!(f, "waiting on rank {r} (host {h})")?,
            None => f.write_str("waiting on no single rank (MPI's own collective)")?,
        }
        f.write_str("; ranks: ")?;
        let mut first = 0;
        for r in 1..=self.hosts.len() {
            if r < self.hosts.len() && self.hosts[r] == self.hosts[first] {
                continue;
            }
            let sep = if first == 0 { "" } else { "," };
            match r - 1 - first {
                0 => write!(f, "{sep}{first}={}", self.hosts[first])?,
                _ => write!(f, "{sep}{first}-{}={}", r - 1, self.hosts[first])?,
            }
            first = r;
        }
        match &self.checkpoint {
            Some((step, dir)) => write!(
                f,
                "; newest checkpoint: step {step} in {} (resume with --resume {})",
                dir.display(),
                dir.display()
            ),
            None => f.write_str("; no checkpoint yet"),
        }
    }
}

impl Report {
    /// Reads a report line back (anywhere in `line`, after mpirun's prefixes); `None` for
    /// any other line. Only what `launch` needs is required: the rank and the ranks' hosts.
    pub fn parse(line: &str) -> Option<Report> {
        let (_, rest) = line.split_once(PREFIX)?;
        let rest = rest.strip_prefix("rank ")?;
        let (rank, rest) = rest.split_once(" (host ")?;
        let (host, rest) = rest.split_once(") made no progress for ")?;
        let (seconds, rest) = rest.split_once(" s in ")?;
        let (collective, rest) = rest.split_once(", waiting on ")?;
        let peer = rest
            .strip_prefix("rank ")
            .and_then(|p| p.split_once(" (host "))
            .and_then(|(r, p)| Some((r.parse().ok()?, p.split_once(')')?.0.to_string())));
        let (_, rest) = rest.split_once("; ranks: ")?;
        let (list, rest) = rest.split_once("; ").unwrap_or((rest, ""));
        let mut hosts = Vec::new();
        for item in list.split(',') {
            let (ranks, host) = item.split_once('=')?;
            let (lo, hi) = ranks.split_once('-').unwrap_or((ranks, ranks));
            let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
            if lo != hosts.len() || hi < lo {
                return None;
            }
            hosts.extend((lo..=hi).map(|_| host.to_string()));
        }
        let checkpoint = rest
            .strip_prefix("newest checkpoint: step ")
            .and_then(|c| c.split_once(" in "))
            .and_then(|(s, c)| {
                let dir = c.rsplit_once(" (resume with --resume ")?.0;
                Some((s.parse().ok()?, PathBuf::from(dir)))
            });
        Some(Report {
            rank: rank.parse().ok()?,
            host: host.to_string(),
            seconds: seconds.parse().ok()?,
            collective: collective.to_string(),
            peer,
            hosts,
            checkpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_stalled_only_past_the_timeout_since_its_last_progress() {
        let w = Watch::new();
        assert_eq!(w.stalled_at(10_000, 100, 0), None, "in no call");
        w.enter_at(Op::all_reduce(Algorithm::Ring), None, 1_000);
        assert_eq!(w.stalled_at(1_099, 100, 0), None);
        let s = w.stalled_at(1_100, 100, 0).unwrap();
        assert_eq!(
            (s.op.name(), s.peer, s.stuck_ms),
            ("ring all-reduce", None, 100)
        );
        // Each point-to-point step is progress, and names its peer and communicator.
        w.progress_at(7, 3, 1_090);
        assert_eq!(w.stalled_at(1_150, 100, 0), None);
        let s = w.stalled_at(1_200, 100, 0).unwrap();
        assert_eq!((s.op, s.peer, s.stuck_ms), (Op(2), Some((7, 3)), 110));
        w.leave();
        assert_eq!(w.stalled_at(1_000_000, 100, 0), None, "the call returned");
        // Outside a marked call, a step marks nothing.
        w.progress_at(7, 3, 0);
        assert_eq!(w.stalled_at(1_000_000, 100, 0), None);
        // A new call forgets the last one's communicator.
        w.enter_at(Op::BROADCAST, Some(0), 2_000);
        let s = w.stalled_at(5_000, 100, 0).unwrap();
        assert_eq!((s.op.name(), s.peer), ("broadcast", Some((0, 0))));
        w.enter_at(Op::BARRIER, Some(usize::MAX), 2_000);
        assert_eq!(w.stalled_at(5_000, 100, 0).unwrap().peer, None);
    }

    #[test]
    fn a_pause_of_this_process_is_not_a_peers_silence() {
        let w = Watch::new();
        w.enter_at(Op::all_reduce(Algorithm::Ring), Some(1), 1_000);
        // Timeout 3 s: polls of 300 ms, a linger of 1.5 s.
        let mut p = Pauses {
            last_ms: 1_000,
            running_since_ms: 0,
        };
        assert_eq!(p.wake(1_300, 300, 3_000), 0);
        // A loaded machine wakes the thread late, but by less than the linger.
        assert_eq!(p.wake(2_900, 300, 3_000), 0);
        // Stopped from 2.9 s to 9 s: the call has waited 8 s, but ran for none of the pause.
        let since = p.wake(9_000, 300, 3_000);
        assert_eq!(since, 9_000);
        assert_eq!(w.stalled_at(9_000, 3_000, since), None);
        assert_eq!(
            w.stalled_at(11_900, 3_000, p.wake(11_900, 2_900, 3_000)),
            None
        );
        let s = w
            .stalled_at(12_000, 3_000, p.wake(12_000, 300, 3_000))
            .unwrap();
        assert_eq!(s.stuck_ms, 3_000, "counted from the end of the pause");
        // Progress after the pause counts from itself.
        w.progress_at(0, 1, 12_500);
        assert_eq!(w.stalled_at(15_400, 3_000, since), None);
        assert!(w.stalled_at(15_500, 3_000, since).is_some());
    }

    #[test]
    fn every_algorithm_and_call_has_a_name() {
        for a in Algorithm::ALL {
            assert!(Op::all_reduce(a).name().contains(a.name()) || a == Algorithm::Mpi);
        }
        assert_eq!(Op::all_reduce(Algorithm::Mpi).name(), "MPI_Allreduce");
        assert_eq!(Op::WAIT.name(), "wait for a message");
    }

    #[test]
    fn the_watchdog_thread_reads_the_global_state() {
        // The thread itself ends the process; here the functions it uses, on the global state.
        ENABLED.store(true, SeqCst);
        set_ranks(1, vec!["h1".into(), "h2".into()]);
        let _busy = enter(Op::RECEIVE, Some(0));
        std::thread::sleep(Duration::from_millis(30));
        let stall = WATCH.stalled_at(now_ms(), 20, 0).expect("stuck for 30 ms");
        note_checkpoint(4, Path::new("out/x"));
        let line = report(stall).to_string();
        assert!(
            line.starts_with("error: collective timeout: rank 1 (host h2) made no progress for ")
                && line.ends_with(
                    " s in receive, waiting on rank 0 (host h1); ranks: 0=h1,1=h2; newest checkpoint: step 4 in out/x (resume with --resume out/x)"
                ),
            "{line}"
        );
        drop(_busy);
        assert_eq!(WATCH.stalled_at(now_ms() + 10_000, 20, 0), None);
        ENABLED.store(false, SeqCst);
    }

    #[test]
    fn reports_print_and_parse_back() {
        let r = Report {
            rank: 0,
            host: "h1".into(),
            seconds: 10.04,
            collective: "ring all-reduce".into(),
            peer: Some((1, "h2".into())),
            hosts: vec!["h1".into(), "h2".into()],
            checkpoint: Some((40, "out/run".into())),
        };
        let line = r.to_string();
        assert_eq!(
            line,
            "error: collective timeout: rank 0 (host h1) made no progress for 10.0 s in ring all-reduce, waiting on rank 1 (host h2); ranks: 0=h1,1=h2; newest checkpoint: step 40 in out/run (resume with --resume out/run)"
        );
        let back = Report::parse(&format!("[1,0]<stderr>:{line}")).unwrap();
        assert_eq!(back, Report { seconds: 10.0, ..r });

        let hosts: Vec<String> = ["a", "a", "a", "b", "a", "c", "c"].map(String::from).into();
        let r = Report {
            rank: 6,
            host: "c".into(),
            seconds: 3.0,
            collective: "MPI_Allreduce".into(),
            peer: None,
            hosts: hosts.clone(),
            checkpoint: None,
        };
        let line = r.to_string();
        assert!(
            line.ends_with(
                "waiting on no single rank (MPI's own collective); ranks: 0-2=a,3=b,4=a,5-6=c; no checkpoint yet"
            ),
            "{line}"
        );
        assert_eq!(Report::parse(&line).unwrap(), r);

        for bad in [
            "error: collective timeout: rank x (host a) made no progress for 1.0 s in barrier, waiting on no single rank (MPI's own collective); ranks: 0=a",
            "error: collective timeout: rank 0 (host a) made no progress for 1.0 s in barrier, waiting on no single rank (MPI's own collective); ranks: 1=a",
            "error: something else",
            "",
        ] {
            assert_eq!(Report::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_linger_is_half_the_timeout_within_bounds() {
        assert_eq!(linger(Duration::from_secs(3)), Duration::from_millis(1500));
        assert_eq!(linger(Duration::from_millis(100)), Duration::from_secs(1));
        assert_eq!(linger(Duration::from_secs(600)), Duration::from_secs(15));
    }
}
