//! The limiter on Redis: one script call for many requests, key TTLs, SCRIPT FLUSH, instance clocks, Redis down and a cluster.

use super::*;
use crate::helpers::{Listen, OwnRedis, free_port, metric_value};

/// One `token_bucket.lua` call of one request per mode in `modes` (0 check, 1 consume,
/// 2 refund), each of cost 1 on `key` (capacity 2, refilling 1 token/s); per request its
/// reply: admitted, then allowed, limit, remaining, reset_ms, retry_ms, multiplier,
/// multiplier TTL.
async fn bucket_calls(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    modes: &[i64],
) -> Vec<Vec<i64>> {
    let requests: Vec<(i64, f64, f64, String)> = modes
        .iter()
        .map(|&mode| (mode, 2.0, 1.0, "1".to_owned()))
        .collect();
    bucket_call(conn, key, &requests).await
}

/// One `token_bucket.lua` call of one request of cost 1 on `key` per `(mode, capacity,
/// refill per second, enforce flag)`; per request its reply, as [`bucket_calls`].
async fn bucket_call(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    requests: &[(i64, f64, f64, String)],
) -> Vec<Vec<i64>> {
    let multiplier = format!("{key}:m");
    let mut invocation = palisade::store::scripts::TOKEN_BUCKET.prepare_invoke();
    invocation.arg(requests.len());
    for (mode, capacity, refill, flag) in requests {
        invocation.key(key).key(&multiplier);
        invocation.arg(1).arg(*mode).arg(1);
        invocation.arg(*capacity).arg(*refill).arg(flag).arg(1);
    }
    let packed: Vec<u8> = invocation.invoke_async(conn).await.unwrap();
    // Little-endian 8-byte integers.
    let reply: Vec<i64> = packed
        .chunks_exact(8)
        .map(|v| i64::from_le_bytes(v.try_into().unwrap()))
        .collect();
    let answers: Vec<Vec<i64>> = reply.chunks(8).map(<[i64]>::to_vec).collect();
    assert_eq!(answers.len(), requests.len(), "{reply:?}");
    answers
}

