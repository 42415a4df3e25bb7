//! Backends: the durable store (Postgres or SQLite) and the hot store (Redis or in-process).
//!
//! Owns connecting (URL scheme → backend), migrations, readiness checks, Redis key naming
//! ([`keys`]) and Lua script loading. No business rules: each domain keeps its own SQL in
//! `<domain>/store.rs` and runs it through [`with_pool!`](crate::store::with_pool).

pub mod epoch;
pub mod health;
pub mod keys;
mod memory;
mod redis_hot;
pub mod scripts;
pub mod window;

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

pub use keys::Keys;
pub use memory::MemoryHot;
pub use redis_hot::RedisHot;
pub use window::{MAX_WINDOWS_PER_KIND, WindowAction, WindowStep, WindowValue};

use crate::config::Settings;

/// The durable store: its pool and the longest one call to it may take.
///
/// The bound holds on every request path (`store.db_timeout_ms`, default 750 ms): a
/// database that is down or blackholed answers `Unavailable` (503) in that time instead of
/// holding requests. Background work takes a copy with a longer bound
/// ([`Durable::with_timeout`]).
#[derive(Debug, Clone)]
pub struct Durable {
    pool: Pool,
    timeout: Duration,
}

/// The pool behind the durable store. Exactly two backends exist, so a closed enum (no
/// boxing on hot paths).
#[derive(Debug, Clone)]
pub enum Pool {
    /// Production: shared by every instance.
    Postgres(PgPool),
    /// Embedded default: one file, one node.
    Sqlite(SqlitePool),
}

/// What a database call answers when it ran out of time.
pub trait TimedOut {
    /// The answer of a call that took longer than its bound.
    fn timed_out(bound: Duration) -> Self;
}

impl<T> TimedOut for Result<T, sqlx::Error> {
    fn timed_out(bound: Duration) -> Self {
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the database did not answer within {} ms",
                bound.as_millis()
            ),
        )))
    }
}

impl TimedOut for () {
    fn timed_out(_: Duration) -> Self {}
}

/// Runs `call`, or answers [`TimedOut::timed_out`] once `bound` has passed (the call is
/// dropped: its connection goes back to the pool or is closed).
pub async fn timed<T: TimedOut>(bound: Duration, call: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(bound, call).await {
        Ok(answer) => answer,
        Err(_) => T::timed_out(bound),
    }
}

/// The hot store: token buckets, counters and published multipliers.
#[derive(Debug, Clone)]
pub enum Hot {
    /// Production: Redis or Redis Cluster, shared by every instance.
    Redis(RedisHot),
    /// Embedded default: in this process only.
    Memory(MemoryHot),
}

/// Both stores of one instance.
#[derive(Debug, Clone)]
pub struct Stores {
    /// Events, lockouts, tokens, audit, lists, attestations, alerts.
    pub durable: Durable,
    /// Buckets, velocity counters, multipliers.
    pub hot: Hot,
    /// Redis key builder (also names in-process entries, so both backends key alike).
    pub keys: Keys,
}

/// A store failure. `Unavailable` (unreachable, timed out) is what callers map to 503.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store could not be reached in time.
    #[error("{store} store unavailable: {source}")]
    Unavailable {
        /// `durable` or `hot`.
        store: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store answered with an error (a bug, or a schema that does not match).
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// Redis answered with an error.
    #[error("redis error: {0}")]
    Redis(#[source] redis::RedisError),
    /// Migrations could not be applied.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        match err {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => Error::Unavailable {
                store: "durable",
                source: Box::new(err),
            },
            // SQLite busy or locked (another writer held it past the busy timeout): a
            // store that cannot answer now, not a broken request.
            sqlx::Error::Database(ref db)
                if db
                    .code()
                    .is_some_and(|code| matches!(&*code, "5" | "6" | "517" | "261")) =>
            {
                Error::Unavailable {
                    store: "durable",
                    source: Box::new(err),
                }
            }
            other => Error::Database(other),
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        if err.is_io_error()
            || err.is_timeout()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
        {
            Error::Unavailable {
                store: "hot",
                source: Box::new(err),
            }
        } else {
            Error::Redis(err)
        }
    }
}

