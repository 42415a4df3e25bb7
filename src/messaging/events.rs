//! Delivery events (`POST /v1/events/messaging`): codes sent and codes verified, per
//! destination.
//!
//! The auth service reports each code it sent (`otp_sent`) and each code entered correctly
//! (`otp_verified`), naming the recipient. They are stored durably (the destination only,
//! never the number), counted into each destination's conversion, and a collapse tightens
//! the destination on `messaging` (factor `messaging:otp_conversion`, explained like every
//! multiplier) and raises one alert per incident.

use std::sync::Arc;

use serde::Deserialize;

use super::Recipients;
use super::conversion::{Collapse, Conversion, Outcome};
use crate::config::MessagingSettings;
use crate::ingest::EventError;
use crate::model::{SubjectKey, SubjectKind};
use crate::scoring::Engine;
use crate::scoring::Error;
use crate::scoring::factor::Factor;
use crate::store::{Durable, with_pool};

/// Largest batch.
pub const MAX_BATCH: usize = 1000;

/// The signal of the factor a collapse asserts.
pub const SIGNAL: &str = "messaging";

/// A batch as posted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryBatch {
    /// The events, each checked on its own (the bad ones are named by index).
    pub events: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelivery {
    event_id: String,
    #[serde(rename = "type")]
    kind: String,
    recipient: String,
    #[serde(default)]
    ts: Option<String>,
}

/// A valid event.
#[derive(Debug, Clone)]
struct Delivery {
    event_id: String,
    outcome: Outcome,
    /// `destination:…` text; none for a push token.
    destination: Option<String>,
    ts_ms: i64,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Sent => "otp_sent",
            Outcome::Verified => "otp_verified",
        }
    }
}

/// Delivery events and each destination's conversion.
#[derive(Debug)]
pub struct Messaging {
    durable: Durable,
    scoring: Arc<Engine>,
    recipients: Recipients,
    conversion: Conversion,
}

/// What a batch did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ingested {
    /// Events stored (a retried one is stored once and counted once).
    pub stored: u64,
    /// Destinations tightened by this batch.
    pub tightened: Vec<String>,
}

impl Messaging {
    /// The service over the durable store and scoring.
    pub fn new(durable: Durable, scoring: Arc<Engine>, settings: MessagingSettings) -> Self {
        Self {
            durable,
            scoring,
            recipients: Recipients::new(settings),
            conversion: Conversion::default(),
        }
    }

    /// Recipients made canonical (the limit check's and these events' alike).
    pub fn recipients(&self) -> &Recipients {
        &self.recipients
    }

    /// Validates a batch: every event, or every bad one's index and reason.
    fn parse(
        &self,
        events: &[serde_json::Value],
        now_ms: i64,
    ) -> Result<Vec<Delivery>, Vec<EventError>> {
        let mut good = Vec::with_capacity(events.len());
        let mut bad = Vec::new();
        for (index, value) in events.iter().enumerate() {
            match self.parse_one(value, now_ms) {
                Ok(delivery) => good.push(delivery),
                Err(reason) => bad.push(EventError { index, reason }),
            }
        }
        if bad.is_empty() { Ok(good) } else { Err(bad) }
    }

