//! envoyproxy/ratelimit descriptor rules on the Envoy path.
//!
//! For a request to a configured domain each descriptor is matched as upstream matches it
//! ([`crate::integrations::descriptors::Rules::lookup`]); `replaces` and `unlimited` are
//! applied over the request as upstream applies them; the matched limits' buckets are checked in one atomic
//! step ([`crate::limiter::Limiter::check_rules`]), only when Palisade's own check of the
//! request allowed it (a refused request spends no rule's tokens). A descriptor with a rule
//! is answered by its rule; the others by Palisade's scopes, as before.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock, RwLock};

use super::envoy_proto::{self as proto, Code, DescriptorStatus, RateLimitRequest};
use crate::integrations::descriptors::{Entry, Matched, MultiplierSource, Rules, Unit};
use crate::limiter::{LimitRequest, RuleBucket, RuleOutcome};
use crate::telemetry::metrics as names;

/// The rule answers of one request: per descriptor a status (None: no rule matched).
#[derive(Debug, Default)]
pub(super) struct RuleAnswer {
    pub statuses: Vec<Option<DescriptorStatus>>,
    /// An enforced rule (not in quota mode) is over, or every quota-mode rule is.
    pub over_limit: bool,
    /// The most limiting rule status (for the `x-ratelimit-*` headers).
    pub tightest: Option<DescriptorStatus>,
    /// The hot store could not be asked (the class's failure policy then applied).
    pub degraded: bool,
}

/// One descriptor's rule, after `replaces` and `unlimited`.
enum Rule {
    None,
    Unlimited(Matched),
    Limited(Matched, u32),
}

/// Each descriptor's rule (upstream's `constructLimitsToCheck`), and its hits.
fn rules_of(rules: &Rules, request: &RateLimitRequest) -> Result<Vec<Rule>, tonic::Status> {
    let mut found = Vec::with_capacity(request.descriptors.len());
    let mut replaced: HashSet<String> = HashSet::new();
    for descriptor in &request.descriptors {
        let entries = entries(descriptor);
        let override_limit = match &descriptor.limit {
            None => None,
            Some(limit) => Some((
                limit.requests_per_unit,
                Unit::from_proto(limit.unit).ok_or_else(|| {
                    tonic::Status::invalid_argument(format!(
                        "descriptor limit override has unknown unit {}",
                        limit.unit
                    ))
                })?,
            )),
        };
        let matched = rules.lookup(&request.domain, &entries, override_limit);
        if let Some(m) = &matched {
            replaced.extend(m.limit.replaces.iter().cloned());
        }
        let hits = descriptor
            .hits_addend
            .unwrap_or(u64::from(request.hits_addend))
            .max(1);
        let hits = u32::try_from(hits).map_err(|_| {
            tonic::Status::invalid_argument(format!("hits_addend {hits} is too large"))
        })?;
        found.push(match matched {
            None => Rule::None,
            Some(m) if m.limit.unlimited => Rule::Unlimited(m),
            Some(m) => Rule::Limited(m, hits),
        });
    }
    for rule in &mut found {
        if let Rule::Limited(m, _) = rule
            && !m.limit.name.is_empty()
            && replaced.contains(&m.limit.name)
        {
            *rule = Rule::None;
        }
    }
    Ok(found)
}

fn entries(descriptor: &proto::RateLimitDescriptor) -> Vec<Entry<'_>> {
    descriptor
        .entries
        .iter()
        .map(|e| Entry {
            key: &e.key,
            value: &e.value,
        })
        .collect()
}

