//! Load drivers (in-process HTTP clients, wrk) and the service under test.

use super::*;

pub(crate) struct Run {
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) latencies_us: Vec<u32>,
    pub(crate) statuses: [u64; 3],
}

impl Run {
    pub(crate) fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }
    pub(crate) fn percentile_ms(&self, p: f64) -> f64 {
        let index = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        f64::from(self.latencies_us[index]) / 1000.0
    }
}

/// Drives `/v1/limit/check` from `concurrency` tasks for `seconds` with bodies from `body`.
pub(crate) fn drive(
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

pub(crate) type MakeRequest = Arc<
    dyn Fn(&reqwest::Client, &str, &mut rand::rngs::ThreadRng) -> reqwest::RequestBuilder
        + Send
        + Sync,
>;

/// Sends requests made by `make` from `concurrency` tasks for `seconds`; records latency and
/// status of each.
pub(crate) fn drive_with(base: &str, concurrency: u64, seconds: u64, make: MakeRequest) -> Run {
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
pub(crate) fn two_workers() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub(crate) struct Server {
    pub(crate) base: String,
    /// The Envoy rate limit service, when started.
    pub(crate) grpc: Option<SocketAddr>,
    pub(crate) _runtime: tokio::runtime::Runtime,
    pub(crate) _dir: tempfile::TempDir,
}

/// The name of the service runtime's threads ([`service_cpu_seconds`] counts them).
pub(crate) const SERVICE_THREAD: &str = "palisade-svc";

pub(crate) fn start_palisade(redis_port: u16, l1_ttl_ms: u64) -> Server {
    start_palisade_on(Some(redis_port), l1_ttl_ms, false)
}

/// The service on Redis, or on in-process buckets (the embedded default) without
/// `redis_port`; with `grpc`, the Envoy rate limit service too.
pub(crate) fn start_palisade_on(redis_port: Option<u16>, l1_ttl_ms: u64, grpc: bool) -> Server {
    start_palisade_with(redis_port, l1_ttl_ms, grpc, |_| {})
}

/// [`start_palisade_on`] with `tweak` applied to its settings before they are validated.
pub(crate) fn start_palisade_with(
    redis_port: Option<u16>,
    l1_ttl_ms: u64,
    grpc: bool,
    tweak: impl FnOnce(&mut Settings),
) -> Server {
    // `LOAD_SERVER_WORKERS`: the service's tokio workers (default 2, this machine's cores;
    // the binary takes `http.workers`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(env_or("LOAD_SERVER_WORKERS", 2).max(1) as usize)
        .thread_name(SERVICE_THREAD)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        database_url: format!("sqlite://{}", dir.path().join("bench.db").display()),
        redis_url: redis_port.map(|port| format!("redis://127.0.0.1:{port}")),
        bootstrap_token: Some(Secret::new(TOKEN)),
        ..Settings::default()
    };
    settings.limits.l1_ttl_ms = l1_ttl_ms;
    settings.limits.coalesce = std::env::var("LOAD_COALESCE").as_deref() != Ok("0");
    settings.limits.coalesce_in_flight = env_or("LOAD_COALESCE_IN_FLIGHT", 4) as u8;
    settings.store.redis_key_prefix = format!("l1x{l1_ttl_ms}");
    tweak(&mut settings);
    let settings = settings.validate().unwrap();
    let (base, grpc) = runtime.block_on(async {
        let app = App::build(settings.clone()).await.unwrap().into_state();
        let listener = tokio::net::TcpListener::bind(settings.listen)
            .await
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let grpc = if grpc {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            tokio::spawn(palisade::api::envoy::serve(
                app.clone(),
                listener,
                std::future::pending(),
            ));
            Some(address)
        } else {
            None
        };
        tokio::spawn(palisade::serve(app, listener, std::future::pending()));
        (base, grpc)
    });
    Server {
        base,
        grpc,
        _runtime: runtime,
        _dir: dir,
    }
}

/// User + system CPU of the service runtime's threads so far, seconds (each thread's
/// `/proc/self/task/<tid>/stat`, 100 ticks/s): the service's own, whatever else this
/// process runs (an in-process load generator).
pub(crate) fn service_cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).ok()?;
            if comm.trim_end() != SERVICE_THREAD {
                return None;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            Some(stat_cpu_seconds(&stat))
        })
        .sum()
}

/// utime + stime of a `/proc/…/stat` line, seconds.
fn stat_cpu_seconds(stat: &str) -> f64 {
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let ticks: f64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<f64>().ok())
        .sum();
    ticks / 100.0
}

pub(crate) const WRK_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
request = function()
  local n = math.random(0, 99999)
  local body = string.format('{"endpoint":"/v1/feed","ip":"10.%d.%d.%d","user_id":"u%d","device_id":"d%d"}',
    math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256, n, n)
  return wrk.format(nil, nil, nil, body)
end
"#;

