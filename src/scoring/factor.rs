//! Factors and how they combine into one multiplier: pure, read this first.
//!
//! Default policy (DESIGN.md, the scoring issue): per endpoint class, the product of the
//! enforced factors that apply to it, clamped to the class's `[floor, ceiling]`; a factor 0
//! (a deny entry, a lockout, spraying) blocks whatever else applies; an allow entry pins the
//! result at 1.0 or more. Shadow factors are reported, and folded into `would_be`, but never
//! into `multiplier`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::ScoringSettings;

/// How a factor acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// Multiplies (0 blocks).
    Scale,
    /// Lifts the result to at least its value (allow entries: 1.0), unless a factor blocks.
    Pin,
    /// Sets the result to its value, beyond the class bounds (an operator's override), unless
    /// another factor blocks; of several, the smallest.
    Set,
}

/// One signal's contribution to one subject's multiplier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Factor {
    /// The signal: `velocity`, `reputation`, `lists`, `attestation`, `anomaly`, `offender`.
    pub signal: String,
    /// Stable reason code, e.g. `lockout`, `reputation_datacenter`, `attestation_strong`.
    pub code: String,
    /// Scale or pin.
    pub effect: Effect,
    /// The factor on every class it applies to that `class_values` does not name.
    pub value: f64,
    /// Per-class values (e.g. tighter on public classes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub class_values: BTreeMap<String, f64>,
    /// Classes it applies to; empty means every class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<String>,
    /// A sentence for analysts.
    pub message: String,
    /// Unix ms after which it no longer applies; None: until retracted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// What it refers to: a lockout id, alert id, list entry id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl Factor {
    /// A scale factor on every class.
    pub fn scale(signal: &str, code: &str, value: f64, message: impl Into<String>) -> Self {
        Self {
            signal: signal.to_owned(),
            code: code.to_owned(),
            effect: Effect::Scale,
            value,
            class_values: BTreeMap::new(),
            classes: Vec::new(),
            message: message.into(),
            expires_at_ms: None,
            reference: None,
        }
    }

    /// A pin (allow) factor on every class.
    pub fn pin(signal: &str, code: &str, message: impl Into<String>) -> Self {
        Self {
            effect: Effect::Pin,
            ..Self::scale(signal, code, 1.0, message)
        }
    }

    /// An override factor: sets the multiplier to `value` on every class.
    pub fn set(signal: &str, code: &str, value: f64, message: impl Into<String>) -> Self {
        Self {
            effect: Effect::Set,
            ..Self::scale(signal, code, value, message)
        }
    }

    /// Restricted to `classes`.
    pub fn on_classes(mut self, classes: &[&str]) -> Self {
        self.classes = classes.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    /// With a different value on `classes`.
    pub fn with_class_value(mut self, classes: &[String], value: f64) -> Self {
        for class in classes {
            self.class_values.insert(class.clone(), value);
        }
        self
    }

    /// Expiring at `at_ms`.
    pub fn until(mut self, at_ms: i64) -> Self {
        self.expires_at_ms = Some(at_ms);
        self
    }

    /// Referring to `reference`.
    pub fn referring_to(mut self, reference: impl Into<String>) -> Self {
        self.reference = Some(reference.into());
        self
    }

    /// Its id within a subject's factors: one factor per signal and code.
    pub fn id(&self) -> String {
        format!("{}:{}", self.signal, self.code)
    }

    /// True if its id ([`Factor::id`], `signal:code`) is `id` (without allocating one).
    pub fn signal_code_is(&self, id: &str) -> bool {
        id.split_once(':')
            .is_some_and(|(signal, code)| signal == self.signal && code == self.code)
    }

    /// True if it applies to `class`.
    pub fn applies_to(&self, class: &str) -> bool {
        self.classes.is_empty() || self.classes.iter().any(|c| c == class)
    }

    /// Its value on `class` (sanitised: never negative or NaN).
    pub fn value_on(&self, class: &str) -> f64 {
        let value = self.class_values.get(class).copied().unwrap_or(self.value);
        if value.is_nan() { 0.0 } else { value.max(0.0) }
    }

    /// True once `now_ms` reaches its expiry.
    pub fn has_expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// The combination policy of one deployment.
#[derive(Debug, Clone)]
pub struct Policy {
    floor: f64,
    ceiling: f64,
    classes: BTreeMap<String, (f64, f64)>,
    shadow: Vec<String>,
}

impl Policy {
    /// The policy of `[scoring]` for the given endpoint classes.
    pub fn from_settings<'a>(
        settings: &ScoringSettings,
        classes: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        Self {
            floor: settings.floor,
            ceiling: settings.ceiling,
            classes: classes
                .into_iter()
                .map(|c| (c.to_owned(), settings.bounds(c)))
                .collect(),
            shadow: settings.shadow.clone(),
        }
    }

    /// `[floor, ceiling]` of `class`.
    pub fn bounds(&self, class: &str) -> (f64, f64) {
        self.classes
            .get(class)
            .copied()
            .unwrap_or((self.floor, self.ceiling))
    }

    /// True when `factor` is configured as shadow (by its code or its signal).
    pub fn is_shadow(&self, factor: &Factor) -> bool {
        self.shadow
            .iter()
            .any(|s| *s == factor.code || *s == factor.signal)
    }
}

