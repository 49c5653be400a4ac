//! `lsgd-host bench`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::args::LimitArgs;
use super::trace::Format;
use crate::bench::{allreduce, calibrate, codecs, ddp, languages, loader, policies, train};
use crate::model::Arch;
use crate::precision::Precision;
use crate::train::augment::Augment;
use crate::train::data::DatasetKind;

/// Arguments of `bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Median ns per policy call through the sandbox vs the same formula compiled natively.
    Policies {
        /// Plugins to measure (paths or names); default: every reference plugin, then the
        /// warmup schedule in every plugin language (Rust, C, Python, JavaScript, Go).
        plugins: Vec<String>,
        /// Timed rounds over 9,000 states each; the median round is reported.
        #[arg(long, default_value_t = 21)]
        rounds: usize,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// `lsgd-host run` vs the same job in PyTorch (samples/s ratio), and the policies' share
    /// of a step through the sandbox vs native.
    Train {
        /// Network (the PyTorch script mirrors `cnn`, `mlp` and `resnet`).
        #[arg(long, value_enum, default_value_t = Arch::Cnn)]
        model: Arch,
        /// ResNet depth, 6n + 2 (with --model resnet).
        #[arg(long, default_value_t = 20)]
        depth: u32,
        /// The data set: fashion-mnist, mnist, cifar10 or cifar100 (the PyTorch script reads
        /// those).
        #[arg(long, value_enum, default_value_t = DatasetKind::FashionMnist)]
        dataset: DatasetKind,
        /// Training augmentation on both sides: none or cifar.
        #[arg(long, value_enum, default_value_t = Augment::None)]
        augment: Augment,
        /// Global batch.
        #[arg(long, default_value_t = 256)]
        global_batch: u32,
        /// libtorch threads on both sides (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed steps.
        #[arg(long, default_value_t = 60)]
        steps: u64,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup_steps: u64,
        /// Rounds of (WASM run, native run, PyTorch run), alternated; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// The data set's directory (default: Fashion-MNIST's).
        #[arg(long, alias = "data", value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Time on N random images written in the data set's format (cifar10, cifar100)
        /// instead of --data-dir: throughput without the download.
        #[arg(long, value_name = "N", conflicts_with = "data_dir")]
        synthetic: Option<usize>,
        /// Python with torch importable (default: the project venv's).
        #[arg(long)]
        python: Option<PathBuf>,
        /// Also time both sides at this precision (bf16, fp16) and print the speed-up over fp32.
        #[arg(long, value_enum, default_value_t = Precision::Fp32)]
        precision: Precision,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Image decoding against training: the loader alone (images/s) and `lsgd-host run` on
    /// the same image folder (samples/s); without --data-dir, on synthetic 500×375 JPEGs.
    Loader {
        /// An image folder (`train/CLASS/*.jpg` …); default: a synthetic one.
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Synthetic images to write without --data-dir.
        #[arg(long, default_value_t = 512)]
        images: usize,
        /// Side of the images made.
        #[arg(long, default_value_t = 224, value_name = "PX")]
        image_size: u32,
        /// Training augmentation.
        #[arg(long, value_enum, default_value_t = Augment::Imagenet)]
        augment: Augment,
        /// Decoding threads.
        #[arg(long, default_value_t = 2, value_name = "N")]
        loader_threads: usize,
        /// Network trained.
        #[arg(long, value_enum, default_value_t = Arch::Resnet)]
        model: Arch,
        /// ResNet depth.
        #[arg(long, default_value_t = 20)]
        depth: u32,
        /// Global batch.
        #[arg(long, default_value_t = 64)]
        global_batch: u32,
        /// libtorch threads of the training run (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed steps.
        #[arg(long, default_value_t = 10)]
        steps: u64,
        /// Untimed steps first.
        #[arg(long, default_value_t = 2)]
        warmup_steps: u64,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// `mpirun -np N lsgd-host run` vs the same job in PyTorch DistributedDataParallel (gloo)
    /// under torchrun (samples/s ratio), and each side's communication time per step.
    Ddp {
        /// Network (the PyTorch script mirrors `cnn` and `mlp`).
        #[arg(long, value_enum, default_value_t = Arch::Cnn)]
        model: Arch,
        /// Global batch, split evenly across the ranks.
        #[arg(long, default_value_t = 256)]
        global_batch: u32,
        /// libtorch threads per rank on both sides.
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Ranks on both sides.
        #[arg(long, default_value_t = 2)]
        np: usize,
        /// Timed steps.
        #[arg(long, default_value_t = 40)]
        steps: u64,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup_steps: u64,
        /// Rounds of (lsgd-host, PyTorch), alternated; medians are reported.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// IDX directory.
        #[arg(long, default_value = crate::data::DEFAULT_DIR)]
        data: PathBuf,
        /// Python with torch importable (default: the project venv's).
        #[arg(long)]
        python: Option<PathBuf>,
        /// lsgd-host's gradient all-reduce algorithm.
        #[arg(long, value_enum, default_value_t = crate::collective::Algorithm::Mpi)]
        allreduce: crate::collective::Algorithm,
        /// Gradient bucket cap of both sides, MiB (`run --bucket-mb`'s default; DDP's
        /// bucket_cap_mb).
        #[arg(long, default_value_t = 25.0, value_name = "MIB")]
        bucket_mb: f64,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// Encode+decode GB/s of each codec plugin vs the same code compiled natively, and the
    /// compression ratio, on 1M- and 16M-float buckets.
    Codecs {
        /// Codecs by describe() name (plugin file `codec-NAME`); default: every reference codec.
        codecs: Vec<String>,
        /// Floats per bucket: a list such as `1M,16M`, or `4K..64M` (powers of two).
        #[arg(long, default_value = "1M,16M", value_parser = allreduce::parse_sizes)]
        sizes: std::vec::Vec<usize>,
        /// Timed rounds per side (alternated); the median is reported.
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Each all-reduce algorithm against MPI_Allreduce, nccl-tests style; run under mpirun
    /// (`mpirun -np 4 lsgd-host bench allreduce --algo all --sizes 4K..64M`).
    Allreduce {
        /// `all` or a comma-separated list: mpi, ring, halving-doubling, binary-blocks, torus2d,
        /// hierarchical.
        #[arg(long, default_value = "all", value_parser = crate::collective::Algorithm::parse_list)]
        algo: std::vec::Vec<crate::collective::Algorithm>,
        /// Floats per vector: `4K..64M` (powers of two between the bounds) or a list `4K,1M`.
        #[arg(long, default_value = "4K..64M", value_parser = allreduce::parse_sizes)]
        sizes: std::vec::Vec<usize>,
        /// Timed iterations per size (default: 50 at small sizes down to 9 at 64 MB).
        #[arg(long)]
        iters: Option<usize>,
        /// Untimed iterations per size first.
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Torus grid XxY for torus2d (default: near-square).
        #[arg(long, value_parser = crate::collective::parse_shape)]
        torus_shape: Option<(usize, usize)>,
        /// A model file (`bench calibrate --out`): adds each row's α-β prediction on this
        /// world (its size, torus grid and ranks per host) and measured/predicted.
        #[arg(long, visible_alias = "predict", value_name = "FILE")]
        model: Option<PathBuf>,
        /// `json` prints the measurements as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
    /// The α-β-γ model's machine parameters fitted from measurements, under mpirun with 2 or
    /// more ranks: ping-pongs and two-way exchanges between hosts and inside one, and the f32
    /// addition (`mpirun -np 2 lsgd-host bench calibrate --out model.json`).
    Calibrate {
        /// Message sizes in bytes: a list `0,8,4K,1M` or `8..16M` (powers of two).
        #[arg(
            long,
            default_value = "0,8,64,512,4K,32K,256K,1M,4M,16M",
            value_parser = allreduce::parse_sizes
        )]
        sizes: std::vec::Vec<usize>,
        /// Timed repetitions per size (default: 51 at small sizes down to 5 at 8 MiB and up);
        /// the median is taken.
        #[arg(long)]
        reps: Option<usize>,
        /// Untimed repetitions per size first.
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        /// Bytes of each vector in the timed f32 addition (γ), with K/M/G suffixes.
        #[arg(long, default_value = "16M", value_parser = allreduce::parse_count)]
        gamma_bytes: usize,
        /// Also write the calibration as JSON here (the model file of `simulate --model`).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// `json` prints the calibration as JSON.
        #[arg(long, value_enum)]
        format: Option<Format>,
    },
}

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.what {
        BenchCommand::Policies {
            plugins,
            rounds,
            format,
            limits,
        } => bench_policies(plugins, rounds, format, &limits),
        BenchCommand::Train {
            model,
            depth,
            dataset,
            augment,
            global_batch,
            threads,
            steps,
            warmup_steps,
            rounds,
            data_dir,
            synthetic,
            python,
            precision,
            format,
            limits,
        } => {
            let scratch =
                std::env::temp_dir().join(format!("lsgd-bench-synthetic-{}", std::process::id()));
            let data_dir = match synthetic {
                Some(n) => {
                    train::synthetic_records(dataset, n, &scratch)?;
                    Some(scratch.clone())
                }
                None => data_dir,
            };
            let setup = train::Setup {
                model,
                depth,
                dataset,
                augment,
                batch: global_batch,
                threads: threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                steps,
                warmup: warmup_steps,
                rounds,
                data: super::run::data_dir(dataset, data_dir.as_deref())?,
                python: python.unwrap_or_else(crate::train::venv::python),
                precision,
            };
            let report = train::run(&setup, &limits.runtime()?);
            let _ = std::fs::remove_dir_all(&scratch);
            let report = report?;
            emit(format, &report, |out| train::print(&setup, &report, out))
        }
        BenchCommand::Loader {
            data_dir,
            images,
            image_size,
            augment,
            loader_threads,
            model,
            depth,
            global_batch,
            threads,
            steps,
            warmup_steps,
            format,
        } => {
            let setup = loader::Setup {
                data: data_dir,
                images,
                image_size,
                augment,
                loader_threads,
                batch: global_batch,
                steps,
                warmup: warmup_steps,
                model,
                depth,
                threads: threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            };
            let report = loader::run(&setup)?;
            emit(format, &report, |out| loader::print(&setup, &report, out))
        }
        BenchCommand::Ddp {
            model,
            global_batch,
            threads,
            np,
            steps,
            warmup_steps,
            rounds,
            data,
            python,
            allreduce,
            bucket_mb,
            format,
        } => {
            let setup = ddp::Setup {
                model,
                batch: global_batch,
                threads,
                np,
                steps,
                warmup: warmup_steps,
                rounds,
                data,
                python: python.unwrap_or_else(crate::train::venv::python),
                allreduce,
                bucket_mb,
            };
            let report = ddp::run(&setup)?;
            emit(format, &report, |out| ddp::print(&setup, &report, out))
        }
        BenchCommand::Codecs {
            codecs: names,
            sizes,
            rounds,
            format,
            limits,
        } => bench_codecs(names, &sizes, rounds, format, limits),
        BenchCommand::Allreduce {
            algo,
            sizes,
            iters,
            warmup,
            torus_shape,
            model,
            format,
        } => {
            // Read before measuring, so a bad file fails at once, on every rank alike.
            let machine = model.as_deref().map(calibrate::Machine::load).transpose()?;
            let mut world = crate::collective::World::init()?;
            world.set_torus_shape(torus_shape)?;
            let setup = allreduce::Setup {
                algos: algo,
                sizes,
                iters,
                warmup,
            };
            let mut rows = allreduce::run(&mut world, &setup)?;
            let mut header = None;
            if let (Some(machine), Some(path)) = (machine, &model) {
                // This world's layout, not the calibration run's: `hierarchical` runs on the
                // hosts this run has.
                let hosts = world.hostnames()?;
                let local = calibrate::Machine {
                    ranks_per_node: calibrate::ranks_per_node(&hosts),
                    ..machine
                };
                let cost = local.cost_model(Some(world.torus_shape()));
                allreduce::predict(&mut rows, &cost, world.size());
                header = Some(format!(
                    "# predicted: α-β model of {} on this world ({} rank(s) per host): {}",
                    path.display(),
                    local.ranks_per_node,
                    local.simulate_flags()
                ));
            }
            // Every rank holds the same rows; rank 0 alone prints them.
            if !world.is_root() {
                return Ok(());
            }
            emit(format, &rows, |mut out| {
                if let Some(h) = &header {
                    writeln!(out, "{h}")?;
                }
                allreduce::print_table(&world, &rows, out)
            })
        }
        BenchCommand::Calibrate {
            sizes,
            reps,
            warmup,
            gamma_bytes,
            out,
            format,
        } => {
            let world = crate::collective::World::init()?;
            let setup = calibrate::Setup {
                sizes,
                reps,
                warmup,
                gamma_bytes,
            };
            let cal = calibrate::run(&world, &setup)?;
            if !world.is_root() {
                return Ok(());
            }
            if let Some(path) = &out {
                let json = serde_json::to_string_pretty(&cal)?;
                std::fs::write(path, json + "\n")
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            emit(format, &cal, |out| calibrate::print(&cal, out))
        }
    }
}

/// Prints `value` as JSON with `--format json`, else as `table` prints it.
fn emit<T: serde::Serialize, E: Into<anyhow::Error>>(
    format: Option<Format>,
    value: &T,
    table: impl FnOnce(std::io::StdoutLock<'static>) -> std::result::Result<(), E>,
) -> Result<()> {
    if format == Some(Format::Json) {
        println!("{}", serde_json::to_string_pretty(value)?);
        Ok(())
    } else {
        table(std::io::stdout().lock()).map_err(Into::into)
    }
}

/// `bench policies`: the given plugins, or every reference plugin and the warmup schedule in
/// each guest language.
fn bench_policies(
    plugins: Vec<String>,
    rounds: usize,
    format: Option<Format>,
    limits: &LimitArgs,
) -> Result<()> {
    let by_language = plugins.is_empty();
    let plugins = if by_language {
        policies::REFERENCE_PLUGINS
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        plugins
    };
    let runtime = limits.runtime()?;
    let mut rows = policies::run(&runtime, &plugins, rounds)?;
    let languages = if by_language {
        languages::run(&runtime, &rows, rounds)?
    } else {
        Vec::new()
    };
    if format == Some(Format::Json) {
        // One list of measurements: the language rows not already in it are appended.
        for m in languages.iter().filter_map(|l| l.measurement.as_ref()) {
            if !rows.iter().any(|r| r.plugin == m.plugin) {
                rows.push(m.clone());
            }
        }
    }
    emit(format, &rows, |mut out| {
        policies::print_table(&rows, &mut out)?;
        if !languages.is_empty() {
            languages::print_table(&languages, &mut out)?;
        }
        std::io::Result::Ok(())
    })
}

/// `bench codecs`: the given codecs, or every reference codec.
fn bench_codecs(
    names: Vec<String>,
    sizes: &[usize],
    rounds: usize,
    format: Option<Format>,
    limits: LimitArgs,
) -> Result<()> {
    let names: Vec<String> = if names.is_empty() {
        codecs::REFERENCE_CODECS
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        names
    };
    // A 16M-float bucket is 64 MiB in and out of the instance, and takes far longer than a
    // training bucket: the default limits are for 1M-float buckets. The other settings
    // (--codec-canonical-nans) are the user's.
    let limits = LimitArgs {
        plugin_memory_mb: limits.plugin_memory_mb.max(1024),
        plugin_deadline_ms: limits.plugin_deadline_ms.max(1000),
        ..limits
    };
    let rows = codecs::run(&limits.runtime()?, &names, sizes, rounds)?;
    emit(format, &rows, |out| codecs::print_table(&rows, out))
}
