//! The wasmtime engines of the process and everything shared by all plugins: the linkers with
//! the (empty) WASI sandbox, whose waits never block (`super::waits`), the compiled-component
//! cache, the epoch ticker that enforces the wall-clock backstop, and the default limits.
//!
//! A call's budget is fuel ([`Metering::FuelAndDeadline`], for policies and codecs alike): it
//! counts WebAssembly instructions, so every rank runs out at the same call whatever its load,
//! where a wall-clock deadline let one rank of a loaded node time out and another not. The
//! epoch deadline stays as a backstop, far above any budget (1000 ms per policy call, 100 s per
//! codec or setup call by default). `bench policies` and `bench codecs` measure what each
//! metering costs (fuel and epoch, epoch only, neither) in the same alternated rounds, and
//! each plugin's fuel per call, from which the defaults in [`super::sandbox`] are chosen with
//! at least 20 times headroom; `docs/plugin-contract.md` records the numbers. Codecs use fuel
//! too: measured at 1M floats it costs nothing where the boundary's copies dominate (identity,
//! int8, top-k, powersgd) and 10-25% on scalar per-float loops (qsgd, terngrad, dgc,
//! threshold), about what the epoch checks already cost them, and a 1M-float bucket is where a
//! loaded rank would otherwise miss a wall-clock deadline that another rank meets. Compiled code
//! differs with the metering, and the cache keys on the engine's compatibility hash, which
//! covers it, so no entry compiled without fuel is loaded into a fuel engine.
//!
//! Policies and codecs get an engine each, because they differ in one compiler setting:
//! policies are compiled with canonical NaNs, so that every rank computes bit-identical
//! decisions even on CPUs whose NaN bit patterns differ (x86 and Arm in one job); for a codec
//! that setting costs up to a third of its speed on float loops (`bench codecs` measures it
//! in its `canon NaN` column), and a NaN in a gradient already spoils the step whatever its
//! bits, so codecs are compiled without it unless [`EngineOptions::canonical_codec_nans`]
//! asks for it.

use std::path::Path;
use std::sync::Arc;
use std::thread;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine, EngineWeak, OptLevel};

use super::cache::Cache;
use super::contract::{Contract, PolicyKind};
use super::error::{Fault, PluginError, wasm_msg};
use super::instance::{Facts, Plugin};
use super::sandbox::{Limits, Sandbox, TICK};
use super::words::{CLI, Knob, Words};
use crate::Result;

/// What an engine's compiled code counts to bound a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// Fuel, the deterministic budget, and epoch checks, the wall-clock backstop.
    FuelAndDeadline,
    /// Epoch checks only: a wall-clock deadline, which a loaded machine can make one rank miss
    /// and not another.
    Deadline,
    /// Neither: a guest that never returns hangs the host. For benchmarks only.
    Unmetered,
}

impl Metering {
    /// Whether the compiled code counts fuel.
    pub fn fuel(self) -> bool {
        self == Metering::FuelAndDeadline
    }

    /// Whether the compiled code checks the epoch deadline.
    pub fn deadline(self) -> bool {
        self != Metering::Unmetered
    }
}

/// Compiler settings of a runtime's engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Compile codec plugins with canonical NaNs too, as policies always are: for jobs whose
    /// ranks run on CPUs of different architectures.
    pub canonical_codec_nans: bool,
    /// What policy plugins are compiled to count; anything but the default is for `bench
    /// policies`, which measures what fuel and the deadline cost.
    pub policy_metering: Metering,
    /// What codec plugins are compiled to count; `bench codecs` measures the alternatives.
    pub codec_metering: Metering,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            canonical_codec_nans: false,
            policy_metering: Metering::FuelAndDeadline,
            codec_metering: Metering::FuelAndDeadline,
        }
    }
}

/// An engine and the linker that serves the sandbox's imports in it.
struct Sandboxed {
    engine: Engine,
    linker: Arc<Linker<Sandbox>>,
    canonical_nans: bool,
    metering: Metering,
}

impl Sandboxed {
    fn new(canonical_nans: bool, metering: Metering) -> Result<Self> {
        let mut config = Config::new();
        // Policies are synchronous; without WASIp3 concurrency a call costs ~155 ns, not ~500.
        config.concurrency_support(false);
        config.epoch_interruption(metering.deadline());
        config.consume_fuel(metering.fuel());
        config.cranelift_opt_level(OptLevel::Speed);
        config.cranelift_nan_canonicalization(canonical_nans);
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        super::waits::link(&mut linker)?;
        Ok(Sandboxed {
            engine,
            linker: Arc::new(linker),
            canonical_nans,
            metering,
        })
    }
}

/// Loads and runs policy plugins.
pub struct Runtime {
    policies: Sandboxed,
    codecs: Sandboxed,
    cache: Cache,
    limits: Limits,
    options: EngineOptions,
    words: &'static Words,
}

impl Runtime {
    /// A runtime with the given cache and default limits for every plugin it loads.
    pub fn new(cache: Cache, limits: Limits) -> Result<Self> {
        Self::with_options(cache, limits, EngineOptions::default())
    }

    /// The same with the engines' compiler settings.
    pub fn with_options(cache: Cache, limits: Limits, options: EngineOptions) -> Result<Self> {
        let policies = Sandboxed::new(true, options.policy_metering)?;
        let codecs = Sandboxed::new(options.canonical_codec_nans, options.codec_metering)?;
        spawn_ticker(vec![policies.engine.weak(), codecs.engine.weak()]);
        Ok(Runtime {
            policies,
            codecs,
            cache,
            limits,
            options,
            words: &CLI,
        })
    }

