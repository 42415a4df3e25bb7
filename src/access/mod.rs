//! API tokens and roles: issuing, hashing, authenticating, revoking.
//!
//! A token is `pal_` + 64 hex characters (256 random bits). Only its SHA-256 is stored: with
//! that much entropy a slow password hash adds nothing, and a fast one keeps authentication
//! off the request's critical path. Read [`Access::authenticate`] first.
//!
//! Verdicts are cached: a known token is answered from memory and refreshed in the background
//! (stale-while-revalidate), so no limit check waits for the database, and a database outage
//! does not stop tokens that were in use ([`MAX_STALE`]).

pub mod identity;
mod store;

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::audit::Actor;
use crate::clock::Clock;
use crate::store::{Durable, Hot, Keys, Stores};

/// The id under which the configured bootstrap token acts.
pub const BOOTSTRAP_TOKEN_ID: &str = "bootstrap";

/// How long an authentication result is used before it is refreshed (in the background for
/// a valid token). A revocation on another instance takes effect within about this time.
pub const CACHE_TTL: Duration = Duration::from_secs(1);

/// How long a valid token keeps working from the cache while its refresh fails (the
/// database is unreachable). A revocation still reaches every instance through the hot store
/// while Redis is up.
pub const MAX_STALE: Duration = Duration::from_secs(15 * 60);

/// Most cached authentication results. The cache (`quick_cache`, S3-FIFO) admits a new
/// verdict to a small probation queue and keeps what is asked again, so a flood of random
/// tokens, each presented once, evicts itself and not the tokens in use.
const CACHE_CAPACITY: usize = 10_000;

/// The role of an API token (DESIGN.md "Who calls it").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The auth service: posts login events, asks for account status, attestations.
    Ingest,
    /// Gateways and limiters: limit checks, multipliers, telemetry, reputation.
    Limiter,
    /// Security analysts: lockouts, alerts, offenders, allow/deny lists.
    Analyst,
    /// Operators: tokens, reload, audit; may call every route.
    Admin,
}

impl Role {
    /// Every role, in the order of DESIGN.md.
    pub const ALL: [Role; 4] = [Role::Ingest, Role::Limiter, Role::Analyst, Role::Admin];

    /// The lowercase name used in JSON and SQL.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ingest => "ingest",
            Role::Limiter => "limiter",
            Role::Analyst => "analyst",
            Role::Admin => "admin",
        }
    }

    /// Parses the lowercase name.
    pub fn parse(value: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == value)
    }

    /// True when a token of this role may call a route that requires `required`.
    pub fn allows(self, required: Role) -> bool {
        self == Role::Admin || self == required
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Token id (shared: a cached caller is cloned on every request).
    pub token_id: Arc<str>,
    /// Token name.
    pub name: Arc<str>,
    /// Token role.
    pub role: Role,
}

impl Caller {
    /// The caller as it appears in the audit log.
    pub fn actor(&self) -> Actor {
        Actor {
            id: self.token_id.to_string(),
            name: self.name.to_string(),
            role: self.role.as_str().to_owned(),
        }
    }
}

/// A token as listed (never with its secret).
#[derive(Debug, Clone, Serialize)]
pub struct TokenInfo {
    /// ULID.
    pub id: String,
    /// Unique among active tokens.
    pub name: String,
    /// Role.
    pub role: Role,
    /// Unix milliseconds.
    pub created_at_ms: i64,
    /// Name of the token that created it (`cli` for `palisade issue-token`).
    pub created_by: String,
    /// Unix milliseconds, if revoked.
    pub revoked_at_ms: Option<i64>,
}

/// A newly issued token: the only time its secret exists outside the caller's hands.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    /// What is stored.
    pub info: TokenInfo,
    /// The bearer token to hand over.
    pub secret: String,
}

/// Why an access operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No active token has this secret.
    #[error("unknown or revoked API token")]
    UnknownToken,
    /// An active token already has this name.
    #[error("an active token named {0:?} already exists")]
    NameTaken(String),
    /// The bootstrap token was presented after an admin token was issued.
    #[error(
        "the bootstrap token was retired when the first admin token was made: use an admin token (lost every one? run palisade issue-token --role admin --name NAME against the database)"
    )]
    BootstrapRetired,
    /// The bootstrap token was presented after `bootstrap_token_expires_at`.
    #[error("the bootstrap token expired (bootstrap_token_expires_at): use an admin token")]
    BootstrapExpired,
    /// The name is empty, too long or has control or invisible characters.
    #[error("token name must be 1-100 printable characters (no control or invisible ones)")]
    InvalidName,
    /// No token has this id.
    #[error("no token with id {0:?}")]
    NotFound(String),
    /// The bootstrap token lives in the settings, not the database.
    #[error("the bootstrap token is configured by PALISADE_BOOTSTRAP_TOKEN; unset it to revoke it")]
    BootstrapNotRevocable,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::Error),
}

