//! The hot side of lockouts: failure windows, lock markers, known IPs/devices, on Redis or
//! in-process.
//!
//! Windows live in one packed value per subject (`lua/velocity_batch.lua` describes the
//! layout): an account's failures and its pair windows (per IP, per device), an IP's
//! failures and distinct accounts, a device's distinct accounts, an account's known IPs and
//! devices. Members are 8-byte ids ([`member_id`]) computed here, the same in every instance.

use redis::Value;
use sha2::{Digest, Sha256};

use crate::model::SubjectKey;
use crate::store::scripts::{LOCK_MARKER, VELOCITY_BATCH};
use std::collections::HashMap;

use crate::store::{Error, Hot, Keys, RedisHot, WindowValue};

pub use crate::store::{WindowAction, WindowStep as Step};

/// Most entries kept per window (thresholds are validated to be at most this).
pub const WINDOW_CAP: usize = 1000;
/// Most known IPs/devices remembered per account.
pub const KNOWN_CAP: usize = 50;

/// Per window: count within the window, ms between its two newest entries (if two).
pub type WindowCounts = Vec<(u32, Option<i64>)>;

/// A window member's id: the first 8 bytes of SHA-256 of its text.
///
/// Stable across instances and versions (two instances must agree that a retried event is the same); two members
/// of one window share an id with probability about n²/2⁶⁵ (n ≤ 1000: below 10⁻¹³).
pub fn member_id(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// The name of a pair window inside an account's value: `kind` (`i` IP, `d` device) and the
/// other subject's id in hex (short and bounded, whatever the device id's length).
pub fn pair_window(kind: char, subject: &SubjectKey) -> String {
    format!("{kind}{:016x}", member_id(subject.as_str()))
}

/// Runs window operations in order, each seeing the ones before.
///
/// Keys of any subjects may repeat: a whole ingest batch is **one** script call on a single
/// Redis. On a cluster a script may touch one slot only, so each run of consecutive steps on
/// one value is its own call there. Returns, per step, the count in its window and (when
/// asked) the gap; `(0, None)` for a delete, 1 or 0 for a membership check.
pub async fn run_sequence(hot: &Hot, steps: &[Step], now_ms: i64) -> Result<WindowCounts, Error> {
    match hot {
        Hot::Memory(memory) => Ok(steps
            .iter()
            .map(|step| memory.window_step(step, now_ms))
            .collect()),
        Hot::Redis(redis) if redis.is_cluster() => {
            let mut out = Vec::with_capacity(steps.len());
            let mut rest = steps;
            while let Some(first) = rest.first() {
                let run = rest.iter().take_while(|s| s.key == first.key).count();
                let (group, tail) = rest.split_at(run);
                let group: Vec<&Step> = group.iter().collect();
                out.extend(script(redis, &group, now_ms).await?);
                rest = tail;
            }
            Ok(out)
        }
        Hot::Redis(redis) => single_redis(redis, steps, now_ms).await,
    }
}

/// A sequence on a single Redis. A value that does not exist yet needs no script: its steps
/// are computed here from empty ([`WindowValue`], the in-process twin) and the result is
/// written with `SET … NX PX` in one pipeline; the values that do exist (`NX` refused), and
/// those only counted or deleted, go through one script call. Their steps are independent
/// across values, so the answers are those of one script call over everything.
///
/// Why: most windows an ingest batch writes are new (a login failure's account and IP rarely
/// failed in the last minutes), and a `SET` from the pipeline costs Redis a fraction of the
/// script's work on the same value (`lua/velocity_batch.lua`, Why).
async fn single_redis(
    redis: &RedisHot,
    steps: &[Step],
    now_ms: i64,
) -> Result<WindowCounts, Error> {
    let mut out = vec![(0, None); steps.len()];
    let mut order: Vec<&str> = Vec::new();
    let mut by_key: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        by_key
            .entry(step.key.as_str())
            .or_insert_with(|| {
                order.push(step.key.as_str());
                Vec::new()
            })
            .push(i);
    }
    let mut fresh = Vec::new();
    let mut scripted: Vec<usize> = Vec::new();
    for key in order {
        let at = &by_key[key];
        let writes = at.iter().any(|&i| {
            let step = &steps[i];
            step.action == WindowAction::Record
                && step.member.is_some()
                && step.score >= now_ms - step.window_ms
        });
        if writes {
            let mut value = WindowValue::default();
            let counts: Vec<(u32, Option<i64>)> =
                at.iter().map(|&i| value.step(&steps[i], now_ms)).collect();
            if let Some((packed, ttl_ms)) = value.packed(now_ms) {
                fresh.push((key, packed, ttl_ms, counts));
                continue;
            }
        }
        scripted.extend(at);
    }
    if !fresh.is_empty() {
        let mut pipe = redis::pipe();
        for (key, packed, ttl_ms, _) in &fresh {
            pipe.cmd("SET")
                .arg(*key)
                .arg(&packed[..])
                .arg("NX")
                .arg("PX")
                .arg(*ttl_ms);
        }
        let created: Vec<Value> = redis.query_pipeline(&pipe).await?;
        for ((key, _, _, counts), created) in fresh.into_iter().zip(created) {
            if created == Value::Nil {
                scripted.extend(&by_key[key]);
            } else {
                for (&i, count) in by_key[key].iter().zip(counts) {
                    out[i] = count;
                }
            }
        }
    }
    scripted.sort_unstable();
    let rest: Vec<&Step> = scripted.iter().map(|&i| &steps[i]).collect();
    let mut done = 0;
    for part in script_parts(&rest) {
        let counts = script(redis, part, now_ms).await?;
        for (k, count) in counts.into_iter().enumerate() {
            out[scripted[done + k]] = count;
        }
        done += part.len();
    }
    Ok(out)
}

