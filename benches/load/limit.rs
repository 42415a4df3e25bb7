//! The limit check over HTTP and in process, coalescing, the hot key, key floods and mixed traffic.

use super::*;

/// `POST /v1/limit/check` with 4 scopes over HTTP (the Rust client and `wrk`) against
/// `redis-benchmark` EVALSHA of the same script and keys, at each concurrency in `levels`.
pub(crate) fn limit_http_section(redis_port: u16, server: &Server, levels: &[u64], seconds: u64) {
    // Load the script so redis-benchmark's EVALSHA finds it.
    let warm = drive(
        &server.base,
        4,
        1,
        Arc::new(|_| r#"{"endpoint":"/v1/feed","ip":"10.0.0.1"}"#.to_owned()),
    );
    assert!(warm.requests > 0);
    let four_scopes: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync> = Arc::new(
        |rng| {
            let n: u32 = rng.random_range(0..100_000);
            format!(
                r#"{{"endpoint":"/v1/feed","ip":"10.{}.{}.{}","user_id":"u{n}","device_id":"d{n}"}}"#,
                n >> 16 & 255,
                n >> 8 & 255,
                n & 255
            )
        },
    );
    println!("\n## `/v1/limit/check`, 4 scopes, 100k users/IPs/devices, over HTTP vs raw script\n");
    println!(
        "The Rust client (reqwest) runs in the same process; wrk is C, like redis-benchmark. Each\n\
         ratio is against a redis-benchmark row of the same concurrency: the same script with\n\
         the same 4 scopes, and with one scope (a plain token bucket).\n"
    );
    println!(
        "| c | what | requests/s | p50 ms | p99 ms | p99.9 ms | ratio to 4 scopes | ratio to 1 scope |\n|---|---|---|---|---|---|---|---|"
    );
    for &concurrency in levels {
        let (http, http_server_p99) = server_p99_during(&server.base, LIMIT_ROUTE, || {
            drive(&server.base, concurrency, seconds, four_scopes.clone())
        });
        let (wrk, wrk_server_p99) = server_p99_during(&server.base, LIMIT_ROUTE, || {
            wrk(&server.base, concurrency, seconds)
        });
        let server_p99 = |p99: Option<f64>| {
            p99.map_or_else(|| "n/a".to_owned(), |s| format!("{} ms", s * 1000.0))
        };
        let (raw_rps, raw_p99) = redis_benchmark(
            redis_port,
            concurrency,
            (http.rps() as u64 * seconds).max(50_000),
            true,
        );
        let (one_rps, one_p99) = redis_benchmark(
            redis_port,
            concurrency,
            (http.rps() as u64 * seconds).max(50_000),
            false,
        );
        println!(
            "| {concurrency} | palisade HTTP, Rust client (200: {}, 429: {}, other: {}; server p99 <= {}) | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            http.statuses[0],
            http.statuses[1],
            http.statuses[2],
            server_p99(http_server_p99),
            http.rps(),
            http.percentile_ms(0.5),
            http.percentile_ms(0.99),
            http.percentile_ms(0.999),
            http.rps() / raw_rps,
            http.rps() / one_rps
        );
        if let Some((rps, p50, p99, p999, non_2xx, cpu_us)) = wrk {
            println!(
                "| {concurrency} | palisade HTTP, wrk -t{} (non-2xx: {non_2xx}; service CPU {cpu_us:.1} µs/request; server p99 <= {}) | {rps:.0} | {p50:.2} | {p99:.2} | {p999:.2} | {:.2} | {:.2} |",
                concurrency.clamp(1, env_or("LOAD_WRK_THREADS", 2).max(1)),
                server_p99(wrk_server_p99),
                rps / raw_rps,
                rps / one_rps
            );
        }
        println!(
            "| {concurrency} | redis-benchmark EVALSHA, same script and keys | {raw_rps:.0} | | {raw_p99:.2} | | 1.00 | {:.2} |",
            raw_rps / one_rps
        );
        println!(
            "| {concurrency} | redis-benchmark EVALSHA, one scope (a plain token bucket) | {one_rps:.0} | | {one_p99:.2} | | {:.2} | 1.00 |",
            one_rps / raw_rps
        );
    }
}

/// Checks per second through `Limiter::check` (the library, no HTTP) on Redis, `concurrency`
/// tasks, the same 4-scope requests as the HTTP run, with `limits.coalesce` on or off; and
/// how many checks each `EVALSHA` carried (Redis `INFO commandstats`).
pub(crate) fn limiter_direct(
    redis_port: u16,
    concurrency: u64,
    seconds: u64,
    coalesce: bool,
) -> (f64, f64, f64) {
    let stats = format!("redis://127.0.0.1:{redis_port}");
    limiter_direct_on(
        &stats.clone(),
        Some(&stats),
        &format!("direct-{coalesce}"),
        concurrency,
        seconds,
        coalesce,
    )
}

/// [`limiter_direct`] on any hot store URL (a cluster's too); the script counts are read
/// from `stats` (a single node) when given, else reported as 0.
pub(crate) fn limiter_direct_on(
    redis_url: &str,
    stats: Option<&str>,
    prefix: &str,
    concurrency: u64,
    seconds: u64,
    coalesce: bool,
) -> (f64, f64, f64) {
    let runtime = two_workers();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        database_url: format!("sqlite://{}", dir.path().join("bench.db").display()),
        redis_url: Some(redis_url.to_owned()),
        ..Settings::default()
    };
    settings.limits.coalesce = coalesce;
    settings.limits.coalesce_in_flight = env_or("LOAD_COALESCE_IN_FLIGHT", 4) as u8;
    settings.store.redis_key_prefix = prefix.to_owned();
    let settings = settings.validate().unwrap();
    let stats = stats.map(str::to_owned);
    runtime.block_on(async move {
        let app = App::build(settings).await.unwrap().into_state();
        let mut conn = match stats {
            Some(url) => Some(
                redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
            None => None,
        };
        let calls_before = match &mut conn {
            Some(conn) => evalsha_calls(conn).await,
            None => (0, 0),
        };
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let limiter = app.limiter.clone();
            tasks.spawn(async move {
                let mut done = 0u64;
                while Instant::now() < deadline {
                    let n: u32 = rand::rng().random_range(0..100_000);
                    let request = palisade::limiter::LimitRequest {
                        method: "GET".to_owned(),
                        endpoint: "/v1/feed".to_owned(),
                        ip: palisade::model::ClientIp::parse(
                            &format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255),
                            64,
                        )
                        .unwrap(),
                        user: Some(
                            palisade::model::SubjectKey::user(&format!("u{n}"), 64).unwrap(),
                        ),
                        device: Some(
                            palisade::model::SubjectKey::device(&format!("d{n}"), 64).unwrap(),
                        ),
                        tenant: None,
                        recipient: None,
                        cost: 1,
                        consume: true,
                    };
                    let decision = limiter.check(&request).await.unwrap();
                    assert!(!decision.degraded);
                    done += 1;
                }
                done
            });
        }
        let mut checks = 0;
        while let Some(done) = tasks.join_next().await {
            checks += done.unwrap();
        }
        let rate = checks as f64 / started.elapsed().as_secs_f64();
        let Some(conn) = &mut conn else {
            return (rate, 0.0, 0.0);
        };
        let (calls, usec) = evalsha_calls(conn).await;
        let calls = (calls - calls_before.0).max(1);
        (
            rate,
            checks as f64 / calls as f64,
            (usec - calls_before.1) as f64 / checks.max(1) as f64,
        )
    })
}

