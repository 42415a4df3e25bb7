//! Watching traffic: per-key baselines and anomalies from request telemetry and limit
//! decisions, and repeat offenders (keys hitting 429 most often) shared across instances.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use super::baseline::Anomaly;
use super::factor::Factor;

use super::{Engine, Error, Offender, lock};
use crate::limiter::{Decision, LimitRequest};
use crate::model::SubjectKey;
use crate::store::Hot;
use crate::telemetry::metrics as names;

use crate::config::ScopeKind;

/// Shared offender totals are kept for this many minutes.
pub(super) const OFFENDER_MINUTES: i64 = 60;
/// Merged per-minute request counts are kept for this many minutes.
const RATE_MINUTES_KEPT: i64 = 3;
/// A key counted fewer times than this in a telemetry batch is not merged.
pub const MERGE_MIN: u32 = 2;

/// Unix ms → minute number.
pub fn minute_of(ms: i64) -> u32 {
    u32::try_from(ms.max(0) / 60_000).unwrap_or(u32::MAX)
}

impl Engine {
    pub(super) fn key_hash(&self, key: &SubjectKey) -> u64 {
        self.key_hasher.hash_one(key.as_str())
    }

    /// Counts requests of `keys` in `minute` (Unix ms ÷ 60000) towards their baselines and,
    /// when `limited`, towards their 429s; returns the keys that became anomalous.
    pub fn observe(
        &self,
        keys: &[&SubjectKey],
        minute: u32,
        limited: bool,
    ) -> Vec<(SubjectKey, Anomaly)> {
        let mut anomalies = Vec::new();
        for key in keys {
            if let Some(anomaly) = self
                .baselines
                .observe(self.key_hash(key), key.kind(), minute, 1)
            {
                anomalies.push(((*key).clone(), anomaly));
            }
        }
        if limited {
            let mut sketch = lock(&self.sketch);
            for key in keys {
                sketch.offer(key.as_str(), 1);
            }
        }
        anomalies
    }

    /// True when several instances may count the same keys (the hot store is shared): then
    /// [`Engine::merge_counts`] has work to do.
    pub fn shares_counts(&self) -> bool {
        matches!(self.hot, Hot::Redis(_))
    }

    /// Adds this instance's per-minute counts of a telemetry batch to the counts of every
    /// instance (one pipeline on Redis) and judges each key on the merged count: a spike a
    /// load balancer spread over instances is seen as on one. Keys counted fewer than
    /// [`MERGE_MIN`] times in the batch stay local (a low-rate key's baseline is then this
    /// instance's share: if anything more sensitive). Nothing to do in process.
    pub async fn merge_counts(
        &self,
        counts: Vec<((SubjectKey, u32), u32)>,
    ) -> Result<Vec<(SubjectKey, Anomaly)>, Error> {
        let Hot::Redis(redis) = &self.hot else {
            return Ok(Vec::new());
        };
        let counts: Vec<((SubjectKey, u32), u32)> = counts
            .into_iter()
            .filter(|(_, n)| *n >= MERGE_MIN)
            .collect();
        if counts.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        let mut minutes: Vec<u32> = Vec::new();
        for ((key, minute), n) in &counts {
            pipe.cmd("HINCRBY")
                .arg(self.keys.scoring(&format!("rates:{minute}")))
                .arg(key.as_str())
                .arg(*n);
            if !minutes.contains(minute) {
                minutes.push(*minute);
            }
        }
        for minute in minutes {
            pipe.cmd("EXPIRE")
                .arg(self.keys.scoring(&format!("rates:{minute}")))
                .arg(RATE_MINUTES_KEPT * 60)
                .ignore();
        }
        let totals: Vec<i64> = redis.query_pipeline(&pipe).await.map_err(Error::Store)?;
        Ok(counts
            .into_iter()
            .zip(totals)
            .filter_map(|(((key, minute), _), total)| {
                let total = u32::try_from(total).unwrap_or(u32::MAX);
                let anomaly =
                    self.baselines
                        .observe_total(self.key_hash(&key), key.kind(), minute, total)?;
                Some((key, anomaly))
            })
            .collect())
    }

