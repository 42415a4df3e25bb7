//! Script calls shared by concurrent checks, on one Redis and per slot on a cluster.
//!
//! A check's group of scopes (all of them on one Redis; those of one slot on a cluster)
//! takes a call of its own when fewer than `in_flight` calls of its slot are on their way;
//! else it waits and goes with the groups that arrived meanwhile in one `EVALSHA`, the
//! script running them one after another, each seeing the ones before, so every answer is
//! the one a call of its own would have got. The calls go through redis-rs' multiplexed
//! connection (one Redis, Sentinel's primary) or its cluster connection, the same path for
//! every deployment.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::RawOutcome;
use super::Scope;
use super::script::{MAX_BATCH, Mode, parse, reply_len, write_args, write_keys};
use crate::store::keys;
use crate::store::scripts::TOKEN_BUCKET;
use crate::store::{Error, RedisHot};
use crate::telemetry::metrics as names;

/// Queues of groups waiting for their slot, by slot range (a sixteenth of the slots each:
/// one shard in the cluster layout).
const QUEUES: usize = keys::SHARDS;

/// One group's script call, ready to go alone (`EVALSHA sha numkeys keys… 1 args…`) and
/// to share: several are joined by copying their keys, then their arguments, into one call.
struct Part {
    slot: u16,
    cmd: redis::Cmd,
    key_count: usize,
    scopes: usize,
}

struct Waiting {
    part: Part,
    answer: oneshot::Sender<Result<Vec<u8>, Error>>,
}

#[derive(Default)]
struct Queue {
    /// Calls of this queue on their way.
    running: usize,
    waiting: VecDeque<Waiting>,
}

/// Script calls shared per slot by concurrent checks.
#[derive(Debug)]
pub(super) struct SharedCalls {
    queues: Box<[Mutex<Queue>]>,
    in_flight: usize,
    /// Checks per call.
    per_call: metrics::Histogram,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("running", &self.running)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl SharedCalls {
    /// At most `in_flight` calls per slot range on their way; the rest wait and share.
    pub(super) fn new(in_flight: usize) -> Arc<Self> {
        Arc::new(Self {
            queues: (0..QUEUES).map(|_| Mutex::default()).collect(),
            in_flight: in_flight.max(1),
            per_call: metrics::histogram!(names::LIMIT_COALESCED_CHECKS),
        })
    }

    fn queue(&self, slot: u16) -> std::sync::MutexGuard<'_, Queue> {
        let width = 16_384 / QUEUES;
        self.queues[usize::from(slot) / width]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The reply to `part`: a call of its own when its slot has room, else a share of the
    /// next call of its slot.
    async fn call(self: &Arc<Self>, redis: &RedisHot, part: Part) -> Result<Vec<u8>, Error> {
        let part = match self.enter(part) {
            Ok(part) => part,
            Err(waiting) => {
                return waiting.await.unwrap_or_else(|_| {
                    Err(unavailable("the shared script call was dropped".into()))
                });
            }
        };
        // Hands the call slot on when the call ends, and when the check is dropped before
        // (a request's deadline): a slot kept would leave the queue waiting forever.
        let _running = Running {
            calls: self,
            redis,
            slot: part.slot,
        };
        self.per_call.record(1.0);
        let reply = send(redis, std::slice::from_ref(&part)).await;
        reply.map(|mut replies| replies.remove(0))
    }

    /// Takes a call slot for `part` (Ok), or queues it for the next shared call (Err: where
    /// its reply comes).
    fn enter(&self, part: Part) -> Result<Part, oneshot::Receiver<Result<Vec<u8>, Error>>> {
        let mut queue = self.queue(part.slot);
        if queue.running < self.in_flight {
            queue.running += 1;
            return Ok(part);
        }
        let (answer, waiting) = oneshot::channel();
        queue.waiting.push_back(Waiting { part, answer });
        Err(waiting)
    }

    /// Sends what waits for `slot`'s queue in one call (on a task of its own, so the caller
    /// answers its own check now), or frees the call slot when nothing waits.
    fn next(self: &Arc<Self>, redis: &RedisHot, slot: u16) {
        let batch = {
            let mut queue = self.queue(slot);
            let Some(first) = queue.waiting.front().map(|w| w.part.slot) else {
                queue.running -= 1;
                return;
            };
            // One call is one slot: a queue's range holds one shard's slot in the cluster
            // layout, but other tags may fall in it too.
            let mut batch = Vec::new();
            let mut rest = VecDeque::new();
            while let Some(waiting) = queue.waiting.pop_front() {
                if waiting.part.slot == first && batch.len() < MAX_BATCH {
                    batch.push(waiting);
                } else {
                    rest.push_back(waiting);
                }
            }
            queue.waiting = rest;
            batch
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (the process is ending): the waiting checks are answered unavailable.
            self.queue(slot).running -= 1;
            return;
        };
        let (this, redis) = (self.clone(), redis.clone());
        runtime.spawn(async move {
            // A check dropped while it waited (its request's deadline) is not sent.
            let (parts, answers): (Vec<Part>, Vec<_>) = batch
                .into_iter()
                .filter(|w| !w.answer.is_closed())
                .map(|w| (w.part, w.answer))
                .unzip();
            if !parts.is_empty() {
                this.per_call.record(parts.len() as f64);
                match send(&redis, &parts).await {
                    Ok(replies) => {
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = answer.send(Ok(reply));
                        }
                    }
                    Err(error) => {
                        let cause = error.to_string();
                        for answer in answers {
                            let _ = answer.send(Err(unavailable(cause.clone().into())));
                        }
                    }
                }
            }
            this.next(&redis, slot);
        });
    }
}

