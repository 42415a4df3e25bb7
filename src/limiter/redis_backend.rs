//! The Redis backend: `lua/token_bucket.lua` over one or, on a cluster, several slots.
//!
//! Single node: one EVALSHA checks and consumes every scope atomically, and checks that
//! arrive while earlier ones are on their way to Redis are coalesced into one call
//! ([`Coalescer`]): the script runs them one after another, each seeing the ones before, so
//! every answer is the one a call of its own would have got. Cluster: a script
//! can only touch one slot, so scopes are grouped by subject (their hash tag). With one
//! group nothing changes. With several, every group is first checked without consuming;
//! only if all admit is each group consumed, re-checking atomically per group. A race
//! between the two phases can consume in some groups and then deny in another: the cluster
//! may under-admit slightly, and never admits more than any bucket allows.

use std::collections::BTreeMap;

use super::{LimitRequest, RawOutcome, Scope};
use crate::store::pipe::{Part, ScriptPipe, Settings as PipeSettings};
use crate::store::scripts::{TOKEN_BUCKET, TOKEN_BUCKET_SOURCE};
use crate::store::{Error, RedisHot};
use crate::telemetry::metrics as names;

const VALUES_PER_SCOPE: usize = 7;
/// Bytes per value of the script's reply (little-endian i64).
const VALUE_BYTES: usize = 8;

/// Most checks in one call.
const MAX_BATCH: usize = 64;

/// Coalesces concurrent checks on a single Redis into shared script calls, on a connection
/// of their own ([`ScriptPipe`]).
///
/// A check that finds a call slot free goes at once (no added wait); when all
/// `limits.coalesce_in_flight` calls are on their way (default 4: 8.5 checks per call and
/// 28 % less Redis CPU per check than a call each, at 50 concurrent checks;
/// `LOAD_ONLY=coalesce cargo bench --bench load`), the checks that arrive meanwhile are sent
/// together in the next. Off (`limits.coalesce = false`) or on a cluster, every check is a
/// call of its own on the shared connection.
#[derive(Debug)]
pub(super) struct Coalescer {
    pipe: Option<ScriptPipe>,
}

