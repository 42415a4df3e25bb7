//! Descriptor rules in envoyproxy/ratelimit's YAML format, read as they are.
//!
//! A team moving from envoyproxy/ratelimit points Palisade at its existing config files
//! (`envoy.ratelimit_config`): each file has a `domain` and nested `descriptors` (`key`,
//! optional `value`, `rate_limit {unit, requests_per_unit, name, unlimited, replaces}`,
//! `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`,
//! `metadata`). [`Rules::lookup`] matches one request descriptor exactly as upstream's
//! `GetLimit` does (value before key-only default, `*` wildcards, depth must match, the
//! request's own `limit` override), and names the metric key the same way; the tests port
//! upstream's config test cases. Counting is Palisade's: each matched limit is a token
//! bucket (capacity `requests_per_unit`, refilled over the unit) in the same hot store as
//! the classes' budgets, keyed by the descriptor's entries as upstream keys its counters.
//!
//! [`load`] reads and validates files and folders; [`watch`] reloads them when they change.

pub mod load;
pub mod watch;

use std::collections::HashMap;
use std::sync::Arc;

pub use load::{ConfigError, File, load_paths, parse};

/// A rate limit unit, as envoyproxy/ratelimit spells it (`RateLimitResponse.RateLimit.Unit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3,600 s.
    Hour,
    /// 86,400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days (upstream's divider).
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit named in a config file (any case), None for anything else.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_uppercase().as_str() {
            "SECOND" => Self::Second,
            "MINUTE" => Self::Minute,
            "HOUR" => Self::Hour,
            "DAY" => Self::Day,
            "WEEK" => Self::Week,
            "MONTH" => Self::Month,
            "YEAR" => Self::Year,
            _ => return None,
        })
    }

    /// The unit of a protobuf enum value (`RateLimitUnit`, also the response's `Unit`).
    pub fn from_proto(value: i32) -> Option<Self> {
        Some(match value {
            1 => Self::Second,
            2 => Self::Minute,
            3 => Self::Hour,
            4 => Self::Day,
            5 => Self::Month,
            6 => Self::Year,
            7 => Self::Week,
            _ => return None,
        })
    }

    /// The protobuf enum value.
    pub fn to_proto(self) -> i32 {
        match self {
            Self::Second => 1,
            Self::Minute => 2,
            Self::Hour => 3,
            Self::Day => 4,
            Self::Month => 5,
            Self::Year => 6,
            Self::Week => 7,
        }
    }

    /// The unit's length in seconds.
    pub fn seconds(self) -> u32 {
        match self {
            Self::Second => 1,
            Self::Minute => 60,
            Self::Hour => 3_600,
            Self::Day => 86_400,
            Self::Week => 604_800,
            Self::Month => 2_592_000,
            Self::Year => 31_536_000,
        }
    }
}

/// Which of Palisade's multipliers scales a rule's bucket (an extension key, `multiplier`:
/// files that use it are Palisade's own). None: the rule's numbers as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiplierSource {
    /// The client IP's multiplier for the request's class.
    Ip,
    /// The user's.
    User,
    /// The device's.
    Device,
}

/// A limit as configured (or as a request's override sets it).
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// Requests per unit (0 when unlimited).
    pub requests_per_unit: u32,
    /// None when unlimited.
    pub unit: Option<Unit>,
    /// `unlimited: true`: the descriptor is never limited (and never counted).
    pub unlimited: bool,
    /// `rate_limit.name` (may be empty).
    pub name: String,
    /// Names of limits this one replaces when both apply to a request.
    pub replaces: Vec<String>,
    /// Over the limit is reported as OK (and counted in metrics).
    pub shadow_mode: bool,
    /// Over the limit fails the request only when every quota-mode descriptor is over.
    pub quota_mode: bool,
    /// The metric key names the request's values.
    pub detailed_metric: bool,
    /// Palisade's extension: scale by this subject's multiplier.
    pub multiplier: Option<MultiplierSource>,
    /// The metric key of the limit as configured (upstream's `FullKey`).
    pub full_key: String,
}

/// One level of the descriptor tree.
#[derive(Debug, Default, Clone)]
struct Node {
    /// By `key` or `key_value`.
    children: HashMap<String, Node>,
    limit: Option<Arc<Limit>>,
    /// The wildcard children's `key_value`, split on `*`, in file order.
    wildcards: Vec<(String, Vec<String>)>,
    value_to_metric: bool,
    share_threshold: bool,
    /// `key_value` with its `*`, when `share_threshold` is set.
    wildcard_pattern: String,
}

/// A request descriptor entry.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    /// Key.
    pub key: &'a str,
    /// Value.
    pub value: &'a str,
}

/// What [`Rules::lookup`] finds for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched {
    /// The limit (shared with the config, or the request's override).
    pub limit: Arc<Limit>,
    /// The metric key (upstream's `Stats.Key`, equal to its `FullKey`).
    pub stats_key: String,
    /// Per entry: the wildcard pattern that stands for its value in the counter's key
    /// (`share_threshold`), else None.
    pub shared_values: Vec<Option<String>>,
}

