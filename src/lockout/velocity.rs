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
use crate::store::scripts::{LOCK_MARKER, VELOCITY_BATCH, WINDOW_CAS};

use crate::store::{Error, Hot, Keys, RedisHot, WindowValue};

/// Per-call maps of keys (no DoS-resistant hashing needed: keys come from the service).
type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub use crate::store::{WindowAction, WindowStep as Step};

/// Most entries kept per window (thresholds are validated to be at most this).
pub const WINDOW_CAP: usize = 1000;
/// Most known IPs/devices remembered per account.
pub const KNOWN_CAP: usize = 50;

/// Per window: count within the window, ms between its two newest entries (if two).
pub type WindowCounts = Vec<(u32, Option<i64>)>;

/// A window member's id: the first 8 bytes of SHA-256 of its text.
///
/// Stable across instances and versions (two instances must agree that a retried event is
/// the same); two members of one window share an id with probability about n²/2⁶⁵
/// (n ≤ 1000: below 10⁻¹³).
pub fn member_id(text: &str) -> u64 {
    let digest = Sha256::digest(text.as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("SHA-256 has 32 bytes"))
}

/// The name of a pair window inside an account's value: `kind` (`i` IP, `d` device) and the
/// other subject's id in hex (short and bounded, whatever the device id's length).
pub fn pair_window(kind: char, subject: &SubjectKey) -> String {
    format!("{kind}{:016x}", member_id(subject.as_str()))
}

/// The values `steps` touch, in first-seen order, and the indexes of each one's steps.
fn by_value(steps: &[Step]) -> (Vec<&str>, Map<&str, Vec<usize>>) {
    let mut order: Vec<&str> = Vec::new();
    let mut by_key: Map<&str, Vec<usize>> = Map::default();
    for (i, step) in steps.iter().enumerate() {
        by_key
            .entry(step.key.as_str())
            .or_insert_with(|| {
                order.push(step.key.as_str());
                Vec::new()
            })
            .push(i);
    }
    (order, by_key)
}

/// Runs window operations in order, each seeing the ones before.
///
/// Keys of any subjects may repeat: a whole ingest batch is computed at once on a single
/// Redis. On a cluster a script may touch one slot only, so all steps on one value are one
/// call there (the calls of a sequence sent at once). Returns, per step, the count in its
/// window and (when asked) the gap; `(0, None)` for a delete, 1 or 0 for a membership check.
pub async fn run_sequence(hot: &Hot, steps: &[Step], now_ms: i64) -> Result<WindowCounts, Error> {
    match hot {
        Hot::Memory(memory) => Ok(memory.window_steps(steps, now_ms)),
        Hot::Redis(redis) if redis.is_cluster() => {
            // Every step of a value in one call (in order), one value a call (one slot),
            // the calls sent at once: steps on different values are independent, so the
            // answers are those of one call over everything, and each value's call ends
            // where it does on the other paths (after its last step: `WindowValue::finish`).
            let (order, by_key) = by_value(steps);
            let at: Vec<usize> = order
                .iter()
                .flat_map(|key| by_key[key].iter().copied())
                .collect();
            let mut out = vec![(0, None); steps.len()];
            run_scripts(redis, steps, &at, 1, now_ms, &mut out).await?;
            Ok(out)
        }
        Hot::Redis(redis) => single_redis(redis, steps, now_ms).await,
    }
}