/// A call slot of a queue, handed on ([`SharedCalls::next`]) when dropped.
struct Running<'a> {
    calls: &'a Arc<SharedCalls>,
    redis: &'a RedisHot,
    slot: u16,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.calls.next(self.redis, self.slot);
    }
}

fn unavailable(source: Box<dyn std::error::Error + Send + Sync>) -> Error {
    Error::Unavailable {
        store: "hot",
        source,
    }
}

/// One script call carrying `parts` (all of one slot); per part, its reply.
async fn send(redis: &RedisHot, parts: &[Part]) -> Result<Vec<Vec<u8>>, Error> {
    if let [part] = parts {
        let reply: Vec<u8> = redis.run_script(&TOKEN_BUCKET, &part.cmd).await?;
        return split(reply, parts);
    }
    let key_count = parts.iter().map(|p| p.key_count).sum();
    let (args, bytes) = parts.iter().fold((0, 0), |(args, bytes), part| {
        let args_of = part.cmd.args_iter().len();
        (
            args + args_of,
            bytes + simple(&part.cmd).map(<[u8]>::len).sum::<usize>(),
        )
    });
    let mut cmd = RedisHot::evalsha_sized(&TOKEN_BUCKET, key_count, args, bytes);
    // A part's own command: EVALSHA, sha, numkeys, its keys, 1, its arguments.
    for part in parts {
        for arg in simple(&part.cmd).skip(3).take(part.key_count) {
            cmd.arg(arg);
        }
    }
    cmd.arg(parts.len());
    for part in parts {
        for arg in simple(&part.cmd).skip(4 + part.key_count) {
            cmd.arg(arg);
        }
    }
    let reply: Vec<u8> = redis.run_script(&TOKEN_BUCKET, &cmd).await?;
    split(reply, parts)
}

/// A shared call's reply cut into its parts' replies.
fn split(reply: Vec<u8>, parts: &[Part]) -> Result<Vec<Vec<u8>>, Error> {
    let expected: usize = parts.iter().map(|p| reply_len(p.scopes)).sum();
    if expected != reply.len() {
        return Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected token_bucket.lua reply",
            format!("{} bytes for {} requests", reply.len(), parts.len()),
        ))));
    }
    if parts.len() == 1 {
        return Ok(vec![reply]);
    }
    let mut at = 0;
    Ok(parts
        .iter()
        .map(|part| {
            let len = reply_len(part.scopes);
            at += len;
            reply[at - len..at].to_vec()
        })
        .collect())
}

fn simple(cmd: &redis::Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    })
}

/// The part of `scopes[at]` for one script call.
fn part(slot: u16, scopes: &[Scope], at: &[usize], cost: u32, mode: Mode) -> Part {
    let group = || at.iter().map(|&i| &scopes[i]);
    let bytes: usize = group()
        .map(|s| s.bucket_key.len() + s.multiplier_key.len() + 4 * 12)
        .sum();
    let mut cmd =
        RedisHot::evalsha_sized(&TOKEN_BUCKET, 2 * at.len(), 4 + 6 * at.len(), bytes + 16);
    write_keys(&mut cmd, group());
    cmd.arg(1);
    write_args(&mut cmd, group(), cost, mode);
    Part {
        slot,
        cmd,
        key_count: 2 * at.len(),
        scopes: at.len(),
    }
}

/// One group's call: shared when `slots` coalesce, else a call of its own.
pub(super) async fn run(
    redis: &RedisHot,
    slots: Option<&Arc<SharedCalls>>,
    slot: u16,
    scopes: &[Scope],
    at: &[usize],
    cost: u32,
    mode: Mode,
) -> Result<(bool, Vec<RawOutcome>), Error> {
    let part = part(slot, scopes, at, cost, mode);
    let reply = match slots {
        Some(slots) => slots.call(redis, part).await?,
        None => send(redis, std::slice::from_ref(&part)).await?.remove(0),
    };
    parse(&reply, at.len())
}
