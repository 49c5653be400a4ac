//! Helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use lsgd_host::plugin::{Cache, Limits, Plugin, PluginError, PolicyKind, Runtime};
use lsgd_host::policy::{Clock, RunShape};
use lsgd_host::train::metrics::{self, Record};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A built plugin or test guest, by name (`warmup`, `bad-schedule` ...).
pub fn plugin_path(name: &str) -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let p = dir.join("plugins").join(format!("{name}.wasm"));
    assert!(
        p.is_file(),
        "{} is missing: build the plugins first with scripts/build-plugins.sh",
        p.display()
    );
    p
}

/// A runtime with default limits and a cache private to this test process.
pub fn runtime() -> Runtime {
    runtime_with(Limits::default())
}

/// A runtime with the given limits.
pub fn runtime_with(limits: Limits) -> Runtime {
    Runtime::new(Cache::new(Some(cache_dir().to_path_buf())), limits).unwrap()
}

fn cache_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("lsgd-test-cache-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// Loads a plugin by name and configures it with `settings`.
pub fn load(rt: &Runtime, name: &str, settings: &[(&str, &str)]) -> Result<Plugin, PluginError> {
    let mut p = rt.load(&plugin_path(name), None)?;
    p.configure(&owned(settings))?;
    Ok(p)
}

/// Loads a plugin expecting `kind`.
pub fn load_as(rt: &Runtime, name: &str, kind: PolicyKind) -> Result<Plugin, PluginError> {
    rt.load(&plugin_path(name), Some(kind))
}

/// `(&str, &str)` pairs as owned settings.
pub fn owned(settings: &[(&str, &str)]) -> Vec<(String, String)> {
    settings
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A Goyal-style run: `epochs` epochs of `steps` steps at global batch `batch`, k = 32.
pub fn clock(epochs: u32, steps: u64, batch: u32) -> Clock {
    Clock::new(RunShape {
        epochs,
        samples_per_epoch: steps * u64::from(batch),
        initial_batch: batch,
        world_size: 32,
        base_lr: 0.1,
        reference_batch: 256,
    })
    .unwrap()
}

/// A scratch directory unique to one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lsgd-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs the `lsgd-host` binary with the built plugins on its path and a private cache.
pub fn lsgd(args: &[&str]) -> Output {
    lsgd_command(args).output().unwrap()
}

/// The command [`lsgd`] runs, to be given a working directory or other variables first.
pub fn lsgd_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lsgd-host"));
    c.args(args)
        .env("LSGD_PLUGIN_PATH", plugin_path("warmup").parent().unwrap())
        .env("LSGD_CACHE_DIR", scratch_cache());
    c
}

/// The component cache of CLI tests.
pub fn scratch_cache() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("lsgd-test-cli-cache-{}", std::process::id()))
}

/// A command's standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `mpirun`'s flags as root on a small machine: oversubscribed, and unbound (bound ranks
/// sharing a core would spin against each other).
pub const MPIRUN_FLAGS: [&str; 4] = [
    "--allow-run-as-root",
    "--oversubscribe",
    "--bind-to",
    "none",
];

/// `mpirun` with [`MPIRUN_FLAGS`], Open MPI's shared-memory transport (no network probing),
/// the built plugins and a private component cache; the apps follow.
pub fn mpirun_command() -> std::process::Command {
    let mut cmd = std::process::Command::new("mpirun");
    cmd.args(MPIRUN_FLAGS)
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("LSGD_PLUGIN_PATH", plugin_path("warmup").parent().unwrap())
        .env("LSGD_CACHE_DIR", scratch_cache());
    cmd
}

