//! Scoring: multipliers with reasons and the decision stream (role `limiter`); repeat
//! offenders and alerts (role `analyst`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Envelope};
use super::extract::{
    ApiQuery, Authorized, parse_cursor, parse_limit, parse_query, parse_since, role,
};
use crate::app::AppState;
use crate::clock::rfc3339;
use crate::lockout::Status;
use crate::model::{ClientIp, SubjectKey};
use crate::scoring::{Contribution, DecisionChange, store::valid_cursor};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(multipliers))
        .routes(routes!(decisions))
        .routes(routes!(offenders))
        .routes(routes!(alerts))
}

/// `GET /v1/multipliers` query: at least one of `ip`, `user_id`, `device_id`, `tenant`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MultiplierParams {
    /// Client IP.
    pub ip: Option<String>,
    /// User (or account).
    pub user_id: Option<String>,
    /// Device.
    pub device_id: Option<String>,
    /// Tenant.
    pub tenant: Option<String>,
    /// Path of the request, for its endpoint class (default `/`).
    pub endpoint: Option<String>,
    /// Its method (default `GET`).
    pub method: Option<String>,
}

/// One key's multiplier.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    /// What enforcement uses for this key and class.
    pub multiplier: f64,
    /// What it would be if shadow factors were enforced.
    pub would_be: f64,
    /// Every factor that applies, enforced and shadow.
    pub reasons: Vec<Contribution>,
}

/// The lockout of the user, if locked.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LockoutRef {
    /// Lockout id.
    pub id: String,
    /// RFC 3339, if it expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked_until: Option<String>,
}

/// `GET /v1/multipliers` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MultipliersView {
    /// The endpoint class the multipliers are for.
    pub class: String,
    /// The strictest key's multiplier.
    pub multiplier: f64,
    /// Per key (`ip:…`, `user:…`, `device:…`, `tenant:…`, and the IP's `asn:…` when known).
    pub keys: BTreeMap<String, KeyView>,
    /// The user's lockout, if locked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout: Option<LockoutRef>,
}

