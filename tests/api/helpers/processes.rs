//! What tests start beside the app, each stopped by PID when dropped: a chaos proxy, the
//! real binary, a redis-server of a test's own, a local Redis Cluster.

use std::net::SocketAddr;
use std::time::Duration;

/// A TCP proxy a test can break, blackhole and restore, to take a store away from the app
/// (crates.io's `ChaosProxy` idea). Broken, it drops every connection and refuses new ones;
/// blackholed, it keeps every connection open and forwards nothing (a network that swallows
/// packets: the app's reads hang instead of failing).
pub struct ChaosProxy {
    /// Where the app should connect.
    pub addr: SocketAddr,
    mode: tokio::sync::watch::Sender<ProxyMode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProxyMode {
    Open,
    Broken,
    Blackhole,
}

impl ChaosProxy {
    /// A proxy on a free loopback port forwarding to `target`.
    pub async fn start(target: SocketAddr) -> ChaosProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (mode, _) = tokio::sync::watch::channel(ProxyMode::Open);
        let modes = mode.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut watch = modes.subscribe();
                let current = *watch.borrow_and_update();
                match current {
                    ProxyMode::Broken => drop(inbound),
                    ProxyMode::Blackhole => {
                        // Accepted, never answered, closed once the hole is gone.
                        tokio::spawn(async move {
                            let _ = watch.wait_for(|m| *m != ProxyMode::Blackhole).await;
                            drop(inbound);
                        });
                    }
                    ProxyMode::Open => {
                        tokio::spawn(async move {
                            let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await
                            else {
                                return;
                            };
                            let changed = tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => None,
                                mode = watch.wait_for(|m| *m != ProxyMode::Open) => mode.ok().map(|m| *m),
                            };
                            if changed == Some(ProxyMode::Blackhole) {
                                // Both sockets stay open and silent until the hole is gone.
                                let _ = watch.wait_for(|m| *m != ProxyMode::Blackhole).await;
                            }
                            drop((inbound, outbound));
                        });
                    }
                }
            }
        });
        ChaosProxy { addr, mode }
    }

    /// Drops every open connection and refuses new ones.
    pub fn break_connections(&self) {
        self.mode.send_replace(ProxyMode::Broken);
    }

    /// Keeps every connection open and forwards nothing, old connections and new.
    pub fn blackhole(&self) {
        self.mode.send_replace(ProxyMode::Blackhole);
    }

    /// Forwards again (connections held by a blackhole are closed).
    pub fn restore(&self) {
        self.mode.send_replace(ProxyMode::Open);
    }

    /// `url` with its host and port replaced by the proxy's.
    pub fn proxied_url(&self, url: &str) -> String {
        let mut parsed = reqwest::Url::parse(url).expect("url");
        parsed.set_ip_host(self.addr.ip()).expect("host");
        parsed.set_port(Some(self.addr.port())).expect("port");
        parsed.to_string()
    }
}

/// The socket address of a `redis://` or `postgres://` URL.
pub fn socket_of(url: &str) -> SocketAddr {
    let parsed = reqwest::Url::parse(url).expect("url");
    let host = parsed.host_str().expect("host");
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    let port = parsed
        .port()
        .unwrap_or(if url.starts_with("redis") { 6379 } else { 5432 });
    format!("{host}:{port}").parse().expect("socket address")
}

