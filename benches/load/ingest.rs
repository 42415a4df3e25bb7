//! Auth-event ingest against raw COPY and pgbench, with CPU per event.

use super::*;

/// A fresh Postgres database for the ingest section, dropped at the end.
pub(crate) struct BenchDatabase {
    pub(crate) admin: String,
    pub(crate) name: String,
    pub(crate) url: String,
}

impl BenchDatabase {
    pub(crate) async fn create() -> BenchDatabase {
        use sqlx::Connection;
        let admin = std::env::var("PALISADE_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
        let name = format!("pal_bench_{}", ulid::Ulid::new().to_string().to_lowercase());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("Postgres for the ingest benchmark");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap();
        let mut url = reqwest::Url::parse(&admin).unwrap();
        url.set_path(&format!("/{name}"));
        BenchDatabase {
            admin,
            name,
            url: url.to_string(),
        }
    }

    pub(crate) async fn drop_it(self) {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&self.admin).await.unwrap();
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&mut conn)
        .await;
    }
}

/// A batch of 500 failures, `first..first + 500`, as the body text (the load generator writes
/// it directly, as an auth service's serializer would, rather than building a JSON tree per
/// event: the generator shares the two cores with the service).
pub(crate) fn auth_batch(first: u64, accounts: u64, now: chrono::DateTime<chrono::Utc>) -> String {
    use std::fmt::Write;
    let ts = now.to_rfc3339();
    let mut body = String::with_capacity(500 * 120);
    body.push_str("{\"events\":[");
    for i in first..first + 500 {
        if i != first {
            body.push(',');
        }
        write!(
            body,
            r#"{{"event_id":"ev-{i}","type":"login_failure","account":"acct{}","ip":"10.{}.{}.{}","ts":"{ts}"}}"#,
            i % accounts,
            i >> 16 & 255,
            i >> 8 & 255,
            i & 255
        )
        .unwrap();
    }
    body.push_str("]}");
    body
}

