//! A check when the hot store fails: a class that fails open allows every scope (counted
//! and logged as `fail_open`); one that fails closed answers [`Error::FailClosed`].

use std::sync::Arc;

use super::budgets::Budgets;
use super::request::{Decision, Error};
use super::scopes::Scope;

use super::{Limiter, RawOutcome};
use crate::config::FailMode;
use crate::telemetry::metrics as names;

impl Limiter {
    pub(super) fn degraded(
        &self,
        budgets: &Budgets,
        class: usize,
        class_name: Arc<str>,
        scopes: &[Scope],
        now_ms: i64,
        source: crate::store::Error,
    ) -> Result<Decision, Error> {
        let fail = budgets.classes[class].fail;
        let outcome_label = match fail {
            FailMode::Open => "fail_open",
            FailMode::Closed => "fail_closed",
        };
        metrics::counter!(names::FAIL_OPEN_TOTAL, "class" => class_name.to_string(), "outcome" => outcome_label)
            .increment(1);
        tracing::warn!(endpoint.class = %class_name, error.cause = %source, "hot store unavailable: {outcome_label}");
        match fail {
            FailMode::Closed => {
                metrics::counter!(names::LIMIT_DECISIONS_TOTAL, "class" => class_name.to_string(), "scope" => "none", "outcome" => outcome_label)
                    .increment(1);
                Err(Error::FailClosed {
                    class: class_name.to_string(),
                    source,
                })
            }
            FailMode::Open => {
                let outcomes = scopes
                    .iter()
                    .map(|scope| {
                        let capacity = scope.params.capacity as u64;
                        let raw = RawOutcome {
                            allowed: true,
                            limit: capacity,
                            remaining: capacity,
                            reset_ms: 0,
                            retry_after_ms: Some(0),
                            multiplier: 1.0,
                            multiplier_ttl_ms: None,
                        };
                        self.outcome(budgets, scope, raw)
                    })
                    .collect();
                Ok(self.conclude(
                    (class_name, &budgets.classes[class].metrics),
                    outcomes,
                    now_ms,
                    true,
                    false,
                ))
            }
        }
    }
}