type TokenHash = [u8; 32];

/// A cached verdict.
#[derive(Debug)]
struct Verdict {
    /// The caller, or None for an unknown or revoked token.
    caller: Option<Caller>,
    /// When the database last confirmed it ([`Clock::monotonic_us`]).
    checked_us: u64,
    /// No background refresh starts before this (one per token per [`CACHE_TTL`]): the
    /// request that moves it starts the refresh.
    refresh_after_us: std::sync::atomic::AtomicU64,
}

/// Cached verdicts by token hash.
type Cache = Arc<quick_cache::sync::Cache<TokenHash, Arc<Verdict>>>;

/// Issues, authenticates and revokes API tokens.
#[derive(Debug)]
pub struct Access {
    durable: Durable,
    hot: Hot,
    keys: Keys,
    clock: Arc<dyn Clock>,
    bootstrap: Option<Bootstrap>,
    cache: Cache,
}

/// The configured bootstrap token: for the first start only.
#[derive(Debug)]
struct Bootstrap {
    hash: TokenHash,
    /// Unix ms after which it is refused, if configured.
    expires_at_ms: Option<i64>,
    /// An active admin token exists: the bootstrap token is refused from then on.
    retired: std::sync::atomic::AtomicBool,
    /// Unix ms of the last warning about its use (one a minute).
    warned_at_ms: std::sync::atomic::AtomicI64,
}

