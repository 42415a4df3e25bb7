//! A client for the auth service and for gateways (cargo feature `client`).
//!
//! One [`Client`] per process: it reuses connections, puts a timeout on every call, and
//! retries what is safe to retry with **full-jitter exponential backoff**, never earlier
//! than the server's `retry_after_ms` (or `Retry-After`) says. Ingest is idempotent by
//! `event_id`, so a retried batch counts nothing twice. A limit check's 429 is an answer
//! (`allowed: false`), not an error, and is never retried.
//!
//! On each login the auth service calls [`Client::account_status`] before checking the
//! password (challenge or refuse as told) and [`Client::post_auth_events`] after it.

use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::Reason;

/// How calls are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Backoff base: attempt `n` waits up to `base · 2ⁿ`.
    pub base: Duration,
    /// Largest jittered backoff.
    pub cap: Duration,
    /// Most time spent waiting over one call; a wait that would pass it is not made and the
    /// last error is returned (the caller's own deadline decides, not ours).
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
            max_wait: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): a uniform
    /// wait in `[0, min(cap, base · 2^attempt)]`; `unit` is a uniform draw in `[0, 1)`.
    pub fn full_jitter(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self
            .base
            .saturating_mul(2u32.saturating_pow(attempt.min(30)))
            .min(self.cap);
        ceiling.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// Palisade answered with an error envelope.
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Envelope code, e.g. `INVALID_ARGUMENT`.
        code: String,
        /// Envelope message.
        message: String,
        /// `details.retry_after_ms`, else `Retry-After` × 1000, else 0.
        retry_after_ms: u64,
    },
    /// The request did not reach Palisade (connection refused, DNS) — never processed.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// No answer in time (it may or may not have been processed).
    #[error("timed out: {0}")]
    Timeout(String),
    /// Anything else on the way (a broken connection, an unreadable body).
    #[error("transport: {0}")]
    Transport(String),
}

impl ClientError {
    /// Whether a retry may help, and the earliest it may be made: `Some(floor)` for 429,
    /// 502, 503 and 504 (the server's `retry_after_ms` as floor), connection failures and
    /// timeouts; `None` for everything else (a 4xx will fail again).
    pub fn retry_floor(&self) -> Option<Duration> {
        match self {
            ClientError::Api {
                status: 429 | 502 | 503 | 504,
                retry_after_ms,
                ..
            } => Some(Duration::from_millis(*retry_after_ms)),
            ClientError::Connect(_) | ClientError::Timeout(_) => Some(Duration::ZERO),
            _ => None,
        }
    }
}

/// Runs `call` until it succeeds, fails for good, or the policy is spent.
///
/// Before retry `n` it sleeps `retry_floor + full_jitter(n)`: never before the server said,
/// and spread so that many clients do not retry in step. `retryable` may narrow which
/// errors are retried (e.g. only `Connect` for a consuming limit check). `backon` runs the
/// loop; the waits are [`FullJitter`]'s, raised to the server's floor. Sleeps with
/// `tokio::time`, so a paused test clock drives it.
pub async fn retrying<T, F, Fut>(
    policy: &RetryPolicy,
    retryable: impl Fn(&ClientError) -> bool,
    call: F,
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    use backon::Retryable;
    let mut waited = Duration::ZERO;
    call.retry(FullJitter::new(policy))
        .sleep(tokio::time::sleep)
        .when(|err| err.retry_floor().is_some() && retryable(err))
        .adjust(|err, jitter| {
            let wait = jitter? + err.retry_floor().unwrap_or_default();
            // The caller's own deadline decides past `max_wait`, not ours.
            (waited + wait <= policy.max_wait).then(|| {
                waited += wait;
                wait
            })
        })
        .await
}

/// The waits before each retry of one call under a [`RetryPolicy`]: `full_jitter(n)` before
/// retry `n`, and none after `max_attempts` calls (a `backon` backoff: any iterator of waits
/// is one).
#[derive(Debug, Clone)]
pub struct FullJitter {
    policy: RetryPolicy,
    attempt: u32,
}

impl FullJitter {
    /// The waits of one call under `policy`.
    pub fn new(policy: &RetryPolicy) -> Self {
        Self {
            policy: policy.clone(),
            attempt: 0,
        }
    }
}

impl Iterator for FullJitter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.attempt.saturating_add(1) >= self.policy.max_attempts {
            return None;
        }
        let wait = self.policy.full_jitter(self.attempt, rand::random::<f64>());
        self.attempt += 1;
        Some(wait)
    }
}

/// One login event for `POST /v1/events/auth`.
#[derive(Debug, Clone, Serialize)]
pub struct AuthEvent {
    /// Unique per event: retries of a batch are recognised by it.
    pub event_id: String,
    /// `login_failure`, `login_success`, or `challenge_passed` (with `challenge_id`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The account tried.
    pub account: String,
    /// The client IP.
    pub ip: String,
    /// The device, if the app sends one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// The login endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// RFC 3339; absent = time of receipt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts: Option<String>,
    /// The login challenge the person passed (`challenge_passed` only): the id the limit
    /// check answered with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub challenge_id: Option<String>,
}

