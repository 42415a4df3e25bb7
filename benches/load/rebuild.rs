//! Rebuilding the hot store after it lost its data: N accounts locked (10 failures each,
//! posted over HTTP), the bench's Redis flushed, then one `Recovery::check` (lock markers,
//! factors, windows from Postgres), against a raw pipeline writing the same number of
//! markers.

use super::*;

/// `LOAD_ONLY=rebuild`: for each N in `LOAD_REBUILD_LOCKOUTS` (default `10000,100000`).
pub(crate) fn rebuild_section(redis_port: u16) {
    let sizes: Vec<u64> = std::env::var("LOAD_REBUILD_LOCKOUTS")
        .unwrap_or_else(|_| "10000,100000".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    println!("\n## Rebuilding the hot store from Postgres after Redis lost its data\n");
    println!(
        "| lockouts in force | events replayed | subjects' factors | enforced again after s | rebuild s | sample refused by its lockout | raw pipeline of as many `SET … PX` s | ratio (enforced) |\n|---|---|---|---|---|---|---|---|"
    );
    let runtime = two_workers();
    for n in sizes {
        runtime.block_on(rebuild_one(redis_port, n));
    }
}

async fn rebuild_one(redis_port: u16, accounts: u64) {
    let database = BenchDatabase::create().await;
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: database.url.clone(),
        redis_url: Some(format!("redis://127.0.0.1:{redis_port}")),
        bootstrap_token: Some(Secret::new(TOKEN)),
        ..Settings::default()
    };
    settings.store.redis_key_prefix = format!("rebuild{accounts}");
    settings.store.redis_timeout_ms = 5000;
    // One check a decision, straight from Redis.
    settings.limits.l1_ttl_ms = 0;
    let settings = settings.validate().unwrap();
    let app = App::build(settings.clone()).await.unwrap().into_state();
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(palisade::serve(
        app.clone(),
        listener,
        std::future::pending(),
    ));
    let client = reqwest::Client::new();
    let now = chrono::Utc::now();
    // 10 failures per account, 500 to a batch, 4 batches at a time.
    let batches: Vec<u64> = (0..accounts * 10).step_by(500).collect();
    for group in batches.chunks(4) {
        let posts = group.iter().map(|&first| {
            client
                .post(format!("{base}/v1/events/auth"))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body(auth_batch(first, accounts, now))
                .send()
        });
        for (response, &first) in futures_util::future::join_all(posts)
            .await
            .iter()
            .zip(group)
        {
            // A batch the server could not answer is posted again (idempotent by event id).
            if !response.as_ref().is_ok_and(|r| r.status() == 200) {
                eprintln!("batch {first}: {response:?}; posting it again");
                let again = client
                    .post(format!("{base}/v1/events/auth"))
                    .bearer_auth(TOKEN)
                    .header("content-type", "application/json")
                    .body(auth_batch(first, accounts, now))
                    .send()
                    .await;
                assert!(
                    again.as_ref().is_ok_and(|r| r.status() == 200),
                    "batch {first}: {again:?}"
                );
            }
        }
    }
    let mut conn = redis::Client::open(format!("redis://127.0.0.1:{redis_port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    app.recovery.check().await.expect("rebuild");
    let took = started.elapsed().as_secs_f64();
    let rebuilt = app.recovery.state().last_rebuild.expect("rebuilt");
    // A sample of the accounts, each from an IP of its own: refused by the lockout (limit 0).
    let (mut enforced, mut sampled) = (0, 0);
    for i in (0..accounts)
        .step_by((accounts / 1000).max(1) as usize)
        .take(1000)
    {
        let body = format!(
            r#"{{"endpoint":"/auth/login","method":"POST","ip":"172.16.{}.{}","user_id":"acct{i}"}}"#,
            i >> 8 & 255,
            i & 255
        );
        let answer: serde_json::Value = client
            .post(format!("{base}/v1/limit/check"))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sampled += 1;
        if answer["error"]["details"]["limit"] == 0 {
            enforced += 1;
        }
    }
    // The baseline: as many markers written by one client in pipelines of 1000.
    let _: () = redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    for chunk in (0..rebuilt.lockouts).collect::<Vec<_>>().chunks(1000) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("SET")
                .arg(format!("raw:{{user:acct{i}}}:lock"))
                .arg("01JEXAMPLE0000000000000000!")
                .arg("PX")
                .arg(900_000)
                .ignore();
        }
        let _: () = pipe.query_async(&mut conn).await.unwrap();
    }
    let raw = started.elapsed().as_secs_f64();
    let _: () = redis::cmd("FLUSHALL")
        .arg("ASYNC")
        .query_async(&mut conn)
        .await
        .unwrap();
    println!(
        "| {} | {} | {} | {:.2} | {took:.2} | {enforced} of {sampled} | {raw:.3} | {:.0} |",
        rebuilt.lockouts,
        rebuilt.events,
        rebuilt.subjects,
        rebuilt.enforced_ms as f64 / 1000.0,
        rebuilt.enforced_ms as f64 / 1000.0 / raw
    );
    database.drop_it().await;
}
