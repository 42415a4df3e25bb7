//! The in-process backend: every scope's bucket checked and taken under one lock of the
//! in-process hot store, with the same arithmetic as `lua/token_bucket.lua` ([`bucket`]).

use super::request::LimitRequest;
use super::scopes::Scope;

use super::{Limiter, RawOutcome, bucket};
use crate::store::MemoryHot;

impl Limiter {
    pub(super) fn evaluate_memory(
        &self,
        memory: &MemoryHot,
        scopes: &[Scope],
        request: &LimitRequest,
        now_us: u64,
    ) -> smallvec::SmallVec<[RawOutcome; 8]> {
        let multipliers: smallvec::SmallVec<[(f64, Option<u64>); 8]> = scopes
            .iter()
            .map(|s| match s.multiplier_override {
                Some(value) => (value, None),
                // No key: nothing was stored when the scopes were made.
                None if s.multiplier_key.is_empty() => (s.default_multiplier, None),
                None => memory
                    .multiplier(&s.multiplier_key, now_us)
                    .map_or((s.default_multiplier, None), |(value, ttl_us)| {
                        (value.max(0.0), ttl_us)
                    }),
            })
            .collect();
        let ids: smallvec::SmallVec<[u64; 8]> = scopes.iter().map(|s| s.bucket_id).collect();
        let cost = f64::from(request.cost);
        let now = now_us as f64;
        memory.update_buckets_by_id(&ids, now, |states, writes| {
            let verdicts: smallvec::SmallVec<[bucket::Verdict; 8]> = scopes
                .iter()
                .zip(states)
                .zip(&multipliers)
                .map(|((scope, state), (m, _))| {
                    let params = bucket::Params {
                        multiplier: *m,
                        ..scope.params
                    };
                    bucket::evaluate(*state, now, params, cost)
                })
                .collect();
            let admitted = scopes
                .iter()
                .zip(&verdicts)
                .all(|(s, v)| v.allowed || !s.enforced);
            for (write, v) in writes.iter_mut().zip(&verdicts) {
                *write = (admitted && request.consume && v.allowed).then_some(v.new_tat);
            }
            verdicts
                .iter()
                .zip(&multipliers)
                .map(|(v, (m, ttl_us))| RawOutcome {
                    allowed: v.allowed,
                    limit: (v.limit + 1e-9).floor() as u64,
                    remaining: v.remaining,
                    reset_ms: bucket::ceil_ms(v.reset_us),
                    retry_after_ms: v
                        .retry_after_us
                        .is_finite()
                        .then(|| bucket::ceil_ms(v.retry_after_us)),
                    multiplier: *m,
                    multiplier_ttl_ms: ttl_us.map(|us| us.div_ceil(1000)),
                })
                .collect()
        })
    }
}
