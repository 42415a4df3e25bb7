//! One decision through each way in (`LOAD_ONLY=paths`): the JSON check on Redis and on
//! in-process buckets (the embedded default), the JSON check pipelined 8 deep, forward-auth
//! and Envoy's `ShouldRateLimit`, and `GET /healthz` through the same server for the floor of
//! any request (and through a bare axum server on the same runtime, for the floor without
//! Palisade's middleware and routes).

use super::*;
use palisade::api::envoy::proto::{
    Code, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient,
};

/// wrk's forward-auth requests: the same 4 scopes as the JSON check (global, IP, user,
/// device; 100k random keys), as a gateway's headers.
const WRK_FORWARD_SCRIPT: &str = r#"
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer TOKEN"
wrk.headers["X-Forwarded-Method"] = "GET"
wrk.headers["X-Forwarded-Uri"] = "/v1/feed"
request = function()
  local n = math.random(0, 99999)
  wrk.headers["X-Forwarded-For"] = string.format("10.%d.%d.%d",
    math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
  wrk.headers["X-User-Id"] = "u" .. n
  wrk.headers["X-Device-Id"] = "d" .. n
  return wrk.format(nil, "/v1/forward-auth")
end
"#;

/// wrk's 4-scope JSON checks, 8 pipelined on each connection (HTTP/1.1): what a client that
/// sends its next checks before the answers come saves per decision.
const WRK_PIPELINED_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
request = function()
  local checks = {}
  for i = 1, 8 do
    local n = math.random(0, 99999)
    local body = string.format('{"endpoint":"/v1/feed","ip":"10.%d.%d.%d","user_id":"u%d","device_id":"d%d"}',
      math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256, n, n)
    checks[i] = wrk.format(nil, nil, nil, body)
  end
  return table.concat(checks)
end
"#;

/// wrk's `GET /healthz`: a static answer through the same server, middleware and runtime,
/// so the floor every decision over HTTP pays on this machine.
const WRK_FLOOR_SCRIPT: &str = r#"
request = function()
  return wrk.format("GET", "/healthz")
end
"#;

/// One row: decisions/s, the service's CPU per decision (µs), refusals or errors.
struct PathRun {
    rps: f64,
    cpu_us: f64,
    not_ok: u64,
}

/// Runs `load` and measures the service runtime's CPU over it.
fn measured(load: impl FnOnce() -> Option<(f64, f64, u64)>) -> Option<PathRun> {
    let before = service_cpu_seconds();
    let (requests, seconds, not_ok) = load()?;
    let cpu = service_cpu_seconds() - before;
    Some(PathRun {
        rps: requests / seconds,
        cpu_us: cpu / requests * 1e6,
        not_ok,
    })
}

fn wrk_run(script: &str, url: &str, concurrency: u64, seconds: u64) -> Option<(f64, f64, u64)> {
    let run = wrk_script(
        &script.replace("TOKEN", TOKEN),
        url,
        env_or("LOAD_WRK_THREADS", 2).max(1),
        concurrency,
        seconds,
    )?;
    Some((run.requests, run.seconds, run.non_2xx))
}

/// `ShouldRateLimit` from `concurrency` tasks of this process over two HTTP/2 connections
/// (as Envoy keeps a few to its rate limit service), the same 4 scopes as descriptors:
/// (calls, seconds, calls that failed or were over the limit).
fn grpc_run(address: SocketAddr, concurrency: u64, seconds: u64) -> (f64, f64, u64) {
    let runtime = two_workers();
    runtime.block_on(async move {
        let mut channels = Vec::new();
        for _ in 0..2 {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .unwrap()
                .connect()
                .await
                .expect("connect to the gRPC service");
            channels.push(channel);
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..concurrency)
            .map(|i| {
                let channel = channels[i as usize % channels.len()].clone();
                tokio::spawn(async move {
                    let mut client = RateLimitServiceClient::new(channel);
                    let (mut calls, mut not_ok) = (0u64, 0u64);
                    while Instant::now() < deadline {
                        let n: u32 = rand::rng().random_range(0..100_000);
                        let ip = format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255);
                        let entry = |key: &str, value: String| RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.to_owned(),
                                value,
                            }],
                            ..RateLimitDescriptor::default()
                        };
                        let request = RateLimitRequest {
                            domain: "edge".to_owned(),
                            descriptors: vec![
                                entry("remote_address", ip),
                                entry("user_id", format!("u{n}")),
                                entry("device_id", format!("d{n}")),
                                entry("path", "/v1/feed".to_owned()),
                            ],
                            hits_addend: 0,
                        };
                        let mut request = tonic::Request::new(request);
                        request
                            .metadata_mut()
                            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
                        let answer: Result<tonic::Response<RateLimitResponse>, _> =
                            client.should_rate_limit(request).await;
                        calls += 1;
                        not_ok += u64::from(
                            answer.map_or(true, |a| a.get_ref().overall_code != Code::Ok as i32),
                        );
                    }
                    (calls, not_ok)
                })
            })
            .collect();
        let (mut calls, mut not_ok) = (0, 0);
        for task in tasks {
            let (c, n) = task.await.unwrap();
            calls += c;
            not_ok += n;
        }
        (calls as f64, started.elapsed().as_secs_f64(), not_ok)
    })
}

