//! Accuracy scenarios: realistic traffic mixes replayed against a running Palisade, each
//! scored on what it did to the attacker and to the honest users.
//!
//! A scenario is a list of requests at simulated times. Each request is asked of
//! `POST /v1/limit/check` as a gateway would; an admitted login is then reported to
//! `POST /v1/events/auth` as the auth service would (a success, or a failure for a wrong
//! password), in one batch per simulated second. Honest users' mistyped passwords are
//! failures followed by a success. Nothing retries a refusal: every 429 is counted once.
//! A login challenge is passed by honest users (reported as `challenge_passed` before the
//! login) and never by the attacker ([`Report`]).
//!
//! Time runs `scale` times faster than in production, with every period of the policy
//! (budgets, lockout and spraying windows, block and lockout lengths, the shared-address
//! window) divided by `scale` ([`scale_settings`]): the decisions are those of the default
//! policy on traffic `scale` times slower. Embedded, the app's manual clock jumps; on
//! Postgres + Redis the run waits in real time (Redis `TIME` drives the buckets).
//!
//! Shared by the `scenarios` bench (every scenario, full size, `docs/ACCURACY.md`) and the
//! `scenarios` test module (a small carrier-NAT run with its goals asserted, on both
//! backends).

#![allow(dead_code, reason = "the bench and the tests use different parts")]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp};

/// Who sends a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    /// A real user of the app.
    Honest,
    /// The attacker.
    Attacker,
}

/// What a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A login with the right password.
    Login,
    /// A login with a wrong password (a typo, or an attacker's guess).
    BadLogin,
    /// An authenticated read.
    Read,
    /// An anonymous search (an expensive class).
    Search,
    /// A request for a one-time code by SMS to [`Request::recipient`] (`messaging`): the
    /// backend sends a message for each one admitted.
    OtpSend,
}

/// One request of a scenario.
#[derive(Debug, Clone)]
pub struct Request {
    /// Simulated ms from the start.
    pub at_ms: u64,
    /// Who sends it; `user` numbers the honest users (an attacker's requests count as one).
    pub side: Side,
    /// The user it belongs to (honest), for "users who saw a 429".
    pub user: u32,
    /// What it is.
    pub kind: Kind,
    /// The account (logins) or user id (reads), if any.
    pub account: Option<String>,
    /// The client address.
    pub ip: String,
    /// The device id, if the client sends one.
    pub device: Option<String>,
    /// Who a message goes to ([`Kind::OtpSend`]).
    pub recipient: Option<String>,
    /// How the client retries a 429 (None: it does not).
    pub retry: Option<Retry>,
    /// Which attempt this is (0: the first).
    pub attempt: u32,
}

/// A retry waiting for its time, ordered by (time, side, user, sequence), earliest first.
struct RetryEntry(std::cmp::Reverse<(u64, Side, u32, u64)>, Request);

impl PartialEq for RetryEntry {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl Eq for RetryEntry {}
impl PartialOrd for RetryEntry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for RetryEntry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// How a client retries a refused request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// As docs/CLIENTS.md asks and its Kotlin client does: after `retry_after_ms` plus full
    /// jitter of up to min(2 s, 100 ms · 2^attempt), 3 attempts in all.
    Honours,
    /// Every 250 ms whatever the answer says, at most 20 times.
    Ignores,
}

impl Retry {
    /// When attempt `attempt + 1` of a request refused at `at_ms` goes, or None when the
    /// client gives up. The jitter is a hash of the user and attempt (the run stays
    /// deterministic).
    fn next(self, at_ms: u64, retry_after_ms: u64, user: u32, attempt: u32) -> Option<u64> {
        match self {
            Retry::Honours if attempt < 2 => {
                let cap = (100u64 << attempt.min(10)).min(2_000);
                let jitter = (u64::from(user) * 7_919 + u64::from(attempt) * 104_729) % (cap + 1);
                Some(at_ms + retry_after_ms + jitter)
            }
            Retry::Ignores if attempt < 20 => Some(at_ms + 250),
            _ => None,
        }
    }
}

/// A scenario: what it models, its traffic, and what must be loaded first.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name.
    pub name: &'static str,
    /// One sentence.
    pub what: &'static str,
    /// Every request, any order.
    pub requests: Vec<Request>,
    /// Auth events of the days before (not measured): e.g. a carrier's NAT seen before.
    pub history: Vec<Value>,
    /// Needs the reputation lists and the ASN test database in the data dir.
    pub data: bool,
}

/// What a scenario did.
///
/// A login challenge (`login_guard`, `network_blocked`: a context the account does not know,
/// while the guard is on or its network is blocked) is passed by an honest user, who then logs
/// in (the auth service reports `challenge_passed`), and never by the attacker, whose attempt
/// ends at the step-up (its password is never checked). A `known_context` step-up is passed
/// by whoever has the context.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Scenario name.
    pub name: &'static str,
    /// Attacker requests and how many were refused.
    pub attacker: (u64, u64),
    /// Attacker requests answered with a login challenge (never passed).
    pub attacker_challenged: u64,
    /// Attacker requests after it was first stopped (refused or challenged), and how many of
    /// them were stopped.
    pub attacker_after_first: (u64, u64),
    /// Simulated ms from the attacker's first request to the first time it was stopped.
    pub first_block_ms: Option<u64>,
    /// Honest requests and how many were refused.
    pub honest: (u64, u64),
    /// Honest requests answered with a login challenge (passed).
    pub honest_challenged: u64,
    /// Honest users, and how many saw at least one 429.
    pub users: (u64, u64),
    /// Honest users who were asked for a login challenge at least once.
    pub users_challenged: u64,
    /// Refusal reasons of honest requests.
    pub honest_reasons: BTreeMap<String, u64>,
    /// Honest requests with a retry policy, per policy (honours, ignores): requests (first
    /// attempts), attempts in all, and requests never admitted (the client gave up).
    pub retried: [(u64, u64, u64); 2],
    /// Wall time of the run.
    pub wall: Duration,
}

