//! Shared addresses (IPs many honest users come from: carrier-grade NAT, a company's proxy)
//! and blocked networks (spraying from rotating addresses).
//!
//! An address is shared when `limits.shared_ip.min_accounts` distinct accounts logged in
//! successfully from it within `window_s` (lockout counts them and calls [`SharedIps::mark`]),
//! or when it is in a configured range. A network or an ASN is blocked on `auth` when
//! lockout finds it spraying ([`NetworkBlocks::block`]). The limiter asks both on every
//! check, so the answers come from memory ([`Marks`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use crate::clock::Clock;
use crate::config::SharedIpSettings;
use crate::model::{ClientIp, SubjectKey};
use crate::store::{Error, Hot, Keys};

/// Most subjects one registry remembers (the soonest to expire are dropped beyond it).
pub const MAX_MARKS: usize = 100_000;

/// Subjects marked until a time, the same on every instance.
///
/// One sorted set in Redis (member the subject key, score the Unix ms it is marked until), read back by every instance each
/// second ([`Marks::refresh`]); in process the memory is the whole truth.
#[derive(Debug)]
pub struct Marks {
    hot: Hot,
    key: String,
    clock: Arc<dyn Clock>,
    /// Subject key text → Unix ms it is marked until.
    marks: RwLock<HashMap<Arc<str>, i64>>,
}

impl Marks {
    /// The marks named `name` (`<prefix>:v1:<name>` in Redis).
    pub fn new(name: &str, hot: Hot, keys: &Keys, clock: Arc<dyn Clock>) -> Self {
        Self {
            hot,
            key: keys.marks(name),
            clock,
            marks: RwLock::new(HashMap::new()),
        }
    }

    /// True when nothing is marked (the limiter's every check asks this first, so an
    /// instance with no marks builds no key and reads no clock).
    pub fn is_empty(&self) -> bool {
        self.marks
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// True when `key` (a subject key's text) is marked now.
    pub fn contains(&self, key: &str) -> bool {
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        !marks.is_empty()
            && marks
                .get(key)
                .is_some_and(|&until| until > self.clock.now_ms())
    }

    /// Until when `key` is marked, as this instance knows.
    pub fn until(&self, key: &str) -> Option<i64> {
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        marks.get(key).copied()
    }

    /// Marks `subjects` until `until_ms` (a later mark is kept); every instance sees it
    /// within a second.
    pub async fn mark(&self, subjects: &[&SubjectKey], until_ms: i64) -> Result<(), Error> {
        if subjects.is_empty() {
            return Ok(());
        }
        {
            let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
            for subject in subjects {
                let entry = marks.entry(subject.as_str().into()).or_insert(until_ms);
                *entry = (*entry).max(until_ms);
            }
            bound(&mut marks, self.clock.now_ms());
        }
        if let Hot::Redis(redis) = &self.hot {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(&self.key).arg("GT");
            for subject in subjects {
                cmd.arg(until_ms).arg(subject.as_str());
            }
            redis.query::<()>(&cmd).await?;
        }
        Ok(())
    }

    /// Reads every instance's marks back from Redis (nothing to do in process); drops the
    /// expired ones there and here. Marks only ever extend: one made here and not yet seen
    /// in Redis (it was emptied) is kept until it expires.
    pub async fn refresh(&self) -> Result<(), Error> {
        let Hot::Redis(redis) = &self.hot else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        let mut pipe = redis::pipe();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&self.key)
            .arg("-inf")
            .arg(now)
            .ignore()
            .cmd("ZRANGE")
            .arg(&self.key)
            .arg(0)
            .arg(MAX_MARKS - 1)
            .arg("REV")
            .arg("WITHSCORES");
        let (read,): (Vec<(String, i64)>,) = redis.query_pipeline(&pipe).await?;
        let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
        for (subject, until) in read {
            let entry = marks.entry(subject.into()).or_insert(until);
            *entry = (*entry).max(until);
        }
        bound(&mut marks, now);
        Ok(())
    }

    /// The subjects marked now, with the Unix ms each is marked until.
    pub fn marked(&self) -> Vec<(String, i64)> {
        let now = self.clock.now_ms();
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, i64)> = marks
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(subject, until)| (subject.to_string(), *until))
            .collect();
        out.sort();
        out
    }
}

/// The shared addresses known to this instance.
#[derive(Debug)]
pub struct SharedIps {
    settings: SharedIpSettings,
    marks: Marks,
    pseudonyms: crate::telemetry::privacy::Pseudonyms,
}

