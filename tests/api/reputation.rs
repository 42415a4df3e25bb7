//! Reputation on the real public lists shipped in `data/` (copied into a temporary data dir
//! for each test).

use std::path::Path;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope, lay_out};
use crate::on_both_backends;

const REAL_LISTS: &[(&str, &str)] = &[
    (
        "data/ranges/datacenter/x4bnet-datacenter-ipv4.txt.gz",
        "ranges/datacenter/x4bnet-datacenter-ipv4.txt",
    ),
    (
        "data/ranges/datacenter/x4bnet-datacenter-ipv6.txt.gz",
        "ranges/datacenter/x4bnet-datacenter-ipv6.txt",
    ),
    (
        "data/ranges/datacenter/ipcat-datacenters.csv.gz",
        "ranges/datacenter/ipcat-datacenters.csv",
    ),
    (
        "data/ranges/datacenter/aws-ip-ranges.json.gz",
        "ranges/datacenter/aws-ip-ranges.json",
    ),
    (
        "data/ranges/datacenter/gcp-cloud.json.gz",
        "ranges/datacenter/gcp-cloud.json",
    ),
    (
        "data/ranges/vpn/x4bnet-vpn-ipv4.txt.gz",
        "ranges/vpn/x4bnet-vpn-ipv4.txt",
    ),
    (
        "data/ranges/tor/tor-exit-relays.csv.gz",
        "ranges/tor/tor-exit-relays.csv",
    ),
    (
        "data/ranges/tor/tor-exit-nodes-2024-02.lst.gz",
        "ranges/tor/tor-exit-nodes-2024-02.lst",
    ),
    (
        "data/ranges/proxy/monosans-open-proxies.txt.gz",
        "ranges/proxy/monosans-open-proxies.txt",
    ),
    (
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/GeoLite2-ASN-Test.mmdb",
    ),
];

fn verdict(snapshot: &palisade::reputation::Snapshot, ip: &str) -> palisade::reputation::Verdict {
    snapshot.lookup(
        ip.parse().unwrap(),
        &palisade::config::ReputationSettings::default(),
    )
}

#[test]
fn real_lists_resolve_class_source_and_asn() {
    let dir = tempfile::tempdir().unwrap();
    lay_out(dir.path(), REAL_LISTS);
    let snapshot = palisade::reputation::load(dir.path()).expect("real lists load");
    let count = |file: &str| {
        snapshot
            .sources()
            .iter()
            .find(|s| s.file.ends_with(file))
            .unwrap()
            .entries
    };
    // Entry counts of SOURCES.md.
    assert_eq!(count("x4bnet-datacenter-ipv4.txt"), 42_566);
    assert_eq!(count("x4bnet-datacenter-ipv6.txt"), 8_752);
    assert_eq!(count("ipcat-datacenters.csv"), 3_429);
    assert_eq!(count("aws-ip-ranges.json"), 10_668 + 6_160);
    assert_eq!(count("gcp-cloud.json"), 661);
    assert_eq!(count("tor-exit-relays.csv"), 5_933);
    assert_eq!(count("monosans-open-proxies.txt"), 492);

    let aws = verdict(&snapshot, "3.5.140.1");
    assert_eq!(aws.classes, vec!["datacenter"]);
    assert!(
        aws.sources
            .iter()
            .any(|s| s.ends_with("aws-ip-ranges.json")),
        "{:?}",
        aws.sources
    );
    assert!(
        aws.sources.len() >= 2,
        "overlapping lists each report: {:?}",
        aws.sources
    );
    assert_eq!(
        verdict(&snapshot, "34.35.0.1")
            .sources
            .iter()
            .filter(|s| s.ends_with("gcp-cloud.json"))
            .count(),
        1
    );
    let both = verdict(&snapshot, "2.26.157.9");
    assert_eq!(both.classes, vec!["datacenter", "vpn"]);
    let tor = verdict(&snapshot, "204.8.96.141");
    assert_eq!(tor.classes, vec!["tor"]);
    assert!(tor.multiplier < 0.5);
    assert_eq!(
        verdict(&snapshot, "2620:7:6003::141").classes,
        vec!["tor"],
        "IPv6"
    );
    assert_eq!(
        verdict(&snapshot, "::ffff:204.8.96.141").classes,
        vec!["tor"],
        "IPv4-mapped IPv6"
    );
    assert_eq!(
        verdict(&snapshot, "::ffff:204.8.96.141").ip.to_string(),
        "204.8.96.141"
    );
    let proxy = verdict(&snapshot, "144.31.222.106");
    assert_eq!(proxy.classes, vec!["proxy"]);
    let clean = verdict(&snapshot, "192.0.2.1");
    assert!(clean.classes.is_empty() && clean.sources.is_empty());
    assert_eq!(clean.multiplier, 1.0);
    let telstra = verdict(&snapshot, "1.128.0.1");
    assert_eq!(
        (telstra.asn, telstra.as_org.as_deref()),
        (Some(1221), Some("Telstra Pty Ltd"))
    );
    assert_eq!(verdict(&snapshot, "2600:6000::1").asn, Some(237));
}

