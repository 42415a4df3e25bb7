//! Palisade's IP bans as CrowdSec's decisions stream, so existing CrowdSec bouncers
//! (nginx, HAProxy, Traefik, firewall) enforce them unchanged.
//!
//! The format is CrowdSec LAPI's `GET /v1/decisions/stream`: `{"new":[…],"deleted":[…]}`,
//! each decision `{id, uuid, origin, type, scope, value, duration, scenario}`. A bouncer
//! pulls with `startup=true` once (every live ban) and then `startup=false` (what changed
//! since its previous pull). Each API token is one bouncer; its last pull time is stored
//! durably, so any instance answers the next pull. Bans are the deny-list entries of kind
//! `cidr` (scope `Ip` for one address, `Range` otherwise). Not exported: ASN, account and
//! device entries (bouncers match addresses) and class-specific zero multipliers such as a
//! spraying IP's 0 on `auth` (a bouncer would block it everywhere).

use std::sync::Arc;

use serde::Serialize;

use crate::clock::Clock;
use crate::config::CrowdsecSettings;
use crate::reputation::lists::{Entry, Lists};
use crate::store::with_pool;
use crate::store::{Durable, Error};

const LAST_PULL: &str = "SELECT last_pull_ms FROM crowdsec_pulls WHERE token_id = $1";
const RECORD_PULL: &str = "INSERT INTO crowdsec_pulls (token_id, last_pull_ms) VALUES ($1, $2) \
    ON CONFLICT (token_id) DO UPDATE SET last_pull_ms = excluded.last_pull_ms";

/// What a bouncer asks for (CrowdSec's query parameters): every list is matched ignoring
/// ASCII case; an empty list does not filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    /// `scopes`: `ip`, `range` (comma-separated).
    pub scopes: Vec<String>,
    /// `origins`: only `palisade` matches.
    pub origins: Vec<String>,
    /// `scenarios_containing`: keep a decision whose scenario contains one of these.
    pub scenarios_containing: Vec<String>,
    /// `scenarios_not_containing`: drop a decision whose scenario contains one of these.
    pub scenarios_not_containing: Vec<String>,
}

impl Filters {
    /// Splits a comma-separated parameter (CrowdSec's form), dropping empty items.
    pub fn list(text: Option<&str>) -> Vec<String> {
        text.unwrap_or("")
            .split(',')
            .map(|item| item.trim().to_ascii_lowercase())
            .filter(|item| !item.is_empty())
            .collect()
    }

    /// True when `decision` passes every filter.
    pub fn keeps(&self, decision: &Decision) -> bool {
        let scenario = decision.scenario.to_ascii_lowercase();
        (self.scopes.is_empty() || self.scopes.contains(&decision.scope.to_ascii_lowercase()))
            && (self.origins.is_empty()
                || self.origins.contains(&decision.origin.to_ascii_lowercase()))
            && (self.scenarios_containing.is_empty()
                || self
                    .scenarios_containing
                    .iter()
                    .any(|word| scenario.contains(word.as_str())))
            && !self
                .scenarios_not_containing
                .iter()
                .any(|word| scenario.contains(word.as_str()))
    }
}

/// A live query (`GET /v1/decisions`): the bans that concern an address, a range, or one
/// scope and value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookup {
    /// `ip`: bans whose address or range holds it.
    pub ip: Option<std::net::IpAddr>,
    /// `range`: bans whose range holds all of it.
    pub range: Option<ipnetwork::IpNetwork>,
    /// `scope` (`ip` or `range`), with `value`: that exact ban.
    pub scope: Option<String>,
    /// `value`: the ban's address or CIDR as written.
    pub value: Option<String>,
}

impl Lookup {
    fn matches(&self, decision: &Decision) -> bool {
        let net: Option<ipnetwork::IpNetwork> = decision.value.parse().ok();
        self.ip
            .is_none_or(|ip| net.is_some_and(|net| net.contains(ip)))
            && self.range.is_none_or(|range| {
                net.is_some_and(|net| {
                    net.contains(range.network())
                        && net.contains(range.broadcast())
                        && net.prefix() <= range.prefix()
                })
            })
            && self
                .scope
                .as_deref()
                .is_none_or(|scope| scope.eq_ignore_ascii_case(&decision.scope))
            && self
                .value
                .as_deref()
                .is_none_or(|value| value == decision.value)
    }
}

/// One decision in CrowdSec's format.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Decision {
    /// A stable number for the entry (CrowdSec ids are integers), at most 2^53 − 1 so that
    /// a JavaScript client reads it exactly.
    pub id: i64,
    /// The list entry's id (ULID).
    pub uuid: String,
    /// Always `palisade`.
    pub origin: String,
    /// Always `ban`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `Ip` (one address) or `Range` (a CIDR).
    pub scope: String,
    /// The address or CIDR.
    pub value: String,
    /// Go duration until it ends, e.g. `3h59m58s`; `0s` in `deleted`.
    pub duration: String,
    /// `palisade/deny-list`, with the entry's reason after a colon.
    pub scenario: String,
}