/// The rules' answer for a request to a configured domain. `palisade` is the request as
/// Palisade's own check saw it (None when the descriptors name no client IP), `admitted`
/// whether that check allowed it.
pub(super) async fn answer(
    state: &crate::app::AppState,
    rules: &Rules,
    request: &RateLimitRequest,
    palisade: Option<&LimitRequest>,
    class: (Arc<str>, crate::config::FailMode),
    admitted: bool,
) -> Result<RuleAnswer, tonic::Status> {
    let found = rules_of(rules, request)?;
    let mut answer = RuleAnswer {
        statuses: vec![None; found.len()],
        ..RuleAnswer::default()
    };
    // Buckets grouped by hits (one atomic call per distinct hits count, usually one).
    let mut by_hits: Vec<(u32, Vec<(usize, RuleBucket)>)> = Vec::new();
    let mut immediate: Vec<(usize, RuleOutcome)> = Vec::new();
    for (i, rule) in found.iter().enumerate() {
        match rule {
            Rule::None => {}
            Rule::Unlimited(m) => {
                count(&request.domain, m, "unlimited");
                answer.statuses[i] = Some(DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                });
            }
            Rule::Limited(m, hits) => {
                let unit = m.limit.unit.unwrap_or(Unit::Second);
                let subject = m.limit.multiplier.and_then(|source| {
                    let request = palisade?;
                    match source {
                        MultiplierSource::Ip => Some(crate::model::SubjectKey::ip(&request.ip)),
                        MultiplierSource::User => request.user.clone(),
                        MultiplierSource::Device => request.device.clone(),
                    }
                });
                if m.limit.requests_per_unit == 0 {
                    // Nothing is ever allowed (upstream's way to ban a value): no bucket.
                    let period_ms = u64::from(unit.seconds()) * 1000;
                    immediate.push((
                        i,
                        RuleOutcome {
                            allowed: false,
                            remaining: 0,
                            reset_ms: 0,
                            retry_after_ms: period_ms,
                            multiplier: 1.0,
                        },
                    ));
                    continue;
                }
                let bucket = RuleBucket {
                    counter: m.counter_key(&request.domain, &entries(&request.descriptors[i])),
                    subject,
                    class: class.0.clone(),
                    requests: m.limit.requests_per_unit,
                    period_s: unit.seconds(),
                };
                match by_hits.iter_mut().find(|(h, _)| h == hits) {
                    Some((_, group)) => group.push((i, bucket)),
                    None => by_hits.push((*hits, vec![(i, bucket)])),
                }
            }
        }
    }
    let mut outcomes = immediate;
    for (hits, group) in by_hits {
        let buckets: Vec<RuleBucket> = group.iter().map(|(_, b)| b.clone()).collect();
        match state.limiter.check_rules(&buckets, hits, admitted).await {
            Ok(checked) => outcomes.extend(group.iter().map(|(i, _)| *i).zip(checked)),
            Err(err) => {
                tracing::warn!(error.cause = %err, "envoy rule buckets unavailable; the class's failure policy applies");
                answer.degraded = true;
                let allowed = class.1 == crate::config::FailMode::Open;
                outcomes.extend(group.iter().map(|(i, _)| {
                    (
                        *i,
                        RuleOutcome {
                            allowed,
                            remaining: 0,
                            reset_ms: 1000,
                            retry_after_ms: if allowed { 0 } else { 1000 },
                            multiplier: 1.0,
                        },
                    )
                }));
            }
        }
    }
    let mut quota = (0usize, 0usize);
    for (i, outcome) in outcomes {
        let Rule::Limited(m, _) = &found[i] else {
            continue;
        };
        let over = !outcome.allowed;
        let outcome_label = match (over, m.limit.shadow_mode) {
            (false, _) => "within_limit",
            (true, true) => "shadow_mode",
            (true, false) => "over_limit",
        };
        count(&request.domain, m, outcome_label);
        if m.limit.quota_mode {
            quota.0 += 1;
            quota.1 += usize::from(over && !m.limit.shadow_mode);
        } else if over && !m.limit.shadow_mode {
            answer.over_limit = true;
        }
        let status = status(m, &outcome);
        let tighter = answer
            .tightest
            .as_ref()
            .is_none_or(|t| status.limit_remaining < t.limit_remaining);
        if tighter {
            answer.tightest = Some(status.clone());
        }
        answer.statuses[i] = Some(status);
    }
    if quota.0 > 0 && quota.0 == quota.1 {
        answer.over_limit = true;
    }
    Ok(answer)
}

fn status(m: &Matched, outcome: &RuleOutcome) -> DescriptorStatus {
    let over = !outcome.allowed && !m.limit.shadow_mode;
    let unit = m.limit.unit.unwrap_or(Unit::Second);
    let quota = (f64::from(m.limit.requests_per_unit) * outcome.multiplier + 1e-9)
        .floor()
        .clamp(0.0, f64::from(u32::MAX)) as u32;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(proto::RateLimit {
            requests_per_unit: quota,
            unit: unit.to_proto(),
            name: m.limit.name.clone(),
        }),
        limit_remaining: if outcome.allowed {
            u32::try_from(outcome.remaining).unwrap_or(u32::MAX)
        } else {
            0
        },
        duration_until_reset: Some(super::envoy_proto::duration(outcome.reset_ms)),
        ..DescriptorStatus::default()
    }
}

/// Distinct rule labels exported before the configured key stands in for the rest: a
/// `detailed_metric` rule names request values, which an attacker chooses.
const MAX_RULE_LABELS: usize = 2_000;

fn count(domain: &str, m: &Matched, outcome: &'static str) {
    static SEEN: OnceLock<RwLock<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    // Known keys (every hit but a key's first) take only the shared lock.
    let known = seen
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .contains(&m.stats_key);
    let label = if known {
        m.stats_key.clone()
    } else {
        let mut seen = seen
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() < MAX_RULE_LABELS {
            seen.insert(m.stats_key.clone());
            m.stats_key.clone()
        } else if seen.contains(&m.stats_key) {
            m.stats_key.clone()
        } else {
            m.limit.full_key.clone()
        }
    };
    metrics::counter!(
        names::ENVOY_RULE_HITS_TOTAL,
        "domain" => domain.to_owned(),
        "rule" => label,
        "outcome" => outcome
    )
    .increment(1);
}
