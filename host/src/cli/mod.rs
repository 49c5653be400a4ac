//! The command line: clap definitions and one module per subcommand. Exit codes: 0 success,
//! 1 `compare` found a difference, 2 an error (bad input, a plugin fault).

mod args;
mod bench;
mod compare;
mod inspect;
mod launch;
mod new;
mod plot;
mod run;
mod selftest;
mod simulate;
mod study;
mod trace;

// The parsers of user-written settings, public for the property tests (tests/all/fuzz.rs).
pub use args::parse_settings;
pub use run::config_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  # Train the cnn on Fashion-MNIST with Goyal's warmup (k = 1024/256 = 4), then plot the curves
  lsgd-host run --schedule warmup --model cnn --epochs 4 --global-batch 1024 \\
      --set schedule.warmup_epochs=1 --set schedule.milestones=3 --out out/run
  lsgd-host plot out/run/metrics.jsonl -o curves.png

  # Goyal et al.: 90 epochs at batch 8192, 5 warmup epochs, ×0.1 at 30/60/80, as CSV and a plot
  lsgd-host trace --schedule warmup --epochs 90 --steps-per-epoch 156 --global-batch 8192 \\
      --plot warmup.png > warmup.csv

  # Change a parameter; add a batch-size controller (the schedule sees the batch it returns)
  lsgd-host trace --schedule warmup --set schedule.warmup_epochs=2 --batch-size batch-ramp \\
      --set batch_size.max_batch=32768 --epochs 90 --steps-per-epoch 100 --global-batch 8192

  # What a plugin is: world, WIT version, parameters, imports, compile time
  lsgd-host inspect warmup

  # Regression check for CI: exit 0 when bit-identical (or within --rtol), 1 otherwise
  lsgd-host compare warmup my-warmup.wasm --epochs 90 --steps-per-epoch 100 --global-batch 8192

  # Cost of a policy call through the sandbox vs native
  lsgd-host bench policies

  # Goyal et al.'s Figure 1 on Fashion-MNIST: every job, then out/study-goyal/report.md
  lsgd-host study goyal

  # A new plugin project in Rust, C, Python, JavaScript or Go that builds with ./build.sh
  lsgd-host new --lang python --kind schedule my-schedule

Plugin arguments are paths, or names looked up in $LSGD_PLUGIN_PATH and next to the binary.";

/// Large-batch synchronous SGD with training policies as sandboxed WebAssembly plugins.
#[derive(Parser, Debug)]
#[command(name = "lsgd-host", version, after_help = EXAMPLES, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a model; the LR, batch size and label smoothing come from policy plugins.
    Run(Box<run::RunArgs>),
    /// Run `run` under mpirun on N ranks; after lost ranks, restart from the newest checkpoint
    /// on those left (down to --min-np), up to --max-restarts times.
    Launch(launch::LaunchArgs),
    /// Plot a run's metrics.jsonl, or several runs' on one figure: losses, accuracy, LR, batch, ε.
    Plot(plot::PlotArgs),
    /// Print the policies' outputs at every step of a run, without training.
    Trace(trace::TraceArgs),
    /// Describe a plugin: world, WIT version, parameters, imports, size, compile time.
    Inspect(inspect::InspectArgs),
    /// Run two plugins over the same states; exit 1 if they differ beyond tolerance.
    Compare(compare::CompareArgs),
    /// Benchmarks that print ratios measured in one run.
    Bench(bench::BenchArgs),
    /// Create a plugin project (Rust, C, Python, JavaScript or Go) that builds with one command.
    New(new::NewArgs),
    /// Predicted all-reduce time of each algorithm on a cluster (α-β model).
    Simulate(simulate::SimulateArgs),
    Study(study::StudyArgs),
    /// Self-checks for the tests (run under mpirun).
    #[command(hide = true)]
    Selftest(selftest::SelftestArgs),
}

/// Parses the command line; for `run --config FILE`, parses again with the file's settings
/// placed before the command line's flags, which therefore win.
fn parse() -> anyhow::Result<Cli> {
    refuse_repeated_flags();
    let cli = Cli::parse_from(launch::spell_np(std::env::args_os()));
    let Command::Run(args) = &cli.command else {
        return Ok(cli);
    };
    let Some(path) = &args.config else {
        return Ok(cli);
    };
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let at = argv
        .iter()
        .position(|a| a == "run")
        .expect("the run subcommand was parsed");
    let from_file = run::config_args(path)?;
    argv.splice(at + 1..at + 1, from_file.into_iter().map(Into::into));
    Ok(Cli::try_parse_from(argv).unwrap_or_else(|e| e.exit()))
}

/// Exits with clap's usage error when the command line gives a single-valued flag twice
/// (`--schedule a --schedule b`): "the last one wins" hid mistakes, such as two schedules meant
/// as a composition. The flags a `--config` file supplies are not on the command line, so the
/// command line may still override them.
fn refuse_repeated_flags() {
    fn strict(cmd: clap::Command) -> clap::Command {
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        names
            .into_iter()
            .fold(cmd.args_override_self(false), |cmd, name| {
                cmd.mut_subcommand(name, strict)
            })
    }
    let argv = launch::spell_np(std::env::args_os());
    if let Err(e) = strict(<Cli as clap::CommandFactory>::command()).try_get_matches_from(argv)
        && e.kind() == clap::error::ErrorKind::ArgumentConflict
    {
        e.exit();
    }
}

/// Parses the command line, runs it and maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let outcome = parse().and_then(|cli| {
        // Before MPI, libtorch or a loader starts a thread (see `one_malloc_arena`).
        if !matches!(&cli.command, Command::Run(a) if a.tolerant()) {
            crate::train::one_malloc_arena();
        }
        run_command(cli)
    });
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            print_error(&e);
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Runs the parsed command; false when it ran and found what it checks failing.
fn run_command(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Run(a) => run::run(*a).map(|()| true),
        Command::Launch(a) => launch::run(a),
        Command::Plot(a) => plot::run(a).map(|()| true),
        Command::Trace(a) => trace::run(a).map(|()| true),
        Command::Inspect(a) => inspect::run(a).map(|()| true),
        Command::Compare(a) => compare::run(a),
        Command::Bench(a) => bench::run(a).map(|()| true),
        Command::New(a) => new::run(a).map(|()| true),
        Command::Simulate(a) => simulate::run(a).map(|()| true),
        Command::Study(a) => study::run(a).map(|()| true),
        Command::Selftest(a) => selftest::run(a),
    }
}

/// The exit code of an error (bad input, a plugin fault).
const EXIT_ERROR: u8 = 2;

/// Prints `error: …` to standard error in one write. Under mpirun every rank may print the
/// same error, and `eprintln!` writes each formatted piece on its own (ten writes for "torus
/// shape 2x2 needs 4 ranks, …"), so two ranks' pieces interleaved into one garbled line.
fn print_error(e: &anyhow::Error) {
    use std::io::Write;
    let line = format!("error: {e:#}\n");
    // Nothing left to tell if standard error itself is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