impl Report {
    /// Percentage of `part` in `whole` (0 when empty).
    pub fn pct((whole, part): (u64, u64)) -> f64 {
        if whole == 0 {
            0.0
        } else {
            part as f64 * 100.0 / whole as f64
        }
    }
}

/// Divides every period of the policy by `scale` (at least 1 s each).
pub fn scale_settings(settings: &mut palisade::Settings, scale: u64) {
    let s = |v: u64| (v / scale).max(1);
    for budget in &mut settings.limits.budgets {
        if budget.period_s > 1 {
            budget.period_s = u32::try_from(s(u64::from(budget.period_s))).unwrap_or(1);
        }
    }
    let lockout = &mut settings.lockout;
    lockout.window_s = s(lockout.window_s);
    lockout.spray_block_s = s(lockout.spray_block_s);
    lockout.base_lockout_s = s(lockout.base_lockout_s);
    lockout.max_lockout_s = s(lockout.max_lockout_s);
    lockout.human_interval_ms = (lockout.human_interval_ms / scale).max(1);
    lockout.stuffing.window_s = s(lockout.stuffing.window_s);
    lockout.stuffing.hold_s = s(lockout.stuffing.hold_s);
    let shared = &mut settings.limits.shared_ip;
    shared.window_s = s(shared.window_s);
    shared.remember_s = s(shared.remember_s);
}

/// The files [`Scenario::data`] scenarios need: (repository file, data dir path).
pub const DATA: &[(&str, &str)] = &[
    (
        "data/ranges/datacenter/x4bnet-datacenter-ipv4.txt.gz",
        "ranges/datacenter/x4bnet-datacenter-ipv4.txt",
    ),
    (
        "data/ranges/tor/tor-exit-nodes-2024-02.lst.gz",
        "ranges/tor/tor-exit-nodes-2024-02.lst",
    ),
    (
        "tests/fixtures/mmdb/GeoLite2-ASN-Test.mmdb",
        "asn/GeoLite2-ASN-Test.mmdb",
    ),
];

fn check_body(request: &Request) -> Value {
    let (method, endpoint) = match request.kind {
        Kind::Login | Kind::BadLogin => ("POST", "/auth/login"),
        Kind::Read => ("GET", "/feed"),
        Kind::Search => ("GET", "/search"),
        Kind::OtpSend => ("POST", "/otp/send"),
    };
    let mut body = json!({"endpoint": endpoint, "method": method, "ip": request.ip});
    if let Some(account) = &request.account {
        body["user_id"] = json!(account);
    }
    if let Some(device) = &request.device {
        body["device_id"] = json!(device);
    }
    if let Some(recipient) = &request.recipient {
        body["recipient"] = json!(recipient);
    }
    body
}

