//! The gateways users already run: Envoy's rate limit service (gRPC, driven by a tonic
//! client exactly as Envoy calls it), forward-auth (directly and behind a real nginx), the
//! CrowdSec decisions stream, and the Rust client against a live instance.

use std::time::Duration;

use palisade::api::envoy::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
    Unit,
};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, assert_envelope, metric_value};
use crate::on_both_backends;

on_both_backends!(
    envoy_descriptors_get_the_http_check_decision,
    envoy_calls_need_a_limiter_token_and_an_ip,
    forward_auth_passes_then_blocks_with_headers,
    forward_auth_believes_forwarded_headers_only_from_trusted_proxies,
    crowdsec_stream_follows_the_deny_list,
    with_an_identity_secret_only_signed_identities_name_the_user,
    with_an_identity_secret_only_a_v2_identity_names_the_tenant,
    crowdsec_filters_and_the_live_query_answer_as_lapi_does,
    grpc_health_answers_check_and_watch_for_the_server_and_the_rate_limit_service,
    the_rust_client_makes_the_auth_service_calls,
);

/// A tonic client of the rate limit service of `app`, served on an ephemeral port.
pub(crate) struct Envoy {
    client: RateLimitServiceClient<tonic::transport::Channel>,
    channel: tonic::transport::Channel,
    /// Where it listens.
    pub(crate) address: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Envoy {
    pub(crate) async fn start(app: &TestApp) -> Envoy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let state = app.app.clone();
        tokio::spawn(async move {
            palisade::api::envoy::serve(state, listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("grpc serve");
        });
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .expect("connect to the gRPC service");
        Envoy {
            client: RateLimitServiceClient::new(channel.clone()),
            channel,
            address,
            _stop: stop,
        }
    }

    pub(crate) async fn call(
        &mut self,
        token: Option<&str>,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let mut request = tonic::Request::new(request);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        self.client
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }
}

pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// What Envoy sends for a login with `remote_address`, a `user_id` header action and
/// the path and method.
fn login(ip: &str, user: &str, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            descriptor(&[("remote_address", ip)]),
            descriptor(&[("user_id", user)]),
            descriptor(&[("path", "/auth/login?next=/home"), ("method", "POST")]),
        ],
        hits_addend: hits,
    }
}

pub(crate) fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

async fn envoy_descriptors_get_the_http_check_decision(app: TestApp) {
    let mut envoy = Envoy::start(&app).await;
    // The auth class allows 5 logins a minute per account.
    for n in 1..=5u32 {
        let answer = envoy
            .call(Some(ADMIN_TOKEN), login("203.0.113.5", "alice", 1))
            .await
            .unwrap();
        assert_eq!(answer.overall_code, Code::Ok as i32, "login {n}");
        let user = &answer.statuses[1];
        assert_eq!(user.limit_remaining, 5 - n, "login {n}: {answer:?}");
        let limit = user.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (5, Unit::Minute as i32)
        );
        assert_eq!(
            header(&answer, "x-ratelimit-remaining"),
            Some(&*(5 - n).to_string())
        );
    }
    let answer = envoy
        .call(Some(ADMIN_TOKEN), login("203.0.113.5", "alice", 1))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    assert_eq!(answer.statuses.len(), 3, "one status per descriptor");
    let (ip, user) = (&answer.statuses[0], &answer.statuses[1]);
    assert_eq!(user.code, Code::OverLimit as i32);
    assert_eq!(user.limit_remaining, 0);
    let reset = user.duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds > 0 && reset.seconds <= 60, "{reset:?}");
    // The IP's own buckets still had room: that descriptor is OK.
    assert_eq!(ip.code, Code::Ok as i32, "{answer:?}");
    let retry_after: u64 = header(&answer, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after));
    assert!(header(&answer, "ratelimit-policy").is_some());

    // The same request over HTTP gets the same decision, scope and wait.
    let http = app
        .limit_check(
            &json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.5",
            "user_id": "alice", "consume": false}),
        )
        .await;
    let envelope = assert_envelope(http, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(envelope["error"]["details"]["scope"], "endpoint_user");

    // hits_addend is the cost; a per-descriptor addend overrides it.
    let answer = envoy
        .call(Some(ADMIN_TOKEN), login("203.0.113.6", "bob", 3))
        .await
        .unwrap();
    assert_eq!(answer.statuses[1].limit_remaining, 2);
    let mut request = login("203.0.113.6", "bob", 1);
    request.descriptors[1].hits_addend = Some(2);
    let answer = envoy.call(Some(ADMIN_TOKEN), request).await.unwrap();
    assert_eq!(answer.statuses[1].limit_remaining, 0);
    let answer = envoy
        .call(Some(ADMIN_TOKEN), login("203.0.113.6", "bob", 1))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
}

