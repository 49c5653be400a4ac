//! mpirun's output, copied through to ours and read for what it says of lost ranks: Open
//! MPI's notices of lost processes and daemons, and the ranks' collective-timeout reports.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::collective::watchdog::Report;

/// A rank Open MPI reported lost, or one that did not report a collective timeout when others
/// did.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Loss {
    pub(super) rank: u32,
    /// The signal number and Open MPI's name for it (`Killed`).
    pub(super) signal: Option<(i32, String)>,
    /// The host it ran on, when known.
    pub(super) node: Option<String>,
    /// Lost because it did not report a collective timeout (Open MPI said nothing of it).
    pub(super) silent: bool,
}

impl Loss {
    /// Reads Open MPI's (and PRRTE's) notices of a lost process: "mpirun noticed that process
    /// rank 1 with PID 0 on node vm exited on signal 9 (Killed)." and "… process rank 1 with PID
    /// 0 on node vm exiting improperly". "exited with non-zero status" is no loss: the rank
    /// ended on its own, with its own error.
    fn parse(line: &str) -> Option<Loss> {
        let (_, rest) = line.split_once("process rank ")?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let rank = digits.parse().ok()?;
        let node = rest
            .split_once(" on node ")
            .and_then(|(_, n)| n.split_whitespace().next())
            .map(String::from);
        if let Some((_, sig)) = rest.split_once("exited on signal ") {
            let number: String = sig.chars().take_while(char::is_ascii_digit).collect();
            let name = sig
                .split_once('(')
                .and_then(|(_, n)| n.split_once(')'))
                .map_or(String::new(), |(n, _)| n.to_string());
            return Some(Loss {
                rank,
                signal: number.parse().ok().map(|n| (n, name)),
                node,
                silent: false,
            });
        }
        rest.contains("exiting improperly").then_some(Loss {
            rank,
            signal: None,
            node,
            silent: false,
        })
    }
}

/// The host of Open MPI's notice that it lost a daemon, and with it every rank on that host:
/// "  Remote daemon: [[51440,0],1] on node h2".
fn lost_node(line: &str) -> Option<String> {
    let (_, rest) = line.split_once("Remote daemon")?;
    let (_, node) = rest.split_once(" on node ")?;
    node.split_whitespace().next().map(String::from)
}

/// PRRTE's notice of a daemon whose launch agent (ssh) ended with a failure while the job ran
/// ("A daemon failed to report back after being spawned"), on mpirun's stdout. It names the
/// host lines later: "  Remote host:   h3".
const DAEMON_FAILED: &str = "A daemon failed to report back";

/// The host of [`DAEMON_FAILED`]'s notice: "  Remote host:   h3".
fn remote_host(line: &str) -> Option<String> {
    let rest = line.trim_start().strip_prefix("Remote host:")?;
    rest.split_whitespace().next().map(String::from)
}

/// The losses and lost hosts in words: "rank 1 (signal 9, Killed) and host(s) h2".
pub(super) fn describe(losses: &[Loss], hosts: &[String]) -> String {
    let one = |l: &Loss| match &l.signal {
        _ if l.silent => format!(
            "rank {} (on {}: no collective-timeout report from it)",
            l.rank,
            l.node.as_deref().unwrap_or("an unknown host")
        ),
        Some((n, name)) if !name.is_empty() => format!("rank {} (signal {n}, {name})", l.rank),
        Some((n, _)) => format!("rank {} (signal {n})", l.rank),
        None => format!("rank {} (exited without finalizing MPI)", l.rank),
    };
    let ranks: Vec<String> = losses.iter().map(one).collect();
    let ranks = ranks.join(", ");
    match (ranks.is_empty(), hosts.is_empty()) {
        (_, true) => ranks,
        (true, false) => format!("host(s) {}", hosts.join(", ")),
        (false, false) => format!("{ranks} and host(s) {}", hosts.join(", ")),
    }
}

