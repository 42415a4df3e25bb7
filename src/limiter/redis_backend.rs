//! The Redis backend: `lua/token_bucket.lua` on one Redis; on a cluster, [`super::cluster`].
//!
//! Single node: one EVALSHA checks and consumes every scope atomically, and checks that
//! arrive while earlier ones are on their way to Redis are coalesced into one call
//! ([`SharedCalls`]).

use std::sync::Arc;

use super::calls::{SharedCalls, run};
use super::script::Mode;
use super::{LimitRequest, RawOutcome, Scope};
use crate::store::{Error, RedisHot};

/// Coalesces concurrent checks into shared script calls, on one Redis and per slot on a
/// cluster ([`SharedCalls`]).
///
/// A check that finds a call slot free goes at once (no added wait); when all
/// `limits.coalesce_in_flight` calls are on their way (default 4), the checks that arrive
/// meanwhile are sent together in the next; on a cluster a quarter as many per slot (at
/// least 1). Off (`limits.coalesce = false`), every check is a call of its own (a call per
/// slot on a cluster). `LOAD_ONLY=coalesce cargo bench --bench load` measures both.
///
/// The script calls take the store's interactive connection ([`RedisHot::interactive`]): on
/// the shared one a check would queue behind whatever bulk commands were written before it
/// (an ingest batch is thousands).
#[derive(Debug)]
pub(super) struct Coalescer {
    calls: Option<Arc<SharedCalls>>,
    checks: Option<RedisHot>,
}

impl Coalescer {
    /// The coalescer of `redis` (none for the in-process store).
    pub(super) fn new(redis: Option<&RedisHot>, enabled: bool, in_flight: usize) -> Self {
        // Per slot on a cluster, a quarter as many: a check's groups spread over 16 slots,
        // and fewer calls per slot on their way let more groups meet in the next
        // (`LOAD_ONLY=cluster cargo bench --bench load`).
        let calls = redis.filter(|_| enabled).map(|redis| {
            SharedCalls::new(if redis.is_cluster() {
                in_flight.div_ceil(4)
            } else {
                in_flight
            })
        });
        Self {
            calls,
            checks: redis.map(RedisHot::interactive),
        }
    }
}

pub(super) async fn evaluate(
    redis: &RedisHot,
    coalescer: &Coalescer,
    scopes: &[Scope],
    request: &LimitRequest,
) -> Result<Vec<RawOutcome>, Error> {
    if scopes.is_empty() {
        return Ok(Vec::new());
    }
    let redis = coalescer.checks.as_ref().unwrap_or(redis);
    if redis.is_cluster() {
        return super::cluster::evaluate(redis, coalescer.calls.as_ref(), scopes, request).await;
    }
    // One Redis: every scope in one group, every check in one queue (slot 0).
    let every: Vec<usize> = (0..scopes.len()).collect();
    let mode = Mode::of(request.consume);
    let (_, outcomes) = run(
        redis,
        coalescer.calls.as_ref(),
        0,
        scopes,
        &every,
        request.cost,
        mode,
    )
    .await?;
    Ok(outcomes)
}