    /// Feeds one limit decision: the request's keys towards their baselines, and a denial
    /// towards the deciding key's 429s. Anomalies found are handled at once.
    pub async fn observe_check(
        &self,
        request: &LimitRequest,
        decision: &Decision,
    ) -> Result<(), Error> {
        let ip = SubjectKey::ip(&request.ip);
        // A shared address's volume is its many users': it is no anomaly, and a 429 of its
        // IP-wide ceiling makes no offender of everyone behind it.
        let shared = self.shared.is_shared(&request.ip);
        let mut keys: Vec<&SubjectKey> = Vec::with_capacity(3);
        if !shared {
            keys.push(&ip);
        }
        keys.extend(request.user.as_ref());
        keys.extend(request.device.as_ref());
        let minute = minute_of(decision.now_ms);
        let anomalies = self.observe(&keys, minute, false);
        if !decision.allowed
            && let Some(scope) = decision.deciding_scope()
        {
            match scope.scope {
                // The device behind the address is the one at fault.
                ScopeKind::IpDevice => {
                    if let Some(device) = &request.device {
                        lock(&self.sketch).offer(device.as_str(), 1);
                    }
                }
                ScopeKind::Ip | ScopeKind::EndpointIp if shared => {}
                // A tenant at its budget is a partner at its contract, not an offender; a
                // recipient or destination at its budget is the target of the flood.
                ScopeKind::Tenant | ScopeKind::Recipient | ScopeKind::Destination => {}
                _ => lock(&self.sketch).offer(&scope.subject, 1),
            }
        }
        if anomalies.is_empty() {
            return Ok(());
        }
        // Boxed: tightening reaches both stores, and held inline that future would make every
        // limit check's future about 19 KB, allocated and copied per request (3.5 % of a check).
        Box::pin(self.handle_anomalies(anomalies)).await
    }

    /// Tightens anomalous keys for the cooling period and raises one alert each.
    pub async fn handle_anomalies(
        &self,
        anomalies: Vec<(SubjectKey, Anomaly)>,
    ) -> Result<(), Error> {
        let settings = &self.settings.anomaly;
        for (key, anomaly) in anomalies {
            let now = self.clock.now_ms();
            let cooling = Duration::from_secs(settings.cooling_s);
            let ratio = f64::from(anomaly.count) / anomaly.baseline;
            let against = if anomaly.class_baseline {
                format!("the {} baseline", key.kind().as_str())
            } else {
                "its own baseline".to_owned()
            };
            let message = format!(
                "{key} made {} requests this minute, {ratio:.0}x {against} of {:.1}/min",
                anomaly.count, anomaly.baseline
            );
            metrics::counter!(names::ANOMALIES_TOTAL, "kind" => key.kind().as_str()).increment(1);
            let alert = self
                .alerts
                .raise(
                    "anomaly",
                    &key,
                    message.clone(),
                    serde_json::json!({
                        "count": anomaly.count,
                        "baseline_per_min": anomaly.baseline,
                        "ratio": ratio,
                        "class_baseline": anomaly.class_baseline,
                    }),
                    Some(cooling),
                )
                .await?;
            let mut factor = Factor::scale("anomaly", "anomaly", settings.factor, message)
                .until(now + i64::try_from(cooling.as_millis()).unwrap_or(i64::MAX));
            if let Some(alert) = alert {
                factor = factor.referring_to(alert.id);
            }
            self.assert(&key, factor).await?;
        }
        Ok(())
    }

