//! `[scoring]`: how factors combine into multipliers, anomaly and repeat-offender detection,
//! shadow factors, alert webhooks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Secret, SettingError, setting_name};

/// Floor and ceiling of one endpoint class's multipliers (unset: the section default).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClassBounds {
    /// Lowest multiplier short of a block (a factor 0 still blocks).
    pub floor: Option<f64>,
    /// Highest multiplier.
    pub ceiling: Option<f64>,
}

/// `[scoring.anomaly]`: a key far above its own baseline.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnomalySettings {
    /// Requests in the current minute ÷ baseline per minute that count as an anomaly.
    /// TOML `scoring.anomaly.ratio`; default 100.
    pub ratio: f64,
    /// A baseline below this many requests per minute is trivial: judged against
    /// `min_baseline_per_min` instead (so a key going from 0.01 to 1 is no anomaly).
    /// Default 1.
    pub min_baseline_per_min: f64,
    /// Minutes a key must be seen before its own baseline counts; until then it is judged
    /// against its kind's (ip, user, device) baseline. Default 10.
    pub warmup_minutes: u32,
    /// Half-life of the baseline (an exponentially weighted moving average of requests per
    /// minute), minutes. Default 30.
    pub half_life_minutes: f64,
    /// Factor an anomalous key gets for the cooling period. Default 0.25.
    pub factor: f64,
    /// Cooling period, seconds: the factor's lifetime, and at most one alert per key in it.
    /// Default 600.
    pub cooling_s: u64,
    /// Most keys whose baselines are tracked per instance (memory is fixed at start: about
    /// 32 bytes per key); past it the key with the lowest baseline in its slot set is
    /// replaced. Default 262144.
    pub capacity: usize,
}

impl Default for AnomalySettings {
    fn default() -> Self {
        Self {
            ratio: 100.0,
            min_baseline_per_min: 1.0,
            warmup_minutes: 10,
            half_life_minutes: 30.0,
            factor: 0.25,
            cooling_s: 600,
            capacity: 262_144,
        }
    }
}

/// `[scoring.offenders]`: keys that keep hitting 429.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OffenderSettings {
    /// More 429s than this in one minute make a key a repeat offender. TOML
    /// `scoring.offenders.per_minute`; default 100.
    pub per_minute: u64,
    /// Factor a repeat offender gets for the cooling period. Default 0.5.
    pub factor: f64,
    /// Cooling period, seconds. Default 600.
    pub cooling_s: u64,
    /// Keys each instance tracks per flush interval (Space-Saving sketch; memory is bounded
    /// by it, not by the number of keys). Default 1024.
    pub sketch_capacity: usize,
}

impl Default for OffenderSettings {
    fn default() -> Self {
        Self {
            per_minute: 100,
            factor: 0.5,
            cooling_s: 600,
            sketch_capacity: 1024,
        }
    }
}

/// One alert webhook (`[[scoring.webhooks]]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Where alerts are POSTed as JSON (`https://…` or `http://…`).
    pub url: String,
    /// HMAC-SHA256 key: every delivery carries `X-Palisade-Signature: t=<unix s>,v1=<hex>`
    /// over `<t>.<body>`. At least 16 characters.
    pub secret: Secret,
    /// Alert kinds to deliver (`anomaly`, `repeat_offender`, `spraying`, `lockout`); empty
    /// means every kind.
    #[serde(default)]
    pub kinds: Vec<String>,
}

/// The `[scoring]` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScoringSettings {
    /// Lowest multiplier short of a block, for classes without their own. TOML
    /// `scoring.floor`, env `PALISADE_SCORING__FLOOR`; default 0.1.
    pub floor: f64,
    /// Highest multiplier, for classes without their own. Default 2.
    pub ceiling: f64,
    /// Per-class bounds: `[scoring.classes.auth] ceiling = 1.0`.
    pub classes: BTreeMap<String, ClassBounds>,
    /// Endpoint classes reachable without an account (reputation and attestation apply
    /// their tighter public factors there). Default `["auth"]`.
    pub public_classes: Vec<String>,
    /// Factors computed and reported but not enforced, by reason code
    /// (`reputation_tor`, `anomaly`) or by signal (`reputation`, `attestation`). Default none.
    pub shadow: Vec<String>,
    /// Anomaly detection.
    pub anomaly: AnomalySettings,
    /// Repeat offenders.
    pub offenders: OffenderSettings,
    /// Alert webhooks. Default none.
    pub webhooks: Vec<WebhookSettings>,
    /// Posted request-telemetry batches are kept this many hours. Default 24.
    pub telemetry_retention_hours: u64,
}