/// What an account must do now.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AccountDecision {
    /// The account.
    pub account: String,
    /// `none`, `challenge` or `lockout`.
    pub action: String,
    /// RFC 3339, when locked.
    #[serde(default)]
    pub locked_until: Option<String>,
    /// Why.
    #[serde(default)]
    pub reasons: Vec<Reason>,
}

/// The answer to a batch of auth events.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuthAccepted {
    /// Newly stored events.
    pub accepted: u64,
    /// Events stored before (retries).
    pub duplicates: u64,
    /// One per account in the batch.
    pub decisions: Vec<AccountDecision>,
}

/// `GET /v1/accounts/{account}/status`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AccountStatus {
    /// The account.
    pub account: String,
    /// `none`, `challenge` or `lockout`.
    pub action: String,
    /// RFC 3339, when locked.
    #[serde(default)]
    pub locked_until: Option<String>,
    /// Failures counted in the window.
    pub failures_in_window: u32,
    /// Why.
    #[serde(default)]
    pub reasons: Vec<Reason>,
}

/// A limit check (`POST /v1/limit/check`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LimitCheck {
    /// Path of the protected request.
    pub endpoint: String,
    /// Its method (default GET).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// The client IP.
    pub ip: String,
    /// The authenticated user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// The device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Who the message or notification it asks for goes to (a phone number, e-mail address
    /// or push token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
    /// Tokens it costs (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u32>,
    /// False: ask without taking tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consume: Option<bool>,
}

/// A limit decision: allowed, or denied with the exact wait.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitDecision {
    /// May the request pass.
    pub allowed: bool,
    /// Milliseconds until it may (0 when allowed).
    pub retry_after_ms: u64,
    /// The deciding scope (`ip`, `user`, …).
    pub scope: Option<String>,
    /// Its limit.
    pub limit: Option<u64>,
    /// Tokens left (allowed only).
    pub remaining: Option<u64>,
}

/// The client.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    retry: RetryPolicy,
}

#[derive(Deserialize)]
struct Envelope {
    error: EnvelopeError,
}

#[derive(Deserialize)]
struct EnvelopeError {
    code: String,
    message: String,
    #[serde(default)]
    details: Option<serde_json::Value>,
}

impl Client {
    /// A client of the Palisade at `base_url` (e.g. `http://127.0.0.1:8080`) with an API
    /// token; 2 s per call, 500 ms to connect, [`RetryPolicy::default`].
    pub fn new(base_url: &str, token: &str) -> Result<Self, ClientError> {
        Self::with_timeouts(
            base_url,
            token,
            Duration::from_secs(2),
            Duration::from_millis(500),
        )
    }

    /// Like [`Client::new`] with other timeouts.
    pub fn with_timeouts(
        base_url: &str,
        token: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            retry: RetryPolicy::default(),
        })
    }

    /// Replaces the retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Posts a batch of login events (≤ 1000); retried safely (idempotent by `event_id`).
    pub async fn post_auth_events(
        &self,
        events: &[AuthEvent],
    ) -> Result<AuthAccepted, ClientError> {
        let body = serde_json::json!({ "events": events });
        retrying(
            &self.retry,
            |_| true,
            || async {
                let response = self
                    .send(self.http.post(self.url("/v1/events/auth")).json(&body))
                    .await?;
                decode(response).await
            },
        )
        .await
    }

    /// What the auth service must do for a login attempt of `account` from `ip`.
    pub async fn account_status(
        &self,
        account: &str,
        ip: &str,
        device_id: Option<&str>,
    ) -> Result<AccountStatus, ClientError> {
        let mut query = vec![("ip", ip)];
        if let Some(device) = device_id {
            query.push(("device_id", device));
        }
        // The account goes in as one path segment, percent-encoded by `url`.
        let mut url = reqwest::Url::parse(&self.url("/v1/accounts"))
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        url.path_segments_mut()
            .map_err(|()| ClientError::Transport(format!("{} is not a base URL", self.base)))?
            .extend([account, "status"]);
        retrying(
            &self.retry,
            |_| true,
            || async {
                let response = self.send(self.http.get(url.clone()).query(&query)).await?;
                decode(response).await
            },
        )
        .await
    }

    /// May this request pass? A 429 is `Ok` with `allowed: false`. Only a request that
    /// never reached Palisade is retried when it consumes tokens (a timed-out one may
    /// have consumed already).
    pub async fn limit_check(&self, check: &LimitCheck) -> Result<LimitDecision, ClientError> {
        let consumes = check.consume.unwrap_or(true);
        let retryable = |err: &ClientError| !consumes || matches!(err, ClientError::Connect(_));
        retrying(&self.retry, retryable, || async {
            let response = self
                .send(self.http.post(self.url("/v1/limit/check")).json(check))
                .await?;
            if response.status().as_u16() == 429 {
                let err = api_error(response).await;
                let ClientError::Api { retry_after_ms, .. } = &err else {
                    return Err(err);
                };
                return Ok(LimitDecision {
                    allowed: false,
                    retry_after_ms: *retry_after_ms,
                    scope: None,
                    limit: None,
                    remaining: None,
                });
            }
            let body: serde_json::Value = decode(response).await?;
            Ok(LimitDecision {
                allowed: true,
                retry_after_ms: 0,
                scope: body["scope"].as_str().map(str::to_owned),
                limit: body["limit"].as_u64(),
                remaining: body["remaining"].as_u64(),
            })
        })
        .await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(transport_error)
    }
}