impl Error {
    /// True when the store was unreachable, as opposed to answering with an error.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable { .. })
    }
}

/// True when `err` is a unique-constraint violation (duplicate id, name, event).
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|db| db.is_unique_violation())
}

/// Runs the same sqlx expression against whichever pool backs the durable store, within
/// the store's time bound ([`Durable`]).
///
/// The SQL is shared between dialects where it is portable (both accept `$1` placeholders);
/// the body is compiled once per backend.
macro_rules! with_pool {
    ($durable:expr, |$pool:ident| $body:expr) => {{
        let durable: &$crate::store::Durable = $durable;
        $crate::store::timed(durable.timeout(), async {
            match durable.pool() {
                $crate::store::Pool::Postgres($pool) => $body,
                $crate::store::Pool::Sqlite($pool) => $body,
            }
        })
        .await
    }};
}
pub(crate) use with_pool;

/// Creates a database file that does not exist yet readable by its owner only (0600): it
/// holds accounts, addresses and token hashes. SQLite gives its `-wal` and `-shm` files the
/// same permissions. An existing file is left as it is; `:memory:` is not a file.
fn create_private(path: &std::path::Path) -> Result<(), Error> {
    if path.as_os_str().is_empty() || path.to_str() == Some(":memory:") || path.exists() {
        return Ok(());
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(err) => Err(Error::Unavailable {
            store: "durable",
            source: format!("cannot create {}: {err}", path.display()).into(),
        }),
    }
}

impl Durable {
    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The longest one call may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same store (same pool) with another bound per call: background work such as
    /// pruning, which may rightly take longer than a request may wait.
    pub fn with_timeout(&self, timeout: Duration) -> Durable {
        Durable {
            pool: self.pool.clone(),
            timeout,
        }
    }

    /// Runs `call` (a few statements, a transaction) within the store's bound.
    pub async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, Error> {
        Ok(timed(self.timeout, call).await?)
    }

    /// Connects by URL scheme: `postgres://` / `postgresql://` or `sqlite:`; `timeout`
    /// bounds waiting for a connection and every call ([`Durable::timeout`]).
    ///
    /// SQLite runs in WAL mode with `synchronous=FULL`, so a committed row survives a power
    /// cut: a 2xx on ingest means the data is on disk.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        timeout: Duration,
    ) -> Result<Durable, Error> {
        Self::connect_in_region(url, max_connections, timeout, "").await
    }

    /// [`Durable::connect`] for an instance of region `region` (empty: one region). Its
    /// Postgres sessions are named `palisade/<region>` and announce the changes other
    /// regions must hear of (`migrations/postgres/0018_regions.sql`).
    pub async fn connect_in_region(
        url: &str,
        max_connections: u32,
        timeout: Duration,
        region: &str,
    ) -> Result<Durable, Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // JIT off for this service's sessions: its statements are short, and a batch's
            // lockout queries (one statement for 500 accounts) crossed `jit_above_cost`,
            // so Postgres compiled each with LLVM: 38 % of the machine's CPU in a lockout
            // wave.
            let mut options = PgConnectOptions::from_str(url)?.options([("jit", "off")]);
            if !region.is_empty() {
                options = options
                    .application_name(&format!("palisade/{region}"))
                    .options([("palisade.regions", "on")]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(timeout)
                .connect_with(options)
                .await?;
            Ok(Durable {
                pool: Pool::Postgres(pool),
                timeout,
            })
        } else {
            let options = SqliteConnectOptions::from_str(url)?;
            create_private(options.get_filename())?;
            let options = options
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(5))
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new()
                .max_connections(max_connections)
                .acquire_timeout(timeout)
                .connect_with(options)
                .await?;
            Ok(Durable {
                pool: Pool::Sqlite(pool),
                timeout,
            })
        }
    }

    /// Applies every migration of this backend's dialect that is not yet applied.
    pub async fn migrate(&self) -> Result<(), Error> {
        match &self.pool {
            Pool::Postgres(pool) => sqlx::migrate!("migrations/postgres").run(pool).await?,
            Pool::Sqlite(pool) => sqlx::migrate!("migrations/sqlite").run(pool).await?,
        }
        Ok(())
    }

    /// Readiness: one trivial query.
    pub async fn ping(&self) -> Result<(), Error> {
        with_pool!(self, |pool| sqlx::query("SELECT 1")
            .execute(pool)
            .await
            .map(|_| ()))?;
        Ok(())
    }

    /// `postgres` or `sqlite`, for logs and `/readyz`.
    pub fn kind(&self) -> &'static str {
        match self.pool {
            Pool::Postgres(_) => "postgres",
            Pool::Sqlite(_) => "sqlite",
        }
    }

    /// Closes every connection (tests that copy a template database need this).
    pub async fn close(&self) {
        with_pool!(self, |pool| pool.close().await);
    }
}

