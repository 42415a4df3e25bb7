//! HTTP and Redis load benchmark of the limiter; figures as ratios against baselines measured
//! in the same run. Run with:
//!
//! ```sh
//! cargo bench --bench load            # LOAD_SECONDS=8 LOAD_CONCURRENCY=50 LOAD_KEYS=1000000
//! ```
//!
//! It starts its own `redis-server` on a free loopback port (stopped at the end) and:
//! 1. bytes per bucket key in Redis: our packed-double layout vs the field guide's HASH and
//!    two-number string, same key names, `INFO memory` delta ÷ `DBSIZE`;
//! 2. `POST /v1/limit/check` (4 scopes) over HTTP vs `redis-benchmark` EVALSHA of the same
//!    script with the same keys and arguments, at the same concurrency;
//!    `LOAD_ONLY=limit` runs it alone at concurrencies 1, 4, 8, 16, 50 (a latency curve; or
//!    the comma-separated `LOAD_CONCURRENCY`); `LOAD_COALESCE=0` turns coalescing off and
//!    `LOAD_SERVER_WORKERS=n` sets the service's tokio workers (also for ingest) and
//!    `LOAD_COALESCE_IN_FLIGHT=n` the script calls on their way before checks queue;
//!    `LOAD_WRK_THREADS=1` drives wrk from one thread, as redis-benchmark drives its own;
//! 3. a hot blocked key with and without the L1 cache;
//! 4. auth-event ingest vs a raw `COPY` of the same rows (`LOAD_ONLY=ingest` alone), once as
//!    one transaction and once in committed batches of 500 from 4 `psql` processes, and vs
//!    `pgbench` inserting such rows 500 a transaction from 4 clients, once before the run and
//!    once after it (the target's ratio is to the faster; each of the three starts at a
//!    `CHECKPOINT`); the CPU per event of this process, Redis and Postgres over the run
//!    (steadier than events/s here);
//!    `LOAD_INGEST_ACCOUNTS=1` sends every failure to one account (distributed brute force),
//!    `LOAD_INGEST_POSTERS=n` posts from n tasks (default 4), `LOAD_INGEST_RATE=N` paces
//!    them to N events/s in all, `LOAD_INGEST_HOT=memory` keeps the windows in process
//!    (no Redis: how far the service and Postgres go without it),
//!    `LOAD_REDIS_TIMEOUT_MS` sets the service's Redis command timeout (default 250);
//! 5. scoring (`LOAD_ONLY=scoring` alone): `GET /v1/multipliers` with L1 hits vs a static
//!    axum handler, both driven by `wrk`; request-telemetry ingest (batches of 5000) vs an
//!    axum handler that only parses the same bodies.
//!
//! Everything shares the machine's cores (server, load generator, Redis), as the baselines do.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use palisade::config::Secret;
use palisade::store::scripts::TOKEN_BUCKET;
use palisade::{App, Settings};
use rand::Rng;

/// The same allocator as the `palisade` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TOKEN: &str = "load-bench-bootstrap-token-0123456789";

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Redis {
    child: Child,
    port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Redis {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Redis { child, port }
}

/// The fields of one `INFO` section that parse as `T`, looked up by name.
async fn info_section<T: std::str::FromStr>(
    conn: &mut redis::aio::MultiplexedConnection,
    section: &str,
) -> impl Fn(&str) -> Option<T> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_default();
    move |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    }
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    info_section(conn, "memory").await("used_memory").expect("INFO memory has used_memory")
}

