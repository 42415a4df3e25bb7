//! `[envoy]`, `[forward_auth]`, `[crowdsec]`: how gateways that already exist talk to us.

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// Envoy rate limit service (v3 gRPC): which descriptor entries name what.
///
/// Envoy sends descriptors as lists of `(key, value)` entries; every entry whose key is
/// listed here feeds the one Palisade check of the request. Entries with other keys are
/// ignored (they still get a status, that of the whole request).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvoySettings {
    /// Keys holding the client IP (Envoy's `remote_address` action).
    ///
    /// TOML `envoy.ip_keys`; default `["remote_address"]`.
    pub ip_keys: Vec<String>,
    /// Keys holding the user (a `request_headers` action with this `descriptor_key`).
    ///
    /// TOML `envoy.user_keys`; default `["user_id"]`.
    pub user_keys: Vec<String>,
    /// Keys holding the device.
    ///
    /// TOML `envoy.device_keys`; default `["device_id"]`.
    pub device_keys: Vec<String>,
    /// Keys holding the tenant (the partner or app, e.g. from the API key Envoy checked).
    ///
    /// TOML `envoy.tenant_keys`; default `["tenant"]`.
    pub tenant_keys: Vec<String>,
    /// Keys holding the recipient of a message or notification (a phone number, e-mail
    /// address or push token the upstream is asked to send to, e.g. from a request header).
    ///
    /// TOML `envoy.recipient_keys`; default `["recipient"]`.
    pub recipient_keys: Vec<String>,
    /// Keys holding the request path (the endpoint class is matched on it).
    ///
    /// TOML `envoy.path_keys`; default `["path", ":path", "request_path"]`.
    pub path_keys: Vec<String>,
    /// Keys holding the HTTP method.
    ///
    /// TOML `envoy.method_keys`; default `["method", ":method", "request_method"]`.
    pub method_keys: Vec<String>,
    /// Path used when no descriptor names one (the class is then `read` or `write` by
    /// method).
    ///
    /// TOML `envoy.default_path`; default `/`.
    pub default_path: String,
    /// envoyproxy/ratelimit config files, read as they are (docs/GUIDE.md "Envoy"): files,
    /// or folders whose `*.yaml`/`*.yml` files are read in name order. Their rules run
    /// beside Palisade's own classes; changes are picked up within a second.
    ///
    /// TOML `envoy.ratelimit_config` (a path or a list), env
    /// `PALISADE_ENVOY__RATELIMIT_CONFIG` (comma-separated); default none.
    #[serde(deserialize_with = "one_or_many")]
    pub ratelimit_config: Vec<std::path::PathBuf>,
    /// Two files may name the same domain (their descriptors are merged; a key in both is
    /// still an error), as upstream's `MERGE_DOMAIN_CONFIG`.
    ///
    /// TOML `envoy.merge_domains`; default false.
    pub merge_domains: bool,
}

impl Default for EnvoySettings {
    fn default() -> Self {
        let list = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect();
        Self {
            ip_keys: list(&["remote_address"]),
            user_keys: list(&["user_id"]),
            device_keys: list(&["device_id"]),
            tenant_keys: list(&["tenant"]),
            recipient_keys: list(&["recipient"]),
            path_keys: list(&["path", ":path", "request_path"]),
            method_keys: list(&["method", ":method", "request_method"]),
            default_path: "/".to_owned(),
            ratelimit_config: Vec::new(),
            merge_domains: false,
        }
    }
}

/// `GET /v1/forward-auth` for nginx `auth_request`, Traefik ForwardAuth, Caddy
/// `forward_auth`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForwardAuthSettings {
    /// Accept the limiter token as `?token=` (for proxies that cannot set a header on the
    /// auth subrequest). Off by default: query strings end up in access logs.
    ///
    /// TOML `forward_auth.query_token`, env `PALISADE_FORWARD_AUTH__QUERY_TOKEN`; default
    /// false.
    pub query_token: bool,
    /// Header carrying the authenticated user, set by the proxy (e.g. from a verified JWT).
    ///
    /// TOML `forward_auth.user_header`; default `x-user-id`.
    pub user_header: String,
    /// Header carrying the device id sent by the app.
    ///
    /// TOML `forward_auth.device_header`; default `x-device-id`.
    pub device_header: String,
    /// Header carrying the tenant (the partner or app the request is made for), set by the
    /// proxy from what it authenticated (an API key); the proxy must drop a client's own.
    ///
    /// TOML `forward_auth.tenant_header`; default `x-tenant-id`.
    pub tenant_header: String,
    /// Header carrying the recipient of the message or notification the request asks for
    /// (a phone number, e-mail address or push token), set by the proxy or the app.
    ///
    /// TOML `forward_auth.recipient_header`; default `x-palisade-recipient`.
    pub recipient_header: String,
    /// Secrets of signed identities (`X-Palisade-Identity`, docs/GUIDE.md): when set,
    /// forward-auth, Envoy and `/v1/limit/check` take the user, device and tenant only from a
    /// valid signature (the tenant from a v2 identity), and plain user/device/tenant headers
    /// and fields are ignored. The first signs
    /// (`palisade identity sign`), every one verifies (rotation).
    ///
    /// TOML `forward_auth.identity_secret` (a list), env
    /// `PALISADE_FORWARD_AUTH__IDENTITY_SECRET` (comma-separated); default none (off).
    #[serde(deserialize_with = "secrets")]
    pub identity_secret: Vec<super::Secret>,
}

