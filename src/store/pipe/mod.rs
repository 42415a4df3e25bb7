//! A connection of its own for one batched Lua script on a single Redis: the limit check's
//! `token_bucket.lua`, called by every decision.
//!
//! Concurrent callers add their part (keys and arguments, written straight as RESP) to the
//! call being gathered and wait on one channel. One task owns the connection (TCP, TLS over
//! it, or a Unix socket): whenever fewer than `in_flight` calls are on their way it writes
//! the gathered call, and it reads the replies in order, handing each part its slice of its
//! call's reply. There is no queue task, no task per call and no second command queue
//! between a check and the socket, as there are on the way through redis-rs' multiplexed
//! connection.
//!
//! A batched script takes `EVALSHA sha numkeys <every part's keys> <parts> <every part's
//! arguments>` and answers one bulk string: the parts' answers in order, each as long as its
//! caller said. Written by hand, not with redis-rs, because redis-rs offers no way to send
//! a pre-encoded command without its queue task and its reply tree; the protocol spoken
//! here is small (RESP2 bulk strings, errors, `+OK`). `NOSCRIPT` (a restarted or flushed
//! Redis) sends the same call again as `EVAL` with the script's body, which caches it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::Error;

mod net; // where and how to connect
mod resp; // the protocol spoken

use net::{Socket, connect};
pub use net::{Target, TargetCell};
use resp::{Reply, bulk, command, parse};

/// Why a call failed; shared by every part of the call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PipeError(Arc<str>);

impl PipeError {
    fn new(message: impl Into<Arc<str>>) -> Self {
        Self(message.into())
    }
}

impl From<std::io::Error> for PipeError {
    fn from(error: std::io::Error) -> Self {
        Self::new(error.to_string())
    }
}

fn unavailable(error: PipeError) -> Error {
    Error::Unavailable {
        store: "hot",
        source: Box::new(error),
    }
}

/// How the pipe calls its script.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Each call's bound, from its write to its reply (and the connection's setup).
    pub timeout: Duration,
    /// Calls on their way at once.
    pub in_flight: usize,
    /// Most parts in one call.
    pub max_parts: usize,
    /// The histogram of parts per call.
    pub parts_metric: &'static str,
}

/// A part's keys and arguments, written as RESP bulk strings as they are added.
#[derive(Debug, Default)]
pub struct Part {
    keys: Vec<u8>,
    key_count: usize,
    args: Vec<u8>,
    arg_count: usize,
}

impl Part {
    /// A part with room for keys of `key_bytes` and arguments of `arg_bytes` in all (each
    /// item takes about 8 bytes more, its RESP length line).
    pub fn with_capacity(key_bytes: usize, arg_bytes: usize) -> Self {
        Self {
            keys: Vec::with_capacity(key_bytes),
            args: Vec::with_capacity(arg_bytes),
            ..Self::default()
        }
    }

    /// A key.
    pub fn key(&mut self, key: &[u8]) -> &mut Self {
        bulk(&mut self.keys, key);
        self.key_count += 1;
        self
    }

    /// An argument.
    pub fn arg(&mut self, value: &[u8]) -> &mut Self {
        bulk(&mut self.args, value);
        self.arg_count += 1;
        self
    }

    /// An integer argument, in decimal.
    pub fn int(&mut self, value: i64) -> &mut Self {
        self.arg(itoa::Buffer::new().format(value).as_bytes())
    }
}

/// A part on its way: how long its answer is, and who waits for it.
#[derive(Debug)]
struct Waiter {
    reply_len: usize,
    tx: oneshot::Sender<Result<Bytes, PipeError>>,
}

/// Parts gathered into one call.
#[derive(Debug, Default)]
struct Batch {
    part: Part,
    waiters: Vec<Waiter>,
}

#[derive(Debug, Default)]
struct Gathered {
    batches: VecDeque<Batch>,
    /// A task serves the pipe (false before the first call, and after its runtime went).
    running: bool,
    /// The last connection attempt failed: calls fail at once until then.
    down: Option<(Instant, PipeError)>,
    closed: bool,
}

#[derive(Debug)]
struct Shared {
    target: Arc<TargetCell>,
    settings: Settings,
    sha: String,
    body: &'static str,
    gathered: Mutex<Gathered>,
    wake: Notify,
}

