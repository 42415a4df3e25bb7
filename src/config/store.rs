//! `[store]`: connection tuning for the durable (SQL) and hot (Redis) stores.

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// Connection tuning for both stores.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSettings {
    /// Largest number of SQL connections per instance.
    ///
    /// TOML `store.db_max_connections`, env `PALISADE_STORE__DB_MAX_CONNECTIONS`; default 16.
    pub db_max_connections: u32,
    /// The longest one database call of a request may take, connection included; past it
    /// the store counts as unavailable (ingest answers 503). Limit checks never wait for the
    /// database at all (tokens are verified from a cache refreshed in the background).
    ///
    /// TOML `store.db_timeout_ms`, env `PALISADE_STORE__DB_TIMEOUT_MS`; default 750.
    pub db_timeout_ms: u64,
    /// Longest a Redis command may take before the failure policy applies.
    ///
    /// TOML `store.redis_timeout_ms`, env `PALISADE_STORE__REDIS_TIMEOUT_MS`; default 250.
    pub redis_timeout_ms: u64,
    /// First part of every Redis key, so several deployments (or test runs) can share one
    /// Redis.
    ///
    /// TOML `store.redis_key_prefix`, env `PALISADE_STORE__REDIS_KEY_PREFIX`; default `pal`.
    pub redis_key_prefix: String,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            db_max_connections: 16,
            db_timeout_ms: 750,
            redis_timeout_ms: 250,
            redis_key_prefix: "pal".to_owned(),
        }
    }
}

impl StoreSettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if self.db_max_connections == 0 {
            return Err(SettingError::new(
                setting_name("store.db_max_connections"),
                "must be at least 1",
            ));
        }
        if self.db_timeout_ms == 0 || self.redis_timeout_ms == 0 {
            return Err(SettingError::new(
                setting_name(if self.db_timeout_ms == 0 {
                    "store.db_timeout_ms"
                } else {
                    "store.redis_timeout_ms"
                }),
                "must be greater than 0 (milliseconds)",
            ));
        }
        let prefix = &self.redis_key_prefix;
        if prefix.is_empty()
            || prefix.len() > 32
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(SettingError::new(
                setting_name("store.redis_key_prefix"),
                "must be 1-32 characters of A-Z, a-z, 0-9, '_' or '-'",
            ));
        }
        Ok(())
    }
}
