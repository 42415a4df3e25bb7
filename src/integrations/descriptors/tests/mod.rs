//! envoyproxy/ratelimit's config test cases (`test/config/config_test.go`), ported: the
//! same files (`tests/fixtures/envoy-ratelimit/`), the same requests, the same limits,
//! metric keys and error messages.

use super::*;

/// A request descriptor's entries.
type Request<'a> = &'a [(&'a str, &'a str)];
/// Per entry, the shared wildcard expected.
type Patterns<'a> = &'a [Option<&'a str>];

fn fixture(name: &str) -> File {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy-ratelimit")
        .join(name);
    let content = std::fs::read_to_string(&path).expect("fixture exists");
    parse(name, &content).expect("fixture parses")
}

fn load_file(name: &str) -> Rules {
    Rules::build(&[fixture(name)], false).expect("fixture loads")
}

fn inline(yaml: &str) -> Rules {
    Rules::build(&[parse("inline", yaml).expect("parses")], false).expect("loads")
}

fn error_of(names: &[&str], merge: bool) -> String {
    let mut files = Vec::new();
    for name in names {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/envoy-ratelimit")
            .join(name);
        match parse(
            name,
            &std::fs::read_to_string(path).expect("fixture exists"),
        ) {
            Ok(file) => files.push(file),
            Err(err) => return err.to_string(),
        }
    }
    Rules::build(&files, merge)
        .expect_err("the config is refused")
        .to_string()
}

fn get(rules: &Rules, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
    let entries: Vec<Entry<'_>> = entries
        .iter()
        .map(|&(key, value)| Entry { key, value })
        .collect();
    rules.lookup(domain, &entries, None)
}

fn limit_of(rules: &Rules, entries: &[(&str, &str)]) -> (u32, Option<Unit>, String) {
    let m = get(rules, "test-domain", entries).expect("a limit matches");
    (m.limit.requests_per_unit, m.limit.unit, m.stats_key)
}

#[test]
fn basic_config() {
    let rules = load_file("basic_config.yaml");
    assert!(!rules.is_empty());
    assert!(get(&rules, "foo_domain", &[]).is_none());
    assert!(get(&rules, "test-domain", &[]).is_none());
    for entries in [
        &[("key1", "something")][..],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        &[("key2", "value3")],
    ] {
        assert!(get(&rules, "test-domain", entries).is_none(), "{entries:?}");
    }
    let cases: &[(Request<'_>, u32, Unit, &str)] = &[
        (
            &[("key1", "value1"), ("subkey1", "something")],
            5,
            Unit::Second,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            10,
            Unit::Second,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (
            &[("key2", "something")],
            20,
            Unit::Minute,
            "test-domain.key2",
        ),
        (
            &[("key2", "value2")],
            30,
            Unit::Minute,
            "test-domain.key2_value2",
        ),
        (&[("key3", "foo")], 1, Unit::Hour, "test-domain.key3"),
        (&[("key4", "foo")], 1, Unit::Day, "test-domain.key4"),
        (
            &[("key7", "unspecified_value")],
            70,
            Unit::Minute,
            "test-domain.key7_unspecified_value",
        ),
        (
            &[("key7", "another_value")],
            70,
            Unit::Minute,
            "test-domain.key7_another_value",
        ),
    ];
    for (entries, requests, unit, key) in cases {
        assert_eq!(
            limit_of(&rules, entries),
            (*requests, Some(*unit), (*key).to_owned()),
            "{entries:?}"
        );
    }
    let key3 = get(&rules, "test-domain", &[("key3", "foo")]).expect("key3");
    assert_eq!(key3.limit.name, "", "no name provided in config");
    let key4 = get(&rules, "test-domain", &[("key4", "foo")]).expect("key4");
    assert_eq!(key4.limit.name, "key4_rate_limit");
    let key6 = get(&rules, "test-domain", &[("key6", "foo")]).expect("key6");
    assert!(key6.limit.unlimited);
    assert_eq!(key6.stats_key, "test-domain.key6");
}

#[test]
fn domain_merge() {
    let files = [
        fixture("merge_domain_key1.yaml"),
        fixture("merge_domain_key2.yaml"),
    ];
    let rules = Rules::build(&files, true).expect("merged");
    assert!(get(&rules, "foo_domain", &[]).is_none());
    assert!(get(&rules, "test-domain", &[]).is_none());
    assert_eq!(limit_of(&rules, &[("key1", "value1")]).0, 10);
    assert_eq!(limit_of(&rules, &[("key2", "value2")]).0, 20);
}

#[test]
fn a_request_limit_overrides_the_config() {
    let rules = load_file("basic_config.yaml");
    let entries = [
        Entry {
            key: "key1",
            value: "value1",
        },
        Entry {
            key: "subkey1",
            value: "something",
        },
    ];
    assert!(
        rules
            .lookup("foo_domain", &[], Some((10, Unit::Day)))
            .is_none(),
        "no matching domain"
    );
    let m = rules
        .lookup("test-domain", &entries, Some((10, Unit::Day)))
        .expect("override");
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1_something");
    assert_eq!(
        (
            m.limit.requests_per_unit,
            m.limit.unit,
            m.limit.name.as_str()
        ),
        (10, Some(Unit::Day), "")
    );
    assert!(
        !m.limit.shadow_mode,
        "an override never runs in shadow mode"
    );
    let m = rules
        .lookup("test-domain", &entries, Some((42, Unit::Hour)))
        .expect("override");
    assert_eq!(m.stats_key, "test-domain.key1_value1.subkey1_something");
    assert_eq!(m.limit.requests_per_unit, 42);
    let other = [
        entries[0],
        Entry {
            key: "subkey1",
            value: "something_else",
        },
    ];
    let m = rules
        .lookup("test-domain", &other, Some((42, Unit::Hour)))
        .expect("override");
    assert_eq!(
        m.stats_key,
        "test-domain.key1_value1.subkey1_something_else"
    );
}

#[test]
fn invalid_configs_are_refused_with_upstreams_messages() {
    let cases: &[(&[&str], bool, &str)] = &[
        (
            &["empty_domain.yaml"],
            false,
            "empty_domain.yaml: config file cannot have empty domain",
        ),
        (
            &["basic_config.yaml", "duplicate_domain.yaml"],
            false,
            "duplicate_domain.yaml: duplicate domain 'test-domain' in config file",
        ),
        (
            &["empty_key.yaml"],
            false,
            "empty_key.yaml: descriptor has empty key",
        ),
        (
            &["duplicate_key.yaml"],
            false,
            "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &["merge_domain_key1.yaml", "merge_domain_key1.yaml"],
            true,
            "merge_domain_key1.yaml: duplicate descriptor composite key 'test-domain.key1_value1'",
        ),
        (
            &["bad_limit_unit.yaml"],
            false,
            "bad_limit_unit.yaml: invalid rate limit unit 'foo'",
        ),
        (
            &["replaces_self.yaml"],
            false,
            "replaces_self.yaml: replaces should not contain name of same descriptor",
        ),
        (
            &["replaces_empty.yaml"],
            false,
            "replaces_empty.yaml: should not have an empty replaces entry",
        ),
        (
            &["misspelled_key.yaml"],
            false,
            "misspelled_key.yaml: config error, unknown key 'ratelimit'",
        ),
        (
            &["misspelled_key2.yaml"],
            false,
            "misspelled_key2.yaml: config error, unknown key 'requestsperunit'",
        ),
        (
            &["non_string_key.yaml"],
            false,
            "non_string_key.yaml: config error, key is not of type string: 0.25",
        ),
        (
            &["non_map_list.yaml"],
            false,
            "non_map_list.yaml: config error, yaml file contains list of type other than map: a",
        ),
        (
            &["unlimited_with_unit.yaml"],
            false,
            "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited",
        ),
    ];
    for (files, merge, expected) in cases {
        assert_eq!(error_of(files, *merge), *expected);
    }
    // Upstream's message names its YAML library's reason; ours names serde_yaml's.
    let bad = error_of(&["bad_yaml.yaml"], false);
    assert!(
        bad.starts_with("bad_yaml.yaml: error loading config file: "),
        "{bad}"
    );
}

#[test]
fn shadow_mode() {
    let rules = load_file("shadowmode_config.yaml");
    let cases: &[(Request<'_>, bool, u32, &str)] = &[
        (
            &[("key1", "value1"), ("subkey1", "something")],
            false,
            5,
            "test-domain.key1_value1.subkey1",
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            true,
            10,
            "test-domain.key1_value1.subkey1_subvalue1",
        ),
        (&[("key2", "something")], true, 20, "test-domain.key2"),
        (&[("key2", "value2")], false, 30, "test-domain.key2_value2"),
    ];
    for (entries, shadow, requests, key) in cases {
        let m = get(&rules, "test-domain", entries).expect("matches");
        assert_eq!(m.limit.shadow_mode, *shadow, "{entries:?}");
        assert_eq!(m.limit.requests_per_unit, *requests);
        assert_eq!(m.stats_key, *key);
    }
}

#[test]
fn wildcards() {
    let rules = load_file("wildcard.yaml");
    let one = get(&rules, "test-domain", &[("noVal", "foo1")]).expect("noVal");
    let two = get(&rules, "test-domain", &[("noVal", "foo2")]).expect("noVal");
    assert_eq!(one, two);
    assert_eq!(one.stats_key, "test-domain.noVal");
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("wild", "foo1")], "test-domain.wild_foo*"),
        (&[("wild", "foo2")], "test-domain.wild_foo*"),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")],
            "test-domain.nestedWild_val1.wild_goo*",
        ),
        (&[("midWild", "barab")], "test-domain.midWild_bar*b"),
        (&[("midWild", "bar123b")], "test-domain.midWild_bar*b"),
        (&[("midWild", "barb")], "test-domain.midWild_bar*b"),
        (
            &[("multiWild", "foo123bar456baz")],
            "test-domain.multiWild_foo*bar*baz",
        ),
        (
            &[("multiWild", "foobarbaz")],
            "test-domain.multiWild_foo*bar*baz",
        ),
    ];
    for (entries, key) in cases {
        let m = get(&rules, "test-domain", entries).expect("matches");
        assert_eq!(m.stats_key, *key, "{entries:?}");
        assert_eq!(
            m.stats_key, m.limit.full_key,
            "FullKey matches the stats key"
        );
    }
    for entries in [
        &[("wild", "bar")][..],
        &[("noWild", "foo1")],
        &[("midWild", "bara")],
        &[("midWild", "xbarb")],
        &[("multiWild", "foo123baz")],
        &[("multiWild", "bar456baz")],
    ] {
        assert!(get(&rules, "test-domain", entries).is_none(), "{entries:?}");
    }
}