/// The multipliers of a request's keys for its endpoint class, with every contribution
/// (role `limiter` or `analyst`). What `/v1/limit/check` enforces for the same keys; stored factors are
/// cached in-process for one L1 TTL.
#[utoipa::path(operation_id = "explain_multipliers", get, path = "/v1/multipliers", tag = "scoring", security(("bearer" = [])),
    params(MultiplierParams),
    responses((status = 200, body = MultipliersView), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn multipliers(
    _auth: Authorized<role::Reader>,
    State(app): State<AppState>,
    uri: axum::http::Uri,
) -> Result<axum::response::Response, ApiError> {
    // L1: the same query within one L1 TTL gets the same answer (cleared by a publish), and
    // is not parsed again: only valid queries are kept.
    let cache_key = uri.query().unwrap_or_default();
    let generation = app.scoring.generation();
    let now_us = app.clock.monotonic_us();
    if let Some(body) = app.explanations.get(cache_key, generation, now_us) {
        return Ok(json_response(body));
    }
    let params: MultiplierParams = parse_query(&uri)?;
    let view = explain_multipliers(&app, params).await?;
    let body = bytes::Bytes::from(serde_json::to_vec(&view).unwrap_or_default());
    let ttl_us = app.scoring.l1_ttl_us();
    if ttl_us > 0 {
        app.explanations
            .put(cache_key, generation, now_us + ttl_us, body.clone());
    }
    Ok(json_response(body))
}

fn json_response(body: bytes::Bytes) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

async fn explain_multipliers(
    app: &AppState,
    params: MultiplierParams,
) -> Result<MultipliersView, ApiError> {
    let ids = app.settings.http.identifiers();
    let mut subjects = Vec::new();
    if let Some(ip) = &params.ip {
        let client = ClientIp::parse(ip, app.settings.limits.ipv6_prefix_len)
            .ok_or_else(|| ApiError::invalid(format!("ip {ip:.64?} is not an IP address")))?;
        subjects.push((SubjectKey::ip(&client), Some(client.addr())));
        if let Some(asn) = app.reputation.asn(client.addr()) {
            subjects.push((SubjectKey::asn(asn), None));
        }
    }
    let user = params
        .user_id
        .as_deref()
        .map(|u| ids.user_key("user_id", u))
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    subjects.extend(user.clone().map(|u| (u, None)));
    if let Some(device) = &params.device_id {
        let key = ids
            .device_key(device)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        subjects.push((key, None));
    }
    if let Some(tenant) = &params.tenant {
        let key = ids
            .tenant_key(tenant)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        subjects.push((key, None));
    }
    if subjects.is_empty() {
        return Err(ApiError::invalid(
            "give at least one of ip, user_id, device_id, tenant",
        ));
    }
    let endpoint = params.endpoint.as_deref().unwrap_or("/");
    if !endpoint.starts_with('/') || endpoint.len() > 2048 {
        return Err(ApiError::invalid(
            "endpoint must be a path starting with '/', at most 2048 bytes",
        ));
    }
    let method = params
        .method
        .as_deref()
        .unwrap_or("GET")
        .to_ascii_uppercase();
    let budgets = app.limiter.budgets();
    let class = budgets.classes[budgets.classify(&method, endpoint)]
        .name
        .to_string();
    let explained = app.scoring.explain(&class, &subjects).await?;
    let lockout = user.and_then(|user| {
        explained
            .iter()
            .find(|k| k.key == user)?
            .combined
            .contributions
            .iter()
            .find(|c| c.code == "lockout")
            .map(|c| LockoutRef {
                id: c.reference.clone().unwrap_or_default(),
                locked_until: c.expires_at.clone(),
            })
    });
    let multiplier = explained
        .iter()
        .map(|k| k.combined.multiplier)
        .fold(f64::INFINITY, f64::min);
    Ok(MultipliersView {
        class,
        multiplier: if multiplier.is_finite() {
            multiplier
        } else {
            1.0
        },
        keys: explained
            .into_iter()
            .map(|k| {
                (
                    k.key.to_string(),
                    KeyView {
                        multiplier: k.combined.multiplier,
                        would_be: k.combined.would_be,
                        reasons: k.combined.contributions.clone(),
                    },
                )
            })
            .collect(),
        lockout,
    })
}

/// `GET /v1/decisions` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DecisionParams {
    /// The `next_cursor` of the previous answer; absent: a full snapshot.
    #[param(pattern = "^[0-9]{1,20}(-[0-9]{1,20})?$")]
    pub since: Option<String>,
    /// Most changes (or snapshot entries) per answer, 1–1000 (default 500).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The `snapshot_next` of the previous snapshot page: the snapshot's next page.
    #[param(pattern = "^[0-9]{1,20}(-[0-9]{1,20})?\\.[A-Za-z0-9_-]{0,4096}$")]
    pub snapshot_after: Option<String>,
}

/// Decisions for an enforcer's local copy.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DecisionPage {
    /// True when `items` is a full snapshot of what is in force (no `since`, or `since` was
    /// older than the changes kept): replace the local copy with it.
    pub snapshot: bool,
    /// Changes in order (or the snapshot).
    pub items: Vec<DecisionChange>,
    /// Pass as `since` next time (every page of one snapshot carries the same).
    pub next_cursor: String,
    /// While a snapshot has more pages: pass as `snapshot_after` for the next one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_next: Option<String>,
}

