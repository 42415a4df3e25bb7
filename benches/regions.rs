//! Leased shares of a global budget across regions, in a deterministic simulator:
//! `cargo bench --bench regions`.
//!
//! Three regions 20, 80 and 200 ms (one way) from the database; each renews its shares every
//! 250 ms with the service's own code (`palisade::regions::lease`) and spends them as the
//! service does, a bucket scaled by the share that keeps its debt in tokens when the share
//! moves (`palisade::limiter::bucket::evaluate_shared`). The
//! same requests go to one global bucket (the oracle: what a single bucket over every region
//! would admit). Per scenario: what the regions admitted against the budget (goal ≤ 105 %)
//! and how many fewer than the one bucket, the requests that fit and were refused (goal
//! ≤ 1 %).

use palisade::limiter::bucket::{Params, evaluate, evaluate_shared};
use palisade::regions::lease::{Lease, Report, smooth, step};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REGIONS: [&str; 3] = ["near", "mid", "far"];
const LATENCY_MS: [i64; 3] = [20, 80, 200];
const RENEW_MS: i64 = 250;
const SECONDS: i64 = 120;

/// The budget: a tenant quota of 100 requests a second, bursts of 100.
const CAPACITY: f64 = 100.0;
const RATE: f64 = 100.0;

#[derive(Clone, Copy, PartialEq)]
enum FailMode {
    Open,
    Closed,
}

struct Scenario {
    name: &'static str,
    /// Requests per second of each region at `t` seconds.
    demand: fn(f64) -> [f64; 3],
    /// A region cut off from the database, from and to (seconds).
    partition: Option<(usize, f64, f64)>,
    fail: FailMode,
}

/// A report as the database holds it: (region, demand, written at).
type Stored = (usize, f64, i64);

struct Region {
    tat: Option<f64>,
    /// The share `tat` was written at.
    written: f64,
    share: f64,
    leased: bool,
    period_cost: f64,
    reported: Option<f64>,
    /// Last renewal answered (ms): a fail-closed region without one for a lease spends 0.
    renewed_ms: i64,
    /// A report on its way to the database: (arrives at, demand, sent at).
    sent: Vec<(i64, f64, i64)>,
    /// An answer on its way back: (arrives at, reports as the database had them then).
    answers: Vec<(i64, Vec<Stored>)>,
}

struct Outcome {
    requests: u64,
    admitted: u64,
    oracle_admitted: u64,
    refused_that_fit: u64,
}

fn run(scenario: &Scenario, seed: u64) -> Outcome {
    let lease = Lease::new(REGIONS.len() as u32, RENEW_MS as u64);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut regions: Vec<Region> = (0..REGIONS.len())
        .map(|_| Region {
            tat: None,
            written: lease.unleased(),
            share: lease.unleased(),
            leased: false,
            period_cost: 0.0,
            reported: None,
            renewed_ms: 0,
            sent: Vec::new(),
            answers: Vec::new(),
        })
        .collect();
    // The database: per region, its latest report (demand, written at).
    let mut database: Vec<Option<(f64, i64)>> = vec![None; REGIONS.len()];
    let mut oracle: Option<f64> = None;
    let mut out = Outcome {
        requests: 0,
        admitted: 0,
        oracle_admitted: 0,
        refused_that_fit: 0,
    };
    let params = |share: f64| Params {
        capacity: CAPACITY,
        refill_per_s: RATE,
        multiplier: share,
    };
    for now in 0..SECONDS * 1000 {
        let t = now as f64 / 1000.0;
        let cut = |r: usize| {
            scenario
                .partition
                .is_some_and(|(p, from, to)| p == r && t >= from && t < to)
        };
        for (r, region) in regions.iter_mut().enumerate() {
            // Renewals, each region at its own phase.
            if (now + r as i64 * 83) % RENEW_MS == 0 {
                let demand = smooth(region.reported, region.period_cost);
                region.reported = Some(demand);
                region.period_cost = 0.0;
                if !cut(r) {
                    region.sent.push((now + LATENCY_MS[r], demand, now));
                }
            }
            // Reports reaching the database, answered with every region's latest.
            let (arrived, waiting): (Vec<_>, Vec<_>) =
                region.sent.drain(..).partition(|(at, _, _)| *at <= now);
            region.sent = waiting;
            for (_, demand, _) in arrived {
                if cut(r) {
                    continue;
                }
                database[r] = Some((demand, now));
                let reports = database
                    .iter()
                    .enumerate()
                    .filter_map(|(i, d)| d.map(|(demand, at)| (i, demand, at)))
                    .collect();
                region.answers.push((now + LATENCY_MS[r], reports));
            }
            let (answered, waiting): (Vec<_>, Vec<_>) =
                region.answers.drain(..).partition(|(at, _)| *at <= now);
            region.answers = waiting;
            for (at, reports) in answered {
                if cut(r) {
                    continue;
                }
                let reports: Vec<Report<'_>> = reports
                    .iter()
                    .map(|&(i, demand, at_ms)| Report {
                        region: REGIONS[i],
                        demand,
                        at_ms,
                    })
                    .collect();
                // Liveness as the database saw it when it answered.
                let target = lease.share(
                    REGIONS[r],
                    &reports,
                    at - LATENCY_MS[r],
                    RATE * RENEW_MS as f64 / 1000.0,
                    scenario.fail == FailMode::Open,
                );
                region.share = step(
                    region.leased.then_some(region.share),
                    target,
                    lease.unleased(),
                );
                region.leased = true;
                region.renewed_ms = now;
            }
            if scenario.fail == FailMode::Closed && now - region.renewed_ms > lease.lease_ms {
                region.share = 0.0;
            }
            // This millisecond's requests.
            let rate = (scenario.demand)(t)[r];
            if rng.random::<f64>() < rate / 1000.0 {
                out.requests += 1;
                region.period_cost += 1.0;
                let now_us = now as f64 * 1000.0;
                let global = evaluate(oracle, now_us, params(1.0), 1.0);
                if global.allowed {
                    oracle = Some(global.new_tat);
                    out.oracle_admitted += 1;
                }
                let local = evaluate_shared(
                    region.tat,
                    region.written,
                    now_us,
                    params(region.share),
                    region.share,
                    1.0,
                );
                if local.allowed {
                    region.tat = Some(local.new_tat);
                    region.written = region.share;
                    out.admitted += 1;
                } else if global.allowed {
                    out.refused_that_fit += 1;
                }
            }
        }
    }
    out
}