/// Fills `keys` buckets with `fill` (one pipelined batch at a time); returns bytes per key
/// from `INFO memory` and the `MEMORY USAGE` of one sample key.
async fn bytes_per_key(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: u64,
    fill: impl Fn(&mut redis::Pipeline, u64),
) -> (f64, i64, i64) {
    let _: () = redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query_async(conn)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = used_memory(conn).await;
    let mut i = 0;
    while i < keys {
        let mut pipe = redis::pipe();
        for k in i..(i + 2000).min(keys) {
            fill(&mut pipe, k);
        }
        let _: () = pipe.query_async(conn).await.unwrap();
        i += 2000;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = used_memory(conn).await;
    let count: i64 = redis::cmd("DBSIZE").query_async(conn).await.unwrap();
    let usage: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(bucket_key(7))
        .query_async(conn)
        .await
        .unwrap();
    ((after - before) as f64 / count as f64, count, usage)
}

fn bucket_key(i: u64) -> String {
    format!(
        "pal:v1:{{ip:10.{}.{}.{}}}:b:ip-anon",
        i >> 16 & 255,
        i >> 8 & 255,
        i & 255
    )
}

async fn memory_section(port: u16, keys: u64) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    let sha = TOKEN_BUCKET.get_hash().to_owned();
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(include_str!("../../lua/token_bucket.lua"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // 10 per hour: one request leaves a 6-minute TTL, so nothing expires while measuring.
    let ours = |pipe: &mut redis::Pipeline, k: u64| {
        let key = bucket_key(k);
        pipe.cmd("EVALSHA")
            .arg(&sha)
            .arg(2)
            .arg(&key)
            .arg(format!("{key}:m"))
            // One request: cost 1, consume, one scope.
            .arg(1)
            .arg(1)
            .arg(1)
            .arg(1)
            .arg(10)
            .arg(10.0 / 3600.0)
            .arg(1)
            .arg(1)
            .ignore();
    };
    let first = bytes_per_key(&mut conn, keys, ours).await;
    let hash = bytes_per_key(&mut conn, keys, |pipe, k| {
        let key = bucket_key(k);
        pipe.cmd("HSET")
            .arg(&key)
            .arg("tokens")
            .arg("9")
            .arg("ts")
            .arg("1764684000000")
            .ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(360_000).ignore();
    })
    .await;
    let string = bytes_per_key(&mut conn, keys, |pipe, k| {
        pipe.cmd("SET")
            .arg(bucket_key(k))
            .arg("9:1764684000000")
            .arg("PX")
            .arg(360_000)
            .ignore();
    })
    .await;
    let last = bytes_per_key(&mut conn, keys, ours).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let ours_bytes = (first.0 + last.0) / 2.0;
    println!(
        "\n## Bytes per bucket key in Redis ({} keys, key like `{}`)\n",
        first.1,
        bucket_key(7)
    );
    println!(
        "| layout | INFO used_memory Δ ÷ keys | MEMORY USAGE of one key | vs ours |\n|---|---|---|---|"
    );
    println!(
        "| palisade: packed double, PSETEX (measured first, last) | {:.1}, {:.1} | {} | 1.00 |",
        first.0, last.0, first.2
    );
    println!(
        "| field guide HASH `tokens`,`ts` + PEXPIRE | {:.1} | {} | {:.2} |",
        hash.0,
        hash.2,
        hash.0 / ours_bytes
    );
    println!(
        "| one string `\"tokens:ts\"` + PX | {:.1} | {} | {:.2} |",
        string.0,
        string.2,
        string.0 / ours_bytes
    );
}

struct Run {
    requests: u64,
    seconds: f64,
    latencies_us: Vec<u32>,
    statuses: [u64; 3],
}

impl Run {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
    fn percentile_ms(&self, p: f64) -> f64 {
        let index = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        f64::from(self.latencies_us[index]) / 1000.0
    }
}

/// Drives `/v1/limit/check` from `concurrency` tasks for `seconds` with bodies from `body`.
fn drive(
    base: &str,
    concurrency: u64,
    seconds: u64,
    body: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync>,
) -> Run {
    drive_with(
        base,
        concurrency,
        seconds,
        Arc::new(move |client, base, rng| {
            client
                .post(format!("{base}/v1/limit/check"))
                .header("content-type", "application/json")
                .body(body(rng))
        }),
    )
}

type MakeRequest = Arc<
    dyn Fn(&reqwest::Client, &str, &mut rand::rngs::ThreadRng) -> reqwest::RequestBuilder
        + Send
        + Sync,
>;

/// Sends requests made by `make` from `concurrency` tasks for `seconds`; records latency and
/// status of each.
fn drive_with(base: &str, concurrency: u64, seconds: u64, make: MakeRequest) -> Run {
    let runtime = two_workers();
    let base = base.to_owned();
    runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(concurrency as usize)
            .build()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (client, base, make) = (client.clone(), base.clone(), make.clone());
            tasks.spawn(async move {
                let mut latencies = Vec::new();
                let mut statuses = [0u64; 3];
                while Instant::now() < deadline {
                    let request = make(&client, &base, &mut rand::rng()).bearer_auth(TOKEN);
                    let sent = Instant::now();
                    let response = request.send().await.expect("palisade answers");
                    let status = response.status().as_u16();
                    let _ = response.bytes().await;
                    latencies.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                    statuses[match status {
                        200 => 0,
                        429 => 1,
                        _ => 2,
                    }] += 1;
                }
                (latencies, statuses)
            });
        }
        let mut run = Run {
            requests: 0,
            seconds: 0.0,
            latencies_us: Vec::new(),
            statuses: [0; 3],
        };
        while let Some(result) = tasks.join_next().await {
            let (latencies, statuses) = result.unwrap();
            run.requests += latencies.len() as u64;
            run.latencies_us.extend(latencies);
            for (total, n) in run.statuses.iter_mut().zip(statuses) {
                *total += n;
            }
        }
        run.seconds = started.elapsed().as_secs_f64();
        run.latencies_us.sort_unstable();
        run
    })
}