/// The table: each way in at concurrency `concurrency` against `redis-benchmark` EVALSHA of
/// the 4-scope and the one-scope script in the same run.
pub(crate) fn paths_section(redis_port: u16, concurrency: u64, seconds: u64) {
    let redis = start_palisade_on(Some(redis_port), 250, true);
    let embedded = start_palisade_on(None, 250, false);
    // A bare axum server on the service's runtime (its threads are the ones measured): what
    // the same runtime and HTTP stack cost without Palisade's middleware and routes.
    let bare = embedded._runtime.block_on(async {
        let router = axum::Router::new().route(
            "/healthz",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        base
    });
    // Load the script so redis-benchmark's EVALSHA finds it.
    let warm = drive(
        &redis.base,
        4,
        1,
        Arc::new(|_| r#"{"endpoint":"/v1/feed","ip":"10.0.0.1"}"#.to_owned()),
    );
    assert!(warm.requests > 0);
    println!(
        "\n## One 4-scope decision through each way in, c={concurrency}\n\n\
         Global, IP, user and device scopes over 100k random keys; HTTP driven by wrk (another\n\
         process), gRPC by {concurrency} tasks of this process over two HTTP/2 connections. CPU is the\n\
         service runtime's threads' own (`/proc/self/task`), per decision.\n"
    );
    println!(
        "| way in | store | decisions/s | service CPU µs/decision | not 200/OK | ratio to 4-scope EVALSHA | ratio to 1-scope EVALSHA |\n|---|---|---|---|---|---|---|"
    );
    let url = |server: &Server, path: &str| format!("{}{path}", server.base);
    let runs = [
        (
            "`POST /v1/limit/check` (JSON)",
            "Redis",
            measured(|| {
                wrk_run(
                    WRK_SCRIPT,
                    &url(&redis, "/v1/limit/check"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "`POST /v1/limit/check` (JSON)",
            "in process",
            measured(|| {
                wrk_run(
                    WRK_SCRIPT,
                    &url(&embedded, "/v1/limit/check"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "`POST /v1/limit/check` (JSON), 8 pipelined per connection",
            "Redis",
            measured(|| {
                wrk_run(
                    WRK_PIPELINED_SCRIPT,
                    &url(&redis, "/v1/limit/check"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "`POST /v1/limit/check` (JSON), 8 pipelined per connection",
            "in process",
            measured(|| {
                wrk_run(
                    WRK_PIPELINED_SCRIPT,
                    &url(&embedded, "/v1/limit/check"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "`GET /v1/forward-auth` (headers)",
            "Redis",
            measured(|| {
                wrk_run(
                    WRK_FORWARD_SCRIPT,
                    &url(&redis, "/v1/forward-auth"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "Envoy `ShouldRateLimit` (gRPC)",
            "Redis",
            measured(|| {
                Some(grpc_run(
                    redis.grpc.expect("started with gRPC"),
                    concurrency,
                    seconds,
                ))
            }),
        ),
        (
            "`GET /healthz`: no decision, the HTTP floor",
            "–",
            measured(|| {
                wrk_run(
                    WRK_FLOOR_SCRIPT,
                    &url(&embedded, "/healthz"),
                    concurrency,
                    seconds,
                )
            }),
        ),
        (
            "`GET /healthz` of a bare axum server on the same runtime",
            "–",
            measured(|| {
                wrk_run(
                    WRK_FLOOR_SCRIPT,
                    &format!("{bare}/healthz"),
                    concurrency,
                    seconds,
                )
            }),
        ),
    ];
    let fastest = runs
        .iter()
        .filter_map(|(_, _, run)| run.as_ref().map(|r| r.rps))
        .fold(50_000.0, f64::max);
    let requests = (fastest * seconds as f64) as u64;
    let (four, _) = redis_benchmark(redis_port, concurrency, requests, true);
    let (one, _) = redis_benchmark(redis_port, concurrency, requests, false);
    for (way, store, run) in runs {
        match run {
            Some(run) => println!(
                "| {way} | {store} | {:.0} | {:.1} | {} | {:.2} | {:.2} |",
                run.rps,
                run.cpu_us,
                run.not_ok,
                run.rps / four,
                run.rps / one
            ),
            None => println!("| {way} | {store} | (wrk is not installed) | | | | |"),
        }
    }
    println!(
        "| redis-benchmark EVALSHA, 4-scope script | Redis | {four:.0} | | | 1.00 | {:.2} |",
        four / one
    );
    println!(
        "| redis-benchmark EVALSHA, one scope (a plain token bucket) | Redis | {one:.0} | | | {:.2} | 1.00 |",
        one / four
    );
}

/// wrk's `POST /otp/send` checks of a signed-in user's device (global, IP, device scopes),
/// with a recipient in `RECIPIENT` (a Lua expression) or none.
const WRK_MESSAGING_SCRIPT: &str = r#"
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer TOKEN"
local countries = { {"+44 7", 9}, {"+33 6", 8}, {"+49 15", 9}, {"+1 2", 9}, {"+91 9", 9}, {"+61 4", 8} }
-- Each thread of each run its own numbers (wrk seeds every thread's Lua alike).
init = function(args)
  local address = tonumber(tostring({}):match("0x(%x+)"), 16) or 0
  math.randomseed(os.time() * 1000003 + address % 1000003)
end
-- Every connection paced to the same rate in every run: the CPU per decision is compared at
-- one rate, not at each run's own saturation.
delay = function() return DELAY_MS end
request = function()
  local n = math.random(0, 99999)
  local recipient = RECIPIENT
  local field = ""
  if recipient ~= nil then field = string.format(',"recipient":"%s"', recipient) end
  local body = string.format('{"endpoint":"/otp/send","method":"POST","ip":"10.%d.%d.%d","user_id":"u%d","device_id":"d%d"%s}',
    math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256, n, n, field)
  return wrk.format(nil, nil, nil, body)
end
"#;

/// A phone number never seen before: one of six countries' mobile ranges, random digits.
const FIRST_SEEN_PHONE: &str = r#"(function()
  local c = countries[math.random(1, #countries)]
  local digits = ""
  for i = 1, c[2] do digits = digits .. math.random(0, 9) end
  return c[1] .. digits
end)()"#;

/// An e-mail address never seen before (its parse is a fraction of a phone number's).
const FIRST_SEEN_EMAIL: &str =
    r#"string.format("user%d.%d@example%d.com", n, math.random(0, 999999), n % 50)"#;

/// One of a thousand UK numbers (a resend, a flood, a pump's range): remembered.
const REMEMBERED_PHONE: &str = r#"string.format("+44 7700 900%03d", n % 1000)"#;

/// A messaging check with a recipient against the same check without one
/// (`LOAD_ONLY=recipient`), on Redis and in process, A B B A: the recipient adds its parse
/// and two scopes (the recipient's and its destination's budgets) to the same one-call
/// decision. Every run is paced to `LOAD_RECIPIENT_RATE` checks/s (default 10,000, below
/// either's saturation on this machine). The recipient's and destination's budgets are raised so that the runs are
/// decisions to admit, as the runs without are (a refusal is answered from L1 after the
/// first).
pub(crate) fn recipient_section(redis_port: u16, concurrency: u64, seconds: u64) {
    let roomy = |settings: &mut Settings| {
        for budget in &mut settings.limits.budgets {
            if budget.name == "otp-destination" || budget.name == "otp-recipient" {
                budget.limit = 1_000_000_000;
            }
        }
    };
    let redis = start_palisade_with(Some(redis_port), 250, false, roomy);
    let embedded = start_palisade_with(None, 250, false, roomy);
    println!(
        "\n## A messaging check with and without a recipient, c={concurrency}, A B B A\n\n\
         `POST /v1/limit/check` of `/otp/send` from a signed-in user's device (global, IP and\n\
         device scopes, 100k random keys), by wrk at {} checks/s; a recipient adds its scopes.\n\
         Service CPU per decision, the mean of the two runs of each.\n",
        env_or("LOAD_RECIPIENT_RATE", 10_000)
    );
    println!(
        "| store | recipient | decisions/s | service CPU µs/decision | not 200 | CPU ratio to none |\n|---|---|---|---|---|---|"
    );
    for (store, server) in [("Redis", &redis), ("in process", &embedded)] {
        let url = format!("{}/v1/limit/check", server.base);
        let delay_ms = concurrency as f64 * 1000.0 / env_or("LOAD_RECIPIENT_RATE", 10_000) as f64;
        let script = |recipient: &str| {
            WRK_MESSAGING_SCRIPT
                .replace("RECIPIENT", recipient)
                .replace("DELAY_MS", &format!("{delay_ms:.3}"))
        };
        for (label, recipient) in [
            (
                "a phone number first seen (six countries)",
                FIRST_SEEN_PHONE,
            ),
            ("a phone number remembered", REMEMBERED_PHONE),
            ("an e-mail address first seen", FIRST_SEEN_EMAIL),
        ] {
            let (without, with) = (script("nil"), script(recipient));
            let a1 = measured(|| wrk_run(&without, &url, concurrency, seconds));
            let b1 = measured(|| wrk_run(&with, &url, concurrency, seconds));
            let b2 = measured(|| wrk_run(&with, &url, concurrency, seconds));
            let a2 = measured(|| wrk_run(&without, &url, concurrency, seconds));
            let (Some(a1), Some(b1), Some(b2), Some(a2)) = (a1, b1, b2, a2) else {
                println!("| {store} | {label} | (wrk is not installed) | | | |");
                continue;
            };
            let none_cpu = (a1.cpu_us + a2.cpu_us) / 2.0;
            // One row for two runs of one kind: their mean, each run's CPU, the ratio.
            let row = |recipient: &str, x: &PathRun, y: &PathRun| {
                let cpu = (x.cpu_us + y.cpu_us) / 2.0;
                println!(
                    "| {store} | {recipient} | {:.0} | {cpu:.1} ({:.1}, {:.1}) | {} | {:.2} |",
                    (x.rps + y.rps) / 2.0,
                    x.cpu_us,
                    y.cpu_us,
                    x.not_ok + y.not_ok,
                    cpu / none_cpu,
                );
            };
            row("none", &a1, &a2);
            row(label, &b1, &b2);
        }
    }
}
