//! `bench calibrate`'s tables: each link's timings against its fits, γ, and the parameters
//! as `simulate` flags.

use std::io::Write;

use anyhow::Result;

use super::{Calibration, Link};

/// The measurements and fits as tables, and the parameters as `simulate` flags.
pub fn print(cal: &Calibration, mut out: impl Write) -> Result<()> {
    let (hosts, layout) = layout(&cal.hosts);
    writeln!(
        out,
        "# calibrate: {} ranks on {hosts} host(s) ({layout}); ranks per node {}",
        cal.ranks, cal.machine.ranks_per_node
    )?;
    writeln!(
        out,
        "# one-way = half a ping-pong round trip; exchange = both ranks send at once \
         (MPI_Sendrecv); medians; fit = α + n·β, β the least-squares slope (set by the large \
         sizes), α from the latency-bound sizes"
    )?;
    for (name, link) in [("inter-host", &cal.inter), ("intra-host", &cal.intra)] {
        if let Some(l) = link {
            print_link(name, l, &mut out)?;
        }
    }
    writeln!(
        out,
        "\n# γ: f32 a[i] += b[i] over {} B in {:.1} us (median of {}, rank 0): {:.3e} s/B ({:.2} GB/s)",
        cal.addition.bytes,
        cal.addition.seconds * 1e6,
        cal.addition.reps,
        cal.machine.gamma,
        1e-9 / cal.machine.gamma
    )?;
    for note in &cal.notes {
        writeln!(out, "# note: {note}")?;
    }
    writeln!(
        out,
        "# as simulate flags (or --model FILE with --out FILE):"
    )?;
    writeln!(out, "{}", cal.machine.simulate_flags())?;
    Ok(())
}

/// How many hosts the ranks are on, and which ranks each holds (`vm: 0,1; h2: 2`).
fn layout(hosts: &[String]) -> (usize, String) {
    let mut by_host: Vec<(&str, Vec<usize>)> = Vec::new();
    for (r, h) in hosts.iter().enumerate() {
        match by_host.iter_mut().find(|(name, _)| name == h) {
            Some((_, ranks)) => ranks.push(r),
            None => by_host.push((h, vec![r])),
        }
    }
    let layout: Vec<String> = by_host
        .iter()
        .map(|(h, rs)| {
            let rs: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
            format!("{h}: {}", rs.join(","))
        })
        .collect();
    (by_host.len(), layout.join("; "))
}

/// One link's measurements against its fits, the fits and its duplex ratio.
fn print_link(name: &str, l: &Link, out: &mut impl Write) -> Result<()> {
    writeln!(
        out,
        "\n## {name} link: rank {} ({}) ↔ rank {} ({})",
        l.ranks[0], l.hosts[0], l.ranks[1], l.hosts[1]
    )?;
    writeln!(
        out,
        "{:>10} {:>5} {:>12} {:>12} {:>7} {:>13} {:>12} {:>7}",
        "bytes", "reps", "one-way(us)", "fit(us)", "ratio", "exchange(us)", "fit(us)", "ratio"
    )?;
    for p in &l.points {
        let (fo, fe) = (l.one_way.at(p.bytes as f64), l.exchange.at(p.bytes as f64));
        writeln!(
            out,
            "{:>10} {:>5} {:>12.2} {:>12.2} {:>7.3} {:>13.2} {:>12.2} {:>7.3}",
            p.bytes,
            p.reps,
            p.one_way_s * 1e6,
            fo * 1e6,
            p.one_way_s / fo,
            p.exchange_s * 1e6,
            fe * 1e6,
            p.exchange_s / fe
        )?;
    }
    for (what, f) in [("one-way ", &l.one_way), ("exchange", &l.exchange)] {
        writeln!(
            out,
            "# {what}: α = {:.3e} s, β = {:.3e} s/B ({:.3} GB/s); R² = {:.6}, relative \
             residuals rms {:.1}%, max {:.1}%{}",
            f.alpha,
            f.beta,
            1e-9 / f.beta,
            f.r_squared,
            100.0 * f.rms_relative_residual,
            100.0 * f.max_relative_residual,
            if f.alpha_clamped {
                " (negative intercept held at α = 0)"
            } else {
                ""
            }
        )?;
    }
    writeln!(
        out,
        "# duplex: exchange β / one-way β = {:.2} (about 1: full duplex; up to 2: both \
         directions share the link); the model takes the exchange fit (a step that sends \
         and receives at once costs α + m·β)",
        l.duplex_ratio
    )?;
    Ok(())
}
