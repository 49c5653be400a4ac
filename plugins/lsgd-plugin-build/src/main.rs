//! `lsgd-plugin-build`: the two steps of turning a core WebAssembly module from a non-Rust
//! toolchain into an `lsgd:policy` component, done with the wasm-tools library crates so that
//! neither `wasm-tools` nor `wit-bindgen-cli` has to be installed.
//!
//! ```text
//! lsgd-plugin-build c-bindings WIT_DIR WORLD OUT_DIR
//!     C bindings for WORLD as `wit-bindgen c` writes them, renamed to OUT_DIR/lsgd.h and
//!     lsgd.c for every world, plus lsgd_kit.h (describe/configure helpers).
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
use wit_parser::{Resolve, WorldId};

/// Helpers every C plugin shares, written next to the generated bindings.
const C_KIT: &str = include_str!("../kit/c/lsgd_kit.h");

const USAGE: &str = "usage:
  lsgd-plugin-build c-bindings WIT_DIR WORLD OUT_DIR
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
        }
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    let kit = out.join("lsgd_kit.h");
    std::fs::write(&kit, C_KIT).with_context(|| format!("writing {}", kit.display()))
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
