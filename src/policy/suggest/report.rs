//! What a suggestion says: per budget its distribution and value, the candidate as a
//! settings file, and the numbers people read.

use serde::Serialize;

use super::Options;
use crate::config::LimitSettings;

/// The smallest number at least `x` that people read at a glance: a whole number up to 10,
/// then 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 times a power of ten.
pub fn readable(x: f64) -> u32 {
    if !x.is_finite() || x <= 1.0 {
        return 1;
    }
    if x <= 10.0 {
        return x.ceil() as u32;
    }
    let magnitude = 10f64.powf(x.log10().floor());
    let step = [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .find(|s| s * magnitude >= x - 1e-9)
        .unwrap_or(10.0);
    (step * magnitude).round().min(f64::from(u32::MAX)) as u32
}

/// A candidate file holding the whole `[limits]`: a candidate's `[[limits.budgets]]`
/// replaces the list, so every budget is written.
pub fn limits_toml(limits: &LimitSettings) -> String {
    #[derive(Serialize)]
    struct File<'a> {
        limits: &'a LimitSettings,
    }
    toml::to_string(&File { limits }).unwrap_or_default()
}

/// A flagged key a budget's suggested value stops.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct FlaggedKey {
    /// The key (a pseudonym or synthetic address, as logs show it).
    pub key: String,
    /// Its tokens in its busiest period.
    pub checks: u32,
    /// Whether the live value stopped it too.
    pub stopped_by_live: bool,
}

/// One budget's distribution and suggested value.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetSuggestion {
    /// Its name.
    pub budget: String,
    /// Its scope.
    pub scope: &'static str,
    /// Its period, seconds.
    pub period_s: u32,
    /// Checks it applied to.
    pub checks: u64,
    /// Honest key-windows (a key's checks in one period).
    pub honest_keys: u64,
    /// Flagged key-windows.
    pub flagged_keys: u64,
    /// Tokens an honest key spent per period (at multiplier 1), at the median.
    pub p50: Option<u64>,
    /// At the 90th percentile.
    pub p90: Option<u64>,
    /// At the 99th.
    pub p99: Option<u64>,
    /// At the 99.9th.
    pub p999: Option<u64>,
    /// The most.
    pub max: Option<u64>,
    /// Tokens in the busiest tenth of a period, at the 99th percentile (how bursty honest keys
    /// are).
    pub busiest_tenth_p99: Option<u64>,
    /// The live limit.
    pub live: u32,
    /// The suggested limit.
    pub suggested: u32,
    /// Honest key-windows over the live limit.
    pub honest_over_live: u64,
    /// Honest key-windows over the suggested limit.
    pub honest_over_suggested: u64,
    /// Flagged key-windows over the live limit.
    pub flagged_over_live: u64,
    /// Flagged key-windows over the suggested limit.
    pub flagged_over_suggested: u64,
    /// The largest flagged keys the suggested limit stops.
    pub flagged_stopped: Vec<FlaggedKey>,
    /// Honest key-windows by tokens spent, in power-of-two buckets `(up to, count)`.
    pub histogram: Vec<(u64, u64)>,
    /// How the value was chosen.
    pub note: String,
}

/// A suggested `[limits]`.
#[derive(Debug, Clone, Serialize)]
pub struct Suggestion {
    /// Checks summarised.
    pub records: u64,
    /// Of those, with the live answer and multipliers recorded.
    pub with_signals: u64,
    /// How it was made.
    pub options: Options,
    /// Per budget, in the settings' order.
    pub budgets: Vec<BudgetSuggestion>,
    /// The candidate.
    #[serde(skip)]
    pub candidate: LimitSettings,
    /// The candidate as a settings file (its whole `[limits]`).
    pub toml: String,
}

impl Suggestion {
    /// The per-budget table as Markdown.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Suggested from {} checks: {} % of honest keys under every budget, × {} headroom.\n\n",
            self.records, self.options.honest, self.options.headroom
        );
        out.push_str("| budget | scope | per | honest keys | p50 | p99 | p99.9 | max | live | suggested | honest over live | over suggested | flagged over live | over suggested |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let n = |v: Option<u64>| v.map_or_else(|| "–".to_owned(), |v| v.to_string());
        for b in &self.budgets {
            out.push_str(&format!(
                "| {} | {} | {} s | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                b.budget,
                b.scope,
                b.period_s,
                b.honest_keys,
                n(b.p50),
                n(b.p99),
                n(b.p999),
                n(b.max),
                b.live,
                b.suggested,
                b.honest_over_live,
                b.honest_over_suggested,
                b.flagged_over_live,
                b.flagged_over_suggested
            ));
        }
        let notes: Vec<String> = self
            .budgets
            .iter()
            .map(|b| format!("- `{}`: {}", b.budget, b.note))
            .collect();
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
        out
    }
}