/// Coalescing (`LOAD_ONLY=coalesce`): the limiter library's checks/s on Redis with one
/// script call per check and with coalesced calls, against `redis-benchmark` EVALSHA of the
/// same 4-scope call (one call per request) at the same concurrency, all in this run.
pub(crate) fn coalesce_section(redis_port: u16, concurrency: u64, seconds: u64) {
    let (single, single_per_call, single_us) =
        limiter_direct(redis_port, concurrency, seconds, false);
    let (coalesced, per_call, coalesced_us) =
        limiter_direct(redis_port, concurrency, seconds, true);
    let (raw_rps, _) = redis_benchmark(
        redis_port,
        concurrency,
        (single as u64 * seconds).max(100_000),
        true,
    );
    println!(
        "\n## Coalesced checks: `Limiter::check` on Redis without HTTP, {concurrency} tasks, 4 scopes\n"
    );
    println!(
        "| what | checks/s | checks per EVALSHA | Redis CPU µs per check | ratio |\n|---|---|---|---|---|"
    );
    println!(
        "| `limits.coalesce = false`: one script call per check | {single:.0} | {single_per_call:.1} | {single_us:.1} | {:.2} |",
        single / raw_rps
    );
    println!(
        "| `limits.coalesce = true` | {coalesced:.0} | {per_call:.1} | {coalesced_us:.1} | {:.2} |",
        coalesced / raw_rps
    );
    println!(
        "| redis-benchmark EVALSHA, one call per request, same script and keys | {raw_rps:.0} | 1.0 | | 1.00 |"
    );
}

