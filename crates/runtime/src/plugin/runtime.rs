//! The wasmtime engines of the process and everything shared by all plugins: the linkers with
//! the (empty) WASI sandbox, the compiled-component cache, the epoch ticker that enforces call
//! deadlines, and the default limits.
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
use crate::Result;

/// Compiler settings of a runtime's engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineOptions {
    /// Compile codec plugins with canonical NaNs too, as policies always are: for jobs whose
    /// ranks run on CPUs of different architectures.
    pub canonical_codec_nans: bool,
    /// Compile codecs without the epoch checks at every loop header and function entry that
    /// enforce the call deadline, so that `bench codecs` can measure what the deadline costs.
    /// A codec that never returns then hangs the host: not for training.
    pub codecs_without_deadline: bool,
}

/// An engine and the linker that serves the sandbox's imports in it.
struct Sandboxed {
    engine: Engine,
    linker: Arc<Linker<Sandbox>>,
    canonical_nans: bool,
}

impl Sandboxed {
    fn new(canonical_nans: bool, deadline: bool) -> Result<Self> {
        let mut config = Config::new();
        // Policies are synchronous; without WASIp3 concurrency a call costs ~155 ns, not ~500.
        config.concurrency_support(false);
        config.epoch_interruption(deadline);
        config.cranelift_opt_level(OptLevel::Speed);
        config.cranelift_nan_canonicalization(canonical_nans);
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        Ok(Sandboxed {
            engine,
            linker: Arc::new(linker),
            canonical_nans,
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
}

impl Runtime {
    /// A runtime with the given cache and default limits for every plugin it loads.
    pub fn new(cache: Cache, limits: Limits) -> Result<Self> {
        Self::with_options(cache, limits, EngineOptions::default())
    }

    /// The same with the engines' compiler settings.
    pub fn with_options(cache: Cache, limits: Limits, options: EngineOptions) -> Result<Self> {
        let policies = Sandboxed::new(true, true)?;
        let codecs = Sandboxed::new(
            options.canonical_codec_nans,
            !options.codecs_without_deadline,
        )?;
        spawn_ticker(vec![policies.engine.weak(), codecs.engine.weak()]);
        Ok(Runtime {
            policies,
            codecs,
            cache,
            limits,
            options,
        })
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

    /// Locates a plugin by path or name (see [`super::locate`]), loads it expecting `kind` when
    /// given, and configures it with `settings`.
    pub fn load_configured(
        &self,
        arg: &str,
        kind: Option<PolicyKind>,
        settings: &[(String, String)],
    ) -> Result<Plugin> {
        let path = super::locate::locate(arg)?;
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
            std::fs::read(path).map_err(|e| load_err(format!("cannot read the file: {e}")))?;
        if !bytes.starts_with(b"\0asm") {
            return Err(load_err("not a WebAssembly file (no \\0asm header)".into()));
        }
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err(load_err(
                "a core WebAssembly module, not a component: build for wasm32-wasip2, or wrap \
                 the module with `wasm-tools component new`"
                    .into(),
            ));
        }
        // The engine is chosen by the kind the export names declare; the contract is then
        // read again, authoritatively, from the compiled component's type.
        let sandboxed = match declared_kind(&bytes) {
            Some(PolicyKind::Codec) => &self.codecs,
            _ => &self.policies,
        };
        let (component, origin) = self
            .cache
            .load(&sandboxed.engine, &bytes)
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
                kind.flag(),
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
            },
            self.limits,
        )
    }
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
