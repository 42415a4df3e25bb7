//! Policy replay: recorded checks through the live and a candidate `[limits]` on simulated
//! time (two in-process limiters), one thread.

use criterion::{Criterion, Throughput};
use palisade::config::LimitSettings;
use palisade::policy::record::{Multipliers, Recorded};
use palisade::policy::replay::{Replayer, Report};

const RECORDS: usize = 100_000;

/// 100,000 recorded checks over 10,000 clients (reads, writes and logins, 1 ms apart), as
/// `palisade replay` reads them; a candidate with every budget halved.
fn records() -> Vec<Recorded> {
    let endpoints = [
        ("GET", "/api/feed"),
        ("POST", "/api/items"),
        ("POST", "/auth/login"),
    ];
    (0..RECORDS)
        .map(|i| {
            let client = (i * 7919) % 10_000;
            let (method, endpoint) = endpoints[i % endpoints.len()];
            Recorded {
                id: format!("{i:026}"),
                at_ms: 1_800_000_000_000 + i as i64,
                method: method.to_owned(),
                endpoint: endpoint.to_owned(),
                ip: format!("fd00:{:x}:{:x}::1", client / 256, client % 256),
                user: (client % 3 != 0).then(|| format!("anon-{client:016x}")),
                device: (client % 2 == 0).then(|| format!("anon-d{client:015x}")),
                tenant: None,
                cost: 1,
                consume: true,
                outcome: None,
                multipliers: Multipliers::default(),
            }
        })
        .collect()
}

pub fn replay(c: &mut Criterion) {
    let live = LimitSettings::default();
    let mut candidate = LimitSettings::default();
    for budget in &mut candidate.budgets {
        budget.limit = (budget.limit / 2).max(1);
    }
    let records = records();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("policy_replay");
    group.sample_size(10);
    // Two decisions per record: the live policy's and the candidate's.
    group.throughput(Throughput::Elements(2 * RECORDS as u64));
    group.bench_function("replay_100k_records", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let mut replayer = Replayer::new(&live, &candidate, records[0].at_ms);
                let mut report = Report::default();
                for record in &records {
                    report.add(&replayer.step(record).await);
                }
                report.requests
            })
        });
    });
    group.finish();
}
