//! The `bundlevisor` binary: everything lives in the library.

/// mimalloc, not glibc's malloc: a gateway call makes about 90
/// allocations, and glibc's paid ≈ 20,000 of its ≈ 127,000 instructions
/// (issue 37, docs/performance.md). Without transparent huge pages
/// (`no_thp`): mimalloc asks for them on its arenas, and with 2,000
/// bundles the daemon's RSS was 552 MiB with them, 312–317 without
/// (glibc's: 322).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    bundlevisor::cli::main()
}
