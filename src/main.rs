//! The `palisade` binary: everything lives in the library.

/// mimalloc: the request path allocates small, short-lived buffers at a high rate; glibc's
/// allocator spent about a fifth of the server's CPU there under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    palisade::cli::run()
}
