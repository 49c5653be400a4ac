//! The set of ranks a job runs on: MPI's world under `mpirun`, else one process without MPI.

use std::time::{Duration, Instant};

use lsgd_codec::{Element, wire};
use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::{Threading, Universe};
use mpi::raw::{AsRaw, FromRaw};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::chunks::{Bf16, F16, F32, Format, Scratch};
use super::hierarchical::Nodes;
use super::torus::{self, Grid};
use super::watchdog::{self, Op};
use super::{
    Algorithm, Error, Result, Traffic, baseline, binary_blocks, halving_doubling, ring, ulfm,
};

/// Environment variables that mpirun (Open MPI, MPICH/PMI, PMIx) sets in every rank.
const LAUNCHER_VARS: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// The length [`World::agree_lengths`] gathers from a rank that failed.
const FAILED: u64 = u64::MAX;

/// What [`World::agree_lengths`] tells every rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Agreement {
    /// No rank failed: every rank's length, in rank order.
    Lengths(Vec<u64>),
    /// Some rank failed before the collective; `rank` is the lowest that did.
    Failed {
        /// The lowest rank that reported a failure.
        rank: usize,
    },
}

/// The ranks of a job and the collectives between them.
pub struct World {
    pub(crate) mpi: Option<Box<Mpi>>,
    torus_shape: Option<(usize, usize)>,
    ranks_per_node: Option<usize>,
}

/// Field order matters: the sub-communicators are freed before the universe finalizes MPI.
pub(crate) struct Mpi {
    /// Stops before anything else of MPI goes.
    pump: Option<ulfm::Pump>,
    grid: Option<Grid>,
    nodes: Option<Nodes>,
    pub(crate) comm: SimpleCommunicator,
    /// A duplicate of `comm` that only [`World::exit_after_error`] uses: its barrier cannot be
    /// matched with a collective that a rank still going on is blocked in.
    exit: SimpleCommunicator,
    scratch: Scratch,
    rank: usize,
    size: usize,
    /// With `--fault-tolerance`: who every rank is, to name and fence a lost one.
    tolerant: Option<Ranks>,
    /// Started by the survivors as a replacement ([`World::grow`]).
    joined: bool,
    /// ULFM's failure detector timeout (zero: off).
    detector: Duration,
    /// Slots of the job's allocation that no process took yet (MPI_UNIVERSE_SIZE less the
    /// ranks started and the replacements spawned): a lost process keeps its slot in Open MPI
    /// 5, so only these can take a replacement. Rank 0's count is the world's.
    spare: usize,
    /// `None` once finalizing is left out (after a shrink: see the `Drop`).
    universe: Option<Universe>,
}

impl Mpi {
    /// Makes `comm` the world's (after a shrink or a growth): the old sub-communicators go,
    /// `comm` and a new exit duplicate are the ones a failure revokes, and rank and size are
    /// its.
    ///
    /// # Safety
    /// `comm` is a live intracommunicator of this process that nothing else owns or frees.
    unsafe fn adopt(&mut self, comm: mpi::ffi::MPI_Comm) {
        ulfm::forget_all();
        self.grid = None;
        self.nodes = None;
        // SAFETY: the caller's promise; owned from here on.
        self.comm = unsafe { SimpleCommunicator::from_raw(comm) };
        ulfm::watch(self.comm.as_raw());
        self.exit = self.comm.duplicate();
        ulfm::watch(self.exit.as_raw());
        self.rank = self.comm.rank() as usize;
        self.size = self.comm.size() as usize;
    }
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // After a rank was lost, Open MPI 5.0.11's MPI_Finalize now and then never returns (the
        // survivors wait in it for each other, one run in four here). The survivors have agreed
        // on everything by then, so they meet on the shrunk world and leave MPI unfinalized;
        // mpirun, started with ULFM, takes that as an ordinary exit. Replacements
        // ([`World::grow`]) run as a job of their own, which is not under ULFM's leave: they
        // free what they share with the survivors' job (the parent communicator here, the
        // others as the fields drop) and finalize their own.
        let shrunk = self.tolerant.as_ref().is_some_and(|t| t.shrunk);
        if !shrunk {
            return;
        }
        self.pump = None;
        self.grid = None;
        self.nodes = None;
        self.comm.barrier();
        if self.joined {
            ulfm::leave_parent();
        } else {
            std::mem::forget(self.universe.take());
        }
    }
}

/// Every rank's host, pid and process start time, in rank order.
struct Ranks {
    /// Whether the world has shrunk since MPI started.
    shrunk: bool,
    hosts: Vec<String>,
    pids: Vec<u64>,
    ticks: Vec<u64>,
}

/// A rank the survivors lost, as [`World::shrink`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRank {
    /// Its rank in the world before the shrink.
    pub rank: usize,
    /// Its host.
    pub host: String,
    /// Whether a survivor on its host ended its process (it was stopped or stuck, not dead).
    pub fenced: bool,
    /// Whether it fell silent rather than died: no error came from the loss before about the
    /// failure detector's timeout (a process that dies closes its connections at once), so it
    /// stopped, hung, or its host or link went, and its host's MPI daemon may be gone too.
    pub silent: bool,
}