/// A local 3-master Redis Cluster on free loopback ports (with a replica for each master
/// when asked), stopped (by PID) when dropped.
///
/// Needs `redis-server` and `redis-cli` on PATH; without them the test is skipped locally and
/// fails in CI.
pub struct RedisCluster {
    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…` (every node, as an operator lists them).
    pub url: String,
    /// Each node's port, in the order of `children`.
    pub ports: Vec<u16>,
    /// `cluster-node-timeout` of every node, ms: how long a master may be silent before
    /// its replica is promoted.
    pub node_timeout_ms: u64,
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn port_pair_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
}

impl RedisCluster {
    /// Starts a 3-master cluster and waits until it reports `cluster_state:ok`.
    pub async fn start() -> Option<RedisCluster> {
        Self::start_with(0, 15_000).await
    }

    /// Three masters with `replicas` replicas each and `node_timeout_ms` as
    /// `cluster-node-timeout`; waits until every node reports `cluster_state:ok`.
    pub async fn start_with(replicas: usize, node_timeout_ms: u64) -> Option<RedisCluster> {
        let available = std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .is_ok();
        if !available {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "CI=true but redis-server is not installed"
            );
            eprintln!("SKIPPED (no redis-server): install Redis to run the cluster tests");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        // Clusters started at once by tests of one process search disjoint port ranges
        // (checking a port free, then binding it later, is not a reservation). Node and
        // bus ports (+10000) stay below Linux's ephemeral range (32768 and up), where
        // the tests' own outbound connections would take them.
        static STARTED: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
        let nth = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 4;
        let mut candidate = 10_000 + (std::process::id() % 60) as u16 * 200 + nth * 50;
        let mut ports = Vec::new();
        let mut children = Vec::new();
        let count = 3 * (1 + replicas);
        while ports.len() < count {
            if !port_pair_free(candidate) {
                candidate += 1;
                continue;
            }
            let mut child = spawn_cluster_node(candidate, dir.path(), node_timeout_ms);
            if wait_for_ping(candidate, &mut child).await {
                ports.push(candidate);
                children.push(child);
            }
            candidate += 1;
        }
        let mut cluster = RedisCluster {
            url: format!(
                "redis+cluster://{}",
                ports
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            ports: ports.clone(),
            node_timeout_ms,
            children,
            _dir: dir,
        };
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            created.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        for port in &ports {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            loop {
                let info = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .expect("cluster info");
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "cluster did not become ok"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        // A replica can take over only once it has synced with its master.
        for port in &ports {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while Self::role(*port).as_deref() == Some("slave") {
                let info = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "info", "replication"])
                    .output()
                    .expect("info replication");
                if String::from_utf8_lossy(&info.stdout).contains("master_link_status:up") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "replica {port} did not sync"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        cluster.children.shrink_to_fit();
        Some(cluster)
    }

    /// The node's role (`master` or `slave`) as it reports it, or None when it does not answer.
    pub fn role(port: u16) -> Option<String> {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "role"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(str::to_owned)
            .filter(|line| !line.is_empty())
    }

    /// Kills one master with SIGKILL (a crash, not a shutdown) and returns its port.
    pub fn kill_a_master(&mut self) -> u16 {
        let at = self
            .ports
            .iter()
            .position(|&port| Self::role(port).as_deref() == Some("master"))
            .expect("a master");
        let _ = self.children[at].kill();
        let _ = self.children[at].wait();
        self.ports[at]
    }

    /// Each node's port, role and `cluster_state`, for a failure message.
    pub fn describe(&self) -> String {
        self.ports
            .iter()
            .map(|port| {
                let info = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .map(|out| String::from_utf8_lossy(&out.stdout).to_string())
                    .unwrap_or_default();
                let state = info
                    .lines()
                    .find(|line| line.starts_with("cluster_state"))
                    .unwrap_or("down")
                    .trim()
                    .to_owned();
                format!("{port}: {:?} {state}", Self::role(*port))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// True when every node still running reports `cluster_state:ok` and three masters.
    pub fn healthy(&self) -> bool {
        let running: Vec<u16> = self
            .ports
            .iter()
            .copied()
            .filter(|&port| Self::role(port).is_some())
            .collect();
        let masters = running
            .iter()
            .filter(|&&port| Self::role(port).as_deref() == Some("master"))
            .count();
        masters == 3
            && running.iter().all(|port| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "cluster", "info"])
                    .output()
                    .is_ok_and(|out| {
                        String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok")
                    })
            })
    }
}

fn spawn_cluster_node(
    port: u16,
    dir: &std::path::Path,
    node_timeout_ms: u64,
) -> std::process::Child {
    std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-node-timeout", &node_timeout_ms.to_string()])
        // A replica syncs at once (the default waits 5 s for more replicas to share a sync).
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--dir", dir.to_str().expect("utf-8 temp dir")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server")
}

/// Waits until the node answers; false when it exited first (its port was taken
/// between the check and its bind), so the caller tries the next port.
async fn wait_for_ping(port: u16, child: &mut std::process::Child) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        if child.try_wait().expect("poll redis-server").is_some() {
            return false;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server on {port} did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    true
}

/// A Palisade process (the real binary).
pub struct Process {
    pub(crate) child: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    /// `palisade serve` with `env` on a free port (gRPC off, logs at warn to stderr dropped),
    /// once `/healthz` answers.
    pub async fn start(env: &[(&str, String)]) -> Process {
        let port = free_port();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"));
        command
            .arg("serve")
            .env("PALISADE_LISTEN", format!("127.0.0.1:{port}"))
            .env("PALISADE_GRPC_LISTEN", "")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let process = Process {
            child: command.spawn().expect("start palisade"),
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if reqwest::get(format!("{}/healthz", process.base))
                .await
                .is_ok()
            {
                return process;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("palisade did not start on {}", process.base);
    }
}

/// A free loopback port (free when asked).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// How an [`OwnRedis`] takes clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    /// TCP on its port.
    Tcp,
    /// TCP, and the Unix socket [`OwnRedis::socket`].
    TcpAndUnixSocket,
    /// TLS only on its port (a self-signed certificate: `rediss://…/#insecure`).
    Tls,
}