/// Runs `scenario` against `app` (built with [`scale_settings`] of `scale`).
pub async fn run(app: &TestApp, scenario: &Scenario, scale: u64) -> Report {
    let started = Instant::now();
    if scenario.data {
        app.load_data(DATA).await;
    }
    // `ago_s`: the event happened that long before the scenario starts.
    let now_ms = app.app.clock.now_ms();
    let history: Vec<Value> = scenario
        .history
        .iter()
        .cloned()
        .map(|mut event| {
            if let Some(ago) = event
                .as_object_mut()
                .and_then(|e| e.remove("ago_s"))
                .and_then(|v| v.as_i64())
            {
                event["ts"] = json!(palisade::clock::rfc3339(now_ms - ago * 1000));
            }
            event
        })
        .collect();
    for chunk in history.chunks(1000) {
        post_events(app, chunk.to_vec()).await;
    }
    let mut requests = scenario.requests.clone();
    requests.sort_by_key(|r| (r.at_ms, r.side, r.user));
    // Retries of refused requests, earliest first.
    let mut retries: std::collections::BinaryHeap<RetryEntry> = std::collections::BinaryHeap::new();
    let mut retry_seq = 0u64;
    let mut report = Report {
        name: scenario.name,
        ..Report::default()
    };
    let honest_users: BTreeSet<u32> = requests
        .iter()
        .filter(|r| r.side == Side::Honest)
        .map(|r| r.user)
        .collect();
    let mut hurt: BTreeSet<u32> = BTreeSet::new();
    let mut challenged: BTreeSet<u32> = BTreeSet::new();
    let mut attacker_start = None;
    let mut event_id = 0u64;
    let tick_ms = 1000;
    let mut now_ms = 0u64;
    let mut tick_started = Instant::now();
    let mut next = 0;
    while next < requests.len() || !retries.is_empty() {
        let tick_end = now_ms + tick_ms;
        let mut events = Vec::new();
        loop {
            // The earlier of the next planned request and the next retry, in this tick.
            let planned = requests
                .get(next)
                .filter(|r| r.at_ms < tick_end)
                .map(|r| (r.at_ms, r.side, r.user));
            let retry = retries
                .peek()
                .filter(|entry| (entry.0).0.0 < tick_end)
                .map(|entry| ((entry.0).0.0, (entry.0).0.1, (entry.0).0.2));
            let owned;
            let request = match (planned, retry) {
                (None, None) => break,
                (Some(p), Some(r)) if r < p => {
                    owned = retries.pop().expect("peeked").1;
                    &owned
                }
                (Some(_), _) => {
                    next += 1;
                    &requests[next - 1]
                }
                (None, Some(_)) => {
                    owned = retries.pop().expect("peeked").1;
                    &owned
                }
            };
            let response = app.limit_check(&check_body(request)).await;
            let status = response.status();
            assert!(
                status == reqwest::StatusCode::OK
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS,
                "{}: limit check answered {status}",
                scenario.name,
            );
            let body: Value = response.json().await.unwrap_or_default();
            let allowed = status == reqwest::StatusCode::OK;
            // A login challenge (with an id), as opposed to a known context's step-up.
            let challenge = body["challenge"]["id"].as_str().map(str::to_owned);
            let stopped = !allowed || (challenge.is_some() && request.side == Side::Attacker);
            match request.side {
                Side::Attacker => {
                    report.attacker.0 += 1;
                    let start = *attacker_start.get_or_insert(request.at_ms);
                    if report.first_block_ms.is_some() {
                        report.attacker_after_first.0 += 1;
                    }
                    if !allowed {
                        report.attacker.1 += 1;
                    } else if challenge.is_some() {
                        report.attacker_challenged += 1;
                    }
                    if stopped {
                        if report.first_block_ms.is_some() {
                            report.attacker_after_first.1 += 1;
                        }
                        report.first_block_ms.get_or_insert(request.at_ms - start);
                    }
                }
                Side::Honest => {
                    report.honest.0 += 1;
                    if let Some(policy) = request.retry {
                        let counts = &mut report.retried[usize::from(policy == Retry::Ignores)];
                        counts.0 += u64::from(request.attempt == 0);
                        counts.1 += 1;
                        if !allowed {
                            // The service's clock runs `scale` times slower than the
                            // simulation: its wait is that many simulated ms.
                            let retry_after = body["error"]["details"]["retry_after_ms"]
                                .as_u64()
                                .unwrap_or(1_000)
                                * scale;
                            match policy.next(
                                request.at_ms,
                                retry_after,
                                request.user,
                                request.attempt,
                            ) {
                                Some(at_ms) => {
                                    retry_seq += 1;
                                    retries.push(RetryEntry(
                                        std::cmp::Reverse((
                                            at_ms,
                                            request.side,
                                            request.user,
                                            retry_seq,
                                        )),
                                        Request {
                                            at_ms,
                                            attempt: request.attempt + 1,
                                            ..request.clone()
                                        },
                                    ));
                                }
                                None => counts.2 += 1,
                            }
                        }
                    }
                    if !allowed {
                        report.honest.1 += 1;
                        hurt.insert(request.user);
                        let reason = body["error"]["details"]["reason"].as_str().unwrap_or("-");
                        *report.honest_reasons.entry(reason.to_owned()).or_default() += 1;
                    } else if challenge.is_some() {
                        report.honest_challenged += 1;
                        challenged.insert(request.user);
                    }
                }
            }
            if !stopped && matches!(request.kind, Kind::Login | Kind::BadLogin) {
                let mut event = json!({
                    "account": request.account,
                    "ip": request.ip,
                });
                if let Some(device) = &request.device {
                    event["device_id"] = json!(device);
                }
                if let Some(id) = &challenge {
                    // The person passed the step-up: the context is known from now on.
                    event_id += 1;
                    let mut passed = event.clone();
                    passed["event_id"] = json!(format!("{}-{event_id}", scenario.name));
                    passed["type"] = json!("challenge_passed");
                    passed["challenge_id"] = json!(id);
                    events.push(passed);
                }
                event_id += 1;
                event["event_id"] = json!(format!("{}-{event_id}", scenario.name));
                event["type"] = json!(if request.kind == Kind::Login {
                    "login_success"
                } else {
                    "login_failure"
                });
                events.push(event);
            }
        }
        if !events.is_empty() {
            post_events(app, events).await;
        }
        // The next simulated second: the manual clock jumps, real time is waited out.
        let step = Duration::from_millis(tick_ms / scale);
        match app.clock.as_ref() {
            Some(_) => app.advance(step).await,
            None => {
                let spent = tick_started.elapsed();
                if spent < step {
                    tokio::time::sleep(step - spent).await;
                }
            }
        }
        tick_started = Instant::now();
        now_ms = tick_end;
    }
    report.users = (honest_users.len() as u64, hurt.len() as u64);
    report.users_challenged = challenged.len() as u64;
    report.wall = started.elapsed();
    report
}

async fn post_events(app: &TestApp, events: Vec<Value>) {
    let response = app
        .post(
            "/v1/events/auth",
            Some(ADMIN_TOKEN),
            &json!({ "events": events }),
        )
        .await;
    let status = response.status();
    assert_eq!(
        status,
        reqwest::StatusCode::OK,
        "auth events: {}",
        response.text().await.unwrap_or_default()
    );
}

