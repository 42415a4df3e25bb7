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
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{LimitRequest, RawOutcome, Scope};
use crate::store::scripts::TOKEN_BUCKET;
use crate::store::{Error, RedisHot};
use crate::telemetry::metrics as names;

const VALUES_PER_SCOPE: usize = 7;
/// Bytes per value of the script's reply (little-endian i64).
const VALUE_BYTES: usize = 8;

/// Most checks in one call.
const MAX_BATCH: usize = 64;

/// One check's answer from a coalesced call (the call's error is shared by its checks).
type Answer = Result<(bool, Vec<RawOutcome>), Arc<Error>>;

/// One check waiting for a coalesced call.
#[derive(Debug)]
struct Job {
    scopes: Vec<Scope>,
    cost: u32,
    consume: bool,
    reply: oneshot::Sender<Answer>,
}

/// Coalesces concurrent checks on a single Redis into shared script calls.
///
/// A check that finds a call slot free goes at once (no added wait); when all
/// `limits.coalesce_in_flight` slots are busy (default 4: 8.8 checks per call and 20 % less
/// Redis CPU per check at 50 concurrent checks, where 16 gave 2.6 per call;
/// `LOAD_ONLY=coalesce cargo bench --bench load`), the checks that arrive meanwhile are sent
/// together. The queue is drained by a task started on first use (and again if its runtime
/// went away).
#[derive(Debug)]
pub(super) struct Coalescer {
    enabled: bool,
    /// Script calls on their way to Redis; shared by direct calls and coalesced ones.
    slots: Arc<Semaphore>,
    queue: Mutex<Option<mpsc::UnboundedSender<Job>>>,
}

impl Coalescer {
    /// `enabled: false` (`limits.coalesce = false`): one script call per check.
    pub(super) fn new(enabled: bool, in_flight: usize) -> Self {
        Self {
            enabled,
            slots: Arc::new(Semaphore::new(in_flight.max(1))),
            queue: Mutex::new(None),
        }
    }

    fn submit(&self, redis: &RedisHot, job: Job) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let job = match queue.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                // The draining task's runtime went away: start another on this one.
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(drain(redis.clone(), self.slots.clone(), rx));
        // The receiver was just created and is alive: the send cannot fail.
        let _ = tx.send(job);
        *queue = Some(tx);
    }
}

async fn drain(redis: RedisHot, slots: Arc<Semaphore>, mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH
            && let Ok(job) = rx.try_recv()
        {
            jobs.push(job);
        }
        let redis = redis.clone();
        tokio::spawn(async move {
            run_jobs(&redis, jobs).await;
            drop(slot);
        });
    }
}

/// One script call for all `jobs`; each gets its own answer (or the call's error).
async fn run_jobs(redis: &RedisHot, jobs: Vec<Job>) {
    metrics::histogram!(names::LIMIT_COALESCED_CHECKS).record(jobs.len() as f64);
    let mut cmd = RedisHot::evalsha(&TOKEN_BUCKET, jobs.iter().map(|j| 2 * j.scopes.len()).sum());
    for job in &jobs {
        write_keys(&mut cmd, &job.scopes);
    }
    cmd.arg(jobs.len());
    for job in &jobs {
        write_args(&mut cmd, &job.scopes, job.cost, job.consume);
    }
    match redis.run_script::<Vec<u8>>(&TOKEN_BUCKET, &cmd).await {
        Err(error) => {
            let error = Arc::new(error);
            for job in jobs {
                // The caller may have gone (its request was cancelled): nothing to tell.
                let _ = job.reply.send(Err(error.clone()));
            }
        }
        Ok(reply) => {
            let mut rest = &reply[..];
            for job in jobs {
                let (mine, tail) = rest.split_at(
                    ((1 + job.scopes.len() * VALUES_PER_SCOPE) * VALUE_BYTES).min(rest.len()),
                );
                rest = tail;
                let _ = job
                    .reply
                    .send(parse(mine, job.scopes.len()).map_err(Arc::new));
            }
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
    if !redis.is_cluster() && coalescer.enabled {
        // A free slot: this check goes at once, on its own (no queue, no other task).
        if let Ok(slot) = coalescer.slots.clone().try_acquire_owned() {
            let answer = run(redis, scopes, request.cost, request.consume).await;
            drop(slot);
            return Ok(answer?.1);
        }
        let (reply, answer) = oneshot::channel();
        coalescer.submit(
            redis,
            Job {
                scopes: scopes.to_vec(),
                cost: request.cost,
                consume: request.consume,
                reply,
            },
        );
        return match answer.await {
            Ok(Ok((_, outcomes))) => Ok(outcomes),
            Ok(Err(error)) => Err(Error::Unavailable {
                store: "hot",
                source: Box::new(error),
            }),
            Err(_) => Err(Error::Unavailable {
                store: "hot",
                source: "the coalesced call was cancelled (runtime shutting down)".into(),
            }),
        };
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
    let mut admitted = true;
    for (indices, group) in groups.values() {
        let (group_admitted, raw) =
            run(redis, group, request.cost, request.consume && single).await?;
        admitted &= group_admitted;
        for (&i, outcome) in indices.iter().zip(raw) {
            outcomes[i] = Some(outcome);
        }
    }
    if admitted && request.consume && !single {
        for (indices, group) in groups.values() {
            let (_, raw) = run(redis, group, request.cost, true).await?;
            for (&i, outcome) in indices.iter().zip(raw) {
                outcomes[i] = Some(outcome);
            }
        }
    }
    Ok(outcomes.into_iter().flatten().collect())
}

/// One request's keys: per scope its bucket and multiplier key.
fn write_keys(cmd: &mut redis::Cmd, scopes: &[Scope]) {
    for scope in scopes {
        cmd.arg(&scope.bucket_key).arg(&scope.multiplier_key);
    }
}

/// One request's arguments (after the call's leading request count): cost, consume, number
/// of scopes, then per scope capacity, refill per second, enforce, default multiplier (or
/// `=m`: the multiplier to use whatever is published).
fn write_args(cmd: &mut redis::Cmd, scopes: &[Scope], cost: u32, consume: bool) {
    cmd.arg(cost).arg(u8::from(consume)).arg(scopes.len());
    for scope in scopes {
        number_arg(cmd, scope.params.capacity);
        number_arg(cmd, scope.params.refill_per_s);
        cmd.arg(u8::from(scope.enforced));
        match scope.multiplier_override {
            Some(value) => {
                cmd.arg(format!("={value}"));
            }
            None => number_arg(cmd, scope.default_multiplier),
        }
    }
}

/// A number for the script (its `tonumber` reads `10` as it reads `10.0`): a whole one, as
/// capacities, refill rates and multipliers nearly always are, written as an integer
/// (formatting a float cost a check about as much as the rest of its arguments together).
fn number_arg(cmd: &mut redis::Cmd, value: f64) {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact.
    if value.fract() == 0.0 && value.abs() < EXACT {
        cmd.arg(value as i64);
    } else {
        cmd.arg(value);
    }
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
    if reply.len() != (1 + scopes * VALUES_PER_SCOPE) * VALUE_BYTES {
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
            (1.0 / 60.0, &*(1.0f64 / 60.0).to_string()),
            (1e300, "1e300"),
        ] {
            let got = written(value);
            assert_eq!(got, text, "{value}");
            assert_eq!(got.parse::<f64>().unwrap(), value, "{value}");
        }
    }
}
