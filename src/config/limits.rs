//! `[limits]`: endpoint classes, budgets, failure policy, shadow mode, L1 cache.
//!
//! The defaults are DESIGN.md's "Default budgets" table; `palisade budgets` prints the
//! effective set as Markdown.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SettingError, setting_name};

/// What happens when the hot store (Redis) cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Allow, with `X-Palisade-Degraded: redis-unavailable` and a metric.
    Open,
    /// Refuse with 503 `UNAVAILABLE` (and the same header).
    Closed,
}

/// Which requests a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum When {
    /// Every request of the budget's classes.
    Always,
    /// Only requests without `user_id`.
    Unauthenticated,
    /// Only requests with `user_id`.
    Authenticated,
}

/// The subject a budget's buckets are keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    /// One bucket for all traffic.
    Global,
    /// Per client IP (IPv6 per prefix).
    Ip,
    /// Per `user_id`.
    User,
    /// Per `device_id`.
    Device,
    /// Per endpoint class and client IP.
    EndpointIp,
    /// Per endpoint class and `user_id`.
    EndpointUser,
    /// Per client IP and `device_id` together (a device behind a shared address); applies
    /// only to requests with a device id.
    IpDevice,
    /// Per tenant (the partner or app a request is made for); applies only to requests
    /// with a tenant.
    Tenant,
    /// Per recipient of a message or notification (a phone number, e-mail address or push
    /// token, canonical); applies only to requests naming a `recipient`.
    Recipient,
    /// Per destination of messages: a phone number's country code and leading digits, or an
    /// e-mail address's domain; applies only to requests whose recipient has one. Tightened
    /// by `messaging.premium_rate_factor` for premium-rate numbers.
    Destination,
}

impl ScopeKind {
    /// The name used in responses, headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::Global => "global",
            ScopeKind::Ip => "ip",
            ScopeKind::User => "user",
            ScopeKind::Device => "device",
            ScopeKind::EndpointIp => "endpoint_ip",
            ScopeKind::EndpointUser => "endpoint_user",
            ScopeKind::IpDevice => "ip_device",
            ScopeKind::Tenant => "tenant",
            ScopeKind::Recipient => "recipient",
            ScopeKind::Destination => "destination",
        }
    }
}

/// An endpoint class: which requests belong to it and how it fails.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassSettings {
    /// Path patterns (`*` matches any run of characters, `/` included). Empty: the class is
    /// only reached as the fallback (`read` for GET/HEAD, `write` otherwise).
    pub paths: Vec<String>,
    /// Methods the patterns apply to (upper case); empty means every method.
    pub methods: Vec<String>,
    /// Redis-down behaviour of this class.
    pub fail: FailMode,
    /// Compute and report decisions for this class but never block.
    pub shadow: bool,
    /// Order in which classes with patterns are tried (lower first; ties by name).
    pub priority: i32,
}

impl Default for ClassSettings {
    fn default() -> Self {
        Self {
            paths: Vec::new(),
            methods: Vec::new(),
            fail: FailMode::Open,
            shadow: false,
            priority: 100,
        }
    }
}

/// One budget: a token bucket per subject of its scope, for the classes it names.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSettings {
    /// Unique short name; part of the Redis key and of the `RateLimit` headers.
    pub name: String,
    /// What the buckets are keyed by.
    pub scope: ScopeKind,
    /// Classes it applies to; empty means every class.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Requests (cost units) per period: the refill rate is `limit / period_s` per second.
    pub limit: u32,
    /// Period in seconds.
    pub period_s: u32,
    /// Bucket capacity (largest burst); default `limit`.
    #[serde(default)]
    pub burst: Option<u32>,
    /// Which requests it counts.
    #[serde(default = "always")]
    pub when: When,
    /// Report but never block on this budget.
    #[serde(default)]
    pub shadow: bool,
}

fn always() -> When {
    When::Always
}

impl BudgetSettings {
    /// Bucket capacity in cost units.
    pub fn capacity(&self) -> u32 {
        self.burst.unwrap_or(self.limit)
    }

    /// Refill in cost units per second.
    pub fn refill_per_s(&self) -> f64 {
        f64::from(self.limit) / f64::from(self.period_s)
    }
}