/// A Tokio runtime with two workers (one per core of the benchmark machine).
fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

struct Server {
    base: String,
    _runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn start_palisade(redis_port: u16, l1_ttl_ms: u64) -> Server {
    // `LOAD_SERVER_WORKERS`: the service's tokio workers (default 2, this machine's cores;
    // the binary takes `TOKIO_WORKER_THREADS`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("LOAD_SERVER_WORKERS", 2).max(1) as usize)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: format!("sqlite://{}", dir.path().join("bench.db").display()),
        redis_url: Some(format!("redis://127.0.0.1:{redis_port}")),
        bootstrap_token: Some(Secret::new(TOKEN)),
        ..Settings::default()
    };
    settings.limits.l1_ttl_ms = l1_ttl_ms;
    settings.limits.coalesce = std::env::var("LOAD_COALESCE").as_deref() != Ok("0");
    settings.limits.coalesce_in_flight = env_or("LOAD_COALESCE_IN_FLIGHT", 4) as u8;
    settings.store.redis_key_prefix = format!("l1x{l1_ttl_ms}");
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
    Server {
        base,
        _runtime: runtime,
        _dir: dir,
    }
}

/// `POST /v1/limit/check` with 4 scopes over HTTP (the Rust client and `wrk`) against
/// `redis-benchmark` EVALSHA of the same script and keys, at each concurrency in `levels`.
fn limit_http_section(redis_port: u16, server: &Server, levels: &[u64], seconds: u64) {
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
         ratio is against the redis-benchmark row of the same concurrency.\n"
    );
    println!(
        "| c | what | requests/s | p50 ms | p99 ms | p99.9 ms | ratio |\n|---|---|---|---|---|---|---|"
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
        );
        println!(
            "| {concurrency} | palisade HTTP, Rust client (200: {}, 429: {}, other: {}; server p99 <= {}) | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
            http.statuses[0],
            http.statuses[1],
            http.statuses[2],
            server_p99(http_server_p99),
            http.rps(),
            http.percentile_ms(0.5),
            http.percentile_ms(0.99),
            http.percentile_ms(0.999),
            http.rps() / raw_rps
        );
        if let Some((rps, p50, p99, p999, non_2xx, cpu_us)) = wrk {
            println!(
                "| {concurrency} | palisade HTTP, wrk -t{} (non-2xx: {non_2xx}; service CPU {cpu_us:.1} µs/request; server p99 <= {}) | {rps:.0} | {p50:.2} | {p99:.2} | {p999:.2} | {:.2} |",
                concurrency.clamp(1, env_or("LOAD_WRK_THREADS", 2).max(1)),
                server_p99(wrk_server_p99),
                rps / raw_rps
            );
        }
        println!(
            "| {concurrency} | redis-benchmark EVALSHA, same script and keys | {raw_rps:.0} | | {raw_p99:.2} | | 1.00 |"
        );
    }
}