    fn parse_one(&self, value: &serde_json::Value, now_ms: i64) -> Result<Delivery, String> {
        let raw = RawDelivery::deserialize(value).map_err(|e| e.to_string())?;
        if raw.event_id.is_empty()
            || raw.event_id.len() > 128
            || raw.event_id.chars().any(char::is_control)
        {
            return Err("event_id must be 1–128 printable characters".to_owned());
        }
        let outcome = match raw.kind.as_str() {
            "otp_sent" => Outcome::Sent,
            "otp_verified" => Outcome::Verified,
            other => {
                return Err(format!("type {other:.40?} is not otp_sent or otp_verified"));
            }
        };
        let recipient = self
            .recipients
            .parse(&raw.recipient)
            .map_err(|e| e.to_string())?;
        let ts_ms = match raw.ts.as_deref() {
            None => now_ms,
            Some(text) => chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.timestamp_millis())
                .map_err(|_| format!("ts {text:.40?} is not an RFC 3339 timestamp"))?,
        };
        if ts_ms < now_ms - crate::ingest::MAX_AGE_MS
            || ts_ms > now_ms + crate::ingest::MAX_FUTURE_MS
        {
            return Err(
                "ts must be within the last 24 hours (and at most 5 minutes ahead)".to_owned(),
            );
        }
        Ok(Delivery {
            event_id: raw.event_id,
            outcome,
            destination: recipient.destination.map(|d| d.to_string()),
            ts_ms,
        })
    }

    /// Stores a batch (all or nothing), then counts what was new into the conversions and
    /// tightens every destination whose window collapsed.
    pub async fn ingest(
        &self,
        events: &[serde_json::Value],
        now_ms: i64,
    ) -> Result<Result<Ingested, Vec<EventError>>, Error> {
        let deliveries = match self.parse(events, now_ms) {
            Ok(deliveries) => deliveries,
            Err(bad) => return Ok(Err(bad)),
        };
        let new: std::collections::HashSet<String> = insert(&self.durable, &deliveries)
            .await?
            .into_iter()
            .collect();
        let mut ingested = Ingested {
            stored: new.len() as u64,
            tightened: Vec::new(),
        };
        let conversion = &self.recipients.settings().conversion;
        let collapses: Vec<Collapse> = deliveries
            .iter()
            .filter(|d| new.contains(&d.event_id))
            .filter_map(|d| {
                let destination = d.destination.as_deref()?;
                self.conversion
                    .record(conversion, destination, d.outcome, d.ts_ms)
            })
            .collect();
        for collapse in collapses {
            self.tighten(&collapse, now_ms).await?;
            ingested.tightened.push(collapse.destination);
        }
        Ok(Ok(ingested))
    }

    /// Counts the stored events of the last day into the conversions (an instance that
    /// starts judges the windows in progress and knows each destination's normal). A window
    /// that collapsed before is not tightened again: its factor is stored. Returns the events
    /// counted.
    pub async fn replay(&self, now_ms: i64) -> Result<u64, Error> {
        const PAGE: i64 = 10_000;
        let conversion = &self.recipients.settings().conversion;
        let mut after = (now_ms - crate::ingest::MAX_AGE_MS, String::new());
        let mut counted = 0u64;
        loop {
            let page = since(&self.durable, (after.0, &after.1), PAGE).await?;
            for (_, kind, destination, ts) in &page {
                let outcome = match kind.as_str() {
                    "otp_verified" => Outcome::Verified,
                    _ => Outcome::Sent,
                };
                if !destination.is_empty() {
                    self.conversion
                        .record(conversion, destination, outcome, *ts);
                    counted += 1;
                }
            }
            match page.last() {
                Some((id, _, _, ts)) if page.len() as i64 == PAGE => after = (*ts, id.clone()),
                _ => return Ok(counted),
            }
        }
    }

    /// Deletes the stored events older than `before_ms`; how many.
    pub async fn prune(&self, before_ms: i64) -> Result<u64, Error> {
        Ok(with_pool!(&self.durable, |pool| sqlx::query(PRUNE)
            .bind(before_ms)
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .map_err(crate::store::Error::from)?)
    }

    async fn tighten(&self, collapse: &Collapse, now_ms: i64) -> Result<(), Error> {
        let Some(subject) = SubjectKey::from_text(&collapse.destination)
            .filter(|s| s.kind() == SubjectKind::Destination)
        else {
            return Ok(());
        };
        let settings = &self.recipients.settings().conversion;
        let message = format!(
            "{}: {} of {} codes verified in {} min, below {:.0} % ({}): SMS pumping?",
            collapse.destination,
            collapse.verified,
            collapse.sent,
            settings.window_s / 60,
            collapse.threshold * 100.0,
            if collapse.learned {
                "half its own normal"
            } else {
                "the floor before its normal is learned"
            }
        );
        let hold_ms = i64::try_from(settings.hold_s * 1000).unwrap_or(i64::MAX);
        let factor = Factor::scale(SIGNAL, "otp_conversion", settings.factor, message.clone())
            .on_classes(&["messaging"])
            .until(now_ms.saturating_add(hold_ms));
        self.scoring.assert(&subject, factor).await?;
        let raised = self
            .scoring
            .alerts()
            .raise(
                "otp_conversion",
                &subject,
                message,
                serde_json::json!({
                    "sent": collapse.sent,
                    "verified": collapse.verified,
                    "threshold": collapse.threshold,
                }),
                Some(std::time::Duration::from_secs(settings.hold_s)),
            )
            .await?;
        tracing::warn!(
            destination = %collapse.destination,
            sent = collapse.sent,
            verified = collapse.verified,
            alerted = raised.is_some(),
            "OTP conversion collapsed: destination tightened on messaging"
        );
        Ok(())
    }
}

const SINCE: &str = "SELECT event_id, kind, destination, ts FROM messaging_events \
    WHERE (ts, event_id) > ($1, $2) ORDER BY ts, event_id LIMIT $3";

/// A page of the stored events after `(ts, event_id)`, in that order.
async fn since(
    durable: &Durable,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<(String, String, String, i64)>, crate::store::Error> {
    Ok(with_pool!(durable, |pool| sqlx::query_as(SINCE)
        .bind(after.0)
        .bind(after.1)
        .bind(limit)
        .fetch_all(pool)
        .await)?)
}

const PRUNE: &str = "DELETE FROM messaging_events WHERE ts < $1";

const INSERT: &str = "INSERT INTO messaging_events (event_id, kind, destination, ts) ";

/// Stores the events; answers the ids that were not stored before.
async fn insert(
    durable: &Durable,
    deliveries: &[Delivery],
) -> Result<Vec<String>, crate::store::Error> {
    if deliveries.is_empty() {
        return Ok(Vec::new());
    }
    let new: Vec<(String,)> = with_pool!(durable, |pool| {
        let mut builder = sqlx::QueryBuilder::new(INSERT);
        builder.push_values(deliveries, |mut row, d| {
            row.push_bind(d.event_id.as_str())
                .push_bind(d.outcome.as_str())
                .push_bind(d.destination.as_deref().unwrap_or(""))
                .push_bind(d.ts_ms);
        });
        builder.push(" ON CONFLICT (event_id) DO NOTHING RETURNING event_id");
        builder.build_query_as().fetch_all(pool).await
    })?;
    Ok(new.into_iter().map(|(id,)| id).collect())
}