impl Shared {
    fn gathered(&self) -> std::sync::MutexGuard<'_, Gathered> {
        self.gathered.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Option<Batch> {
        self.gathered().batches.pop_front()
    }

    /// Fails every gathered part with `error`; `stopped`: the serving task is ending too
    /// (marked in the same lock, so that a part added after it starts another task).
    fn fail_gathered(&self, error: &PipeError, stopped: bool) {
        let batches = {
            let mut gathered = self.gathered();
            if stopped {
                gathered.running = false;
            }
            std::mem::take(&mut gathered.batches)
        };
        for batch in batches {
            fail(batch.waiters, error);
        }
    }
}

fn fail(waiters: Vec<Waiter>, error: &PipeError) {
    for waiter in waiters {
        // The caller may have gone (its request was cancelled): nothing to tell.
        let _ = waiter.tx.send(Err(error.clone()));
    }
}

/// One batched script on a connection of its own. Dropping it stops its task.
#[derive(Debug)]
pub struct ScriptPipe {
    shared: Arc<Shared>,
}

impl Drop for ScriptPipe {
    fn drop(&mut self) {
        self.shared.gathered().closed = true;
        self.shared.wake.notify_one();
    }
}

/// How long a failed connection attempt answers calls at once, before the next attempt.
const RETRY_AFTER: Duration = Duration::from_millis(500);

impl ScriptPipe {
    /// A pipe to `target` for the batched script `body`. Connects on the first call.
    pub fn new(target: Target, body: &'static str, settings: Settings) -> Self {
        Self::following(TargetCell::new(target), body, settings)
    }