async fn envoy_calls_need_a_limiter_token_and_an_ip(app: TestApp) {
    let mut envoy = Envoy::start(&app).await;
    let (_, limiter) = app.create_token("limiter", "envoy").await;
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    let status = envoy
        .call(None, login("192.0.2.1", "u", 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = envoy
        .call(Some("not-a-token"), login("192.0.2.1", "u", 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = envoy
        .call(Some(&ingest), login("192.0.2.1", "u", 1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    let answer = envoy
        .call(Some(&limiter), login("192.0.2.1", "u", 1))
        .await
        .unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    // No remote_address entry: a clear error, not a guess.
    let mut request = login("192.0.2.1", "u", 1);
    request.descriptors.remove(0);
    let status = envoy.call(Some(&limiter), request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("remote_address"),
        "{}",
        status.message()
    );
    let status = envoy
        .call(
            Some(&limiter),
            RateLimitRequest {
                domain: "edge".to_owned(),
                descriptors: vec![descriptor(&[("remote_address", "not-an-ip")])],
                hits_addend: 0,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

/// A forward-auth subrequest as a proxy sends it.
pub(crate) async fn forward(
    app: &TestApp,
    token: Option<&str>,
    query: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = app.client.get(app.url(&format!("/v1/forward-auth{query}")));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn forward_auth_passes_then_blocks_with_headers(app: TestApp) {
    let original = [
        ("x-forwarded-method", "POST"),
        ("x-forwarded-uri", "/auth/login?next=%2F"),
        ("x-forwarded-for", "198.51.100.9"),
        ("x-user-id", "carol"),
    ];
    for n in 1..=5 {
        let response = forward(&app, Some(ADMIN_TOKEN), "", &original).await;
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
        assert_eq!(response.headers()["x-ratelimit-limit"], "5");
        assert_eq!(
            response.headers()["x-ratelimit-remaining"],
            (5 - n).to_string().as_str()
        );
    }
    let blocked = forward(&app, Some(ADMIN_TOKEN), "", &original).await;
    assert!(
        blocked.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(blocked.headers()["x-ratelimit-remaining"], "0");
    let envelope = assert_envelope(blocked, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(envelope["error"]["details"]["scope"], "endpoint_user");
    // nginx's auth_request only understands 401/403: the status of a block is chosen.
    let blocked = forward(&app, Some(ADMIN_TOKEN), "?deny_status=403", &original).await;
    assert_eq!(blocked.status(), StatusCode::FORBIDDEN);
    assert!(blocked.headers().contains_key("retry-after"));
    let bad = forward(&app, Some(ADMIN_TOKEN), "?deny_status=500", &original).await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    // Another user on the same IP passes: the block was the account's.
    let other = [
        ("x-forwarded-method", "POST"),
        ("x-original-uri", "/auth/login"),
        ("x-forwarded-for", "198.51.100.9"),
        ("x-user-id", "dave"),
    ];
    assert_eq!(
        forward(&app, Some(ADMIN_TOKEN), "", &other).await.status(),
        StatusCode::OK
    );
    // Passes and blocks are counted (the registry is the process's: other tests add to it).
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    for outcome in ["pass", "block"] {
        let series = format!(r#"palisade_forward_auth_total{{outcome="{outcome}"}}"#);
        let count = metric_value(&metrics, &series);
        assert!(count >= 1.0, "{series} is {count}");
    }
    // Roles, and ?token= only when configured.
    let (_, ingest) = app.create_token("ingest", "auth").await;
    let (_, limiter) = app.create_token("limiter", "edge").await;
    let forbidden = forward(&app, Some(&ingest), "", &other).await;
    assert_envelope(forbidden, StatusCode::FORBIDDEN, "FORBIDDEN").await;
    let missing = forward(&app, None, "", &other).await;
    assert_envelope(missing, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    let by_query = forward(&app, None, &format!("?token={limiter}"), &other).await;
    assert_envelope(by_query, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| s.forward_auth.query_token = true)
        .await
        .unwrap();
    let (_, limiter) = app.create_token("limiter", "edge").await;
    let by_query = forward(&app, None, &format!("?token={limiter}"), &other).await;
    assert_eq!(by_query.status(), StatusCode::OK);
}

async fn forward_auth_believes_forwarded_headers_only_from_trusted_proxies(app: TestApp) {
    // Trusted (the default trusts loopback): each forwarded address has its own budget of
    // 10 unauthenticated logins a minute.
    for n in 0..12 {
        let ip = format!("198.51.100.{n}");
        let headers = [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/auth/login"),
            ("x-forwarded-for", ip.as_str()),
        ];
        assert_eq!(
            forward(&app, Some(ADMIN_TOKEN), "", &headers)
                .await
                .status(),
            StatusCode::OK
        );
    }
    // Untrusted peer: the headers are a client's claim and ignored; all twelve are the peer.
    let backend = app.backend;
    drop(app);
    let app = TestApp::spawn_with(backend, |s| {
        s.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()]
    })
    .await
    .unwrap();
    let mut statuses = Vec::new();
    for n in 0..12 {
        let ip = format!("198.51.100.{n}");
        let headers = [
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/auth/login"),
            ("x-forwarded-for", ip.as_str()),
            ("x-real-ip", ip.as_str()),
        ];
        statuses.push(
            forward(&app, Some(ADMIN_TOKEN), "", &headers)
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(statuses[10..], [429, 429]);
}

async fn add_deny(app: &TestApp, value: &str, reason: &str) -> String {
    let mut entry = json!({"value": value, "reason": reason});
    if !value.contains(['.', ':']) {
        entry["kind"] = json!("account");
    }
    let response = app.post("/v1/lists/deny", Some(ADMIN_TOKEN), &entry).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let body: Value = response.json().await.unwrap();
    body["id"].as_str().unwrap().to_owned()
}

async fn pull(app: &TestApp, key: Option<&str>, query: &str) -> reqwest::Response {
    let mut request = app
        .client
        .get(app.url(&format!("/crowdsec/v1/decisions/stream{query}")));
    if let Some(key) = key {
        request = request.header("X-Api-Key", key);
    }
    request.send().await.unwrap()
}

async fn crowdsec_stream_follows_the_deny_list(app: TestApp) {
    let backend = app.backend;
    drop(app);
    // Exact semantics for the test (the default overlap re-sends the last 2 s).
    let app = TestApp::spawn_with(backend, |s| s.crowdsec.overlap_ms = 0)
        .await
        .unwrap();
    let (_, bouncer) = app.create_token("limiter", "nginx-bouncer").await;
    let single = add_deny(&app, "203.0.113.7", "credential stuffing").await;
    let range = add_deny(&app, "198.51.100.0/24", "abusive hosting range").await;
    add_deny(&app, "mallory", "fraud ring").await; // an account: not a bouncer's business
    // Bouncers send more parameters than startup; they are accepted.
    let response = pull(
        &app,
        Some(&bouncer),
        "?startup=true&scopes=ip,range&origins=",
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let stream: Value = response.json().await.unwrap();
    assert_eq!(stream["deleted"], json!([]));
    let new = stream["new"].as_array().unwrap();
    assert_eq!(new.len(), 2, "{stream}");
    let by_uuid = |uuid: &str| new.iter().find(|d| d["uuid"] == uuid).unwrap().clone();
    let ip = by_uuid(&single);
    assert_eq!(
        (ip["scope"].as_str(), ip["value"].as_str()),
        (Some("Ip"), Some("203.0.113.7"))
    );
    assert_eq!(
        (ip["type"].as_str(), ip["origin"].as_str()),
        (Some("ban"), Some("palisade"))
    );
    assert!(ip["id"].as_i64().unwrap() > 0);
    assert_eq!(
        ip["duration"], "168h0m0s",
        "no expiry: the permanent ban duration"
    );
    assert!(
        ip["scenario"]
            .as_str()
            .unwrap()
            .contains("credential stuffing")
    );
    assert_eq!(by_uuid(&range)["scope"], "Range");
    assert_eq!(by_uuid(&range)["value"], "198.51.100.0/24");

    // Nothing changed: nothing new.
    app.advance(Duration::from_millis(5)).await;
    let stream: Value = pull(&app, Some(&bouncer), "?startup=false")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stream, json!({"new": [], "deleted": []}));
    // A removal is `deleted`, an addition `new`.
    app.advance(Duration::from_millis(5)).await;
    let response = app
        .request(
            Method::DELETE,
            &format!("/v1/lists/deny/{range}?reason=lifted"),
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let later = add_deny(&app, "2001:db8::/48", "v6 abuse").await;
    app.advance(Duration::from_millis(5)).await;
    let stream: Value = pull(&app, Some(&bouncer), "").await.json().await.unwrap();
    assert_eq!(stream["deleted"].as_array().unwrap().len(), 1, "{stream}");
    assert_eq!(stream["deleted"][0]["uuid"], range.as_str());
    assert_eq!(stream["new"].as_array().unwrap().len(), 1, "{stream}");
    assert_eq!(stream["new"][0]["uuid"], later.as_str());
    assert_eq!(stream["new"][0]["scope"], "Range");
    // Each bouncer has its own position: a second one starts from everything.
    let (_, second) = app.create_token("limiter", "firewall-bouncer").await;
    let stream: Value = pull(&app, Some(&second), "?startup=false")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stream["new"].as_array().unwrap().len(), 2, "{stream}");
    // Keys and roles.
    assert_envelope(
        pull(&app, None, "").await,
        StatusCode::UNAUTHORIZED,
        "UNAUTHENTICATED",
    )
    .await;
    let (_, analyst) = app.create_token("analyst", "soc").await;
    assert_envelope(
        pull(&app, Some(&analyst), "").await,
        StatusCode::FORBIDDEN,
        "FORBIDDEN",
    )
    .await;
    let bad = pull(&app, Some(&bouncer), "?startup=maybe").await;
    assert_envelope(bad, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
}

async fn the_rust_client_makes_the_auth_service_calls(app: TestApp) {
    use palisade::client::{AuthEvent, Client, LimitCheck};
    let (_, ingest) = app.create_token("ingest", "auth-svc").await;
    let client = Client::new(&app.base, &ingest).unwrap();
    let failure = |n: u32| AuthEvent {
        event_id: format!("evt-{n}"),
        kind: "login_failure".to_owned(),
        account: "erin@example.com".to_owned(),
        ip: "192.0.2.44".to_owned(),
        device_id: None,
        endpoint: Some("/auth/login".to_owned()),
        ts: None,
        challenge_id: None,
    };
    let events: Vec<AuthEvent> = (0..5).map(failure).collect();
    let accepted = client.post_auth_events(&events).await.unwrap();
    assert_eq!((accepted.accepted, accepted.duplicates), (5, 0));
    assert_eq!(accepted.decisions[0].action, "challenge");
    // A retried batch counts nothing twice.
    let again = client.post_auth_events(&events).await.unwrap();
    assert_eq!((again.accepted, again.duplicates), (0, 5));
    let status = client
        .account_status("erin@example.com", "192.0.2.44", None)
        .await
        .unwrap();
    assert_eq!(
        (status.action.as_str(), status.failures_in_window),
        ("challenge", 5)
    );
    // A 4xx is an error with the envelope's code, not retried.
    let err = client
        .account_status("erin@example.com", "not-an-ip", None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, palisade::client::ClientError::Api { status: 400, .. }),
        "{err}"
    );
    // Limit checks: a 429 is an answer with the exact wait.
    let (_, limiter) = app.create_token("limiter", "gw").await;
    let gateway = Client::new(&app.base, &limiter).unwrap();
    let check = LimitCheck {
        endpoint: "/auth/login".to_owned(),
        method: Some("POST".to_owned()),
        ip: "192.0.2.45".to_owned(),
        user_id: Some("frank".to_owned()),
        ..LimitCheck::default()
    };
    for _ in 0..5 {
        assert!(gateway.limit_check(&check).await.unwrap().allowed);
    }
    let denied = gateway.limit_check(&check).await.unwrap();
    assert!(!denied.allowed);
    assert!(
        denied.retry_after_ms > 0 && denied.retry_after_ms <= 12_000,
        "{denied:?}"
    );
    // Nothing listening: a connection error after the retries.
    let nowhere = Client::new("http://127.0.0.1:9", &limiter).unwrap();
    let err = nowhere.limit_check(&check).await.unwrap_err();
    assert!(
        matches!(err, palisade::client::ClientError::Connect(_)),
        "{err}"
    );
}

/// `grpc.health.v1.Health`, as Envoy's health checks, grpcurl and Kubernetes gRPC probes use
/// it: the server and the rate limit service are SERVING, an unknown service is NOT_FOUND,
/// and Watch streams the status.
async fn grpc_health_answers_check_and_watch_for_the_server_and_the_rate_limit_service(
    app: TestApp,
) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let envoy = Envoy::start(&app).await;
    let mut health = HealthClient::new(envoy.channel.clone());
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    let overall = health.check(check("")).await.unwrap().into_inner();
    assert_eq!(overall.status, ServingStatus::Serving as i32);
    let name = "envoy.service.ratelimit.v3.RateLimitService";
    let mut status = None;
    for _ in 0..50 {
        match health.check(check(name)).await {
            Ok(answer) => {
                status = Some(answer.into_inner().status);
                break;
            }
            // Registered by the first readiness probe, within a second.
            Err(err) if err.code() == tonic::Code::NotFound => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(err) => panic!("{err}"),
        }
    }
    assert_eq!(status, Some(ServingStatus::Serving as i32));
    let unknown = health.check(check("no.such.Service")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let mut watch = health.watch(check(name)).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
}

async fn live(app: &TestApp, key: &str, query: &str) -> Value {
    let response = app
        .client
        .get(app.url(&format!("/crowdsec/v1/decisions{query}")))
        .header("X-Api-Key", key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{query}");
    response.json().await.unwrap()
}

/// The filters bouncers send (scopes, origins, scenarios), the live query by address, range,
/// scope and value (`null` when nothing matches), and ids a JavaScript number holds.
async fn crowdsec_filters_and_the_live_query_answer_as_lapi_does(app: TestApp) {
    let (_, bouncer) = app.create_token("limiter", "bouncer").await;
    let single = add_deny(&app, "203.0.113.7", "credential stuffing").await;
    let range = add_deny(&app, "198.51.100.0/24", "abusive hosting range").await;
    let uuids = |stream: &Value| -> Vec<String> {
        let mut found: Vec<String> = stream["new"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["uuid"].as_str().unwrap().to_owned())
            .collect();
        found.sort();
        found
    };
    let stream = |query: &'static str| {
        let (app, bouncer) = (&app, &bouncer);
        async move {
            let response = pull(app, Some(bouncer), query).await;
            assert_eq!(response.status(), StatusCode::OK, "{query}");
            response.json::<Value>().await.unwrap()
        }
    };
    assert_eq!(
        uuids(&stream("?startup=true&scopes=ip").await),
        vec![single.clone()]
    );
    assert_eq!(
        uuids(&stream("?startup=true&scopes=Range").await),
        vec![range.clone()]
    );
    assert!(uuids(&stream("?startup=true&origins=crowdsec,cscli").await).is_empty());
    assert_eq!(
        uuids(&stream("?startup=true&origins=palisade").await).len(),
        2
    );
    assert_eq!(
        uuids(&stream("?startup=true&scenarios_containing=hosting").await),
        vec![range.clone()]
    );
    assert_eq!(
        uuids(&stream("?startup=true&scenarios_not_containing=STUFFING,nothing").await),
        vec![range.clone()]
    );
    // Ids are integers a JavaScript client reads exactly.
    for decision in stream("?startup=true").await["new"].as_array().unwrap() {
        let id = decision["id"].as_u64().unwrap();
        assert!(id > 0 && id < (1 << 53), "{decision}");
    }

    // Live mode: by address (a range holds it), by range, by scope and value.
    let found = live(&app, &bouncer, "?ip=198.51.100.42").await;
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["uuid"], range.as_str());
    assert_eq!(found[0]["scope"], "Range");
    let found = live(&app, &bouncer, "?ip=203.0.113.7").await;
    assert_eq!(found[0]["uuid"], single.as_str());
    assert_eq!(live(&app, &bouncer, "?ip=192.0.2.1").await, Value::Null);
    let found = live(&app, &bouncer, "?range=198.51.100.128/25").await;
    assert_eq!(found[0]["uuid"], range.as_str());
    assert_eq!(
        live(&app, &bouncer, "?range=198.51.0.0/16").await,
        Value::Null
    );
    let found = live(&app, &bouncer, "?scope=ip&value=203.0.113.7").await;
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(
        live(&app, &bouncer, "?scope=range&value=203.0.113.7").await,
        Value::Null
    );
    assert_eq!(
        live(
            &app,
            &bouncer,
            "?ip=198.51.100.42&scenarios_not_containing=hosting"
        )
        .await,
        Value::Null
    );
    // Bad input is a 400 in the envelope; the role is checked.
    let response = app
        .client
        .get(app.url("/crowdsec/v1/decisions?ip=not-an-ip"))
        .header("X-Api-Key", &bouncer)
        .send()
        .await
        .unwrap();
    assert_envelope(response, StatusCode::BAD_REQUEST, "INVALID_ARGUMENT").await;
    let response = app
        .client
        .get(app.url("/crowdsec/v1/decisions?ip=203.0.113.7"))
        .send()
        .await
        .unwrap();
    assert_envelope(response, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED").await;
}

const NEW_SECRET: &str = "new-identity-secret-0123456789abcdef";
const OLD_SECRET: &str = "old-identity-secret-0123456789abcdef";

/// With `forward_auth.identity_secret`, the user and device come only from a valid signed
/// identity (`/v1/limit/check`, forward-auth, Envoy); a plain id, a forged, expired or
/// garbled identity is anonymous; the second secret still verifies (rotation).
async fn with_an_identity_secret_only_signed_identities_name_the_user(app: TestApp) {
    use palisade::access::identity::sign;
    use palisade::config::Secret;
    let app = TestApp::spawn_with(app.backend, |s| {
        s.forward_auth.identity_secret = vec![Secret::new(NEW_SECRET), Secret::new(OLD_SECRET)];
    })
    .await
    .unwrap();
    let now_s = app.app.clock.now_ms() / 1000;
    let (new, old) = (Secret::new(NEW_SECRET), Secret::new(OLD_SECRET));
    let valid = sign(&new, now_s + 60, Some("alice"), Some("phone-1"), None);
    let rotated = sign(&old, now_s + 60, Some("bob"), None, None);
    let expired = sign(&new, now_s - 120, Some("alice"), None, None);
    let forged = sign(
        &Secret::new("not-our-secret-0123456789abcdefgh"),
        now_s + 60,
        Some("alice"),
        None,
        None,
    );
    let check = |identity: Option<&str>, user_id: Option<&str>| {
        let mut body = json!({"endpoint": "/auth/login", "method": "POST", "ip": "203.0.113.40", "consume": false});
        if let Some(identity) = identity {
            body["identity"] = json!(identity);
        }
        if let Some(user) = user_id {
            body["user_id"] = json!(user);
        }
        let app = &app;
        async move {
            let response = app.limit_check(&body).await;
            assert_eq!(response.status(), StatusCode::OK);
            response.json::<Value>().await.unwrap()
        }
    };
    // The user's budget (auth-account, 5) applies only to a signed user.
    assert_eq!(check(Some(&valid), None).await["budget"], "auth-account");
    assert_eq!(check(Some(&rotated), None).await["budget"], "auth-account");
    for (what, identity, user) in [
        ("a plain user_id", None, Some("alice")),
        ("an expired identity", Some(expired.as_str()), Some("alice")),
        ("a forged identity", Some(forged.as_str()), None),
        ("a garbled identity", Some("v1.garbage"), None),
    ] {
        let body = check(identity, user).await;
        assert_eq!(body["budget"], "auth-ip", "{what}: {body}");
    }
    // Forward-auth: the header, never X-User-Id.
    let headers = |identity: Option<&str>| {
        let mut headers = vec![
            ("x-forwarded-method", "POST".to_owned()),
            ("x-forwarded-uri", "/auth/login".to_owned()),
            ("x-user-id", "alice".to_owned()),
        ];
        if let Some(identity) = identity {
            headers.push(("x-palisade-identity", identity.to_owned()));
        }
        headers
    };
    for (identity, limit) in [
        (Some(valid.as_str()), "5"),
        (None, "10"),
        (Some(forged.as_str()), "10"),
    ] {
        let owned = headers(identity);
        let borrowed: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let response = forward(&app, Some(ADMIN_TOKEN), "", &borrowed).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["x-ratelimit-limit"],
            limit,
            "{identity:?}"
        );
    }
    // Envoy: a descriptor entry `identity`; a plain `user_id` entry is ignored.
    let mut envoy = Envoy::start(&app).await;
    let signed = RateLimitRequest {
        domain: "edge".to_owned(),
        descriptors: vec![
            descriptor(&[("remote_address", "203.0.113.41")]),
            descriptor(&[("identity", valid.as_str())]),
            descriptor(&[("path", "/auth/login"), ("method", "POST")]),
        ],
        hits_addend: 1,
    };
    let answer = envoy.call(Some(ADMIN_TOKEN), signed).await.unwrap();
    assert_eq!(header(&answer, "x-ratelimit-limit"), Some("5"));
    let plain = envoy
        .call(Some(ADMIN_TOKEN), login("203.0.113.42", "alice", 1))
        .await
        .unwrap();
    assert_eq!(header(&plain, "x-ratelimit-limit"), Some("10"));
}

/// With `forward_auth.identity_secret`, the tenant comes only from a v2 identity: a plain
/// `tenant` field or `x-tenant-id` header (a client's own claim, if the proxy passes it on)
/// neither spends nor skips a tenant's budget.
async fn with_an_identity_secret_only_a_v2_identity_names_the_tenant(app: TestApp) {
    use palisade::access::identity::sign;
    use palisade::config::Secret;
    let app = TestApp::spawn_with(app.backend, |s| {
        s.forward_auth.identity_secret = vec![Secret::new(NEW_SECRET)];
        s.limits.budgets.push(crate::helpers::partner_budget(3));
    })
    .await
    .unwrap();
    let now_s = app.app.clock.now_ms() / 1000;
    let secret = Secret::new(NEW_SECRET);
    let read = |i: usize, identity: String, tenant: Option<&str>| {
        let mut body = json!({"endpoint": "/api/feed", "ip": format!("192.0.2.{}", 60 + i),
                              "identity": identity});
        if let Some(tenant) = tenant {
            body["tenant"] = json!(tenant);
        }
        body
    };
    // Claimed in the body beside a v1 identity: ignored, however often.
    for i in 0..5 {
        let identity = sign(&secret, now_s + 60, Some(&format!("m{i}")), None, None);
        let response = app.limit_check(&read(i, identity, Some("acme"))).await;
        assert_eq!(response.status(), StatusCode::OK, "claimed tenant {i}");
    }
    // Signed in a v2 identity: acme's 3 requests, then its budget refuses (whatever tenant
    // the body claims).
    for i in 0..3 {
        let identity = sign(
            &secret,
            now_s + 60,
            Some(&format!("s{i}")),
            None,
            Some("acme"),
        );
        let response = app.limit_check(&read(i, identity, Some("globex"))).await;
        assert_eq!(response.status(), StatusCode::OK, "signed tenant {i}");
    }
    let identity = sign(&secret, now_s + 60, Some("s9"), None, Some("acme"));
    let response = app.limit_check(&read(9, identity, None)).await;
    let body = assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    assert_eq!(body["error"]["details"]["reason"], "tenant_rate", "{body}");
    // Forward-auth: x-tenant-id is not believed either.
    let identity = sign(&secret, now_s + 60, Some("h1"), None, None);
    let headers = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/api/feed"),
        ("x-tenant-id", "acme"),
        ("x-palisade-identity", identity.as_str()),
    ];
    let response = forward(&app, Some(ADMIN_TOKEN), "", &headers).await;
    assert_eq!(response.status(), StatusCode::OK);
}
