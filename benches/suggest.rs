//! Budgets from traffic: how fast recorded checks are summarised, on one thread, and what
//! memory it takes as the record grows.
//!
//! `cargo bench --bench suggest` (`SUGGEST_RECORDS`, default 10,000,000): an hour of checks
//! from 1,000,000 clients (reads, writes, logins and searches; two in three signed in, half
//! with a device, one in a hundred flagged), generated page by page as `policy suggest`
//! reads them. The baseline is generating and walking the same pages without summarising,
//! in the same run; each pass of the summary is reported against it, and the two-pass
//! suggestion (`policy suggest`'s) in full. Resident memory is read after a tenth of the
//! record and at its end: it follows the keys of one window, not the record.

use std::time::{Duration, Instant};

use palisade::config::LimitSettings;
use palisade::policy::record::{Multipliers, Outcome, Recorded};
use palisade::policy::suggest::{Options, Summary};

/// Checks per page, as `policy suggest` reads them.
const PAGE: usize = 20_000;
const CLIENTS: u64 = 1_000_000;
const HOUR_MS: i64 = 3_600_000;

fn record(i: u64, total: u64) -> Recorded {
    let endpoints = [
        ("GET", "/api/feed"),
        ("GET", "/api/items/7"),
        ("POST", "/api/items"),
        ("POST", "/auth/login"),
        ("GET", "/search"),
    ];
    // A multiplicative hash spreads the clients; each appears about ten times an hour.
    let client = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % CLIENTS;
    let (method, endpoint) = endpoints[(i % endpoints.len() as u64) as usize];
    let flagged = client.is_multiple_of(100);
    Recorded {
        id: String::new(),
        at_ms: 1_800_000_000_000 + (i as i64 * HOUR_MS) / total as i64,
        method: method.to_owned(),
        endpoint: endpoint.to_owned(),
        ip: format!("fd00:{:x}:{:x}::1", client >> 16, client & 0xffff),
        user: (!client.is_multiple_of(3)).then(|| format!("anon-{client:016x}")),
        device: client
            .is_multiple_of(2)
            .then(|| format!("anon-d{client:015x}")),
        tenant: None,
        cost: 1,
        consume: true,
        outcome: Some(Outcome::Allowed),
        multipliers: Multipliers {
            ip: if flagged { 0.5 } else { 1.0 },
            ..Multipliers::default()
        },
    }
}

/// Walks the record page by page, handing each check to `each`; resident KiB after a tenth
/// of the record and at its end.
fn walk(total: u64, mut each: impl FnMut(&Recorded)) -> (Duration, u64, u64) {
    let started = Instant::now();
    let mut page = Vec::with_capacity(PAGE);
    let mut at_tenth = 0;
    let mut i = 0;
    while i < total {
        page.clear();
        let end = (i + PAGE as u64).min(total);
        page.extend((i..end).map(|n| record(n, total)));
        for r in &page {
            each(r);
        }
        if i < total / 10 && end >= total / 10 {
            at_tenth = resident_kib();
        }
        i = end;
    }
    (started.elapsed(), at_tenth, resident_kib())
}

/// This process's resident memory, KiB (0 where /proc is missing).
fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let total: u64 = std::env::var("SUGGEST_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let live = LimitSettings::default();
    let mut sink = 0u64;
    let (baseline, _, _) = walk(total, |r| sink = sink.wrapping_add(r.at_ms as u64));
    let mut first = Summary::new(&live).collecting_flagged();
    let (collect, tenth_1, end_1) = walk(total, |r| first.add(r));
    let started = Instant::now();
    let flagged = first.finish().flagged_keys();
    let finish_1 = started.elapsed();
    let flagged_count = flagged.len();
    let mut second = Summary::new(&live).excluding(flagged);
    let (count, tenth_2, end_2) = walk(total, |r| second.add(r));
    let started = Instant::now();
    let suggestion = second.suggest(&live, Options::default());
    let suggest = started.elapsed();
    let (baseline_again, _, _) = walk(total, |r| sink = sink.wrapping_add(r.at_ms as u64));
    let base = (baseline + baseline_again) / 2;
    let s = |d: Duration| d.as_secs_f64();
    let summary_s = s(collect) - s(base) + s(finish_1) + s(count) - s(base) + s(suggest);
    println!(
        "{total} checks, {CLIENTS} clients, {} flagged keys; {} budgets suggested (checksum {sink})\n",
        flagged_count,
        suggestion.budgets.len()
    );
    println!("| step | wall s | over the baseline s | resident KiB at a tenth → at the end |");
    println!("|---|---:|---:|---:|");
    println!(
        "| baseline: generate and walk the pages (mean of two) | {:.1} | – | – |",
        s(base)
    );
    println!(
        "| pass 1: summary, collecting flagged keys | {:.1} | {:.1} | {tenth_1} → {end_1} |",
        s(collect) + s(finish_1),
        s(collect) + s(finish_1) - s(base)
    );
    println!(
        "| pass 2: summary, flagged keys left out, and the suggestion | {:.1} | {:.1} | {tenth_2} → {end_2} |",
        s(count) + s(suggest),
        s(count) + s(suggest) - s(base)
    );
    println!(
        "\nSummarising {total} checks (both passes, the baseline taken out): {summary_s:.1} s on one thread, {:.2} M checks/s per pass.",
        2.0 * total as f64 / summary_s / 1e6
    );
}