/// What one attempt's output said about lost ranks.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Open MPI's notices of lost ranks.
    losses: Vec<Loss>,
    /// Collective-timeout reports, one per rank.
    reports: Vec<Report>,
    /// When the first report came.
    pub(super) first_report: Option<Instant>,
    /// Hosts whose daemon Open MPI lost.
    nodes: Vec<String>,
    /// [`DAEMON_FAILED`]'s notice began and has not named its host yet.
    daemon_failed: bool,
}

impl Seen {
    fn line(&mut self, line: &str) {
        if let Some(l) = Loss::parse(line) {
            if !self.losses.iter().any(|o| o.rank == l.rank) {
                self.losses.push(l);
            }
        } else if let Some(r) = Report::parse(line) {
            self.first_report.get_or_insert_with(Instant::now);
            if !self.reports.iter().any(|o| o.rank == r.rank) {
                self.reports.push(r);
            }
        } else if line.contains(DAEMON_FAILED) {
            self.daemon_failed = true;
        } else if let Some(n) = lost_node(line)
            .or_else(|| remote_host(line).filter(|_| std::mem::take(&mut self.daemon_failed)))
            && !self.nodes.contains(&n)
        {
            self.nodes.push(n);
        }
    }
}

/// Copies a child's output to ours as it comes, and collects what it says of lost ranks.
pub(super) fn pump(mut from: impl Read, mut to: impl Write, seen: Arc<Mutex<Seen>>) {
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    let flush = |line: &mut Vec<u8>| {
        seen.lock()
            .expect("no pump panics holding the lock")
            .line(&String::from_utf8_lossy(line));
        line.clear();
    };
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // A closed terminal must not stall the job: the bytes are still read and parsed.
        let _ = to.write_all(&buf[..n]).and_then(|()| to.flush());
        for &b in &buf[..n] {
            match b {
                b'\n' | b'\r' => flush(&mut line),
                // Open MPI's notices are short and a timeout report lists hosts, not ranks; a
                // longer line is something else.
                _ if line.len() < 1 << 16 => line.push(b),
                _ => {}
            }
        }
    }
    flush(&mut line);
}