#[test]
fn counters_are_per_value_unless_a_wildcard_is_shared() {
    let rules = load_file("share_threshold.yaml");
    let entries = |value| {
        [Entry {
            key: "files",
            value,
        }]
    };
    let a = entries("files/a.pdf");
    let b = entries("files/b.csv");
    let key_a = get(&rules, "test-domain", &[("files", "files/a.pdf")])
        .expect("matches")
        .counter_key("test-domain", &a);
    let key_b = get(&rules, "test-domain", &[("files", "files/b.csv")])
        .expect("matches")
        .counter_key("test-domain", &b);
    assert_eq!(key_a, "test-domain_files_files/*_");
    assert_eq!(key_a, key_b, "one shared counter");
    let basic = load_file("basic_config.yaml");
    let one = [Entry {
        key: "key2",
        value: "a",
    }];
    let two = [Entry {
        key: "key2",
        value: "b",
    }];
    let m = get(&basic, "test-domain", &[("key2", "a")]).expect("matches");
    assert_ne!(
        m.counter_key("test-domain", &one),
        m.counter_key("test-domain", &two),
        "a key-only rule counts each value apart (a per-IP limit)"
    );
}

#[test]
fn palisade_multiplier_extension() {
    let rules = inline(
        "domain: d
descriptors:
  - key: remote_address
    multiplier: ip
    rate_limit: {requests_per_unit: 10, unit: second}
",
    );
    let m = get(&rules, "d", &[("remote_address", "10.0.0.1")]).expect("matches");
    assert_eq!(m.limit.multiplier, Some(MultiplierSource::Ip));
    let err = Rules::build(
        &[parse(
            "x.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    multiplier: planet\n",
        )
        .expect("parses")],
        false,
    )
    .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "x.yaml: invalid multiplier 'planet' (ip, user or device)"
    );
}

