//! API tokens and roles: issuing, hashing, authenticating, revoking.
//!
//! A token is `pal_` + 64 hex characters (256 random bits). Only its SHA-256 is stored: with
//! that much entropy a slow password hash adds nothing, and a fast one keeps authentication
//! off the request's critical path. Read [`Access::authenticate`] first.

mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::audit::Actor;
use crate::clock::Clock;
use crate::store::Durable;

/// The id under which the configured bootstrap token acts.
pub const BOOTSTRAP_TOKEN_ID: &str = "bootstrap";

/// How long an authentication result is reused before the token is looked up again.
/// A revocation on another instance takes effect within this time.
pub const CACHE_TTL: Duration = Duration::from_secs(1);

/// Most cached authentication results; past it the cache starts over (bounds memory under
/// a flood of random tokens).
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
    /// Name of the token that created it (`cli` for `palisade token create`).
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
    /// The name is empty, too long or has control characters.
    #[error("token name must be 1-100 printable characters")]
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

/// Issues, authenticates and revokes API tokens.
#[derive(Debug)]
pub struct Access {
    durable: Durable,
    clock: Arc<dyn Clock>,
    bootstrap: Option<TokenHash>,
    /// std Mutex: held only for a map lookup or insert, never across `.await`.
    cache: Mutex<HashMap<TokenHash, (Option<Caller>, Instant)>>,
}

/// SHA-256 of a token secret.
fn hash(secret: &str) -> TokenHash {
    Sha256::digest(secret.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Access {
    /// The access service; `bootstrap` is `PALISADE_BOOTSTRAP_TOKEN`.
    pub fn new(durable: Durable, clock: Arc<dyn Clock>, bootstrap: Option<&str>) -> Self {
        Self {
            durable,
            clock,
            bootstrap: bootstrap.map(hash),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Finds the caller for a bearer token.
    ///
    /// Constant-time compare: the bootstrap hash and the stored hash are compared with
    /// `subtle`, so response timing does not reveal how much of a guess was right. The
    /// database lookup is by the hash of the presented secret, which an attacker cannot
    /// steer towards a stored hash.
    pub async fn authenticate(&self, secret: &str) -> Result<Caller, Error> {
        let presented = hash(secret);
        if let Some(bootstrap) = &self.bootstrap
            && bool::from(bootstrap.ct_eq(&presented))
        {
            return Ok(Caller {
                token_id: Arc::from(BOOTSTRAP_TOKEN_ID),
                name: Arc::from(BOOTSTRAP_TOKEN_ID),
                role: Role::Admin,
            });
        }
        if let Some(cached) = self.cached(&presented) {
            return cached.ok_or(Error::UnknownToken);
        }
        let found = store::find_active_by_hash(&self.durable, &hex(&presented)).await?;
        let caller = found.and_then(|(stored_hash, caller)| {
            bool::from(stored_hash.as_bytes().ct_eq(hex(&presented).as_bytes())).then_some(caller)
        });
        self.remember(presented, caller.clone());
        caller.ok_or(Error::UnknownToken)
    }

    fn cached(&self, key: &TokenHash) -> Option<Option<Caller>> {
        let cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < CACHE_TTL)
            .map(|(caller, _)| caller.clone())
    }

    fn remember(&self, key: TokenHash, caller: Option<Caller>) {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(key, (caller, Instant::now()));
    }

    /// Issues a new token; `created_by` is the creating token's name (or `cli`).
    pub async fn create(
        &self,
        role: Role,
        name: &str,
        created_by: &str,
    ) -> Result<IssuedToken, Error> {
        let name = name.trim();
        if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
            return Err(Error::InvalidName);
        }
        let mut raw = [0u8; 32];
        rand::rng().fill_bytes(&mut raw);
        let secret = format!("pal_{}", hex(&raw));
        let info = TokenInfo {
            id: ulid::Ulid::new().to_string(),
            name: name.to_owned(),
            role,
            created_at_ms: self.clock.now_ms(),
            created_by: created_by.to_owned(),
            revoked_at_ms: None,
        };
        store::insert(&self.durable, &info, &hex(&hash(&secret))).await?;
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
            let mut cache = self
                .cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            cache.retain(|_, (caller, _)| caller.as_ref().is_none_or(|c| &*c.token_id != id));
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
    fn hash_is_hex_sha256() {
        assert_eq!(
            hex(&hash("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
