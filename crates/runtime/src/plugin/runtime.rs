//! The one wasmtime `Engine` of the process and everything shared by all plugins: the linker
//! with the (empty) WASI sandbox, the compiled-component cache, the epoch ticker that enforces
//! call deadlines, and the default limits.

use std::path::Path;
use std::sync::Arc;
use std::thread;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, OptLevel};

use super::cache::Cache;
use super::contract::{Contract, PolicyKind};
use super::error::{Fault, PluginError, wasm_msg};
use super::instance::{Facts, Plugin};
use super::sandbox::{Limits, Sandbox, TICK};
use crate::Result;

/// Loads and runs policy plugins.
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<Sandbox>>,
    cache: Cache,
    limits: Limits,
}

impl Runtime {
    /// A runtime with the given cache and default limits for every plugin it loads.
    pub fn new(cache: Cache, limits: Limits) -> Result<Self> {
        let mut config = Config::new();
        // Policies are synchronous; without WASIp3 concurrency a call costs ~155 ns, not ~500.
        config.concurrency_support(false);
        config.epoch_interruption(true);
        config.cranelift_opt_level(OptLevel::Speed);
        // Every rank must compute identical policy outputs; canonical NaNs remove the one
        // place where hardware could differ.
        config.cranelift_nan_canonicalization(true);
        let engine = Engine::new(&config)?;
        spawn_ticker(&engine);
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        Ok(Runtime {
            engine,
            linker: Arc::new(linker),
            cache,
            limits,
        })
    }

    /// The limits new plugins get.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
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
        let (component, origin) = self
            .cache
            .load(&self.engine, &bytes)
            .map_err(|e| load_err(format!("not a valid component: {}", wasm_msg(&e))))?;
        let contract = self
            .contract(&component)
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
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            load_err(format!(
                "imports something the sandbox does not provide: {}",
                wasm_msg(&e)
            ))
        })?;
        let imports = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_string())
            .collect();
        Plugin::new(
            label,
            self.engine.clone(),
            pre,
            contract,
            Facts {
                size: bytes.len(),
                origin,
                imports,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
            },
            self.limits,
        )
    }

    fn contract(&self, component: &Component) -> Result<Contract> {
        let ty = component.component_type();
        Contract::detect(ty.exports(&self.engine).map(|(name, _)| name))
    }
}

/// Advances the engine's epoch every [`TICK`] for as long as the engine lives.
fn spawn_ticker(engine: &Engine) {
    let weak = engine.weak();
    thread::Builder::new()
        .name("lsgd-plugin-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                thread::sleep(TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}