/// Ingest: `POST /v1/events/auth` (batches of 500, Postgres + Redis) vs a raw COPY of the same
/// rows into the same table, then `GET /v1/accounts/{a}/status` latency.
pub(crate) fn ingest_section(redis_port: u16, seconds: u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("LOAD_SERVER_WORKERS", 2).max(1) as usize)
        .enable_all()
        .build()
        .unwrap();
    let database = runtime.block_on(BenchDatabase::create());
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: database.url.clone(),
        // `LOAD_INGEST_HOT=memory`: in-process windows, lock markers and factors (one
        // instance's answers; a ceiling for the Redis work, not a deployment).
        redis_url: (std::env::var("LOAD_INGEST_HOT").as_deref() != Ok("memory"))
            .then(|| format!("redis://127.0.0.1:{redis_port}")),
        bootstrap_token: Some(Secret::new(TOKEN)),
        ..Settings::default()
    };
    settings.store.redis_key_prefix = "ingest".to_owned();
    settings.store.redis_timeout_ms = env_or("LOAD_REDIS_TIMEOUT_MS", 250);
    let settings = settings.validate().unwrap();
    let base = runtime.block_on(async {
        let app = App::build(settings.clone()).await.unwrap().into_state();
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(palisade::serve(app, listener, std::future::pending()));
        base
    });
    let mut redis_conn = runtime.block_on(async {
        redis::Client::open(format!("redis://127.0.0.1:{redis_port}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    });
    // `pgbench` once before the ingest run and once after it: the rate of the same inserts
    // moves with what Postgres is doing (checkpoints, autovacuum after the run's inserts) and
    // with the machine's other tenants; the run is measured against the faster of the two.
    // Each measured run starts from a checkpoint, so none pays for the one before's writes.
    runtime.block_on(checkpoint(&database.url));
    let pgbench_before = runtime.block_on(pgbench_insert(
        &database.url,
        "pgbench_before",
        seconds.clamp(3, 10),
    ));
    runtime.block_on(checkpoint(&database.url));
    let scripts_before = runtime.block_on(evalsha_calls(&mut redis_conn));
    let status_route = "/v1/accounts/{account}/status";
    let status_before = runtime
        .block_on(server_buckets(&base, status_route))
        .unwrap_or_default();
    let cpu_before = runtime.block_on(CpuUse::now(&mut redis_conn));
    let ((events, elapsed), probe) = runtime.block_on(async {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        // The auth service's question while the batches go in: one status every 5 ms on its
        // own connection, for accounts the posters are failing (latency per request, µs).
        let probe = {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let mut latencies: Vec<u32> = Vec::new();
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                let mut n = 0u64;
                while Instant::now() < deadline {
                    tick.tick().await;
                    n += 7919;
                    let sent = Instant::now();
                    let response = client
                        .get(format!(
                            "{base}/v1/accounts/acct{}/status?ip=10.0.0.{}",
                            n % 100_000,
                            n % 250
                        ))
                        .bearer_auth(TOKEN)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200);
                    let _ = response.bytes().await;
                    latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                latencies
            })
        };
        let mut tasks = tokio::task::JoinSet::new();
        // `LOAD_INGEST_ACCOUNTS=1`: every failure on one account from a new IP (a distributed
        // brute force); by default 100k accounts, each failing again every 100k events.
        let accounts = env_or("LOAD_INGEST_ACCOUNTS", 100_000).max(1);
        // `LOAD_INGEST_RATE=N`: the posters send N events/s in all (a batch each every
        // 4 × 500 / N s) instead of as fast as they are answered, to see the status query
        // under a given load rather than at saturation.
        let rate = env_or("LOAD_INGEST_RATE", 0);
        // `LOAD_INGEST_POSTERS=n` (default 4) posts from n tasks at once. They take batches
        // off one numbered stream (batch k holds events 500k..500k+499), so the events, and
        // each account's failures, are the same whatever n: batches in flight together hold
        // neighbouring accounts, as an auth service's instances would post different users
        // (streams of their own, each starting at a multiple of the account count, would have
        // all four fail the same 500 accounts at the same moment).
        let posters = env_or("LOAD_INGEST_POSTERS", 4).max(1);
        let batches = Arc::new(std::sync::atomic::AtomicU64::new(0));
        for poster in 0..posters {
            let (client, base, batches) = (client.clone(), base.clone(), batches.clone());
            tasks.spawn(async move {
                let mut sent = 0u64;
                // Paced posters start a period's share apart: started together they posted
                // their batches in the same instant, a burst of `posters` batches every
                // period that saturated both cores for ~20 ms (at 10k events/s, 2000 events
                // every 200 ms), and that burst, not the rate, was the status query's p99.
                let mut pace = (rate > 0).then(|| {
                    let period = Duration::from_secs_f64(500.0 * posters as f64 / rate as f64);
                    tokio::time::interval_at(
                        tokio::time::Instant::now()
                            + period.mul_f64(poster as f64 / posters as f64),
                        period,
                    )
                });
                while Instant::now() < deadline {
                    if let Some(pace) = &mut pace {
                        pace.tick().await;
                    }
                    let next = batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 500;
                    let body = auth_batch(next, accounts, chrono::Utc::now());
                    let response = client
                        .post(format!("{base}/v1/events/auth"))
                        .bearer_auth(TOKEN)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(
                        response.status(),
                        200,
                        "{}",
                        response.text().await.unwrap_or_default()
                    );
                    sent += 500;
                }
                sent
            });
        }
        let mut total = 0;
        while let Some(sent) = tasks.join_next().await {
            total += sent.unwrap();
        }
        let elapsed = started.elapsed().as_secs_f64();
        ((total, elapsed), probe.await.unwrap())
    });
    let cpu = runtime
        .block_on(CpuUse::now(&mut redis_conn))
        .since(&cpu_before, events);
    let status_during = runtime
        .block_on(server_buckets(&base, status_route))
        .unwrap_or_default();
    let probe_server_p99 = percentile_of(&since(&status_before, &status_during), 0.99);
    let probe_line = {
        let mut sorted = probe;
        sorted.sort_unstable();
        let at = |q: f64| {
            sorted
                .get(((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1)))
                .map_or(0.0, |&us| f64::from(us) / 1000.0)
        };
        format!(
            "`GET /v1/accounts/{{a}}/status` during the ingest run, one request every 5 ms on its own connection ({} requests): p50 {:.3} ms, p99 {:.3} ms, p99.9 {:.3} ms (client side); server time p99 <= {}",
            sorted.len(),
            at(0.5),
            at(0.99),
            at(0.999),
            probe_server_p99.map_or_else(|| "n/a".to_owned(), |s| format!("{:.2} ms", s * 1000.0))
        )
    };
    let ours = events as f64 / elapsed;
    let scripts_after = runtime.block_on(evalsha_calls(&mut redis_conn));
    let redis_us_per_event = (scripts_after.1 - scripts_before.1) as f64 / events.max(1) as f64;

    // The same rows by COPY into a copy of the table: the database's own ceiling here.
    let copy_rate = runtime.block_on(async {
        let (mut conn, _dir, now_ms) = scratch_copy_of_auth_events(&database.url, "copy_target")
            .await
            .expect("a copy of auth_events for COPY");
        let rows = events.max(50_000);
        let mut csv = String::with_capacity(rows as usize * 64);
        for i in 0..rows {
            csv.push_str(&format!(
                "copy-{i},login_failure,acct{},10.{}.{}.{},,,{now_ms},{now_ms}\n",
                i % 100_000,
                i >> 16 & 255,
                i >> 8 & 255,
                i & 255
            ));
        }
        let started = Instant::now();
        let mut copy = conn
            .copy_in_raw("COPY copy_target (event_id, kind, account, ip, device_id, endpoint, ts, received_at) FROM STDIN WITH (FORMAT csv)")
            .await
            .unwrap();
        copy.send(csv.as_bytes()).await.unwrap();
        copy.finish().await.unwrap();
        rows as f64 / started.elapsed().as_secs_f64()
    });
    // The same rows again, as the service must store them: batches of 500, each its own
    // committed transaction (a 2xx means the batch is durable), from 4 connections as the
    // 4 posters. Each batch is a `COPY` (the cheapest way to write it) sent by `psql`: sqlx's
    // connections do not set TCP_NODELAY, so its `CopyDone` waits for the delayed ACK of
    // the data before it (measured: 35–38k rows/s against 103k with psql on an idle machine).
    let batched_copy_rate = runtime.block_on(batched_copy(&database.url, events.max(50_000)));
    runtime.block_on(checkpoint(&database.url));
    let pgbench_after = runtime.block_on(pgbench_insert(
        &database.url,
        "pgbench_after",
        seconds.clamp(3, 10),
    ));
    let status: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync> = Arc::new(|rng| {
        let n: u32 = rng.random_range(0..100_000);
        format!(
            "acct{n}?ip=10.{}.{}.{}",
            n >> 16 & 255,
            n >> 8 & 255,
            n & 255
        )
    });
    // One connection first: the server's own time without queueing behind 49 others.
    let (single, single_p99) = server_p99_during(&base, status_route, || {
        drive_get(&base, 1, 2, status.clone())
    });
    let single_line = format!(
        "`GET /v1/accounts/{{a}}/status`, 1 connection: p50 {:.3} ms, p99 {:.3} ms (client side); server time p99 <= {}",
        single.percentile_ms(0.5),
        single.percentile_ms(0.99),
        single_p99.map_or_else(|| "n/a".to_owned(), |s| format!("{:.2} ms", s * 1000.0))
    );
    let (status_run, server_p99) = server_p99_during(&base, status_route, || {
        drive_get(&base, 50, seconds.min(5), status)
    });
    println!(
        "\n## Ingest: auth events, batches of 500, Postgres + {}, {} concurrent posters\n",
        if settings.redis_url.is_some() {
            "Redis"
        } else {
            "in-process windows (`LOAD_INGEST_HOT=memory`)"
        },
        env_or("LOAD_INGEST_POSTERS", 4).max(1)
    );
    println!("| what | events/s | ratio |\n|---|---|---|");
    println!(
        "| palisade `POST /v1/events/auth` (stored + velocity + lockouts) | {ours:.0} | {:.2} |",
        ours / copy_rate
    );
    println!("| raw `COPY` of the same rows into the same table | {copy_rate:.0} | 1.00 |");
    match batched_copy_rate {
        Some(rate) => println!(
            "| raw `COPY` of the same rows in batches of 500, each committed, 4 connections (`psql`) | {rate:.0} | {:.2} |",
            ours / rate
        ),
        None => println!("| batches of 500 by `psql` | n/a (psql not on PATH) | |"),
    }
    for (when, rate) in [("before", pgbench_before), ("after", pgbench_after)] {
        match rate {
            Some(rate) => println!(
                "| `pgbench` {when} the run: `INSERT` of such rows, 500 a transaction, 4 clients | {rate:.0} | {:.2} |",
                ours / rate
            ),
            None => println!("| `pgbench` | n/a (pgbench not on PATH) | |"),
        }
    }
    if let Some(fastest) = pgbench_before
        .into_iter()
        .chain(pgbench_after)
        .reduce(f64::max)
    {
        println!(
            "\nIngest vs the faster `pgbench` run: {:.2} (the issue's target: at least 0.5).",
            ours / fastest
        );
    }
    println!(
        "\nRedis CPU in window scripts: {redis_us_per_event:.1} µs per event (`INFO commandstats`, EVALSHA usec)."
    );
    println!(
        "\nCPU per event over the run (user + system, from `/proc` and Redis's `INFO cpu`): this process (the service with the bench's posters and probe) {:.1} µs, Redis {:.1} µs, Postgres (all its processes) {:.1} µs; {:.1} µs in all, a ceiling of {:.0} events/s on {} cores.",
        cpu.service_us,
        cpu.redis_us,
        cpu.postgres_us,
        cpu.total_us(),
        cpu.ceiling(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    println!(
        "\n`GET /v1/accounts/{{a}}/status` right after, 50 connections: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms (client side); server time p99 <= {} (request histogram)\n",
        status_run.rps(),
        status_run.percentile_ms(0.5),
        status_run.percentile_ms(0.99),
        status_run.percentile_ms(0.999),
        server_p99.map_or_else(|| "n/a".to_owned(), |s| format!("{:.2} ms", s * 1000.0))
    );
    println!("{single_line}\n");
    println!("{probe_line}\n");
    runtime.block_on(database.drop_it());
}

/// CPU seconds used so far by this process, the bench's Redis and every Postgres process.
/// Per event it is steadier than events/s on a shared machine: it says where the cost is,
/// not how long the run waited.
pub(crate) struct CpuUse {
    pub(crate) service: f64,
    pub(crate) redis: f64,
    /// Per `postgres` process (pid): CPU seconds so far.
    pub(crate) postgres: std::collections::HashMap<u32, f64>,
}

/// [`CpuUse`] differences per event, in µs.
pub(crate) struct CpuPerEvent {
    pub(crate) service_us: f64,
    pub(crate) redis_us: f64,
    pub(crate) postgres_us: f64,
}

impl CpuPerEvent {
    pub(crate) fn total_us(&self) -> f64 {
        self.service_us + self.redis_us + self.postgres_us
    }

    /// Events/s if the cores did nothing but this work.
    pub(crate) fn ceiling(&self) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        cores * 1e6 / self.total_us().max(f64::MIN_POSITIVE)
    }
}

impl CpuUse {
    pub(crate) async fn now(redis: &mut redis::aio::MultiplexedConnection) -> CpuUse {
        let cpu = info_section::<f64>(redis, "cpu").await;
        let field = |name: &str| cpu(name).unwrap_or(0.0);
        let own = proc_cpu_ticks(std::path::Path::new("/proc/self/stat")).map_or(0, |(_, t)| t);
        // Asked once per reading (it runs `getconf`), not once per process read.
        let ticks_per_s = clock_ticks();
        CpuUse {
            service: own as f64 / ticks_per_s,
            redis: field("used_cpu_user") + field("used_cpu_sys"),
            postgres: postgres_cpu_seconds(ticks_per_s),
        }
    }

    pub(crate) fn since(&self, before: &CpuUse, events: u64) -> CpuPerEvent {
        let per = |now: f64, then: f64| (now - then).max(0.0) * 1e6 / events.max(1) as f64;
        CpuPerEvent {
            service_us: per(self.service, before.service),
            redis_us: per(self.redis, before.redis),
            // Per process: a backend that ended between the two readings (the `pgbench`
            // run's, just before) would otherwise count against the run.
            postgres_us: per(
                self.postgres
                    .iter()
                    .map(|(pid, now)| now - before.postgres.get(pid).copied().unwrap_or(0.0))
                    .sum(),
                0.0,
            ),
        }
    }
}

/// CPU seconds used so far by each process named `postgres` (the server and its backends;
/// one that exits takes its time with it, so a run's figure leaves out backends that ended
/// during it: pooled connections do not).
pub(crate) fn postgres_cpu_seconds(ticks_per_s: f64) -> std::collections::HashMap<u32, f64> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let (comm, ticks) = proc_cpu_ticks(&entry.path().join("stat"))?;
            (comm == "postgres").then(|| (pid, ticks as f64 / ticks_per_s))
        })
        .collect()
}

