//! Settings: the TOML file, `PALISADE_*` environment variables, defaults and validation.
//!
//! Owns [`Settings`] and its sections (one file per TOML section) and the only code in the
//! crate that reads the environment or the settings file. Read [`Settings::load`] first.
//! Every error is one line naming the setting (env var or TOML key) and what is accepted.

mod attestation;
mod history;
mod http;
mod integrations;
mod limits;
mod lockout;
mod messaging;
mod privacy;
mod record;
mod regions;
mod reputation;
mod scoring;
mod store;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub use attestation::{
    AppAttestEnvironment, AppAttestSettings, AttestationSettings, LEVELS, PlayIntegritySettings,
};
pub use history::HistorySettings;
pub use http::HttpSettings;
pub use integrations::{CrowdsecSettings, EnvoySettings, ForwardAuthSettings};
pub use limits::{
    BudgetSettings, ClassSettings, FailMode, LimitSettings, ScopeKind, SharedIpSettings, When,
};
pub use lockout::{Escalation, LockoutSettings, StuffingSettings, UnknownContext};
pub use messaging::{ConversionSettings, MessagingSettings};
pub use privacy::PrivacySettings;
pub use record::RecordSettings;
pub use regions::RegionSettings;
pub use reputation::{RangeFormat, ReputationSettings, SourceSettings};
pub use scoring::{
    AnomalySettings, ClassBounds, OffenderSettings, ScoringSettings, WebhookSettings,
};
pub use store::StoreSettings;

/// Prefix of every environment variable Palisade reads.
pub const ENV_PREFIX: &str = "PALISADE_";

/// Default settings file, read when present and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "palisade.toml";