/// The ranks lost in an attempt of `np` ranks and the hosts lost with them: Open MPI's lost
/// ranks; when ranks reported a collective timeout, also every rank that did not; the hosts
/// whose daemon Open MPI lost, and those on which no rank is left (known from the reports'
/// host lists).
pub(super) fn lost(seen: &Seen, np: u32) -> (Vec<Loss>, Vec<String>) {
    let hosts = seen.reports.first().map(|r| r.hosts.as_slice());
    let host = |rank: u32| hosts.and_then(|h| h.get(rank as usize)).cloned();
    let mut losses: Vec<Loss> = seen.losses.clone();
    if !seen.reports.is_empty() {
        for rank in 0..np {
            let reported = seen.reports.iter().any(|r| r.rank == rank as usize);
            if !reported && !losses.iter().any(|l| l.rank == rank) {
                losses.push(Loss {
                    rank,
                    signal: None,
                    node: host(rank),
                    silent: true,
                });
            }
        }
        losses.sort_by_key(|l| l.rank);
    }
    let mut nodes = seen.nodes.clone();
    if let Some(hosts) = hosts {
        let alive = |h: &String| {
            (0..np).any(|r| hosts.get(r as usize) == Some(h) && !losses.iter().any(|l| l.rank == r))
        };
        for h in losses.iter().filter_map(|l| host(l.rank)) {
            if !alive(&h) && !nodes.contains(&h) {
                nodes.push(h);
            }
        }
    }
    (losses, nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mpi_notices_of_lost_ranks_are_read_and_exit_codes_are_not() {
        assert_eq!(
            Loss::parse(
                "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
            ),
            Some(Loss {
                rank: 1,
                signal: Some((9, "Killed".into())),
                node: Some("vm".into()),
                silent: false,
            })
        );
        assert_eq!(
            Loss::parse(
                "prterun noticed that process rank 12 with PID 4242 on node n3 exited on signal 11 (Segmentation fault)."
            ),
            Some(Loss {
                rank: 12,
                signal: Some((11, "Segmentation fault".into())),
                node: Some("n3".into()),
                silent: false,
            })
        );
        assert_eq!(
            Loss::parse(
                "mpirun has exited due to process rank 2 with PID 0 on node vm exiting improperly. There are three reasons this could occur:"
            ),
            Some(Loss {
                rank: 2,
                signal: None,
                node: Some("vm".into()),
                silent: false,
            })
        );
        for line in [
            "mpirun detected that one or more processes exited with non-zero status, thus causing",
            "  Process name: [[26368,1],2]",
            "  Exit code:    2",
            "Primary job  terminated normally, but 1 process returned",
        ] {
            assert_eq!(Loss::parse(line), None, "{line}");
        }
    }

    fn seen(lines: &[&str]) -> Seen {
        let mut s = Seen::default();
        for l in lines {
            s.line(l);
        }
        s
    }

    const RANKS: &str = "ranks: 0-1=h1,2-3=h2,4=h3; no checkpoint yet";

    #[test]
    fn ranks_that_did_not_report_a_collective_timeout_are_lost_with_hosts_left_empty() {
        let report = |rank: u32, host: &str, peer: u32| {
            format!(
                "error: collective timeout: rank {rank} (host {host}) made no progress for 3.0 s in ring all-reduce, waiting on rank {peer} (host h2); {RANKS}"
            )
        };
        // h2 was cut: its ranks 2 and 3 cannot report; rank 1 is killed by mpirun first.
        let lines = [report(0, "h1", 3), report(4, "h3", 3), report(0, "h1", 3)];
        let s = seen(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(s.reports.len(), 2, "one report per rank");
        assert!(s.first_report.is_some());
        let (losses, hosts) = lost(&s, 5);
        let ranks: Vec<u32> = losses.iter().map(|l| l.rank).collect();
        assert_eq!(ranks, [1, 2, 3]);
        assert!(losses.iter().all(|l| l.silent && l.signal.is_none()));
        // h1 keeps rank 0, so only h2 goes.
        assert_eq!(hosts, ["h2"]);
        assert_eq!(
            describe(&losses[1..2], &[]),
            "rank 2 (on h2: no collective-timeout report from it)"
        );
    }

    #[test]
    fn open_mpi_losses_and_lost_daemons_count_without_reports() {
        let s = seen(&[
            "mpirun noticed that process rank 1 with PID 0 on node h2 exited on signal 9 (Killed).",
            "ORTE has lost communication with a remote daemon.",
            "  HNP daemon   : [[51440,0],0] on node h1",
            "  Remote daemon: [[51440,0],1] on node h3",
        ]);
        let (losses, hosts) = lost(&s, 3);
        assert_eq!(losses.len(), 1);
        assert_eq!((losses[0].rank, losses[0].silent), (1, false));
        // Without reports nothing says whether rank 1 was h2's only rank: h2 stays.
        assert_eq!(hosts, ["h3"]);
        let (losses, hosts) = lost(&seen(&["Primary job  terminated normally"]), 3);
        assert!(losses.is_empty() && hosts.is_empty());
    }

    #[test]
    fn a_daemon_whose_agent_failed_is_a_lost_host() {
        // What Open MPI 5.0.11's mpirun printed on its stdout, exiting 137, when the ssh agent
        // of h3's daemon ended (killed) before mpirun saw the daemon's connection close.
        let s = seen(&[
            "------------------------------------------------------------",
            "A daemon failed to report back after being spawned. This could",
            "be due to several factors, including inability to find the",
            "back to prterun:",
            "",
            "  Local host:    h1",
            "  Remote host:   h3",
            "  Daemon exit status: 137",
        ]);
        let (losses, hosts) = lost(&s, 3);
        assert!(losses.is_empty());
        assert_eq!(hosts, ["h3"]);
        // "Remote host" outside that notice names nothing.
        let (_, hosts) = lost(&seen(&["  Remote host:   h3"]), 3);
        assert!(hosts.is_empty());
    }
}
