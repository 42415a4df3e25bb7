//! A suggestion proved on the record: summarised from a window, then replayed against the
//! live policy over the same window and, when the record is long enough, computed from its
//! first three quarters and replayed over the last quarter it was not computed from.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::{Options, Suggestion, Summary};
use crate::config::{LimitSettings, ScopeKind, Settings};
use crate::policy::record::{read, span};
use crate::policy::replay::{Report, Signals, Window, replay_window};
use crate::store::{Durable, Error};

/// A hold-out needs the record to span this many of the longest budget period.
const HOLDOUT_PERIODS: i64 = 10;

/// The share of the record a hold-out keeps back, its last part.
const HOLDOUT_SHARE: f64 = 0.25;

/// Checks read per page.
const PAGE: u32 = 20_000;

/// A suggestion, and what it does on the record.
///
/// The replays count a check as flagged when it was
/// challenged or one of its subjects was flagged in any window of the summary (an offender,
/// a locked account, a scraper refused most of the time before it became an offender).
#[derive(Debug, Clone, Serialize)]
pub struct Proposal {
    /// The first and last check summarised, Unix ms.
    pub span_ms: Option<(i64, i64)>,
    /// The suggestion from the whole window.
    pub suggestion: Suggestion,
    /// It replayed over the same window against the live policy.
    pub replay: Report,
    /// A suggestion computed from the window's first part, replayed over the rest (None: the
    /// record spans fewer than ten of the longest budget period).
    pub holdout: Option<Holdout>,
    /// Why the window may hold no checks (set by the caller, who knows the settings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty: Option<String>,
}

/// A suggestion tested on checks it was not computed from.
#[derive(Debug, Clone, Serialize)]
pub struct Holdout {
    /// Computed from checks before this time, Unix ms.
    pub split_ms: i64,
    /// Its value per budget.
    pub suggested: BTreeMap<String, u32>,
    /// Replayed from `split_ms` against the live policy.
    pub replay: Report,
    /// Honest checks the suggestion refused on the hold-out, percent.
    pub honest_refused_pct: f64,
    /// The most it may refuse: 100 − `honest`, percent.
    pub target_pct: f64,
}

impl Holdout {
    /// Whether the suggestion kept honest refusals within its target on checks it was not
    /// computed from.
    pub fn within_target(&self) -> bool {
        self.honest_refused_pct <= self.target_pct
    }
}

/// Honest checks and of them refused by the candidate, over every class.
fn honest_refused(report: &Report) -> (u64, u64) {
    report.classes.values().fold((0, 0), |(all, refused), c| {
        (all + c.honest(), refused + c.honest_refused().1)
    })
}

/// The longest period of a budget the record can count, ms.
fn longest_period_ms(live: &LimitSettings) -> i64 {
    live.budgets
        .iter()
        .filter(|b| !matches!(b.scope, ScopeKind::Recipient | ScopeKind::Destination))
        .map(|b| i64::from(b.period_s) * 1000)
        .max()
        .unwrap_or(1000)
}

