//! The hot side of lockouts: failure windows, lock markers, known IPs/devices, on Redis
//! (`lua/velocity_window.lua`, one call per subject so a cluster sees one slot) or in-process.

use redis::Value;

use crate::model::SubjectKey;
use crate::store::scripts::{LOCK_MARKER, VELOCITY_BATCH, VELOCITY_WINDOW};
use crate::store::{Error, Hot, Keys};

/// Most entries kept per window (thresholds are validated to be at most this).
pub const WINDOW_CAP: usize = 1000;
/// Most known IPs/devices remembered per account.
pub const KNOWN_CAP: usize = 50;

/// One window to record into (`add`: member and score) or only count.
#[derive(Debug, Clone)]
pub struct WindowOp {
    /// Redis key of the window.
    pub key: String,
    /// `(member, score_ms)` to add.
    pub add: Option<(String, i64)>,
}

/// Per window: count within the window, ms between its two newest entries (if two).
pub type WindowCounts = Vec<(u32, Option<i64>)>;

/// One step of a sequence of window operations ([`run_sequence`]).
#[derive(Debug, Clone)]
pub struct Step {
    /// Redis key of the window.
    pub key: String,
    /// `(member, score_ms)` to add; None only counts.
    pub add: Option<(String, i64)>,
    /// The window's length, ms.
    pub window_ms: i64,
    /// Most entries kept.
    pub cap: usize,
    /// Also report the gap between the two newest entries.
    pub gap: bool,
    /// Delete the window instead (a success clears the pair windows).
    pub delete: bool,
}

/// Runs window operations in order, each seeing the ones before.
///
/// Keys of any subjects may repeat: a whole ingest batch is **one** script call on a single
/// Redis. On a cluster a
/// script may touch one slot only, so each step is its own call there. Returns, per step,
/// the count in its window and (when asked) the gap; `(0, None)` for a delete.
pub async fn run_sequence(hot: &Hot, steps: &[Step], now_ms: i64) -> Result<WindowCounts, Error> {
    match hot {
        Hot::Memory(memory) => Ok(steps
            .iter()
            .map(|step| {
                if step.delete {
                    memory.window_clear(std::slice::from_ref(&step.key));
                    return (0, None);
                }
                let (count, gap) = memory.window_record(
                    &[(step.key.clone(), step.add.clone())],
                    now_ms,
                    step.window_ms,
                    step.cap,
                )[0];
                (count, gap.filter(|_| step.gap))
            })
            .collect()),
        Hot::Redis(redis) if redis.is_cluster() => {
            // A script sees one slot: consecutive steps of one subject (same hash tag, window
            // and cap) go as one `velocity_window.lua` call, as before batching; a delete is
            // its own command.
            let mut out = Vec::with_capacity(steps.len());
            let mut rest = steps;
            while let Some(first) = rest.first() {
                if first.delete {
                    clear(hot, std::slice::from_ref(&first.key)).await?;
                    out.push((0, None));
                    rest = &rest[1..];
                    continue;
                }
                let run = rest
                    .iter()
                    .take_while(|s| {
                        !s.delete
                            && s.window_ms == first.window_ms
                            && s.cap == first.cap
                            && Keys::hash_tag(&s.key) == Keys::hash_tag(&first.key)
                    })
                    .count();
                let (group, tail) = rest.split_at(run);
                let ops: Vec<WindowOp> = group
                    .iter()
                    .map(|s| WindowOp {
                        key: s.key.clone(),
                        add: s.add.clone(),
                    })
                    .collect();
                let counts = record(hot, &ops, now_ms, first.window_ms, first.cap).await?;
                out.extend(
                    group
                        .iter()
                        .zip(counts)
                        .map(|(s, (count, gap))| (count, gap.filter(|_| s.gap))),
                );
                rest = tail;
            }
            Ok(out)
        }
        Hot::Redis(redis) => {
            if steps.is_empty() {
                return Ok(Vec::new());
            }
            let mut keys: Vec<String> = Vec::new();
            let mut index: std::collections::HashMap<&str, usize> =
                std::collections::HashMap::new();
            let mut args = Vec::with_capacity(1 + steps.len() * 6);
            args.push(now_ms.to_string());
            for step in steps {
                let at = *index.entry(step.key.as_str()).or_insert_with(|| {
                    keys.push(step.key.clone());
                    keys.len()
                });
                let (member, score) = step.add.clone().unwrap_or_default();
                args.push(at.to_string());
                args.push(member);
                args.push(score.to_string());
                args.push(step.window_ms.to_string());
                args.push(step.cap.to_string());
                args.push(
                    if step.delete {
                        "x"
                    } else if step.gap {
                        "g"
                    } else {
                        "w"
                    }
                    .to_owned(),
                );
            }
            let reply: Vec<Value> = redis.eval(&VELOCITY_BATCH, &keys, &args).await?;
            Ok(pairs(&reply))
        }
    }
}

