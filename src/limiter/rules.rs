//! Buckets that are not in the budget table: envoyproxy/ratelimit descriptor rules
//! (`crate::integrations::descriptors`), checked in the same hot store with the same bucket
//! model.

use std::sync::Arc;

use super::request::LimitRequest;
use super::scopes::Scope;

use super::{BLOCKED_RETRY_MS, Limiter, bucket};
use crate::config::ScopeKind;
use crate::model::{ClientIp, SubjectKey};

/// One rule's bucket for one request.
#[derive(Debug, Clone)]
pub struct RuleBucket {
    /// The counter's name (upstream's cache key without its window: `domain_key_value_…`).
    pub counter: String,
    /// Whose multiplier scales the bucket (and in whose Redis slot it lives): None for a
    /// rule's own numbers (the bucket lives beside the `global` scope).
    pub subject: Option<SubjectKey>,
    /// The request's endpoint class (whose multiplier of `subject` is read).
    pub class: Arc<str>,
    /// Requests per period.
    pub requests: u32,
    /// The period in seconds.
    pub period_s: u32,
}

/// What one rule's bucket says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RuleOutcome {
    /// The bucket held the request's hits.
    pub allowed: bool,
    /// Tokens left.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_ms: u64,
    /// Until the request's hits fit again (0 when allowed).
    pub retry_after_ms: u64,
    /// The multiplier applied (1 without one).
    pub multiplier: f64,
}

/// Counters longer than this are named by their SHA-256 (descriptor values come from
/// requests: a key stays short whatever a client sends).
const MAX_COUNTER_LEN: usize = 200;

/// The bucket name of a rule's counter: `rl~` and the counter, or its digest when long.
fn counter_name(counter: &str) -> String {
    use sha2::Digest;
    if counter.len() <= MAX_COUNTER_LEN {
        return format!("rl~{counter}");
    }
    let digest = sha2::Sha256::digest(counter.as_bytes());
    let mut name = String::with_capacity(3 + 64);
    name.push_str("rl#");
    for byte in digest {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

impl Limiter {
    /// Takes `cost` tokens from each rule bucket that holds them (each counts on its own,
    /// as envoyproxy/ratelimit's counters do; none when `consume` is false), in one call to
    /// the hot store.
    pub async fn check_rules(
        &self,
        buckets: &[RuleBucket],
        cost: u32,
        consume: bool,
    ) -> Result<Vec<RuleOutcome>, crate::store::Error> {
        let scopes: Vec<Scope> = buckets
            .iter()
            .map(|rule| {
                let subject = rule.subject.clone().unwrap_or_else(SubjectKey::global);
                let capacity = f64::from(rule.requests);
                let (bucket_key, bucket_id) =
                    self.bucket(&subject, &counter_name(&rule.counter), None);
                Scope {
                    budget: 0,
                    kind: ScopeKind::Global,
                    bucket_key,
                    bucket_id,
                    multiplier_key: self.keys.multiplier(&subject, &rule.class),
                    label: None,
                    params: bucket::Params {
                        capacity,
                        refill_per_s: capacity / f64::from(rule.period_s.max(1)),
                        multiplier: 1.0,
                    },
                    scale: 1.0,
                    share: None,
                    // Never blocking the others: each bucket is taken from on its own.
                    enforced: false,
                    default_multiplier: 1.0,
                    multiplier_override: rule.subject.is_none().then_some(1.0),
                    network_blocked: false,
                    guarded: false,
                    suspected: false,
                    subject,
                }
            })
            .collect();
        let request = LimitRequest {
            method: String::new(),
            endpoint: String::new(),
            ip: ClientIp::new(std::net::IpAddr::from([0, 0, 0, 0]), 64),
            user: None,
            device: None,
            tenant: None,
            recipient: None,
            cost,
            consume,
        };
        let now_us = self.clock.monotonic_us();
        let raw = self.evaluate(&scopes, &request, now_us).await?;
        Ok(scopes
            .iter()
            .zip(raw)
            .map(|(scope, raw)| {
                let raw = if consume {
                    raw
                } else {
                    raw.unconsumed(scope, cost)
                };
                RuleOutcome {
                    allowed: raw.allowed,
                    remaining: raw.remaining,
                    reset_ms: raw.reset_ms,
                    retry_after_ms: if raw.allowed {
                        0
                    } else {
                        raw.retry_after_ms.unwrap_or_else(|| {
                            raw.multiplier_ttl_ms
                                .filter(|&ms| ms > 0)
                                .unwrap_or(BLOCKED_RETRY_MS)
                        })
                    },
                    multiplier: raw.multiplier,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::counter_name;

    #[test]
    fn long_counters_are_named_by_their_digest() {
        assert_eq!(counter_name("d_k_v_"), "rl~d_k_v_");
        let long = format!("d_k_{}_", "x".repeat(500));
        let name = counter_name(&long);
        assert!(name.starts_with("rl#") && name.len() == 67, "{name}");
        assert_eq!(name, counter_name(&long));
        assert_ne!(name, counter_name(&format!("d_k_{}_", "y".repeat(500))));
    }
}
