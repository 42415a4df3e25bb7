//! The Redis hot store: single node behind a reconnecting connection manager, or Redis
//! Cluster; every command is bounded by the configured timeout, and its outcome feeds the
//! store's [`Health`].
//!
//! A cluster connection that keeps failing is rebuilt from the seed nodes: after a master's
//! failover under load, the client's own slot refresh can stall with every command timing
//! out although the cluster has healed (seen with redis-rs 1.8; only a new connection
//! recovered). [`Supervisor`] watches the command outcomes and replaces the connection while
//! commands keep failing, at most once per [`REBUILD_EVERY`].

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;

use super::Error;
use super::health::Health;

#[derive(Clone)]
enum Conn {
    /// One node; replaceable when a Sentinel names another primary.
    Single(Arc<ArcSwap<ConnectionManager>>),
    Cluster(Arc<ClusterConn>),
}

/// A cluster connection that can be replaced under its users.
struct ClusterConn {
    current: ArcSwap<ClusterConnection>,
    client: redis::cluster::ClusterClient,
}

impl Conn {
    /// The connection to send a command on now.
    fn cluster(conn: &ClusterConn) -> ClusterConnection {
        (**conn.current.load()).clone()
    }
}

/// How often a failing cluster connection may be rebuilt.
pub const REBUILD_EVERY: Duration = Duration::from_secs(2);

/// Redis or Redis Cluster. Cloning is cheap and shares the connection (commands are
/// pipelined on it, so concurrent requests share round trips); a second connection serves
/// [`RedisHot::interactive`] reads.
#[derive(Clone)]
pub struct RedisHot {
    conn: Conn,
    /// The connection of [`RedisHot::interactive`] (on a cluster, `conn` again).
    interactive: Conn,
    timeout: Duration,
    /// The outcomes of this store's commands (shared by every clone).
    health: Arc<Health>,
}

impl std::fmt::Debug for RedisHot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisHot")
            .field("kind", &self.kind())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

fn unavailable(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Error {
    Error::Unavailable {
        store: "hot",
        source: source.into(),
    }
}

/// Runs `$call` (an expression using `$conn`) on whichever connection this is, bounded by
/// the command timeout; a timeout is [`Error::Unavailable`].
macro_rules! bounded {
    ($self:expr, |$conn:ident| $call:expr) => {{
        let result = unrecorded!($self, |$conn| $call);
        $self.health.record(result)
    }};
}

/// [`bounded!`] without recording the outcome (probes that must not heal the health).
macro_rules! unrecorded {
    ($self:expr, |$conn:ident| $call:expr) => {{
        let run = async {
            match &$self.conn {
                Conn::Single(single) => {
                    let mut $conn = (**single.load()).clone();
                    $call.await
                }
                Conn::Cluster(cluster) => {
                    let mut $conn = Conn::cluster(cluster);
                    $call.await
                }
            }
        };
        match tokio::time::timeout($self.timeout, run).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(Error::from(error)),
            Err(elapsed) => Err(unavailable(elapsed)),
        }
    }};
}

/// The two connection managers of a single node (shared commands, interactive reads).
fn managers(
    info: redis::ConnectionInfo,
    timeout: Duration,
) -> Result<(ConnectionManager, ConnectionManager), Error> {
    let client = redis::Client::open(info.set_tcp_settings(no_delay()))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(500));
    let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
    let interactive = ConnectionManager::new_lazy_with_config(client, config)?;
    Ok((conn, interactive))
}

/// TCP_NODELAY on every Redis connection. Commands share one pipelined connection: with
/// Nagle's algorithm a request written while an earlier one is unanswered waits for that
/// answer's ACK, which serialises the pipeline (the limit check's shared script calls
/// included).
fn no_delay() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