/// How big a scenario is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Honest users (a scenario may use a multiple).
    pub users: u32,
    /// Simulated seconds.
    pub duration_s: u64,
}

impl Size {
    /// The size `docs/ACCURACY.md` reports.
    pub const FULL: Size = Size {
        users: 1000,
        duration_s: 300,
    };
}

/// An honest user's day in the app: one login (3 % mistyped first, then right 10 s later)
/// at a random time, then `reads` authenticated reads spread over the rest.
fn honest_user(
    rng: &mut StdRng,
    out: &mut Vec<Request>,
    user: u32,
    ip: String,
    device: Option<String>,
    size: Size,
    reads: u32,
) {
    let end = size.duration_s * 1000;
    let login_at = rng.random_range(0..end * 2 / 3);
    let base = Request {
        at_ms: login_at,
        side: Side::Honest,
        user,
        kind: Kind::Login,
        account: Some(format!("user{user}")),
        ip,
        device,
        recipient: None,
        retry: None,
        attempt: 0,
    };
    login_then_read(rng, out, &base, reads, end + 11_000);
}

/// `base`'s login (3 % mistyped first, then right 10 s later), then `reads` authenticated
/// reads from 11 s after it until `until_ms`.
fn login_then_read(
    rng: &mut StdRng,
    out: &mut Vec<Request>,
    base: &Request,
    reads: u32,
    until_ms: u64,
) {
    if rng.random_bool(0.03) {
        out.push(Request {
            kind: Kind::BadLogin,
            ..base.clone()
        });
        out.push(Request {
            at_ms: base.at_ms + 10_000,
            ..base.clone()
        });
    } else {
        out.push(base.clone());
    }
    for _ in 0..reads {
        out.push(Request {
            at_ms: rng.random_range(base.at_ms + 11_000..until_ms),
            kind: Kind::Read,
            ..base.clone()
        });
    }
}

/// Half of `size.users` honest users at home (`198.18.x.y`), each with a login and 5 reads;
/// they logged in from home half a day ago, but 1 in `new_every` (if any), who signs in for
/// the first time.
fn home_users(
    rng: &mut StdRng,
    requests: &mut Vec<Request>,
    history: &mut Vec<Value>,
    size: Size,
    new_every: Option<u32>,
) {
    for user in 0..size.users / 2 {
        let ip = format!("198.18.{}.{}", user / 250, user % 250 + 1);
        if new_every.is_none_or(|every| user % every != 0) {
            history.push(json!({"event_id": format!("home-history-{user}"),
                                "type": "login_success", "account": format!("user{user}"),
                                "ip": ip, "ago_s": 43_200}));
        }
        honest_user(rng, requests, user, ip, None, size, 5);
    }
}

/// Attempt `n`'s address in a proxy pool spread over many networks: a new /24 each, over 150
/// /8s, host `host`.
fn pool_address(n: u64, host: u8) -> String {
    format!(
        "{}.{}.{}.{host}",
        20 + n % 150,
        n / 150 % 256,
        n / 38_400 % 256
    )
}

/// One attacker's logins with wrong passwords: `per_s` a second from `from_s` on, each
/// from the address, account and device `pick` gives for attempt n.
fn attacker(
    out: &mut Vec<Request>,
    size: Size,
    from_s: u64,
    per_s: u64,
    mut pick: impl FnMut(u64) -> (String, String, Option<String>),
) {
    let every_ms = 1000 / per_s.max(1);
    let mut at = from_s * 1000;
    let mut n = 0;
    while at < size.duration_s * 1000 {
        let (ip, account, device) = pick(n);
        out.push(Request {
            at_ms: at,
            side: Side::Attacker,
            user: 0,
            kind: Kind::BadLogin,
            account: Some(account),
            ip,
            device,
            recipient: None,
            retry: None,
            attempt: 0,
        });
        n += 1;
        at += every_ms;
    }
}

/// Logins of `n` distinct accounts from `ip` (history: the address seen before).
fn seen_before(name: &str, ip: &str, n: u32) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"event_id": format!("{name}-history-{i}"), "type": "login_success",
                   "account": format!("regular{i}"), "ip": ip,
                   "device_id": format!("regular-phone{i}")})
        })
        .collect()
}

/// 1,000 users behind one carrier-NAT IPv4 (each with its own device id, seen before as a
/// busy address), and two attackers behind it guessing one account each (one sends a device
/// id, one does not).
pub fn carrier_nat(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(1);
    let nat = "198.51.100.10";
    let mut requests = Vec::new();
    for user in 0..size.users {
        let device = Some(format!("nat-phone{user}"));
        honest_user(
            &mut rng,
            &mut requests,
            user,
            nat.to_owned(),
            device,
            size,
            10,
        );
    }
    attacker(&mut requests, size, 5, 1, |_| {
        (
            nat.to_owned(),
            "victim-a".to_owned(),
            Some("evil-phone".to_owned()),
        )
    });
    attacker(&mut requests, size, 5, 1, |_| {
        (nat.to_owned(), "victim-b".to_owned(), None)
    });
    Scenario {
        name: "carrier_nat",
        what: "users behind one carrier-NAT IPv4 + 2 attackers behind it, 1 guess/s each",
        requests,
        history: seen_before("carrier_nat", nat, 30),
        data: false,
    }
}

