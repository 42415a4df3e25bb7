//! `[http]`: limits of the HTTP server.

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};
use crate::model::{AccountIds, Identifiers};

/// HTTP server limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Largest request body accepted; larger bodies get 413 `PAYLOAD_TOO_LARGE`.
    ///
    /// TOML `http.body_limit_bytes`, env `PALISADE_HTTP__BODY_LIMIT_BYTES`; default
    /// 2 MiB (a batch of 5000 telemetry events fits).
    pub body_limit_bytes: usize,
    /// Time a request may take before it is answered 503 `UNAVAILABLE`.
    ///
    /// TOML `http.request_timeout_ms`, env `PALISADE_HTTP__REQUEST_TIMEOUT_MS`; default 10000.
    pub request_timeout_ms: u64,
    /// Longest accepted path parameter or query value, such as an account name.
    ///
    /// TOML `http.max_key_length`, env `PALISADE_HTTP__MAX_KEY_LENGTH`; default 256.
    pub max_key_length: usize,
    /// How account and user ids compare; pick what the auth service's own comparison does:
    /// `case_insensitive` (trimmed, NFKC, case-folded, IDNA full stops read as dots:
    /// `Alice@Example。com` is `alice@example.com`), `accent_insensitive` (that, and accents
    /// removed: `víctim` is `victim`, as MySQL's default `utf8mb4_0900_ai_ci` compares) or
    /// `exact` (opaque ids, byte for byte). Control and invisible characters are refused
    /// in every profile.
    ///
    /// TOML `http.account_ids`, env `PALISADE_HTTP__ACCOUNT_IDS`; default `case_insensitive`.
    pub account_ids: AccountIds,
    /// Longest a client may take to send a request's headers, and to start its next request
    /// on a kept-alive connection; then the connection is closed (slowloris, idle sockets).
    ///
    /// TOML `http.header_read_timeout_ms`, env `PALISADE_HTTP__HEADER_READ_TIMEOUT_MS`;
    /// default 10000.
    pub header_read_timeout_ms: u64,
    /// Connections the kernel queues for `accept` (capped by `net.core.somaxconn`).
    ///
    /// TOML `http.listen_backlog`, env `PALISADE_HTTP__LISTEN_BACKLOG`; default 4096.
    pub listen_backlog: u32,
    /// Threads of the async runtime that serves requests and runs background work; 0: one
    /// per CPU core. On a host whose cores are shared with Redis (or a load generator),
    /// fewer threads than cores cost less CPU per request: every check that resumes on
    /// another thread than the one that read its Redis reply pays a wake-up (on 2 cores
    /// shared with Redis, 1 thread: 26–32 µs per 4-scope check, 2: 34–36 µs; see
    /// `docs/PERFORMANCE.md`).
    ///
    /// TOML `http.workers`, env `PALISADE_HTTP__WORKERS`; default 0 (one per core), at
    /// most 256.
    pub workers: usize,
}

/// Most runtime threads (`http.workers`).
const MAX_WORKERS: usize = 256;

impl HttpSettings {
    /// Runtime threads: `workers`, or one per CPU core when 0.
    pub fn worker_count(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }

    /// The identifier profile these settings describe.
    pub fn identifiers(&self) -> Identifiers {
        Identifiers {
            accounts: self.account_ids,
            max_len: self.max_key_length,
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            body_limit_bytes: 2 * 1024 * 1024,
            request_timeout_ms: 10_000,
            max_key_length: 256,
            account_ids: AccountIds::CaseInsensitive,
            header_read_timeout_ms: 10_000,
            listen_backlog: 4096,
            workers: 0,
        }
    }
}

impl HttpSettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        if self.body_limit_bytes == 0 {
            return Err(SettingError::new(
                setting_name("http.body_limit_bytes"),
                "must be greater than 0 (bytes)",
            ));
        }
        if self.request_timeout_ms == 0 {
            return Err(SettingError::new(
                setting_name("http.request_timeout_ms"),
                "must be greater than 0 (milliseconds)",
            ));
        }
        if !(100..=600_000).contains(&self.header_read_timeout_ms) {
            return Err(SettingError::new(
                setting_name("http.header_read_timeout_ms"),
                "must be between 100 and 600000 (milliseconds)",
            ));
        }
        if !(1..=65_535).contains(&self.listen_backlog) {
            return Err(SettingError::new(
                setting_name("http.listen_backlog"),
                "must be between 1 and 65535",
            ));
        }
        if self.workers > MAX_WORKERS {
            return Err(SettingError::new(
                setting_name("http.workers"),
                format!("must be at most {MAX_WORKERS} (0: one per CPU core)"),
            ));
        }
        if !(16..=4096).contains(&self.max_key_length) {
            return Err(SettingError::new(
                setting_name("http.max_key_length"),
                "must be between 16 and 4096 (characters)",
            ));
        }
        Ok(())
    }
}