/// Open MPI 5's `mpirun --with-ft ulfm` (from `$LSGD_OMPI5`, which scripts/setup.sh
/// installs) with [`MPIRUN_FLAGS`]' effect, its libmpi first on every rank's library path, the
/// built plugins and a private cache: how `run --fault-tolerance` is started. `None`, said
/// once per test, when it is not installed.
pub fn ulfm_mpirun() -> Option<std::process::Command> {
    let prefix = std::path::PathBuf::from(std::env::var_os("LSGD_OMPI5")?);
    let mpirun = prefix.join("bin/mpirun");
    if !mpirun.is_file() {
        eprintln!(
            "skipped: no {} (Open MPI 5 with ULFM; scripts/setup.sh installs it)",
            mpirun.display()
        );
        return None;
    }
    let mut cmd = std::process::Command::new(mpirun);
    // Eight slots here, more than any test starts: --grow-back places replacements only in
    // slots no process took (a lost one keeps its own).
    cmd.args(["--with-ft", "ulfm", "--oversubscribe", "--bind-to", "none"])
        .args(["--host", "localhost:8", "-x", "LD_LIBRARY_PATH"])
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("LSGD_PLUGIN_PATH", plugin_path("warmup").parent().unwrap())
        .env("LSGD_CACHE_DIR", scratch_cache());
    Some(cmd)
}

/// Runs `apps` (each `-np N program args…`) under [`mpirun_command`] to the end.
pub fn mpirun(apps: &[Vec<String>]) -> std::process::Output {
    let mut cmd = mpirun_command();
    for (i, app) in apps.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(app);
    }
    cmd.output()
        .expect("mpirun (Open MPI) is installed by scripts/setup.sh")
}

/// `-np N lsgd-host run`: an mpirun app, the run's flags to follow.
pub fn run_app(n: usize) -> Vec<String> {
    let bin = env!("CARGO_BIN_EXE_lsgd-host");
    ["-np", &n.to_string(), bin, "run"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// `-np N lsgd-host run` with the small cnn job's flags plus `extra`.
pub fn ranks(n: usize, out: &Path, extra: &[&str]) -> Vec<String> {
    let flags = [
        "--model",
        "cnn",
        "--train-subset",
        "640",
        "--test-subset",
        "200",
        "--epochs",
        "1",
        "--global-batch",
        "64",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--schedule",
        "warmup",
        "--set",
        "schedule.warmup_epochs=0.5",
        "--consistency-every",
        "2",
    ];
    // `run_app`'s `-np N` is no `--flag`: `extra` overrides only the run's own flags.
    let mut v = run_app(n);
    v.extend(with_out(&flags, out, extra));
    v
}

/// `run` of a 1-epoch cnn job of 20 steps at global batch 60 (divisible by 3, 2 and 1 ranks),
/// one thread per rank, plus `extra`: the job that launch and collective-timeout tests kill or
/// freeze ranks of.
pub fn cnn_job(out: &Path, extra: &[&str]) -> Vec<String> {
    let flags = [
        "run",
        "--model",
        "cnn",
        "--train-subset",
        "1200",
        "--test-subset",
        "100",
        "--epochs",
        "1",
        "--global-batch",
        "60",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "3",
        "--quiet",
    ];
    with_out(&flags, out, extra)
}

/// `flags`, then `--out out`, then `extra` replacing any of them.
pub fn with_out(flags: &[&str], out: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    v.extend(["--out".to_string(), out.display().to_string()]);
    overridden(v, extra)
}

/// `program args` started with the built plugins, a private cache and Open MPI's
/// shared-memory transport (no network probing), its stdout and stderr in files in `dir`.
pub fn spawn_logged(program: &str, args: &[String], dir: &Path) -> std::process::Child {
    let file = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    std::process::Command::new(program)
        .args(args)
        .env("LSGD_PLUGIN_PATH", plugin_path("warmup").parent().unwrap())
        .env("LSGD_CACHE_DIR", scratch_cache())
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(std::process::Stdio::null())
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .unwrap()
}

/// Waits at most `bound` for `child` to exit: its status, or `None` once it is killed for
/// running past the bound (so a test of a hang fails instead of hanging the suite).
pub fn wait_at_most(
    child: &mut std::process::Child,
    bound: std::time::Duration,
) -> Option<std::process::ExitStatus> {
    let started = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `base` flags followed by `extra`, minus each `--flag VALUE` of `base` whose flag `extra`
/// gives again: a single-valued flag given twice is refused, so a test's `extra` replaces the
/// job's own value (`--set`, which repeats, is kept).
pub fn overridden(base: Vec<String>, extra: &[&str]) -> Vec<String> {
    let given = |flag: &str| flag != "--set" && extra.contains(&flag);
    let mut v = Vec::with_capacity(base.len() + extra.len());
    let mut base = base.into_iter().peekable();
    while let Some(a) = base.next() {
        if a.starts_with("--") && given(&a) {
            // Its value too, unless it is a switch (the next word is a flag).
            base.next_if(|next| !next.starts_with("--"));
            continue;
        }
        v.push(a);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The step records of a run directory's metrics.jsonl.
pub fn steps(out: &Path) -> Vec<metrics::StepRecord> {
    metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter_map(Record::as_step)
        .cloned()
        .collect()
}

/// Whether an executable named `name` is in one of `$PATH`'s directories.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|dir| dir.join(name).is_file()))
}

/// Whether mpirun is missing (then the test says so and passes).
pub fn no_mpirun() -> bool {
    let missing = !on_path("mpirun");
    if missing {
        eprintln!("skipped: no mpirun on PATH (Open MPI; scripts/setup.sh installs it)");
    }
    missing
}

/// The pid of rank `rank` among `root`'s descendants (mpirun's children, or orted's), found
/// by the rank Open MPI puts in each process's environment.
pub fn rank_pid(root: u32, rank: usize) -> Option<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
            let ppid = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut family = vec![root];
    let mut i = 0;
    while i < family.len() {
        let p = family[i];
        family.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    family.into_iter().skip(1).find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == wanted.as_bytes()))
    })
}

