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
//! Checks in flight meet per slot ([`SlotCalls`]): while `limits.coalesce_in_flight` calls
//! of a slot are on their way, the groups that arrive for it wait and then go together in
//! one call, each answered as a call of its own would have been, as on one Redis.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::script::{MAX_BATCH, Mode, parse, reply_len, write_args, write_keys};
use super::{LimitRequest, RawOutcome, Scope};
use crate::store::keys::{self, Keys};
use crate::store::scripts::TOKEN_BUCKET;
use crate::store::{Error, RedisHot};
use crate::telemetry::metrics as names;

/// Queues of groups waiting for their slot, by slot range (a sixteenth of the slots each:
/// one shard in the cluster layout).
const QUEUES: usize = keys::SHARDS;

/// One group's script call, ready to share: its keys and arguments as written for the
/// script, apart, so that several can be joined into one call.
struct Part {
    slot: u16,
    keys: redis::Cmd,
    key_count: usize,
    args: redis::Cmd,
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

/// Script calls shared per slot by concurrent checks on a cluster.
#[derive(Debug)]
pub(super) struct SlotCalls {
    queues: Box<[Mutex<Queue>]>,
    in_flight: usize,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("running", &self.running)
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl SlotCalls {
    /// At most `in_flight` calls per slot range on their way; the rest wait and share.
    pub(super) fn new(in_flight: usize) -> Arc<Self> {
        Arc::new(Self {
            queues: (0..QUEUES).map(|_| Mutex::default()).collect(),
            in_flight: in_flight.max(1),
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

/// A call slot of a queue, handed on ([`SlotCalls::next`]) when dropped.
struct Running<'a> {
    calls: &'a Arc<SlotCalls>,
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
    let key_count = parts.iter().map(|p| p.key_count).sum();
    let mut cmd = RedisHot::evalsha(&TOKEN_BUCKET, key_count);
    for part in parts {
        append(&mut cmd, &part.keys);
    }
    cmd.arg(parts.len());
    for part in parts {
        append(&mut cmd, &part.args);
    }
    if parts.len() > 1 {
        metrics::histogram!(names::LIMIT_COALESCED_CHECKS).record(parts.len() as f64);
    }
    let reply: Vec<u8> = redis.run_script(&TOKEN_BUCKET, &cmd).await?;
    let mut replies = Vec::with_capacity(parts.len());
    let mut at = 0;
    for part in parts {
        let len = reply_len(part.scopes);
        let Some(one) = reply.get(at..at + len) else {
            break;
        };
        replies.push(one.to_vec());
        at += len;
    }
    if replies.len() != parts.len() || at != reply.len() {
        return Err(Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected token_bucket.lua reply",
            format!("{} bytes for {} requests", reply.len(), parts.len()),
        ))));
    }
    Ok(replies)
}

fn append(cmd: &mut redis::Cmd, from: &redis::Cmd) {
    for arg in from.args_iter() {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
}

/// The part of `scopes[at]` for one script call.
fn part(slot: u16, scopes: &[Scope], at: &[usize], cost: u32, mode: Mode) -> Part {
    let group: Vec<&Scope> = at.iter().map(|&i| &scopes[i]).collect();
    let mut keys = redis::Cmd::with_capacity(2 * group.len(), 0);
    write_keys(&mut keys, group.iter().copied());
    let mut args = redis::Cmd::with_capacity(3 + 4 * group.len(), 0);
    write_args(&mut args, group.iter().copied(), cost, mode);
    Part {
        slot,
        keys,
        key_count: 2 * group.len(),
        args,
        scopes: group.len(),
    }
}

/// One group's call: shared when `slots` coalesce, else a call of its own.
async fn run(
    redis: &RedisHot,
    slots: Option<&Arc<SlotCalls>>,
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

/// Answers a check on a cluster (see the module's comment).
pub(super) async fn evaluate(
    redis: &RedisHot,
    slots: Option<&Arc<SlotCalls>>,
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
