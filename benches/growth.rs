//! How a cost grows with what is held: the reputation table's lookup and memory at 10k, 1 M
//! and 10 M ranges, and the in-process bucket store's check and memory at 10k, 1 M and
//! 10 M live keys, and a check at 10, 100 and 1,000 configured classes. Each size is its own
//! entry of one group, so their ratios come from one run: `cargo bench --bench growth`. A
//! target of its own: filling the largest tables takes seconds and hundreds of MiB, which
//! the other micro-benchmarks should not pay.
//!
//! A lookup that grows faster than the logarithm of the ranges, or memory faster than
//! linearly, shows as a ratio between sizes beyond what the sizes explain.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use palisade::limiter::bucket::{Params, evaluate};
use palisade::reputation::table::RangeTable;
use palisade::store::MemoryHot;
use rand::{Rng, SeedableRng};

/// The same allocator as the `palisade` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [usize; 3] = [10_000, 1_000_000, 10_000_000];

/// The position of IPv4 address `v4` in the table's address space (`::ffff:a.b.c.d`).
fn v4_position(v4: u32) -> u128 {
    0xffff_0000_0000 + u128::from(v4)
}

/// `count` random ranges, nine in ten IPv4 prefixes of /16 to /32 and the rest IPv6 /32 to
/// /64, from eight sources (overlaps included, as real lists have).
fn ranges(count: usize, rng: &mut rand::rngs::StdRng) -> Vec<(u128, u128, u16)> {
    (0..count)
        .map(|i| {
            let source = (i % 8) as u16;
            if i % 10 == 0 {
                let bits = rng.random_range(64..=96u32);
                let start = rng.random::<u128>() >> bits << bits;
                (start, start | ((1u128 << bits) - 1), source)
            } else {
                let host_bits = rng.random_range(0..=16u32);
                let start = rng.random::<u32>() >> host_bits << host_bits;
                let end = start | ((1u64 << host_bits) - 1) as u32;
                (v4_position(start), v4_position(end), source)
            }
        })
        .collect()
}

/// Resident memory of this process, bytes (Linux; 0 elsewhere).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn reputation(c: &mut Criterion) {
    let mut group = c.benchmark_group("growth_reputation_lookup");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let queries: Vec<u128> = (0..100_000)
        .map(|_| v4_position(rng.random::<u32>()))
        .collect();
    for size in SIZES {
        let ranges = ranges(size, &mut rng);
        let started = Instant::now();
        let table = RangeTable::build(ranges);
        println!(
            "growth: {size} ranges -> {} segments in {:.2} s, {:.1} B per range ({} MiB)",
            table.segments(),
            started.elapsed().as_secs_f64(),
            table.heap_bytes() as f64 / size as f64,
            table.heap_bytes() >> 20
        );
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                i = (i + 1) % queries.len();
                black_box(table.lookup(queries[i]).len())
            })
        });
    }
    group.finish();
}

fn buckets(c: &mut Criterion) {
    let mut group = c.benchmark_group("growth_in_process_check");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    // A bucket that never refills to full within the run: every key stays resident.
    let params = Params {
        capacity: 1e9,
        refill_per_s: 1.0,
        multiplier: 1.0,
    };
    let mut now_us = 0.0f64;
    let check = |memory: &MemoryHot, id: u64, now_us: f64| {
        memory.update_buckets_by_id(&[id], now_us, |states, writes| {
            let verdict = evaluate(states[0], now_us, params, 1.0);
            writes[0] = verdict.allowed.then_some(verdict.new_tat);
            verdict.allowed
        })
    };
    for size in SIZES {
        let memory = MemoryHot::new();
        let ids: Vec<u64> = (0..size as u64)
            .map(|k| memory.bucket_id(&format!("user:{k}"), "b", ""))
            .collect();
        let before = resident_bytes();
        let started = Instant::now();
        for &id in &ids {
            now_us += 0.01;
            check(&memory, id, now_us);
        }
        let held = resident_bytes().saturating_sub(before);
        println!(
            "growth: {size} live keys filled in {:.2} s, resident +{} MiB ({:.1} B per key)",
            started.elapsed().as_secs_f64(),
            held >> 20,
            held as f64 / size as f64
        );
        // The ids in turn: reading them is sequential (prefetched), while each is a random
        // slot of the store's table (they are hashes), as a check's key is.
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                now_us += 0.01;
                i = (i + 1) % ids.len();
                black_box(check(&memory, ids[i], now_us))
            })
        });
        drop(ids);
        drop(memory);
    }
    group.finish();
}

fn classes(c: &mut Criterion) {
    use palisade::clock::ManualClock;
    use palisade::config::{BudgetSettings, ClassSettings, LimitSettings, ScopeKind};
    use palisade::limiter::{LimitRequest, Limiter};
    use palisade::model::{ClientIp, SubjectKey};
    use palisade::store::{Hot, Keys};
    use std::sync::Arc;
    use std::time::Duration;

    let mut group = c.benchmark_group("growth_classes_check");
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for count in [10usize, 100, 1000] {
        // The default classes and budgets, and `count` more classes each with a budget of
        // its own; every budget so large that no bucket refills to full within the run.
        let mut settings = LimitSettings::default();
        for i in 0..count {
            settings.classes.insert(
                format!("svc{i}"),
                ClassSettings {
                    paths: vec![format!("/svc{i}/*")],
                    priority: 50,
                    ..ClassSettings::default()
                },
            );
            settings.budgets.push(BudgetSettings {
                name: format!("svc{i}-user"),
                scope: ScopeKind::EndpointUser,
                classes: vec![format!("svc{i}")],
                limit: 1,
                period_s: 1,
                burst: None,
                when: palisade::config::When::Always,
                shadow: false,
            });
        }
        for budget in &mut settings.budgets {
            budget.limit = 1_000_000_000;
            budget.period_s = 1_000_000_000;
        }
        let clock = ManualClock::new(1_800_000_000_000);
        let limiter = Limiter::new(
            &settings,
            Hot::Memory(MemoryHot::new()),
            Keys::new("pal"),
            Arc::new(clock.clone()),
        );
        // The class tried last, a path of its own per request (an id in it), 100k users.
        let last = count - 1;
        let requests: Vec<LimitRequest> = (0..100_000)
            .map(|i| LimitRequest {
                method: "GET".to_owned(),
                endpoint: format!("/svc{last}/items/{i}"),
                ip: ClientIp::parse(
                    &format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                    64,
                )
                .unwrap(),
                user: Some(SubjectKey::user(&format!("user-{i}"), 64).unwrap()),
                device: None,
                tenant: None,
                recipient: None,
                cost: 1,
                consume: true,
            })
            .collect();
        let decision = runtime.block_on(limiter.check(&requests[0])).unwrap();
        assert_eq!(
            &*decision.class,
            format!("svc{last}"),
            "the request reaches its class"
        );
        let mut i = 0;
        group.bench_function(BenchmarkId::from_parameter(count), |b| {
            b.iter(|| {
                i = (i + 1) % requests.len();
                clock.advance(Duration::from_micros(1));
                black_box(
                    runtime
                        .block_on(limiter.check(&requests[i]))
                        .unwrap()
                        .allowed,
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, reputation, buckets, classes);
criterion_main!(benches);