/// Feeds the record's checks from `from_ms` to before `to_ms` to `whole`, and those before
/// `split_ms` to `early` too.
async fn pass(
    durable: &Durable,
    (from_ms, to_ms): (i64, i64),
    whole: &mut Summary,
    early: Option<(&mut Summary, i64)>,
) -> Result<(), Error> {
    let mut early = early;
    let mut after: Option<(i64, String)> = None;
    loop {
        let page = read(durable, from_ms, to_ms, after.as_ref(), PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = Some((last.at_ms, last.id.clone()));
        for r in &page {
            whole.add(r);
            if let Some((early, split)) = early.as_mut()
                && r.at_ms < *split
            {
                early.add(r);
            }
        }
    }
    Ok(())
}

/// Summarises the record in two passes: the first finds the keys flagged in any window, the
/// second counts every other key's windows as honest. The summary of the checks before
/// `split_ms` (if any) knows only what was flagged before it.
async fn summarise(
    durable: &Durable,
    new: impl Fn() -> Summary,
    window: (i64, i64),
    split_ms: Option<i64>,
) -> Result<(Summary, Option<Summary>, HashSet<String>), Error> {
    let mut whole = new().collecting_flagged();
    let mut early = split_ms.map(|split| (new().collecting_flagged(), split));
    pass(
        durable,
        window,
        &mut whole,
        early.as_mut().map(|(s, at)| (s, *at)),
    )
    .await?;
    let flagged = whole.finish().flagged_keys();
    let mut whole = new().excluding(flagged.clone());
    let mut early = early.map(|(s, split)| (new().excluding(s.finish().flagged_keys()), split));
    pass(
        durable,
        window,
        &mut whole,
        early.as_mut().map(|(s, at)| (s, *at)),
    )
    .await?;
    Ok((whole, early.map(|(s, _)| s), flagged))
}

/// Suggests budgets from the record's checks from `from_ms` to before `to_ms`.
///
/// The suggestion is replayed against `live` (at most `max` checks per replay); `settings`
/// tells what an unattested device's multiplier is on each class ([`super::device_floor`]).
pub async fn propose(
    durable: &Durable,
    (settings, live): (&Settings, &LimitSettings),
    (from_ms, to_ms): (i64, i64),
    options: Options,
    max: usize,
) -> Result<Proposal, Error> {
    let span_ms = span(durable, from_ms, to_ms).await?;
    let split_ms = span_ms.and_then(|(first, last)| {
        let length = last - first;
        (length >= HOLDOUT_PERIODS * longest_period_ms(live))
            .then(|| last - (length as f64 * HOLDOUT_SHARE) as i64)
    });
    let new = || Summary::new(live).with_device_floor(|class| super::device_floor(settings, class));
    let (whole, early, flagged_keys) = summarise(durable, new, (from_ms, to_ms), split_ms).await?;
    let suggestion = whole.suggest(live, options);
    // A candidate against the live policy from `from_ms` on, honest and flagged apart.
    let against_live = async |candidate: &LimitSettings, from_ms| {
        let window = Window {
            from_ms,
            to_ms,
            max,
        };
        let flagged = Some(&flagged_keys);
        replay_window(
            durable,
            (live, candidate),
            window,
            Signals::Recorded,
            flagged,
            |_, _| {},
        )
        .await
    };
    let replay = against_live(&suggestion.candidate, from_ms).await?;
    let holdout = match (early, split_ms) {
        (Some(early), Some(split_ms)) => {
            let earlier = early.suggest(live, options);
            let replay = against_live(&earlier.candidate, split_ms).await?;
            let (honest, refused) = honest_refused(&replay);
            Some(Holdout {
                split_ms,
                suggested: earlier
                    .budgets
                    .iter()
                    .map(|b| (b.budget.clone(), b.suggested))
                    .collect(),
                honest_refused_pct: if honest == 0 {
                    0.0
                } else {
                    refused as f64 * 100.0 / honest as f64
                },
                target_pct: 100.0 - options.honest,
                replay,
            })
        }
        _ => None,
    };
    Ok(Proposal {
        span_ms,
        suggestion,
        replay,
        holdout,
        empty: None,
    })
}

/// Per class: honest and flagged checks, and how many each policy refuses.
fn diff_table(report: &Report) -> String {
    let mut out = "| class | honest checks | refused live | refused suggested | flagged checks | refused live | refused suggested |\n|---|---:|---:|---:|---:|---:|---:|\n".to_owned();
    for (class, c) in &report.classes {
        let (live, candidate) = c.honest_refused();
        out.push_str(&format!(
            "| {class} | {} | {live} | {candidate} | {} | {} | {} |\n",
            c.honest(),
            c.flagged,
            c.flagged_refused_live,
            c.flagged_refused_candidate
        ));
    }
    out
}

impl Proposal {
    /// The proposal as Markdown: the per-budget table, then the replays.
    pub fn markdown(&self) -> String {
        if let Some(why) = &self.empty {
            return format!("Summarised no checks: {why}\n");
        }
        let mut out = self.suggestion.markdown();
        out.push_str(&format!(
            "\nReplayed over the same {} checks against the live policy (flagged: a check of a key flagged in any window, or challenged):\n\n",
            self.replay.requests
        ));
        out.push_str(&diff_table(&self.replay));
        match &self.holdout {
            Some(h) => {
                out.push_str(&format!(
                    "\nHold-out: suggested from the checks before {}, replayed over the {} after it: honest checks refused {:.3} % (target ≤ {:.3} %: {}).\n\n",
                    crate::clock::rfc3339(h.split_ms),
                    h.replay.requests,
                    h.honest_refused_pct,
                    h.target_pct,
                    if h.within_target() { "met" } else { "not met" }
                ));
                out.push_str(&diff_table(&h.replay));
            }
            None => out.push_str(&format!(
                "\nNo hold-out: the record spans fewer than {HOLDOUT_PERIODS} of the longest budget period.\n"
            )),
        }
        out
    }
}