fn main() {
    let scenarios = [
        Scenario {
            name: "steady, 80 % of the budget, 70/20/10",
            demand: |_| [56.0, 16.0, 8.0],
            partition: None,
            fail: FailMode::Open,
        },
        Scenario {
            name: "steady, 200 % of the budget, 70/20/10",
            demand: |_| [140.0, 40.0, 20.0],
            partition: None,
            fail: FailMode::Open,
        },
        Scenario {
            name: "the busiest region moves every 20 s, 150 %",
            demand: |t| {
                let busy = (t / 20.0) as usize % 3;
                let mut d = [25.0; 3];
                d[busy] = 100.0;
                d
            },
            partition: None,
            fail: FailMode::Open,
        },
        Scenario {
            name: "bursts: one region 3× for 2 s in 10, 70 % on average",
            demand: |t| {
                if t % 10.0 < 2.0 {
                    [30.0, 90.0, 10.0]
                } else {
                    [30.0, 20.0, 10.0]
                }
            },
            partition: None,
            fail: FailMode::Open,
        },
        Scenario {
            name: "far region cut off 40–70 s, 200 %, fail open",
            demand: |_| [100.0, 60.0, 40.0],
            partition: Some((2, 40.0, 70.0)),
            fail: FailMode::Open,
        },
        Scenario {
            name: "far region down from 40 s, its traffic to the near one, 80 %, fail open",
            demand: |t| {
                if t < 40.0 {
                    [40.0, 24.0, 16.0]
                } else {
                    [56.0, 24.0, 0.0]
                }
            },
            partition: Some((2, 40.0, f64::INFINITY)),
            fail: FailMode::Open,
        },
        Scenario {
            name: "far region cut off 40–70 s, 200 %, fail closed",
            demand: |_| [100.0, 60.0, 40.0],
            partition: Some((2, 40.0, 70.0)),
            fail: FailMode::Closed,
        },
    ];
    let budget = CAPACITY + RATE * SECONDS as f64;
    println!(
        "## Leased shares: 3 regions 20/80/200 ms from the database, renewed every {RENEW_MS} ms, a budget of {RATE}/s (bursts of {CAPACITY}), {SECONDS} s, seeds 1–5\n"
    );
    println!(
        "| scenario | requests | admitted / budget (goal ≤ 105 %) | admitted / one global bucket | fewer than one bucket (goal ≤ 1 %) | refused while one bucket admitted the same request |"
    );
    println!("|---|---|---|---|---|---|");
    for scenario in &scenarios {
        let runs: Vec<Outcome> = (1..=5).map(|seed| run(scenario, seed)).collect();
        let worst_over = runs
            .iter()
            .map(|o| o.admitted as f64 / budget)
            .fold(0.0, f64::max);
        let ratio = runs
            .iter()
            .map(|o| o.admitted as f64 / o.oracle_admitted as f64)
            .fold(0.0, f64::max);
        let shortfall = runs
            .iter()
            .map(|o| (1.0 - o.admitted as f64 / o.oracle_admitted as f64).max(0.0))
            .fold(0.0, f64::max);
        let worst_refused = runs
            .iter()
            .map(|o| o.refused_that_fit as f64 / o.oracle_admitted as f64)
            .fold(0.0, f64::max);
        let requests = runs.iter().map(|o| o.requests).sum::<u64>() / runs.len() as u64;
        println!(
            "| {} | {requests} | {:.1} % | {:.3} | {:.2} % | {:.1} % |",
            scenario.name,
            100.0 * worst_over,
            ratio,
            100.0 * shortfall,
            100.0 * worst_refused
        );
    }
    println!(
        "\n(worst of the five seeds in each column; the last column pairs requests: over the budget, which requests a bucket admits is arbitrary)"
    );
}
