//! The Redis backend: `lua/token_bucket.lua` over one or, on a cluster, several slots.
//!
//! Single node: one EVALSHA checks and consumes every scope atomically. Cluster: a script
//! can only touch one slot, so scopes are grouped by subject (their hash tag). With one
//! group nothing changes. With several, every group is first checked without consuming;
//! only if all admit is each group consumed, re-checking atomically per group. A race
//! between the two phases can consume in some groups and then deny in another: the cluster
//! may under-admit slightly, and never admits more than any bucket allows.

use std::collections::BTreeMap;

use redis::Value;

use super::{LimitRequest, RawOutcome, Scope};
use crate::store::scripts::TOKEN_BUCKET;
use crate::store::{Error, RedisHot};

const VALUES_PER_SCOPE: usize = 7;

pub(super) async fn evaluate(
    redis: &RedisHot,
    scopes: &[Scope],
    request: &LimitRequest,
) -> Result<Vec<RawOutcome>, Error> {
    if scopes.is_empty() {
        return Ok(Vec::new());
    }
    if !redis.is_cluster() {
        let indices: Vec<usize> = (0..scopes.len()).collect();
        return Ok(run(redis, scopes, &indices, request.cost, request.consume)
            .await?
            .1);
    }
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, scope) in scopes.iter().enumerate() {
        groups.entry(scope.subject.to_string()).or_default().push(i);
    }
    let mut outcomes: Vec<Option<RawOutcome>> = vec![None; scopes.len()];
    let single = groups.len() == 1;
    let mut admitted = true;
    for indices in groups.values() {
        let (group_admitted, raw) = run(
            redis,
            scopes,
            indices,
            request.cost,
            request.consume && single,
        )
        .await?;
        admitted &= group_admitted;
        for (&i, outcome) in indices.iter().zip(raw) {
            outcomes[i] = Some(outcome);
        }
    }
    if admitted && request.consume && !single {
        for indices in groups.values() {
            let (_, raw) = run(redis, scopes, indices, request.cost, true).await?;
            for (&i, outcome) in indices.iter().zip(raw) {
                outcomes[i] = Some(outcome);
            }
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}

async fn run(
    redis: &RedisHot,
    scopes: &[Scope],
    indices: &[usize],
    cost: u32,
    consume: bool,
) -> Result<(bool, Vec<RawOutcome>), Error> {
    let mut keys = Vec::with_capacity(indices.len() * 2);
    let mut args = Vec::with_capacity(2 + indices.len() * 4);
    args.push(cost.to_string());
    args.push(if consume { "1" } else { "0" }.to_owned());
    for &i in indices {
        let scope = &scopes[i];
        keys.push(scope.bucket_key.clone());
        keys.push(scope.multiplier_key.clone());
        args.push(scope.params.capacity.to_string());
        args.push(scope.params.refill_per_s.to_string());
        args.push(if scope.enforced { "1" } else { "0" }.to_owned());
        args.push(scope.default_multiplier.to_string());
    }
    let reply: Vec<Value> = redis.eval(&TOKEN_BUCKET, &keys, &args).await?;
    parse(&reply, indices.len())
}

fn int(value: &Value) -> Result<i64, Error> {
    match value {
        Value::Int(i) => Ok(*i),
        other => Err(bad_reply(format!("expected an integer, got {other:?}"))),
    }
}

fn bad_reply(message: String) -> Error {
    Error::Redis(redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected token_bucket.lua reply",
        message,
    )))
}

fn non_negative(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn parse(reply: &[Value], scopes: usize) -> Result<(bool, Vec<RawOutcome>), Error> {
    if reply.len() != 1 + scopes * VALUES_PER_SCOPE {
        return Err(bad_reply(format!(
            "{} values for {scopes} scopes",
            reply.len()
        )));
    }
    let admitted = int(&reply[0])? == 1;
    let outcomes = reply[1..]
        .chunks(VALUES_PER_SCOPE)
        .map(|v| {
            let retry = int(&v[4])?;
            let pttl = int(&v[6])?;
            Ok(RawOutcome {
                allowed: int(&v[0])? == 1,
                limit: non_negative(int(&v[1])?),
                remaining: non_negative(int(&v[2])?),
                reset_ms: non_negative(int(&v[3])?),
                retry_after_ms: (retry >= 0).then(|| non_negative(retry)),
                multiplier: int(&v[5])? as f64 / 1e6,
                multiplier_ttl_ms: (pttl > 0).then(|| non_negative(pttl)),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok((admitted, outcomes))
}