/// Households on their own IPv6 /64 (three users and devices each, addresses rotating in
/// the /64), one member of one household guessing an account, rotating its address.
pub fn ipv6_households(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(2);
    let mut requests = Vec::new();
    let households = size.users / 3;
    for user in 0..households * 3 {
        let home = user / 3;
        let ip = format!(
            "2001:db8:{:x}:{:x}::{:x}",
            home / 256,
            home % 256,
            user % 3 + 1
        );
        let device = Some(format!("home-phone{user}"));
        honest_user(&mut rng, &mut requests, user, ip, device, size, 10);
    }
    attacker(&mut requests, size, 5, 1, |n| {
        (
            format!("2001:db8:0:0:{:x}::1", n % 65536),
            "victim-c".to_owned(),
            None,
        )
    });
    Scenario {
        name: "ipv6_households",
        what: "households of 3 on their own IPv6 /64; one member guesses an account, rotating addresses in the /64",
        requests,
        history: Vec::new(),
        data: false,
    }
}

/// Credential stuffing from a residential proxy pool: one attempt per address, each on
/// another account of a leaked list, 10 a second, from addresses of one consumer ISP's ASN;
/// honest users of other networks log in meanwhile.
pub fn credential_stuffing(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(3);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    for user in 0..size.users / 2 {
        // Half are customers of the same ISP, at home where all but one in ten logged in
        // before (the tenth is new: the ISP's block refuses it).
        let ip = if user % 2 == 0 {
            let ip = format!("1.150.{}.{}", user / 250, user % 250 + 1);
            if user % 20 != 0 {
                // Within the hour (of the policy's time: 2 minutes of the scenario's clock).
                history.push(json!({"event_id": format!("isp-history-{user}"),
                                    "type": "login_success", "account": format!("user{user}"),
                                    "ip": ip, "ago_s": 120}));
            }
            ip
        } else {
            // Customers of other networks, who logged in from home half a day ago (of the
            // scenario's clock; 1 in 20 for the first time now).
            let ip = format!("203.0.{}.{}", 113 + user / 250 % 2, user % 250 + 1);
            if user % 40 != 1 {
                history.push(json!({"event_id": format!("home-history-{user}"),
                                    "type": "login_success", "account": format!("user{user}"),
                                    "ip": ip, "ago_s": 43_200}));
            }
            ip
        };
        honest_user(&mut rng, &mut requests, user, ip, None, size, 5);
    }
    attacker(&mut requests, size, 5, 10, |n| {
        // AS1221 (1.128.0.0/11 in the ASN test database): a new address each attempt.
        (
            format!(
                "1.{}.{}.{}",
                128 + n / 65_536 % 32,
                n / 256 % 256,
                n % 254 + 1
            ),
            format!("leaked{n}"),
            None,
        )
    });
    Scenario {
        name: "credential_stuffing",
        what: "a residential proxy pool in one ISP's ASN, 1 attempt per address on a leaked account list, 10/s; half the honest users are that ISP's customers, 1 in 10 of them new (1 in 20 of the others)",
        requests,
        history,
        data: true,
    }
}

/// Credential stuffing spread over many networks: one attempt per address, each in another
/// network of no autonomous system the attack stays in, on another account of a leaked list,
/// 10 a second; honest users log in from home meanwhile, 1 in 20 of them for the first time.
pub fn distributed_stuffing(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(8);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    home_users(&mut rng, &mut requests, &mut history, size, Some(20));
    attacker(&mut requests, size, 5, 10, |n| {
        (pool_address(n, 9), format!("leaked{n}"), None)
    });
    Scenario {
        name: "distributed_stuffing",
        what: "a proxy pool spread over many networks, 1 attempt per address (a new /24 each) on a leaked account list, 10/s; 1 in 20 honest users logs in for the first time",
        requests,
        history,
        data: false,
    }
}

/// Stuffing kept just under the guard's trigger: 80 attempts every 5 minutes (the guard
/// needs 100), each from a new /24 on another leaked account, for the whole run.
pub fn slow_stuffing(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(14);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    home_users(&mut rng, &mut requests, &mut history, size, None);
    // 80 in 300 s: one every 3.75 s.
    let mut at = 5_000;
    let mut n = 0u64;
    while at < size.duration_s * 1000 {
        requests.push(Request {
            at_ms: at,
            side: Side::Attacker,
            user: 0,
            kind: Kind::BadLogin,
            account: Some(format!("leaked{n}")),
            ip: pool_address(n, 9),
            device: None,
            recipient: None,
            retry: None,
            attempt: 0,
        });
        n += 1;
        at += 3_750;
    }
    Scenario {
        name: "slow_stuffing",
        what: "stuffing kept under the guard's trigger: 80 attempts per 5 min, each from a new /24 on another leaked account",
        requests,
        history,
        data: false,
    }
}

/// Stuffing over many networks that sends a new device id with every attempt (as a bot
/// rotating app installs and user agents does), 10 a second.
pub fn rotating_devices(size: Size) -> Scenario {
    let mut scenario = distributed_stuffing(size);
    for (n, request) in scenario
        .requests
        .iter_mut()
        .filter(|r| r.side == Side::Attacker)
        .enumerate()
    {
        request.device = Some(format!("install-{n}"));
    }
    scenario.name = "rotating_devices";
    scenario.what = "distributed_stuffing with a new device id on every attempt (rotating installs and user agents), 10/s";
    scenario
}