/// Several requests in one `token_bucket.lua` call run one after another: a later request
/// sees what an earlier one took from a shared bucket, a denied or `consume: false` request
/// takes nothing, and the bucket is written once with its final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn one_script_call_with_several_requests_runs_them_in_order() {
    let Some((_, redis_url)) = production_urls() else {
        return;
    };
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("test:{{coalesce-{}}}:b", ulid::Ulid::new());
    // 4 requests on one bucket of capacity 2, refilling 1 token/s: take, peek, take, take.
    let requests = bucket_calls(&mut conn, &key, &[1, 0, 1, 1]).await;
    assert_eq!(requests[0][..4], [1, 1, 2, 1], "first take: one left");
    assert_eq!(
        requests[1][..4],
        [1, 1, 2, 0],
        "a peek answers as if it took one"
    );
    assert_eq!(requests[2][..4], [1, 1, 2, 0], "the peek took nothing");
    assert_eq!(requests[3][..3], [0, 0, 2], "the bucket is empty");
    assert!(
        (990..=1000).contains(&requests[3][5]),
        "retry {:?}",
        requests[3]
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (1980..=2000).contains(&ttl),
        "written once, full again in 2 s: {ttl}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// A budget held across regions is spent at this region's share (capacity and refill
/// scaled by it, the share after the enforce flag: `1:0.5`). When the share moves, the bucket
/// keeps the tokens it owes rather than its fraction: a risen share brings its new tokens, a
/// fallen one still owes what was spent (`bucket::evaluate_shared`, the simulator's model).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_shared_budget_keeps_what_it_owes_when_its_share_moves() {
    let Some((_, redis_url)) = production_urls() else {
        return;
    };
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("test:{{share-{}}}:b", ulid::Ulid::new());
    // A budget of 10 refilling 1/s: one call of `takes` consuming requests at `share`.
    async fn at(
        conn: &mut redis::aio::MultiplexedConnection,
        key: &str,
        share: &str,
        takes: usize,
    ) -> Vec<Vec<i64>> {
        let fraction: f64 = share.parse().unwrap();
        let request = (1, 10.0 * fraction, fraction, format!("1:{share}"));
        bucket_call(conn, key, &vec![request; takes]).await
    }
    // Half the budget (5 tokens): 4 taken.
    let taken = at(&mut conn, &key, "0.5", 4).await;
    assert_eq!(taken[3][..4], [1, 1, 5, 1], "{taken:?}");
    let stored: Vec<u8> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored.len(), 16, "the time and the share it was written at");
    // The whole budget: 4 owed of 10, so 5 left after this one (keeping the fraction, 1).
    let risen = at(&mut conn, &key, "1", 1).await;
    assert_eq!(risen[0][..4], [1, 1, 10, 5], "{risen:?}");
    // A fifth (2 tokens) while owing 5: the next token when 4 are repaid at 0.2/s, in 20 s.
    let fallen = at(&mut conn, &key, "0.2", 1).await;
    assert_eq!(fallen[0][..4], [0, 0, 2, 0], "{fallen:?}");
    assert!((19_900..=20_000).contains(&fallen[0][5]), "{fallen:?}");
    // Read without a share (the budget no longer held across regions): as a plain bucket,
    // the time taken as it is.
    let plain = bucket_calls(&mut conn, &key, &[0]).await;
    assert_eq!(plain[0][0], 0, "{plain:?}");
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Mode 2 gives a consumed token back (a cluster's refund when another slot refused the
/// check), never past a full bucket, and nothing to a bucket never taken from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_refund_gives_back_what_was_taken_and_no_more() {
    let Some((_, redis_url)) = production_urls() else {
        return;
    };
    let client = redis::Client::open(redis_url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = format!("test:{{refund-{}}}:b", ulid::Ulid::new());
    // Refund a bucket never used, take, refund twice, take three times.
    let requests = bucket_calls(&mut conn, &key, &[2, 1, 2, 2, 1, 1, 1]).await;
    assert_eq!(
        requests[1][..4],
        [1, 1, 2, 1],
        "a take after the refund of nothing"
    );
    assert_eq!(
        requests[4][..4],
        [1, 1, 2, 1],
        "refunded to full, not past it"
    );
    assert_eq!(requests[5][..4], [1, 1, 2, 0]);
    assert_eq!(requests[6][..3], [0, 0, 2], "two tokens, not three");
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// Field-guide defect: a non-integer PEXPIRE (capacity 100, refill 30/s) errored after the
/// write and left the key without a TTL. Ours writes value and TTL in one `SET … PX`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn redis_bucket_keys_always_get_an_integer_ttl() {
    let Some(app) = TestApp::spawn_with(Backend::Production, |settings| {
        settings.limits.budgets = vec![palisade::config::BudgetSettings {
            name: "odd".to_owned(),
            scope: palisade::config::ScopeKind::Ip,
            classes: vec![],
            limit: 30,
            period_s: 1,
            burst: Some(100),
            when: palisade::config::When::Always,
            shadow: false,
        }];
    })
    .await
    else {
        return;
    };
    assert_eq!(
        app.limit_check(&json!({"endpoint": "/x", "ip": "192.0.2.50"}))
            .await
            .status(),
        StatusCode::OK
    );
    let ip = ClientIp::parse("192.0.2.50", 64).unwrap();
    let key = app.app.stores.keys.bucket(&SubjectKey::ip(&ip), "odd");
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    // One token of 30/s is 33.3 ms of window: the key lives until the bucket is full.
    assert!((1..=34).contains(&ttl), "PTTL {ttl}");
    let size: i64 = redis::cmd("STRLEN")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(size, 8, "one packed double per bucket");
}

/// After `SCRIPT FLUSH` the next check reloads the script (NOSCRIPT → load → retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn script_flush_is_survived() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let body = json!({"endpoint": "/v1/x", "ip": "192.0.2.60"});
    assert_eq!(app.limit_check(&body).await.status(), StatusCode::OK);
    let redis = redis::Client::open(app.settings.redis_url.clone().unwrap()).unwrap();
    let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let response = app.limit_check(&body).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-ratelimit-remaining"], "58");
}