/// A process's `comm` and its user + system time in clock ticks, from `/proc/<pid>/stat`.
pub(crate) fn proc_cpu_ticks(path: &std::path::Path) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let comm = stat.get(open + 1..close)?.to_owned();
    // After the command: state is field 3 of the man page, utime 14 and stime 15.
    let fields: Vec<&str> = stat.get(close + 2..)?.split(' ').collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// `/proc`'s clock ticks per second (`getconf CLK_TCK`; 100 if that fails).
pub(crate) fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// A connection to the bench's database with an empty copy of `auth_events` named `table`,
/// a scratch directory for the baseline's files, and the time to stamp its rows with.
pub(crate) async fn scratch_copy_of_auth_events(
    url: &str,
    table: &'static str,
) -> Option<(sqlx::PgConnection, tempfile::TempDir, i64)> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await.ok()?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (LIKE auth_events INCLUDING ALL)"
    )))
    .execute(&mut conn)
    .await
    .ok()?;
    let dir = tempfile::tempdir().ok()?;
    Some((conn, dir, chrono::Utc::now().timestamp_millis()))
}

/// Writes Postgres's dirty pages out (`CHECKPOINT`) before a measured run.
pub(crate) async fn checkpoint(url: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .expect("a connection for CHECKPOINT");
    sqlx::query("CHECKPOINT")
        .execute(&mut conn)
        .await
        .expect("CHECKPOINT (the bench connects as a superuser)");
}

