//! `lsgd-plugin-build`: the two steps of turning a core WebAssembly module from a non-Rust
//! toolchain into an `lsgd:policy` component, done with the wasm-tools library crates so that
//! neither `wasm-tools` nor `wit-bindgen-cli` has to be installed.
//!
//! ```text
//! lsgd-plugin-build c-bindings WIT_DIR WORLD OUT_DIR
//!     C bindings for WORLD as `wit-bindgen c` writes them, renamed to OUT_DIR/lsgd.h and
//!     lsgd.c for every world, plus lsgd_kit.h (describe/configure helpers). From contract 0.4
//!     a schedule's `momentum` is optional: lsgd.c carries a weak default that returns none.
//! lsgd-plugin-build go-kit WIT_DIR WORLD OUT_DIR
//!     The Go kit files WORLD needs (`lsgd_plugin.go`, its kind's, `lsgd_state.go` for a
//!     stateful world, `lsgd_momentum.go` for a 0.4 schedule; a 0.5 sync policy's is
//!     `lsgd_sync.go`), their `//go:wasmexport` names at WIT_DIR's contract version.
//! lsgd-plugin-build componentize [--wasi-stub] CORE.wasm WIT_DIR WORLD OUT.wasm
//!     Embeds WORLD's type information unless the module already carries it, adapts
//!     wasi_snapshot_preview1 imports (wasi-libc's stdio) to WASI 0.2 with wasmtime 48's reactor
//!     adapter, or with `--wasi-stub` to a stub of our own (see `wasi_stub.rs`: Go's runtime
//!     cannot share its memory with the real adapter; the stub passes fd 2 to
//!     `wasi:cli/stderr`), and writes the component.
//! lsgd-plugin-build exports COMPONENT.wasm
//!     Prints the names the component exports, one a line (`lsgd:policy/plugin@0.3.0` ...:
//!     what the host reads to tell a plugin's contract version and kind), without compiling it.
//! ```

mod wasi_stub;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
};
use wit_component::{ComponentEncoder, StringEncoding, embed_component_metadata};
use wit_parser::{Resolve, WorldId, WorldItem};

/// Helpers every C plugin shares, written next to the generated bindings.
const C_KIT: &str = include_str!("../kit/c/lsgd_kit.h");

/// The Go kit by file name: the `plugin` ABI, one file per interface, and the optional
/// momentum of a 0.4 schedule. Their export names carry the version that introduced them
/// (`@0.1.0`, `@0.3.0` ...), rewritten to the world's version by `go-kit`.
const GO_KIT: &[(&str, &str)] = &[
    ("lsgd_plugin.go", include_str!("../kit/go/lsgd_plugin.go")),
    (
        "lsgd_schedule.go",
        include_str!("../kit/go/lsgd_schedule.go"),
    ),
    (
        "lsgd_momentum.go",
        include_str!("../kit/go/lsgd_momentum.go"),
    ),
    (
        "lsgd_batch_size.go",
        include_str!("../kit/go/lsgd_batch_size.go"),
    ),
    (
        "lsgd_label_smoothing.go",
        include_str!("../kit/go/lsgd_label_smoothing.go"),
    ),
    (
        "lsgd_layer_rate.go",
        include_str!("../kit/go/lsgd_layer_rate.go"),
    ),
    ("lsgd_sync.go", include_str!("../kit/go/lsgd_sync.go")),
    ("lsgd_state.go", include_str!("../kit/go/lsgd_state.go")),
];

const USAGE: &str = "usage:
  lsgd-plugin-build c-bindings WIT_DIR WORLD OUT_DIR
  lsgd-plugin-build go-kit WIT_DIR WORLD OUT_DIR
  lsgd-plugin-build componentize [--wasi-stub] CORE.wasm WIT_DIR WORLD OUT.wasm
  lsgd-plugin-build exports COMPONENT.wasm";