impl Coalescer {
    /// The coalescer of `redis` (none for the in-process store).
    pub(super) fn new(redis: Option<&RedisHot>, enabled: bool, in_flight: usize) -> Self {
        let pipe = redis
            .filter(|_| enabled)
            .and_then(|redis| Some((redis.pipe_target()?.clone(), redis.timeout())))
            .map(|(target, timeout)| {
                ScriptPipe::following(
                    target,
                    TOKEN_BUCKET_SOURCE,
                    PipeSettings {
                        timeout,
                        in_flight: in_flight.max(1),
                        max_parts: MAX_BATCH,
                        parts_metric: names::LIMIT_COALESCED_CHECKS,
                    },
                )
            });
        Self { pipe }
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
    if let Some(pipe) = &coalescer.pipe {
        // Each key and argument is preceded by its RESP length line (`$NN\r\n`) and
        // followed by `\r\n`: sized once, the part is written without growing.
        let key_bytes = scopes
            .iter()
            .map(|s| s.bucket_key.len() + s.multiplier_key.len() + 2 * 10)
            .sum();
        let mut part = Part::with_capacity(key_bytes, 3 * 8 + scopes.len() * 4 * 16);
        write_keys(&mut part, scopes);
        write_args(&mut part, scopes, request.cost, request.consume);
        let reply = redis
            .health()
            .record(pipe.call(part, reply_len(scopes.len())).await)?;
        return Ok(parse(&reply, scopes.len())?.1);
    }
    if !redis.is_cluster() {
        return Ok(run(redis, scopes, request.cost, request.consume).await?.1);
    }
    // Per subject (one slot): the scopes' places in the request, and the scopes.
    let mut groups: BTreeMap<String, (Vec<usize>, Vec<Scope>)> = BTreeMap::new();
    for (i, scope) in scopes.iter().enumerate() {
        let (indices, group) = groups.entry(scope.subject.to_string()).or_default();
        indices.push(i);
        group.push(scope.clone());
    }
    let mut outcomes: Vec<Option<RawOutcome>> = vec![None; scopes.len()];
    let single = groups.len() == 1;
    // Every slot's group is checked at once (one round trip for all, each on its node's
    // multiplexed connection), then, if all admit, consumed at once.
    let checked = futures_util::future::try_join_all(
        groups
            .values()
            .map(|(_, group)| run(redis, group, request.cost, request.consume && single)),
    )
    .await?;
    let mut admitted = true;
    for ((indices, _), (group_admitted, raw)) in groups.values().zip(checked) {
        admitted &= group_admitted;
        for (&i, outcome) in indices.iter().zip(raw) {
            outcomes[i] = Some(outcome);
        }
    }
    if admitted && request.consume && !single {
        let consumed = futures_util::future::try_join_all(
            groups
                .values()
                .map(|(_, group)| run(redis, group, request.cost, true)),
        )
        .await?;
        for ((indices, _), (_, raw)) in groups.values().zip(consumed) {
            for (&i, outcome) in indices.iter().zip(raw) {
                outcomes[i] = Some(outcome);
            }
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}

/// Where a script call's keys and arguments are written: a command of its own, or a part
/// of a coalesced call.
trait ScriptArgs {
    fn key(&mut self, key: &str);
    fn int(&mut self, value: i64);
    fn text(&mut self, value: &str);
}

impl ScriptArgs for redis::Cmd {
    fn key(&mut self, key: &str) {
        self.arg(key);
    }
    fn int(&mut self, value: i64) {
        self.arg(value);
    }
    fn text(&mut self, value: &str) {
        self.arg(value);
    }
}

impl ScriptArgs for Part {
    fn key(&mut self, key: &str) {
        Part::key(self, key.as_bytes());
    }
    fn int(&mut self, value: i64) {
        Part::int(self, value);
    }
    fn text(&mut self, value: &str) {
        Part::arg(self, value.as_bytes());
    }
}

/// One request's keys: per scope its bucket and multiplier key.
fn write_keys(out: &mut impl ScriptArgs, scopes: &[Scope]) {
    for scope in scopes {
        out.key(&scope.bucket_key);
        out.key(&scope.multiplier_key);
    }
}

/// One request's arguments (after the call's leading request count): cost, consume, number
/// of scopes, then per scope capacity, refill per second, enforce, default multiplier (or
/// `=m`: the multiplier to use whatever is published).
fn write_args(out: &mut impl ScriptArgs, scopes: &[Scope], cost: u32, consume: bool) {
    out.int(cost.into());
    out.int(consume.into());
    out.int(scopes.len() as i64);
    for scope in scopes {
        number_arg(out, scope.params.capacity);
        number_arg(out, scope.params.refill_per_s);
        out.int(scope.enforced.into());
        match scope.multiplier_override {
            Some(value) => out.text(&format!("={value}")),
            None => number_arg(out, scope.default_multiplier),
        }
    }
}

/// A number for the script (its `tonumber` reads `10` as it reads `10.0`): a whole one, as
/// capacities, refill rates and multipliers nearly always are, written as an integer
/// (formatting a float cost a check about as much as the rest of its arguments together).
fn number_arg(out: &mut impl ScriptArgs, value: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact.
    if value.fract() == 0.0 && value.abs() < EXACT {
        out.int(value as i64);
    } else {
        out.text(&value.to_string());
    }
}

/// The length of one request's part of the script's reply.
fn reply_len(scopes: usize) -> usize {
    (1 + scopes * VALUES_PER_SCOPE) * VALUE_BYTES
}

/// One request of its own (on a cluster: one group, one slot).
async fn run(
    redis: &RedisHot,
    scopes: &[Scope],
    cost: u32,
    consume: bool,
) -> Result<(bool, Vec<RawOutcome>), Error> {
    let mut cmd = RedisHot::evalsha(&TOKEN_BUCKET, 2 * scopes.len());
    write_keys(&mut cmd, scopes);
    cmd.arg(1);
    write_args(&mut cmd, scopes, cost, consume);
    let reply: Vec<u8> = redis.run_script(&TOKEN_BUCKET, &cmd).await?;
    parse(&reply, scopes.len())
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

/// One request's part of the script's reply: `1 + 7 × scopes` little-endian i64 values.
fn parse(reply: &[u8], scopes: usize) -> Result<(bool, Vec<RawOutcome>), Error> {
    if reply.len() != reply_len(scopes) {
        return Err(bad_reply(format!(
            "{} bytes for {scopes} scopes",
            reply.len()
        )));
    }
    let values: Vec<i64> = reply
        .chunks_exact(VALUE_BYTES)
        .map(|v| i64::from_le_bytes(v.try_into().expect("chunks of 8 bytes")))
        .collect();
    let admitted = values[0] == 1;
    let outcomes = values[1..]
        .chunks_exact(VALUES_PER_SCOPE)
        .map(|v| RawOutcome {
            allowed: v[0] == 1,
            limit: non_negative(v[1]),
            remaining: non_negative(v[2]),
            reset_ms: non_negative(v[3]),
            retry_after_ms: (v[4] >= 0).then(|| non_negative(v[4])),
            multiplier: v[5] as f64 / 1e6,
            multiplier_ttl_ms: (v[6] > 0).then(|| non_negative(v[6])),
        })
        .collect();
    Ok((admitted, outcomes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(value: f64) -> String {
        let mut cmd = redis::cmd("EVALSHA");
        number_arg(&mut cmd, value);
        match cmd.args_iter().nth(1) {
            Some(redis::Arg::Simple(bytes)) => String::from_utf8(bytes.to_vec()).unwrap(),
            other => panic!("unexpected argument {other:?}"),
        }
    }

    #[test]
    fn numbers_reach_the_script_as_lua_reads_them() {
        // Whole numbers as integers, the rest as floats; Lua's `tonumber` gives the same
        // value for either spelling, and for what a float argument was before.
        for (value, text) in [
            (10.0, "10"),
            (1.0, "1"),
            (0.0, "0"),
            (100_000.0, "100000"),
            (0.5, "0.5"),
            (1.0 / 60.0, "0.016666666666666666"),
            (-2.5, "-2.5"),
            // Past 2^53 a float, in Rust's shortest exact decimal (Lua reads it back).
            (1e300, &*format!("1{}", "0".repeat(300))),
        ] {
            let got = written(value);
            assert_eq!(got, text, "{value}");
            assert_eq!(got.parse::<f64>().unwrap(), value, "{value}");
        }
    }
}
