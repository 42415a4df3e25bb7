//! The bench's own redis-server, bucket memory per key and the EVALSHA baseline.

use super::*;

pub(crate) struct Redis {
    pub(crate) child: Child,
    pub(crate) port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start_redis() -> Redis {
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
pub(crate) async fn info_section<T: std::str::FromStr>(
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

pub(crate) async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    info_section(conn, "memory").await("used_memory").expect("INFO memory has used_memory")
}

/// Fills `keys` buckets with `fill` (one pipelined batch at a time); returns bytes per key
/// from `INFO memory` and the `MEMORY USAGE` of one sample key.
pub(crate) async fn bytes_per_key(
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

pub(crate) fn bucket_key(i: u64) -> String {
    format!(
        "pal:v1:{{ip:10.{}.{}.{}}}:b:ip-anon",
        i >> 16 & 255,
        i >> 8 & 255,
        i & 255
    )
}

pub(crate) async fn memory_section(port: u16, keys: u64) {
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

/// `EVALSHA` calls so far and the Redis CPU they took, µs (`INFO commandstats`).
pub(crate) async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
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

/// `redis-benchmark` EVALSHA of the 4-scope call `/v1/limit/check` makes for a read with
/// user and device (global, ip-authn, user-read, device): requests per second and p99.
/// `redis-benchmark` EVALSHA of `lua/token_bucket.lua` with the 4 scopes of the HTTP runs
/// (`four: true`) or with one scope (an IP's bucket and multiplier: a plain token bucket, what
/// a user compares a limiter with); requests/s and p99 ms.
pub(crate) fn redis_benchmark(
    port: u16,
    concurrency: u64,
    requests: u64,
    four: bool,
) -> (f64, f64) {
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
    let (keys, args): (&[String], &[&str]) = if four {
        (&keys, &args)
    } else {
        (&keys[2..4], &["1", "1", "1", "1", "600", "10", "1", "1"])
    };
    let output = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            &concurrency.to_string(),
            "-n",
            &requests.to_string(),
        ])
        .args(["-r", "100000", "--csv", "EVALSHA", sha])
        .arg(keys.len().to_string())
        .args(keys)
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

/// A local 3-master Redis Cluster (no replicas), stopped when dropped.
pub(crate) struct Cluster {
    children: Vec<std::process::Child>,
    /// `redis+cluster://…` of every node.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn start_cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let mut ports = Vec::new();
    let mut children = Vec::new();
    let mut candidate = 21_000u16;
    while ports.len() < 3 {
        candidate += 1;
        let free = std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", candidate + 10_000)).is_ok();
        if !free {
            continue;
        }
        let child = Command::new("redis-server")
            .args(["--port", &candidate.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{candidate}.conf")])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", dir.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", candidate)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        ports.push(candidate);
        children.push(child);
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let created = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(&nodes)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("redis-cli");
    assert!(created.status.success(), "cluster create");
    for port in &ports {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "cluster", "info"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not become ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Cluster {
        children,
        url: format!("redis+cluster://{}", nodes.join(",")),
        _dir: dir,
    }
}