/// [`diluted_stuffing_after`] 20 quiet minutes (four of the guard's windows at the default
/// policy's 5 minutes: it learns the service's normal from them), then five of attack.
pub fn diluted_stuffing(size: Size) -> Scenario {
    diluted_stuffing_after(size, 1_200)
}

/// Stuffing diluted with logins of the attacker's own accounts: after `quiet_s` quiet
/// seconds, for `size.duration_s` more, 10 attempts a second on leaked accounts and 12
/// right passwords a second on 50 accounts it owns, each from a new /24, so failures stay
/// well under half of all logins.
pub fn diluted_stuffing_after(size: Size, quiet_s: u64) -> Scenario {
    let mut rng = StdRng::seed_from_u64(12);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    home_users(&mut rng, &mut requests, &mut history, size, None);
    let from_s = quiet_s;
    let size = Size {
        duration_s: quiet_s + size.duration_s,
        ..size
    };
    attacker(&mut requests, size, from_s, 10, |n| {
        (pool_address(n, 9), format!("leaked{n}"), None)
    });
    let mut at = from_s * 1000;
    let mut n = 0u64;
    while at < size.duration_s * 1000 {
        requests.push(Request {
            at_ms: at,
            side: Side::Attacker,
            user: 0,
            kind: Kind::Login,
            account: Some(format!("owned{}", n % 50)),
            // Apart from the failing attempts' /24s (their third octet is below 128 in a run).
            ip: pool_address(n + 128 * 38_400, 77),
            device: None,
            recipient: None,
            retry: None,
            attempt: 0,
        });
        n += 1;
        at += 1000 / 12;
    }
    Scenario {
        name: "diluted_stuffing",
        what: "stuffing over many networks, 10/s, diluted with 12 logins/s of 50 accounts the attacker owns (failures 45 % of logins) after 20 quiet minutes",
        requests,
        history,
        data: false,
    }
}

/// Every user signed out by an app update logs in again within a minute, from home on the
/// phone they used before; 3 % mistype first. No attack: nothing may be challenged.
pub fn forced_relogin(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(13);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    for user in 0..size.users {
        let ip = format!("198.18.{}.{}", user / 250, user % 250 + 1);
        let device = format!("phone{user}");
        history.push(json!({"event_id": format!("relogin-history-{user}"),
                            "type": "login_success", "account": format!("user{user}"),
                            "ip": ip, "device_id": device, "ago_s": 80_000}));
        let base = Request {
            at_ms: 30_000 + rng.random_range(0..60_000),
            side: Side::Honest,
            user,
            kind: Kind::Login,
            account: Some(format!("user{user}")),
            ip,
            device: Some(device),
            recipient: None,
            retry: None,
            attempt: 0,
        };
        login_then_read(&mut rng, &mut requests, &base, 3, size.duration_s * 1000);
    }
    Scenario {
        name: "forced_relogin",
        what: "an app update signs every user out: all log in again within a minute from home on their phones, 3 % mistyping first",
        requests,
        history,
        data: false,
    }
}

/// Password spraying across one ASN: 10 addresses in 10 networks of one ASN, each trying a
/// common password on 19 accounts (under the per-address threshold).
pub fn asn_spraying(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(4);
    let mut requests = Vec::new();
    for user in 0..size.users / 2 {
        let ip = format!("198.18.{}.{}", user / 250, user % 250 + 1);
        honest_user(&mut rng, &mut requests, user, ip, None, size, 5);
    }
    let span = size.duration_s.saturating_sub(10).max(1);
    for source in 0..10u64 {
        for target in 0..19u64 {
            requests.push(Request {
                at_ms: 5_000 + (target * 10 + source) * span * 1000 / 190,
                side: Side::Attacker,
                user: 0,
                kind: Kind::BadLogin,
                account: Some(format!("sprayed{source}-{target}")),
                ip: format!("1.{}.{}.7", 130 + source, source * 3),
                device: None,
                recipient: None,
                retry: None,
                attempt: 0,
            });
        }
    }
    Scenario {
        name: "asn_spraying",
        what: "password spraying from 10 addresses in 10 networks of one ASN, 19 accounts each",
        requests,
        history: Vec::new(),
        data: true,
    }
}

/// A scraper on one datacenter address hammering search (an expensive class), 20 a
/// second, while honest users search from home.
pub fn datacenter_scraper(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(5);
    let mut requests = Vec::new();
    for user in 0..size.users / 2 {
        let ip = format!("203.0.113.{}", user % 250 + 1);
        let at = rng.random_range(0..size.duration_s * 1000);
        for k in 0..3 {
            requests.push(Request {
                at_ms: at + k * 20_000,
                side: Side::Honest,
                user,
                kind: Kind::Search,
                account: None,
                ip: ip.clone(),
                device: None,
                recipient: None,
                retry: None,
                attempt: 0,
            });
        }
    }
    let every_ms = 50;
    let mut at = 5_000;
    while at < size.duration_s * 1000 {
        requests.push(Request {
            at_ms: at,
            side: Side::Attacker,
            user: 0,
            kind: Kind::Search,
            account: None,
            // In 1.12.0.0/14, a datacenter range of the shipped lists.
            ip: "1.12.0.5".to_owned(),
            device: None,
            recipient: None,
            retry: None,
            attempt: 0,
        });
        at += every_ms;
    }
    Scenario {
        name: "datacenter_scraper",
        what: "one datacenter address scraping search at 20/s; honest users search from home",
        requests,
        history: Vec::new(),
        data: true,
    }
}