/// A sequence on a single Redis, computed in the service with optimistic writes.
///
/// One `MGET` reads every value the steps touch; the steps run here on the values read
/// ([`WindowValue`], the in-process twin); then one round trip writes what changed: a value
/// that did not exist with `SET … NX PX`, one that did with `lua/window_cas.lua` (written only
/// if still as read). Steps that only count are answered from the read. The values written
/// meanwhile by another instance (`NX` refused, or changed since read) have their steps run by
/// `lua/velocity_batch.lua` instead, atomically. Steps are independent across values, so the
/// answers are those of one script call over everything.
///
/// Why: Lua's per-value work (decode, update, re-encode, one `redis.call` per command) was
/// most of Redis's CPU per ingested event, and Redis the ingest bottleneck; here Redis only
/// reads, compares and stores.
async fn single_redis(
    redis: &RedisHot,
    steps: &[Step],
    now_ms: i64,
) -> Result<WindowCounts, Error> {
    let mut out = vec![(0, None); steps.len()];
    if steps.is_empty() {
        return Ok(out);
    }
    let (order, by_key) = by_value(steps);
    let mut mget = redis::Cmd::with_capacity(
        order.len() + 1,
        order.iter().map(|k| k.len()).sum::<usize>() + 4,
    );
    mget.arg("MGET").arg(&order);
    let read: Vec<Option<Vec<u8>>> = redis.query(&mget).await?;
    let answer = |out: &mut WindowCounts, key: &str, counts: Vec<(u32, Option<i64>)>| {
        for (&i, count) in by_key[key].iter().zip(counts) {
            out[i] = count;
        }
    };
    // (key, value to create, TTL, answers) and (key, value read, value to write, answers).
    type Counts = Vec<(u32, Option<i64>)>;
    type Packed = Option<(Vec<u8>, i64)>;
    let mut created: Vec<(&str, Vec<u8>, i64, Counts)> = Vec::new();
    let mut swapped: Vec<(&str, Vec<u8>, Packed, Counts)> = Vec::new();
    for (key, old) in order.iter().copied().zip(read) {
        let at = &by_key[key];
        // A value not in the layout (not written by this version) is replaced, if written.
        let mut value = old
            .as_deref()
            .and_then(|bytes| WindowValue::unpack(bytes, now_ms))
            .unwrap_or_default();
        let counts: Counts = at.iter().map(|&i| value.step(&steps[i], now_ms)).collect();
        value.finish(now_ms);
        match (old, value.changed().then(|| value.packed(now_ms))) {
            // Only counted, or only deletes where there was nothing: the read answers.
            (_, None) | (None, Some(None)) => answer(&mut out, key, counts),
            (None, Some(Some((new, ttl_ms)))) => created.push((key, new, ttl_ms, counts)),
            (Some(old), Some(new)) => swapped.push((key, old, new, counts)),
        }
    }
    let create = async {
        if created.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (key, new, ttl_ms, _) in &created {
            pipe.cmd("SET")
                .arg(*key)
                .arg(&new[..])
                .arg("NX")
                .arg("PX")
                .arg(*ttl_ms);
        }
        redis.query_pipeline::<Vec<Value>>(&pipe).await
    };
    // Compare-and-sets in calls of at most VALUES_PER_CALL values, sent at once: a script runs
    // alone in Redis, and one call over a whole batch (about a thousand values, 3-4 ms)
    // held up every other connection's commands that long (other instances' limit checks
    // and status queries).
    let swap = async {
        let calls = swapped.chunks(VALUES_PER_CALL).map(|part| async move {
            let bytes = part
                .iter()
                .map(|(key, old, new, _)| {
                    key.len() + old.len() + new.as_ref().map_or(0, |(v, _)| v.len()) + 20
                })
                .sum();
            let mut cmd = RedisHot::evalsha_sized(&WINDOW_CAS, part.len(), 4 * part.len(), bytes);
            for (key, ..) in part {
                cmd.arg(*key);
            }
            for (_, old, new, _) in part {
                let (new, ttl_ms) = new.as_ref().map_or((&[][..], 0), |(v, t)| (&v[..], *t));
                cmd.arg(&old[..]).arg(new).arg(ttl_ms);
            }
            redis.run_script::<Vec<usize>>(&WINDOW_CAS, &cmd).await
        });
        let mut failed = Vec::new();
        for (n, part) in futures_util::future::join_all(calls)
            .await
            .into_iter()
            .enumerate()
        {
            // Indexes in the part (1-based) to indexes in `swapped`.
            failed.extend(part?.into_iter().map(|i| n * VALUES_PER_CALL + i));
        }
        Ok::<_, Error>(failed)
    };
    let (created_replies, failed) = tokio::join!(create, swap);
    let mut conflicted: Vec<&str> = Vec::new();
    for ((key, _, _, counts), reply) in created.into_iter().zip(created_replies?) {
        if reply == Value::Nil {
            conflicted.push(key);
        } else {
            answer(&mut out, key, counts);
        }
    }
    let failed: std::collections::HashSet<usize> = failed?.into_iter().collect();
    for (n, (key, _, _, counts)) in swapped.into_iter().enumerate() {
        if failed.contains(&(n + 1)) {
            conflicted.push(key);
        } else {
            answer(&mut out, key, counts);
        }
    }
    if !conflicted.is_empty() {
        // Value by value (each value's steps in order; values are independent).
        let at: Vec<usize> = conflicted
            .iter()
            .flat_map(|key| by_key[key].iter().copied())
            .collect();
        run_scripts(redis, steps, &at, VALUES_PER_CALL, now_ms, &mut out).await?;
    }
    Ok(out)
}