/// Every setting of the service. `palisade.example.toml` documents each one.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Where the HTTP server listens.
    ///
    /// TOML `listen`, env `PALISADE_LISTEN`; default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Durable store URL: `sqlite://PATH` (embedded) or `postgres://…` (production).
    ///
    /// TOML `database_url`, env `PALISADE_DATABASE_URL`; default `sqlite://palisade.db`.
    pub database_url: String,
    /// Hot store URL: `redis://…`, `rediss://…` (TLS, the server's certificate checked
    /// against the system's roots; `#insecure` at the end skips the check),
    /// `redis+unix:///PATH` (a Unix socket; `?db=N&pass=…` for its database and password) or
    /// `redis+cluster://h1:p1,h2:p2` (seed nodes: list several), or
    /// `redis+sentinel://[user:password@]s1:p1,s2:p2/PRIMARY_NAME[/DB]` (the Sentinels; the
    /// credentials and database are the primary's). Unset or empty means in-process buckets
    /// and counters (single node).
    ///
    /// TOML `redis_url`, env `PALISADE_REDIS_URL`; default unset.
    pub redis_url: Option<String>,
    /// Folder with range files and ASN databases (its layout: `data/README.md`). When the
    /// default `data` is absent (started outside the checkout), the shipped data is looked
    /// for beside the binary, in `/usr/local/share/palisade/data`,
    /// `/usr/share/palisade/data` and the source tree it was built from; the log says which.
    ///
    /// TOML `data_dir`, env `PALISADE_DATA_DIR`; default `data`.
    pub data_dir: PathBuf,
    /// If set, an `admin` API token with exactly this value exists (first start, tests).
    ///
    /// TOML `bootstrap_token`, env `PALISADE_BOOTSTRAP_TOKEN`; default unset. At least 16
    /// characters.
    pub bootstrap_token: Option<Secret>,
    /// When the bootstrap token stops working, RFC 3339 (it stops anyway as soon as an
    /// active `admin` token exists in the database).
    ///
    /// TOML `bootstrap_token_expires_at`, env `PALISADE_BOOTSTRAP_TOKEN_EXPIRES_AT`; default
    /// unset (until an admin token exists).
    pub bootstrap_token_expires_at: Option<String>,
    /// Log output format: `text` or `json`.
    ///
    /// TOML `log_format`, env `PALISADE_LOG_FORMAT`; default `text`.
    pub log_format: LogFormat,
    /// Proxies whose `X-Forwarded-For` / `X-Real-IP` / `Forwarded` headers are believed; the
    /// right-most address not in this list is the client.
    ///
    /// TOML `trusted_proxies` (list), env `PALISADE_TRUSTED_PROXIES` (comma-separated CIDRs);
    /// default `127.0.0.1/32,::1/128`.
    #[serde(deserialize_with = "cidr_list")]
    pub trusted_proxies: Vec<ipnetwork::IpNetwork>,
    /// Where the Envoy rate limit service (gRPC) listens; empty turns it off.
    ///
    /// TOML `grpc_listen`, env `PALISADE_GRPC_LISTEN`; default `127.0.0.1:8081`.
    pub grpc_listen: String,
    /// HTTP server limits (`[http]`).
    pub http: HttpSettings,
    /// Endpoint classes, budgets, failure policy (`[limits]`).
    pub limits: LimitSettings,
    /// Login velocity, challenges, lockouts (`[lockout]`).
    pub lockout: LockoutSettings,
    /// Reputation class factors (`[reputation]`).
    pub reputation: ReputationSettings,
    /// Factor combination, anomalies, repeat offenders, webhooks (`[scoring]`).
    pub scoring: ScoringSettings,
    /// Device attestation: challenges, Play Integrity, App Attest, verdict factors
    /// (`[attestation]`).
    pub attestation: AttestationSettings,
    /// Envoy descriptor keys (`[envoy]`).
    pub envoy: EnvoySettings,
    /// The forward-auth endpoint (`[forward_auth]`).
    pub forward_auth: ForwardAuthSettings,
    /// The CrowdSec-compatible decisions stream (`[crowdsec]`).
    pub crowdsec: CrowdsecSettings,
    /// Store connection tuning (`[store]`).
    pub store: StoreSettings,
    /// The decision history analysts read (`[history]`).
    pub history: HistorySettings,
    /// Pseudonyms in logs, webhooks and erasures (`[privacy]`).
    pub privacy: PrivacySettings,
    /// Recipients of messages and notifications (`[messaging]`).
    pub messaging: MessagingSettings,
    /// The traffic record for policy replay (`[record]`).
    pub record: RecordSettings,
    /// Several regions sharing one Postgres (`[regions]`).
    pub regions: RegionSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database_url: "sqlite://palisade.db".to_owned(),
            redis_url: None,
            data_dir: PathBuf::from("data"),
            bootstrap_token: None,
            bootstrap_token_expires_at: None,
            log_format: LogFormat::Text,
            trusted_proxies: vec![
                ipnetwork::IpNetwork::from(std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST)),
                ipnetwork::IpNetwork::from(std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
            ],
            grpc_listen: "127.0.0.1:8081".to_owned(),
            http: HttpSettings::default(),
            limits: LimitSettings::default(),
            lockout: LockoutSettings::default(),
            reputation: ReputationSettings::default(),
            scoring: ScoringSettings::default(),
            attestation: AttestationSettings::default(),
            envoy: EnvoySettings::default(),
            forward_auth: ForwardAuthSettings::default(),
            crowdsec: CrowdsecSettings::default(),
            store: StoreSettings::default(),
            history: HistorySettings::default(),
            privacy: PrivacySettings::default(),
            messaging: MessagingSettings::default(),
            record: RecordSettings::default(),
            regions: RegionSettings::default(),
        }
    }
}

/// Log output format (`PALISADE_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A secret setting (tokens, keys, URLs with passwords).
///
/// `secrecy`'s string: redacted in `Debug`, zeroed when dropped, read only through
/// [`Secret::expose`]. It is never compared and never serialized (the settings are
/// serialized only as figment's defaults, which hold no secret: serializing one is an
/// error).
#[derive(Clone)]
pub struct Secret(secrecy::SecretString);

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(secrecy::SecretString::from(value))
    }
}

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self::from(value.into())
    }

    /// The secret value; call only where it is used, never to log it.
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(
            "a secret setting is never serialized",
        ))
    }
}

/// A setting that could not be loaded or has a value that is not accepted.
///
/// `Display` is one line: the setting's name as the user wrote it (env var or TOML key),
/// the problem and what is accepted.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {problem}")]
pub struct SettingError {
    /// `PALISADE_LISTEN`, `listen` in palisade.toml, …
    pub setting: String,
    /// What is wrong and what is accepted.
    pub problem: String,
}

impl SettingError {
    fn new(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            setting: one_line(&setting.into()),
            problem: one_line(&problem.into()),
        }
    }
}