impl Matched {
    /// The counter's key, as upstream builds it (without its time window): the domain and
    /// every entry's key and value, a shared wildcard standing for the value.
    pub fn counter_key(&self, domain: &str, entries: &[Entry<'_>]) -> String {
        let mut key = String::with_capacity(domain.len() + 32);
        key.push_str(domain);
        key.push('_');
        for (i, entry) in entries.iter().enumerate() {
            key.push_str(entry.key);
            key.push('_');
            match self.shared_values.get(i).and_then(Option::as_deref) {
                Some(pattern) => key.push_str(pattern),
                None => key.push_str(entry.value),
            }
            key.push('_');
        }
        key
    }
}

/// A loaded configuration: every domain's descriptor tree.
#[derive(Debug, Default, Clone)]
pub struct Rules {
    domains: HashMap<String, Node>,
}

/// Whether `value` matches a pattern split on `*` (each `*` matches any run, also empty).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
        return false;
    }
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let mut remaining = &value[first.len()..value.len() - last.len()];
    for part in middle {
        match remaining.find(part.as_str()) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl Rules {
    /// No domain configured.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// The limit that applies to one descriptor of a request to `domain` (upstream's
    /// `GetLimit`): None when the domain or the descriptor matches no limit, or when the
    /// request's descriptor is deeper or shallower than the configured limit.
    /// `override_limit` is the descriptor's own `limit` (requests per unit, unit).
    pub fn lookup(
        &self,
        domain: &str,
        entries: &[Entry<'_>],
        override_limit: Option<(u32, Unit)>,
    ) -> Option<Matched> {
        let root = self.domains.get(domain)?;
        if let Some((requests_per_unit, unit)) = override_limit {
            let key = descriptor_key(domain, entries);
            return Some(Matched {
                limit: Arc::new(Limit {
                    requests_per_unit,
                    unit: Some(unit),
                    unlimited: false,
                    name: String::new(),
                    replaces: Vec::new(),
                    shadow_mode: false,
                    quota_mode: false,
                    detailed_metric: false,
                    multiplier: None,
                    full_key: key.clone(),
                }),
                stats_key: key,
                shared_values: Vec::new(),
            });
        }
        let mut level = &root.children;
        let mut previous = root;
        let mut found: Option<Arc<Limit>> = None;
        let mut detailed = String::from(domain);
        let mut value_metric = String::from(domain);
        let mut shared: Vec<Option<String>> = vec![None; entries.len()];
        let mut any_shared = false;
        for (i, entry) in entries.iter().enumerate() {
            let with_value = format!("{}_{}", entry.key, entry.value);
            detailed.push('.');
            detailed.push_str(&with_value);
            let mut next = level.get(&with_value);
            let mut wildcard_key: Option<&str> = None;
            if next.is_none()
                && let Some((key, _)) = previous
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &with_value))
            {
                next = level.get(key);
                wildcard_key = Some(key);
            }
            let by_value = next.is_some();
            if next.is_none() {
                next = level.get(entry.key);
            }
            if wildcard_key.is_some()
                && let Some(node) = next
                && node.share_threshold
                && !node.wildcard_pattern.is_empty()
            {
                shared[i] = Some(strip_key(&node.wildcard_pattern, entry.key).to_owned());
                any_shared = true;
            }
            value_metric.push('.');
            match next {
                Some(node) => {
                    let value = if let Some(key) = wildcard_key {
                        if let Some(pattern) = &shared[i] {
                            pattern.as_str()
                        } else if node.value_to_metric {
                            entry.value
                        } else {
                            strip_key(key, entry.key)
                        }
                    } else if by_value || node.value_to_metric {
                        entry.value
                    } else {
                        ""
                    };
                    value_metric.push_str(entry.key);
                    if !value.is_empty() {
                        value_metric.push('_');
                        value_metric.push_str(value);
                    }
                }
                None => value_metric.push_str(entry.key),
            }
            if let Some(node) = next
                && let Some(limit) = &node.limit
                && i == entries.len() - 1
            {
                found = Some(limit.clone());
            }
            match next {
                Some(node) if !node.children.is_empty() => {
                    level = &node.children;
                    previous = node;
                }
                _ => break,
            }
        }
        let limit = found?;
        let stats_key = if limit.detailed_metric {
            if any_shared {
                let mut key = String::from(domain);
                for (entry, pattern) in entries.iter().zip(&shared) {
                    key.push('.');
                    key.push_str(entry.key);
                    match pattern {
                        Some(pattern) => {
                            key.push('_');
                            key.push_str(pattern);
                        }
                        None if !entry.value.is_empty() => {
                            key.push('_');
                            key.push_str(entry.value);
                        }
                        None => {}
                    }
                }
                key
            } else {
                detailed
            }
        } else {
            value_metric
        };
        Some(Matched {
            limit,
            stats_key,
            shared_values: if any_shared { shared } else { Vec::new() },
        })
    }
}

/// `key_value` without its `key_` (a wildcard pattern's value part).
fn strip_key<'a>(key_value: &'a str, key: &str) -> &'a str {
    key_value
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix('_'))
        .unwrap_or(key_value)
}

/// `domain.key_value.key…`: the key of a request's override limit.
fn descriptor_key(domain: &str, entries: &[Entry<'_>]) -> String {
    let mut key = String::from(domain);
    key.push('.');
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(entry.key);
        if !entry.value.is_empty() {
            key.push('_');
            key.push_str(entry.value);
        }
    }
    key
}

#[cfg(test)]
mod tests;
