//! The `hourglass` command line.

mod cli;

use std::process::ExitCode;

/// glibc malloc spent about a quarter of the host's CPU under load (BENCHMARKS.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cli::main()
}
