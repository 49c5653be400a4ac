//! A stand-in for the wasi_snapshot_preview1 adapter, for Go's wasip1 runtime.
//!
//! The real adapter allocates its state through the module's `cabi_realloc` (a Go function,
//! which Go refuses to enter while its runtime is still starting, inside a WASI call) or with
//! `memory.grow` (pages that Go's allocator then hands out again, because it assumes it owns all
//! memory past its data). This stub keeps no state in linear memory: it answers the few calls
//! Go's runtime makes from wasm globals, exactly as the host's sandbox would, with no arguments
//! or environment, a clock that starts on 2017-06-08 and only moves forward, seeded randomness,
//! and standard output discarded. Any other preview1 function returns ENOSYS.
//!
//! File descriptor 2 goes to WASI 0.2's `wasi:cli/stderr`, so that what Go's runtime prints when
//! it dies (`panic: …` and the goroutine's stack, `fatal error: …`) reaches the host's error
//! report. `blocking-write-and-flush` needs a 12-byte return area in linear memory, which the
//! stub does not own; it borrows bytes 0..12 for the duration of the call and puts their old
//! contents back (safe: nothing else runs meanwhile, the host copies the bytes to write before
//! it stores the result, and the call needs no `cabi_realloc`, so Go is never re-entered).
//! Standard output is not forwarded: other languages' stdout is not captured either, and a
//! chatty plugin would fill the host's bounded capture before its panic could be read.

use anyhow::{Context, Result, bail};
use wasmparser::{Payload, TypeRef, ValType};
use wit_component::{StringEncoding, embed_component_metadata};
use wit_parser::Resolve;

use crate::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME as WASI;

/// Bodies of the functions Go's runtime imports, by name: (signature, body).
const KNOWN: &[(&str, &str, &str)] = &[
    (
        "args_sizes_get",
        "(param i32 i32) (result i32)",
        ZERO_COUNTS,
    ),
    (
        "environ_sizes_get",
        "(param i32 i32) (result i32)",
        ZERO_COUNTS,
    ),
    ("args_get", "(param i32 i32) (result i32)", "i32.const 0"),
    ("environ_get", "(param i32 i32) (result i32)", "i32.const 0"),
    ("sched_yield", "(result i32)", "i32.const 0"),
    // EBADF: no preopened directories, which ends the `syscall` package's scan of them at
    // startup (ENOSYS made it panic, so a plugin importing `fmt` or `os` could not start).
    (
        "fd_prestat_get",
        "(param i32 i32) (result i32)",
        "i32.const 8",
    ),
    ("proc_exit", "(param i32)", "unreachable"),
    (
        "clock_time_get",
        "(param i32 i64 i32) (result i32)",
        "(global.set $clock (i64.add (global.get $clock) (i64.const 1000)))
         (i64.store (local.get 2) (global.get $clock))
         i32.const 0",
    ),
    (
        "random_get",
        "(param $buf i32) (param $len i32) (result i32)",
        "(block $done (loop $next
           (br_if $done (i32.eqz (local.get $len)))
           (global.set $rng (i64.add (i64.mul (global.get $rng) (i64.const 6364136223846793005))
                                     (i64.const 1442695040888963407)))
           (i64.store8 (local.get $buf) (i64.shr_u (global.get $rng) (i64.const 56)))
           (local.set $buf (i32.add (local.get $buf) (i32.const 1)))
           (local.set $len (i32.sub (local.get $len) (i32.const 1)))
           (br $next)))
         i32.const 0",
    ),
    (
        "fd_write",
        "(param $fd i32) (param $iovs i32) (param $n i32) (param $written i32) (result i32)
         (local $sum i32) (local $ptr i32) (local $len i32) (local $chunk i32)",
        "(block $done (loop $next
           (br_if $done (i32.eqz (local.get $n)))
           (local.set $ptr (i32.load (local.get $iovs)))
           (local.set $len (i32.load offset=4 (local.get $iovs)))
           (local.set $sum (i32.add (local.get $sum) (local.get $len)))
           ;; blocking-write-and-flush takes at most 4096 bytes a call.
           (if (i32.eq (local.get $fd) (i32.const 2))
             (then (block $sent (loop $more
               (br_if $sent (i32.eqz (local.get $len)))
               (local.set $chunk (select (local.get $len) (i32.const 4096)
                                         (i32.lt_u (local.get $len) (i32.const 4096))))
               (call $to_stderr (local.get $ptr) (local.get $chunk))
               (local.set $ptr (i32.add (local.get $ptr) (local.get $chunk)))
               (local.set $len (i32.sub (local.get $len) (local.get $chunk)))
               (br $more)))))
           (local.set $iovs (i32.add (local.get $iovs) (i32.const 8)))
           (local.set $n (i32.sub (local.get $n) (i32.const 1)))
           (br $next)))
         (i32.store (local.get $written) (local.get $sum))
         i32.const 0",
    ),
    // Every subscription fires at once; a clock subscription moves the clock to its deadline,
    // so a sleeping Go scheduler wakes up to the time it asked for.
    (
        "poll_oneoff",
        "(param $in i32) (param $out i32) (param $n i32) (param $events i32) (result i32)
         (local $i i32)",
        "(block $done (loop $next
           (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
           (i64.store (local.get $out) (i64.load (local.get $in)))
           (i64.store offset=8 (local.get $out) (i64.const 0))
           (i32.store8 offset=10 (local.get $out) (i32.load8_u offset=8 (local.get $in)))
           (i64.store offset=16 (local.get $out) (i64.const 0))
           (i64.store offset=24 (local.get $out) (i64.const 0))
           (if (i32.eqz (i32.load8_u offset=8 (local.get $in)))
             (then
               (if (i32.and (i32.load16_u offset=40 (local.get $in)) (i32.const 1))
                 (then (if (i64.gt_u (i64.load offset=24 (local.get $in)) (global.get $clock))
                   (then (global.set $clock (i64.load offset=24 (local.get $in))))))
                 (else (global.set $clock
                   (i64.add (global.get $clock) (i64.load offset=24 (local.get $in))))))))
           (local.set $in (i32.add (local.get $in) (i32.const 48)))
           (local.set $out (i32.add (local.get $out) (i32.const 32)))
           (local.set $i (i32.add (local.get $i) (i32.const 1)))
           (br $next)))
         (i32.store (local.get $events) (local.get $n))
         i32.const 0",
    ),
];

