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

/// One decision in CrowdSec's format.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Decision {
    /// A stable number for the entry (CrowdSec ids are integers).
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
    pub async fn pull(&self, token_id: &str, startup: bool) -> Result<Stream, Error> {
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
                .collect(),
            deleted: gone.iter().map(|e| decision(e, 0)).collect(),
        })
    }
}

fn decision(entry: &Entry, duration_ms: i64) -> Decision {
    let (scope, value) = match entry.value.parse::<ipnetwork::IpNetwork>() {
        Ok(net) if net.prefix() == if net.is_ipv4() { 32 } else { 128 } => {
            ("Ip", net.ip().to_string())
        }
        _ => ("Range", entry.value.clone()),
    };
    let id = entry
        .id
        .parse::<ulid::Ulid>()
        .map_or(0, |u| (u.0 as u64 & 0x7fff_ffff_ffff_ffff) as i64);
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
