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
//!    axum handler that only parses the same bodies;
//! 6. rebuild (`LOAD_ONLY=rebuild` alone): accounts locked over HTTP, Redis flushed, the
//!    rebuild from Postgres timed and a sample of the lockouts checked, against a raw
//!    pipeline writing as many markers (`LOAD_REBUILD_LOCKOUTS=10000,100000`);
//! 7. ways in (`LOAD_ONLY=paths` alone): one 4-scope decision as a JSON check on Redis and on
//!    in-process buckets (one at a time and 8 pipelined per connection), as forward-auth and
//!    as Envoy's gRPC `ShouldRateLimit`: decisions/s and the service threads' CPU per
//!    decision, against the 4-scope and one-scope EVALSHA, with `GET /healthz` through the
//!    same server as the floor of any HTTP request, and of a bare axum server on the same
//!    runtime as the floor without Palisade's own stack;
//!    `LOAD_ONLY=recipient` alone: a messaging check with a phone number (first seen, or
//!    remembered) against the same check without one, A B B A;
//! 8. cluster (`LOAD_ONLY=cluster` alone): `Limiter::check` on a local 3-master Redis Cluster
//!    against one Redis, A B B A.
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

mod drive;
mod ingest;
mod limit;
mod paths;
mod rebuild;
mod scoring;
mod server_redis;

use drive::*;
use ingest::*;
use limit::*;
use paths::*;
use rebuild::*;
use scoring::*;
use server_redis::*;

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
        Ok("rebuild") => return rebuild_section(redis.port),
        Ok("paths") => return paths_section(redis.port, concurrency, seconds),
        Ok("recipient") => return recipient_section(redis.port, concurrency, seconds),
        Ok("cluster") => return cluster_section(redis.port, concurrency, seconds),
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

    hot_key_section(&server, redis.port, concurrency, seconds);
}