/// Tor exit nodes shipped in `data/ranges/tor/` (the 2024-02 list).
const TOR_EXITS: [&str; 10] = [
    "101.99.92.179",
    "101.99.92.182",
    "101.99.92.194",
    "101.99.92.198",
    "102.130.113.9",
    "102.130.127.117",
    "103.106.3.94",
    "103.109.101.105",
    "103.126.161.54",
    "103.129.222.46",
];

/// A brute force on one account through Tor, a new exit every attempt, 2 a second.
pub fn tor_brute_force(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(6);
    let mut requests = Vec::new();
    for user in 0..size.users / 2 {
        let ip = format!("203.0.113.{}", user % 250 + 1);
        honest_user(&mut rng, &mut requests, user, ip, None, size, 5);
    }
    attacker(&mut requests, size, 5, 2, |n| {
        (
            TOR_EXITS[(n % 10) as usize].to_owned(),
            "victim-d".to_owned(),
            None,
        )
    });
    Scenario {
        name: "tor_brute_force",
        what: "one account guessed through 10 Tor exits in turn, 2/s",
        requests,
        history: Vec::new(),
        data: true,
    }
}

/// A stolen device id replayed from another address against many accounts, 1 a second,
/// while the device's owner goes on using the app from home.
pub fn stolen_device(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(7);
    let mut requests = Vec::new();
    for user in 0..size.users / 2 {
        let ip = format!("203.0.113.{}", user % 250 + 1);
        let device = Some(format!("phone{user}"));
        honest_user(&mut rng, &mut requests, user, ip, device, size, 10);
    }
    attacker(&mut requests, size, 5, 1, |n| {
        (
            "192.0.2.66".to_owned(),
            format!("stuffed{n}"),
            Some("phone0".to_owned()),
        )
    });
    Scenario {
        name: "stolen_device",
        what: "a stolen device id replayed from another address on many accounts, 1/s; its owner keeps using the app",
        requests,
        history: Vec::new(),
        data: false,
    }
}

/// A flash crowd: a push notification at 60 s brings every user in within 20 s (a login and
/// 10 reads each, from their own addresses), 10 times the normal traffic.
pub fn flash_crowd(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(8);
    let mut requests = Vec::new();
    for user in 0..size.users * 2 {
        let ip = format!("10.{}.{}.{}", user / 65_536, user / 256 % 256, user % 256);
        let login = Request {
            at_ms: 60_000 + rng.random_range(0..20_000),
            side: Side::Honest,
            user,
            kind: Kind::Login,
            account: Some(format!("fan{user}")),
            ip,
            device: Some(format!("fan-phone{user}")),
            recipient: None,
            retry: None,
            attempt: 0,
        };
        let reads: Vec<u64> = (0..10)
            .map(|k| 1_000 + k * rng.random_range(500..3_000))
            .collect();
        login_then_reads(&mut requests, login, &reads);
    }
    Scenario {
        name: "flash_crowd",
        what: "a push notification: every user logs in and reads 10 times within 20 s",
        requests,
        history: Vec::new(),
        data: false,
    }
}

/// A push notification reaches a carrier's customers behind one address: every user logs in
/// within 5 s of 60 s with the phone they signed in with there before, then reads. More
/// logins than the address-wide ceiling holds; none of them from a stranger.
pub fn carrier_flash_crowd(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(9);
    let nat = "198.51.100.20";
    let mut requests = Vec::new();
    let mut history = Vec::new();
    for user in 0..size.users {
        let account = format!("customer{user}");
        let device = format!("customer-phone{user}");
        history.push(
            json!({"event_id": format!("crowd-history-{user}"), "type": "login_success",
                            "account": account, "ip": nat, "device_id": device}),
        );
        let login = Request {
            at_ms: 60_000 + rng.random_range(0..5_000),
            side: Side::Honest,
            user,
            kind: Kind::Login,
            account: Some(account),
            ip: nat.to_owned(),
            device: Some(device),
            recipient: None,
            retry: None,
            attempt: 0,
        };
        let reads: Vec<u64> = (0..3).map(|k| 1_000 + k * 2_000).collect();
        login_then_reads(&mut requests, login, &reads);
    }
    Scenario {
        name: "carrier_flash_crowd",
        what: "a push notification behind one carrier NAT: every customer logs in within 5 s with the phone it used there before",
        requests,
        history,
        data: false,
    }
}

/// Queued reads each app sends at once when the service is back.
const STORM_READS: u32 = 600;

