//! The `lsgd-host` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    lsgd_host::cli::main()
}
