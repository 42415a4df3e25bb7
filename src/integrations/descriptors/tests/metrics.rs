//! Upstream's metric-key cases: `detailed_metric`, `value_to_metric` and `share_threshold`.

use super::*;

const REALISTIC: &str = r#"
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    detailed_metric: true
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 100, unit: minute}
"#;

fn two_level(top_detailed: bool, leaf_detailed: bool) -> String {
    format!(
        "domain: nested
descriptors:
  - key: key-1
    detailed_metric: {top_detailed}
    rate_limit: {{requests_per_unit: 100, unit: minute}}
    descriptors:
      - key: key-2
        detailed_metric: {leaf_detailed}
        rate_limit: {{requests_per_unit: 5, unit: minute}}
"
    )
}

#[test]
fn detailed_metric() {
    let cases: &[(String, Request<'_>, &str)] = &[
        (
            two_level(true, false),
            &[("key-1", "value-1")],
            "nested.key-1_value-1",
        ),
        (
            two_level(false, false),
            &[("key-1", "value-1")],
            "nested.key-1",
        ),
        (
            two_level(true, true),
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1_value-1.key-2_value-2",
        ),
        (
            two_level(false, false),
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1.key-2",
        ),
        (
            REALISTIC.to_owned(),
            &[("key_1", "value-for-key-1")],
            "nested.key_1_value-for-key-1",
        ),
        (
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value")],
            "nested.key_2_key-2-value",
        ),
        (
            REALISTIC.to_owned(),
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            "nested.key_2_key-2-value.key_3_requested-key3-value",
        ),
    ];
    for (yaml, entries, key) in cases {
        let rules = inline(yaml);
        let m = get(&rules, "nested", entries).expect("matches");
        assert_eq!(m.stats_key, *key, "{entries:?}");
    }
}

#[test]
fn value_to_metric() {
    let three = |route: bool, method: bool, leaf_detailed: bool| {
        format!(
            "domain: domain
descriptors:
  - key: route
    value_to_metric: {route}
    descriptors:
      - key: http_method
        value_to_metric: {method}
        descriptors:
          - key: subject_id
            detailed_metric: {leaf_detailed}
            rate_limit: {{requests_per_unit: 60, unit: minute}}
"
        )
    };
    let request = [
        ("route", "draw"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];
    let key = |yaml: String, entries: &[(&str, &str)]| {
        get(&inline(&yaml), "domain", entries)
            .expect("matches")
            .stats_key
    };
    assert_eq!(
        key(three(true, true, false), &request),
        "domain.route_draw.http_method_GET.subject_id"
    );
    assert_eq!(
        key(three(false, true, false), &request),
        "domain.route.http_method_GET.subject_id"
    );
    assert_eq!(
        key(three(false, false, false), &request),
        "domain.route.http_method.subject_id"
    );
    assert_eq!(
        key(three(true, true, true), &request),
        "domain.route_draw.http_method_GET.subject_id_123",
        "detailed_metric wins"
    );
    for (entries, expected) in [
        (
            [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
            "domain.route.http_method_GET.subject_id",
        ),
        (
            [
                ("route", "draw"),
                ("http_method", ""),
                ("subject_id", "123"),
            ],
            "domain.route_draw.http_method.subject_id",
        ),
        (
            [("route", ""), ("http_method", ""), ("subject_id", "123")],
            "domain.route.http_method.subject_id",
        ),
    ] {
        assert_eq!(key(three(true, true, false), &entries), expected);
    }
    let configured = inline(
        "domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
",
    );
    let m = get(
        &configured,
        "test-domain",
        &[
            ("route", "api"),
            ("http_method", "POST"),
            ("subject_id", "user456"),
        ],
    )
    .expect("matches");
    assert_eq!(m.limit.requests_per_unit, 30);
    assert_eq!(
        m.stats_key,
        "test-domain.route_api.http_method_POST.subject_id"
    );
    let wildcard = inline(
        "domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
",
    );
    let m = get(
        &wildcard,
        "domain",
        &[
            ("user", "alice"),
            ("action", "readfile"),
            ("resource", "documents"),
        ],
    )
    .expect("matches");
    assert_eq!(m.stats_key, "domain.user_alice.action_readfile.resource");
}

#[test]
fn share_threshold() {
    let rules = load_file("share_threshold.yaml");
    let cases: &[(Request<'_>, u32, &str, Patterns<'_>)] = &[
        (
            &[("files", "files/a.pdf")],
            100,
            "test-domain.files_files/*",
            &[Some("files/*")],
        ),
        (
            &[("files", "files/b.csv")],
            100,
            "test-domain.files_files/*",
            &[Some("files/*")],
        ),
        (
            &[("route", "api/v1"), ("method", "GET")],
            60,
            "test-domain.route_api/*.method",
            &[Some("api/*"), None],
        ),
        (
            &[("service", "svc/user"), ("endpoint", "get")],
            80,
            "test-domain.service_svc/*.endpoint_get",
            &[Some("svc/*"), None],
        ),
        (
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            200,
            "test-domain.nested_parent.files_nested/*",
            &[None, Some("nested/*")],
        ),
        (
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
            300,
            "test-domain.files_top/*.files_nested/*",
            &[Some("top/*"), Some("nested/*")],
        ),
        (
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
            120,
            "test-domain.path_path/*.file_file/*.type",
            &[Some("path/*"), None, None],
        ),
        (
            &[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ],
            150,
            "test-domain.user_user/*.resource_res/*.action",
            &[Some("user/*"), Some("res/*"), None],
        ),
        (
            &[("file", "test2")],
            100,
            "test-domain.file_test*",
            &[Some("test*")],
        ),
        (
            &[("midpath", "/api/v1")],
            100,
            "test-domain.midpath_/api*v1",
            &[Some("/api*v1")],
        ),
        (
            &[("multiroute", "svcXepYrpc")],
            50,
            "test-domain.multiroute_svc*ep*rpc",
            &[Some("svc*ep*rpc")],
        ),
        (
            &[("midroute", "/api-beta-v2")],
            80,
            "test-domain.midroute_/api*v2",
            &[Some("/api*v2")],
        ),
        (
            &[("tenant", "t1prod"), ("resource", "resAv2")],
            60,
            "test-domain.tenant_t*prod.resource_res*v2",
            &[Some("t*prod"), Some("res*v2")],
        ),
    ];
    for (entries, requests, key, patterns) in cases {
        let m = get(&rules, "test-domain", entries).expect("matches");
        assert_eq!(m.limit.requests_per_unit, *requests, "{entries:?}");
        assert_eq!(m.stats_key, *key, "{entries:?}");
        let shared: Vec<Option<&str>> = m.shared_values.iter().map(Option::as_deref).collect();
        assert_eq!(shared, *patterns, "{entries:?}");
    }
    let explicit = get(&rules, "test-domain", &[("file", "test1")]).expect("explicit");
    assert_eq!(explicit.limit.requests_per_unit, 50);
    assert!(explicit.shared_values.is_empty());
    assert_eq!(explicit.stats_key, "test-domain.file_test1");
    assert!(get(&rules, "test-domain", &[("midpath", "/api/v2")]).is_none());
    assert!(get(&rules, "test-domain", &[("multiroute", "svcABCrpc")]).is_none());
}
