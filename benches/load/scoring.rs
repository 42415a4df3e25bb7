//! Multiplier queries and request-telemetry ingest against plain axum handlers.

use super::*;

/// Scoring: `/v1/multipliers` (L1 hits) vs a static axum handler, and telemetry ingest vs a
/// parse-only handler, on Postgres + Redis.
pub(crate) fn scoring_section(redis_port: u16, seconds: u64, concurrency: u64) {
    let runtime = two_workers();
    let database = runtime.block_on(BenchDatabase::create());
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: database.url.clone(),
        redis_url: Some(format!("redis://127.0.0.1:{redis_port}")),
        bootstrap_token: Some(Secret::new(TOKEN)),
        ..Settings::default()
    };
    settings.store.redis_key_prefix = "scoring".to_owned();
    let settings = settings.validate().unwrap();
    let (base, static_base) = runtime.block_on(async {
        let app = App::build(settings.clone()).await.unwrap().into_state();
        // Some stored factors, so the keys have something to combine.
        for n in 0..100u32 {
            let user = palisade::model::SubjectKey::user(&format!("u{n}"), 64).unwrap();
            app.scoring
                .assert(&user, palisade::scoring::Factor::scale("bench", "stored", 0.5, "bench factor"))
                .await
                .unwrap();
        }
        let listener = tokio::net::TcpListener::bind(settings.listen).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(palisade::serve(app, listener, std::future::pending()));
        // The baseline: a static JSON answer of the same size as a /v1/multipliers answer.
        let answer = r#"{"class":"read","keys":{"device:d1":{"multiplier":1.0,"reasons":[],"would_be":1.0},"ip:10.0.0.1":{"multiplier":1.0,"reasons":[],"would_be":1.0},"user:u1":{"multiplier":0.5,"reasons":[{"code":"stored","effect":"scale","factor":0.5,"message":"bench factor","shadow":false,"signal":"bench"}],"would_be":0.5}},"multiplier":0.5}"#;
        let router = axum::Router::new()
            .route("/static", axum::routing::get(move || async move {
                ([("content-type", "application/json")], answer)
            }))
            .route("/parse", axum::routing::post(|body: axum::Json<serde_json::Value>| async move {
                let n = body["events"].as_array().map_or(0, Vec::len);
                axum::Json(serde_json::json!({"accepted": n}))
            }));
        let static_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let static_base = format!("http://{}", static_listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(static_listener, router).await.unwrap() });
        (base, static_base)
    });
    println!(
        "\n## Scoring: `GET /v1/multipliers` (L1 hits, 100 keys) vs a static axum handler, wrk -t2 -c{concurrency}\n"
    );
    let path = "/v1/multipliers?ip=10.0.0.%d&user_id=u%d&device_id=d%d&endpoint=/v1/feed";
    let ours = wrk_get(&base, path, 100, concurrency, seconds);
    let baseline = wrk_get(
        &static_base,
        "/static?a=%d&b=%d&c=%d",
        100,
        concurrency,
        seconds,
    );
    match (ours, baseline) {
        (Some(ours), Some(baseline)) => {
            println!(
                "| what | requests/s | p50 ms | p99 ms | p99.9 ms | non-2xx | ratio |\n|---|---|---|---|---|---|---|"
            );
            println!(
                "| palisade `/v1/multipliers` (ip, user, device) | {:.0} | {:.2} | {:.2} | {:.2} | {} | {:.2} |",
                ours.0,
                ours.1,
                ours.2,
                ours.3,
                ours.4,
                ours.0 / baseline.0
            );
            println!(
                "| static axum handler, same answer size | {:.0} | {:.2} | {:.2} | {:.2} | {} | 1.00 |",
                baseline.0, baseline.1, baseline.2, baseline.3, baseline.4
            );
        }
        _ => println!("(wrk is not installed: `apt-get install wrk`)"),
    }

    let now = chrono::Utc::now();
    let batch: Arc<Vec<serde_json::Value>> = Arc::new(
        (0..5000u64)
            .map(|i| {
                serde_json::json!({
                    "ts": now.to_rfc3339(),
                    "ip": format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                    "user_id": format!("u{}", i % 2000),
                    "device_id": format!("d{}", i % 3000),
                    "endpoint": "/v1/feed",
                    "status": if i % 50 == 0 { 429 } else { 200 },
                })
            })
            .collect(),
    );
    let ours = runtime.block_on(post_batches(
        format!("{base}/v1/events/requests"),
        2,
        seconds,
        batch.clone(),
    ));
    let parse_only = runtime.block_on(post_batches(
        format!("{static_base}/parse"),
        2,
        seconds,
        batch,
    ));
    println!(
        "\n## Scoring: request telemetry, batches of 5000 (3 keys each), Postgres + Redis, 2 posters\n"
    );
    println!("| what | events/s | ratio |\n|---|---|---|");
    println!(
        "| palisade `POST /v1/events/requests` (parsed, stored, baselines, 429 sketch) | {ours:.0} | {:.2} |",
        ours / parse_only
    );
    println!("| axum handler that only parses the same JSON | {parse_only:.0} | 1.00 |");
    runtime.block_on(database.drop_it());
}