/// `run` flags of a tiny deterministic CPU job: an MLP on 384 samples at global batch `batch`
/// for `epochs` epochs, then `extra`.
pub fn tiny_at(batch: u32, epochs: u32, out: &Path, extra: &[&str]) -> Vec<String> {
    let (batch, epochs) = (batch.to_string(), epochs.to_string());
    let flags = [
        "run",
        "--model",
        "mlp",
        "--train-subset",
        "384",
        "--test-subset",
        "100",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--seed",
        "5",
        "--schedule",
        "warmup",
        "--set",
        "schedule.warmup_epochs=0.5",
        "--global-batch",
        &batch,
        "--epochs",
        &epochs,
    ];
    with_out(&flags, out, extra)
}

/// A PNG's width and height, after checking its signature and header chunk.
pub fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The test accuracy (a fraction) of the last evaluation in a run directory's metrics.jsonl.
pub fn last_accuracy(out: &Path) -> f64 {
    metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter_map(Record::as_eval)
        .map(|e| e.test_acc)
        .next_back()
        .expect("an evaluation after each epoch")
}

/// The `weights blake3 …` hash a finished (or stopped) run printed.
pub fn weights(o: &Output) -> String {
    let out = stdout(o);
    out.lines()
        .find_map(|l| l.strip_prefix("weights blake3 "))
        .unwrap_or_else(|| panic!("no weights line in\n{out}\n{}", stderr(o)))
        .to_string()
}

/// The project venv's Python, found as scripts/env.sh finds it: the test command installs
/// torch and tensorboard into it.
pub use lsgd_host::train::venv::python as venv_python;

