//! envoyproxy/ratelimit config files served as they are: upstream's example config
//! (`tests/fixtures/envoy-ratelimit/example.yaml`) over Envoy's gRPC API, on both backends.

use palisade::api::envoy::proto::{
    Code, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, RateLimitResponse, Unit,
};

use crate::gateways::{Envoy, descriptor, header};
use crate::helpers::{ADMIN_TOKEN, TestApp, metric_value, repo_file};
use crate::on_both_backends;

on_both_backends!(
    upstreams_example_config_limits_as_upstream_does,
    replaces_unlimited_shadow_and_quota_mode_answer_as_upstream,
    rules_run_beside_palisades_own_check,
    a_changed_config_is_picked_up_and_a_bad_one_keeps_the_rules,
    the_documented_envoy_config_works_with_palisade,
);

async fn with_rules(app: TestApp, paths: Vec<std::path::PathBuf>) -> TestApp {
    TestApp::spawn_with(app.backend, move |s| {
        s.envoy.ratelimit_config = paths;
    })
    .await
    .expect("the backend exists")
}

async fn example(app: TestApp) -> TestApp {
    with_rules(
        app,
        vec![repo_file("tests/fixtures/envoy-ratelimit/example.yaml")],
    )
    .await
}

fn rl(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "rl".to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(envoy: &mut Envoy, entries: &[&[(&str, &str)]]) -> RateLimitResponse {
    envoy
        .call(
            Some(ADMIN_TOKEN),
            rl(entries.iter().map(|e| descriptor(e)).collect()),
        )
        .await
        .expect("answered")
}

fn codes(response: &RateLimitResponse) -> (i32, Vec<i32>) {
    (
        response.overall_code,
        response.statuses.iter().map(|s| s.code).collect(),
    )
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

async fn upstreams_example_config_limits_as_upstream_does(app: TestApp) {
    let app = example(app).await;
    let mut envoy = Envoy::start(&app).await;
    // `foo` (any value): 2 a minute, counted per value; no client IP is needed.
    for n in 1..=2u32 {
        let answer = ask(&mut envoy, &[&[("foo", "pelican")]]).await;
        assert_eq!(codes(&answer), (OK, vec![OK]), "request {n}");
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().expect("the rule's limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (2, Unit::Minute as i32)
        );
        assert_eq!(status.limit_remaining, 2 - n);
        assert!(status.duration_until_reset.is_some());
    }
    let third = ask(&mut envoy, &[&[("foo", "pelican")]]).await;
    assert_eq!(codes(&third), (OVER, vec![OVER]));
    assert_eq!(third.statuses[0].limit_remaining, 0);
    assert_eq!(header(&third, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(header(&third, "x-ratelimit-limit"), Some("2"));
    let other_value = ask(&mut envoy, &[&[("foo", "heron")]]).await;
    assert_eq!(
        codes(&other_value),
        (OK, vec![OK]),
        "another value has its own counter"
    );
    // The most specific rule wins: foo → bar_bkthomps (named, 1 a minute).
    let named = ask(&mut envoy, &[&[("foo", "x"), ("bar", "bkthomps")]]).await;
    assert_eq!(codes(&named), (OK, vec![OK]));
    let limit = named.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, limit.name.as_str()),
        (1, "bkthomps")
    );
    let named = ask(&mut envoy, &[&[("foo", "x"), ("bar", "bkthomps")]]).await;
    assert_eq!(codes(&named), (OVER, vec![OVER]));
    // foo → bar (any other value): 3 a minute.
    let bar = ask(&mut envoy, &[&[("foo", "x"), ("bar", "other")]]).await;
    assert_eq!(
        bar.statuses[0]
            .current_limit
            .as_ref()
            .expect("limit")
            .requests_per_unit,
        3
    );
    // 0 requests per unit: always over.
    let banned = ask(&mut envoy, &[&[("foo", "x"), ("bar", "banned")]]).await;
    assert_eq!(codes(&banned), (OVER, vec![OVER]));
    // A descriptor deeper than any rule, or naming no rule, is not limited.
    let unmatched = ask(
        &mut envoy,
        &[
            &[("nothing", "here")],
            &[("foo", "x"), ("bar", "y"), ("z", "1")],
        ],
    )
    .await;
    assert_eq!(codes(&unmatched), (OK, vec![OK, OK]));
    assert!(unmatched.statuses.iter().all(|s| s.current_limit.is_none()));
    // The route's own limit overrides the config (counted per descriptor values).
    let mut overridden = descriptor(&[("unspec", "route-override")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour as i32,
    });
    let call = |d: RateLimitDescriptor| rl(vec![d]);
    let first = envoy
        .call(Some(ADMIN_TOKEN), call(overridden.clone()))
        .await
        .unwrap();
    assert_eq!(codes(&first), (OK, vec![OK]));
    let limit = first.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    let second = envoy
        .call(Some(ADMIN_TOKEN), call(overridden))
        .await
        .unwrap();
    assert_eq!(codes(&second), (OVER, vec![OVER]));
    // hits_addend counts several hits at once.
    let mut heavy = descriptor(&[("unspec", "bulk")]);
    heavy.hits_addend = Some(2);
    let bulk = envoy.call(Some(ADMIN_TOKEN), call(heavy)).await.unwrap();
    assert_eq!(
        (bulk.overall_code, bulk.statuses[0].limit_remaining),
        (OK, 0)
    );
    // The rule's hits are in the metrics, by its upstream stats key (the registry is the
    // process's: other tests may add to it).
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    let count = |series: &str| metric_value(&metrics, series);
    assert!(
        count(r#"palisade_envoy_rule_hits_total{domain="rl",rule="rl.foo",outcome="over_limit"}"#)
            >= 1.0
    );
    assert!(
        count(
            r#"palisade_envoy_rule_hits_total{domain="rl",rule="rl.unspec_bulk",outcome="within_limit"}"#
        ) >= 1.0
    );
    // Every call is counted by its outcome and timed.
    assert!(count(r#"palisade_grpc_requests_total{outcome="ok"}"#) >= 1.0);
    assert!(count(r#"palisade_grpc_requests_total{outcome="over_limit"}"#) >= 1.0);
    assert!(count("palisade_grpc_request_duration_seconds_count") >= 3.0);
    // An unknown domain with no client IP is still an error (nothing to check).
    let mut unknown = rl(vec![descriptor(&[("foo", "x")])]);
    unknown.domain = "not-configured".to_owned();
    let err = envoy
        .call(Some(ADMIN_TOKEN), unknown)
        .await
        .expect_err("no IP");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // A token is still required.
    let err = envoy
        .call(None, rl(vec![descriptor(&[("foo", "x")])]))
        .await
        .expect_err("no token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

async fn replaces_unlimited_shadow_and_quota_mode_answer_as_upstream(app: TestApp) {
    let app = example(app).await;
    let mut envoy = Envoy::start(&app).await;
    // destination bkthomps (2 a minute) replaces the limit named bkthomps (1 a minute).
    let both: &[&[(&str, &str)]] = &[
        &[
            ("source_cluster", "proxy"),
            ("destination_cluster", "bkthomps"),
        ],
        &[("foo", "x"), ("bar", "bkthomps")],
    ];
    for n in 1..=2 {
        let answer = ask(&mut envoy, both).await;
        assert_eq!(
            codes(&answer),
            (OK, vec![OK, OK]),
            "request {n}: {answer:?}"
        );
        assert!(
            answer.statuses[1].current_limit.is_none(),
            "the replaced limit is not checked"
        );
    }
    let third = ask(&mut envoy, both).await;
    assert_eq!(codes(&third), (OVER, vec![OVER, OK]));
    // category account (4 a minute) replaces bkthomps and fake_name.
    let replacing = ask(
        &mut envoy,
        &[
            &[("category", "account")],
            &[("source_cluster", "proxy"), ("destination_cluster", "fake")],
        ],
    )
    .await;
    assert!(replacing.statuses[1].current_limit.is_none());
    // Unlimited: never limited, remaining u32::MAX.
    for _ in 0..5 {
        let answer = ask(
            &mut envoy,
            &[&[("foo", "x"), ("bay", "any")], &[("qux", "q")]],
        )
        .await;
        assert_eq!(codes(&answer), (OK, vec![OK, OK]));
        assert!(
            answer
                .statuses
                .iter()
                .all(|s| s.limit_remaining == u32::MAX)
        );
    }
    // Shadow mode: over the limit is reported as OK.
    for n in 1..=5u32 {
        let answer = ask(&mut envoy, &[&[("foo", "x"), ("baz", "shady")]]).await;
        assert_eq!(codes(&answer), (OK, vec![OK]), "request {n}");
        assert_eq!(answer.statuses[0].limit_remaining, 3u32.saturating_sub(n));
    }
    // Quota mode: over only when every quota-mode descriptor is over.
    let quota: &[&[(&str, &str)]] = &[&[("service", "service_1")], &[("service", "service_2")]];
    assert_eq!(codes(&ask(&mut envoy, quota).await), (OK, vec![OK, OK]));
    assert_eq!(codes(&ask(&mut envoy, quota).await), (OK, vec![OVER, OK]));
    assert_eq!(
        codes(&ask(&mut envoy, quota).await),
        (OVER, vec![OVER, OVER])
    );
}

async fn rules_run_beside_palisades_own_check(app: TestApp) {
    let app = example(app).await;
    let mut envoy = Envoy::start(&app).await;
    // A login: Palisade's own budgets answer the remote_address and user descriptors, the
    // rule answers `foo`.
    let login = |user: &str| {
        rl(vec![
            descriptor(&[("remote_address", "203.0.113.77")]),
            descriptor(&[("user_id", user)]),
            descriptor(&[("path", "/auth/login"), ("method", "POST")]),
            descriptor(&[("foo", "login")]),
        ])
    };
    let first = envoy.call(Some(ADMIN_TOKEN), login("carol")).await.unwrap();
    assert_eq!(first.overall_code, OK);
    let user = first.statuses[1]
        .current_limit
        .as_ref()
        .expect("Palisade's user budget");
    assert_eq!(
        (user.requests_per_unit, user.unit),
        (5, Unit::Minute as i32)
    );
    assert_eq!(
        first.statuses[3]
            .current_limit
            .as_ref()
            .expect("rule")
            .requests_per_unit,
        2
    );
    assert_eq!(first.statuses[3].limit_remaining, 1);
    // The rule is the tighter: the headers name it.
    assert_eq!(header(&first, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    envoy.call(Some(ADMIN_TOKEN), login("carol")).await.unwrap();
    let third = envoy.call(Some(ADMIN_TOKEN), login("carol")).await.unwrap();
    assert_eq!(
        codes(&third),
        (OVER, vec![OK, OK, OK, OVER]),
        "the rule refuses what Palisade allows"
    );
    // Palisade's own budget refuses: the rule's tokens are not spent. Five logins of dave
    // spend his budget (the rule for `foo=dave` allows 2, so it is asked with another value
    // each time); the sixth is refused by Palisade and leaves `foo=spare` untouched.
    for n in 0..5 {
        let mut request = login("dave");
        request.descriptors[3] = descriptor(&[("foo", &format!("v{n}"))]);
        let answer = envoy.call(Some(ADMIN_TOKEN), request).await.unwrap();
        assert_eq!(answer.overall_code, OK, "login {n}");
    }
    let mut refused = login("dave");
    refused.descriptors[3] = descriptor(&[("foo", "spare")]);
    let answer = envoy.call(Some(ADMIN_TOKEN), refused).await.unwrap();
    assert_eq!(codes(&answer).0, OVER);
    assert_eq!(
        answer.statuses[1].code, OVER,
        "Palisade's user budget refused"
    );
    assert_eq!(
        answer.statuses[3].limit_remaining, 2,
        "nothing taken from the rule"
    );
}

async fn a_changed_config_is_picked_up_and_a_bad_one_keeps_the_rules(app: TestApp) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    let write = |limit: u32| {
        std::fs::write(
            &file,
            format!(
                "domain: rl\ndescriptors:\n  - key: generic_key\n    value: api\n    rate_limit: {{unit: second, requests_per_unit: {limit}}}\n"
            ),
        )
        .unwrap();
    };
    write(5);
    let app = with_rules(app, vec![dir.path().to_path_buf()]).await;
    let mut envoy = Envoy::start(&app).await;
    let limit_of = |r: &RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    let answer = ask(&mut envoy, &[&[("generic_key", "api")]]).await;
    assert_eq!(limit_of(&answer), Some(5));
    let live = app.app.envoy_rules.as_ref().expect("rules loaded");
    // Same size, new content: the modification time tells (set it, as a coarse clock may not).
    write(7);
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(later)
        .unwrap();
    assert!(
        live.reload_if_changed().expect("valid"),
        "the change is seen"
    );
    let answer = ask(&mut envoy, &[&[("generic_key", "api")]]).await;
    assert_eq!(limit_of(&answer), Some(7));
    std::fs::write(
        &file,
        "domain: rl\ndescriptors:\n  - key: generic_key\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    let err = live.reload_if_changed().expect_err("refused");
    assert!(
        err.to_string()
            .ends_with("invalid rate limit unit 'fortnight'"),
        "{err}"
    );
    let answer = ask(&mut envoy, &[&[("generic_key", "api")]]).await;
    assert_eq!(limit_of(&answer), Some(7), "the rules in force stay");
    // A bad file at start-up stops the start with the file and the reason.
    let scratch = tempfile::tempdir().unwrap();
    let mut settings = crate::helpers::test_settings(app.backend, &scratch)
        .await
        .expect("the backend exists");
    settings.envoy.ratelimit_config = vec![dir.path().to_path_buf()];
    let message = match palisade::App::build(settings).await {
        Err(err) => err.to_string(),
        Ok(_) => panic!("a bad config must stop the start"),
    };
    assert!(
        message.contains("invalid rate limit unit 'fortnight'"),
        "{message}"
    );
}

/// grpcio, or None (a loud skip locally; a failure in CI).
fn grpcio() -> bool {
    let present = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_reflection"])
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true but grpcio is missing (.ci/run installs grpcio and grpcio-reflection)"
        );
        eprintln!("SKIPPED (no grpcio): pip install grpcio grpcio-reflection");
    }
    present
}

/// A client that knows nothing of Envoy's protos learns them by server reflection and
/// makes a real call (grpcio, `tests/grpc/reflect.py`), as grpcurl does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reflection_lets_a_generic_client_call_the_service() {
    if !grpcio() {
        return;
    }
    let app = TestApp::spawn(crate::helpers::Backend::Embedded)
        .await
        .unwrap();
    let envoy = Envoy::start(&app).await;
    let address = envoy.address.to_string();
    let script = repo_file("tests/grpc/reflect.py");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .args([address.as_str(), ADMIN_TOKEN])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let services: Vec<&str> = result["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s.as_str())
        .collect();
    for service in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(services.contains(&service), "{services:?}");
    }
    let answer = &result["answer"];
    assert_eq!(answer["overallCode"], "OK", "{answer}");
    assert_eq!(
        answer["statuses"][0]["currentLimit"]["unit"], "MINUTE",
        "the per-IP login budget: {answer}"
    );
    assert!(
        answer["responseHeadersToAdd"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    );
    assert_eq!(result["health"]["status"], "SERVING");
    // What reflection serves is the whole compiled set: every file, field for field, Envoy's
    // comments included, and nothing else.
    let compiled = <prost_types::FileDescriptorSet as prost::Message>::decode(
        palisade::api::envoy::proto::FILE_DESCRIPTOR_SET,
    )
    .unwrap();
    let served = result["files"].as_object().expect("files");
    let mut compiled_names: Vec<&str> = compiled.file.iter().map(|f| f.name()).collect();
    let mut served_names: Vec<&str> = served.keys().map(String::as_str).collect();
    compiled_names.sort_unstable();
    served_names.sort_unstable();
    assert_eq!(served_names, compiled_names);
    assert!(compiled_names.contains(&"envoy/service/ratelimit/v3/rls.proto"));
    assert!(compiled_names.contains(&"validate/validate.proto"));
    for file in &compiled.file {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(served[file.name()].as_str().unwrap())
            .unwrap();
        let served =
            <prost_types::FileDescriptorProto as prost::Message>::decode(&raw[..]).unwrap();
        assert_eq!(&served, file, "{} as served", file.name());
        // Google's well-known types come with protox, without their comments.
        assert!(
            file.source_code_info.is_some() || file.name().starts_with("google/protobuf/"),
            "{} carries its comments",
            file.name()
        );
    }
    // The call is timed.
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("palisade_grpc_request_duration_seconds_count")),
        "{metrics}"
    );
}

/// The descriptors Envoy's `rate_limits` actions make for a request (remote_address,
/// request_headers, generic_key); a descriptor with an absent header is not sent.
fn envoy_descriptors(
    rate_limits: &serde_yaml_ng::Value,
    ip: &str,
    headers: &[(&str, &str)],
) -> Vec<RateLimitDescriptor> {
    let mut out = Vec::new();
    'limits: for limit in rate_limits.as_sequence().unwrap() {
        let mut entries: Vec<(String, String)> = Vec::new();
        for action in limit["actions"].as_sequence().unwrap() {
            let (kind, spec) = action.as_mapping().unwrap().iter().next().unwrap();
            match kind.as_str().unwrap() {
                "remote_address" => entries.push(("remote_address".into(), ip.into())),
                "generic_key" => entries.push((
                    spec["descriptor_key"]
                        .as_str()
                        .unwrap_or("generic_key")
                        .into(),
                    spec["descriptor_value"].as_str().unwrap().into(),
                )),
                "request_headers" => {
                    let name = spec["header_name"].as_str().unwrap();
                    let Some((_, value)) = headers.iter().find(|(h, _)| *h == name) else {
                        continue 'limits;
                    };
                    entries.push((
                        spec["descriptor_key"].as_str().unwrap().into(),
                        (*value).into(),
                    ));
                }
                other => panic!("action {other} is not modelled here"),
            }
        }
        let pairs: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        out.push(descriptor(&pairs));
    }
    out
}

async fn the_documented_envoy_config_works_with_palisade(app: TestApp) {
    let envoy_config: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_file("docs/gateways/envoy.yaml")).unwrap(),
    )
    .unwrap();
    let listener = &envoy_config["static_resources"]["listeners"][0];
    let manager = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let filter = manager["http_filters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the rate limit filter");
    let domain = filter["typed_config"]["domain"].as_str().unwrap();
    let service = &filter["typed_config"]["rate_limit_service"];
    assert_eq!(service["transport_api_version"], "V3");
    let cluster_name = service["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap();
    let cluster = envoy_config["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the cluster the filter names");
    let options = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    assert!(
        !options["explicit_http_config"]["http2_protocol_options"].is_null(),
        "gRPC needs HTTP/2"
    );
    let port = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"]["port_value"]
        .as_u64()
        .unwrap();
    let default_grpc = palisade::Settings::default().grpc_listen;
    assert!(
        default_grpc.ends_with(&format!(":{port}")),
        "{default_grpc} vs {port}"
    );
    assert_eq!(
        cluster["health_checks"][0]["grpc_health_check"]["service_name"],
        "envoy.service.ratelimit.v3.RateLimitService"
    );
    let rate_limits =
        &manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["rate_limits"];

    let app = with_rules(app, vec![repo_file("docs/gateways/ratelimit/config.yaml")]).await;
    let mut client = Envoy::start(&app).await;
    let login = envoy_descriptors(
        rate_limits,
        "203.0.113.90",
        &[
            ("x-user-id", "erin"),
            (":path", "/auth/login"),
            (":method", "POST"),
        ],
    );
    assert_eq!(
        login.len(),
        4,
        "no x-device-id header: no device descriptor"
    );
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: login,
        hits_addend: 0,
    };
    let answer = client
        .call(Some(ADMIN_TOKEN), request.clone())
        .await
        .expect("answered");
    assert_eq!(answer.overall_code, OK, "{answer:?}");
    // Palisade's user budget answers the user descriptor, the rule the last one.
    let user = answer.statuses[1]
        .current_limit
        .as_ref()
        .expect("user budget");
    assert_eq!(
        (user.requests_per_unit, user.unit),
        (5, Unit::Minute as i32)
    );
    let rule = answer.statuses[3]
        .current_limit
        .as_ref()
        .expect("the config's rule");
    assert_eq!(
        (rule.requests_per_unit, rule.name.as_str()),
        (100, "api_per_ip")
    );
    assert_eq!(answer.statuses[3].limit_remaining, 99);
}

/// Envoy reads identity into descriptors from request headers: in the documented config,
/// every header a rate limit action reads (other than pseudo-headers) is removed from the
/// client's request by a header mutation placed before the rate limit filter, so only what
/// the gateway's own authentication sets afterwards reaches Palisade.
#[test]
fn the_documented_envoy_config_removes_client_identity_headers_first() {
    let config: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(repo_file("docs/gateways/envoy.yaml")).unwrap(),
    )
    .unwrap();
    let manager = &config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let filters = manager["http_filters"].as_sequence().unwrap();
    let ratelimit = filters
        .iter()
        .position(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the rate limit filter");
    let removed: Vec<String> = filters[..ratelimit]
        .iter()
        .filter(|f| f["name"] == "envoy.filters.http.header_mutation")
        .flat_map(|f| {
            f["typed_config"]["mutations"]["request_mutations"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|m| m["remove"].as_str().map(str::to_ascii_lowercase))
        .collect();
    let rate_limits =
        &manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["rate_limits"];
    let mut read = Vec::new();
    for limit in rate_limits.as_sequence().unwrap() {
        for action in limit["actions"].as_sequence().unwrap() {
            if let Some(name) = action["request_headers"]["header_name"].as_str()
                && !name.starts_with(':')
            {
                read.push(name.to_ascii_lowercase());
            }
        }
    }
    assert!(!read.is_empty(), "the config reads identity headers");
    let defaults = palisade::config::ForwardAuthSettings::default();
    for name in read.iter().map(String::as_str).chain([
        defaults.tenant_header.as_str(),
        palisade::access::identity::HEADER,
    ]) {
        assert!(
            removed.iter().any(|r| r == name),
            "envoy.yaml passes the client's own {name} (removed: {removed:?})"
        );
    }
}