impl Hot {
    /// The same store, on its own connection for interactive reads where it has one.
    pub fn interactive(&self) -> Hot {
        match self {
            Hot::Redis(redis) => Hot::Redis(redis.interactive()),
            Hot::Memory(memory) => Hot::Memory(memory.clone()),
        }
    }

    /// Readiness: Redis `PING` within the configured timeout; in-process is always ready.
    pub async fn ping(&self) -> Result<(), Error> {
        match self {
            Hot::Redis(redis) => redis.ping().await,
            Hot::Memory(_) => Ok(()),
        }
    }

    /// False while enforcement's own commands keep failing ([`health::Health`]): a cluster
    /// may answer `PING` while one slot's master is gone.
    pub fn answers(&self) -> bool {
        match self {
            Hot::Redis(redis) => redis.health().healthy(),
            Hot::Memory(_) => true,
        }
    }

    /// `SET key value NX PX ttl_ms`: true if this call set it.
    pub async fn set_nx(
        &self,
        key: &str,
        value: &str,
        now_ms: i64,
        ttl_ms: i64,
    ) -> Result<bool, Error> {
        match self {
            Hot::Memory(memory) => Ok(memory.value_set_nx(key, value, now_ms, ttl_ms)),
            Hot::Redis(redis) => {
                let set: Option<String> = redis
                    .query(
                        redis::cmd("SET")
                            .arg(key)
                            .arg(value)
                            .arg("NX")
                            .arg("PX")
                            .arg(ttl_ms.max(1)),
                    )
                    .await?;
                Ok(set.is_some())
            }
        }
    }

    /// `GET key` of a value written with [`Hot::set_nx`] (or a plain `SET`).
    pub async fn get(&self, key: &str, now_ms: i64) -> Result<Option<String>, Error> {
        match self {
            Hot::Memory(memory) => Ok(memory.value_get(key, now_ms).map(|(value, _)| value)),
            Hot::Redis(redis) => redis.query(redis::cmd("GET").arg(key)).await,
        }
    }

    /// `redis`, `redis-cluster` or `memory`, for logs and `/readyz`.
    pub fn kind(&self) -> &'static str {
        match self {
            Hot::Redis(redis) => redis.kind(),
            Hot::Memory(_) => "memory",
        }
    }
}

impl Stores {
    /// Opens both stores from the settings and applies migrations.
    pub async fn open(settings: &Settings) -> Result<Stores, Error> {
        let store = &settings.store;
        let durable = Durable::connect_in_region(
            &settings.database_url,
            store.db_max_connections,
            Duration::from_millis(store.db_timeout_ms),
            &settings.regions.name,
        )
        .await?;
        durable.migrate().await?;
        let hot = match &settings.redis_url {
            Some(url) => Hot::Redis(
                RedisHot::connect(url, Duration::from_millis(store.redis_timeout_ms)).await?,
            ),
            None => Hot::Memory(MemoryHot::new()),
        };
        let keys = match &hot {
            Hot::Redis(redis) if redis.is_cluster() => Keys::sharded(&store.redis_key_prefix),
            _ => Keys::new(&store.redis_key_prefix),
        };
        Ok(Stores { durable, hot, keys })
    }
}
