//! Scoring: where signals meet. Factors with reasons in, one multiplier per key and class out,
//! published where the token-bucket script reads it.
//!
//! Read [`factor::combine`] first (pure: the combination policy), then [`Engine::apply`].
//! Two ways in: *push* signals (lockouts, spraying, attestation verdicts, anomalies, repeat
//! offenders) store factors with [`Engine::assert`] / [`Engine::retract`]; *pull* signals
//! (reputation, manual lists, attestation's default) implement [`Signal`] and are asked
//! whenever a subject is scored, from in-process state. A subject with stored factors gets
//! its combined multiplier per class published ([`store`]); every other subject is judged by
//! the pull signals alone, computed per check and passed to the bucket script as its default
//! ([`Engine`] implements [`crate::limiter::DefaultMultipliers`]). Scoring never imports a
//! concrete signal: `app` registers them.

pub mod alerts;
mod baseline;
mod explain; // reading and explaining multipliers, the limiter's defaults
pub mod factor;
pub mod guard; // the service-wide login guard
mod observe; // baselines, anomalies, repeat offenders
mod offenders;
pub mod overrides; // an operator's multiplier for one subject, as a factor
mod publish; // stored factors in, published multipliers out
pub mod shared; // addresses many honest users share
pub mod store;
mod stream; // the decision stream

pub use observe::minute_of;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use arc_swap::ArcSwap;

pub use alerts::{Alert, Alerts};
pub use baseline::Anomaly;
pub use explain::Explanations;
pub use factor::{Combined, Contribution, Effect, Factor, Policy, combine, combine_multiplier};
pub use guard::LoginGuard;
pub use shared::{NetworkBlocks, SharedIps};
pub use store::{Change, DecisionChange};

use crate::clock::Clock;
use crate::config::Settings;
use crate::limiter::{DefaultMultipliers, Defaults, LimitRequest};
use crate::model::SubjectKey;
use crate::store::{Hot, Keys, Stores};
use baseline::Baselines;
use explain::Cached;
use offenders::SpaceSaving;
use store::FactorStore;

/// Stored factors read for explanations are reused for at most this long (`/v1/multipliers`
/// L1); also bounded by `limits.l1_ttl_ms`.
const MAX_L1_TTL_US: u64 = 1_000_000;
/// Most subjects held in that L1.
const L1_CAPACITY: usize = 100_000;
/// Most subjects in a decision snapshot.
pub const SNAPSHOT_LIMIT: usize = 10_000;

/// A subject as pull signals see it.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Its key.
    pub key: &'a SubjectKey,
    /// The client address, for `ip:` subjects.
    pub ip: Option<IpAddr>,
}