/// Runs the steps `at` names (grouped by value, each value's steps in order) as
/// `velocity_batch.lua` calls of at most `values_per_call` values, sent at once, and puts
/// each step's answer in `out`.
async fn run_scripts(
    redis: &RedisHot,
    steps: &[Step],
    at: &[usize],
    values_per_call: usize,
    now_ms: i64,
    out: &mut WindowCounts,
) -> Result<(), Error> {
    let rest: Vec<&Step> = at.iter().map(|&i| &steps[i]).collect();
    let parts = script_parts(&rest, values_per_call);
    let calls = parts.iter().map(|part| script(redis, part, now_ms));
    let mut done = 0;
    for (part, counts) in parts
        .iter()
        .zip(futures_util::future::join_all(calls).await)
    {
        for (k, count) in counts?.into_iter().enumerate() {
            out[at[done + k]] = count;
        }
        done += part.len();
    }
    Ok(())
}

/// Values per script call on a single Redis (`window_cas.lua`: about 0.2 ms of Redis time;
/// `velocity_batch.lua` on values another instance changed: about 1.3 ms), so a command from
/// another connection waits at most that long behind an ingest batch's writes. (Batches
/// failing the same 500 accounts at once conflict on all of them, and the script over all
/// 500 takes 10-11 ms.)
const VALUES_PER_CALL: usize = 64;