impl Default for ScoringSettings {
    fn default() -> Self {
        Self {
            floor: 0.1,
            ceiling: 2.0,
            classes: BTreeMap::new(),
            public_classes: vec!["auth".to_owned()],
            shadow: Vec::new(),
            anomaly: AnomalySettings::default(),
            offenders: OffenderSettings::default(),
            webhooks: Vec::new(),
            telemetry_retention_hours: 24,
        }
    }
}

impl ScoringSettings {
    /// Floor and ceiling of `class`.
    pub fn bounds(&self, class: &str) -> (f64, f64) {
        let own = self.classes.get(class);
        (
            own.and_then(|b| b.floor).unwrap_or(self.floor),
            own.and_then(|b| b.ceiling).unwrap_or(self.ceiling),
        )
    }

    /// Checks values; `classes` are the configured endpoint classes.
    pub(super) fn validate(&self, classes: &[&str]) -> Result<(), SettingError> {
        let factor = |key: &str, value: f64, max: f64| {
            if value.is_nan() || !(0.0..=max).contains(&value) {
                Err(SettingError::new(
                    setting_name(key),
                    format!("must be between 0 and {max}"),
                ))
            } else {
                Ok(())
            }
        };
        factor("scoring.floor", self.floor, 1.0)?;
        factor("scoring.ceiling", self.ceiling, 100.0)?;
        if self.ceiling < 1.0 {
            return Err(SettingError::new(
                setting_name("scoring.ceiling"),
                "must be at least 1 (an allow entry pins a multiplier at 1)",
            ));
        }
        for name in self.classes.keys() {
            let key = format!("scoring.classes.{name}");
            if !classes.contains(&name.as_str()) {
                return Err(SettingError::new(
                    key,
                    "names a class that [limits.classes] does not configure",
                ));
            }
            let (floor, ceiling) = self.bounds(name);
            factor(&format!("{key}.floor"), floor, 1.0)?;
            factor(&format!("{key}.ceiling"), ceiling, 100.0)?;
            if floor > ceiling {
                return Err(SettingError::new(key, "floor must not exceed ceiling"));
            }
        }
        if let Some(class) = self
            .public_classes
            .iter()
            .find(|c| !classes.contains(&c.as_str()))
        {
            return Err(SettingError::new(
                setting_name("scoring.public_classes"),
                format!("names the class {class:?}, which [limits.classes] does not configure"),
            ));
        }
        let anomaly = &self.anomaly;
        if anomaly.ratio.is_nan() || anomaly.ratio < 1.0 {
            return Err(SettingError::new(
                setting_name("scoring.anomaly.ratio"),
                "must be at least 1",
            ));
        }
        if anomaly.min_baseline_per_min.is_nan() || anomaly.min_baseline_per_min <= 0.0 {
            return Err(SettingError::new(
                setting_name("scoring.anomaly.min_baseline_per_min"),
                "must be greater than 0",
            ));
        }
        if anomaly.half_life_minutes.is_nan() || anomaly.half_life_minutes < 1.0 {
            return Err(SettingError::new(
                setting_name("scoring.anomaly.half_life_minutes"),
                "must be at least 1",
            ));
        }
        factor("scoring.anomaly.factor", anomaly.factor, 1.0)?;
        factor("scoring.offenders.factor", self.offenders.factor, 1.0)?;
        let positive = [
            ("scoring.anomaly.cooling_s", anomaly.cooling_s),
            ("scoring.anomaly.capacity", anomaly.capacity as u64),
            ("scoring.offenders.per_minute", self.offenders.per_minute),
            ("scoring.offenders.cooling_s", self.offenders.cooling_s),
            (
                "scoring.offenders.sketch_capacity",
                self.offenders.sketch_capacity as u64,
            ),
            (
                "scoring.telemetry_retention_hours",
                self.telemetry_retention_hours,
            ),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(SettingError::new(setting_name(key), "must be at least 1"));
        }
        if anomaly.capacity > 64 << 20 || self.offenders.sketch_capacity > 1 << 20 {
            return Err(SettingError::new(
                setting_name("scoring.anomaly.capacity"),
                "capacities are at most 67108864 keys (anomaly) and 1048576 (offenders)",
            ));
        }
        for (index, hook) in self.webhooks.iter().enumerate() {
            let key = format!("scoring.webhooks[{index}]");
            if !(hook.url.starts_with("https://") || hook.url.starts_with("http://")) {
                return Err(SettingError::new(
                    key,
                    "url must start with https:// or http://",
                ));
            }
            if hook.secret.expose().len() < 16 {
                return Err(SettingError::new(
                    key,
                    "secret must be at least 16 characters",
                ));
            }
        }
        Ok(())
    }
}
