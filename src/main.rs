//! The `palisade` binary: everything lives in the library.

fn main() -> std::process::ExitCode {
    palisade::cli::run()
}