fn main() {
    if let Err(e) = run(std::env::args().skip(1).collect()) {
        eprintln!("lsgd-plugin-build: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["c-bindings", wit, world, out] => c_bindings(Path::new(wit), world, Path::new(out)),
        ["go-kit", wit, world, out] => go_kit(Path::new(wit), world, Path::new(out)),
        ["componentize", core, wit, world, out] => componentize(
            Path::new(core),
            Path::new(wit),
            world,
            Path::new(out),
            false,
        ),
        ["componentize", "--wasi-stub", core, wit, world, out] => {
            componentize(Path::new(core), Path::new(wit), world, Path::new(out), true)
        }
        ["exports", component] => {
            for name in exports(Path::new(component))? {
                println!("{name}");
            }
            Ok(())
        }
        _ => bail!("{USAGE}"),
    }
}

/// Parses the WIT package in `dir` and finds `world` in it.
fn load_world(dir: &Path, world: &str) -> Result<(Resolve, WorldId)> {
    let mut resolve = Resolve::default();
    let (pkg, _) = resolve
        .push_path(dir)
        .with_context(|| format!("reading WIT from {}", dir.display()))?;
    let id = resolve.select_world(&[pkg], Some(world))?;
    Ok((resolve, id))
}

fn c_bindings(wit: &Path, world: &str, out: &Path) -> Result<()> {
    let (mut resolve, id) = load_world(wit, world)?;
    let exports = exported_functions(&resolve, id);
    let has = |iface: &str, func: &str| exports.iter().any(|(i, f)| i == iface && f == func);
    // The type information is embedded by `componentize` after linking, the same way for every
    // language, so no `*_component_type.o` is needed.
    // One name for every world (`lsgd.h`, `lsgd_string_t`), so lsgd_kit.h serves every kind.
    let opts = wit_bindgen_c::Opts {
        no_object_file: true,
        rename_world: Some("lsgd".to_owned()),
        ..Default::default()
    };
    let mut files = wit_bindgen_core::Files::default();
    opts.build().generate(&mut resolve, id, &mut files)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for (name, bytes) in files.iter() {
        let path: PathBuf = out.join(name);
        let mut bytes = bytes.to_vec();
        if name.ends_with(".c") {
            // The bindings reference a symbol of the `*_component_type.o` we do not write.
            bytes.extend_from_slice(b"\nvoid __component_type_object_force_link_lsgd(void) {}\n");
            if has("schedule", "momentum") {
                bytes.extend_from_slice(C_MOMENTUM_DEFAULT.as_bytes());
            }
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    // Kit helpers whose types exist only in some worlds are compiled in by these macros.
    let mut prelude = format!(
        "/* Written by lsgd-plugin-build for the world {world} of lsgd:policy@{}. */\n\
         #define LSGD_POLICY_VERSION \"{}\"\n",
        package_version(&resolve, id),
        package_version(&resolve, id),
    );
    if exports.iter().any(|(i, _)| i == "state") {
        prelude.push_str("#define LSGD_STATEFUL 1\n");
    }
    let kit = out.join("lsgd_kit.h");
    std::fs::write(&kit, prelude + C_KIT).with_context(|| format!("writing {}", kit.display()))
}

/// Linked into a 0.4+ schedule's C bindings: a plugin that defines no `momentum` keeps the
/// configured one at every step, so the momentum function is as optional in C as in the other
/// kits. Weak, so that the plugin's own definition wins at link time.
const C_MOMENTUM_DEFAULT: &str = "
/* lsgd-plugin-build: the default momentum, none (the configured --momentum or --adam-beta1 stays);
 * a plugin that defines exports_lsgd_policy_schedule_momentum replaces it. */
__attribute__((__weak__)) bool exports_lsgd_policy_schedule_momentum(
    exports_lsgd_policy_schedule_train_state_t *state, double *ret) {
  (void)state;
  (void)ret;
  return false;
}
";

/// `(interface, function)` for every function `world` exports, interfaces by their bare name
/// (`schedule`, `state` ...).
fn exported_functions(resolve: &Resolve, world: WorldId) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for item in resolve.worlds[world].exports.values() {
        if let WorldItem::Interface { id, .. } = item {
            let iface = &resolve.interfaces[*id];
            let name = iface.name.clone().unwrap_or_default();
            for func in iface.functions.keys() {
                out.push((name.clone(), func.clone()));
            }
        }
    }
    out
}

/// The version of the package that declares `world` (`0.4.0`), `0.0.0` for an unversioned one.
fn package_version(resolve: &Resolve, world: WorldId) -> String {
    resolve.worlds[world]
        .package
        .and_then(|p| {
            resolve.packages[p]
                .name
                .version
                .as_ref()
                .map(|v| v.to_string())
        })
        .unwrap_or_else(|| "0.0.0".to_owned())
}

fn go_kit(wit: &Path, world: &str, out: &Path) -> Result<()> {
    let (resolve, id) = load_world(wit, world)?;
    let version = package_version(&resolve, id);
    let exports = exported_functions(&resolve, id);
    let mut names = vec!["lsgd_plugin.go"];
    for (iface, func) in &exports {
        let file = match (iface.as_str(), func.as_str()) {
            ("plugin", _) => continue,
            ("schedule", "learning-rate") => "lsgd_schedule.go",
            ("schedule", "momentum") => "lsgd_momentum.go",
            ("batch-size", _) => "lsgd_batch_size.go",
            ("label-smoothing", _) => "lsgd_label_smoothing.go",
            ("layer-rate", _) => "lsgd_layer_rate.go",
            ("sync", _) => "lsgd_sync.go",
            ("state", _) => "lsgd_state.go",
            (iface, func) => bail!("the Go kit has no {iface}.{func} (world {world})"),
        };
        if !names.contains(&file) {
            names.push(file);
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for name in names {
        let (_, text) = GO_KIT
            .iter()
            .find(|(n, _)| *n == name)
            .expect("listed above");
        let path = out.join(name);
        std::fs::write(&path, go_exports_at(text, &version))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `text` with every `//go:wasmexport lsgd:policy/IFACE@X.Y.Z#func` at `version`: the canonical
/// ABI of an interface is the same in every 0.x version that has it, only the names differ.
/// `lsgd-host new` does the same for the projects it writes.
fn go_exports_at(text: &str, version: &str) -> String {
    const EXPORT: &str = "//go:wasmexport lsgd:policy/";
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let renamed = line.strip_prefix(EXPORT).and_then(|rest| {
            let (iface, rest) = rest.split_once('@')?;
            let (_, func) = rest.split_once('#')?;
            Some(format!("{EXPORT}{iface}@{version}#{func}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
    }
    out
}

fn componentize(core: &Path, wit: &Path, world: &str, out: &Path, stub: bool) -> Result<()> {
    let mut module = std::fs::read(core).with_context(|| format!("reading {}", core.display()))?;
    if !has_custom_section(&module, "component-type")? {
        let (resolve, id) = load_world(wit, world)?;
        embed_component_metadata(&mut module, &resolve, id, StringEncoding::UTF8)?;
    }
    let mut encoder = ComponentEncoder::default();
    encoder.validate(true).module(&module)?;
    if imports_module(&module, WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME)? {
        let adapter = if stub {
            wasi_stub::adapter(&module)?
        } else {
            WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER.to_vec()
        };
        encoder.adapter(WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, &adapter)?;
    }
    let component = encoder
        .encode()
        .with_context(|| format!("making a component of {}", core.display()))?;
    std::fs::write(out, component).with_context(|| format!("writing {}", out.display()))
}

/// The export names of the outermost component in `path` (not those of the modules and
/// components nested in it).
fn exports(path: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut names = Vec::new();
    // Every module and component, the outermost one too, is a Version payload, its sections'
    // payloads (those of nested ones included) and an End payload.
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(&bytes) {
        match payload.with_context(|| format!("parsing {}", path.display()))? {
            wasmparser::Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    bail!("{} is a core module, not a component", path.display());
                }
                depth += 1;
            }
            wasmparser::Payload::End(_) => depth -= 1,
            wasmparser::Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    names.push(export?.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

fn has_custom_section(module: &[u8], prefix: &str) -> Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::CustomSection(s) = payload?
            && s.name().starts_with(prefix)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

fn imports_module(module: &[u8], name: &str) -> Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ImportSection(imports) = payload? {
            for import in imports.into_imports() {
                if import?.module == name {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}