/// Rows per second `pgbench` inserts into a copy of `auth_events` for `seconds`: the issue's
/// other named baseline, "the raw insert rate of the same rows". Each transaction is one
/// `INSERT` of 500 literal rows shaped like the bench's events (ids made unique by the client
/// and a random number per transaction, accounts spread over ~100k), from 4 clients as the 4
/// posters; rows counted in the table afterwards. None without `pgbench`.
pub(crate) async fn pgbench_insert(url: &str, table: &'static str, seconds: u64) -> Option<f64> {
    let (mut conn, dir, now_ms) = scratch_copy_of_auth_events(url, table).await?;
    // pgbench puts the variables' values into the text (in quotes too) before sending it.
    let mut script = format!(
        "\\set b random(1, 1000000000000000)\n\\set a random(0, 199)\n\
         INSERT INTO {table} (event_id, kind, account, ip, device_id, endpoint, ts, received_at) VALUES\n",
    );
    for i in 0..500u64 {
        if i > 0 {
            script.push_str(",\n");
        }
        script.push_str(&format!(
            "('ev-:client_id-:b-{i}','login_failure','acct:a{i}','10.:client_id.{}.{}',NULL,NULL,{now_ms},{now_ms})",
            i >> 8 & 255,
            i & 255
        ));
    }
    script.push_str(";\n");
    let path = dir.path().join("insert.sql");
    std::fs::write(&path, script).ok()?;
    let started = Instant::now();
    let output = Command::new("pgbench")
        .args(["-n", "-c", "4", "-j", "2", "-T", &seconds.to_string(), "-f"])
        .arg(&path)
        .arg(url)
        .output()
        .ok()?;
    let elapsed = started.elapsed().as_secs_f64();
    assert!(
        output.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stored: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&mut conn)
            .await
            .ok()?;
    Some(stored as f64 / elapsed)
}