/// Key-cardinality flood (`LOAD_ONLY=flood`): `keys` checks, each from a new random user id
/// and IP, through an embedded instance's limiter and scoring (what `/v1/limit/check` does
/// after parsing), printing resident memory and tracked keys as it goes.
pub(crate) fn flood_section(keys: u64) {
    use rand::Rng;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let settings = palisade::Settings {
            database_url: format!("sqlite://{}", dir.path().join("flood.db").display()),
            data_dir: dir.path().join("data"),
            ..palisade::Settings::default()
        };
        let app = palisade::App::build(settings).await.expect("app").into_state();
        let mut rng = rand::rng();
        println!(
            "\n## Key-cardinality flood: {keys} random user ids (and IPs) through the embedded limiter and scoring\n"
        );
        println!("| checks | resident memory MiB | baseline keys tracked | of at most | table bytes |\n|---|---|---|---|---|");
        let report = |done: u64| {
            let (tracked, capacity, bytes) = app.scoring.baseline_keys();
            println!(
                "| {done} | {:.1} | {tracked} | {capacity} | {bytes} |",
                rss_kib() as f64 / 1024.0
            );
        };
        report(0);
        let part = std::env::var("LOAD_FLOOD_PART").unwrap_or_default();
        let started = std::time::Instant::now();
        for done in 1..=keys {
            let user: u128 = rng.random();
            let ip = std::net::Ipv4Addr::from(rng.random::<u32>()).to_string();
            let request = palisade::limiter::LimitRequest {
                method: "GET".to_owned(),
                endpoint: "/v1/feed".to_owned(),
                ip: palisade::model::ClientIp::parse(&ip, 64).unwrap(),
                user: Some(palisade::model::SubjectKey::user(&format!("{user:x}"), 256).unwrap()),
                device: None,
                tenant: None,
                recipient: None,
                cost: 1,
                consume: true,
            };
            if part == "defaults" {
                use palisade::limiter::DefaultMultipliers;
                std::hint::black_box(app.scoring.defaults("read", &request));
            } else if part == "buckets" {
                let memory = match &app.stores.hot {
                    palisade::store::Hot::Memory(memory) => memory.clone(),
                    _ => unreachable!(),
                };
                let now = app.clock.monotonic_us() as f64;
                let (a, b) = (format!("pal:v1:{{ip:{ip}}}:b:x"), format!("pal:v1:{{user:{user:x}}}:b:y"));
                memory.update_buckets(&[a.as_str(), b.as_str()], now, |_, writes| {
                    writes[0] = Some(now + 100_000.0);
                    writes[1] = Some(now + 200_000.0);
                });
            } else if part == "scoring" {
                let ip = palisade::model::SubjectKey::ip(&request.ip);
                let keys = [&ip, request.user.as_ref().unwrap()];
                app.scoring.observe(&keys, 1, false);
            } else {
                let decision = app.limiter.check(&request).await.unwrap();
                if part != "limiter" {
                    app.scoring.observe_check(&request, &decision).await.unwrap();
                }
            }
            if done % (keys / 5).max(1) == 0 {
                report(done);
            }
        }
        println!(
            "\n{keys} checks in {:.1} s ({:.0}/s, one thread)",
            started.elapsed().as_secs_f64(),
            keys as f64 / started.elapsed().as_secs_f64()
        );
    });
}

