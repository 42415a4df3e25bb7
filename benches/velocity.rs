//! The service's share of an ingested failure on a single Redis: read an account's window
//! value, run the failure's two steps on it, write it back (`WindowValue`: unpack, step,
//! finish, packed), as `lockout::velocity` does for every value of a batch.

use std::hint::black_box;

use criterion::{Criterion, Throughput};
use palisade::store::{WindowAction, WindowStep, WindowValue};

const NOW: i64 = 1_800_000_000_000;
const WINDOW_MS: i64 = 600_000;

fn step(window: String, member: u64, score: i64, cap: usize) -> WindowStep {
    WindowStep {
        key: "pal:v1:{user:acct1}:win".to_owned(),
        window,
        member: Some(member),
        score,
        window_ms: WINDOW_MS,
        cap,
        gap: false,
        action: WindowAction::Record,
    }
}

/// A failure's steps on its account's value: its failures, and the pair window of the
/// failure's IP (a new IP per failure, as in the load bench).
fn failure(n: u64) -> [WindowStep; 2] {
    let score = NOW - 1000 * (10 - n as i64);
    [
        step("f".to_owned(), n, score, 1000),
        step(
            format!("i{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            n,
            score,
            10,
        ),
    ]
}

/// An account's value after `failures` failures, packed as Redis holds it.
fn account_value(failures: u64) -> Vec<u8> {
    let mut value = WindowValue::default();
    for n in 0..failures {
        for step in failure(n) {
            value.step(&step, NOW);
        }
    }
    value.finish(NOW);
    value.packed(NOW).expect("a value with entries").0
}

pub fn account_value_update(c: &mut Criterion) {
    let mut group = c.benchmark_group("account_value_update");
    group.throughput(Throughput::Elements(1));
    for failures in [4u64, 9] {
        let stored = account_value(failures);
        let next = failure(failures);
        // The floor of any read-modify-write of the value: copy it and append one failure's
        // bytes (a window entry and a new pair window).
        group.bench_function(format!("copy_and_append_{failures}_failures"), |b| {
            b.iter(|| {
                let mut out = Vec::with_capacity(stored.len() + 62);
                out.extend_from_slice(black_box(&stored));
                out.extend_from_slice(&[0u8; 62]);
                black_box(out)
            });
        });
        group.bench_function(format!("unpack_step_pack_{failures}_failures"), |b| {
            b.iter(|| {
                let mut value = WindowValue::unpack(black_box(&stored), NOW).expect("our layout");
                for step in &next {
                    black_box(value.step(step, NOW));
                }
                value.finish(NOW);
                black_box(value.packed(NOW))
            });
        });
    }
    group.finish();
}