/// Multipliers, lockouts and list entries changed since a cursor, so a gateway can keep a
/// local copy and keep enforcing when Palisade is unreachable (role `limiter`). Without
/// `since` (or when `since` is older than the changes kept, or from before the hot store
/// lost its data) the answer is a snapshot of everything in force, `limit` entries a page
/// (follow `snapshot_next` as `snapshot_after`); then follow `next_cursor` from there. Changes after the
/// snapshot's cursor may repeat what the snapshot holds: apply them in order.
#[utoipa::path(operation_id = "scoring_decisions", get, path = "/v1/decisions", tag = "scoring", security(("bearer" = [])),
    params(DecisionParams),
    responses((status = 200, body = DecisionPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn decisions(
    _auth: Authorized<role::Limiter>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<DecisionParams>,
) -> Result<Json<DecisionPage>, ApiError> {
    let limit = parse_limit(params.limit, 500, 1000)? as usize;
    if let Some(token) = params.snapshot_after.as_deref() {
        let (cursor, after) = parse_snapshot_token(token).ok_or_else(|| {
            ApiError::invalid("snapshot_after is not a snapshot_next returned by this API")
        })?;
        return snapshot_page(&app, cursor.to_owned(), Some(&after), limit).await;
    }
    if let Some(since) = params.since.as_deref() {
        if !valid_cursor(since) {
            return Err(ApiError::invalid(
                "since is not a cursor returned by this API",
            ));
        }
        let page = app.scoring.changes(Some(since), limit).await?;
        if !page.reset {
            return Ok(Json(DecisionPage {
                snapshot: false,
                items: page.changes,
                next_cursor: page.next,
                snapshot_next: None,
            }));
        }
    }
    // The cursor first: a change made while the snapshot is read is then replayed after it.
    let next_cursor = app.scoring.changes(None, 0).await?.next;
    snapshot_page(&app, next_cursor, None, limit).await
}

/// A snapshot entry's place in the snapshot's order.
fn snapshot_key(change: &DecisionChange) -> String {
    format!(
        "{}\u{0}{}\u{0}{}",
        change.kind,
        change.subject,
        change.reference.as_deref().unwrap_or("")
    )
}

/// `<stream cursor>.<base64url of the last entry's key>`.
fn snapshot_token(cursor: &str, last: &DecisionChange) -> String {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(snapshot_key(last));
    format!("{cursor}.{key}")
}

fn parse_snapshot_token(token: &str) -> Option<(&str, String)> {
    use base64::Engine as _;
    let (cursor, key) = token.split_once('.')?;
    let key = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(key)
        .ok()?;
    valid_cursor(cursor).then_some(())?;
    Some((cursor, String::from_utf8(key).ok()?))
}

/// One page of the snapshot (entries in `(kind, subject, reference)` order after `after`),
/// answered with the stream cursor taken before its first page.
async fn snapshot_page(
    app: &AppState,
    next_cursor: String,
    after: Option<&str>,
    limit: usize,
) -> Result<Json<DecisionPage>, ApiError> {
    let mut items: Vec<(String, DecisionChange)> = snapshot(app)
        .await?
        .into_iter()
        .map(|change| (snapshot_key(&change), change))
        .filter(|(key, _)| after.is_none_or(|after| key.as_str() > after))
        .collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let more = items.len() > limit;
    items.truncate(limit);
    let items: Vec<DecisionChange> = items.into_iter().map(|(_, change)| change).collect();
    let snapshot_next = more
        .then(|| items.last().map(|last| snapshot_token(&next_cursor, last)))
        .flatten();
    Ok(Json(DecisionPage {
        snapshot: true,
        items,
        next_cursor,
        snapshot_next,
    }))
}

/// Everything in force: published multipliers, live list entries, active lockouts.
pub(super) async fn snapshot(app: &AppState) -> Result<Vec<DecisionChange>, ApiError> {
    let mut items = app.scoring.snapshot().await?;
    for list in [
        crate::reputation::lists::ListName::Deny,
        crate::reputation::lists::ListName::Allow,
    ] {
        for entry in app.lists.entries(list) {
            items.push(DecisionChange {
                cursor: String::new(),
                kind: "list".to_owned(),
                action: "set".to_owned(),
                subject: entry.value,
                classes: BTreeMap::new(),
                expires_at_ms: entry.expires_at_ms,
                reasons: vec![format!("list_{}", list.as_str())],
                reference: Some(entry.id),
                list: Some(list.as_str().to_owned()),
                at_ms: entry.created_at_ms,
            });
        }
    }
    let mut before = None;
    loop {
        let (page, next) = app
            .lockouts
            .list(&crate::lockout::Query {
                status: Status::Active,
                before,
                limit: 500,
                ..Default::default()
            })
            .await?;
        for lockout in page {
            items.push(DecisionChange {
                cursor: String::new(),
                kind: "lockout".to_owned(),
                action: "set".to_owned(),
                subject: SubjectKey::user(&lockout.account, usize::MAX)
                    .map_or_else(|_| lockout.account.clone(), |k| k.to_string()),
                classes: BTreeMap::new(),
                expires_at_ms: Some(lockout.locked_until_ms),
                reasons: vec![lockout.reason],
                reference: Some(lockout.id),
                list: None,
                at_ms: lockout.created_at_ms,
            });
        }
        match next.and_then(|c| ulid::Ulid::from_string(&c).ok()) {
            Some(cursor) if items.len() < crate::scoring::SNAPSHOT_LIMIT * 2 => {
                before = Some(cursor)
            }
            _ => break,
        }
    }
    Ok(items)
}

/// `GET /v1/offenders` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OffenderParams {
    /// Window in seconds, 1–3600 (default 60), rounded up to whole minutes.
    #[param(minimum = 1, maximum = 3600)]
    pub window_s: Option<u64>,
    /// Most keys, 1–500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// A key hitting 429 often.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OffenderView {
    /// The key.
    pub key: String,
    /// 429s in the window, over every instance (as of the last flush, at most 1 s old).
    pub count: u64,
    /// RFC 3339 until which it is tightened as a repeat offender, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tightened_until: Option<String>,
}

/// Repeat offenders.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OffenderPage {
    /// The window, seconds.
    pub window_s: u64,
    /// Most refused first.
    pub items: Vec<OffenderView>,
}

