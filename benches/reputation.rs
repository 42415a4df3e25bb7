//! Reputation lookups: our range table vs `ip_network_table` vs a linear scan on the same
//! lists (the ones shipped in `data/`, ~86k ranges), and the 515k-range IP→ASN table of
//! `@ip-location-db/asn` (CC BY 4.0, not shipped: set `PALISADE_ASN_CSV_DIR` to the folder
//! holding `ip-location-db-asn-ipv4.csv` and `-ipv6.csv`; without it that group is skipped).

use std::hint::black_box;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use palisade::reputation::parse::{parse_ranges, position};
use palisade::reputation::table::RangeTable;
use rand::{Rng, SeedableRng};

/// A list shipped in the repository's `data/ranges/`, decompressed.
fn shipped(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data/ranges")
        .join(rel);
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("shipped list")),
        &mut text,
    )
    .expect("gzip");
    text
}

/// The large IP→ASN CSVs, when `PALISADE_ASN_CSV_DIR` names their folder.
fn asn_csvs() -> Option<[PathBuf; 2]> {
    let dir = PathBuf::from(std::env::var_os("PALISADE_ASN_CSV_DIR")?);
    Some([
        dir.join("ip-location-db-asn-ipv4.csv"),
        dir.join("ip-location-db-asn-ipv6.csv"),
    ])
}

const LISTS: &[&str] = &[
    "datacenter/x4bnet-datacenter-ipv4.txt.gz",
    "datacenter/x4bnet-datacenter-ipv6.txt.gz",
    "vpn/x4bnet-vpn-ipv4.txt.gz",
    "vpn/x4bnet-vpn-ipv6.txt.gz",
    "datacenter/aws-ip-ranges.json.gz",
    "datacenter/gcp-cloud.json.gz",
    "tor/tor-exit-relays.csv.gz",
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

/// Lookups per second on one core over every shipped CIDR/IP list loaded together.
pub fn lookups(c: &mut Criterion) {
    let started = Instant::now();
    let mut triples = Vec::new();
    for (source, list) in LISTS.iter().enumerate() {
        let text = shipped(list);
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
    let Some(csvs) = asn_csvs() else {
        eprintln!(
            "SKIPPED asn_lookup: set PALISADE_ASN_CSV_DIR to the folder of the @ip-location-db/asn CSVs"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("asn")).unwrap();
    for file in &csvs {
        std::fs::copy(file, dir.path().join("asn").join(file.file_name().unwrap())).unwrap();
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

    // The same ranges written as a GeoLite2-ASN-format .mmdb (mmdb-writer), read by the
    // `maxminddb` crate through the same code path (`asn/*.mmdb` in the data dir).
    let started = Instant::now();
    let (mmdb, networks) = mmdb_from_csvs(&csvs);
    println!(
        "asn: {networks} networks written as a {} MiB .mmdb in {:.1} s",
        mmdb.len() / (1024 * 1024),
        started.elapsed().as_secs_f64()
    );
    let mmdb_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(mmdb_dir.path().join("asn")).unwrap();
    std::fs::write(mmdb_dir.path().join("asn/asn.mmdb"), &mmdb).unwrap();
    let from_mmdb = palisade::reputation::load(mmdb_dir.path()).expect("the mmdb loads");
    // Same answers on every query address.
    let aliased = |ip: &IpAddr| match ip {
        IpAddr::V6(v6) => matches!(v6.segments(), [0x2001, 0, ..] | [0x2002, ..]),
        IpAddr::V4(_) => false,
    };
    for ip in queries.iter().filter(|ip| !aliased(ip)) {
        assert_eq!(
            snapshot.asn(*ip).map(|a| a.0),
            from_mmdb.asn(*ip).map(|a| a.0),
            "{ip}"
        );
    }
    group.bench_function(BenchmarkId::new("palisade_asn_ranges", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(snapshot.asn(queries[i]))
        });
    });
    group.bench_function(BenchmarkId::new("maxminddb_same_data", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(from_mmdb.asn(queries[i]))
        });
    });
    // The number alone, as scoring asks for it on every request.
    group.bench_function(BenchmarkId::new("palisade_asn_number", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(snapshot.asn_number(queries[i]))
        });
    });
    group.bench_function(BenchmarkId::new("maxminddb_asn_number", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(from_mmdb.asn_number(queries[i]))
        });
    });
    group.bench_function(BenchmarkId::new("maxminddb_verdict", asn_ranges), |b| {
        b.iter(|| {
            i = (i + 1) % queries.len();
            black_box(from_mmdb.lookup(queries[i], &factors).asn)
        });
    });
    group.finish();
}

/// Writes `start,end,asn,org` CSVs as a GeoLite2-ASN-format database; returns its bytes and
/// the number of networks (each range becomes the CIDRs that cover it exactly).
fn mmdb_from_csvs(files: &[PathBuf]) -> (Vec<u8>, usize) {
    use mmdb_writer::ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};
    use mmdb_writer::{Value, Writer};
    let mut writer = Writer::builder("GeoLite2-ASN")
        .description(&[("en", "ip-location-db ASN ranges, for the benchmark")])
        .build();
    let mut networks = 0;
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let mut fields = line.splitn(4, ',');
            let (Some(start), Some(end), Some(asn), Some(org)) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let (Ok(start), Ok(end), Ok(asn)) = (
                start.parse::<IpAddr>(),
                end.parse::<IpAddr>(),
                asn.parse::<u32>(),
            ) else {
                continue;
            };
            let value = Value::map([
                ("autonomous_system_number", Value::from(asn)),
                (
                    "autonomous_system_organization",
                    Value::from(org.trim_matches('"')),
                ),
            ]);
            let nets: Vec<IpNet> = match (start, end) {
                (IpAddr::V4(s), IpAddr::V4(e)) => {
                    Ipv4Subnets::new(s, e, 0).map(IpNet::V4).collect()
                }
                (IpAddr::V6(s), IpAddr::V6(e)) => {
                    Ipv6Subnets::new(s, e, 0).map(IpNet::V6).collect()
                }
                _ => continue,
            };
            for net in nets {
                // The IPv4 aliases of an IPv6 tree (2001::/32 Teredo, 2002::/16 6to4) cannot
                // hold their own data: those few networks are left out (and not compared).
                match writer.insert_value(net, value.clone()) {
                    Ok(()) => networks += 1,
                    Err(mmdb_writer::Error::AliasedNetwork(_)) => {}
                    Err(err) => panic!("{net}: {err}"),
                }
            }
        }
    }
    (writer.to_bytes().unwrap(), networks)
}