/// SHA-256 of a token secret.
fn hash(secret: &str) -> TokenHash {
    Sha256::digest(secret.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The caller a token hash belongs to, from the database (within its time bound).
///
/// Constant-time compare of the stored hash: the lookup is by the hash of the presented
/// secret, which an attacker cannot steer towards a stored hash, and the comparison does not
/// reveal how much of a guess was right.
async fn lookup(durable: &Durable, presented: &TokenHash) -> Result<Option<Caller>, Error> {
    let presented = hex(presented);
    let found = store::find_active_by_hash(durable, &presented).await?;
    Ok(found.and_then(|(stored_hash, caller)| {
        bool::from(stored_hash.as_bytes().ct_eq(presented.as_bytes())).then_some(caller)
    }))
}

/// `duration` in microseconds.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn remember(cache: &Cache, key: TokenHash, caller: Option<Caller>, checked_us: u64) {
    cache.insert(
        key,
        Arc::new(Verdict {
            caller,
            checked_us,
            refresh_after_us: std::sync::atomic::AtomicU64::new(
                checked_us.saturating_add(micros(CACHE_TTL)),
            ),
        }),
    );
}

impl Access {
    /// The access service; `bootstrap` is `PALISADE_BOOTSTRAP_TOKEN`, refused after
    /// `bootstrap_expires_at_ms` and once an active admin token exists
    /// ([`Access::refresh_bootstrap`]).
    pub fn new(
        stores: &Stores,
        clock: Arc<dyn Clock>,
        bootstrap: Option<&str>,
        bootstrap_expires_at_ms: Option<i64>,
    ) -> Self {
        Self {
            durable: stores.durable.clone(),
            hot: stores.hot.clone(),
            keys: stores.keys.clone(),
            clock,
            bootstrap: bootstrap.map(|secret| Bootstrap {
                hash: hash(secret),
                expires_at_ms: bootstrap_expires_at_ms,
                retired: std::sync::atomic::AtomicBool::new(false),
                warned_at_ms: std::sync::atomic::AtomicI64::new(i64::MIN),
            }),
            cache: Arc::new(quick_cache::sync::Cache::new(CACHE_CAPACITY)),
        }
    }

    /// Retires the bootstrap token once an admin token was ever issued (run at start and
    /// every few seconds, so a token created on another instance retires it here too). The
    /// durable store decides, so revoking that admin token or restarting never brings the
    /// bootstrap token back: a lost admin is recovered with `palisade issue-token` on the
    /// database.
    pub async fn refresh_bootstrap(&self) -> Result<(), Error> {
        let Some(bootstrap) = &self.bootstrap else {
            return Ok(());
        };
        if bootstrap.retired.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        if store::admin_ever_issued(&self.durable).await? {
            bootstrap
                .retired
                .store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                "an admin token was issued: the bootstrap token (PALISADE_BOOTSTRAP_TOKEN) no longer works; unset it"
            );
        }
        Ok(())
    }

    /// Why the bootstrap token is refused: retired or expired.
    fn bootstrap_refusal(&self) -> Error {
        let retired = self
            .bootstrap
            .as_ref()
            .is_some_and(|b| b.retired.load(std::sync::atomic::Ordering::Relaxed));
        if retired {
            Error::BootstrapRetired
        } else {
            Error::BootstrapExpired
        }
    }

    /// Whether the presented hash is the bootstrap token's and it still works (logged
    /// loudly, at most once a minute, while it does).
    fn is_bootstrap(&self, presented: &TokenHash) -> Option<bool> {
        use std::sync::atomic::Ordering::Relaxed;
        let bootstrap = self.bootstrap.as_ref()?;
        if !bool::from(bootstrap.hash.ct_eq(presented)) {
            return None;
        }
        let now = self.clock.now_ms();
        let expired = bootstrap.expires_at_ms.is_some_and(|at| now >= at);
        let works = !expired && !bootstrap.retired.load(Relaxed);
        let last = bootstrap.warned_at_ms.load(Relaxed);
        if now.saturating_sub(last) >= 60_000
            && bootstrap
                .warned_at_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            if works {
                tracing::warn!(
                    "the bootstrap token was used: create an admin token (POST /v1/admin/tokens) and unset PALISADE_BOOTSTRAP_TOKEN"
                );
            } else {
                tracing::warn!(
                    expired,
                    "the bootstrap token was refused: it is retired (an admin token exists) or expired"
                );
            }
        }
        type Uses = crate::telemetry::metrics::Handles<&'static str, metrics::Counter>;
        static USES: std::sync::LazyLock<Uses> = std::sync::LazyLock::new(Uses::new);
        let outcome = if works { "accepted" } else { "refused" };
        USES.with(
            outcome,
            || metrics::counter!(crate::telemetry::metrics::BOOTSTRAP_USES_TOTAL, "outcome" => outcome),
            |uses| uses.increment(1),
        );
        Some(works)
    }

    /// Finds the caller for a bearer token.
    ///
    /// Constant-time compare: the bootstrap hash and the stored hash are compared with
    /// `subtle` ([`lookup`]). A token seen before is answered from the cache; once its
    /// verdict is older than [`CACHE_TTL`] it is refreshed behind the answer, never before it.
    pub async fn authenticate(&self, secret: &str) -> Result<Caller, Error> {
        let presented = hash(secret);
        match self.is_bootstrap(&presented) {
            Some(true) => {
                return Ok(Caller {
                    token_id: Arc::from(BOOTSTRAP_TOKEN_ID),
                    name: Arc::from(BOOTSTRAP_TOKEN_ID),
                    role: Role::Admin,
                });
            }
            Some(false) => return Err(self.bootstrap_refusal()),
            None => {}
        }
        let now = self.clock.monotonic_us();
        let cached = self.cache.get(&presented);
        let mut known_unknown = false;
        if let Some(verdict) = cached {
            let age = now.saturating_sub(verdict.checked_us);
            if age < micros(CACHE_TTL) {
                return verdict.caller.clone().ok_or(Error::UnknownToken);
            }
            // A valid token is answered from the cache while a refresh runs behind it; an
            // unknown one (or one stale past MAX_STALE) is looked up before answering.
            match &verdict.caller {
                Some(caller) if age < micros(MAX_STALE) => {
                    self.refresh_in_background(presented, &verdict, caller, now);
                    return Ok(caller.clone());
                }
                Some(_) => {}
                None => known_unknown = true,
            }
        }
        match lookup(&self.durable, &presented).await {
            Ok(caller) => {
                remember(
                    &self.cache,
                    presented,
                    caller.clone(),
                    self.clock.monotonic_us(),
                );
                caller.ok_or(Error::UnknownToken)
            }
            // Unknown (or revoked) when last asked: still refused while the database is away.
            Err(Error::Store(_)) if known_unknown => Err(Error::UnknownToken),
            Err(err) => Err(err),
        }
    }

    /// Refreshes one cached valid token from the database, off the request path. When the
    /// database cannot answer, the verdict stays (until [`MAX_STALE`]) unless the hot store
    /// holds the token's revocation marker.
    fn refresh_in_background(
        &self,
        presented: TokenHash,
        verdict: &Verdict,
        caller: &Caller,
        now_us: u64,
    ) {
        use std::sync::atomic::Ordering;
        let due = verdict.refresh_after_us.load(Ordering::Relaxed);
        let next = now_us.saturating_add(micros(CACHE_TTL));
        if now_us < due
            || verdict
                .refresh_after_us
                .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let (durable, hot, cache) = (self.durable.clone(), self.hot.clone(), self.cache.clone());
        let clock = self.clock.clone();
        let revoked_key = self.keys.revoked_token(&caller.token_id);
        tokio::spawn(async move {
            match lookup(&durable, &presented).await {
                Ok(found) => remember(&cache, presented, found, clock.monotonic_us()),
                Err(err) => {
                    metrics::counter!(crate::telemetry::metrics::ACCESS_STALE_TOTAL).increment(1);
                    let revoked = match &hot {
                        Hot::Redis(redis) => redis
                            .query::<bool>(redis::cmd("EXISTS").arg(&revoked_key))
                            .await
                            .unwrap_or(false),
                        Hot::Memory(_) => false,
                    };
                    if revoked {
                        remember(&cache, presented, None, clock.monotonic_us());
                    }
                    tracing::warn!(error.cause = %err, revoked, "token check answered from the cache: the database did not answer");
                }
            }
        });
    }

    /// Issues a new token; `created_by` is the creating token's name (or `cli`).
    pub async fn create(
        &self,
        role: Role,
        name: &str,
        created_by: &str,
    ) -> Result<IssuedToken, Error> {
        let name = crate::model::free_text(name, 100).map_err(|_| Error::InvalidName)?;
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let secret = format!("pal_{}", hex(&raw));
        let info = TokenInfo {
            id: self.clock.new_id().to_string(),
            name: name.to_owned(),
            role,
            created_at_ms: self.clock.now_ms(),
            created_by: created_by.to_owned(),
            revoked_at_ms: None,
        };
        store::insert(&self.durable, &info, &hex(&hash(&secret))).await?;
        if role == Role::Admin
            && let Some(bootstrap) = &self.bootstrap
        {
            bootstrap
                .retired
                .store(true, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(token.name = %info.name, "an admin token was created: the bootstrap token no longer works");
        }
        Ok(IssuedToken { info, secret })
    }

    /// Revokes a token. Revoking a revoked token returns it unchanged (`false`: nothing
    /// changed); this instance forgets it at once, others within [`CACHE_TTL`].
    pub async fn revoke(&self, id: &str, revoked_by: &str) -> Result<(TokenInfo, bool), Error> {
        if id == BOOTSTRAP_TOKEN_ID {
            return Err(Error::BootstrapNotRevocable);
        }
        let changed = store::revoke(&self.durable, id, self.clock.now_ms(), revoked_by).await?;
        let info = store::find_by_id(&self.durable, id)
            .await?
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        if changed {
            self.cache
                .retain(|_, v| v.caller.as_ref().is_none_or(|c| &*c.token_id != id));
            // Instances that cannot reach the database see the revocation here.
            if let Hot::Redis(redis) = &self.hot {
                let mut marker = redis::cmd("SET");
                marker
                    .arg(self.keys.revoked_token(id))
                    .arg(1)
                    .arg("PX")
                    .arg(u64::try_from(MAX_STALE.as_millis()).unwrap_or(u64::MAX) * 2);
                if let Err(err) = redis.query::<()>(&marker).await {
                    tracing::warn!(error.cause = %err, "the revocation marker was not written: other instances rely on the database");
                }
            }
        }
        Ok((info, changed))
    }

    /// Every token, newest first (secrets are never stored, so never listed).
    pub async fn list(&self) -> Result<Vec<TokenInfo>, Error> {
        Ok(store::list(&self.durable).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_allows_everything_others_only_themselves() {
        for required in Role::ALL {
            assert!(Role::Admin.allows(required));
        }
        assert!(Role::Analyst.allows(Role::Analyst));
        assert!(!Role::Analyst.allows(Role::Admin));
        assert!(!Role::Ingest.allows(Role::Analyst));
        assert!(!Role::Limiter.allows(Role::Ingest));
    }

    #[test]
    fn role_names_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }

    #[test]
    fn a_flood_of_one_off_tokens_leaves_the_tokens_in_use_cached() {
        let cache: Cache = Arc::new(quick_cache::sync::Cache::new(CACHE_CAPACITY));
        let in_use: Vec<TokenHash> = (0..100u32).map(|i| hash(&format!("valid-{i}"))).collect();
        for key in &in_use {
            let caller = Caller {
                token_id: Arc::from("id"),
                name: Arc::from("gateway"),
                role: Role::Limiter,
            };
            remember(&cache, *key, Some(caller), 0);
        }
        // Each token in use is presented again while the flood runs, as a gateway's would.
        for round in 0..50u32 {
            for i in 0..1_000u32 {
                remember(&cache, hash(&format!("random-{round}-{i}")), None, 0);
            }
            for key in &in_use {
                assert!(cache.get(key).is_some(), "evicted in round {round}");
            }
        }
        assert!(cache.len() <= CACHE_CAPACITY, "{}", cache.len());
    }

    #[test]
    fn hash_is_hex_sha256() {
        assert_eq!(
            hex(&hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
