//! The Redis hot store: a reconnecting connection with a per-command timeout.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::Error;

/// Redis (single node) behind a reconnecting connection manager.
///
/// Cloning is cheap and shares the connection (commands are pipelined on it).
#[derive(Clone)]
pub struct RedisHot {
    conn: ConnectionManager,
    timeout: Duration,
}

impl std::fmt::Debug for RedisHot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisHot")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisHot {
    /// Connects lazily: the service starts while Redis is down and reconnects by itself;
    /// until then every command fails fast with [`Error::Unavailable`].
    pub async fn connect(url: &str, timeout: Duration) -> Result<RedisHot, Error> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(RedisHot { conn, timeout })
    }

    /// `PING`, bounded by the command timeout.
    pub async fn ping(&self) -> Result<(), Error> {
        let mut conn = self.conn.clone();
        let answer = tokio::time::timeout(
            self.timeout,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await
        .map_err(|elapsed| Error::Unavailable {
            store: "hot",
            source: Box::new(elapsed),
        })??;
        if answer == "PONG" {
            Ok(())
        } else {
            Err(Error::Unavailable {
                store: "hot",
                source: format!("unexpected PING answer {answer:?}").into(),
            })
        }
    }

    /// `redis` (cluster support arrives with the limiter).
    pub fn kind(&self) -> &'static str {
        "redis"
    }
}