const ZERO_COUNTS: &str = "(i32.store (local.get 0) (i32.const 0))
    (i32.store (local.get 1) (i32.const 0))
    i32.const 0";

/// The part of WASI 0.2 that `fd_write` uses, as the host's WIT declares it (a subset: an
/// import's instance type lists only what the component uses).
const STDERR_WIT: &[(&str, &str)] = &[
    (
        "wasi-io.wit",
        "package wasi:io@0.2.0;
interface error {
  resource error;
}
interface streams {
  use error.{error};
  variant stream-error {
    last-operation-failed(error),
    closed,
  }
  resource output-stream {
    blocking-write-and-flush: func(contents: list<u8>) -> result<_, stream-error>;
  }
}",
    ),
    (
        "wasi-cli.wit",
        "package wasi:cli@0.2.0;
interface stderr {
  use wasi:io/streams@0.2.0.{output-stream};
  get-stderr: func() -> output-stream;
}",
    ),
];

/// The world the stub's imports belong to.
const STUB_WORLD: &str = "package lsgd:wasi-stub;
world stderr {
  import wasi:cli/stderr@0.2.0;
}";

/// The WASI 0.2 imports of `fd_write`'s forwarding to `wasi:cli/stderr`.
const STDERR_IMPORTS: &str = "
  (import \"wasi:cli/stderr@0.2.0\" \"get-stderr\" (func $get_stderr (result i32)))
  (import \"wasi:io/streams@0.2.0\" \"[method]output-stream.blocking-write-and-flush\"
    (func $write_and_flush (param i32 i32 i32 i32)))
  (import \"wasi:io/error@0.2.0\" \"[resource-drop]error\" (func $drop_error (param i32)))
";

/// The state and the helper of `fd_write`'s forwarding to `wasi:cli/stderr`.
const STDERR_HELPER: &str = "
  ;; The output-stream handle, fetched on first use; -1 before that.
  (global $stderr (mut i32) (i32.const -1))
  ;; Set once a write failed (e.g. the host's capture is full): later output is discarded.
  (global $stderr_failed (mut i32) (i32.const 0))
  (func $to_stderr (param $ptr i32) (param $len i32) (local $lo i64) (local $hi i32)
    (if (global.get $stderr_failed) (then (return)))
    (if (i32.eq (global.get $stderr) (i32.const -1))
      (then (global.set $stderr (call $get_stderr))))
    ;; result<_, stream-error>: tag @0, stream-error's tag @4, its error handle @8.
    (local.set $lo (i64.load (i32.const 0)))
    (local.set $hi (i32.load offset=8 (i32.const 0)))
    (call $write_and_flush (global.get $stderr) (local.get $ptr) (local.get $len) (i32.const 0))
    (if (i32.load8_u (i32.const 0))
      (then
        (global.set $stderr_failed (i32.const 1))
        (if (i32.eqz (i32.load8_u offset=4 (i32.const 0)))
          (then (call $drop_error (i32.load offset=8 (i32.const 0)))))))
    (i64.store (i32.const 0) (local.get $lo))
    (i32.store offset=8 (i32.const 0) (local.get $hi)))
";

/// The stub adapter for exactly the preview1 functions `module` imports.
pub fn adapter(module: &[u8]) -> Result<Vec<u8>> {
    let imports = wasi_imports(module)?;
    let forwards_stderr = imports.iter().any(|(name, ..)| name == "fd_write");
    let mut wat = String::from("(module\n  (import \"env\" \"memory\" (memory 0))\n");
    if forwards_stderr {
        wat.push_str(STDERR_IMPORTS);
    }
    wat.push_str(
        "
  ;; Nanoseconds since the epoch: 2017-06-08, the host sandbox's fixed wall clock.
  (global $clock (mut i64) (i64.const 1496880000000000000))
  (global $rng (mut i64) (i64.const 0x2545F4914F6CDD1D))\n",
    );
    if forwards_stderr {
        wat.push_str(STDERR_HELPER);
    }
    for (name, params, results) in imports {
        let func = match KNOWN.iter().find(|(n, ..)| *n == name) {
            Some((_, sig, body)) => format!("(func (export \"{name}\") {sig}\n {body})"),
            None => {
                let list = |tys: &[ValType]| {
                    tys.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                // ENOSYS for functions that return an errno, a trap for anything else.
                let body = if results == [ValType::I32] {
                    "i32.const 52"
                } else {
                    "unreachable"
                };
                format!(
                    "(func (export \"{name}\") (param {}) (result {})\n {body})",
                    list(&params),
                    list(&results)
                )
            }
        };
        wat.push_str(&func);
        wat.push('\n');
    }
    wat.push(')');
    let mut stub = wat::parse_str(&wat).context("assembling the WASI stub")?;
    if forwards_stderr {
        // wit-component reads an adapter's imports from the world embedded in it.
        let mut resolve = Resolve::default();
        for (file, text) in STDERR_WIT {
            resolve.push_str(file, text)?;
        }
        let pkg = resolve.push_str("stub.wit", STUB_WORLD)?;
        let world = resolve.select_world(&[pkg], Some("stderr"))?;
        embed_component_metadata(&mut stub, &resolve, world, StringEncoding::UTF8)
            .context("embedding the WASI stub's world")?;
    }
    Ok(stub)
}

/// An imported function: name, parameter types, result types.
type Import = (String, Vec<ValType>, Vec<ValType>);

/// The preview1 functions `module` imports, each once.
fn wasi_imports(module: &[u8]) -> Result<Vec<Import>> {
    let mut types = Vec::new();
    let mut out: Vec<Import> = Vec::new();
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        match payload? {
            Payload::TypeSection(section) => {
                for ty in section.into_iter_err_on_gc_types() {
                    let ty = ty?;
                    types.push((ty.params().to_vec(), ty.results().to_vec()));
                }
            }
            Payload::ImportSection(section) => {
                for import in section.into_imports() {
                    let import = import?;
                    if let (WASI, TypeRef::Func(i)) = (import.module, import.ty) {
                        let (p, r) = types[i as usize].clone();
                        // Go's runtime and its `syscall` package import some functions
                        // (`fd_write`) separately; the stub exports each name once.
                        match out.iter().find(|(name, ..)| name == import.name) {
                            None => out.push((import.name.to_string(), p, r)),
                            Some((_, p0, r0)) if (p0, r0) == (&p, &r) => {}
                            Some(_) => {
                                bail!("{WASI}::{} is imported with two signatures", import.name)
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wit_component::ComponentEncoder;

    /// The component's own import names.
    fn component_imports(component: &[u8]) -> Vec<String> {
        let mut depth = 0usize;
        let mut names = Vec::new();
        for payload in wasmparser::Parser::new(0).parse_all(component) {
            match payload.unwrap() {
                Payload::Version { .. } => depth += 1,
                Payload::End(_) => depth -= 1,
                Payload::ComponentImportSection(s) if depth == 1 => {
                    names.extend(s.into_iter().map(|i| i.unwrap().name.name.to_owned()));
                }
                _ => {}
            }
        }
        names
    }

    /// A component of a core module importing `funcs` from preview1, the way `componentize
    /// --wasi-stub` makes one.
    fn componentize(funcs: &[(&str, &str)]) -> Vec<u8> {
        let imports: String = funcs
            .iter()
            .map(|(name, sig)| format!("(import \"{WASI}\" \"{name}\" (func {sig}))\n"))
            .collect();
        let mut module =
            wat::parse_str(format!("(module {imports} (memory (export \"memory\") 1))")).unwrap();
        let mut resolve = Resolve::default();
        let pkg = resolve
            .push_str("t.wit", "package t:t; world w {}")
            .unwrap();
        let world = resolve.select_world(&[pkg], Some("w")).unwrap();
        embed_component_metadata(&mut module, &resolve, world, StringEncoding::UTF8).unwrap();
        let stub = adapter(&module).unwrap();
        let mut encoder = ComponentEncoder::default();
        encoder.validate(true).module(&module).unwrap();
        encoder.adapter(WASI, &stub).unwrap();
        encoder.encode().unwrap()
    }

    const FD_WRITE: (&str, &str) = ("fd_write", "(param i32 i32 i32 i32) (result i32)");

    #[test]
    fn fd_write_imported_twice_reaches_wasi_stderr() {
        let component = componentize(&[FD_WRITE, ("proc_exit", "(param i32)"), FD_WRITE]);
        let imports = component_imports(&component);
        assert!(
            imports.contains(&"wasi:cli/stderr@0.2.0".to_owned()),
            "{imports:?}"
        );
    }

    #[test]
    fn no_fd_write_no_wasi_imports() {
        let clock = ("clock_time_get", "(param i32 i64 i32) (result i32)");
        assert_eq!(
            component_imports(&componentize(&[clock])),
            Vec::<String>::new()
        );
    }
}