/// Checks per second through `Limiter::check` (the library, no HTTP) on Redis, `concurrency`
/// tasks, the same 4-scope requests as the HTTP run, with `limits.coalesce` on or off; and
/// how many checks each `EVALSHA` carried (Redis `INFO commandstats`).
fn limiter_direct(
    redis_port: u16,
    concurrency: u64,
    seconds: u64,
    coalesce: bool,
) -> (f64, f64, f64) {
    let runtime = two_workers();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        database_url: format!("sqlite://{}", dir.path().join("bench.db").display()),
        redis_url: Some(format!("redis://127.0.0.1:{redis_port}")),
        ..Settings::default()
    };
    settings.limits.coalesce = coalesce;
    settings.limits.coalesce_in_flight = env_or("LOAD_COALESCE_IN_FLIGHT", 4) as u8;
    settings.store.redis_key_prefix = format!("direct-{coalesce}");
    let settings = settings.validate().unwrap();
    runtime.block_on(async move {
        let app = App::build(settings).await.unwrap().into_state();
        let client = redis::Client::open(format!("redis://127.0.0.1:{redis_port}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let calls_before = evalsha_calls(&mut conn).await;
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
        let (calls, usec) = evalsha_calls(&mut conn).await;
        let calls = (calls - calls_before.0).max(1);
        (
            rate,
            checks as f64 / calls as f64,
            (usec - calls_before.1) as f64 / checks.max(1) as f64,
        )
    })
}

/// `EVALSHA` calls so far and the Redis CPU they took, µs (`INFO commandstats`).
async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or("");
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("usec="))
}

/// Coalescing (`LOAD_ONLY=coalesce`): the limiter library's checks/s on Redis with one
/// script call per check and with coalesced calls, against `redis-benchmark` EVALSHA of the
/// same 4-scope call (one call per request) at the same concurrency, all in this run.
fn coalesce_section(redis_port: u16, concurrency: u64, seconds: u64) {
    let (single, single_per_call, single_us) =
        limiter_direct(redis_port, concurrency, seconds, false);
    let (coalesced, per_call, coalesced_us) =
        limiter_direct(redis_port, concurrency, seconds, true);
    let (raw_rps, _) = redis_benchmark(
        redis_port,
        concurrency,
        (single as u64 * seconds).max(100_000),
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

/// `redis-benchmark` EVALSHA of the 4-scope call `/v1/limit/check` makes for a read with
/// user and device (global, ip-authn, user-read, device): requests per second and p99.
fn redis_benchmark(port: u16, concurrency: u64, requests: u64) -> (f64, f64) {
    let sha = TOKEN_BUCKET.get_hash();
    let keys = [
        "rb:v1:{global}:b:global".to_owned(),
        "rb:v1:{global}:m:read".to_owned(),
        "rb:v1:{ip:__rand_int__}:b:ip-authn".to_owned(),
        "rb:v1:{ip:__rand_int__}:m:read".to_owned(),
        "rb:v1:{user:__rand_int__}:b:user-read".to_owned(),
        "rb:v1:{user:__rand_int__}:m:read".to_owned(),
        "rb:v1:{device:__rand_int__}:b:device".to_owned(),
        "rb:v1:{device:__rand_int__}:m:read".to_owned(),
    ];
    // One request (one call per request: the rate coalescing must beat): cost 1, consume,
    // 4 scopes; per scope: capacity, refill/s, enforce, default multiplier.
    let args = [
        "1", "1", "1", "4", "100000", "100000", "1", "1", "600", "10", "1", "1", "300", "5", "1",
        "1", "600", "10", "1", "1",
    ];
    let output = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            &concurrency.to_string(),
            "-n",
            &requests.to_string(),
        ])
        .args(["-r", "100000", "--csv", "EVALSHA", sha, "8"])
        .args(&keys)
        .args(args)
        .output()
        .expect("redis-benchmark on PATH");
    let text = String::from_utf8_lossy(&output.stdout);
    let row = text.lines().last().expect("redis-benchmark output");
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|f| f.trim_matches('"').parse().ok())
        .collect();
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    (fields[0], fields[5])
}