    /// A pipe to whatever `target` holds when it connects.
    pub fn following(target: Arc<TargetCell>, body: &'static str, settings: Settings) -> Self {
        let sha = redis::Script::new(body).get_hash().to_owned();
        Self {
            shared: Arc::new(Shared {
                target,
                settings,
                sha,
                body,
                gathered: Mutex::new(Gathered::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// Adds `part` to the next call and waits for its answer: `reply_len` bytes of the
    /// call's reply (fewer if the reply is shorter than its parts said).
    pub async fn call(&self, part: Part, reply_len: usize) -> Result<Bytes, Error> {
        let (tx, rx) = oneshot::channel();
        {
            let mut gathered = self.shared.gathered();
            if let Some((until, error)) = &gathered.down {
                if Instant::now() < *until {
                    return Err(unavailable(error.clone()));
                }
                gathered.down = None;
            }
            let max_parts = self.shared.settings.max_parts;
            let waiter = Waiter { reply_len, tx };
            match gathered.batches.back_mut() {
                Some(batch) if batch.waiters.len() < max_parts => {
                    batch.part.keys.extend_from_slice(&part.keys);
                    batch.part.key_count += part.key_count;
                    batch.part.args.extend_from_slice(&part.args);
                    batch.part.arg_count += part.arg_count;
                    batch.waiters.push(waiter);
                }
                _ => gathered.batches.push_back(Batch {
                    part,
                    waiters: vec![waiter],
                }),
            }
            if !gathered.running {
                gathered.running = true;
                tokio::spawn(serve(self.shared.clone()));
            }
        }
        self.shared.wake.notify_one();
        match rx.await {
            Ok(answer) => answer.map_err(unavailable),
            Err(_) => Err(unavailable(PipeError::new(
                "the script call was dropped (runtime shutting down)",
            ))),
        }
    }
}

/// Marks the pipe unserved when its task ends (or its runtime drops it), failing what was
/// gathered, so that the next call starts another task.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .fail_gathered(&PipeError::new("the script pipe's task stopped"), true);
    }
}

async fn serve(shared: Arc<Shared>) {
    let _running = Running(shared.clone());
    let mut conn: Option<Conn> = None;
    loop {
        let (closed, idle) = {
            let gathered = shared.gathered();
            (
                gathered.closed,
                conn.is_none() && gathered.batches.is_empty(),
            )
        };
        if closed {
            return;
        }
        if idle {
            shared.wake.notified().await;
            continue;
        }
        if conn
            .as_ref()
            .is_some_and(|current| current.generation != shared.target.generation())
            && let Some(moved) = conn.take()
        {
            tracing::warn!("the hot store's primary moved: the script connection follows it");
            moved.fail_all(&PipeError::new("the hot store's primary moved"));
            continue;
        }
        let current = match &mut conn {
            Some(current) => current,
            None => match Conn::open(&shared).await {
                Ok(opened) => conn.insert(opened),
                Err(error) => {
                    tracing::warn!(error.cause = %error, "the hot store's script connection failed");
                    shared.gathered().down = Some((Instant::now() + RETRY_AFTER, error.clone()));
                    shared.fail_gathered(&error, false);
                    continue;
                }
            },
        };
        if let Err(error) = current.step(&shared).await {
            tracing::warn!(error.cause = %error, "the hot store's script connection was lost");
            if let Some(lost) = conn.take() {
                lost.fail_all(&error);
            }
        }
    }
}

/// A call written and not yet answered.
#[derive(Debug)]
struct Call {
    /// Everything after the command's name and script: numkeys, keys, parts, arguments.
    body: Vec<u8>,
    items: usize,
    waiters: Vec<Waiter>,
    deadline: Instant,
    /// Sent again as `EVAL` after a `NOSCRIPT`.
    evaluated: bool,
}

struct Conn {
    stream: Box<dyn Socket>,
    out: Vec<u8>,
    /// Written to the stream, perhaps not yet to the socket (TLS records).
    unflushed: bool,
    input: BytesMut,
    /// What one read takes from the stream.
    chunk: Box<[u8]>,
    calls: VecDeque<Call>,
    /// The [`TargetCell`] generation it connected to.
    generation: u64,
}

/// Bytes one read takes at most.
const CHUNK: usize = 64 * 1024;

impl Conn {
    async fn open(shared: &Shared) -> Result<Conn, PipeError> {
        let generation = shared.target.generation();
        let target = &*shared.target.get();
        let open = async {
            let mut stream = connect(&target.addr).await?;
            let mut hello = Vec::new();
            let mut expected = 0;
            if let Some(password) = &target.password {
                let mut args: Vec<&[u8]> = vec![b"AUTH"];
                args.extend(target.username.as_deref().map(str::as_bytes));
                args.push(password.as_bytes());
                command(&mut hello, &args);
                expected += 1;
            }
            if target.db != 0 {
                command(
                    &mut hello,
                    &[b"SELECT", itoa::Buffer::new().format(target.db).as_bytes()],
                );
                expected += 1;
            }
            stream.write_all(&hello).await?;
            stream.flush().await?;
            let mut conn = Conn {
                stream,
                out: Vec::new(),
                unflushed: false,
                input: BytesMut::with_capacity(CHUNK),
                chunk: vec![0; CHUNK].into_boxed_slice(),
                calls: VecDeque::new(),
                generation,
            };
            while expected > 0 {
                match parse(&mut conn.input)? {
                    Some(Reply::Ok) => expected -= 1,
                    Some(Reply::Error(message)) => return Err(PipeError::new(message)),
                    Some(Reply::Bulk(_)) => {
                        return Err(PipeError::new("unexpected reply to AUTH or SELECT"));
                    }
                    None => {
                        if conn.stream.read_buf(&mut conn.input).await? == 0 {
                            return Err(PipeError::new("Redis closed the connection"));
                        }
                    }
                }
            }
            Ok(conn)
        };
        match tokio::time::timeout(shared.settings.timeout, open).await {
            Ok(conn) => conn,
            Err(_) => Err(PipeError::new(format!(
                "no connection to {} within {} ms",
                target.addr,
                shared.settings.timeout.as_millis()
            ))),
        }
    }

    /// Writes what was gathered while calls may go, then waits for replies, more parts, or
    /// the oldest call's deadline, writing meanwhile what the socket takes.
    async fn step(&mut self, shared: &Shared) -> Result<(), PipeError> {
        while self.calls.len() < shared.settings.in_flight
            && let Some(batch) = shared.take()
        {
            self.send(shared, batch);
        }
        let deadline = self.calls.front().map(|call| call.deadline);
        let room = self.calls.len() < shared.settings.in_flight;
        let notified = shared.wake.notified();
        let expired = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now));
        tokio::pin!(notified, expired);
        std::future::poll_fn(|cx| {
            if let Poll::Ready(done) = self.poll_io(cx, shared) {
                return Poll::Ready(done);
            }
            if room && notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            if deadline.is_some() && expired.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(PipeError::new(format!(
                    "Redis did not answer within {} ms",
                    shared.settings.timeout.as_millis()
                ))));
            }
            Poll::Pending
        })
        .await
    }

    /// Writes what the socket takes, then reads what has come; ready once replies were
    /// handed out (or the connection failed), pending while there is nothing to read.
    fn poll_io(&mut self, cx: &mut Context<'_>, shared: &Shared) -> Poll<Result<(), PipeError>> {
        while !self.out.is_empty() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(PipeError::new("Redis closed the connection")));
                }
                Poll::Ready(Ok(written)) => {
                    self.out.drain(..written);
                    self.unflushed = true;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => break,
            }
        }
        if self.unflushed && self.out.is_empty() {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => {}
            }
        }
        let mut read = ReadBuf::new(&mut self.chunk);
        match Pin::new(&mut self.stream).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                Poll::Ready(Err(PipeError::new("Redis closed the connection")))
            }
            Poll::Ready(Ok(())) => {
                self.input.extend_from_slice(read.filled());
                Poll::Ready(self.answer(shared))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn send(&mut self, shared: &Shared, batch: Batch) {
        let Batch { part, waiters } = batch;
        metrics::histogram!(shared.settings.parts_metric).record(waiters.len() as f64);
        let mut body = Vec::with_capacity(part.keys.len() + part.args.len() + 32);
        bulk(
            &mut body,
            itoa::Buffer::new().format(part.key_count).as_bytes(),
        );
        body.extend_from_slice(&part.keys);
        bulk(
            &mut body,
            itoa::Buffer::new().format(waiters.len()).as_bytes(),
        );
        body.extend_from_slice(&part.args);
        let call = Call {
            body,
            items: 1 + part.key_count + 1 + part.arg_count,
            waiters,
            deadline: Instant::now() + shared.settings.timeout,
            evaluated: false,
        };
        self.write_call(shared, call);
    }

    fn write_call(&mut self, shared: &Shared, call: Call) {
        let out = &mut self.out;
        out.push(b'*');
        out.extend_from_slice(itoa::Buffer::new().format(2 + call.items).as_bytes());
        out.extend_from_slice(b"\r\n");
        if call.evaluated {
            bulk(out, b"EVAL");
            bulk(out, shared.body.as_bytes());
        } else {
            bulk(out, b"EVALSHA");
            bulk(out, shared.sha.as_bytes());
        }
        out.extend_from_slice(&call.body);
        self.calls.push_back(call);
    }

    /// Hands out every whole reply read so far.
    fn answer(&mut self, shared: &Shared) -> Result<(), PipeError> {
        while let Some(reply) = parse(&mut self.input)? {
            let Some(mut call) = self.calls.pop_front() else {
                return Err(PipeError::new("a reply to no call"));
            };
            match reply {
                Reply::Bulk(answer) => answer_parts(call.waiters, answer),
                Reply::Error(message) if message.starts_with("NOSCRIPT") && !call.evaluated => {
                    call.evaluated = true;
                    call.deadline = Instant::now() + shared.settings.timeout;
                    self.write_call(shared, call);
                }
                Reply::Error(message) => fail(call.waiters, &PipeError::new(message)),
                Reply::Ok => fail(
                    call.waiters,
                    &PipeError::new("unexpected +OK to a script call"),
                ),
            }
        }
        Ok(())
    }

    fn fail_all(self, error: &PipeError) {
        for call in self.calls {
            fail(call.waiters, error);
        }
    }
}

/// Each part's slice of its call's answer, in order.
fn answer_parts(waiters: Vec<Waiter>, mut answer: Bytes) {
    for waiter in waiters {
        let mine = answer.split_to(waiter.reply_len.min(answer.len()));
        let _ = waiter.tx.send(Ok(mine));
    }
}

#[cfg(test)]
mod tests;