/// `steps` cut where one script call would name more than 65535 keys or 256 (window, cap)
/// profiles (the sizes of their indexes in an op): one part for any batch the API takes.
fn script_parts<'a>(steps: &'a [&'a Step]) -> Vec<&'a [&'a Step]> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut keys = std::collections::HashSet::new();
    let mut profiles = std::collections::HashSet::new();
    for (i, step) in steps.iter().enumerate() {
        keys.insert(step.key.as_str());
        profiles.insert((step.window_ms, step.cap));
        if keys.len() > usize::from(u16::MAX) || profiles.len() > 256 {
            parts.push(&steps[start..i]);
            start = i;
            keys = std::collections::HashSet::from([step.key.as_str()]);
            profiles = std::collections::HashSet::from([(step.window_ms, step.cap)]);
        }
    }
    parts.push(&steps[start..]);
    parts
}

/// One `velocity_batch.lua` call for `steps` (every value they touch in one call).
async fn script(redis: &RedisHot, steps: &[&Step], now_ms: i64) -> Result<WindowCounts, Error> {
    if steps.is_empty() {
        return Ok(Vec::new());
    }
    let mut keys: Vec<&str> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let at: Vec<usize> = steps
        .iter()
        .map(|step| {
            *index.entry(step.key.as_str()).or_insert_with(|| {
                keys.push(step.key.as_str());
                keys.len()
            })
        })
        .collect();
    // Profiles: the distinct (window, cap) pairs, a handful per call.
    let mut profiles: Vec<(i64, usize)> = Vec::new();
    let profile: Vec<u8> = steps
        .iter()
        .map(|step| {
            let wanted = (step.window_ms, step.cap);
            let at = profiles
                .iter()
                .position(|p| *p == wanted)
                .unwrap_or_else(|| {
                    profiles.push(wanted);
                    profiles.len() - 1
                });
            u8::try_from(at).expect("run_sequence splits calls at 256 profiles")
        })
        .collect();
    let mut cmd = RedisHot::evalsha(&VELOCITY_BATCH, keys.len());
    for key in &keys {
        cmd.arg(*key);
    }
    cmd.arg(now_ms).arg(profiles.len());
    for (window_ms, cap) in &profiles {
        cmd.arg(*window_ms).arg(*cap);
    }
    let mut op = Vec::with_capacity(64);
    for ((step, at), profile) in steps.iter().zip(at).zip(profile) {
        let name = step.window.as_bytes();
        // Names are made in `lockout` (at most 17 bytes: `i`/`d` and 16 hex digits).
        let name_len = u8::try_from(name.len()).expect("window names are short");
        let at = u16::try_from(at).expect("run_sequence splits calls at 65535 keys");
        op.clear();
        op.extend_from_slice(&at.to_be_bytes());
        op.push(profile);
        op.push(match step.action {
            WindowAction::Delete => b'x',
            WindowAction::Contains => b'c',
            WindowAction::Record if step.gap => b'g',
            WindowAction::Record => b'w',
        });
        op.push(name_len);
        op.extend_from_slice(name);
        if let (Some(member), false) = (step.member, step.action == WindowAction::Delete) {
            op.extend_from_slice(&member.to_be_bytes());
            // Scores are ms since 1970: exact in a double (the script's number type).
            op.extend_from_slice(&(step.score as f64).to_be_bytes());
        }
        cmd.arg(&op[..]);
    }
    let reply: Vec<Value> = redis.run_script(&VELOCITY_BATCH, &cmd).await?;
    let counts = pairs(&reply);
    Ok(steps
        .iter()
        .zip(counts)
        .map(|(step, (count, gap))| (count, gap.filter(|_| step.gap)))
        .collect())
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

/// Deletes window values (release clears an account's windows, pairs included).
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