    /// One flush step: adds this instance's counted 429s to the shared per-minute totals and
    /// tightens the keys whose total passed `offenders.per_minute`. Returns how many keys
    /// became repeat offenders.
    pub async fn flush_offenders(&self) -> Result<usize, Error> {
        let counted = lock(&self.sketch).drain();
        if counted.is_empty() {
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let minute = now / 60_000;
        // Guaranteed counts only: a sketch estimate never makes an offender.
        let deltas: Vec<(Arc<str>, u64)> = counted
            .into_iter()
            .filter_map(|(key, count, error)| (count > error).then_some((key, count - error)))
            .collect();
        let totals: Vec<u64> = match &self.hot {
            Hot::Memory(_) => {
                let mut all = lock(&self.offender_totals);
                all.retain(|m, _| *m > minute - OFFENDER_MINUTES);
                let this = all.entry(minute).or_default();
                deltas
                    .iter()
                    .map(|(key, delta)| {
                        let total = this.entry(key.to_string()).or_default();
                        *total += delta;
                        *total
                    })
                    .collect()
            }
            Hot::Redis(redis) => {
                let key = self.keys.scoring(&format!("offenders:{minute}"));
                let mut pipe = redis::pipe();
                for (subject, delta) in &deltas {
                    pipe.cmd("ZINCRBY").arg(&key).arg(*delta).arg(&**subject);
                }
                pipe.cmd("EXPIRE")
                    .arg(&key)
                    .arg(OFFENDER_MINUTES * 60)
                    .ignore()
                    .cmd("ZREMRANGEBYRANK")
                    .arg(&key)
                    .arg(0)
                    .arg(-(4096 + 1))
                    .ignore();
                let scores: Vec<f64> = redis.query_pipeline(&pipe).await.map_err(Error::Store)?;
                scores.into_iter().map(|s| s as u64).collect()
            }
        };
        let settings = &self.settings.offenders;
        let mut flagged = 0;
        for ((subject, _), total) in deltas.iter().zip(totals) {
            if total <= settings.per_minute {
                continue;
            }
            let Some(key) = SubjectKey::from_text(subject) else {
                continue;
            };
            let cooling = Duration::from_secs(settings.cooling_s);
            let message = format!(
                "{key} was refused {total} times this minute (repeat offender above {}/min)",
                settings.per_minute
            );
            let alert = self
                .alerts
                .raise(
                    "repeat_offender",
                    &key,
                    message.clone(),
                    serde_json::json!({ "count_this_minute": total, "threshold_per_min": settings.per_minute }),
                    Some(cooling),
                )
                .await?;
            // Once per cooling period: the alert marker decides.
            let Some(alert) = alert else { continue };
            flagged += 1;
            metrics::counter!(names::OFFENDERS_TOTAL, "kind" => key.kind().as_str()).increment(1);
            let until = now + i64::try_from(cooling.as_millis()).unwrap_or(i64::MAX);
            self.assert(
                &key,
                Factor::scale("offender", "repeat_offender", settings.factor, message)
                    .until(until)
                    .referring_to(alert.id),
            )
            .await?;
        }
        Ok(flagged)
    }

    /// The keys refused most often in the last `window_s` seconds (1..=3600), most first,
    /// over every instance (as of their last flush), at most `limit`.
    pub async fn offenders(&self, window_s: u64, limit: usize) -> Result<Vec<Offender>, Error> {
        let now = self.clock.now_ms();
        let window_min = i64::try_from(window_s.div_ceil(60).clamp(1, 60)).unwrap_or(1);
        let last = now / 60_000;
        let minutes: Vec<i64> = (last - window_min + 1..=last).collect();
        let mut counts: Vec<(String, u64)> = match &self.hot {
            Hot::Memory(_) => {
                let all = lock(&self.offender_totals);
                let mut merged: HashMap<String, u64> = HashMap::new();
                for minute in &minutes {
                    for (key, count) in all.get(minute).into_iter().flatten() {
                        *merged.entry(key.clone()).or_default() += count;
                    }
                }
                merged.into_iter().collect()
            }
            Hot::Redis(redis) => {
                let mut cmd = redis::cmd("ZUNION");
                cmd.arg(minutes.len());
                for minute in &minutes {
                    cmd.arg(self.keys.scoring(&format!("offenders:{minute}")));
                }
                cmd.arg("WITHSCORES");
                let merged: Vec<(String, f64)> = redis.query(&cmd).await?;
                merged.into_iter().map(|(k, s)| (k, s as u64)).collect()
            }
        };
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        counts.truncate(limit);
        let mut out = Vec::with_capacity(counts.len());
        for (key, count) in counts {
            let tightened_until_ms = match SubjectKey::from_text(&key) {
                Some(subject) => self
                    .stored(&subject)
                    .await?
                    .iter()
                    .find(|f| f.signal == "offender")
                    .and_then(|f| f.expires_at_ms),
                None => None,
            };
            out.push(Offender {
                key,
                count,
                tightened_until_ms,
            });
        }
        Ok(out)
    }
}