fn pairs(reply: &[Value]) -> WindowCounts {
    let ints: Vec<i64> = reply
        .iter()
        .map(|v| match v {
            Value::Int(i) => *i,
            _ => 0,
        })
        .collect();
    ints.chunks_exact(2)
        .map(|pair| {
            (
                u32::try_from(pair[0]).unwrap_or(0),
                (pair[1] >= 0).then_some(pair[1]),
            )
        })
        .collect()
}

/// Records into (and counts) windows of one subject, atomically.
pub async fn record(
    hot: &Hot,
    ops: &[WindowOp],
    now_ms: i64,
    window_ms: i64,
    cap: usize,
) -> Result<WindowCounts, Error> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    match hot {
        Hot::Memory(memory) => {
            let keys: Vec<(String, Option<(String, i64)>)> = ops
                .iter()
                .map(|op| (op.key.clone(), op.add.clone()))
                .collect();
            Ok(memory.window_record(&keys, now_ms, window_ms, cap))
        }
        Hot::Redis(redis) => {
            let keys: Vec<String> = ops.iter().map(|op| op.key.clone()).collect();
            let mut args = vec![now_ms.to_string(), window_ms.to_string(), cap.to_string()];
            for op in ops {
                let (member, score) = op.add.clone().unwrap_or_default();
                args.push(member);
                args.push(score.to_string());
            }
            let reply: Vec<Value> = redis.eval(&VELOCITY_WINDOW, &keys, &args).await?;
            Ok(pairs(&reply))
        }
    }
}

/// Members of a window within `window_ms` of `now_ms`, oldest first.
pub async fn members(
    hot: &Hot,
    key: &str,
    now_ms: i64,
    window_ms: i64,
) -> Result<Vec<String>, Error> {
    match hot {
        Hot::Memory(memory) => Ok(memory
            .window_entries(key, now_ms, window_ms)
            .into_iter()
            .map(|(_, m)| m)
            .collect()),
        Hot::Redis(redis) => {
            let mut cmd = redis::cmd("ZRANGE");
            cmd.arg(key)
                .arg(now_ms - window_ms)
                .arg("+inf")
                .arg("BYSCORE");
            redis.query(&cmd).await
        }
    }
}

/// Deletes windows (release clears the account's counters).
pub async fn clear(hot: &Hot, keys: &[String]) -> Result<(), Error> {
    match hot {
        Hot::Memory(memory) => {
            memory.window_clear(keys);
            Ok(())
        }
        Hot::Redis(redis) => {
            for key in keys {
                redis.query::<()>(redis::cmd("DEL").arg(key)).await?;
            }
            Ok(())
        }
    }
}

/// Sets the account's lock marker unless one exists: true if this call set it (exactly one
/// instance creates a lockout).
pub async fn lock_if_absent(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, Error> {
    let key = keys.lock(account);
    match hot {
        Hot::Memory(memory) => Ok(memory.value_set_nx(&key, lockout_id, now_ms, ttl_ms)),
        Hot::Redis(redis) => {
            let set: Option<String> = redis
                .query(
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(lockout_id)
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms.max(1)),
                )
                .await?;
            Ok(set.is_some())
        }
    }
}