/// A message as one line: parser errors (TOML) quote the offending source over several lines
/// (`305 | [table]`, `    | ^`); those lines are dropped and the rest joined with `: ` / `; `.
/// Control characters (a quoted TOML key may hold a newline) are escaped.
fn one_line(text: &str) -> String {
    let snippet = |line: &str| {
        let line = line.trim();
        line.is_empty()
            || line.starts_with('|')
            || line
                .chars()
                .all(|c| c == '^' || c == '-' || c.is_whitespace())
            || line
                .split_once('|')
                .is_some_and(|(gutter, _)| gutter.trim().chars().all(|c| c.is_ascii_digit()))
    };
    let mut parts = text.lines().filter(|line| !snippet(line)).map(str::trim);
    let mut out = parts.next().unwrap_or_default().to_owned();
    for (i, part) in parts.enumerate() {
        out.push_str(if i == 0 { ": " } else { "; " });
        out.push_str(part);
    }
    out.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Name of a setting for messages: `PALISADE_HTTP__BODY_LIMIT_BYTES (http.body_limit_bytes)`.
pub fn setting_name(key_path: &str) -> String {
    format!(
        "{ENV_PREFIX}{} ({key_path})",
        key_path.replace('.', "__").to_ascii_uppercase()
    )
}

impl Settings {
    /// The Envoy rate limit service's address; `None` when `grpc_listen` is empty (off).
    pub fn grpc_listen_addr(&self) -> Result<Option<SocketAddr>, std::net::AddrParseError> {
        let text = self.grpc_listen.trim();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse().map(Some)
    }

    /// Loads defaults, then the TOML file, then `PALISADE_*` variables (env wins), and
    /// validates the result.
    ///
    /// `config` is the `--config` path; without it `palisade.toml` is read if present.
    /// A named file that does not exist is an error.
    pub fn load(config: Option<&Path>) -> Result<Settings, SettingError> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        match config {
            Some(path) => {
                if !path.is_file() {
                    return Err(SettingError::new(
                        "--config",
                        format!("{} does not exist or is not a file", path.display()),
                    ));
                }
                figment = figment.merge(Toml::file_exact(path));
            }
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                figment = figment.merge(Toml::file_exact(DEFAULT_CONFIG_FILE));
            }
            None => {}
        }
        let figment = figment.merge(env_provider());
        Self::from_figment(&figment)
    }

    /// A candidate policy: defaults and this TOML file only (no environment: the live
    /// instance's `PALISADE_*` variables must not leak into what is being compared),
    /// validated as a whole settings file would be.
    pub fn candidate(path: &Path) -> Result<Settings, SettingError> {
        if !path.is_file() {
            return Err(SettingError::new(
                "--policy",
                format!("{} does not exist or is not a file", path.display()),
            ));
        }
        Self::candidate_toml(
            &std::fs::read_to_string(path).map_err(|err| {
                SettingError::new("--policy", format!("{}: {err}", path.display()))
            })?,
        )
    }

    /// A candidate policy from TOML text (see [`Settings::candidate`]).
    pub fn candidate_toml(text: &str) -> Result<Settings, SettingError> {
        let figment =
            Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(text));
        Self::from_figment(&figment)
    }

    /// Extracts and validates settings from an assembled figment (used by [`Settings::load`]
    /// and by tests that bring their own providers).
    pub fn from_figment(figment: &Figment) -> Result<Settings, SettingError> {
        let settings: Settings = figment.extract().map_err(|err| figment_error(&err))?;
        settings.validate()
    }

    /// Checks meaning beyond types: URL schemes, non-zero limits, token length.
    pub fn validate(mut self) -> Result<Settings, SettingError> {
        if !(self.database_url.starts_with("sqlite:")
            || self.database_url.starts_with("postgres://")
            || self.database_url.starts_with("postgresql://"))
        {
            return Err(SettingError::new(
                setting_name("database_url"),
                format!(
                    "{:?} is not a supported URL (expected sqlite://PATH or postgres://USER@HOST/DB)",
                    redact_url(&self.database_url)
                ),
            ));
        }
        if self
            .redis_url
            .as_deref()
            .is_some_and(|url| url.trim().is_empty())
        {
            self.redis_url = None;
        }
        if let Some(url) = &self.redis_url
            && !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("redis+unix://")
                || url.starts_with("redis+cluster://")
                || url.starts_with("redis+sentinel://"))
        {
            return Err(SettingError::new(
                setting_name("redis_url"),
                format!(
                    "{:?} is not a supported URL (expected redis://HOST:PORT, rediss://…, redis+unix:///PATH, redis+cluster://H1:P1,H2:P2 or redis+sentinel://S1:P1,S2:P2/NAME; unset for in-process)",
                    redact_url(url)
                ),
            ));
        }
        if let Some(at) = &self.bootstrap_token_expires_at
            && chrono::DateTime::parse_from_rfc3339(at).is_err()
        {
            return Err(SettingError::new(
                setting_name("bootstrap_token_expires_at"),
                "is not an RFC 3339 time (e.g. 2027-01-31T00:00:00Z)",
            ));
        }
        if let Some(token) = &self.bootstrap_token
            && token.expose().len() < 16
        {
            return Err(SettingError::new(
                setting_name("bootstrap_token"),
                "is shorter than 16 characters (use a long random value)",
            ));
        }
        self.http.validate()?;
        self.limits.validate()?;
        self.lockout.validate()?;
        self.reputation.validate()?;
        let classes: Vec<&str> = self.limits.classes.keys().map(String::as_str).collect();
        self.scoring.validate(&classes)?;
        self.attestation.validate()?;
        if self.grpc_listen_addr().is_err() {
            return Err(SettingError::new(
                setting_name("grpc_listen"),
                format!(
                    "{:?} is not an address (expected HOST:PORT such as 127.0.0.1:8081, or empty to turn the gRPC service off)",
                    self.grpc_listen
                ),
            ));
        }
        integrations::validate(&self.envoy, &self.forward_auth, &self.crowdsec)?;
        self.store.validate()?;
        self.history.validate()?;
        self.privacy.validate()?;
        self.messaging.validate()?;
        self.record.validate(self.privacy.pseudonym_key.is_some())?;
        let budgets: Vec<&str> = self
            .limits
            .budgets
            .iter()
            .map(|b| b.name.as_str())
            .collect();
        self.regions.validate(
            &budgets,
            !self.database_url.starts_with("sqlite:"),
            self.redis_url.is_some(),
        )?;
        Ok(self)
    }
}

