//! Reputation lookups: our range table vs `ip_network_table` vs a linear scan on the same
//! shared lists (every CIDR/IP list, ~86k ranges), and the 515k-range IP→ASN table.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use palisade::reputation::parse::{parse_ranges, position};
use palisade::reputation::table::RangeTable;
use rand::{Rng, SeedableRng};

fn shared(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(rel)
}

const LISTS: &[&str] = &[
    "datacenter/x4bnet-datacenter-ipv4.txt",
    "datacenter/x4bnet-datacenter-ipv6.txt",
    "vpn/x4bnet-vpn-ipv4.txt",
    "vpn/x4bnet-vpn-ipv6.txt",
    "cloud/aws-ip-ranges.json",
    "cloud/gcp-cloud.json",
    "tor/tor-exit-relays.csv",
];

fn queries() -> Vec<IpAddr> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    (0..10_000)
        .map(|i| {
            if i % 10 == 0 {
                IpAddr::from(rng.random::<u128>().to_be_bytes())
            } else {
                IpAddr::from(rng.random::<u32>().to_be_bytes())
            }
        })
        .collect()
}

/// The `(start, end)` of a prefix range as an `ip_network::IpNetwork`.
fn network(start: u128, end: u128) -> ip_network::IpNetwork {
    let host_bits = if end - start == u128::MAX {
        128
    } else {
        (end - start + 1).trailing_zeros()
    };
    let v6 = std::net::Ipv6Addr::from(start);
    match v6.to_ipv4_mapped() {
        Some(v4) if host_bits <= 32 => {
            ip_network::IpNetwork::new(v4, (32 - host_bits) as u8).expect("prefix")
        }
        _ => ip_network::IpNetwork::new(v6, (128 - host_bits) as u8).expect("prefix"),
    }
}

/// Lookups per second on one core over every shared CIDR/IP list loaded together.
pub fn lookups(c: &mut Criterion) {
    let started = Instant::now();
    let mut triples = Vec::new();
    for (source, list) in LISTS.iter().enumerate() {
        let text = std::fs::read_to_string(shared(list)).expect("shared data");
        for (start, end) in parse_ranges(&text).expect("parses") {
            triples.push((start, end, source as u16));
        }
    }
    let ranges = triples.len();
    let ours = RangeTable::build(triples.clone());
    let ours_ms = started.elapsed().as_secs_f64() * 1000.0;
    let started = Instant::now();
    let mut theirs = ip_network_table::IpNetworkTable::new();
    for &(start, end, source) in &triples {
        theirs.insert(network(start, end), source);
    }
    let theirs_ms = started.elapsed().as_secs_f64() * 1000.0;
    let linear: Vec<(u128, u128)> = triples.iter().map(|t| (t.0, t.1)).collect();
    println!(
        "reputation: {ranges} ranges -> {} segments, {:.1} bytes/range; parse+build {ours_ms:.0} ms (ip_network_table insert {theirs_ms:.0} ms)",
        ours.segments(),
        ours.heap_bytes() as f64 / ranges as f64
    );

    let queries = queries();
    let mut group = c.benchmark_group(format!("reputation_lookup_{}k_ranges", ranges / 1000));
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function(BenchmarkId::new("palisade_range_table", ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(ours.lookup(position(queries[i])).len())
        });
    });
    group.bench_function(BenchmarkId::new("ip_network_table", ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(theirs.longest_match(queries[i]).is_some())
        });
    });
    group.sample_size(10);
    group.bench_function(BenchmarkId::new("linear_scan", ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            let p = position(queries[i]);
            black_box(linear.iter().filter(|(s, e)| *s <= p && p <= *e).count())
        });
    });
    group.finish();
}

/// IP→ASN over the 515k-range CSVs (the `asn/*.csv` source), through the whole verdict.
pub fn asn_lookups(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("asn")).unwrap();
    for file in ["ip-location-db-asn-ipv4.csv", "ip-location-db-asn-ipv6.csv"] {
        std::fs::copy(
            shared(&format!("asn/{file}")),
            dir.path().join("asn").join(file),
        )
        .unwrap();
    }
    let started = Instant::now();
    let snapshot = palisade::reputation::load(dir.path()).expect("asn csv loads");
    let (_, asn_ranges) = snapshot.asn_databases();
    println!(
        "asn: {asn_ranges} IP->ASN ranges loaded in {:.0} ms",
        started.elapsed().as_secs_f64() * 1000.0
    );
    let queries = queries();
    let factors = palisade::config::ReputationSettings::default();
    let mut group = c.benchmark_group(format!("asn_lookup_{}k_ranges", asn_ranges / 1000));
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function(BenchmarkId::new("palisade_verdict", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(snapshot.lookup(queries[i], &factors).asn)
        });
    });
    group.finish();
}