/// The service comes back from an outage and every app at once signs in again (from the phone
/// and home address its account knows; 3 % mistype first) and sends the reads it queued: more
/// than a user's read budget holds. Half the apps retry a 429 as docs/CLIENTS.md asks, half
/// every 250 ms whatever it says.
pub fn retry_storm(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(17);
    let mut requests = Vec::new();
    let mut history = Vec::new();
    // A tenth of the users: each sends hundreds of requests.
    for user in 0..(size.users / 10).max(10) {
        let account = format!("returning{user}");
        let device = format!("returning-phone{user}");
        let ip = format!("198.18.{}.{}", 100 + user / 250, user % 250 + 1);
        history.push(
            json!({"event_id": format!("storm-history-{user}"), "type": "login_success",
                            "account": account, "ip": ip, "device_id": device, "ago_s": 43_200}),
        );
        let back_at = 30_000 + rng.random_range(0..3_000);
        let login = Request {
            at_ms: back_at,
            side: Side::Honest,
            user,
            kind: Kind::Login,
            account: Some(account),
            ip,
            device: Some(device),
            recipient: None,
            retry: Some(if user % 2 == 0 {
                Retry::Honours
            } else {
                Retry::Ignores
            }),
            attempt: 0,
        };
        if rng.random_bool(0.03) {
            requests.push(Request {
                kind: Kind::BadLogin,
                retry: None,
                ..login.clone()
            });
        }
        for k in 0..STORM_READS {
            requests.push(Request {
                at_ms: back_at + 500 + u64::from(k),
                kind: Kind::Read,
                ..login.clone()
            });
        }
        requests.push(Request {
            at_ms: back_at + 200,
            ..login
        });
    }
    Scenario {
        name: "retry_storm",
        what: "back from an outage, every app signs in again and sends the reads it queued, over its budget; half retry as asked, half every 250 ms",
        requests,
        history,
        data: false,
    }
}

/// Honest users asking for a sign-in code by SMS to their own UK mobile, each from home at
/// a random time (1 in 20 asks again 30 s later: the first code did not arrive).
fn otp_users(rng: &mut StdRng, requests: &mut Vec<Request>, size: Size) {
    for user in 0..size.users {
        let at_ms = rng.random_range(0..size.duration_s * 1000);
        let mobile = format!(
            "+44 7{} {:06}",
            rng.random_range(100..1000),
            rng.random_range(0..1_000_000)
        );
        let request = Request {
            at_ms,
            side: Side::Honest,
            user,
            kind: Kind::OtpSend,
            account: Some(format!("user{user}")),
            ip: format!("198.18.{}.{}", user / 250, user % 250 + 1),
            device: None,
            recipient: Some(mobile),
            retry: None,
            attempt: 0,
        };
        if rng.random_bool(0.05) {
            requests.push(Request {
                at_ms: at_ms + 30_000,
                ..request.clone()
            });
        }
        requests.push(request);
    }
}

/// One attacker's OTP requests: `per_s` a second from 10 s on, each from a fresh account at a
/// fresh address of a proxy pool, to the number `recipient` gives for attempt n.
fn otp_attacker(
    requests: &mut Vec<Request>,
    size: Size,
    per_s: u64,
    recipient: impl Fn(u64) -> String,
) {
    let first = requests.len();
    attacker(requests, size, 10, per_s, |n| {
        (pool_address(n, 7), format!("fresh{n}"), None)
    });
    for (n, request) in (0u64..).zip(&mut requests[first..]) {
        request.kind = Kind::OtpSend;
        request.recipient = Some(recipient(n));
    }
}

/// SMS pumping: a bot asks for codes to 200 numbers of one UK premium-rate range (the
/// fraudster shares their revenue), 2 a second from fresh accounts at rotating addresses;
/// honest users of the same country ask for codes to their own mobiles.
pub fn sms_pumping(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(21);
    let mut requests = Vec::new();
    otp_users(&mut rng, &mut requests, size);
    otp_attacker(&mut requests, size, 2, |n| {
        format!("+44 909 876 {:04}", 5000 + n % 200)
    });
    Scenario {
        name: "sms_pumping",
        what: "OTPs to 200 numbers of one premium-rate range, 2 a second from fresh accounts at rotating addresses",
        requests,
        history: Vec::new(),
        data: false,
    }
}

/// One person's phone flooded with codes: a bot asks for a code to the same number from a
/// new account and address every 2 s; honest users ask for codes to their own mobiles.
pub fn otp_flood(size: Size) -> Scenario {
    let mut rng = StdRng::seed_from_u64(22);
    let mut requests = Vec::new();
    otp_users(&mut rng, &mut requests, size);
    let spellings = ["+44 7700 900123", "tel:+44-7700-900-123", "+447700900123"];
    otp_attacker(&mut requests, size, 1, |n| {
        spellings[n as usize % spellings.len()].to_owned()
    });
    requests.retain(|r| r.side == Side::Honest || r.at_ms % 2_000 == 0);
    Scenario {
        name: "otp_flood",
        what: "one person's phone sent codes from a new account and address every 2 s, the number spelled three ways",
        requests,
        history: Vec::new(),
        data: false,
    }
}

/// `login`, then a read `after` each of the given milliseconds past it.
fn login_then_reads(requests: &mut Vec<Request>, login: Request, after: &[u64]) {
    for &ms in after {
        requests.push(Request {
            at_ms: login.at_ms + ms,
            kind: Kind::Read,
            ..login.clone()
        });
    }
    requests.push(login);
}

/// Every scenario at `size`.
pub fn all(size: Size) -> Vec<Scenario> {
    vec![
        carrier_nat(size),
        ipv6_households(size),
        credential_stuffing(size),
        distributed_stuffing(size),
        diluted_stuffing(size),
        slow_stuffing(size),
        rotating_devices(size),
        asn_spraying(size),
        datacenter_scraper(size),
        tor_brute_force(size),
        stolen_device(size),
        flash_crowd(size),
        carrier_flash_crowd(size),
        sms_pumping(size),
        otp_flood(size),
        forced_relogin(size),
        retry_storm(size),
    ]
}