/// A pull signal: factors derived on demand from in-process state (it must be cheap: it runs
/// for every limit check of a subject that has nothing published).
pub trait Signal: Send + Sync + fmt::Debug {
    /// Stable name, as in [`Factor::signal`].
    fn name(&self) -> &'static str;
    /// The factors this signal gives `subject` at `now_ms`; `stored` are the subject's
    /// stored factors (a signal may step back when a push signal already spoke).
    fn factors(&self, subject: &Subject<'_>, stored: &[Factor], now_ms: i64) -> Vec<Factor>;
    /// [`Signal::factors`] with nothing stored: the default multiplier's part, asked on
    /// every limit check. A signal that gives every subject of a kind the same factors
    /// lends them instead of building them per check.
    fn defaults(&self, subject: &Subject<'_>, now_ms: i64) -> Cow<'_, [Factor]> {
        Cow::Owned(self.factors(subject, &[], now_ms))
    }
}

/// Why scoring failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

/// One key's multiplier for one class, with every contribution.
#[derive(Debug, Clone)]
pub struct KeyMultiplier {
    /// The key.
    pub key: SubjectKey,
    /// Its combination.
    pub combined: Arc<Combined>,
}

/// A key that keeps hitting 429.
#[derive(Debug, Clone, PartialEq)]
pub struct Offender {
    /// The key.
    pub key: String,
    /// 429s in the window (over every instance).
    pub count: u64,
    /// Unix ms until which it is tightened as a repeat offender, if it is.
    pub tightened_until_ms: Option<i64>,
}

/// Called after every publish (wired to the limiter's L1 reset).
struct Hook(Box<dyn Fn() + Send + Sync>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hook")
    }
}

/// The scoring engine of one instance.
#[derive(Debug)]
pub struct Engine {
    policy: Policy,
    classes: Vec<String>,
    public_classes: Vec<String>,
    settings: crate::config::ScoringSettings,
    keys: Keys,
    hot: Hot,
    /// Where stored factors are kept for good ([`store::durable`]).
    durable: crate::store::Durable,
    store: FactorStore,
    clock: Arc<dyn Clock>,
    signals: ArcSwap<Vec<Arc<dyn Signal>>>,
    on_publish: OnceLock<Hook>,
    l1_ttl_us: u64,
    /// Subject → what explanations read of it, each for one L1 TTL.
    l1: quick_cache::sync::Cache<String, Arc<Cached>>,
    /// See [`Engine::generation`].
    generation: std::sync::atomic::AtomicU64,
    /// Unix ms when the hot store's current epoch began (its decision stream with it).
    stream_since_ms: std::sync::atomic::AtomicI64,
    baselines: Baselines,
    key_hasher: foldhash::fast::RandomState,
    sketch: Mutex<SpaceSaving>,
    /// In-process shared offender totals (embedded mode): minute → key → count.
    offender_totals: Mutex<BTreeMap<i64, HashMap<String, u64>>>,
    alerts: Alerts,
    shared: SharedIps,
    networks: NetworkBlocks,
    suspects: NetworkBlocks,
    guard: LoginGuard,
    asn_lookup: Arc<dyn AsnLookup>,
}

/// The autonomous system of an address (the socket reputation's ASN databases plug into;
/// `app` wires it).
pub trait AsnLookup: Send + Sync + fmt::Debug {
    /// The ASN of `ip`, if known.
    fn asn(&self, ip: IpAddr) -> Option<u32>;
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Engine {
    /// The engine of one instance; register the pull signals with [`Engine::register`].
    pub fn new(
        settings: &Settings,
        stores: &Stores,
        clock: Arc<dyn Clock>,
        asn_lookup: Arc<dyn AsnLookup>,
    ) -> Self {
        let scoring = settings.scoring.clone();
        let classes: Vec<String> = settings.limits.classes.keys().cloned().collect();
        Self {
            policy: Policy::from_settings(&scoring, classes.iter().map(String::as_str)),
            public_classes: scoring.public_classes.clone(),
            classes,
            keys: stores.keys.clone(),
            hot: stores.hot.clone(),
            durable: stores.durable.clone(),
            store: store::open(&stores.hot),
            signals: ArcSwap::from_pointee(Vec::new()),
            on_publish: OnceLock::new(),
            l1_ttl_us: (settings.limits.l1_ttl_ms * 1000).min(MAX_L1_TTL_US),
            l1: quick_cache::sync::Cache::new(L1_CAPACITY),
            generation: std::sync::atomic::AtomicU64::new(0),
            stream_since_ms: std::sync::atomic::AtomicI64::new(0),
            baselines: Baselines::new(&scoring.anomaly),
            key_hasher: foldhash::fast::RandomState::default(),
            sketch: Mutex::new(SpaceSaving::new(scoring.offenders.sketch_capacity)),
            offender_totals: Mutex::new(BTreeMap::new()),
            alerts: Alerts::new(
                stores.durable.clone(),
                stores.hot.clone(),
                stores.keys.clone(),
                clock.clone(),
                scoring.webhooks.clone(),
                crate::telemetry::privacy::Pseudonyms::new(&settings.privacy),
            ),
            shared: SharedIps::new(
                settings.limits.shared_ip.clone(),
                stores.hot.clone(),
                &stores.keys,
                clock.clone(),
                crate::telemetry::privacy::Pseudonyms::new(&settings.privacy),
            ),
            networks: NetworkBlocks::new(stores.hot.clone(), &stores.keys, clock.clone()),
            suspects: NetworkBlocks::named(
                "suspect_networks",
                stores.hot.clone(),
                &stores.keys,
                clock.clone(),
            ),
            guard: LoginGuard::new(
                settings.lockout.stuffing.clone(),
                stores.hot.clone(),
                &stores.keys,
                clock.clone(),
            ),
            asn_lookup,
            settings: scoring,
            clock,
        }
    }

    /// How accounts, devices and addresses are named in logs and webhooks.
    pub fn pseudonyms(&self) -> &crate::telemetry::privacy::Pseudonyms {
        self.alerts.pseudonyms()
    }

    /// Installs the pull signals (replacing any before).
    pub fn register(&self, signals: Vec<Arc<dyn Signal>>) {
        self.signals.store(Arc::new(signals));
    }

    /// Runs `hook` after every publish (once; later calls are ignored).
    pub fn on_publish(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_publish.set(Hook(Box::new(hook)));
    }

    /// Endpoint classes multipliers are published for.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Classes reachable without an account (`scoring.public_classes`).
    pub fn public_classes(&self) -> &[String] {
        &self.public_classes
    }

    /// The combination policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The alerts service.
    pub fn alerts(&self) -> &Alerts {
        &self.alerts
    }

    /// The shared addresses (carrier NAT, company proxies).
    pub fn shared_ips(&self) -> &SharedIps {
        &self.shared
    }

    /// Networks and ASNs blocked on `auth` for spraying from rotating addresses.
    pub fn network_blocks(&self) -> &NetworkBlocks {
        &self.networks
    }

    /// Networks and ASNs suspected of spraying from rotating addresses: a few accounts
    /// failed from them, more than logged in (`lockout.suspect_accounts`); logins from
    /// contexts their accounts do not know get a login challenge there.
    pub fn network_suspects(&self) -> &NetworkBlocks {
        &self.suspects
    }

    /// The service-wide login guard (stuffing spread over many networks).
    pub fn login_guard(&self) -> &LoginGuard {
        &self.guard
    }

    /// Why a login from `ip` by a context its account does not know is stopped now, as the
    /// limiter words it: `network_blocked` (its network or ASN is blocked for spraying),
    /// `login_guard` (the service-wide guard is on), `network_spraying` (its network or ASN
    /// is suspected: a known context passes there freely), or None.
    pub fn logins_stopped(&self, ip: &crate::model::ClientIp) -> Option<&'static str> {
        if self.networks.is_blocked(ip, || self.asn_of(ip.addr())) {
            Some("network_blocked")
        } else if self.guard.is_active() {
            Some("login_guard")
        } else if self.suspects.is_blocked(ip, || self.asn_of(ip.addr())) {
            Some("network_spraying")
        } else {
            None
        }
    }

