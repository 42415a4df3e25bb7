//! L1: an in-process cache of buckets known to be blocked, so a hot blocked key (a client
//! hammering after its 429) is answered without a Redis round trip.
//!
//! An entry lives for `min(ttl, retry_after)`: a bucket only refills, so a request of at
//! least the denied cost stays denied until then. It keeps the whole decision (every scope),
//! so a cached answer has the same headers as a fresh one, with waits shortened by the time
//! since; other scopes' figures may be up to the TTL old. A published multiplier clears it.

use std::sync::Arc;
use std::time::Duration;

use super::ScopeOutcome;

const CAPACITY: usize = 100_000;

#[derive(Debug)]
struct Blocked {
    until_us: u64,
    recorded_us: u64,
    min_cost: u32,
    outcomes: Arc<Vec<ScopeOutcome>>,
}

/// The cache (disabled when the TTL is 0). Bounded and concurrent (`quick_cache`): every
/// check on Redis looks its enforced scopes up here, so lookups of different keys do not
/// wait on one lock, and a full cache evicts the least used entries, never everything.
#[derive(Debug)]
pub(super) struct L1 {
    ttl_us: u64,
    entries: quick_cache::sync::Cache<String, Arc<Blocked>>,
}

impl L1 {
    pub(super) fn new(ttl: Duration) -> Self {
        Self {
            ttl_us: u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX),
            entries: quick_cache::sync::Cache::new(CAPACITY),
        }
    }

    /// Remembers that `key` denied a request of `cost`, with the decision's scopes.
    pub(super) fn remember(
        &self,
        key: &str,
        cost: u32,
        retry_after_ms: u64,
        outcomes: &Arc<Vec<ScopeOutcome>>,
        now_us: u64,
    ) {
        if self.ttl_us == 0 {
            return;
        }
        let hold_us = self.ttl_us.min(retry_after_ms.saturating_mul(1000));
        if hold_us == 0 {
            return;
        }
        self.entries.insert(
            key.to_owned(),
            Arc::new(Blocked {
                until_us: now_us + hold_us,
                recorded_us: now_us,
                min_cost: cost,
                outcomes: outcomes.clone(),
            }),
        );
    }

    /// The cached decision's scopes for `key`, with waits shortened by the time since it was
    /// recorded, if a request of `cost` is still certain to be denied.
    pub(super) fn blocked(&self, key: &str, cost: u32, now_us: u64) -> Option<Vec<ScopeOutcome>> {
        if self.ttl_us == 0 {
            return None;
        }
        let entry = self.entries.get(key)?;
        if entry.until_us <= now_us || cost < entry.min_cost {
            return None;
        }
        let elapsed_ms = (now_us - entry.recorded_us) / 1000;
        let outcomes = entry
            .outcomes
            .iter()
            .map(|outcome| {
                let mut outcome = outcome.clone();
                if !outcome.allowed {
                    outcome.retry_after_ms =
                        outcome.retry_after_ms.saturating_sub(elapsed_ms).max(1);
                }
                outcome.reset_ms = outcome.reset_ms.saturating_sub(elapsed_ms);
                outcome
            })
            .collect();
        Some(outcomes)
    }

    /// Forgets every entry.
    pub(super) fn clear(&self) {
        self.entries.clear();
    }
}