/// Rows per second of `COPY`ing `rows` rows like the bench's events into a copy of
/// `auth_events` in batches of 500, each `COPY` its own committed transaction, from 4 `psql`
/// processes at once (None without `psql`).
pub(crate) async fn batched_copy(url: &str, rows: u64) -> Option<f64> {
    let (mut conn, dir, now_ms) = scratch_copy_of_auth_events(url, "copy_batched").await?;
    let mut scripts = vec![String::new(); 4];
    for batch in 0..rows.div_ceil(500) {
        let mut csv = String::with_capacity(500 * 64);
        for i in batch * 500..(batch + 1) * 500 {
            csv.push_str(&format!(
                "batched-{i},login_failure,acct{},10.{}.{}.{},,,{now_ms},{now_ms}\n",
                i % 100_000,
                i >> 16 & 255,
                i >> 8 & 255,
                i & 255
            ));
        }
        let file = dir.path().join(format!("{batch}.csv"));
        std::fs::write(&file, csv).ok()?;
        scripts[(batch % 4) as usize].push_str(&format!(
            "\\copy copy_batched (event_id, kind, account, ip, device_id, endpoint, ts, received_at) from '{}' with (format csv)\n",
            file.display()
        ));
    }
    let mut paths = Vec::new();
    for (n, script) in scripts.iter().enumerate() {
        let path = dir.path().join(format!("s{n}.sql"));
        std::fs::write(&path, script).ok()?;
        paths.push(path);
    }
    let started = Instant::now();
    let children: Vec<std::process::Child> = paths
        .iter()
        .map(|path| {
            Command::new("psql")
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f"])
                .arg(path)
                .stdout(std::process::Stdio::null())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .ok()?;
    for child in children {
        assert!(
            child.wait_with_output().ok()?.status.success(),
            "psql COPY failed"
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM copy_batched")
        .fetch_one(&mut conn)
        .await
        .ok()?;
    assert_eq!(
        stored as u64,
        rows.div_ceil(500) * 500,
        "every batch stored"
    );
    Some(stored as f64 / elapsed)
}