/// One factor as it applied to one class.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Contribution {
    /// The signal.
    pub signal: String,
    /// Stable reason code.
    pub code: String,
    /// `scale` or `pin`.
    pub effect: Effect,
    /// Its value on this class.
    pub factor: f64,
    /// A sentence for analysts.
    pub message: String,
    /// Reported only: would have applied, is not enforced.
    pub shadow: bool,
    /// RFC 3339, if it expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// A lockout id, alert id or list entry id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// The multiplier of one subject for one class, with every contribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Combined {
    /// What enforcement uses.
    pub multiplier: f64,
    /// What it would be if shadow factors were enforced too.
    pub would_be: f64,
    /// The factors that apply to the class, enforced and shadow.
    pub contributions: Vec<Contribution>,
}

/// Product, clamp, block and pin over `values` (effect, value).
fn fold(values: impl Iterator<Item = (Effect, f64)> + Clone, floor: f64, ceiling: f64) -> f64 {
    let mut product = 1.0;
    let mut pin: Option<f64> = None;
    let mut set: Option<f64> = None;
    for (effect, value) in values {
        match effect {
            Effect::Scale if value == 0.0 => return 0.0,
            Effect::Scale => product *= value,
            Effect::Pin => pin = Some(pin.map_or(value, |p: f64| p.max(value))),
            Effect::Set => set = Some(set.map_or(value, |s: f64| s.min(value))),
        }
    }
    if let Some(set) = set {
        return set;
    }
    let clamped = product.clamp(floor, ceiling);
    match pin {
        Some(pin) => clamped.max(pin),
        None => clamped,
    }
}

/// The live factors that apply to `class` at `now_ms`, each with whether it is shadow.
fn applicable<'a>(
    factors: impl IntoIterator<Item = &'a Factor, IntoIter: Clone>,
    class: &'a str,
    policy: &'a Policy,
    now_ms: i64,
) -> impl Iterator<Item = (&'a Factor, bool)> + Clone {
    factors
        .into_iter()
        .filter(move |f| f.applies_to(class) && !f.has_expired(now_ms))
        .map(|f| (f, policy.is_shadow(f)))
}

/// [`combine`]'s multiplier alone, and the codes of the enforced factors behind it: what a
/// publish needs, without a contribution (messages, expiries as text) built per class.
pub fn combine_multiplier<'a>(
    factors: &'a [Factor],
    class: &'a str,
    policy: &'a Policy,
    now_ms: i64,
) -> (f64, impl Iterator<Item = &'a str>) {
    let multiplier = multiplier_of(factors.iter(), class, policy, now_ms);
    let enforced = applicable(factors, class, policy, now_ms).filter(|(_, shadow)| !shadow);
    (multiplier, enforced.map(|(f, _)| f.code.as_str()))
}

/// [`combine`]'s multiplier alone, of factors from several places (the pull signals'
/// defaults on every limit check), without gathering them.
pub fn multiplier_of<'a>(
    factors: impl Iterator<Item = &'a Factor> + Clone,
    class: &'a str,
    policy: &'a Policy,
    now_ms: i64,
) -> f64 {
    let (floor, ceiling) = policy.bounds(class);
    let enforced = applicable(factors, class, policy, now_ms)
        .filter(|(_, shadow)| !shadow)
        .map(|(f, _)| (f.effect, f.value_on(class)));
    fold(enforced, floor, ceiling)
}

