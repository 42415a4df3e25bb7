//! Micro-benchmarks (criterion), one module per area; ratios come from comparing entries of
//! one group in one run. Run with `cargo bench --bench palisade`.

use criterion::{criterion_group, criterion_main};

/// The same allocator as the `palisade` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod attestation;
mod limiter;
mod policy;
mod reputation;
mod velocity;

criterion_group!(
    benches,
    limiter::in_process_vs_governor,
    limiter::full_check,
    limiter::messaging_check,
    limiter::reply_decoding,
    policy::replay,
    reputation::lookups,
    reputation::asn_lookups,
    attestation::play_integrity,
    attestation::app_attest_assertion,
    velocity::account_value_update
);
criterion_main!(benches);