impl RedisHot {
    /// Connects to `redis://…` / `rediss://…` lazily (the service starts while Redis is
    /// down and reconnects by itself), or to `redis+cluster://h1:p1,h2:p2` (seed nodes;
    /// the cluster must answer at start).
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisHot, Error> {
        if let Some(seeds) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = seeds
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|node| format!("redis://{node}"))
                .collect();
            let client = ClusterClientBuilder::new(nodes)
                .tcp_settings(no_delay())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()?;
            let conn = client.get_async_connection().await?;
            let conn = Arc::new(ClusterConn {
                current: ArcSwap::from_pointee(conn),
                client,
            });
            let hot = RedisHot {
                conn: Conn::Cluster(conn.clone()),
                interactive: Conn::Cluster(conn),
                timeout,
                health: Arc::new(Health::new("redis-cluster")),
            };
            Supervisor::start(&hot);
            return Ok(hot);
        }
        if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            return Sentinel::connect(rest, timeout).await;
        }
        let info = url.into_connection_info()?;
        Self::single(info, timeout, "redis")
    }

    /// A single node at `info`, connected lazily.
    fn single(
        info: redis::ConnectionInfo,
        timeout: Duration,
        kind: &'static str,
    ) -> Result<RedisHot, Error> {
        let (conn, interactive) = managers(info, timeout)?;
        Ok(RedisHot {
            conn: Conn::Single(Arc::new(ArcSwap::from_pointee(conn))),
            interactive: Conn::Single(Arc::new(ArcSwap::from_pointee(interactive))),
            timeout,
            health: Arc::new(Health::new(kind)),
        })
    }

    /// The same store on a second connection, for commands a caller waits on (an account's
    /// status, the limit check's script calls): on the shared connection they would queue
    /// behind whatever bulk commands were written before them (an ingest batch's reads,
    /// writes and consequences are thousands of commands). Redis still runs one command at a
    /// time, but the caller does not wait for the replies to everything queued ahead of it on
    /// this side. A cluster connection stays shared (one per node).
    pub fn interactive(&self) -> RedisHot {
        RedisHot {
            conn: self.interactive.clone(),
            interactive: self.interactive.clone(),
            timeout: self.timeout,
            health: self.health.clone(),
        }
    }

    /// The outcomes of this store's commands.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The bound of every command.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs a command, bounded by the timeout.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        bounded!(self, |conn| cmd.query_async(&mut conn))
    }

    /// Runs a pipeline (one slot on a cluster), bounded by the timeout.
    pub async fn query_pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, Error> {
        bounded!(self, |conn| pipe.query_async(&mut conn))
    }

    /// Runs a Lua script by EVALSHA (loading it on NOSCRIPT), bounded by the timeout.
    ///
    /// On a cluster every key must share one slot (callers group keys by hash tag).
    pub async fn eval<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[String],
        args: &[String],
    ) -> Result<T, Error> {
        let mut cmd = Self::evalsha(script, keys.len());
        cmd.arg(keys).arg(args);
        self.run_script(script, &cmd).await
    }

    /// An `EVALSHA` of `script` whose next `numkeys` arguments are its keys: the caller adds
    /// keys, then arguments, straight into the command's one buffer (no allocation per
    /// argument, as `redis::ScriptInvocation` makes), and runs it with
    /// [`RedisHot::run_script`].
    pub fn evalsha(script: &redis::Script, numkeys: usize) -> redis::Cmd {
        Self::evalsha_sized(script, numkeys, 0, 0)
    }

    /// [`RedisHot::evalsha`] with room for `args` more arguments of `bytes` in all, allocated
    /// once (a batch's compare-and-set call carries tens of kilobytes).
    pub fn evalsha_sized(
        script: &redis::Script,
        numkeys: usize,
        args: usize,
        bytes: usize,
    ) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(args + 3, bytes + 64);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(numkeys);
        cmd
    }

    /// Runs an [`RedisHot::evalsha`] command; on NOSCRIPT (a restarted or flushed Redis)
    /// loads `script` and runs it once more. Bounded by the timeout.
    pub async fn run_script<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        bounded!(self, |conn| async {
            match cmd.query_async(&mut conn).await {
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    script.prepare_invoke().load_async(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                other => other,
            }
        })
    }

    /// `PING`, bounded by the command timeout (every node on a cluster). A probe: its answer
    /// does not count as enforcement's ([`Health`]).
    pub async fn ping(&self) -> Result<(), Error> {
        let answer: String = unrecorded!(self, |conn| redis::cmd("PING").query_async(&mut conn))?;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(unavailable(format!("unexpected PING answer {answer:?}")))
        }
    }

    /// Replaces a cluster connection with a new one from the seed nodes (a fresh slot map);
    /// a no-op on a single node, whose connection manager reconnects by itself.
    pub async fn rebuild(&self) -> Result<(), Error> {
        let Conn::Cluster(cluster) = &self.conn else {
            return Ok(());
        };
        let fresh = tokio::time::timeout(
            self.timeout.saturating_mul(8),
            cluster.client.get_async_connection(),
        )
        .await
        .map_err(unavailable)??;
        cluster.current.store(Arc::new(fresh));
        metrics::counter!(crate::telemetry::metrics::HOT_STORE_RECONNECTS_TOTAL).increment(1);
        Ok(())
    }

    /// True when connected to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// `redis`, `redis-sentinel` or `redis-cluster`.
    pub fn kind(&self) -> &'static str {
        self.health.store()
    }
}

/// Rebuilds a cluster connection whose commands keep failing ([`RedisHot::rebuild`]), at
/// most once per [`REBUILD_EVERY`]; stops when the store is dropped.
struct Supervisor;

impl Supervisor {
    fn start(hot: &RedisHot) {
        let Conn::Cluster(cluster) = &hot.conn else {
            return;
        };
        let (conn, health) = (Arc::downgrade(cluster), Arc::downgrade(&hot.health));
        let timeout = hot.timeout;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REBUILD_EVERY / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_rebuild = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                let (Some(conn), Some(health)) = (conn.upgrade(), health.upgrade()) else {
                    return;
                };
                if health.healthy() || last_rebuild.elapsed() < REBUILD_EVERY {
                    continue;
                }
                last_rebuild = tokio::time::Instant::now();
                let hot = RedisHot {
                    conn: Conn::Cluster(conn.clone()),
                    interactive: Conn::Cluster(conn),
                    timeout,
                    health,
                };
                match hot.rebuild().await {
                    Ok(()) => tracing::warn!(
                        failures = hot.health.failures(),
                        "redis cluster commands kept failing: connection rebuilt from the seed nodes"
                    ),
                    Err(error) => tracing::warn!(
                        error.cause = %error,
                        "redis cluster commands keep failing and no seed node answers yet"
                    ),
                }
            }
        });
    }
}