/// Combines the live factors that apply to `class` at `now_ms`.
pub fn combine(factors: &[Factor], class: &str, policy: &Policy, now_ms: i64) -> Combined {
    let (floor, ceiling) = policy.bounds(class);
    let applicable: Vec<(&Factor, bool)> = applicable(factors, class, policy, now_ms).collect();
    let enforced = applicable
        .iter()
        .filter(|(_, shadow)| !shadow)
        .map(|(f, _)| (f.effect, f.value_on(class)));
    let all = applicable
        .iter()
        .map(|(f, _)| (f.effect, f.value_on(class)));
    Combined {
        multiplier: fold(enforced, floor, ceiling),
        would_be: fold(all, floor, ceiling),
        contributions: applicable
            .iter()
            .map(|(f, shadow)| Contribution {
                signal: f.signal.clone(),
                code: f.code.clone(),
                effect: f.effect,
                factor: f.value_on(class),
                message: f.message.clone(),
                shadow: *shadow,
                expires_at: f.expires_at_ms.map(crate::clock::rfc3339),
                reference: f.reference.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(shadow: &[&str]) -> Policy {
        let settings = ScoringSettings {
            shadow: shadow.iter().map(|s| (*s).to_owned()).collect(),
            ..ScoringSettings::default()
        };
        Policy::from_settings(&settings, ["auth", "read", "write"])
    }

    #[test]
    fn no_factor_is_neutral() {
        let combined = combine(&[], "read", &policy(&[]), 0);
        assert_eq!(combined.multiplier, 1.0);
        assert!(combined.contributions.is_empty());
    }

    #[test]
    fn factors_multiply_and_are_clamped_to_the_class_bounds() {
        let factors = [
            Factor::scale("reputation", "reputation_datacenter", 0.5, "dc"),
            Factor::scale("attestation", "attestation_unverified", 0.5, "unverified"),
        ];
        assert_eq!(combine(&factors, "read", &policy(&[]), 0).multiplier, 0.25);
        let many: Vec<Factor> = (0..10)
            .map(|i| Factor::scale("x", &format!("c{i}"), 0.5, ""))
            .collect();
        assert_eq!(combine(&many, "read", &policy(&[]), 0).multiplier, 0.1);
        let loose = [Factor::scale("attestation", "attestation_strong", 5.0, "")];
        assert_eq!(combine(&loose, "read", &policy(&[]), 0).multiplier, 2.0);
    }

    #[test]
    fn an_override_sets_the_result_beyond_the_bounds_but_not_past_a_block() {
        let raise = Factor::set("override", "o1", 5.0, "partner launch");
        let halve = Factor::scale("offender", "repeat_offender", 0.5, "429s");
        assert_eq!(
            combine(&[raise.clone(), halve.clone()], "read", &policy(&[]), 0).multiplier,
            5.0
        );
        let cut = Factor::set("override", "o2", 0.01, "misbehaving");
        assert_eq!(
            combine(&[raise.clone(), cut], "read", &policy(&[]), 0).multiplier,
            0.01
        );
        let locked = Factor::scale("velocity", "lockout", 0.0, "locked");
        assert_eq!(
            combine(&[raise, locked], "read", &policy(&[]), 0).multiplier,
            0.0
        );
    }

    #[test]
    fn a_zero_blocks_below_the_floor_and_beats_an_allow_pin() {
        let factors = [
            Factor::pin("lists", "list_allow", "allowed"),
            Factor::scale("velocity", "lockout", 0.0, "locked").on_classes(&["auth"]),
        ];
        assert_eq!(combine(&factors, "auth", &policy(&[]), 0).multiplier, 0.0);
        // The lockout is for the auth class only; elsewhere the allow entry holds.
        assert_eq!(combine(&factors, "read", &policy(&[]), 0).multiplier, 1.0);
    }

    #[test]
    fn an_allow_pin_lifts_tightening_factors_to_one_but_keeps_loosening_ones() {
        let tight = [
            Factor::pin("lists", "list_allow", ""),
            Factor::scale("reputation", "reputation_tor", 0.25, ""),
        ];
        assert_eq!(combine(&tight, "read", &policy(&[]), 0).multiplier, 1.0);
        let loose = [
            Factor::pin("lists", "list_allow", ""),
            Factor::scale("attestation", "attestation_strong", 1.5, ""),
        ];
        assert_eq!(combine(&loose, "read", &policy(&[]), 0).multiplier, 1.5);
    }

    #[test]
    fn shadow_factors_are_reported_but_not_enforced() {
        let factors = [
            Factor::scale("anomaly", "anomaly", 0.25, "100x baseline"),
            Factor::scale("reputation", "reputation_vpn", 0.5, "vpn"),
        ];
        let combined = combine(&factors, "read", &policy(&["anomaly"]), 0);
        assert_eq!(combined.multiplier, 0.5);
        assert_eq!(combined.would_be, 0.125);
        let anomaly = combined
            .contributions
            .iter()
            .find(|c| c.code == "anomaly")
            .unwrap();
        assert!(anomaly.shadow);
        // A whole signal can be shadow too.
        let combined = combine(&factors, "read", &policy(&["reputation"]), 0);
        assert_eq!(combined.multiplier, 0.25);
    }

    #[test]
    fn expired_factors_and_other_classes_do_not_apply() {
        let factors = [
            Factor::scale("offender", "repeat_offender", 0.5, "").until(1_000),
            Factor::scale("velocity", "spraying", 0.0, "").on_classes(&["auth"]),
        ];
        assert_eq!(combine(&factors, "read", &policy(&[]), 999).multiplier, 0.5);
        assert_eq!(
            combine(&factors, "read", &policy(&[]), 1_000).multiplier,
            1.0
        );
        assert_eq!(
            combine(&factors, "auth", &policy(&[]), 1_000).multiplier,
            0.0
        );
    }

    #[test]
    fn class_values_override_the_value_on_their_classes() {
        let public = vec!["auth".to_owned()];
        let factor = Factor::scale("reputation", "reputation_datacenter", 0.5, "")
            .with_class_value(&public, 0.25);
        assert_eq!(
            combine(std::slice::from_ref(&factor), "auth", &policy(&[]), 0).multiplier,
            0.25
        );
        assert_eq!(combine(&[factor], "read", &policy(&[]), 0).multiplier, 0.5);
    }

    #[test]
    fn bad_values_never_produce_a_negative_or_nan_multiplier() {
        let factors = [
            Factor::scale("x", "nan", f64::NAN, ""),
            Factor::scale("x", "neg", -3.0, ""),
        ];
        assert_eq!(combine(&factors, "read", &policy(&[]), 0).multiplier, 0.0);
    }

    #[test]
    fn the_multiplier_alone_is_the_combination_and_its_enforced_codes() {
        let factors = [
            Factor::scale("reputation", "reputation_datacenter", 0.5, "dc"),
            Factor::scale("velocity", "login_failures", 0.5, "5").on_classes(&["auth"]),
            Factor::scale("anomaly", "rate", 0.25, "shadow"),
            Factor::scale("x", "gone", 0.1, "expired").until(500),
            Factor::pin("lists", "allow", "pinned").on_classes(&["write"]),
        ];
        let policy = policy(&["rate"]);
        for class in ["auth", "read", "write"] {
            let combined = combine(&factors, class, &policy, 1_000);
            let (multiplier, codes) = combine_multiplier(&factors, class, &policy, 1_000);
            assert_eq!(multiplier, combined.multiplier, "{class}");
            // The same factors from two places (the pull signals' defaults) combine alike.
            let (first, rest) = factors.split_at(2);
            let chained = multiplier_of(first.iter().chain(rest), class, &policy, 1_000);
            assert_eq!(chained, combined.multiplier, "{class}");
            if class != "write" {
                // (On `write` the pin lifts both to 1.0.)
                assert_ne!(
                    multiplier, combined.would_be,
                    "{class}: the shadow factor counts"
                );
            }
            let enforced: Vec<&str> = combined
                .contributions
                .iter()
                .filter(|c| !c.shadow)
                .map(|c| c.code.as_str())
                .collect();
            assert_eq!(codes.collect::<Vec<_>>(), enforced, "{class}");
        }
    }
}
