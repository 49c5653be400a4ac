//! Makes the binaries (lsgd-host and the test binaries of this crate and the host) find
//! libtorch without environment variables, and links libtorch_cuda only where it can be used.
//!
//! - An rpath to the libtorch that torch-sys linked, so `lsgd-host` runs from anywhere.
//! - lsgd-train only: libtorch's per-device autocast switches as C functions
//!   (`src/precision/autocast.cpp`), which tch does not expose, and a TorchScript module with
//!   its buffers (`src/model/script.cpp`), which tch's `CModule` does not give, and
//!   gradient-ready hooks (`src/overlap/ready.cpp`), which tch lacks; the latter two include
//!   libtorch's headers, compiled as torch-sys compiles its own `torch_api.cpp` (about 15 s).
//! - rustc links with `--as-needed`, which drops torch-sys's `-ltorch -ltorch_cuda` because no
//!   symbol of ours refers to them; without them CUDA kernels never register and a GPU machine
//!   reports no CUDA. We force them in, but only when every library libtorch_cuda needs
//!   resolves (the full torch install) and a GPU driver is present or `LSGD_LINK_CUDA=1`:
//!   on a CPU-only machine the minimal install lacks cuDNN and friends, and a binary that
//!   needs them would not start. `LSGD_LINK_CUDA=0` forces a CPU-only binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn torch_lib_dir() -> PathBuf {
    // torch-sys has `links = "tch"` and prints `cargo:libtorch_lib=…`.
    if let Ok(p) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        return PathBuf::from(p);
    }
    match std::env::var("LIBTORCH") {
        Ok(p) => PathBuf::from(p).join("lib"),
        Err(_) => panic!("libtorch not found: run scripts/setup.sh and source scripts/env.sh"),
    }
}

fn cuda_libs_resolve(lib: &Path) -> bool {
    let so = lib.join("libtorch_cuda.so");
    so.exists()
        && Command::new("ldd").arg(&so).output().is_ok_and(|o| {
            o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("not found")
        })
}

fn main() {
    // No rerun-if-changed: the host shares this script, and cargo rebuilds a changed script anyway.
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LSGD_LINK_CUDA");
    let lib = torch_lib_dir();
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    let link_cuda = match std::env::var("LSGD_LINK_CUDA").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => Path::new("/proc/driver/nvidia/version").exists() && cuda_libs_resolve(&lib),
    };
    println!("cargo:rustc-env=LSGD_LINKED_CUDA={}", u8::from(link_cuda));
    if std::env::var("CARGO_PKG_NAME").as_deref() == Ok("lsgd-train") {
        println!("cargo:rerun-if-changed=src/precision/autocast.cpp");
        cc::Build::new()
            .cpp(true)
            .std("c++17")
            .warnings(true)
            .file("src/precision/autocast.cpp")
            .compile("lsgd_autocast");
        println!("cargo:rerun-if-changed=src/model/script.cpp");
        println!("cargo:rerun-if-changed=src/overlap/ready.cpp");
        println!("cargo:rerun-if-changed=src/shim.hpp");
        println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
        // libtorch's layout: <torch>/lib holds the libraries, <torch>/include the headers.
        let torch = lib.parent().expect("libtorch's lib dir has a parent");
        let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
        let mut build = cc::Build::new();
        build.cpp(true).std("c++17").warnings(true);
        // -isystem: libtorch's headers warn under -Wextra; ours must not.
        for dir in ["include", "include/torch/csrc/api/include"] {
            build
                .flag("-isystem")
                .flag(torch.join(dir).to_string_lossy().as_ref());
        }
        build
            .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
            .define("GLOG_USE_GLOG_EXPORT", None)
            .file("src/model/script.cpp")
            .file("src/overlap/ready.cpp")
            .compile("lsgd_script");
    }
    if link_cuda {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-ltorch_cuda");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