/// The `[limits]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitSettings {
    /// IPv6 clients are keyed by this prefix length, so one host cannot rotate through its
    /// allocation. TOML `limits.ipv6_prefix_len`, env `PALISADE_LIMITS__IPV6_PREFIX_LEN`;
    /// default 64 (accepted 32–128).
    pub ipv6_prefix_len: u8,
    /// TTL of the in-process L1 cache of blocked buckets, milliseconds (0 disables it).
    /// TOML `limits.l1_ttl_ms`, env `PALISADE_LIMITS__L1_TTL_MS`; default 250 (max 5000).
    pub l1_ttl_ms: u64,
    /// Coalesce concurrent checks into shared script calls (each still answered as if it ran
    /// alone): on one Redis, all checks; on a Redis Cluster, the checks' groups of one slot.
    /// TOML `limits.coalesce`, env `PALISADE_LIMITS__COALESCE`; default true.
    pub coalesce: bool,
    /// Script calls on their way to Redis at once (on a cluster: a quarter as many per
    /// slot, at least 1) before further checks queue for a shared call (with `coalesce`). Fewer means more checks per call and less Redis CPU and
    /// fewer socket writes per check, for up to one call's round trip of waiting. TOML
    /// `limits.coalesce_in_flight`, env `PALISADE_LIMITS__COALESCE_IN_FLIGHT`; default 4
    /// (accepted 1–64).
    pub coalesce_in_flight: u8,
    /// Largest `cost` of one check. TOML `limits.max_cost`; default 1000.
    pub max_cost: u32,
    /// Match request paths against class patterns ignoring ASCII case (`/Login` is
    /// `/login`), as most backends route them. TOML `limits.case_insensitive_paths`, env
    /// `PALISADE_LIMITS__CASE_INSENSITIVE_PATHS`; default true. Turn off only when the
    /// backend routes by exact case.
    pub case_insensitive_paths: bool,
    /// Endpoint classes by name. `read` and `write` must exist (they are the fallbacks).
    pub classes: BTreeMap<String, ClassSettings>,
    /// Every budget. TOML `[[limits.budgets]]`; giving any replaces the whole default list.
    pub budgets: Vec<BudgetSettings>,
    /// Addresses many honest users share (carrier-grade NAT, a company's proxy).
    pub shared_ip: SharedIpSettings,
}

/// `[limits.shared_ip]`: addresses many honest users share.
///
/// An address that many distinct accounts log in from successfully is *shared*. For requests carrying a device id, its `ip` and `endpoint_ip` budgets are then
/// counted per IP and device (scope `ip_device`, the budget's own numbers) plus one IP-wide
/// bucket raised to `ceiling` times the budget; requests without a device id keep the strict
/// IP budget. Spraying and failure flags on a shared IP need `spray_factor` times the
/// evidence, and its 429s and request counts make no repeat-offender or anomaly flag.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedIpSettings {
    /// Off: every address is treated alike. TOML `limits.shared_ip.enabled`, env
    /// `PALISADE_LIMITS__SHARED_IP__ENABLED`; default true.
    pub enabled: bool,
    /// Distinct accounts with a successful login from one IP (IPv6: its prefix) within
    /// `window_s` that make it shared. TOML `limits.shared_ip.min_accounts`; default 20
    /// (accepted 2–1000).
    pub min_accounts: u32,
    /// The window those successes are counted in, seconds. TOML `limits.shared_ip.window_s`;
    /// default 3600.
    pub window_s: u64,
    /// How long an address stays shared after it last qualified, seconds. TOML
    /// `limits.shared_ip.remember_s`; default 604800 (7 days).
    pub remember_s: u64,
    /// The IP-wide bucket of a shared address holds this many times each IP budget; it binds
    /// logins from devices their account does not know (a known or attested device is not
    /// refused by it). TOML `limits.shared_ip.ceiling`; default 50 (accepted 1–10000).
    pub ceiling: f64,
    /// Spraying and IP-failure thresholds are this many times higher on a shared address.
    /// TOML `limits.shared_ip.spray_factor`; default 5 (accepted 1–100).
    pub spray_factor: u32,
    /// Ranges that are shared whatever their traffic (CIDR), e.g. a carrier's NAT pools.
    /// TOML `limits.shared_ip.ranges`; default `["100.64.0.0/10"]` (RFC 6598 carrier-grade
    /// NAT space).
    pub ranges: Vec<ipnetwork::IpNetwork>,
}

impl Default for SharedIpSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            min_accounts: 20,
            window_s: 3600,
            remember_s: 7 * 86_400,
            ceiling: 50.0,
            spray_factor: 5,
            ranges: vec!["100.64.0.0/10".parse().expect("a valid CIDR")],
        }
    }
}

