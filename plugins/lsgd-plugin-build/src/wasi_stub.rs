//! A stand-in for the wasi_snapshot_preview1 adapter, for Go's wasip1 runtime.
//!
//! The real adapter allocates its state through the module's `cabi_realloc` (a Go function,
//! which Go refuses to enter while its runtime is still starting, inside a WASI call) or with
//! `memory.grow` (pages that Go's allocator then hands out again, because it assumes it owns all
//! memory past its data). This stub needs no state in linear memory: it answers the few calls
//! Go's runtime makes from wasm globals, exactly as the host's sandbox would, with no arguments
//! or environment, a clock that starts on 2017-06-08 and only moves forward, seeded randomness,
//! and output discarded. Any other preview1 function returns ENOSYS.

use anyhow::{Context, Result};
use wasmparser::{Payload, TypeRef, ValType};

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
         (local $sum i32)",
        "(block $done (loop $next
           (br_if $done (i32.eqz (local.get $n)))
           (local.set $sum (i32.add (local.get $sum) (i32.load offset=4 (local.get $iovs))))
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

/// The stub adapter for exactly the preview1 functions `module` imports.
pub fn adapter(module: &[u8]) -> Result<Vec<u8>> {
    let mut wat = String::from(
        "(module
  (import \"env\" \"memory\" (memory 0))
  ;; Nanoseconds since the epoch: 2017-06-08, the host sandbox's fixed wall clock.
  (global $clock (mut i64) (i64.const 1496880000000000000))
  (global $rng (mut i64) (i64.const 0x2545F4914F6CDD1D))\n",
    );
    for (name, params, results) in wasi_imports(module)? {
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
    wat::parse_str(&wat).context("assembling the WASI stub")
}

/// An imported function: name, parameter types, result types.
type Import = (String, Vec<ValType>, Vec<ValType>);

/// The preview1 functions `module` imports.
fn wasi_imports(module: &[u8]) -> Result<Vec<Import>> {
    let mut types = Vec::new();
    let mut out = Vec::new();
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
                        out.push((import.name.to_string(), p, r));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