fn transport_error(err: reqwest::Error) -> ClientError {
    if err.is_connect() {
        ClientError::Connect(err.to_string())
    } else if err.is_timeout() {
        ClientError::Timeout(err.to_string())
    } else {
        ClientError::Transport(err.to_string())
    }
}

async fn decode<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
) -> Result<T, ClientError> {
    if !response.status().is_success() {
        return Err(api_error(response).await);
    }
    response.json().await.map_err(transport_error)
}

async fn api_error(response: reqwest::Response) -> ClientError {
    let status = response.status().as_u16();
    let header_ms = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| s.saturating_mul(1000));
    let envelope: Option<Envelope> = response.json().await.ok();
    let (code, message, details) = match envelope {
        Some(Envelope { error }) => (error.code, error.message, error.details),
        None => ("UNKNOWN".to_owned(), format!("HTTP {status}"), None),
    };
    let body_ms = details.as_ref().and_then(|d| d["retry_after_ms"].as_u64());
    ClientError::Api {
        status,
        code,
        message,
        retry_after_ms: body_ms.or(header_ms).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    fn api(status: u16, retry_after_ms: u64) -> ClientError {
        ClientError::Api {
            status,
            code: "X".to_owned(),
            message: "x".to_owned(),
            retry_after_ms,
        }
    }

    /// Runs `retrying` over scripted answers; returns the result and when each call came.
    async fn run(
        policy: &RetryPolicy,
        answers: Vec<Result<u32, ClientError>>,
    ) -> (Result<u32, ClientError>, Vec<Duration>) {
        let start = Instant::now();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(answers.into_iter()));
        let result = retrying(
            policy,
            |_| true,
            || {
                calls.lock().unwrap().push(start.elapsed());
                let next = answers
                    .lock()
                    .unwrap()
                    .next()
                    .expect("no more scripted answers");
                async move { next }
            },
        )
        .await;
        let calls = calls.lock().unwrap().clone();
        (result, calls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_is_never_retried_before_its_retry_after() {
        let policy = RetryPolicy::default();
        for _ in 0..50 {
            let (result, calls) = run(&policy, vec![Err(api(429, 1800)), Ok(7)]).await;
            assert_eq!(result, Ok(7));
            let gap = calls[1] - calls[0];
            // retry_after + full jitter of attempt 0: [1800, 1800 + 100] ms.
            assert!(gap >= Duration::from_millis(1800), "{gap:?}");
            assert!(gap <= Duration::from_millis(1900), "{gap:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unavailable_is_retried_with_growing_jittered_backoff_then_given_up() {
        let policy = RetryPolicy {
            max_attempts: 4,
            max_wait: Duration::from_secs(60),
            ..RetryPolicy::default()
        };
        let (result, calls) = run(
            &policy,
            vec![
                Err(api(503, 0)),
                Err(api(503, 0)),
                Err(api(503, 0)),
                Err(api(503, 0)),
            ],
        )
        .await;
        assert_eq!(result, Err(api(503, 0)));
        assert_eq!(calls.len(), 4, "max_attempts calls, then the error");
        for (n, pair) in calls.windows(2).enumerate() {
            let ceiling = Duration::from_millis(100 * 2u64.pow(n as u32));
            assert!(
                pair[1] - pair[0] <= ceiling,
                "attempt {n}: {:?}",
                pair[1] - pair[0]
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn client_errors_are_not_retried_and_long_waits_are_not_made() {
        let policy = RetryPolicy::default();
        let (result, calls) = run(&policy, vec![Err(api(400, 0))]).await;
        assert_eq!((result, calls.len()), (Err(api(400, 0)), 1));
        // The server asks for 60 s; the policy waits at most 5 s: give the error back now.
        let (result, calls) = run(&policy, vec![Err(api(429, 60_000))]).await;
        assert_eq!((result, calls.len()), (Err(api(429, 60_000)), 1));
        assert_eq!(calls[0], Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn connection_failures_are_retried() {
        let policy = RetryPolicy::default();
        let refused = ClientError::Connect("refused".to_owned());
        let (result, calls) = run(&policy, vec![Err(refused.clone()), Err(refused), Ok(1)]).await;
        assert_eq!((result, calls.len()), (Ok(1), 3));
    }

    #[test]
    fn full_jitter_stays_within_the_capped_exponential_ceiling() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.full_jitter(0, 0.0), Duration::ZERO);
        assert_eq!(policy.full_jitter(0, 1.0), Duration::from_millis(100));
        assert_eq!(policy.full_jitter(3, 1.0), Duration::from_millis(800));
        assert_eq!(
            policy.full_jitter(10, 1.0),
            Duration::from_secs(2),
            "capped"
        );
        assert_eq!(policy.full_jitter(40, 0.5), Duration::from_secs(1));
    }
}