/// The items of a list, or of one comma-separated string (as an environment variable gives
/// it), trimmed; blank ones kept.
fn items<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    let items = match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(text) => text.split(',').map(str::to_owned).collect(),
        OneOrMany::Many(items) => items,
    };
    Ok(items
        .into_iter()
        .map(|item| item.trim().to_owned())
        .collect())
}

/// A list, or one comma-separated string; blank items dropped.
pub(super) fn one_or_many<'de, D: serde::Deserializer<'de>, T: From<String>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    Ok(items(deserializer)?
        .into_iter()
        .filter(|item| !item.is_empty())
        .map(T::from)
        .collect())
}

/// Like [`one_or_many`], but a blank item is kept (and refused by validation): an unset
/// `${VAR}` in a compose file gives `" , "`, and reading that as "no secrets" would switch
/// signed identity off without a word.
fn secrets<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<super::Secret>, D::Error> {
    Ok(items(deserializer)?
        .into_iter()
        .map(super::Secret::from)
        .collect())
}

impl Default for ForwardAuthSettings {
    fn default() -> Self {
        Self {
            query_token: false,
            user_header: "x-user-id".to_owned(),
            device_header: "x-device-id".to_owned(),
            tenant_header: "x-tenant-id".to_owned(),
            recipient_header: "x-palisade-recipient".to_owned(),
            identity_secret: Vec::new(),
        }
    }
}

/// The CrowdSec-compatible decisions stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrowdsecSettings {
    /// Duration given to bans of deny entries without an expiry (bouncers need one; a
    /// bouncer's next `startup=true` pull sends them again).
    ///
    /// TOML `crowdsec.permanent_ban_s`, env `PALISADE_CROWDSEC__PERMANENT_BAN_S`; default
    /// 604800 (7 days).
    pub permanent_ban_s: u64,
    /// How far before a bouncer's previous pull `startup=false` looks again, ms: an entry
    /// written by an instance whose clock is slightly behind is sent twice rather than
    /// missed (bouncers treat a repeated decision as an update).
    ///
    /// TOML `crowdsec.overlap_ms`, env `PALISADE_CROWDSEC__OVERLAP_MS`; default 2000.
    pub overlap_ms: u64,
}

impl Default for CrowdsecSettings {
    fn default() -> Self {
        Self {
            permanent_ban_s: 7 * 24 * 3600,
            overlap_ms: 2_000,
        }
    }
}

pub(super) fn validate(
    envoy: &EnvoySettings,
    forward: &ForwardAuthSettings,
    crowdsec: &CrowdsecSettings,
) -> Result<(), SettingError> {
    if forward
        .identity_secret
        .iter()
        .any(|secret| secret.expose().is_empty())
    {
        return Err(SettingError::new(
            setting_name("forward_auth.identity_secret"),
            "is set but blank (an unset ${VAR}?): give each secret (at least 32 characters) \
             or remove the setting to turn signed identities off",
        ));
    }
    if forward
        .identity_secret
        .iter()
        .any(|secret| secret.expose().len() < 32)
    {
        return Err(SettingError::new(
            setting_name("forward_auth.identity_secret"),
            "each secret must be at least 32 characters (e.g. openssl rand -hex 32)",
        ));
    }
    if !envoy.default_path.starts_with('/') {
        return Err(SettingError::new(
            setting_name("envoy.default_path"),
            "must be a path starting with '/'",
        ));
    }
    for (name, keys) in [
        ("envoy.ip_keys", &envoy.ip_keys),
        ("envoy.path_keys", &envoy.path_keys),
    ] {
        if keys.is_empty() {
            return Err(SettingError::new(
                setting_name(name),
                "needs at least one descriptor key",
            ));
        }
    }
    for (name, header) in [
        ("forward_auth.user_header", &forward.user_header),
        ("forward_auth.device_header", &forward.device_header),
        ("forward_auth.tenant_header", &forward.tenant_header),
        ("forward_auth.recipient_header", &forward.recipient_header),
    ] {
        let token = !header.is_empty()
            && header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !token {
            return Err(SettingError::new(
                setting_name(name),
                format!("{header:?} is not an HTTP header name"),
            ));
        }
    }
    if crowdsec.overlap_ms > 3_600_000 {
        return Err(SettingError::new(
            setting_name("crowdsec.overlap_ms"),
            "must be at most 3600000 (one hour)",
        ));
    }
    if crowdsec.permanent_ban_s == 0 {
        return Err(SettingError::new(
            setting_name("crowdsec.permanent_ban_s"),
            "must be greater than 0 (seconds)",
        ));
    }
    Ok(())
}