const WRK_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
request = function()
  local n = math.random(0, 99999)
  local body = string.format('{"endpoint":"/v1/feed","ip":"10.%d.%d.%d","user_id":"u%d","device_id":"d%d"}',
    math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256, n, n)
  return wrk.format(nil, nil, nil, body)
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %d %f %f %f %f %d\n", summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000,
    summary.errors.status))
end
"#;

/// `wrk` (C, like redis-benchmark) driving the same 4-scope bodies: (requests/s, p50, p99,
/// p99.9 ms, non-2xx), or None when wrk is not installed (`apt-get install wrk`).
fn wrk(base: &str, concurrency: u64, seconds: u64) -> Option<(f64, f64, f64, f64, u64, f64)> {
    let dir = tempfile::tempdir().ok()?;
    // wrk is another process: this process's CPU meanwhile is the service's (its Rust client
    // is idle), so the service's CPU per request is measured without the load generator's.
    let cpu_before = process_cpu_seconds();
    let script = dir.path().join("check.lua");
    std::fs::write(&script, WRK_SCRIPT.replace("TOKEN", TOKEN)).ok()?;
    let output = Command::new("wrk")
        .args([
            // wrk needs a connection per thread at least. `LOAD_WRK_THREADS=1` matches
            // redis-benchmark, which drives its connections from one thread.
            &format!(
                "-t{}",
                concurrency.clamp(1, env_or("LOAD_WRK_THREADS", 2).max(1))
            ),
            &format!("-c{concurrency}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(&script)
        .arg(format!("{base}/v1/limit/check"))
        .output()
        .ok()?;
    let cpu = process_cpu_seconds() - cpu_before;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|l| l.starts_with("WRK "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((v[0] / v[1], v[2], v[3], v[4], v[5] as u64, cpu / v[0] * 1e6))
}

/// User + system CPU of this process so far, seconds (`/proc/self/stat`, 100 ticks/s).
fn process_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let ticks: Vec<f64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    ticks.iter().sum::<f64>() / 100.0
}

/// A fresh Postgres database for the ingest section, dropped at the end.
struct BenchDatabase {
    admin: String,
    name: String,
    url: String,
}

impl BenchDatabase {
    async fn create() -> BenchDatabase {
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

    async fn drop_it(self) {
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
fn auth_batch(first: u64, accounts: u64, now: chrono::DateTime<chrono::Utc>) -> String {
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
fn ingest_section(redis_port: u16, seconds: u64) {
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
struct CpuUse {
    service: f64,
    redis: f64,
    /// Per `postgres` process (pid): CPU seconds so far.
    postgres: std::collections::HashMap<u32, f64>,
}

/// [`CpuUse`] differences per event, in µs.
struct CpuPerEvent {
    service_us: f64,
    redis_us: f64,
    postgres_us: f64,
}

impl CpuPerEvent {
    fn total_us(&self) -> f64 {
        self.service_us + self.redis_us + self.postgres_us
    }

    /// Events/s if the cores did nothing but this work.
    fn ceiling(&self) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        cores * 1e6 / self.total_us().max(f64::MIN_POSITIVE)
    }
}

impl CpuUse {
    async fn now(redis: &mut redis::aio::MultiplexedConnection) -> CpuUse {
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

    fn since(&self, before: &CpuUse, events: u64) -> CpuPerEvent {
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
fn postgres_cpu_seconds(ticks_per_s: f64) -> std::collections::HashMap<u32, f64> {
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
fn proc_cpu_ticks(path: &std::path::Path) -> Option<(String, u64)> {
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
fn clock_ticks() -> f64 {
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
async fn scratch_copy_of_auth_events(
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
async fn checkpoint(url: &str) {
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
async fn pgbench_insert(url: &str, table: &'static str, seconds: u64) -> Option<f64> {
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
async fn batched_copy(url: &str, rows: u64) -> Option<f64> {
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

/// The server's request-duration histogram for `route`: (upper bound s, cumulative count)
/// per bucket, in order.
async fn server_buckets(base: &str, route: &str) -> Option<Vec<(f64, f64)>> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let prefix = "palisade_http_request_duration_seconds_bucket{";
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(&format!("route=\"{route}\"")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count: f64 = l.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(buckets)
}

/// The upper bound of the bucket holding quantile `q` of cumulative `buckets`.
fn percentile_of(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map(|(le, _)| *le)
}

const LIMIT_ROUTE: &str = "/v1/limit/check";

/// Cumulative bucket counts of `after` less those of `before`: the requests in between.
fn since(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(le, n)| {
            let earlier = before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
            (le, n - earlier)
        })
        .collect()
}

/// The server's own p99 (upper bound of its histogram bucket, s) for `route` over the
/// requests `run` sends: time inside Palisade, without the client's share of the machine,
/// so a client's tail can be told apart from the service's.
fn server_p99_during<T>(base: &str, route: &str, run: impl FnOnce() -> T) -> (T, Option<f64>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = runtime
        .block_on(server_buckets(base, route))
        .unwrap_or_default();
    let out = run();
    let after = runtime
        .block_on(server_buckets(base, route))
        .unwrap_or_default();
    (out, percentile_of(&since(&before, &after), 0.99))
}

/// Like [`drive`] for `GET /v1/accounts/{account}/status?ip=…` (`path` returns `account?ip=…`).
fn drive_get(
    base: &str,
    concurrency: u64,
    seconds: u64,
    path: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync>,
) -> Run {
    drive_with(
        base,
        concurrency,
        seconds,
        Arc::new(move |client, base, rng| {
            client.get(format!(
                "{base}/v1/accounts/{}",
                path(rng).replacen('?', "/status?", 1)
            ))
        }),
    )
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds = env_or(
        "LOAD_SECONDS",
        if std::env::var("CI").is_ok() { 2 } else { 8 },
    );
    let concurrency = env_or("LOAD_CONCURRENCY", 50);
    let keys = env_or("LOAD_KEYS", 1_000_000);
    // The service's own logging (text to stderr, RUST_LOG default info): request spans cost
    // what they cost in production.
    palisade::telemetry::init(palisade::config::LogFormat::Text);
    let redis = start_redis();
    match std::env::var("LOAD_ONLY").as_deref() {
        Ok("ingest") => return ingest_section(redis.port, seconds),
        Ok("scoring") => return scoring_section(redis.port, seconds, concurrency),
        Ok("flood") => return flood_section(env_or("LOAD_FLOOD_KEYS", 1_000_000)),
        Ok("mixed") => return mixed_section(redis.port, seconds),
        Ok("coalesce") => return coalesce_section(redis.port, concurrency, seconds),
        Ok("limit") => {
            // A latency curve: each concurrency against the raw script at the same one.
            let levels: Vec<u64> = match std::env::var("LOAD_CONCURRENCY") {
                Ok(list) => list
                    .split(',')
                    .filter_map(|c| c.trim().parse().ok())
                    .collect(),
                Err(_) => vec![1, 4, 8, 16, 50],
            };
            let server = start_palisade(redis.port, 250);
            return limit_http_section(redis.port, &server, &levels, seconds);
        }
        _ => {}
    }
    println!(
        "# Palisade load benchmark ({} cores, {seconds} s per HTTP run, concurrency {concurrency})",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(memory_section(redis.port, keys));

    let server = start_palisade(redis.port, 250);
    limit_http_section(redis.port, &server, &[concurrency], seconds);

    coalesce_section(redis.port, concurrency, seconds);
    ingest_section(redis.port, seconds);
    scoring_section(redis.port, seconds, concurrency);

    let hot_blocked: Arc<dyn Fn(&mut rand::rngs::ThreadRng) -> String + Send + Sync> =
        Arc::new(|_| {
            r#"{"endpoint":"/auth/login","method":"POST","ip":"10.9.9.9","user_id":"victim"}"#
                .to_owned()
        });
    let with_l1 = drive(&server.base, concurrency, seconds, hot_blocked.clone());
    let no_l1_server = start_palisade(redis.port, 0);
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

const WRK_GET_SCRIPT: &str = r#"
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer TOKEN"
request = function()
  local n = math.random(0, KEYS - 1)
  return wrk.format(nil, string.format(PATH, n % 256, n, n))
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %d %f %f %f %f %d\n", summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000,
    summary.errors.status))
end
"#;

/// `wrk -t2` GETs of `path` (a format with `%d` for an IP octet, a user and a device number
/// below `keys`): (requests/s, p50, p99, p99.9 ms, non-2xx), None without wrk.
fn wrk_get(
    base: &str,
    path: &str,
    keys: u64,
    concurrency: u64,
    seconds: u64,
) -> Option<(f64, f64, f64, f64, u64)> {
    let dir = tempfile::tempdir().ok()?;
    let script = dir.path().join("get.lua");
    let body = WRK_GET_SCRIPT
        .replace("TOKEN", TOKEN)
        .replace("KEYS", &keys.to_string())
        .replace("PATH", &format!("{path:?}"));
    std::fs::write(&script, body).ok()?;
    let output = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{concurrency}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(&script)
        .arg(base)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|l| l.starts_with("WRK "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((v[0] / v[1], v[2], v[3], v[4], v[5] as u64))
}

/// Posts `batches` of telemetry from `posters` tasks for `seconds` to `url`; events/s.
async fn post_batches(
    url: String,
    posters: u64,
    seconds: u64,
    batch: Arc<Vec<serde_json::Value>>,
) -> f64 {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..posters {
        let (client, url, batch) = (client.clone(), url.clone(), batch.clone());
        tasks.spawn(async move {
            let body = serde_json::to_vec(&serde_json::json!({ "events": *batch })).unwrap();
            let mut sent = 0u64;
            while Instant::now() < deadline {
                let response = client
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(
                    response.status(),
                    200,
                    "{}",
                    response.text().await.unwrap_or_default()
                );
                sent += batch.len() as u64;
            }
            sent
        });
    }
    let mut total = 0;
    while let Some(sent) = tasks.join_next().await {
        total += sent.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Scoring: `/v1/multipliers` (L1 hits) vs a static axum handler, and telemetry ingest vs a
/// parse-only handler, on Postgres + Redis.
fn scoring_section(redis_port: u16, seconds: u64, concurrency: u64) {
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

/// Resident memory of this process, KiB (`VmRSS`).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Key-cardinality flood (`LOAD_ONLY=flood`): `keys` checks, each from a new random user id
/// and IP, through an embedded instance's limiter and scoring (what `/v1/limit/check` does
/// after parsing), printing resident memory and tracked keys as it goes.
fn flood_section(keys: u64) {
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
fn mixed_section(redis_port: u16, seconds: u64) {
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