#[test]
fn asn_lists_classify_every_address_of_the_asn() {
    let dir = tempfile::tempdir().unwrap();
    lay_out(
        dir.path(),
        &[(
            "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
            "asn/test.mmdb",
        )],
    );
    std::fs::create_dir_all(dir.path().join("asns")).unwrap();
    std::fs::write(
        dir.path().join("asns/hosting.txt"),
        "# test\nAS1221 # Telstra, for the test\n",
    )
    .unwrap();
    let snapshot = palisade::reputation::load(dir.path()).unwrap();
    let hit = verdict(&snapshot, "1.128.0.1");
    assert_eq!(hit.classes, vec!["hosting"]);
    assert_eq!(
        hit.multiplier, 0.5,
        "an unlisted class gets the default factor"
    );
    let mut factors = palisade::config::ReputationSettings::default();
    factors.factors.insert("hosting".to_owned(), 0.1);
    assert_eq!(
        snapshot
            .lookup("1.128.0.1".parse().unwrap(), &factors)
            .multiplier,
        0.1
    );
    assert_eq!(hit.sources, vec!["asns/hosting.txt"]);
    // Our own committed list parses.
    let ours = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/asns/datacenter.txt"
    ))
    .unwrap();
    assert!(
        palisade::reputation::parse::parse_asns(&ours)
            .unwrap()
            .contains(&16509)
    );
}

#[test]
fn broken_files_are_named_with_file_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("ranges/vpn")).unwrap();
    std::fs::write(
        dir.path().join("ranges/vpn/list.txt"),
        "10.0.0.0/8\n# fine\n300.1.2.3\n",
    )
    .unwrap();
    let err = palisade::reputation::load(dir.path()).unwrap_err();
    assert_eq!((err.file.as_str(), err.line), ("ranges/vpn/list.txt", 3));
    let dir = tempfile::tempdir().unwrap();
    lay_out(
        dir.path(),
        &[(
            "tests/fixtures/mmdb/MaxMind-DB-test-broken-search-tree-24.mmdb",
            "asn/broken.mmdb",
        )],
    );
    let err = palisade::reputation::load(dir.path()).unwrap_err();
    assert_eq!(err.file, "asn/broken.mmdb");
    assert!(
        palisade::reputation::load(Path::new("/nonexistent/dir")).is_ok(),
        "no data dir: empty"
    );
}

on_both_backends!(reputation_route_answers_and_reload_swaps_or_keeps);

