//! `lsgd-host plot`: the curves of a training run, or of several runs on one figure.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::Args;

use crate::plot;
use crate::train::metrics;

/// Arguments of `plot`.
#[derive(Args, Debug)]
pub struct PlotArgs {
    /// The runs: each a metrics.jsonl or a run directory holding one. Several are drawn
    /// together, one line per run, with a legend.
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,
    /// A run's name in the legend, once per RUN in order (default: the run directories' names).
    #[arg(long = "label", value_name = "NAME")]
    labels: Vec<String>,
    /// The image to write (.png or .svg).
    #[arg(long, short, value_name = "FILE", default_value = "curves.png")]
    output: PathBuf,
    /// Chart title (default: the run's directory, or the runs' common directory).
    #[arg(long)]
    title: Option<String>,
}

/// Runs `plot`.
pub fn run(args: PlotArgs) -> Result<()> {
    if !args.labels.is_empty() && args.labels.len() != args.runs.len() {
        bail!(
            "{} --label for {} runs: give one per RUN, in the same order, or none",
            args.labels.len(),
            args.runs.len()
        );
    }
    let files: Vec<PathBuf> = args.runs.iter().map(|r| metrics_file(r)).collect();
    let mut runs = Vec::with_capacity(files.len());
    for file in &files {
        let records = metrics::read(file)?;
        if records.is_empty() {
            bail!("{} holds no records", file.display());
        }
        runs.push(records);
    }
    let dirs: Vec<PathBuf> = files.iter().map(|f| run_dir(f)).collect();
    let title = args.title.unwrap_or_else(|| default_title(&files, &dirs));
    let records: usize = runs.iter().map(Vec::len).sum();
    let panels = if runs.len() == 1 {
        let mut panels = plot::metrics_panels(&runs[0]);
        // A single run gets a legend only when it was given a name.
        if let Some(label) = args.labels.first() {
            for p in &mut panels {
                p.series[0].label = label.clone();
            }
        }
        panels
    } else {
        let labels = if args.labels.is_empty() {
            default_labels(&dirs)
        } else {
            args.labels
        };
        plot::compare_panels(&labels.into_iter().zip(runs).collect::<Vec<_>>())
    };
    plot::draw(&panels, &title, "epoch", &args.output)?;
    eprintln!(
        "plotted {records} records of {} run(s) to {}",
        files.len(),
        args.output.display()
    );
    Ok(())
}

/// A RUN's metrics file: itself, or the metrics.jsonl in it when it is a directory.
fn metrics_file(run: &Path) -> PathBuf {
    if run.is_dir() {
        run.join("metrics.jsonl")
    } else {
        run.to_path_buf()
    }
}

/// The directory of a metrics file, absolute where it can be, so that `.` has a name.
fn run_dir(file: &Path) -> PathBuf {
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// One run: its directory as given (today's title); several: the directory they share.
fn default_title(files: &[PathBuf], dirs: &[PathBuf]) -> String {
    if let [file] = files {
        return file
            .parent()
            .map(|p| p.display().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| file.display().to_string());
    }
    let mut common: Vec<_> = dirs[0].components().collect();
    for d in &dirs[1..] {
        let n = common
            .iter()
            .zip(d.components())
            .take_while(|(a, b)| **a == *b)
            .count();
        common.truncate(n);
    }
    let common: PathBuf = common.iter().collect();
    if common.parent().is_none() {
        format!("{} runs", files.len())
    } else {
        format!("{} runs in {}", files.len(), common.display())
    }
}

/// Each directory's shortest path suffix (its name, else name and parents) that no other run
/// shares; runs given twice are numbered.
fn default_labels(dirs: &[PathBuf]) -> Vec<String> {
    let parts: Vec<Vec<String>> = dirs
        .iter()
        .map(|d| {
            d.components()
                .rev()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .collect();
    let suffix = |i: usize, k: usize| {
        let mut p: Vec<&str> = parts[i].iter().take(k).map(String::as_str).collect();
        p.reverse();
        p.join("/").replace("//", "/")
    };
    let mut depth = vec![1; dirs.len()];
    loop {
        let labels: Vec<String> = (0..dirs.len()).map(|i| suffix(i, depth[i])).collect();
        let mut grew = false;
        for i in 0..dirs.len() {
            let clash = (0..dirs.len()).any(|j| j != i && labels[j] == labels[i]);
            if clash && depth[i] < parts[i].len() {
                depth[i] += 1;
                grew = true;
            }
        }
        if !grew {
            // Still equal with every component: the same run twice, told apart by number.
            return (0..dirs.len())
                .map(|i| {
                    if (0..dirs.len()).any(|j| j != i && labels[j] == labels[i]) {
                        let n = (0..i).filter(|&j| labels[j] == labels[i]).count();
                        format!("{} #{}", suffix(i, 1), n + 1)
                    } else {
                        labels[i].clone()
                    }
                })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(dirs: &[&str]) -> Vec<String> {
        default_labels(&dirs.iter().map(PathBuf::from).collect::<Vec<_>>())
    }

    #[test]
    fn labels_are_the_shortest_distinct_suffixes() {
        assert_eq!(
            labels(&["/o/goyal/b256", "/o/goyal/b1024"]),
            ["b256", "b1024"]
        );
        assert_eq!(
            labels(&["/o/seed1/run", "/o/seed2/run", "/o/other"]),
            ["seed1/run", "seed2/run", "other"]
        );
        assert_eq!(labels(&["/o/a", "/o/a"]), ["a #1", "a #2"]);
    }
}
