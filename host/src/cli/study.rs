//! `lsgd-host study NAME`: reproduce a paper's experiment and write its report.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use crate::study::{self, Name, Recipe, Settings};
use crate::train::data::DatasetKind;

/// Arguments of `study`.
#[derive(Args, Debug)]
pub struct StudyArgs {
    /// Which study: goyal, batch-control, compression, layerwise, network or sync.
    #[arg(value_enum)]
    name: Name,
    /// The few-minute variant (smaller subsets, fewer jobs, one seed) that the tests run.
    #[arg(long)]
    quick: bool,
    /// Output directory: report.md, PNGs and jobs/ [default: out/study-NAME, or
    /// out/study-NAME-quick with --quick].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Seeds 1..=N for every job [default: 2, or 1 with --quick].
    #[arg(long, value_name = "N")]
    seeds: Option<u64>,
    /// libtorch threads of each job (of each rank under mpirun).
    #[arg(long, default_value_t = 1, value_name = "N")]
    threads: usize,
    /// Single-process jobs run at once [default: the cores / --threads].
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Ranks of the compression and network studies' jobs (the sync study trains on 2 and 4
    /// hosts).
    #[arg(long = "np", default_value_t = 2, value_name = "N")]
    ranks: u32,
    /// The mpirun to start ranks with.
    #[arg(long, default_value = "mpirun", value_name = "PATH")]
    mpirun: PathBuf,
    /// The emulated cluster's script, for the network and sync studies [default:
    /// $LSGD_ROOT/scripts/netlab.sh, else ./scripts/netlab.sh].
    #[arg(long, value_name = "PATH")]
    netlab: Option<PathBuf>,
    /// The data set: fashion-mnist (the `cnn` the plans were tuned for), mnist, or cifar10 /
    /// cifar100 (He et al.'s ResNet-20 with CIFAR augmentation, LR 0.1 per 128 samples,
    /// momentum 0.9, weight decay 10⁻⁴).
    #[arg(long, value_enum, default_value_t = DatasetKind::FashionMnist)]
    dataset: DatasetKind,
    /// The data set's directory (default: Fashion-MNIST's).
    #[arg(long, alias = "data", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

/// Runs `study`.
pub fn run(args: StudyArgs) -> Result<()> {
    let seeds = args.seeds.unwrap_or(if args.quick { 1 } else { 2 });
    if seeds == 0 || args.threads == 0 || args.jobs == Some(0) {
        bail!("--seeds, --threads and --jobs must be at least 1");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let suffix = if args.quick { "-quick" } else { "" };
    let settings = Settings {
        name: args.name,
        quick: args.quick,
        out: args
            .out
            .unwrap_or_else(|| PathBuf::from(format!("out/study-{}{suffix}", args.name))),
        seeds: (1..=seeds).collect(),
        threads: args.threads,
        parallel: args.jobs.unwrap_or((cores / args.threads).max(1)),
        ranks: args.ranks,
        mpirun: args.mpirun,
        netlab: args.netlab,
        recipe: Recipe::new(args.dataset)?,
        data: super::run::data_dir(args.dataset, args.data_dir.as_deref())?,
        command: std::iter::once("lsgd-host".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
    };
    let report = study::run(&settings)?;
    println!("{}", report.display());
    Ok(())
}