/// `wrk` (C, like redis-benchmark) driving the same 4-scope bodies: (requests/s, p50, p99,
/// p99.9 ms, non-2xx), or None when wrk is not installed (`apt-get install wrk`).
pub(crate) fn wrk(
    base: &str,
    concurrency: u64,
    seconds: u64,
) -> Option<(f64, f64, f64, f64, u64, f64)> {
    // wrk is another process: this process's CPU meanwhile is the service's (its Rust client
    // is idle), so the service's CPU per request is measured without the load generator's.
    // `LOAD_WRK_THREADS=1` matches redis-benchmark, which drives its connections from one
    // thread (wrk needs a connection per thread at least).
    let cpu_before = process_cpu_seconds();
    let run = wrk_script(
        &WRK_SCRIPT.replace("TOKEN", TOKEN),
        &format!("{base}/v1/limit/check"),
        env_or("LOAD_WRK_THREADS", 2).max(1),
        concurrency,
        seconds,
    )?;
    let cpu = process_cpu_seconds() - cpu_before;
    Some((
        run.rps(),
        run.p50_ms,
        run.p99_ms,
        run.p999_ms,
        run.non_2xx,
        cpu / run.requests * 1e6,
    ))
}

/// User + system CPU of this process so far, seconds (`/proc/self/stat`, 100 ticks/s).
pub(crate) fn process_cpu_seconds() -> f64 {
    stat_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

/// The server's request-duration histogram for `route`: (upper bound s, cumulative count)
/// per bucket, in order.
pub(crate) async fn server_buckets(base: &str, route: &str) -> Option<Vec<(f64, f64)>> {
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
pub(crate) fn percentile_of(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map(|(le, _)| *le)
}

pub(crate) const LIMIT_ROUTE: &str = "/v1/limit/check";

/// Cumulative bucket counts of `after` less those of `before`: the requests in between.
pub(crate) fn since(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
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
pub(crate) fn server_p99_during<T>(
    base: &str,
    route: &str,
    run: impl FnOnce() -> T,
) -> (T, Option<f64>) {
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
pub(crate) fn drive_get(
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

pub(crate) const WRK_GET_SCRIPT: &str = r#"
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer TOKEN"
request = function()
  local n = math.random(0, KEYS - 1)
  return wrk.format(nil, string.format(PATH, n % 256, n, n))
end
"#;

/// `wrk -t2` GETs of `path` (a format with `%d` for an IP octet, a user and a device number
/// below `keys`): (requests/s, p50, p99, p99.9 ms, non-2xx), None without wrk.
pub(crate) fn wrk_get(
    base: &str,
    path: &str,
    keys: u64,
    concurrency: u64,
    seconds: u64,
) -> Option<(f64, f64, f64, f64, u64)> {
    let script = WRK_GET_SCRIPT
        .replace("TOKEN", TOKEN)
        .replace("KEYS", &keys.to_string())
        .replace("PATH", &format!("{path:?}"));
    let run = wrk_script(&script, base, 2, concurrency, seconds)?;
    Some((run.rps(), run.p50_ms, run.p99_ms, run.p999_ms, run.non_2xx))
}

/// What one wrk run reports (its script's `done` prints the `WRK` line).
pub(crate) struct WrkRun {
    pub(crate) requests: f64,
    pub(crate) seconds: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    pub(crate) non_2xx: u64,
}

impl WrkRun {
    pub(crate) fn rps(&self) -> f64 {
        self.requests / self.seconds
    }
}

/// What every wrk script ends with: the `WRK` line [`wrk_script`] reads.
const WRK_DONE: &str = r#"
done = function(summary, latency, requests)
  io.write(string.format("WRK %d %f %f %f %f %d\n", summary.requests, summary.duration / 1e6,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000,
    summary.errors.status))
end
"#;

/// Runs wrk with the Lua `script` (its `done` added here) against `url`; None when wrk is
/// not installed.
pub(crate) fn wrk_script(
    script: &str,
    url: &str,
    threads: u64,
    concurrency: u64,
    seconds: u64,
) -> Option<WrkRun> {
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join("script.lua");
    std::fs::write(&path, format!("{script}{WRK_DONE}")).ok()?;
    let output = Command::new("wrk")
        .args([
            &format!("-t{}", threads.clamp(1, concurrency.max(1))),
            &format!("-c{concurrency}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(&path)
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find(|l| l.starts_with("WRK "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some(WrkRun {
        requests: v[0],
        seconds: v[1],
        p50_ms: v[2],
        p99_ms: v[3],
        p999_ms: v[4],
        non_2xx: v[5] as u64,
    })
}

/// Posts `batches` of telemetry from `posters` tasks for `seconds` to `url`; events/s.
pub(crate) async fn post_batches(
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

/// Resident memory of this process, KiB (`VmRSS`).
pub(crate) fn rss_kib() -> u64 {
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