/// `steps`, grouped by value, cut into script calls of at most `values_per_call` values
/// (that cut falls between values; 1 on a cluster, where a call sees one slot) and 256
/// (window, cap) profiles (the size of their index in an op; a batch has a handful).
fn script_parts<'a>(steps: &'a [&'a Step], values_per_call: usize) -> Vec<&'a [&'a Step]> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut keys = std::collections::HashSet::new();
    let mut profiles = std::collections::HashSet::new();
    for (i, step) in steps.iter().enumerate() {
        keys.insert(step.key.as_str());
        profiles.insert((step.window_ms, step.cap));
        if keys.len() > values_per_call || profiles.len() > 256 {
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
    let mut index: Map<&str, usize> = Map::default();
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
            WindowAction::Remove => b'r',
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
    hot.set_nx(&keys.lock(account), lockout_id, now_ms, ttl_ms)
        .await
}

/// Puts back the marker of a stored lockout (the hot store lost it), expiring in `ttl_ms`;
/// a marker already there stays. True if this call set it.
pub async fn restore_marker(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, Error> {
    match hot {
        Hot::Memory(_) => lock_if_absent(hot, keys, account, lockout_id, now_ms, ttl_ms).await,
        Hot::Redis(_) => {
            let stored = format!("{lockout_id}{STORED}");
            lock_if_absent(hot, keys, account, &stored, now_ms, ttl_ms).await
        }
    }
}

/// Appended to a lock marker's lockout id once the lockout is durably stored (the same
/// character in `lua/lock_marker.lua`).
const STORED: char = '!';

/// An account's lock marker: the hot side of a lockout, which enforcement reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The lockout it stands for.
    pub lockout_id: String,
    /// Milliseconds until it expires (`i64::MAX` without an expiry).
    pub ttl_ms: i64,
    /// The lockout is durably stored (else it is being stored, or its instance died first:
    /// an orphan to repair).
    pub stored: bool,
}

/// A marker read with its PTTL: lockout id, ms until it expires (`i64::MAX` without a TTL)
/// and whether the lockout is stored; None when the key is gone (PTTL -2).
fn marker(value: Option<String>, ttl: i64) -> Option<Marker> {
    let value = value.filter(|_| ttl != -2)?;
    let ttl = if ttl < 0 { i64::MAX } else { ttl };
    let (lockout_id, stored) = match value.strip_suffix(STORED) {
        Some(id) => (id.to_owned(), true),
        None => (value, false),
    };
    Some(Marker {
        lockout_id,
        ttl_ms: ttl,
        stored,
    })
}

/// The account's lock marker, if it has one.
///
/// Not stored: between the marker and the row, and forever if the instance that set the
/// marker died in between (an orphan to repair).
pub async fn lock_marker(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    now_ms: i64,
) -> Result<Option<Marker>, Error> {
    let key = keys.lock(account);
    match hot {
        // In-process markers die with the process, and with them any orphan.
        Hot::Memory(memory) => Ok(memory.value_get(&key, now_ms).map(|(id, ttl)| Marker {
            lockout_id: id,
            ttl_ms: ttl,
            stored: true,
        })),
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
        .map(|m| (m.lockout_id, m.ttl_ms)))
}

/// The lock markers of many accounts: one `MGET` and the TTLs of the markers found on a
/// single Redis (one call per account on a cluster, where the markers live in different
/// slots).
pub async fn locks(
    hot: &Hot,
    keys: &Keys,
    accounts: &[&SubjectKey],
    now_ms: i64,
) -> Result<Vec<Option<Marker>>, Error> {
    match hot {
        Hot::Redis(redis) if !redis.is_cluster() && accounts.len() > 1 => {
            // One MGET for every marker, then the TTL of those that exist (few: locked
            // accounts), instead of a GET and a PTTL per account.
            let keys: Vec<String> = accounts.iter().map(|a| keys.lock(a)).collect();
            let values: Vec<Option<String>> = redis.query(redis::cmd("MGET").arg(&keys)).await?;
            let present: Vec<usize> = (0..keys.len()).filter(|&i| values[i].is_some()).collect();
            let mut ttls = vec![-2; keys.len()];
            if !present.is_empty() {
                let mut pipe = redis::pipe();
                for &i in &present {
                    pipe.cmd("PTTL").arg(&keys[i]);
                }
                let found: Vec<i64> = redis.query_pipeline(&pipe).await?;
                for (&i, ttl) in present.iter().zip(found) {
                    ttls[i] = ttl;
                }
            }
            Ok(values
                .into_iter()
                .zip(ttls)
                .map(|(value, ttl)| marker(value, ttl))
                .collect())
        }
        _ => {
            let mut out = Vec::with_capacity(accounts.len());
            for account in accounts {
                out.push(lock_marker(hot, keys, account, now_ms).await?);
            }
            Ok(out)
        }
    }
}

/// Moves the end of an account's lock marker to `ttl_ms` from `now_ms`, only while it
/// names `lockout_id`. True if it did.
pub async fn retime(
    hot: &Hot,
    keys: &Keys,
    account: &SubjectKey,
    lockout_id: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<bool, Error> {
    let key = keys.lock(account);
    match hot {
        Hot::Memory(memory) => Ok(memory.value_update(&key, now_ms, |current| match current {
            Some(id) if id == lockout_id => (Some((id.to_owned(), ttl_ms)), true),
            _ => (None, false),
        })),
        Hot::Redis(redis) => {
            let args = [
                lockout_id.to_owned(),
                "retime".to_owned(),
                ttl_ms.to_string(),
            ];
            Ok(redis.eval::<i64>(&LOCK_MARKER, &[key], &args).await? == 1)
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