/// What [`World::shrink`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Shrunk {
    /// Ranks before.
    pub before: usize,
    /// The ranks lost, in rank order.
    pub lost: Vec<LostRank>,
    /// How long before the shrink's end the first error struck this rank.
    pub since_failure: Duration,
    /// The MPI error class of that error (0: none struck this rank; another rank's did).
    pub class: i32,
    /// Said once when `--torus-shape` no longer fits and the near-square default takes over.
    pub note: Option<String>,
}

/// Whether the survivors of a world of `before` ranks that lost `lost` may go on: more than
/// half of it, or exactly half holding its rank 0. Each side of a partition decides alone, and
/// at most one side can hold more than half, or half with rank 0.
fn goes_on(before: usize, lost: &[usize]) -> bool {
    let after = before - lost.len();
    after * 2 > before || (after * 2 == before && !lost.contains(&0))
}

/// Ends this process now, without MPI: stdout and stderr flushed, nothing finalized.
fn abandon(code: i32) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process without running anything that could call into MPI.
    unsafe { libc::_exit(code) }
}

/// A failed split of a tolerant world is a lost rank, not a missing communicator.
fn lost_or(e: Error, tolerant: bool) -> Error {
    match tolerant.then(ulfm::check) {
        Some(Err(lost)) => lost,
        _ => e,
    }
}

impl Mpi {
    /// The one other rank of a two-rank world: whom any collective waits on. With more ranks,
    /// MPI's own collectives do not say.
    fn sole_peer(&self) -> Option<usize> {
        (self.size == 2).then(|| 1 - self.rank)
    }
}