/// Mixed traffic (`LOAD_ONLY=mixed`): limit checks over 100k users with a skew (a few hot
/// users, a long tail), auth-event batches, telemetry batches and multiplier queries, all at
/// once against one instance (SQLite + the bench's Redis), each route from its own clients;
/// throughput and latency per route.
pub(crate) fn mixed_section(redis_port: u16, seconds: u64) {
    use rand::Rng;
    let server = start_palisade(redis_port, 250);
    // A cube of a uniform draw: about 20 % of checks go to the first 0.8 % of users.
    let skewed = |rng: &mut rand::rngs::ThreadRng| (100_000.0 * rng.random::<f64>().powi(3)) as u32;
    let routes: Vec<(&str, u64, MakeRequest)> = vec![
        (
            "POST /v1/limit/check (skewed users)",
            24,
            Arc::new(move |client, base, rng| {
                let n = skewed(rng);
                client
                    .post(format!("{base}/v1/limit/check"))
                    .header("content-type", "application/json")
                    .body(format!(
                        r#"{{"endpoint":"/v1/feed","ip":"10.{}.{}.{}","user_id":"u{n}","device_id":"d{n}"}}"#,
                        n >> 16 & 255,
                        n >> 8 & 255,
                        n & 255
                    ))
            }),
        ),
        (
            "GET /v1/multipliers",
            8,
            Arc::new(move |client, base, rng| {
                let n = skewed(rng);
                client.get(format!(
                    "{base}/v1/multipliers?ip=10.0.{}.{}&user_id=u{n}&endpoint=/v1/feed",
                    n >> 8 & 255,
                    n & 255
                ))
            }),
        ),
        (
            "POST /v1/events/auth (batches of 50)",
            2,
            Arc::new(|client, base, rng| {
                let now = chrono::Utc::now();
                let batch: Vec<serde_json::Value> = (0..50)
                    .map(|_| {
                        let n: u32 = rng.random_range(0..100_000);
                        serde_json::json!({"event_id": format!("{:x}", rng.random::<u128>()),
                            "type": "login_failure", "account": format!("u{n}"),
                            "ip": format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255),
                            "ts": now.to_rfc3339()})
                    })
                    .collect();
                client
                    .post(format!("{base}/v1/events/auth"))
                    .json(&serde_json::json!({"events": batch}))
            }),
        ),
        (
            "POST /v1/events/requests (batches of 100)",
            2,
            Arc::new(|client, base, rng| {
                let now = chrono::Utc::now();
                let batch: Vec<serde_json::Value> = (0..100)
                    .map(|_| {
                        let n: u32 = rng.random_range(0..100_000);
                        serde_json::json!({"ts": now.to_rfc3339(), "ip": format!("10.0.{}.{}", n >> 8 & 255, n & 255),
                            "user_id": format!("u{n}"), "endpoint": "/v1/feed", "status": 200})
                    })
                    .collect();
                client
                    .post(format!("{base}/v1/events/requests"))
                    .json(&serde_json::json!({"events": batch}))
            }),
        ),
    ];
    let runs: Vec<(&str, Run)> = std::thread::scope(|scope| {
        let handles: Vec<_> = routes
            .into_iter()
            .map(|(name, concurrency, make)| {
                let base = server.base.clone();
                scope.spawn(move || (name, drive_with(&base, concurrency, seconds, make)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!(
        "\n## Mixed traffic, {seconds} s, all routes at once (SQLite + Redis, 2 cores shared)\n"
    );
    println!(
        "| route | clients | requests/s | p50 ms | p99 ms | p99.9 ms | 200 | 429 | other |\n|---|---|---|---|---|---|---|---|---|"
    );
    for ((name, run), clients) in runs.iter().zip([24, 8, 2, 2]) {
        println!(
            "| {name} | {clients} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            run.rps(),
            run.percentile_ms(0.5),
            run.percentile_ms(0.99),
            run.percentile_ms(0.999),
            run.statuses[0],
            run.statuses[1],
            run.statuses[2]
        );
    }
}

/// One hot blocked key (a brute force after its 429) with the L1 cache on and off.
pub(crate) fn hot_key_section(server: &Server, redis_port: u16, concurrency: u64, seconds: u64) {
    let hot_blocked: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync> =
        Arc::new(|_| {
            r#"{"endpoint":"/auth/login","method":"POST","ip":"10.9.9.9","user_id":"victim"}"#
                .to_owned()
        });
    let with_l1 = drive(&server.base, concurrency, seconds, hot_blocked.clone());
    let no_l1_server = start_palisade(redis_port, 0);
    let without_l1 = drive(&no_l1_server.base, concurrency, seconds, hot_blocked);
    println!("\n## One hot blocked key (brute force after its 429), L1 cache on vs off\n");
    println!("| L1 | requests/s | p99 ms | 429 share | ratio |\n|---|---|---|---|---|");
    for (name, run, base) in [
        ("off (`l1_ttl_ms = 0`)", &without_l1, without_l1.rps()),
        ("on (250 ms)", &with_l1, without_l1.rps()),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} | {:.4} | {:.2} |",
            run.rps(),
            run.percentile_ms(0.99),
            run.statuses[1] as f64 / run.requests as f64,
            run.rps() / base
        );
    }
}

/// Cluster against one Redis (`LOAD_ONLY=cluster`): the limiter library's 4-scope checks/s
/// on a local 3-master Redis Cluster and on one Redis, each with its defaults, the same
/// requests and `concurrency` tasks, measured A B B A in this run.
pub(crate) fn cluster_section(redis_port: u16, concurrency: u64, seconds: u64) {
    let cluster = start_cluster();
    let single_url = format!("redis://127.0.0.1:{redis_port}");
    let mut single = Vec::new();
    let mut clustered = Vec::new();
    for (round, on_cluster) in [false, true, true, false].into_iter().enumerate() {
        let url = if on_cluster {
            &cluster.url
        } else {
            &single_url
        };
        let (rate, _, _) = limiter_direct_on(
            url,
            None,
            &format!("cluster-bench-{round}"),
            concurrency,
            seconds,
            true,
        );
        if on_cluster {
            clustered.push(rate);
        } else {
            single.push(rate);
        }
    }
    let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
    println!(
        "\n## Redis Cluster against one Redis: `Limiter::check`, {concurrency} tasks, 4 scopes, A B B A\n"
    );
    println!("| hot store | checks/s (each run) | mean | ratio |\n|---|---|---|---|");
    println!(
        "| one Redis (`redis://`, coalesced script calls) | {:.0}, {:.0} | {:.0} | 1.00 |",
        single[0],
        single[1],
        mean(&single)
    );
    println!(
        "| 3-master cluster (`redis+cluster://`) | {:.0}, {:.0} | {:.0} | {:.2} |",
        clustered[0],
        clustered[1],
        mean(&clustered),
        mean(&clustered) / mean(&single)
    );
}