    /// The same runtime wording its messages in `words` (lsgd-host's flags by default).
    pub fn with_words(mut self, words: &'static Words) -> Self {
        self.words = words;
        self
    }

    /// The words its messages use.
    pub fn words(&self) -> &'static Words {
        self.words
    }

    /// The compiler settings.
    pub fn options(&self) -> EngineOptions {
        self.options
    }

    /// The limits new plugins get.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The engine policies (every kind but codecs) are compiled for.
    pub fn engine(&self) -> &Engine {
        &self.policies.engine
    }

    /// The engine plugins of `kind` are compiled for.
    pub fn engine_of(&self, kind: PolicyKind) -> &Engine {
        match kind {
            PolicyKind::Codec => &self.codecs.engine,
            _ => &self.policies.engine,
        }
    }

    /// The compiled-component cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Locates a plugin by path or name in lsgd-host's folders ([`super::locate::search_dirs`]),
    /// loads it expecting `kind` when given, and configures it with `settings`.
    pub fn load_configured(
        &self,
        arg: &str,
        kind: Option<PolicyKind>,
        settings: &[(String, String)],
    ) -> Result<Plugin> {
        let path = super::locate::locate_in(arg, &super::locate::search_dirs(), self.words)?;
        let mut plugin = self.load(&path, kind)?;
        plugin.configure(settings)?;
        Ok(plugin)
    }

    /// Loads a plugin file, checks it implements a supported world (of kind `expect` when
    /// given), instantiates it in the sandbox and calls `describe`.
    pub fn load(&self, path: &Path, expect: Option<PolicyKind>) -> Result<Plugin, PluginError> {
        let label = path.display().to_string();
        let load_err = |m: String| PluginError::new(label.clone(), "load", Fault::Load(m));
        let bytes =
            read_component(path, self.limits.max_component_bytes, self.words).map_err(load_err)?;
        // The engine is chosen by the kind the export names declare; the contract is then
        // read again, authoritatively, from the compiled component's type.
        let sandboxed = match declared_kind(&bytes) {
            Some(PolicyKind::Codec) => &self.codecs,
            _ => &self.policies,
        };
        let (component, origin) = self
            .cache
            .load(&sandboxed.engine, &bytes, &label)
            .map_err(|e| load_err(format!("not a valid component: {}", wasm_msg(&e))))?;
        let contract = Contract::detect(
            component
                .component_type()
                .exports(&sandboxed.engine)
                .map(|(name, _)| name),
        )
        .map_err(|e| load_err(e.to_string()))?;
        if let Some(kind) = expect.filter(|k| *k != contract.kind) {
            return Err(load_err(format!(
                "is a {} plugin (world {}), but {} takes a {} plugin (world {})",
                contract.kind,
                contract.kind.world(),
                self.words.takes(kind),
                kind,
                kind.world()
            )));
        }
        let pre = sandboxed.linker.instantiate_pre(&component).map_err(|e| {
            load_err(format!(
                "imports something the sandbox does not provide: {}",
                wasm_msg(&e)
            ))
        })?;
        let imports = component
            .component_type()
            .imports(&sandboxed.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        Plugin::new(
            label,
            sandboxed.engine.clone(),
            pre,
            contract,
            Facts {
                size: bytes.len(),
                origin,
                imports,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
                canonical_nans: sandboxed.canonical_nans,
                metering: sandboxed.metering,
            },
            self.limits,
            self.words,
        )
    }
}

/// The bytes of a component file, refused before compiling when they are over `limit`, not
/// WebAssembly, or a core module rather than a component.
fn read_component(path: &Path, limit: u64, words: &Words) -> Result<Vec<u8>, String> {
    // Before reading and compiling: a hostile multi-GiB file would cost memory and minutes.
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read the file: {e}"))?
        .len();
    if size > limit {
        return Err(too_big(size, limit, words));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(too_big(bytes.len() as u64, limit, words));
    }
    if !bytes.starts_with(b"\0asm") {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
        return Err(
            "a core WebAssembly module, not a component: build for wasm32-wasip2, or \
                    wrap the module with `wasm-tools component new`"
                .into(),
        );
    }
    Ok(bytes)
}

/// The refusal of a component of `size` bytes over the `limit`.
fn too_big(size: u64, limit: u64, words: &Words) -> String {
    format!(
        "the component is {:.1} MiB, over the {} MiB limit on a plugin's size{}",
        size as f64 / f64::from(1 << 20),
        limit >> 20,
        words
            .raise(Knob::MaxComponentMb)
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    )
}

/// The kind of plugin a component's top-level export names declare, read without compiling
/// it; `None` when the bytes do not parse or declare no contract (compiling then says why).
fn declared_kind(bytes: &[u8]) -> Option<PolicyKind> {
    use wasmparser::{Parser, Payload};
    let mut names = Vec::new();
    // Nested modules and components have export sections of their own: only depth 0 counts.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) if depth == 0 => break,
            Payload::End(_) => depth -= 1,
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    names.push(export.ok()?.name.name);
                }
            }
            _ => {}
        }
    }
    Contract::detect(names).ok().map(|c| c.kind)
}

/// Advances the engines' epochs every [`TICK`] for as long as any of them lives.
fn spawn_ticker(engines: Vec<EngineWeak>) {
    thread::Builder::new()
        .name("lsgd-plugin-epoch".into())
        .spawn(move || {
            loop {
                let live: Vec<Engine> = engines.iter().filter_map(EngineWeak::upgrade).collect();
                if live.is_empty() {
                    break;
                }
                for engine in &live {
                    engine.increment_epoch();
                }
                drop(live);
                thread::sleep(TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}