/// The step of the newest checkpoint in `out` (its `checkpoint.json`), if there is one.
pub fn checkpoint_step(out: &Path) -> Option<u64> {
    std::fs::read(out.join("checkpoint.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["step"].as_u64())
}

/// Waits until `out` holds a checkpoint of step >= 2 (a job under test has started and a
/// restart has something to resume) and returns its step; panics with the log at `stderr` when
/// `child` ends first or none comes within 120 s.
pub fn await_checkpoint(child: &mut std::process::Child, stderr: &Path, out: &Path) -> u64 {
    let started = std::time::Instant::now();
    let log = || std::fs::read_to_string(stderr).unwrap_or_default();
    loop {
        if let Some(s) = checkpoint_step(out).filter(|s| *s >= 2) {
            return s;
        }
        if let Some(s) = child.try_wait().unwrap() {
            panic!("ended ({s}) before the first checkpoint\n{}", log());
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no checkpoint in {} after 120 s\n{}",
            out.display(),
            log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The records of a run directory's metrics.jsonl that `pick` keeps.
fn records<T>(out: &Path, pick: impl FnMut(Record) -> Option<T>) -> Vec<T> {
    metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(pick)
        .collect()
}

/// The rank-lost records `run --fault-tolerance` wrote into a run directory's metrics.jsonl.
pub fn losses(out: &Path) -> Vec<metrics::RankLostRecord> {
    records(out, |r| match r {
        Record::RankLost(r) => Some(r),
        _ => None,
    })
}

/// The grew-back records `run --grow-back` wrote into a run directory's metrics.jsonl.
pub fn growths(out: &Path) -> Vec<metrics::GrewBackRecord> {
    records(out, |r| match r {
        Record::GrewBack(g) => Some(g),
        _ => None,
    })
}

/// The restart records `launch` wrote into a run directory's metrics.jsonl.
pub fn restarts(out: &Path) -> Vec<metrics::RestartRecord> {
    records(out, |r| match r {
        Record::Restart(r) => Some(r),
        _ => None,
    })
}

/// A `.npy` array of `version` (1, 2 or 3; others are written as 1's layout) whose header says
/// `descr`, `fortran` and `shape`, over `data` unchecked, so lying headers can be made.
pub fn npy(version: u8, descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| format!("{d},")).collect();
    let order = if fortran { "True" } else { "False" };
    let header = format!(
        "{{'descr': '{descr}', 'fortran_order': {order}, 'shape': ({}), }}\n",
        dims.join(" ")
    );
    let mut out = b"\x93NUMPY".to_vec();
    out.extend([version, 0]);
    match version {
        2 | 3 => out.extend((header.len() as u32).to_le_bytes()),
        _ => out.extend((header.len() as u16).to_le_bytes()),
    }
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// A zip of `(name, content, method, flags)` entries written byte by byte: method 8 is
/// deflated, any other is written as stored bytes under its number; flag bit 0 says encrypted.
pub fn zip_bytes(entries: &[(String, Vec<u8>, u16, u16)]) -> Vec<u8> {
    use std::io::Write;
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, content, method, flags) in entries {
        let data = if *method == 8 {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(content).unwrap();
            e.finish().unwrap()
        } else {
            content.clone()
        };
        let mut crc = flate2::Crc::new();
        crc.update(content);
        let mut common = Vec::new();
        for half in [20u16, *flags, *method, 0, 0] {
            common.extend(half.to_le_bytes());
        }
        for word in [crc.sum(), data.len() as u32, content.len() as u32] {
            common.extend(word.to_le_bytes());
        }
        common.extend((name.len() as u16).to_le_bytes());
        common.extend([0, 0]);
        let offset = out.len() as u32;
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(&common);
        out.extend(name.as_bytes());
        out.extend(&data);
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        central.extend(&common);
        central.extend([0u8; 10]);
        central.extend(offset.to_le_bytes());
        central.extend(name.as_bytes());
    }
    let start = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((entries.len() as u16).to_le_bytes());
    out.extend((entries.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(start.to_le_bytes());
    out.extend([0, 0]);
    out
}

/// A PNG of `width × height` RGB pixels as far as its header goes (IHDR, an IDAT of no pixels,
/// IEND), so any size can be claimed without the pixels.
pub fn png_header(width: u32, height: u32) -> Vec<u8> {
    let chunk = |kind: &[u8], data: &[u8]| {
        let mut crc = flate2::Crc::new();
        crc.update(kind);
        crc.update(data);
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend(kind);
        out.extend(data);
        out.extend(crc.sum().to_be_bytes());
        out
    };
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(
        b"IDAT",
        &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    png.extend(chunk(b"IEND", &[]));
    png
}