/// Appended to a lock marker's lockout id once the lockout is durably stored (the same
/// character in `lua/lock_marker.lua`).
const STORED: char = '!';

/// A marker read with its PTTL: lockout id, ms until it expires (`i64::MAX` without a TTL)
/// and whether the lockout is stored; None when the key is gone (PTTL -2).
fn marker(value: Option<String>, ttl: i64) -> Option<(String, i64, bool)> {
    let value = value.filter(|_| ttl != -2)?;
    let ttl = if ttl < 0 { i64::MAX } else { ttl };
    Some(match value.strip_suffix(STORED) {
        Some(id) => (id.to_owned(), ttl, true),
        None => (value, ttl, false),
    })
}

/// The account's lock marker: lockout id, ms until it expires, and whether it is stored.
///
/// Not stored: between the marker and the row, and forever if the instance that set the
/// marker died in between (an orphan to repair).
pub async fn lock_marker(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    now_ms: i64,
) -> Result<Option<(String, i64, bool)>, Error> {
    let key = keys.lock(account);
    match hot {
        // In-process markers die with the process, and with them any orphan.
        Hot::Memory(memory) => Ok(memory
            .value_get(&key, now_ms)
            .map(|(id, ttl)| (id, ttl, true))),
        Hot::Redis(redis) => {
            let mut pipe = redis::pipe();
            pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
            let (value, ttl): (Option<String>, i64) = redis.query_pipeline(&pipe).await?;
            Ok(marker(value, ttl))
        }
    }
}

/// Marks the account's lock marker as durably stored, keeping its TTL, if it still names
/// `lockout_id` (not one set for another lockout after a release).
pub async fn mark_stored(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
) -> Result<(), Error> {
    if let Hot::Redis(redis) = hot {
        let key = keys.lock(account);
        let args = [lockout_id.to_owned(), "stored".to_owned()];
        redis.eval::<i64>(&LOCK_MARKER, &[key], &args).await?;
    }
    Ok(())
}

/// The account's lock marker: lockout id and ms until it expires.
pub async fn lock(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    now_ms: i64,
) -> Result<Option<(String, i64)>, Error> {
    Ok(lock_marker(hot, keys, account, now_ms)
        .await?
        .map(|(id, ttl, _)| (id, ttl)))
}

/// The lock markers of many accounts: one pipeline on a single Redis (one call per account
/// on a cluster, where the markers live in different slots).
pub async fn locks(
    hot: &Hot,
    keys: &Keys,
    accounts: &[&SubjectKey],
    now_ms: i64,
) -> Result<Vec<Option<(String, i64)>>, Error> {
    match hot {
        Hot::Redis(redis) if !redis.is_cluster() && accounts.len() > 1 => {
            let mut pipe = redis::pipe();
            for account in accounts {
                let key = keys.lock(account);
                pipe.cmd("GET").arg(&key).cmd("PTTL").arg(&key);
            }
            let reply: Vec<(Option<String>, i64)> = redis.query_pipeline(&pipe).await?;
            Ok(reply
                .into_iter()
                .map(|(value, ttl)| marker(value, ttl).map(|(id, ttl, _)| (id, ttl)))
                .collect())
        }
        _ => {
            let mut out = Vec::with_capacity(accounts.len());
            for account in accounts {
                out.push(lock(hot, keys, account, now_ms).await?);
            }
            Ok(out)
        }
    }
}

/// Removes the lock marker if it still names `lockout_id` (atomically on Redis: a marker
/// set meanwhile for another lockout stays).
pub async fn unlock(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
) -> Result<(), Error> {
    let key = keys.lock(account);
    match hot {
        Hot::Memory(memory) => {
            if memory
                .value_get(&key, now_ms)
                .is_some_and(|(id, _)| id == lockout_id)
            {
                memory.value_delete(&key);
            }
        }
        Hot::Redis(redis) => {
            let args = [lockout_id.to_owned(), "delete".to_owned()];
            redis.eval::<i64>(&LOCK_MARKER, &[key], &args).await?;
        }
    }
    Ok(())
}