impl World {
    /// MPI when launched by mpirun (detected from its environment), otherwise a single-process
    /// world that never touches MPI (so plain `lsgd-host run` needs no MPI daemon). MPI must
    /// give `MPI_THREAD_FUNNELED`: the overlapped step runs the backward pass on a thread of
    /// its own while the thread that initialized MPI makes every MPI call.
    pub fn init() -> Result<World> {
        if !LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            return Ok(World::single());
        }
        let (universe, threading) =
            mpi::initialize_with_threading(Threading::Funneled).ok_or(Error::MpiInitialized)?;
        if threading == Threading::Single {
            return Err(Error::ThreadLevel(format!(
                "MPI gave thread level {threading:?}; the overlapped step computes the backward \
                 pass on a thread of its own beside the main thread's MPI calls, which needs \
                 Funneled"
            )));
        }
        World::started(universe)
    }

    /// A world whose collectives report a lost rank ([`Error::RankLost`]) instead of ending
    /// the job, for `--fault-tolerance`: MPI's ULFM (Open MPI 5 under `mpirun --with-ft
    /// ulfm`), with its failure detector on, so that a stopped or silent rank counts as lost
    /// after `detector` without a heartbeat (zero: off, only ranks whose process or link ends
    /// are found). A thread of ours keeps the heartbeats going while a rank computes, so MPI
    /// must give `MPI_THREAD_MULTIPLE`. Without mpirun this is a single-process world (nothing
    /// to lose).
    pub fn init_tolerant(detector: Duration) -> Result<World> {
        if !LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some()) {
            return Ok(World::single());
        }
        if let Some(why) = ulfm::unavailable() {
            return Err(Error::Unavailable(why));
        }
        if !detector.is_zero() {
            ulfm::configure_detector(detector);
        }
        let (universe, threading) =
            mpi::initialize_with_threading(Threading::Multiple).ok_or(Error::MpiInitialized)?;
        if threading != Threading::Multiple {
            return Err(Error::Unavailable(format!(
                "MPI gave thread level {threading:?}; the failure detector's heartbeats come \
                 from a thread of their own, which needs Multiple"
            )));
        }
        // A replacement started by `World::grow` joins the survivors' world, after them.
        let parent = ulfm::parent();
        let comm = match parent {
            Some(parent) => {
                ulfm::watch(parent);
                let merged = ulfm::merge(parent, true)?;
                // SAFETY: a communicator MPI_Intercomm_merge just made, owned from here on.
                unsafe { SimpleCommunicator::from_raw(merged) }
            }
            None => universe.world(),
        };
        let joined = parent.is_some();
        let slots = universe.size().unwrap_or(0);
        ulfm::watch(comm.as_raw());
        let mut world = World::started_on(universe, comm)?;
        ulfm::watch(world.mpi.as_deref().expect("an MPI world").exit.as_raw());
        // A replacement exists because its world shrank: it leaves MPI as the survivors do.
        world.learn_ranks(joined)?;
        let m = world.mpi.as_deref_mut().expect("an MPI world");
        m.joined = joined;
        m.detector = detector;
        m.spare = if joined {
            0
        } else {
            slots.saturating_sub(m.size)
        };
        if !detector.is_zero() {
            m.pump = Some(ulfm::Pump::start(ulfm::pump_period(detector)));
        }
        Ok(world)
    }

    fn started(universe: Universe) -> Result<World> {
        let comm = universe.world();
        World::started_on(universe, comm)
    }

    fn started_on(universe: Universe, comm: SimpleCommunicator) -> Result<World> {
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        let exit = comm.duplicate();
        let world = World {
            mpi: Some(Box::new(Mpi {
                pump: None,
                grid: None,
                nodes: None,
                comm,
                exit,
                scratch: Scratch::default(),
                rank,
                size,
                tolerant: None,
                joined: false,
                detector: Duration::ZERO,
                spare: 0,
                universe: Some(universe),
            })),
            torus_shape: None,
            ranks_per_node: None,
        };
        // Gathered now, while every rank is reachable: a timeout report names hosts.
        watchdog::set_ranks(rank, world.hostnames()?);
        Ok(world)
    }

    /// Every rank's host, pid and start time, gathered (collective) into the world's fault
    /// tolerance; `shrunk` as it was. What a starting world and a grown one both do.
    fn learn_ranks(&mut self, shrunk: bool) -> Result<()> {
        let pid = u64::from(std::process::id());
        let ticks = ulfm::start_ticks(std::process::id()).unwrap_or(0);
        let ranks = Ranks {
            shrunk,
            hosts: self.hostnames()?,
            pids: self.all_gather_u64(pid)?,
            ticks: self.all_gather_u64(ticks)?,
        };
        let m = self.mpi.as_deref_mut().expect("an MPI world");
        m.tolerant = Some(ranks);
        Ok(())
    }

    /// How many replacements [`World::grow`] can place: rank 0's count of the allocation's
    /// slots no process took yet (collective).
    pub fn spare_slots(&self) -> Result<usize> {
        let Some(m) = self.mpi.as_deref() else {
            return Ok(0);
        };
        let mut bytes = (m.spare as u64).to_le_bytes().to_vec();
        self.broadcast_bytes(&mut bytes)?;
        let spare: [u8; 8] = bytes
            .try_into()
            .map_err(|_| Error::Grow("a bad slot count".into()))?;
        Ok(u64::from_le_bytes(spare) as usize)
    }

    /// Whether this process joined a running world as a replacement ([`World::grow`]).
    pub fn joined(&self) -> bool {
        self.mpi.as_ref().is_some_and(|m| m.joined)
    }

    /// The survivors start `count` replacements, `command argv…` (the same `lsgd-host run`),
    /// and take them into the world after themselves (collective over the survivors; the
    /// replacements' [`World::init_tolerant`] is the other half). The world's size grows by
    /// `count`; sub-communicators are made again on first use. Returns the replacements' hosts.
    pub fn grow(&mut self, count: usize, command: &str, argv: &[String]) -> Result<Vec<String>> {
        let Some(m) = self.mpi.as_deref_mut().filter(|m| m.tolerant.is_some()) else {
            return Err(Error::Grow("the world is not fault tolerant".into()));
        };
        let intercomm = {
            let _busy = watchdog::enter(Op::SHRINK, None);
            ulfm::spawn(m.comm.as_raw(), count, command, argv)?
        };
        m.spare = m.spare.saturating_sub(count);
        let merged = ulfm::merge(intercomm, false)?;
        let shrunk = m.tolerant.as_ref().is_some_and(|t| t.shrunk);
        // SAFETY: a communicator MPI_Intercomm_merge just made.
        unsafe { m.adopt(merged) };
        let rank = m.rank;
        // As a replacement's start does: the hosts for the watchdog, then the ranks.
        watchdog::set_ranks(rank, self.hostnames()?);
        self.learn_ranks(shrunk)?;
        if self.torus_shape.is_some_and(|s| s.0 * s.1 != self.size()) {
            self.torus_shape = None;
        }
        let m = self.mpi.as_deref().expect("an MPI world");
        let hosts = &m.tolerant.as_ref().expect("learnt above").hosts;
        Ok(hosts[hosts.len() - count..].to_vec())
    }

    /// Whether collectives report lost ranks ([`World::init_tolerant`]).
    pub fn is_tolerant(&self) -> bool {
        self.mpi.as_ref().is_some_and(|m| m.tolerant.is_some())
    }

    /// Whether every live rank says `ok`: the same answer on every survivor, also after a
    /// failure (ULFM's agreement), false when some rank was lost. What a step's update waits
    /// for with fault tolerance; otherwise (no ranks to lose) `ok` itself.
    pub fn agree(&self, ok: bool) -> bool {
        match self.mpi.as_deref() {
            Some(m) if m.tolerant.is_some() => {
                let _busy = watchdog::enter(Op::AGREE, m.sole_peer());
                ulfm::agree(m.comm.as_raw(), ok)
            }
            _ => ok,
        }
    }

    /// After a failed [`World::agree`]: the survivors revoke the world, shrink it to
    /// themselves and rebuild it (ranks renumbered in their old order, sub-communicators made
    /// again on first use). Only a majority of the world before goes on (exactly half when it
    /// holds the old rank 0): any other side of a partition gets [`Error::CutOff`] and must
    /// stop without writing. A lost rank on this machine whose process is still there (stopped,
    /// or stuck past the detector) is killed, so that nothing waits for it.
    pub fn shrink(&mut self) -> Result<Shrunk> {
        let torus_shape = self.torus_shape;
        let Some(m) = self.mpi.as_deref_mut() else {
            return Err(Error::Shrink);
        };
        let Some(ranks) = m.tolerant.as_mut() else {
            return Err(Error::Shrink);
        };
        let old = m.comm.as_raw();
        let new = {
            let _busy = watchdog::enter(Op::SHRINK, None);
            ulfm::shrink(old)?
        };
        let since_failure = ulfm::failed().map_or(Duration::ZERO, |(_, ago)| ago);
        let class = ulfm::failed().map_or(0, |(class, _)| class);
        let lost = ulfm::missing(old, new, m.size);
        let before = m.size;
        if !goes_on(before, &lost) {
            let after = before - lost.len();
            return Err(Error::CutOff {
                before,
                after,
                lost,
                tie: if after * 2 == before {
                    " (exactly half, and the half with the old rank 0 goes on)"
                } else {
                    ""
                },
            });
        }
        let me = ranks.hosts[m.rank].clone();
        let silent = !m.detector.is_zero() && ulfm::quiet_before_failure() >= m.detector / 2;
        let lost: Vec<LostRank> = lost
            .into_iter()
            .map(|r| LostRank {
                rank: r,
                host: ranks.hosts[r].clone(),
                fenced: ranks.hosts[r] == me && ulfm::fence(ranks.pids[r] as u32, ranks.ticks[r]),
                silent,
            })
            .collect();
        let kept = |r: &usize| !lost.iter().any(|l| l.rank == *r);
        let survivors: Vec<usize> = (0..before).filter(kept).collect();
        ranks.hosts = survivors.iter().map(|&r| ranks.hosts[r].clone()).collect();
        ranks.pids = survivors.iter().map(|&r| ranks.pids[r]).collect();
        ranks.ticks = survivors.iter().map(|&r| ranks.ticks[r]).collect();
        ranks.shrunk = true;
        // SAFETY: a communicator MPIX_Comm_shrink just made.
        let hosts = ranks.hosts.clone();
        unsafe { m.adopt(new) };
        ulfm::clear();
        watchdog::set_ranks(m.rank, hosts);
        let mut note = None;
        if let Some(shape) = torus_shape.filter(|s| s.0 * s.1 != m.size) {
            let (x, y) = torus::default_shape(m.size);
            note = Some(format!(
                "--torus-shape {}x{} does not fit {} ranks: torus2d uses {x}x{y} from now on",
                shape.0, shape.1, m.size
            ));
            self.torus_shape = None;
        }
        Ok(Shrunk {
            before,
            lost,
            since_failure,
            class,
            note,
        })
    }

    /// Sends `signal` to rank `rank`'s process if it runs on this machine (a fault-tolerant
    /// world knows every rank's pid); whether it was sent.
    pub fn signal_local(&self, rank: usize, signal: i32) -> bool {
        let Some(ranks) = self.mpi.as_deref().and_then(|m| m.tolerant.as_ref()) else {
            return false;
        };
        let me = &ranks.hosts[self.rank()];
        rank < ranks.hosts.len()
            && ranks.hosts[rank] == *me
            && ulfm::signal(ranks.pids[rank] as u32, ranks.ticks[rank], signal)
    }

    /// Err([`Error::RankLost`]) once a collective of a tolerant world has failed: its result
    /// is garbage and must not be used.
    fn settled(&self) -> Result<()> {
        match self.mpi.as_deref() {
            Some(m) if m.tolerant.is_some() => ulfm::check(),
            _ => Ok(()),
        }
    }

    /// Ends this rank, with a report naming the rank and host it waits on, when one blocking
    /// call makes no progress for `timeout` (zero: never). Only MPI worlds have a watchdog;
    /// every rank should set the same timeout.
    pub fn set_collective_timeout(&self, timeout: Duration) {
        if self.is_mpi() {
            watchdog::start(timeout);
        }
    }

    /// Ends this process with `code` after an error it has already printed. When every rank
    /// ends with an error within `linger` (a failure the ranks agreed on), MPI finalizes as
    /// usual. When some rank goes on (the error struck this rank alone, and the others wait
    /// for it in a collective, where MPI_Finalize would wait for them in turn), the job is
    /// aborted, so that it ends now rather than after the collective timeout.
    pub fn exit_after_error(self, code: i32, linger: Duration) -> ! {
        if self.is_tolerant() && ulfm::failed().is_some() {
            // A rank was lost and not recovered from (this side was cut off, or the recovery
            // failed): MPI_Finalize and MPI_Abort would reach across to ranks that go on.
            abandon(code);
        }
        if let Some(mpi) = self.mpi.as_ref().filter(|m| m.size > 1) {
            let deadline = Instant::now() + linger;
            let mut barrier = mpi.exit.immediate_barrier();
            loop {
                match barrier.test() {
                    Ok(_) => break,
                    Err(pending) if Instant::now() < deadline => {
                        barrier = pending;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    // MPI_Abort ends every rank; the request dies with the process.
                    Err(pending) => {
                        std::mem::forget(pending);
                        mpi.comm.abort(code)
                    }
                }
            }
        }
        drop(self);
        std::process::exit(code)
    }

    /// An explicit single-process world (no MPI).
    pub fn single() -> World {
        World {
            mpi: None,
            torus_shape: None,
            ranks_per_node: None,
        }
    }

    /// This process's rank, 0-based.
    pub fn rank(&self) -> usize {
        self.mpi.as_ref().map_or(0, |m| m.rank)
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.mpi.as_ref().map_or(1, |m| m.size)
    }

    /// Whether this is rank 0 (the one that prints and writes files).
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Whether the world runs on MPI (launched by mpirun, even with one rank).
    pub fn is_mpi(&self) -> bool {
        self.mpi.is_some()
    }

    /// In-place sum across ranks with `algo`; every rank gets identical result bytes. All ranks
    /// must call it with the same algorithm and buffer length.
    pub fn all_reduce_sum(&mut self, algo: Algorithm, buf: &mut [f32]) -> Result<Traffic> {
        self.all_reduce::<F32>(algo, buf)
    }

    /// In-place sum of 16-bit floats (`format`'s bits) across ranks with `algo`, sent as 2 bytes
    /// per element; each addition converts both operands to binary32, adds, and rounds back to
    /// nearest even. Every rank gets identical result bits, as with [`World::all_reduce_sum`].
    /// [`Algorithm::Mpi`] is MPI_Allreduce with a user-defined operation (MPI has no 16-bit
    /// float sum). All ranks must call it with the same algorithm, format and buffer length.
    /// [`Element::F32`] is an error (on every rank alike, before any communication): binary32
    /// sums are [`World::all_reduce_sum`].
    pub fn all_reduce_sum_half(
        &mut self,
        algo: Algorithm,
        format: Element,
        buf: &mut [u16],
    ) -> Result<Traffic> {
        match format {
            Element::F16 => self.all_reduce::<F16>(algo, buf),
            Element::Bf16 => self.all_reduce::<Bf16>(algo, buf),
            Element::F32 => Err(Error::NotSixteenBit { element: format }),
        }
    }

    /// Sums a little-endian payload of `element`s across ranks with `algo` (binary32 with
    /// [`World::all_reduce_sum`], 16-bit formats with [`World::all_reduce_sum_half`]) and
    /// returns the sum's bytes, identical on every rank. All ranks must call it with the same
    /// algorithm, element and payload length; the length must be a multiple of
    /// [`Element::size`] (checked before any communication).
    pub fn all_reduce_payload(
        &mut self,
        algo: Algorithm,
        element: Element,
        payload: &[u8],
    ) -> Result<(Vec<u8>, Traffic)> {
        if !payload.len().is_multiple_of(element.size()) {
            return Err(Error::PayloadLength {
                len: payload.len(),
                element,
            });
        }
        if element == Element::F32 {
            let mut v = wire::f32s_from_le(payload);
            let t = self.all_reduce_sum(algo, &mut v)?;
            let mut out = Vec::with_capacity(payload.len());
            wire::put_f32s(&mut out, &v);
            return Ok((out, t));
        }
        let mut v: Vec<u16> = payload
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let t = self.all_reduce_sum_half(algo, element, &mut v)?;
        Ok((v.iter().flat_map(|x| x.to_le_bytes()).collect(), t))
    }

    /// Every rank's payload length, `None` from a rank that failed before the collective (it
    /// still calls this, so that the others stop with it rather than wait for it). Every rank
    /// gets the same answer: every length in rank order, or the lowest rank that failed. A
    /// length of `u64::MAX` is the failure marker on the wire, so it reads as a failure.
    pub fn agree_lengths(&self, mine: Option<u64>) -> Result<Agreement> {
        let lengths = self.all_gather_u64(mine.unwrap_or(FAILED))?;
        Ok(match lengths.iter().position(|&l| l == FAILED) {
            Some(rank) => Agreement::Failed { rank },
            None => Agreement::Lengths(lengths),
        })
    }

    /// The lowest rank that reports `failed_here`, on every rank alike; `None` when no rank
    /// failed.
    pub fn agree_failure(&self, failed_here: bool) -> Result<Option<usize>> {
        let flags = self.all_gather_u64(u64::from(failed_here))?;
        Ok(flags.iter().position(|&f| f != 0))
    }

    /// The message of the lowest rank that has one, with that rank, on every rank alike
    /// (`None` when no rank has one): how every rank stops with the same words after a fault
    /// that struck only some of them. One byte all-gather; every rank must call it.
    pub fn first_message(&self, mine: Option<&str>) -> Result<Option<(usize, String)>> {
        // A leading byte tells "no message" from an empty one.
        let bytes: Vec<u8> = mine.map_or_else(Vec::new, |m| [&[1u8][..], m.as_bytes()].concat());
        let (all, _) = self.all_gather_bytes(&bytes)?;
        Ok(all
            .into_iter()
            .enumerate()
            .find(|(_, b)| !b.is_empty())
            .map(|(rank, b)| (rank, String::from_utf8_lossy(&b[1..]).into_owned())))
    }

    fn all_reduce<E: Format>(&mut self, algo: Algorithm, buf: &mut [E::Stored]) -> Result<Traffic> {
        let start = Instant::now();
        let (torus_shape, ranks_per_node) = (self.torus_shape, self.ranks_per_node);
        let Some(m) = self.mpi.as_deref_mut() else {
            return Ok(Traffic {
                bytes_sent: 0,
                seconds: start.elapsed().as_secs_f64(),
            });
        };
        if m.size == 1 || buf.is_empty() {
            return Ok(Traffic {
                bytes_sent: 0,
                seconds: start.elapsed().as_secs_f64(),
            });
        }
        if m.tolerant.is_some() {
            ulfm::check()?;
        }
        let tolerant = m.tolerant.is_some();
        let _busy = watchdog::enter(Op::all_reduce(algo), m.sole_peer());
        let scratch = E::scratch(&mut m.scratch);
        let bytes_sent = match algo {
            Algorithm::Mpi => baseline::all_reduce::<E>(&m.comm, buf, scratch, tolerant),
            Algorithm::Ring => ring::all_reduce::<E>(&m.comm, buf, scratch),
            Algorithm::HalvingDoubling => halving_doubling::all_reduce::<E>(&m.comm, buf, scratch),
            Algorithm::BinaryBlocks => binary_blocks::all_reduce::<E>(&m.comm, buf, scratch),
            Algorithm::Torus2d => {
                let shape = torus_shape.unwrap_or_else(|| torus::default_shape(m.size));
                // Sub-communicators are made on first use: every rank reaches this call together.
                if m.grid.as_ref().is_none_or(|g| g.shape() != shape) {
                    m.grid = None;
                    m.grid = Some(Grid::new(&m.comm, shape).map_err(|e| lost_or(e, tolerant))?);
                    if tolerant {
                        m.grid.as_ref().expect("made above").watch();
                    }
                }
                m.grid
                    .as_ref()
                    .expect("made above")
                    .all_reduce::<E>(buf, scratch)
            }
            Algorithm::Hierarchical => {
                if m.nodes
                    .as_ref()
                    .is_none_or(|n| n.ranks_per_node() != ranks_per_node)
                {
                    m.nodes = None;
                    m.nodes = Some(
                        Nodes::new(&m.comm, ranks_per_node).map_err(|e| lost_or(e, tolerant))?,
                    );
                    if tolerant {
                        m.nodes.as_ref().expect("made above").watch();
                    }
                }
                m.nodes
                    .as_ref()
                    .expect("made above")
                    .all_reduce::<E>(buf, scratch)
            }
        };
        self.settled()?;
        Ok(Traffic {
            bytes_sent,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Every rank's value, in rank order (for the weight/policy-hash consistency check).
    pub fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let Some(m) = self.mpi.as_deref() else {
            return Ok(vec![value]);
        };
        let mut all = vec![0u64; m.size];
        self.settled()?;
        let _busy = watchdog::enter(Op::ALL_GATHER, m.sole_peer());
        m.comm.all_gather_into(&value, &mut all[..]);
        self.settled()?;
        Ok(all)
    }

    /// Every rank's payload, in rank order; lengths may differ between ranks. `bytes_sent` is
    /// what a direct all-gather sends from this rank: its 8-byte length and its payload to each
    /// of the p−1 others (MPI does not say what it really sent).
    pub fn all_gather_bytes(&self, mine: &[u8]) -> Result<(Vec<Vec<u8>>, Traffic)> {
        let start = Instant::now();
        let Some(m) = self.mpi.as_deref() else {
            let traffic = Traffic {
                bytes_sent: 0,
                seconds: start.elapsed().as_secs_f64(),
            };
            return Ok((vec![mine.to_vec()], traffic));
        };
        let mut lengths = vec![0u64; m.size];
        self.settled()?;
        let _busy = watchdog::enter(Op::ALL_GATHER, m.sole_peer());
        m.comm
            .all_gather_into(&(mine.len() as u64), &mut lengths[..]);
        // After a failure the lengths are garbage: never allocate by them.
        self.settled()?;
        // MPI counts and displacements are C ints: refuse, on every rank alike, what overflows.
        let mut counts = Vec::with_capacity(m.size);
        let mut displs = Vec::with_capacity(m.size);
        let mut total: i32 = 0;
        for &len in &lengths {
            let count = i32::try_from(len).ok();
            let end = count.and_then(|c| total.checked_add(c));
            let (Some(count), Some(end)) = (count, end) else {
                return Err(Error::GatherOverflow { lengths });
            };
            counts.push(count);
            displs.push(total);
            total = end;
        }
        let mut all = vec![0u8; total as usize];
        // Open MPI's MPI_IN_PLACE is the address 1, which is where Rust puts empty byte slices:
        // an empty buffer would be taken for it (and an empty receive buffer refused), so every
        // buffer handed to MPI has a real address.
        let anchor = [0u8; 1];
        let send = if mine.is_empty() { &anchor[..0] } else { mine };
        if total > 0 {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            m.comm.all_gather_varcount_into(send, &mut partition);
        }
        self.settled()?;
        let payloads = counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
            .collect();
        let peers = (m.size - 1) as u64;
        let traffic = Traffic {
            bytes_sent: peers * (size_of::<u64>() + mine.len()) as u64,
            seconds: start.elapsed().as_secs_f64(),
        };
        Ok((payloads, traffic))
    }

    /// Element-wise maximum across ranks, in place (e.g. per-iteration times in benchmarks).
    pub fn all_reduce_max_f64(&self, values: &mut [f64]) -> Result<()> {
        let Some(m) = self.mpi.as_deref() else {
            return Ok(());
        };
        let local = values.to_vec();
        self.settled()?;
        let _busy = watchdog::enter(Op::MAX, m.sole_peer());
        m.comm
            .all_reduce_into(&local[..], values, SystemOperation::max());
        self.settled()
    }

    /// Root's bytes to every rank (other ranks' `bytes` are replaced).
    pub fn broadcast_bytes(&self, bytes: &mut Vec<u8>) -> Result<()> {
        let Some(m) = self.mpi.as_deref() else {
            return Ok(());
        };
        let root = m.comm.process_at_rank(0);
        let _busy = watchdog::enter(Op::BROADCAST, (m.rank != 0).then_some(0).or(m.sole_peer()));
        let mut len = bytes.len() as u64;
        self.settled()?;
        root.broadcast_into(&mut len);
        self.settled()?;
        let n = usize::try_from(len).map_err(|_| Error::BroadcastTooLong { len })?;
        bytes.resize(n, 0);
        // Every rank knows the length now; an empty buffer's dangling pointer is an invalid
        // argument to Open MPI 5 (MPI_ERR_ARG under fault tolerance's error handler).
        if n > 0 {
            root.broadcast_into(&mut bytes[..]);
        }
        self.settled()
    }

    /// Waits until every rank reaches this point; with fault tolerance, Err([`Error::RankLost`])
    /// when a rank was lost.
    pub fn barrier(&self) -> Result<()> {
        if let Some(m) = self.mpi.as_deref() {
            let _busy = watchdog::enter(Op::BARRIER, m.sole_peer());
            m.comm.barrier();
        }
        self.settled()
    }

    /// The torus2d grid (`--torus-shape XxY`); `None` is the near-square default. Errors when
    /// X·Y is not the world size.
    pub fn set_torus_shape(&mut self, shape: Option<(usize, usize)>) -> Result<()> {
        if let Some(s) = shape {
            torus::check_shape(s, self.size())?;
        }
        self.torus_shape = shape;
        Ok(())
    }

    /// The torus2d grid in use: the one set, else the near-square default.
    pub fn torus_shape(&self) -> (usize, usize) {
        self.torus_shape
            .unwrap_or_else(|| torus::default_shape(self.size()))
    }

    /// Treats blocks of `k` consecutive ranks as one node for `hierarchical` (to exercise the
    /// inter-node ring on one machine); `None` uses the real shared-memory nodes.
    pub fn set_ranks_per_node(&mut self, ranks_per_node: Option<usize>) -> Result<()> {
        if ranks_per_node == Some(0) {
            return Err(Error::RanksPerNode);
        }
        self.ranks_per_node = ranks_per_node;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_process_world_is_the_identity() {
        let mut w = World::single();
        assert_eq!(
            (w.rank(), w.size(), w.is_root(), w.is_mpi()),
            (0, 1, true, false)
        );
        for algo in Algorithm::ALL {
            let mut v = vec![1.5f32, -2.0, 3.25];
            let t = w.all_reduce_sum(algo, &mut v).unwrap();
            assert_eq!(v, [1.5, -2.0, 3.25]);
            assert_eq!(t.bytes_sent, 0);
        }
        for format in [Element::F16, Element::Bf16] {
            let mut v = vec![0x3e00, 0xc000];
            let t = w
                .all_reduce_sum_half(Algorithm::Ring, format, &mut v)
                .unwrap();
            assert_eq!(v, [0x3e00, 0xc000]);
            assert_eq!(t.bytes_sent, 0);
        }
        let err = w
            .all_reduce_sum_half(Algorithm::Ring, Element::F32, &mut [0])
            .unwrap_err();
        assert!(matches!(
            err,
            Error::NotSixteenBit {
                element: Element::F32
            }
        ));
        assert_eq!(w.all_gather_u64(7).unwrap(), [7]);
        let (all, t) = w.all_gather_bytes(&[4, 5]).unwrap();
        assert_eq!((all, t.bytes_sent), (vec![vec![4, 5]], 0));
        let (all, _) = w.all_gather_bytes(&[]).unwrap();
        assert_eq!(all, [Vec::<u8>::new()]);
        let mut b = vec![1, 2, 3];
        w.broadcast_bytes(&mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        let mut t = [1.0, 2.0];
        w.all_reduce_max_f64(&mut t).unwrap();
        assert_eq!(t, [1.0, 2.0]);
        w.barrier().unwrap();
    }

    #[test]
    fn only_a_majority_or_the_half_with_rank_zero_goes_on() {
        assert!(goes_on(3, &[2]));
        assert!(!goes_on(3, &[1, 2]));
        assert!(!goes_on(3, &[0, 1]));
        assert!(goes_on(4, &[2, 3]));
        assert!(!goes_on(4, &[0, 3]));
        assert!(goes_on(2, &[1]));
        assert!(!goes_on(2, &[0]));
        assert!(goes_on(5, &[0, 1]));
        assert!(!goes_on(5, &[2, 3, 4]));
        // The two sides of every cut of 4 ranks: never both.
        for mask in 0u32..16 {
            let side: Vec<usize> = (0..4).filter(|r| mask & (1 << r) != 0).collect();
            let other: Vec<usize> = (0..4).filter(|r| mask & (1 << r) == 0).collect();
            assert!(!(goes_on(4, &side) && goes_on(4, &other)), "{side:?}");
        }
    }

    #[test]
    fn a_torus_shape_must_match_the_world_size() {
        let mut w = World::single();
        assert!(matches!(
            w.set_torus_shape(Some((2, 2))),
            Err(Error::TorusShape {
                shape: (2, 2),
                world: 1
            })
        ));
        assert!(matches!(
            w.set_ranks_per_node(Some(0)),
            Err(Error::RanksPerNode)
        ));
        w.set_torus_shape(Some((1, 1))).unwrap();
        assert_eq!(w.torus_shape(), (1, 1));
        w.set_torus_shape(None).unwrap();
        assert_eq!(w.torus_shape(), (1, 1));
    }

    #[test]
    fn a_single_process_payload_sum_is_its_own_bytes() {
        let mut w = World::single();
        let payloads = [
            (Element::F32, [1.5f32, -2.0].map(f32::to_le_bytes).concat()),
            (Element::F16, vec![0x00, 0x3e, 0x00, 0xc0]),
            (Element::Bf16, vec![0xc0, 0x3f, 0x00, 0xc0]),
        ];
        for (element, payload) in payloads {
            for algo in Algorithm::ALL {
                let (sum, t) = w.all_reduce_payload(algo, element, &payload).unwrap();
                assert_eq!((sum, t.bytes_sent), (payload.clone(), 0), "{element:?}");
            }
            let (sum, _) = w.all_reduce_payload(Algorithm::Ring, element, &[]).unwrap();
            assert!(sum.is_empty());
        }
        for (element, len) in [(Element::F32, 6), (Element::F16, 3), (Element::Bf16, 1)] {
            let err = w
                .all_reduce_payload(Algorithm::Mpi, element, &vec![0; len])
                .unwrap_err();
            assert!(
                matches!(err, Error::PayloadLength { len: l, element: e } if l == len && e == element),
                "{err}"
            );
        }
    }

    #[test]
    fn a_single_process_agrees_with_itself() {
        let w = World::single();
        assert_eq!(
            w.agree_lengths(Some(12)).unwrap(),
            Agreement::Lengths(vec![12])
        );
        assert_eq!(
            w.agree_lengths(Some(0)).unwrap(),
            Agreement::Lengths(vec![0])
        );
        assert_eq!(
            w.agree_lengths(None).unwrap(),
            Agreement::Failed { rank: 0 }
        );
        assert_eq!(w.agree_failure(false).unwrap(), None);
        assert_eq!(w.agree_failure(true).unwrap(), Some(0));
        assert_eq!(w.first_message(None).unwrap(), None);
        assert_eq!(w.first_message(Some("")).unwrap(), Some((0, String::new())));
        assert_eq!(
            w.first_message(Some("trapped")).unwrap(),
            Some((0, "trapped".to_string()))
        );
    }
}