#[test]
fn numbers_and_booleans_are_read_as_upstream_reads_them() {
    let rules = inline(
        "domain: d
descriptors:
  - key: code
    value: 429
    rate_limit: {requests_per_unit: 3, unit: MINUTE}
",
    );
    assert_eq!(
        limit_of_domain(&rules, "d", &[("code", "429")]),
        (3, Some(Unit::Minute))
    );
    let refused = parse(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1.5, unit: second}\n",
    )
    .expect_err("a float is refused");
    assert_eq!(refused.to_string(), "f.yaml: error checking config");
    let negative = Rules::build(
        &[parse(
            "n.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: -1, unit: second}\n",
        )
        .expect("parses")],
        false,
    )
    .expect_err("refused");
    assert!(
        negative.to_string().contains("requests_per_unit -1"),
        "{negative}"
    );
}

fn limit_of_domain(rules: &Rules, domain: &str, entries: &[(&str, &str)]) -> (u32, Option<Unit>) {
    let m = get(rules, domain, entries).expect("matches");
    (m.limit.requests_per_unit, m.limit.unit)
}

#[test]
fn files_and_folders_load_and_a_bad_edit_keeps_the_rules() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1, unit: second}\n",
    )
    .expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a config").expect("write");
    std::fs::write(dir.path().join(".hidden.yaml"), "domain: [").expect("write");
    let live = watch::LiveRules::load(vec![dir.path().to_path_buf()], false).expect("loads");
    assert_eq!(live.current().domains().collect::<Vec<_>>(), ["a"]);
    assert!(!live.reload_if_changed().expect("no change"));
    std::fs::write(
        dir.path().join("b.yml"),
        "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 2, unit: minute}\n",
    )
    .expect("write");
    assert!(live.reload_if_changed().expect("reloads"));
    let mut domains: Vec<String> = live.current().domains().map(str::to_owned).collect();
    domains.sort();
    assert_eq!(domains, ["a", "b"]);
    std::fs::write(
        dir.path().join("b.yml"),
        "domain: b\ndescriptors:\n  - value: x\n",
    )
    .expect("write");
    let err = live.reload_if_changed().expect_err("a bad edit is refused");
    assert!(
        err.to_string().ends_with("b.yml: descriptor has empty key"),
        "{err}"
    );
    assert_eq!(
        live.current().domains().count(),
        2,
        "the rules in force stay"
    );
}

mod metrics; // metric keys: detailed, per value, the share threshold