/// A redis-server of this test's own, without persistence; stopped by PID.
pub struct OwnRedis {
    child: std::process::Child,
    /// Its port.
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OwnRedis {
    /// `redis-server` on `port`, data in `dir`, once it answers `PING`.
    pub async fn start(port: u16, dir: tempfile::TempDir) -> OwnRedis {
        Self::start_with(port, dir, None, Listen::Tcp).await
    }

    /// The same, asking clients for `password` (`requirepass`) when there is one, listening
    /// as `listen` says.
    pub async fn start_with(
        port: u16,
        dir: tempfile::TempDir,
        password: Option<&str>,
        listen: Listen,
    ) -> OwnRedis {
        let mut command = std::process::Command::new("redis-server");
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path());
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        match listen {
            Listen::Tcp => {
                command.args(["--port", &port.to_string()]);
            }
            Listen::TcpAndUnixSocket => {
                command
                    .args(["--port", &port.to_string()])
                    .arg("--unixsocket")
                    .arg(dir.path().join("redis.sock"))
                    .args(["--unixsocketperm", "700"]);
            }
            Listen::Tls => {
                // A self-signed certificate for 127.0.0.1; clients do not present one.
                let certified =
                    rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
                std::fs::write(dir.path().join("redis.crt"), certified.cert.pem()).unwrap();
                std::fs::write(
                    dir.path().join("redis.key"),
                    certified.signing_key.serialize_pem(),
                )
                .unwrap();
                command
                    .args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(dir.path().join("redis.crt"))
                    .arg("--tls-key-file")
                    .arg(dir.path().join("redis.key"))
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        let child = command
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        // Owned at once: stopped (and waited for) on every path, a panic's included.
        let redis = OwnRedis {
            child,
            port,
            _dir: dir,
        };
        let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
        let url = match listen {
            Listen::Tls => format!("rediss://{auth}127.0.0.1:{port}/#insecure"),
            _ => format!("redis://{auth}127.0.0.1:{port}"),
        };
        let client = redis::Client::open(url).unwrap();
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server on {port} did not start");
    }

    /// Where it listens for Unix socket clients (when started with one).
    pub fn socket(&self) -> std::path::PathBuf {
        self._dir.path().join("redis.sock")
    }

    /// SIGKILL, then a new empty server on the same port.
    pub async fn restart_empty(self) -> OwnRedis {
        let port = self.port;
        drop(self);
        OwnRedis::start(port, tempfile::tempdir().unwrap()).await
    }
}

/// A Redis primary with one replica, watched by three Sentinels (quorum 2), on free loopback
/// ports; every process stopped (by PID) when dropped.
pub struct RedisSentinels {
    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/palisade`.
    pub url: String,
    /// The primary's and the replica's ports, in the order of the first two children.
    pub ports: [u16; 2],
    /// `down-after-milliseconds`: how long the primary may be silent before a failover.
    pub down_after_ms: u64,
    children: Vec<std::process::Child>,
    _dir: tempfile::TempDir,
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl RedisSentinels {
    /// Starts them and waits until the replica has synced and every Sentinel knows the
    /// primary, its replica and the other Sentinels.
    pub async fn start(down_after_ms: u64) -> Option<RedisSentinels> {
        if std::process::Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "CI=true but redis-server is not installed"
            );
            eprintln!("SKIPPED (no redis-server): install Redis to run the Sentinel tests");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let mut candidate = 25_000 + (std::process::id() % 60) as u16 * 100;
        let mut next_port = || loop {
            candidate += 1;
            if std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok() {
                return candidate;
            }
        };
        let mut children = Vec::new();
        let mut ports = [0u16; 2];
        for (at, port) in ports.iter_mut().enumerate() {
            loop {
                let candidate = next_port();
                let mut command = std::process::Command::new("redis-server");
                command
                    .args(["--port", &candidate.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no"])
                    .args(["--repl-diskless-sync-delay", "0"])
                    .args(["--dir", dir.path().to_str().expect("utf-8 temp dir")])
                    .stdout(std::process::Stdio::null());
                if at == 1 {
                    command.args(["--replicaof", "127.0.0.1", &ports_first(&children)]);
                }
                let mut child = command.spawn().expect("start redis-server");
                if wait_for_ping(candidate, &mut child).await {
                    *port = candidate;
                    children.push((candidate, child));
                    break;
                }
            }
        }
        let mut sentinels = Vec::new();
        while sentinels.len() < 3 {
            let port = next_port();
            let conf = dir.path().join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor palisade 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds palisade {down_after_ms}\n\
                     sentinel failover-timeout palisade 10000\n\
                     sentinel parallel-syncs palisade 1\n",
                    dir.path().display(),
                    ports[0]
                ),
            )
            .expect("sentinel.conf");
            let mut child = std::process::Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("start redis-sentinel");
            if wait_for_ping(port, &mut child).await {
                sentinels.push(port);
                children.push((port, child));
            }
        }
        let sentinels_ready = || {
            sentinels.iter().all(|port| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "sentinel", "master", "palisade"])
                    .output()
                    .is_ok_and(|out| {
                        let text = String::from_utf8_lossy(&out.stdout).to_string();
                        let field = |name: &str| {
                            let lines: Vec<&str> = text.lines().collect();
                            lines
                                .iter()
                                .position(|line| *line == name)
                                .and_then(|at| lines.get(at + 1))
                                .and_then(|v| v.parse::<u32>().ok())
                                .unwrap_or(0)
                        };
                        field("num-slaves") >= 1 && field("num-other-sentinels") >= 2
                    })
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !(sentinels_ready() && replica_synced(ports[1])) {
            assert!(
                std::time::Instant::now() < deadline,
                "the Sentinels did not find the primary, its replica and each other"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Some(RedisSentinels {
            url: format!(
                "redis+sentinel://{}/palisade",
                sentinels
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            ports,
            down_after_ms,
            children: children.into_iter().map(|(_, child)| child).collect(),
            _dir: dir,
        })
    }

    /// Kills the current primary with SIGKILL and returns its port.
    pub fn kill_the_primary(&mut self) -> u16 {
        let at = self
            .ports
            .iter()
            .position(|&port| RedisCluster::role(port).as_deref() == Some("master"))
            .expect("a primary");
        let _ = self.children[at].kill();
        let _ = self.children[at].wait();
        self.ports[at]
    }

    /// True when a node still running is the primary.
    pub fn has_a_primary(&self) -> bool {
        self.ports
            .iter()
            .any(|&port| RedisCluster::role(port).as_deref() == Some("master"))
    }
}

fn ports_first(children: &[(u16, std::process::Child)]) -> String {
    children.first().expect("the primary first").0.to_string()
}

fn replica_synced(port: u16) -> bool {
    std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "info", "replication"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("master_link_status:up"))
}