/// The environment provider: `PALISADE_X` → `x`, `PALISADE_A__B` → `a.b`.
///
/// `PALISADE_TEST_*` (test suites), `PALISADE_CONFIG` (the `--config` flag) and the command
/// line's own `PALISADE_URL` and `PALISADE_TOKEN` (which instance a remote command asks, and
/// as whom) are not settings and are skipped, so they are not reported as unknown.
fn env_provider() -> Env {
    Env::prefixed(ENV_PREFIX).split("__").filter(|key| {
        let key = key.as_str().to_ascii_lowercase();
        !(key.starts_with("test_") || matches!(key.as_str(), "config" | "url" | "token"))
    })
}

/// Accepts a list of CIDRs or one comma-separated string of them (environment variables).
fn cidr_list<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ipnetwork::IpNetwork>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        List(Vec<String>),
    }
    let items = match Form::deserialize(deserializer)? {
        Form::Text(text) => text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        Form::List(list) => list,
    };
    items
        .iter()
        .map(|item| {
            item.parse::<ipnetwork::IpNetwork>().map_err(|_| {
                serde::de::Error::custom(format!(
                    "{item:?} is not an IP address or CIDR (expected e.g. 10.0.0.0/8)"
                ))
            })
        })
        .collect()
}

/// Turns a figment error into one line naming the setting the way the user wrote it.
fn figment_error(err: &figment::Error) -> SettingError {
    let key = err.path.join(".");
    let from_env = err
        .metadata
        .as_ref()
        .is_some_and(|meta| meta.name.contains("environment"));
    let from_file = err.metadata.as_ref().and_then(|meta| match &meta.source {
        Some(figment::Source::File(path)) => Some(path.display().to_string()),
        _ => None,
    });
    let problem = match &err.kind {
        figment::error::Kind::UnknownField(field, expected) => {
            let key = if key.is_empty() {
                field.clone()
            } else if key == *field || key.ends_with(&format!(".{field}")) {
                key
            } else {
                format!("{key}.{field}")
            };
            let setting = if from_env {
                setting_name(&key)
            } else {
                format!("{key} in {}", from_file.as_deref().unwrap_or("settings"))
            };
            return SettingError::new(
                setting,
                format!("unknown setting (known here: {})", expected.join(", ")),
            );
        }
        other => other.to_string(),
    };
    let setting = if from_env {
        setting_name(&key)
    } else if let Some(file) = from_file {
        if key.is_empty() {
            file
        } else {
            format!("{key} in {file}")
        }
    } else if key.is_empty() {
        "settings".to_owned()
    } else {
        key
    };
    SettingError::new(setting, problem)
}

/// Hides a password in a URL for messages.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests;