impl SharedIpSettings {
    fn validate(&self) -> Result<(), SettingError> {
        let bad = |key: &str, problem: &str| {
            Err(SettingError::new(
                setting_name(&format!("limits.shared_ip.{key}")),
                problem,
            ))
        };
        if !(2..=1000).contains(&self.min_accounts) {
            return bad("min_accounts", "must be between 2 and 1000");
        }
        if self.window_s == 0 || self.remember_s == 0 {
            return bad("window_s", "window_s and remember_s must be at least 1");
        }
        if !(1.0..=10_000.0).contains(&self.ceiling) {
            return bad("ceiling", "must be between 1 and 10000");
        }
        if !(1..=100).contains(&self.spray_factor) {
            return bad("spray_factor", "must be between 1 and 100");
        }
        Ok(())
    }
}

impl Default for LimitSettings {
    fn default() -> Self {
        let class = |paths: &[&str], fail, priority| ClassSettings {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            fail,
            priority,
            ..ClassSettings::default()
        };
        let classes = BTreeMap::from([
            // Requests that make the backend send something (an SMS or e-mail OTP, an
            // invitation): each costs money and reaches a person, so they fail closed and come
            // before `auth` (an OTP is sent under `messaging`, checked under `auth`).
            (
                "messaging".to_owned(),
                class(
                    &["/otp/send", "/otp/resend", "/sms*", "/verify*", "/invite*"],
                    FailMode::Closed,
                    5,
                ),
            ),
            (
                "push".to_owned(),
                class(
                    &["/push/*", "/notifications*", "/devices/*/push*"],
                    FailMode::Open,
                    25,
                ),
            ),
            (
                "auth".to_owned(),
                class(
                    &[
                        "/auth/*",
                        "/login",
                        "/token",
                        "/oauth/token",
                        "/session",
                        "/password/*",
                        "/otp/*",
                    ],
                    FailMode::Closed,
                    10,
                ),
            ),
            (
                "payment".to_owned(),
                class(
                    &["/pay/*", "/payments*", "/checkout*"],
                    FailMode::Closed,
                    20,
                ),
            ),
            (
                "expensive".to_owned(),
                class(
                    &[
                        "/search*",
                        "*/search",
                        "*/aggregations*",
                        "/export*",
                        "*/report*",
                    ],
                    FailMode::Open,
                    30,
                ),
            ),
            ("read".to_owned(), class(&[], FailMode::Open, 1000)),
            ("write".to_owned(), class(&[], FailMode::Open, 1000)),
        ]);
        let budget = |name: &str, scope, classes: &[&str], limit, period_s, when| BudgetSettings {
            name: name.to_owned(),
            scope,
            classes: classes.iter().map(|c| (*c).to_owned()).collect(),
            limit,
            period_s,
            burst: None,
            when,
            shadow: false,
        };
        let budgets = vec![
            budget("global", ScopeKind::Global, &[], 100_000, 1, When::Always),
            budget("ip-anon", ScopeKind::Ip, &[], 60, 60, When::Unauthenticated),
            budget("ip-authn", ScopeKind::Ip, &[], 600, 60, When::Authenticated),
            budget(
                "user-write",
                ScopeKind::User,
                &["write", "payment"],
                60,
                60,
                When::Always,
            ),
            budget(
                "user-read",
                ScopeKind::User,
                &["read"],
                300,
                60,
                When::Always,
            ),
            budget("device", ScopeKind::Device, &[], 600, 60, When::Always),
            budget(
                "auth-ip",
                ScopeKind::EndpointIp,
                &["auth"],
                10,
                60,
                When::Always,
            ),
            budget(
                "auth-account",
                ScopeKind::EndpointUser,
                &["auth"],
                5,
                60,
                When::Always,
            ),
            budget(
                "expensive-ip",
                ScopeKind::EndpointIp,
                &["expensive"],
                20,
                60,
                When::Always,
            ),
            budget(
                "expensive-user",
                ScopeKind::EndpointUser,
                &["expensive"],
                30,
                60,
                When::Always,
            ),
            budget(
                "otp-recipient",
                ScopeKind::Recipient,
                &["messaging"],
                3,
                600,
                When::Always,
            ),
            budget(
                "otp-destination",
                ScopeKind::Destination,
                &["messaging"],
                100,
                3600,
                When::Always,
            ),
            budget(
                "push-recipient",
                ScopeKind::Recipient,
                &["push"],
                10,
                3600,
                When::Always,
            ),
        ];
        Self {
            ipv6_prefix_len: 64,
            l1_ttl_ms: 250,
            coalesce: true,
            coalesce_in_flight: 4,
            max_cost: 1000,
            case_insensitive_paths: true,
            classes,
            budgets,
            shared_ip: SharedIpSettings::default(),
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=24).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl LimitSettings {
    pub(super) fn validate(&self) -> Result<(), SettingError> {
        self.shared_ip.validate()?;
        if !(32..=128).contains(&self.ipv6_prefix_len) {
            return Err(SettingError::new(
                setting_name("limits.ipv6_prefix_len"),
                "must be between 32 and 128",
            ));
        }
        if self.l1_ttl_ms > 5000 {
            return Err(SettingError::new(
                setting_name("limits.l1_ttl_ms"),
                "must be at most 5000 (milliseconds; 0 disables the cache)",
            ));
        }
        if !(1..=64).contains(&self.coalesce_in_flight) {
            return Err(SettingError::new(
                setting_name("limits.coalesce_in_flight"),
                "must be between 1 and 64",
            ));
        }
        if self.max_cost == 0 {
            return Err(SettingError::new(
                setting_name("limits.max_cost"),
                "must be at least 1",
            ));
        }
        for fallback in ["read", "write"] {
            if !self.classes.contains_key(fallback) {
                return Err(SettingError::new(
                    format!("limits.classes.{fallback}"),
                    "must exist: it is the class of requests that match no pattern",
                ));
            }
        }
        for (name, class) in &self.classes {
            let key = format!("limits.classes.{name}");
            if !valid_name(name) {
                return Err(SettingError::new(
                    key,
                    "class names are 1-24 characters of A-Z, a-z, 0-9, '-', '_'",
                ));
            }
            if class
                .paths
                .iter()
                .any(|p| !p.starts_with('/') && !p.starts_with('*'))
            {
                return Err(SettingError::new(
                    format!("{key}.paths"),
                    "patterns start with '/' or '*'",
                ));
            }
            if class
                .methods
                .iter()
                .any(|m| m.is_empty() || m.bytes().any(|b| !b.is_ascii_uppercase()))
            {
                return Err(SettingError::new(
                    format!("{key}.methods"),
                    "methods are upper case, e.g. \"GET\"",
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (index, budget) in self.budgets.iter().enumerate() {
            let key = format!("limits.budgets[{index}] ({})", budget.name);
            if !valid_name(&budget.name) {
                return Err(SettingError::new(
                    key,
                    "name must be 1-24 characters of A-Z, a-z, 0-9, '-', '_'",
                ));
            }
            if !seen.insert(budget.name.as_str()) {
                return Err(SettingError::new(key, "budget names must be unique"));
            }
            if budget.limit == 0 || budget.period_s == 0 || budget.burst == Some(0) {
                return Err(SettingError::new(
                    key,
                    "limit, period_s and burst must be at least 1",
                ));
            }
            if let Some(class) = budget
                .classes
                .iter()
                .find(|c| !self.classes.contains_key(*c))
            {
                return Err(SettingError::new(
                    key,
                    format!("names the class {class:?}, which is not configured"),
                ));
            }
            let per_class = matches!(
                budget.scope,
                ScopeKind::EndpointIp | ScopeKind::EndpointUser
            );
            if per_class && budget.classes.is_empty() {
                return Err(SettingError::new(
                    key,
                    "endpoint_ip and endpoint_user budgets must name their classes",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_follow_design_md() {
        let limits = LimitSettings::default();
        limits.validate().expect("defaults validate");
        let find = |name: &str| limits.budgets.iter().find(|b| b.name == name).unwrap();
        assert_eq!(
            (find("auth-account").limit, find("auth-account").period_s),
            (5, 60)
        );
        assert_eq!((find("auth-ip").limit, find("auth-ip").period_s), (10, 60));
        assert_eq!(find("global").limit, 100_000);
        assert_eq!((find("ip-anon").limit, find("ip-authn").limit), (60, 600));
        assert!((find("auth-account").refill_per_s() - 5.0 / 60.0).abs() < 1e-12);
        assert_eq!(limits.classes["auth"].fail, FailMode::Closed);
        assert_eq!(limits.classes["read"].fail, FailMode::Open);
    }

    #[test]
    fn a_budget_naming_an_unknown_class_is_rejected() {
        let mut limits = LimitSettings::default();
        limits.budgets[0].classes = vec!["nope".to_owned()];
        let err = limits.validate().unwrap_err().to_string();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn duplicate_and_zero_budgets_are_rejected() {
        let mut limits = LimitSettings::default();
        limits.budgets[1].name = "global".to_owned();
        assert!(
            limits
                .validate()
                .unwrap_err()
                .to_string()
                .contains("unique")
        );
        let mut limits = LimitSettings::default();
        limits.budgets[1].period_s = 0;
        assert!(limits.validate().is_err());
    }
}
