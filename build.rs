//! Generates Envoy's rate limit service from the vendored `proto/` (see `proto/SOURCES.md`):
//! the messages (prost), the server and a client (tonic), and the encoded descriptor set that
//! gRPC reflection serves. `protox` parses the files, so no `protoc` is needed.
//!
//! It also tells the tests whether the production backends are configured
//! (`cfg(production_tests)`): without them the production-backend tests are reported as
//! ignored, not as passed.

use std::path::PathBuf;

const ROOT: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    production_tests();
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    // Imports are part of the set: a reflection client resolves every type from this server.
    compiler.include_imports(true).include_source_info(true);
    compiler.open_file(ROOT)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("rls_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    let mut config = tonic_prost_build::Config::new();
    // Envoy's comments are reStructuredText: as rustdoc they would be run as doctests.
    config.disable_comments(["."]);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The client takes any channel; tests and benchmarks bring tonic's transport.
        .build_transport(false)
        .include_file("rls.rs")
        .compile_fds_with_config(compiler.file_descriptor_set(), config)?;
    Ok(())
}

/// `cfg(production_tests)` when `PALISADE_TEST_DATABASE_URL` and `PALISADE_TEST_REDIS_URL`
/// are both set, or under `CI=true` (where a missing one must fail the run, not skip it).
fn production_tests() {
    println!("cargo::rustc-check-cfg=cfg(production_tests)");
    for var in [
        "PALISADE_TEST_DATABASE_URL",
        "PALISADE_TEST_REDIS_URL",
        "CI",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let set = |var: &str| std::env::var(var).is_ok_and(|v| !v.is_empty());
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if ci || (set("PALISADE_TEST_DATABASE_URL") && set("PALISADE_TEST_REDIS_URL")) {
        println!("cargo:rustc-cfg=production_tests");
    }
}