impl SharedIps {
    /// The registry of one instance.
    pub fn new(
        settings: SharedIpSettings,
        hot: Hot,
        keys: &Keys,
        clock: Arc<dyn Clock>,
        pseudonyms: crate::telemetry::privacy::Pseudonyms,
    ) -> Self {
        Self {
            settings,
            marks: Marks::new("shared_ips", hot, keys, clock),
            pseudonyms,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> &SharedIpSettings {
        &self.settings
    }

    /// True when `ip` is shared now: a configured range, or marked and not expired.
    pub fn is_shared(&self, ip: &ClientIp) -> bool {
        if !self.settings.enabled {
            return false;
        }
        self.in_ranges(ip.addr())
            || (!self.marks.is_empty() && self.marks.contains(SubjectKey::ip(ip).as_str()))
    }

    fn in_ranges(&self, addr: IpAddr) -> bool {
        self.settings
            .ranges
            .iter()
            .any(|range| range.contains(addr))
    }

    fn remember_ms(&self) -> i64 {
        i64::try_from(self.settings.remember_s.saturating_mul(1000)).unwrap_or(i64::MAX / 2)
    }

    /// True when a qualifying `ip` should be marked (again): not marked here, or marked
    /// more than a minute ago.
    pub fn needs_mark(&self, ip: &SubjectKey, now_ms: i64) -> bool {
        self.marks
            .until(ip.as_str())
            .is_none_or(|until| until < now_ms.saturating_add(self.remember_ms() - 60_000))
    }

    /// Marks the `ip:` subjects `ips` shared for `remember_s` from `now_ms`.
    pub async fn mark(&self, ips: &[&SubjectKey], now_ms: i64) -> Result<(), Error> {
        if !self.settings.enabled || ips.is_empty() {
            return Ok(());
        }
        self.marks
            .mark(ips, now_ms.saturating_add(self.remember_ms()))
            .await?;
        for ip in ips {
            let ip = self.pseudonyms.shown_key(ip.as_str());
            tracing::info!(subject.key = %ip, "shared address: many accounts log in from {ip}");
        }
        Ok(())
    }

    /// Reads every instance's marks back (see [`Marks::refresh`]).
    pub async fn refresh(&self) -> Result<(), Error> {
        self.marks.refresh().await
    }

    /// Addresses marked shared now, with the Unix ms each stays shared until.
    pub fn marked(&self) -> Vec<(String, i64)> {
        self.marks.marked()
    }
}

/// Networks and autonomous systems blocked on `auth` for spraying from rotating addresses.
///
/// A network is an IPv4 /24 or an IPv6 /48. Every address in them is refused there, whatever is
/// published for the address itself (a block beats every other factor).
#[derive(Debug)]
pub struct NetworkBlocks {
    marks: Marks,
}

impl NetworkBlocks {
    /// The registry of one instance.
    pub fn new(hot: Hot, keys: &Keys, clock: Arc<dyn Clock>) -> Self {
        Self::named("blocked_networks", hot, keys, clock)
    }

    /// A registry of networks and ASNs under another name (the suspected ones).
    pub fn named(name: &str, hot: Hot, keys: &Keys, clock: Arc<dyn Clock>) -> Self {
        Self {
            marks: Marks::new(name, hot, keys, clock),
        }
    }

    /// True when `ip`'s network or its autonomous system (`asn` looks it up, only when
    /// something is blocked) is blocked now.
    pub fn is_blocked(&self, ip: &ClientIp, asn: impl FnOnce() -> Option<u32>) -> bool {
        !self.marks.is_empty()
            && (self.marks.contains(SubjectKey::ip_network(ip).as_str())
                || asn().is_some_and(|asn| self.marks.contains(SubjectKey::asn(asn).as_str())))
    }

    /// True for the subjects blocks are kept for: an `asn:` key, or an `ip:` network key
    /// ([`SubjectKey::ip_network`]).
    pub fn is_network(subject: &SubjectKey) -> bool {
        let text = subject.as_str();
        subject.kind() == crate::model::SubjectKind::Asn
            || (subject.kind() == crate::model::SubjectKind::Ip
                && (text.ends_with("/24") || text.ends_with("/48")))
    }

    /// Until when `subject` (an `ip:` network or `asn:` key) is blocked, as this instance
    /// knows.
    pub fn until(&self, subject: &SubjectKey) -> Option<i64> {
        self.marks.until(subject.as_str())
    }

    /// Blocks `subject` (an `ip:` network or `asn:` key) until `until_ms`.
    pub async fn block(&self, subject: &SubjectKey, until_ms: i64) -> Result<(), Error> {
        self.marks.mark(&[subject], until_ms).await
    }

    /// Reads every instance's blocks back (see [`Marks::refresh`]).
    pub async fn refresh(&self) -> Result<(), Error> {
        self.marks.refresh().await
    }

    /// The networks blocked now, with the Unix ms each is blocked until.
    pub fn blocked(&self) -> Vec<(String, i64)> {
        self.marks.marked()
    }
}

/// Drops expired marks, then the soonest to expire beyond [`MAX_MARKS`].
fn bound(marks: &mut HashMap<Arc<str>, i64>, now_ms: i64) {
    marks.retain(|_, until| *until > now_ms);
    if marks.len() > MAX_MARKS {
        let mut untils: Vec<i64> = marks.values().copied().collect();
        let cut = untils.len() - MAX_MARKS;
        let (_, &mut nth, _) = untils.select_nth_unstable(cut);
        marks.retain(|_, until| *until > nth);
    }
}