/// A key Redis refused is answered from the L1 cache while it cannot refill (a flood on one
/// key costs no round trip), with the same 429 and `Retry-After`, and every such answer is
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_refused_key_is_answered_from_the_l1_and_counted() {
    let Some(app) = TestApp::spawn_with(Backend::Production, |settings| {
        settings.limits.l1_ttl_ms = 5_000;
    })
    .await
    else {
        return;
    };
    let l1_hits = |metrics: &str| metric_value(metrics, "palisade_limit_l1_hits_total");
    for _ in 0..5 {
        let response = app.limit_check(&login("olga", "192.0.2.65")).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let refused = app.limit_check(&login("olga", "192.0.2.65")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // The registry is the process's: other tests may add to it, never take from it.
    let before = l1_hits(&app.get("/metrics", None).await.text().await.unwrap());
    for _ in 0..3 {
        let response = app.limit_check(&login("olga", "192.0.2.65")).await;
        assert!(
            response.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
                >= 1
        );
        assert_envelope(response, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    }
    let after = l1_hits(&app.get("/metrics", None).await.text().await.unwrap());
    assert!(
        after - before >= 3.0,
        "L1 hits went from {before} to {after}"
    );
}

/// Field-guide defect: the caller's clock drove the bucket, so a caller whose clock lagged
/// burned tokens. Two instances whose clocks disagree by a century share one bucket exactly:
/// time comes from Redis `TIME`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn instance_clocks_do_not_change_redis_buckets() {
    let Some(app) = TestApp::spawn(Backend::Production).await else {
        return;
    };
    let past = app.another_instance_with_wall_clock(0).await;
    let future = app
        .another_instance_with_wall_clock(4_102_444_800_000)
        .await;
    let mut admitted = 0;
    for instance in [&past, &future, &past, &future, &past, &future, &past] {
        if instance
            .limit_check(&login("ivan", "192.0.2.70"))
            .await
            .status()
            == StatusCode::OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
}

/// An instance whose Redis is reached through a proxy the test can break or blackhole, with
/// `timeout_ms` as the store's timeout; None without a production Redis.
async fn app_behind_proxy(timeout_ms: u64) -> Option<(ChaosProxy, TestApp)> {
    let (_, redis_url) = production_urls()?;
    let proxy = ChaosProxy::start(socket_of(&redis_url)).await;
    let proxied = proxy.proxied_url(&redis_url);
    let app = TestApp::spawn_with(Backend::Production, |settings| {
        settings.redis_url = Some(proxied);
        settings.store.redis_timeout_ms = timeout_ms;
    })
    .await
    .expect("a production instance, with production URLs set");
    Some((proxy, app))
}

/// Redis going away mid-run: the auth class fails closed (503), the read class passes with
/// the degraded header, account statuses are 503; when Redis returns, decisions and
/// statuses are normal again within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn redis_down_auth_fails_closed_reads_fail_open_and_recover() {
    let Some((proxy, app)) = app_behind_proxy(100).await else {
        return;
    };
    let read = json!({"endpoint": "/v1/feed", "ip": "192.0.2.80"});
    assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);

    proxy.break_connections();
    for _ in 0..3 {
        let auth = app.limit_check(&login("judy", "192.0.2.80")).await;
        assert_eq!(auth.headers()["x-palisade-degraded"], "redis-unavailable");
        assert!(auth.headers().contains_key("retry-after"));
        assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
        let read_response = app.limit_check(&read).await;
        assert_eq!(read_response.status(), StatusCode::OK);
        assert_eq!(
            read_response.headers()["x-palisade-degraded"],
            "redis-unavailable"
        );
        // The account status (read on its own Redis connection) says so too.
        let status = app
            .get("/v1/accounts/judy/status?ip=192.0.2.80", Some(ADMIN_TOKEN))
            .await;
        assert_envelope(status, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
    }

    proxy.restore();
    let restored = std::time::Instant::now();
    loop {
        let response = app.limit_check(&login("judy", "192.0.2.80")).await;
        let status = app
            .get("/v1/accounts/judy/status?ip=192.0.2.80", Some(ADMIN_TOKEN))
            .await
            .status();
        if response.status() == StatusCode::OK
            && !response.headers().contains_key("x-palisade-degraded")
            && status == StatusCode::OK
        {
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(1),
            "not recovered within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = app.get("/metrics", None).await.text().await.unwrap();
    assert!(
        metrics.contains("palisade_fail_open_total{class=\"read\",outcome=\"fail_open\"}"),
        "{metrics}"
    );
}

/// A Redis that stops answering (its packets dropped, the connection left open): a check
/// waits no longer than the store's timeout, the auth class fails closed and the read class
/// passes degraded; once Redis answers again, so do the checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_redis_that_stops_answering_bounds_every_check_and_is_recovered_from() {
    let Some((proxy, app)) = app_behind_proxy(200).await else {
        return;
    };
    let read = json!({"endpoint": "/v1/feed", "ip": "192.0.2.81"});
    assert_eq!(app.limit_check(&read).await.status(), StatusCode::OK);

    proxy.blackhole();
    let started = std::time::Instant::now();
    let auth = login("mallory", "192.0.2.81");
    let (auth, read_response) = tokio::join!(app.limit_check(&auth), app.limit_check(&read));
    let waited = started.elapsed();
    assert_eq!(auth.headers()["x-palisade-degraded"], "redis-unavailable");
    assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
    assert_eq!(read_response.status(), StatusCode::OK);
    assert_eq!(
        read_response.headers()["x-palisade-degraded"],
        "redis-unavailable"
    );
    assert!(
        waited < Duration::from_millis(1500),
        "checks held {waited:?} by a silent Redis (timeout 200 ms)"
    );

    proxy.restore();
    let restored = std::time::Instant::now();
    loop {
        let response = app.limit_check(&login("mallory", "192.0.2.81")).await;
        if response.status() == StatusCode::OK
            && !response.headers().contains_key("x-palisade-degraded")
        {
            break;
        }
        assert!(
            restored.elapsed() < Duration::from_secs(2),
            "not recovered within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A redis-server of the test's own asking for the password `s3cret-pass`, listening as
/// `listen`, and an instance on it at the URL `url` makes of it.
async fn app_on_own_redis(
    listen: Listen,
    url: impl FnOnce(&OwnRedis) -> String,
) -> (OwnRedis, TestApp) {
    let redis = OwnRedis::start_with(
        free_port(),
        tempfile::tempdir().unwrap(),
        Some("s3cret-pass"),
        listen,
    )
    .await;
    let url = url(&redis);
    let app = TestApp::spawn_with(Backend::Production, |settings| {
        settings.redis_url = Some(url);
    })
    .await
    .unwrap();
    (redis, app)
}

/// A Redis URL's password and database reach every connection, the limit check's own
/// included: the buckets are written in that database; a wrong password is a clear
/// degraded answer, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn the_urls_password_and_database_reach_the_limit_checks() {
    if production_urls().is_none() {
        return;
    }
    let (redis, app) = app_on_own_redis(Listen::Tcp, |redis| {
        format!("redis://:s3cret-pass@127.0.0.1:{}/5", redis.port)
    })
    .await;
    let port = redis.port;
    let response = app.limit_check(&login("peggy", "192.0.2.82")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response.headers().contains_key("x-palisade-degraded"));
    let client = redis::Client::open(format!("redis://:s3cret-pass@127.0.0.1:{port}")).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut sizes = Vec::new();
    for db in [0, 5] {
        let _: () = redis::cmd("SELECT")
            .arg(db)
            .query_async(&mut conn)
            .await
            .unwrap();
        let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        sizes.push(size);
    }
    assert_eq!(sizes[0], 0, "nothing written in database 0");
    assert!(sizes[1] > 0, "the buckets are in database 5");

    let wrong = TestApp::spawn_with(Backend::Production, |settings| {
        settings.redis_url = Some(format!("redis://:wrong@127.0.0.1:{port}/5"));
        settings.store.redis_timeout_ms = 200;
    })
    .await;
    if let Some(wrong) = wrong {
        let auth = wrong.limit_check(&login("peggy", "192.0.2.82")).await;
        assert_eq!(auth.headers()["x-palisade-degraded"], "redis-unavailable");
        assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
    }
}

/// A Redis on a Unix socket (`redis+unix:///PATH?db=N&pass=…`): concurrent checks of one
/// account, coalesced on the socket, drain its bucket exactly, in that database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_redis_on_a_unix_socket_keeps_the_budget() {
    if production_urls().is_none() {
        return;
    }
    let (redis, app) = app_on_own_redis(Listen::TcpAndUnixSocket, |redis| {
        format!(
            "redis+unix://{}?db=4&pass=s3cret-pass",
            redis.socket().display()
        )
    })
    .await;
    let socket = redis.socket();
    forty_checks_of_one_account_drain_it_one_token_at_a_time(&app).await;
    let client = redis::Client::open(format!(
        "redis+unix://{}?db=4&pass=s3cret-pass",
        socket.display()
    ))
    .unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert!(size > 0, "the buckets are in database 4");
}

/// A Redis that takes only TLS (`rediss://`, here with `#insecure` for its self-signed
/// certificate): checks are decided on it, and concurrent checks of one account, coalesced
/// over TLS, drain its bucket exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn a_redis_over_tls_keeps_the_budget() {
    if production_urls().is_none() {
        return;
    }
    let (redis, app) = app_on_own_redis(Listen::Tls, |redis| {
        format!("rediss://:s3cret-pass@127.0.0.1:{}/2#insecure", redis.port)
    })
    .await;
    let port = redis.port;
    let response = app.limit_check(&login("trent", "192.0.2.83")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response.headers().contains_key("x-palisade-degraded"));
    forty_checks_of_one_account_drain_it_one_token_at_a_time(&app).await;

    // Without `#insecure` the self-signed certificate is refused: nothing is decided on a
    // server whose certificate the system's roots do not vouch for.
    let unverified = TestApp::spawn_with(Backend::Production, |settings| {
        settings.redis_url = Some(format!("rediss://:s3cret-pass@127.0.0.1:{port}/2"));
        settings.store.redis_timeout_ms = 500;
    })
    .await
    .unwrap();
    let auth = unverified.limit_check(&login("trent", "192.0.2.84")).await;
    assert_eq!(auth.headers()["x-palisade-degraded"], "redis-unavailable");
    assert_envelope(auth, StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE").await;
}

/// Against a 3-master Redis Cluster: scopes of different subjects live in different slots
/// and are checked per slot; the budget still holds exactly, across two instances, and a
/// multiplier published next to its buckets is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(production_tests),
    ignore = "set PALISADE_TEST_DATABASE_URL and PALISADE_TEST_REDIS_URL"
)]
async fn redis_cluster_keeps_every_budget() {
    let Some((_cluster, app)) = TestApp::on_cluster().await else {
        return;
    };
    assert_eq!(
        app.get("/readyz", None)
            .await
            .json::<Value>()
            .await
            .unwrap()["hot"]["kind"],
        "redis-cluster"
    );
    let second = app.another_instance().await;
    let mut admitted = 0;
    for i in 0..12 {
        let instance = if i % 2 == 0 { &app } else { &second };
        let mut body = login("kate", "203.0.113.90");
        body["device_id"] = json!("phone-1");
        let response = instance.limit_check(&body).await;
        assert!(matches!(
            response.status(),
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS
        ));
        admitted += u32::from(response.status() == StatusCode::OK);
    }
    assert_eq!(
        admitted, 5,
        "auth-account holds 5 across slots and instances"
    );

    let ip = ClientIp::parse("203.0.113.91", 64).unwrap();
    app.app
        .limiter
        .publish_multiplier(
            &SubjectKey::ip(&ip),
            Some("auth"),
            0.0,
            Some(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    let blocked = second.limit_check(&login("leo", "203.0.113.91")).await;
    let body = assert_envelope(blocked, StatusCode::TOO_MANY_REQUESTS, "RATE_LIMITED").await;
    let scope = body["error"]["details"]["scope"].as_str().unwrap();
    assert!(
        scope == "endpoint_ip" || scope == "ip",
        "both IP-keyed scopes are blocked: {scope}"
    );
    // The denied check consumed nothing in the other slots: leo's account still has 5.
    let other_ip = second.limit_check(&login("leo", "203.0.113.92")).await;
    assert_eq!(other_ip.headers()["x-ratelimit-remaining"], "4");
}