/// One answer of the stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Stream {
    /// Bans to add.
    pub new: Vec<Decision>,
    /// Bans to remove.
    pub deleted: Vec<Decision>,
}

/// The stream service.
#[derive(Debug)]
pub struct Crowdsec {
    durable: Durable,
    lists: Arc<Lists>,
    clock: Arc<dyn Clock>,
    settings: CrowdsecSettings,
}

impl Crowdsec {
    /// The service over the deny list.
    pub fn new(
        durable: Durable,
        lists: Arc<Lists>,
        clock: Arc<dyn Clock>,
        settings: CrowdsecSettings,
    ) -> Self {
        Self {
            durable,
            lists,
            clock,
            settings,
        }
    }

    /// One pull by the bouncer `token_id`: everything live on `startup` (or on its first
    /// pull), else what changed since its previous pull.
    pub async fn pull(
        &self,
        token_id: &str,
        startup: bool,
        filters: &Filters,
    ) -> Result<Stream, Error> {
        let now = self.clock.now_ms();
        let since = if startup {
            None
        } else {
            let last: Option<i64> =
                with_pool!(&self.durable, |pool| sqlx::query_scalar(LAST_PULL)
                    .bind(token_id)
                    .fetch_optional(pool)
                    .await)?;
            let overlap = i64::try_from(self.settings.overlap_ms).unwrap_or(0);
            last.map(|at| at - overlap)
        };
        let (new, gone) = self.lists.ip_bans_since(since, now).await?;
        with_pool!(&self.durable, |pool| sqlx::query(RECORD_PULL)
            .bind(token_id)
            .bind(now)
            .execute(pool)
            .await
            .map(|_| ()))?;
        let permanent_ms =
            i64::try_from(self.settings.permanent_ban_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Ok(Stream {
            new: new
                .iter()
                .map(|e| {
                    let left = e.expires_at_ms.map_or(permanent_ms, |at| at - now);
                    decision(e, left)
                })
                .filter(|d| filters.keeps(d))
                .collect(),
            deleted: gone
                .iter()
                .map(|e| decision(e, 0))
                .filter(|d| filters.keeps(d))
                .collect(),
        })
    }

    /// The live bans matching `lookup` and `filters` (a bouncer in live mode asks per
    /// request; nothing is recorded).
    pub async fn decisions(
        &self,
        lookup: &Lookup,
        filters: &Filters,
    ) -> Result<Vec<Decision>, Error> {
        let now = self.clock.now_ms();
        let (live, _) = self.lists.ip_bans_since(None, now).await?;
        let permanent_ms =
            i64::try_from(self.settings.permanent_ban_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        Ok(live
            .iter()
            .map(|e| decision(e, e.expires_at_ms.map_or(permanent_ms, |at| at - now)))
            .filter(|d| filters.keeps(d) && lookup.matches(d))
            .collect())
    }
}

/// The largest integer a JavaScript number holds exactly.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

fn decision(entry: &Entry, duration_ms: i64) -> Decision {
    let (scope, value) = match entry.value.parse::<ipnetwork::IpNetwork>() {
        Ok(net) if net.prefix() == if net.is_ipv4() { 32 } else { 128 } => {
            ("Ip", net.ip().to_string())
        }
        _ => ("Range", entry.value.clone()),
    };
    // The ULID's 80 random bits folded to 53: two live entries share an id with probability
    // about n²/2⁵⁴.
    let id = entry.id.parse::<ulid::Ulid>().map_or(1, |u| {
        let random = u.random();
        let folded = (random as u64) ^ ((random >> 64) as u64) << 37;
        (folded & MAX_SAFE_INTEGER).max(1) as i64
    });
    Decision {
        id,
        uuid: entry.id.clone(),
        origin: "palisade".to_owned(),
        kind: "ban".to_owned(),
        scope: scope.to_owned(),
        value,
        duration: go_duration(duration_ms),
        scenario: format!("palisade/deny-list: {}", entry.reason),
    }
}

/// A Go `time.Duration` string as CrowdSec writes it: `1h2m3s`, `4m0.5s`, `0s`.
pub fn go_duration(ms: i64) -> String {
    let ms = ms.max(0);
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::go_duration;

    #[test]
    fn durations_are_written_like_go() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(-5), "0s");
        assert_eq!(go_duration(1_500), "1.5s");
        assert_eq!(go_duration(240_000), "4m0s");
        assert_eq!(go_duration(3_723_250), "1h2m3.25s");
        assert_eq!(go_duration(7 * 24 * 3_600_000), "168h0m0s");
    }
}