    /// The ASN of `ip`, when the lookup knows it.
    pub fn asn_of(&self, ip: IpAddr) -> Option<u32> {
        self.asn_lookup.asn(ip)
    }

    /// Keys tracked by the anomaly baselines, the most they can hold, and their bytes (fixed
    /// at start).
    pub fn baseline_keys(&self) -> (usize, usize, usize) {
        (
            self.baselines.tracked(),
            self.baselines.capacity(),
            self.baselines.bytes(),
        )
    }

    /// Counts up at every publish of this instance and every change of a pull signal's
    /// data: an answer made under an older generation may be out of date.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// How long an explanation read from this engine stays fresh enough to reuse, µs.
    pub fn l1_ttl_us(&self) -> u64 {
        self.l1_ttl_us
    }

    /// Moves [`Engine::generation`] on.
    fn next_generation(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl DefaultMultipliers for Engine {
    fn defaults(&self, class: &str, request: &LimitRequest) -> Defaults {
        let now = self.clock.now_ms();
        let ip = SubjectKey::ip(&request.ip);
        let of = |key: &SubjectKey, ip: Option<IpAddr>| {
            self.default_for(&Subject { key, ip }, class, now)
        };
        Defaults {
            ip: of(&ip, Some(request.ip.addr())),
            user: request.user.as_ref().map_or(1.0, |u| of(u, None)),
            device: request.device.as_ref().map_or(1.0, |d| of(d, None)),
            shared_ip: self.shared.is_shared(&request.ip),
            ip_blocked: class == "auth"
                && self
                    .networks
                    .is_blocked(&request.ip, || self.asn_of(request.ip.addr())),
            login_guard: class == "auth" && request.user.is_some() && self.guard.is_active(),
            login_suspect: class == "auth"
                && request.user.is_some()
                && self
                    .suspects
                    .is_blocked(&request.ip, || self.asn_of(request.ip.addr())),
        }
    }
}
