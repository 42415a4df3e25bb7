//! The limit check on a Redis Cluster: one phase, and calls shared by concurrent checks.
//!
//! A script call may touch one slot only, so a check's scopes are grouped by slot (their
//! hash tag: a shard of subjects, [`crate::store::keys`]). Every group is checked and
//! consumed at once, each group atomically, all groups in parallel. When some group refuses
//! the check, the groups that consumed give it back (mode 2 of `lua/token_bucket.lua`): the
//! cluster never admits more than a bucket allows, and a check refused elsewhere holds a
//! token only for the round trip of its refund (concurrent checks may be refused meanwhile:
//! it can under-admit, never over-admit).
//!
//! Checks in flight meet per slot ([`SharedCalls`]), as on one Redis.

use std::sync::Arc;

use super::calls::{SharedCalls, run};
use super::script::Mode;
use super::{LimitRequest, RawOutcome, Scope};
use crate::store::keys::{self, Keys};
use crate::store::{Error, RedisHot};

/// Answers a check on a cluster (see the module's comment).
pub(super) async fn evaluate(
    redis: &RedisHot,
    slots: Option<&Arc<SharedCalls>>,
    scopes: &[Scope],
    request: &LimitRequest,
) -> Result<Vec<RawOutcome>, Error> {
    // Per slot: the scopes' places in the request (a handful of groups: a short list).
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::with_capacity(scopes.len());
    for (i, scope) in scopes.iter().enumerate() {
        let slot = keys::slot(Keys::hash_tag(&scope.bucket_key).as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, at)) => at.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    let mode = if request.consume {
        Mode::Consume
    } else {
        Mode::Check
    };
    let cost = request.cost;
    let answers = futures_util::future::try_join_all(
        groups
            .iter()
            .map(|(slot, at)| run(redis, slots, *slot, scopes, at, cost, mode)),
    )
    .await?;
    let mut outcomes: Vec<Option<RawOutcome>> = vec![None; scopes.len()];
    let mut admitted = true;
    for ((_, at), (group_admitted, raw)) in groups.iter().zip(&answers) {
        admitted &= group_admitted;
        for (&i, outcome) in at.iter().zip(raw) {
            outcomes[i] = Some(*outcome);
        }
    }
    if !admitted && request.consume && groups.len() > 1 {
        // The groups that admitted consumed where their scopes allowed: give it back.
        let refunds: Vec<(u16, Vec<usize>)> = groups
            .iter()
            .zip(&answers)
            .filter(|(_, (group_admitted, _))| *group_admitted)
            .map(|((slot, at), _)| {
                let consumed = at
                    .iter()
                    .copied()
                    .filter(|&i| outcomes[i].is_some_and(|o| o.allowed))
                    .collect();
                (*slot, consumed)
            })
            .filter(|(_, at): &(u16, Vec<usize>)| !at.is_empty())
            .collect();
        let refunded = futures_util::future::try_join_all(
            refunds
                .iter()
                .map(|(slot, at)| run(redis, slots, *slot, scopes, at, cost, Mode::Refund)),
        )
        .await;
        match refunded {
            Ok(_) => {
                for i in refunds.iter().flat_map(|(_, at)| at.iter().copied()) {
                    if let Some(outcome) = &mut outcomes[i] {
                        outcome.remaining =
                            (outcome.remaining + u64::from(request.cost)).min(outcome.limit);
                    }
                }
            }
            // The check stays refused; the tokens stay spent until they refill (the cluster
            // under-admits, never over-admits).
            Err(error) => tracing::debug!(error.cause = %error, "a refused check's refund failed"),
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}
