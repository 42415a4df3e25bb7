//! Runtime overrides: an operator sets one subject's multiplier on some classes (or all) until
//! a time, beyond the class bounds: raise a partner for a launch, cut a misbehaving key.
//!
//! An override is a scoring factor (signal `override`, effect [`Effect::Set`]), so it is
//! published to every instance like any factor, survives a hot-store rebuild from its
//! durable row, expires by itself and shows in every explanation. A blocking factor
//! (lockout, deny entry) still blocks; of two overrides on one class the smaller wins.

use std::sync::Arc;

use serde::Serialize;

use super::{Effect, Engine, Factor};
use crate::audit::{Actor, Audit};
use crate::clock::Clock;
use crate::model::SubjectKey;
use crate::store::with_pool;
use crate::store::{Durable, Error};

/// The signal of override factors.
pub const SIGNAL: &str = "override";

/// One override.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Override {
    /// ULID.
    pub id: String,
    /// The subject key (`user:…`, `ip:…`, `device:…`).
    pub subject: String,
    /// The classes it applies to (empty: every class).
    pub classes: Vec<String>,
    /// The multiplier it sets.
    pub multiplier: f64,
    /// Unix ms.
    pub expires_at_ms: i64,
    /// Who set it and why.
    pub message: String,
}

/// What an override sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Classes it applies to (empty: every class).
    pub classes: Vec<String>,
    /// The multiplier it sets.
    pub multiplier: f64,
    /// When it ends, Unix ms.
    pub expires_at_ms: i64,
    /// Why.
    pub reason: String,
}

/// Sets, lists and removes overrides.
#[derive(Debug, Clone)]
pub struct Overrides {
    durable: Durable,
    clock: Arc<dyn Clock>,
    scoring: Arc<Engine>,
    audit: Audit,
}

fn code(id: &str) -> String {
    format!("o{}", id.to_ascii_lowercase())
}

impl Overrides {
    /// Overrides as scoring factors.
    pub fn new(
        durable: Durable,
        clock: Arc<dyn Clock>,
        scoring: Arc<Engine>,
        audit: Audit,
    ) -> Self {
        Self {
            durable,
            clock,
            scoring,
            audit,
        }
    }

    /// Sets an override at once on every instance; audited as `override.create`.
    pub async fn create(
        &self,
        subject: &SubjectKey,
        spec: &Spec,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Override, crate::scoring::Error> {
        let Spec {
            classes,
            multiplier,
            expires_at_ms,
            reason,
        } = spec;
        let (multiplier, expires_at_ms) = (*multiplier, *expires_at_ms);
        let id = self.clock.new_id().to_string();
        let message = format!("override by {}: {reason}", actor.name);
        let class_refs: Vec<&str> = classes.iter().map(String::as_str).collect();
        let factor = Factor::set(SIGNAL, &code(&id), multiplier, message.clone())
            .on_classes(&class_refs)
            .until(expires_at_ms)
            .referring_to(id.clone());
        self.scoring.assert(subject, factor).await?;
        self.audit
            .record(
                actor,
                "override.create",
                subject.as_str(),
                serde_json::json!({
                    "id": id, "classes": classes, "multiplier": multiplier,
                    "expires_at": crate::clock::rfc3339(expires_at_ms), "reason": reason,
                }),
                request_id,
            )
            .await?;
        Ok(Override {
            id,
            subject: subject.to_string(),
            classes: classes.to_vec(),
            multiplier,
            expires_at_ms,
            message,
        })
    }

    /// The overrides in force, newest first.
    pub async fn list(&self) -> Result<Vec<Override>, Error> {
        let now = self.clock.now_ms();
        let rows: Vec<(String, String)> = with_pool!(&self.durable, |pool| sqlx::query_as(
            "SELECT subject, body FROM factors WHERE id LIKE 'override:%' \
             AND (expires_at IS NULL OR expires_at > $1)"
        )
        .bind(now)
        .fetch_all(pool)
        .await)?;
        let mut out: Vec<Override> = rows
            .into_iter()
            .filter_map(|(subject, body)| {
                let factor: Factor = serde_json::from_str(&body).ok()?;
                (factor.signal == SIGNAL && factor.effect == Effect::Set).then(|| Override {
                    id: factor.reference.clone().unwrap_or_default(),
                    subject,
                    classes: factor.classes.clone(),
                    multiplier: factor.value,
                    expires_at_ms: factor.expires_at_ms.unwrap_or(i64::MAX),
                    message: factor.message,
                })
            })
            .collect();
        out.sort_by(|a, b| b.id.cmp(&a.id));
        Ok(out)
    }

    /// Removes an override at once on every instance; audited as `override.delete`. None
    /// when there is none with this id (or it expired).
    pub async fn delete(
        &self,
        id: &str,
        reason: &str,
        actor: &Actor,
        request_id: &str,
    ) -> Result<Option<Override>, crate::scoring::Error> {
        let Some(found) = self.list().await?.into_iter().find(|o| o.id == id) else {
            return Ok(None);
        };
        let subject = SubjectKey::from_text(&found.subject).ok_or_else(|| {
            crate::scoring::Error::Store(Error::Unavailable {
                store: "durable",
                source: format!("stored override subject {:?} does not parse", found.subject)
                    .into(),
            })
        })?;
        let factor_id = format!("{SIGNAL}:{}", code(id));
        self.scoring.retract(&subject, &[&factor_id]).await?;
        self.audit
            .record(
                actor,
                "override.delete",
                subject.as_str(),
                serde_json::json!({ "id": id, "reason": reason }),
                request_id,
            )
            .await?;
        Ok(Some(found))
    }
}