/// A primary named by Redis Sentinel (`redis+sentinel://S1:P1,S2:P2/NAME`, the shape of most
/// managed Redis): connected as a single node, and asked again while commands keep failing.
/// When the Sentinels name another primary, every connection (the shared one and the
/// interactive one) moves to it.
struct Sentinel {
    client: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
    primary: std::sync::Mutex<redis::ConnectionInfo>,
}

impl Sentinel {
    /// `rest` is what follows `redis+sentinel://`: `[user:password@]host:port,…/NAME[/DB]`;
    /// the credentials and database are the primary's.
    async fn connect(rest: &str, timeout: Duration) -> Result<RedisHot, Error> {
        let invalid = |why: &str| {
            Error::from(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "invalid redis+sentinel:// URL",
                why.to_owned(),
            )))
        };
        let (credentials, rest) = match rest.rsplit_once('@') {
            Some((credentials, rest)) => (Some(credentials), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid("expected redis+sentinel://HOST:PORT,…/PRIMARY_NAME"))?;
        let mut path = path.split('/');
        let name = path
            .next()
            .filter(|n| !n.is_empty())
            .ok_or_else(|| invalid("no primary name"))?;
        let db: i64 = match path.next() {
            Some(db) if !db.is_empty() => db
                .parse()
                .map_err(|_| invalid("the database is not a number"))?,
            _ => 0,
        };
        let sentinels: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}"))
            .collect();
        let mut node = redis::RedisConnectionInfo::default().set_db(db);
        if let Some(credentials) = credentials {
            let (user, password) = credentials.split_once(':').unwrap_or(("", credentials));
            if !user.is_empty() {
                node = node.set_username(user);
            }
            node = node.set_password(password);
        }
        let node = redis::sentinel::SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(node)
            .set_tcp_settings(no_delay());
        let mut client = redis::sentinel::SentinelClient::build(
            sentinels,
            name,
            Some(node),
            redis::sentinel::SentinelServerType::Master,
        )?;
        let primary = tokio::time::timeout(timeout.saturating_mul(8), client.async_get_client())
            .await
            .map_err(unavailable)??
            .get_connection_info()
            .clone();
        let hot = RedisHot::single(primary.clone(), timeout, "redis-sentinel")?;
        let sentinel = Arc::new(Sentinel {
            client: tokio::sync::Mutex::new(client),
            primary: std::sync::Mutex::new(primary),
        });
        sentinel.supervise(&hot);
        Ok(hot)
    }

    /// Asks the Sentinels for the primary while commands keep failing (at most every
    /// [`REBUILD_EVERY`]) and moves every connection when they name another one.
    fn supervise(self: Arc<Self>, hot: &RedisHot) {
        let (Conn::Single(conn), Conn::Single(interactive)) = (&hot.conn, &hot.interactive) else {
            return;
        };
        let (conn, interactive) = (Arc::downgrade(conn), Arc::downgrade(interactive));
        let health = Arc::downgrade(&hot.health);
        let timeout = hot.timeout;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REBUILD_EVERY / 4);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_ask = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                let (Some(conn), Some(interactive), Some(health)) =
                    (conn.upgrade(), interactive.upgrade(), health.upgrade())
                else {
                    return;
                };
                if health.healthy() || last_ask.elapsed() < REBUILD_EVERY {
                    continue;
                }
                last_ask = tokio::time::Instant::now();
                let asked = {
                    let mut client = self.client.lock().await;
                    tokio::time::timeout(timeout.saturating_mul(8), client.async_get_client()).await
                };
                let primary = match asked {
                    Ok(Ok(client)) => client.get_connection_info().clone(),
                    Ok(Err(error)) => {
                        tracing::warn!(error.cause = %error, "no Sentinel names a primary yet");
                        continue;
                    }
                    Err(_) => {
                        tracing::warn!("no Sentinel answered within the bound");
                        continue;
                    }
                };
                let moved = {
                    let mut current = self
                        .primary
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let moved = current.addr() != primary.addr();
                    *current = primary.clone();
                    moved
                };
                if !moved {
                    continue;
                }
                match managers(primary.clone(), timeout) {
                    Ok((shared, reads)) => {
                        conn.store(Arc::new(shared));
                        interactive.store(Arc::new(reads));
                        metrics::counter!(crate::telemetry::metrics::HOT_STORE_RECONNECTS_TOTAL)
                            .increment(1);
                        tracing::warn!(primary = %primary.addr(), "the Sentinels name another primary: every connection moved to it");
                    }
                    Err(error) => {
                        tracing::warn!(error.cause = %error, "the new primary's connection could not be made");
                    }
                }
            }
        });
    }
}