/// The keys refused (429) most often in the window (role `analyst`). Counted per instance in
/// a bounded Space-Saving sketch and summed across instances every second.
#[utoipa::path(operation_id = "list_offenders", get, path = "/v1/offenders", tag = "scoring", security(("bearer" = [])),
    params(OffenderParams),
    responses((status = 200, body = OffenderPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn offenders(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<OffenderParams>,
) -> Result<Json<OffenderPage>, ApiError> {
    let window_s = params.window_s.unwrap_or(60);
    if !(1..=3600).contains(&window_s) {
        return Err(ApiError::invalid("window_s must be between 1 and 3600"));
    }
    let limit = parse_limit(params.limit, 50, 500)? as usize;
    let items = app.scoring.offenders(window_s, limit).await?;
    Ok(Json(OffenderPage {
        window_s,
        items: items
            .into_iter()
            .map(|o| OffenderView {
                key: o.key,
                count: o.count,
                tightened_until: o.tightened_until_ms.map(rfc3339),
            })
            .collect(),
    }))
}

/// `GET /v1/alerts` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AlertParams {
    /// `anomaly`, `repeat_offender`, `spraying` or `lockout`.
    pub kind: Option<String>,
    /// Only this key (`device:…`, `ip:…`, `user:…`).
    pub subject: Option<String>,
    /// Only alerts raised at or after this RFC 3339 time.
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// The `next_cursor` of the previous page.
    #[param(pattern = "^[0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26}$")]
    pub cursor: Option<String>,
    /// Page size 1–500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// An alert.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AlertView {
    /// Id (ULID).
    pub id: String,
    /// Kind.
    pub kind: String,
    /// The key it is about.
    pub subject: String,
    /// A sentence for analysts.
    pub message: String,
    /// Figures behind it.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
    /// RFC 3339.
    pub created_at: String,
}

/// A page of alerts, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AlertPage {
    /// Alerts.
    pub items: Vec<AlertView>,
    /// Pass as `cursor` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Anomaly and abuse alerts, newest first (role `analyst`).
#[utoipa::path(operation_id = "list_alerts", get, path = "/v1/alerts", tag = "scoring", security(("bearer" = [])),
    params(AlertParams),
    responses((status = 200, body = AlertPage), (status = 400, body = Envelope),
        (status = 401, body = Envelope), (status = 403, body = Envelope), (status = 503, body = Envelope)))]
async fn alerts(
    _auth: Authorized<role::Analyst>,
    State(app): State<AppState>,
    ApiQuery(params): ApiQuery<AlertParams>,
) -> Result<Json<AlertPage>, ApiError> {
    let limit = parse_limit(params.limit, 100, 500)?;
    let before = parse_cursor(params.cursor.as_deref())?;
    let since_ms = parse_since(params.since.as_deref())?;
    let too_long = |v: &Option<String>| v.as_ref().is_some_and(|v| v.len() > 1024);
    if too_long(&params.kind) || too_long(&params.subject) {
        return Err(ApiError::invalid("kind and subject are at most 1024 bytes"));
    }
    let (items, next_cursor) = app
        .scoring
        .alerts()
        .list(&crate::scoring::alerts::Query {
            kind: params.kind,
            subject: params.subject,
            since_ms,
            before,
            limit,
        })
        .await?;
    Ok(Json(AlertPage {
        items: items
            .into_iter()
            .map(|a| AlertView {
                id: a.id,
                kind: a.kind,
                subject: a.subject,
                message: a.message,
                details: a.details,
                created_at: rfc3339(a.created_at_ms),
            })
            .collect(),
        next_cursor,
    }))
}