async fn reputation_route_answers_and_reload_swaps_or_keeps(app: TestApp) {
    let data = app.settings.data_dir.clone();
    lay_out(
        &data,
        &[(
            "data/ranges/tor/tor-exit-relays.csv.gz",
            "ranges/tor/exits.csv",
        )],
    );
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    assert_envelope(
        app.get("/v1/reputation/204.8.96.141", Some(&ingest)).await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    let before: Value = app
        .get("/v1/reputation/204.8.96.141", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        before["classes"].as_array().unwrap().is_empty(),
        "not loaded until reload"
    );

    let reloaded = app
        .post(
            "/v1/admin/reload",
            Some(ADMIN_TOKEN),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(reloaded.status(), StatusCode::OK);
    let after: Value = app
        .get("/v1/reputation/204.8.96.141", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(after["classes"], serde_json::json!(["tor"]));
    assert_eq!(after["multiplier"], 0.25);

    // A broken file: the reload is refused with file and line, and the old data stays.
    std::fs::write(data.join("ranges/tor/broken.txt"), "1.2.3.4\nnot-an-ip\n").unwrap();
    let refused = app
        .post(
            "/v1/admin/reload",
            Some(ADMIN_TOKEN),
            &serde_json::json!({}),
        )
        .await;
    let body = assert_envelope(refused, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    assert_eq!(body["error"]["details"]["file"], "ranges/tor/broken.txt");
    assert_eq!(body["error"]["details"]["line"], 2);
    let kept: Value = app
        .get("/v1/reputation/204.8.96.141", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(kept["classes"], serde_json::json!(["tor"]));

    // Lookups during reloads never fail.
    std::fs::remove_file(data.join("ranges/tor/broken.txt")).unwrap();
    let mut lookups = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, url) = (app.client.clone(), app.url("/v1/reputation/204.8.96.141"));
        lookups.spawn(async move {
            for _ in 0..50 {
                let response = client
                    .get(&url)
                    .bearer_auth(ADMIN_TOKEN)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["classes"], serde_json::json!(["tor"]));
            }
        });
    }
    for _ in 0..5 {
        assert_eq!(
            app.post(
                "/v1/admin/reload",
                Some(ADMIN_TOKEN),
                &serde_json::json!({})
            )
            .await
            .status(),
            StatusCode::OK
        );
    }
    while let Some(done) = lookups.join_next().await {
        done.unwrap();
    }
    let bad = app.get("/v1/reputation/not-an-ip", Some(ADMIN_TOKEN)).await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let audit: Value = app
        .get("/v1/audit?action=reputation.reload", Some(ADMIN_TOKEN))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(audit["items"].as_array().unwrap().len(), 6);
}

/// A source configured with an explicit format is parsed as that format only; the others
/// are still detected from their content.
#[test]
fn configured_formats_are_enforced_with_file_and_line() {
    use palisade::config::SourceSettings;
    use palisade::reputation::parse::RangeFormat;
    let dir = tempfile::tempdir().unwrap();
    lay_out(
        dir.path(),
        &[
            (
                "data/ranges/datacenter/aws-ip-ranges.json.gz",
                "ranges/datacenter/aws.json",
            ),
            (
                "data/ranges/tor/tor-exit-relays.csv.gz",
                "ranges/tor/exits.csv",
            ),
        ],
    );
    let source = |name: &str, class: &str, format| SourceSettings {
        name: name.to_owned(),
        class: class.to_owned(),
        url: String::new(),
        format,
    };
    let right = [
        source("aws.json", "datacenter", RangeFormat::Json),
        source("exits.csv", "tor", RangeFormat::Csv),
    ];
    let snapshot = palisade::reputation::load_with(dir.path(), &right).expect("formats match");
    assert!(snapshot.ranges > 1000);
    // The Tor CSV declared as a plain CIDR list: refused at its first data line, named.
    let wrong = [source("exits.csv", "tor", RangeFormat::Cidr)];
    let err = palisade::reputation::load_with(dir.path(), &wrong).unwrap_err();
    assert_eq!(err.file, "ranges/tor/exits.csv");
    assert!(err.line >= 1 && err.reason.contains("cidr"), "{err:?}");
    // Undeclared, the same file is detected as CSV.
    assert!(palisade::reputation::load(dir.path()).is_ok());
}

/// A fresh checkout's default data dir (`data/`, as shipped) recognises well-known
/// datacenter, VPN, proxy and Tor addresses with no download.
#[test]
fn the_shipped_data_dir_classifies_well_known_addresses() {
    let snapshot = palisade::reputation::load(&crate::helpers::repo_file("data"))
        .expect("the shipped data loads");
    assert!(snapshot.ranges > 80_000, "{} ranges", snapshot.ranges);
    assert!(
        snapshot
            .sources()
            .iter()
            .any(|s| s.file == "ranges/datacenter/aws-ip-ranges.json.gz" && s.entries > 10_000)
    );
    assert_eq!(verdict(&snapshot, "3.5.140.1").classes, vec!["datacenter"]);
    assert_eq!(verdict(&snapshot, "204.8.96.141").classes, vec!["tor"]);
    assert_eq!(verdict(&snapshot, "144.31.222.106").classes, vec!["proxy"]);
    assert!(verdict(&snapshot, "192.0.2.1").classes.is_empty());
    // iCloud Private Relay egress is left out of the shipped VPN list (see data/SOURCES.md).
    assert!(
        !verdict(&snapshot, "104.28.28.1")
            .classes
            .contains(&"vpn".to_owned())
    );
}
