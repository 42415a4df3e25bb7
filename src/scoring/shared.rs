//! Shared addresses: IPs many honest users come from (carrier-grade NAT, a company's proxy).
//!
//! An address is shared when `limits.shared_ip.min_accounts` distinct accounts logged in
//! successfully from it within `window_s` (lockout counts them and calls [`SharedIps::mark`]),
//! or when it is in a configured range. The limiter asks [`SharedIps::is_shared`] on every
//! check, so the answer comes from memory: marks live in one sorted set in Redis (member the
//! IP's subject key, score the Unix ms it stays shared until), which every instance reads back
//! each second ([`SharedIps::refresh`]); in process the memory is the whole truth.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use crate::clock::Clock;
use crate::config::SharedIpSettings;
use crate::model::{ClientIp, SubjectKey};
use crate::store::{Error, Hot, Keys};

/// Most addresses remembered as shared (the oldest marks are dropped beyond it).
pub const MAX_SHARED: usize = 100_000;

/// The shared addresses known to this instance.
#[derive(Debug)]
pub struct SharedIps {
    settings: SharedIpSettings,
    hot: Hot,
    key: String,
    clock: Arc<dyn Clock>,
    /// IP subject key text → Unix ms it is shared until.
    marks: RwLock<HashMap<Arc<str>, i64>>,
}

impl SharedIps {
    /// The registry of one instance.
    pub fn new(settings: SharedIpSettings, hot: Hot, keys: &Keys, clock: Arc<dyn Clock>) -> Self {
        Self {
            settings,
            hot,
            key: format!("{}:shared_ips", keys.prefix()),
            clock,
            marks: RwLock::new(HashMap::new()),
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
        if self.in_ranges(ip.addr()) {
            return true;
        }
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        if marks.is_empty() {
            return false;
        }
        let key = SubjectKey::ip(ip);
        marks
            .get(key.as_str())
            .is_some_and(|&until| until > self.clock.now_ms())
    }

    /// True when the `ip:` subject `key` is shared now.
    pub fn is_shared_key(&self, key: &SubjectKey) -> bool {
        if !self.settings.enabled {
            return false;
        }
        if key.ip_addr().is_some_and(|addr| self.in_ranges(addr)) {
            return true;
        }
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        marks
            .get(key.as_str())
            .is_some_and(|&until| until > self.clock.now_ms())
    }

    fn in_ranges(&self, addr: IpAddr) -> bool {
        self.settings
            .ranges
            .iter()
            .any(|range| range.contains(addr))
    }

    /// True when a qualifying `ip` should be marked (again): not marked here, or marked
    /// more than a minute ago.
    pub fn needs_mark(&self, ip: &SubjectKey, now_ms: i64) -> bool {
        let remember_ms =
            i64::try_from(self.settings.remember_s.saturating_mul(1000)).unwrap_or(i64::MAX / 2);
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        marks
            .get(ip.as_str())
            .is_none_or(|&until| until < now_ms.saturating_add(remember_ms - 60_000))
    }

    /// Marks the `ip:` subjects `ips` shared for `remember_s` from `now_ms` (every instance
    /// sees it within a second).
    pub async fn mark(&self, ips: &[&SubjectKey], now_ms: i64) -> Result<(), Error> {
        if !self.settings.enabled || ips.is_empty() {
            return Ok(());
        }
        let remember_ms =
            i64::try_from(self.settings.remember_s.saturating_mul(1000)).unwrap_or(i64::MAX / 2);
        let until = now_ms.saturating_add(remember_ms);
        {
            let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
            for ip in ips {
                let text: Arc<str> = ip.as_str().into();
                let entry = marks.entry(text).or_insert(until);
                *entry = (*entry).max(until);
            }
            bound(&mut marks, now_ms);
        }
        if let Hot::Redis(redis) = &self.hot {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(&self.key).arg("GT");
            for ip in ips {
                cmd.arg(until).arg(ip.as_str());
            }
            redis.query::<()>(&cmd).await?;
        }
        for ip in ips {
            tracing::info!(subject.key = %ip, "shared address: many accounts log in from {ip}");
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
            .arg(MAX_SHARED - 1)
            .arg("REV")
            .arg("WITHSCORES");
        let (read,): (Vec<(String, i64)>,) = redis.query_pipeline(&pipe).await?;
        let mut marks = self.marks.write().unwrap_or_else(|e| e.into_inner());
        for (ip, until) in read {
            let entry = marks.entry(ip.into()).or_insert(until);
            *entry = (*entry).max(until);
        }
        bound(&mut marks, now);
        Ok(())
    }

    /// Addresses marked shared now, with the Unix ms each stays shared until.
    pub fn marked(&self) -> Vec<(String, i64)> {
        let now = self.clock.now_ms();
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, i64)> = marks
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(ip, until)| (ip.to_string(), *until))
            .collect();
        out.sort();
        out
    }
}

/// Drops expired marks, then the soonest to expire beyond [`MAX_SHARED`].
fn bound(marks: &mut HashMap<Arc<str>, i64>, now_ms: i64) {
    marks.retain(|_, until| *until > now_ms);
    if marks.len() > MAX_SHARED {
        let mut untils: Vec<i64> = marks.values().copied().collect();
        let cut = untils.len() - MAX_SHARED;
        let (_, &mut nth, _) = untils.select_nth_unstable(cut);
        marks.retain(|_, until| *until > nth);
    }
}
