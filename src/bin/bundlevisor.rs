//! The `bundlevisor` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    bundlevisor::cli::main()
}
